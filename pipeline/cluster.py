"""Spark on this machine as separate processes, for the tests and the benchmarks: a standalone
cluster (a master and workers) and a Spark Connect server, each started with the launchers
that the ``pyspark`` package ships (``bin/spark-class``, ``bin/spark-submit``).

    with StandaloneCluster(folder) as cluster:           # a master, two workers of 1 core, 1 GiB
        martinet-pipeline --master cluster.master_url …
    with ConnectServer(folder, master="local[2]") as server:
        martinet-pipeline --remote server.url …

Everything binds to 127.0.0.1 on ports the system picks (each process logs the port it got,
read from its log); logs, work folders and scratch files go below ``folder``. Each process runs
in a session of its own, and stopping kills every process of that session: the daemon's JVM,
the executor JVMs a worker started and their Python workers (PySpark's daemon moves them to a
process group of their own, but not out of the session), so nothing is left running.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "ClusterError",
    "ConnectServer",
    "Process",
    "StandaloneCluster",
    "java_missing",
    "spark_home",
    "worker_launcher",
]

START_TIMEOUT = 120.0  # seconds for a daemon to log its port, or the workers to register: a busy 2-core machine


class ClusterError(RuntimeError):
    """A daemon did not start: its message says which, with the end of its log."""


def spark_home() -> Path:
    """The Spark distribution inside the ``pyspark`` package (its ``bin/``, ``sbin/``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def java_missing() -> str | None:
    """Why Spark's JVMs cannot start here, or None when they can."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return None
    if shutil.which("java"):
        return None
    return "Java is missing (Spark needs Java 17 or newer: `apt-get install default-jre-headless`)"


@dataclass(frozen=True)
class Process:
    """A process as /proc shows it."""

    pid: int
    parent: int
    session: int
    argv: tuple[str, ...]

    def runs(self, text: str) -> bool:
        """Whether ``text`` is one of its arguments (a main class, a module)."""
        return any(text in arg for arg in self.argv)


def processes() -> list[Process]:
    """Every live process (zombies left out: they are gone, only not yet reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state ppid pgrp session …
        if fields[0] == "Z":
            continue
        command = tuple(arg.decode(errors="replace") for arg in argv if arg)
        found.append(Process(int(entry.name), int(fields[1]), int(fields[3]), command))
    return found


def descendants(pid: int) -> list[Process]:
    """The children of ``pid``, their children and so on."""
    everything = processes()
    found: list[Process] = []
    parents = {pid}
    while True:
        more = [p for p in everything if p.parent in parents and p not in found]
        if not more:
            return found
        found += more
        parents = {p.pid for p in more}


class _Daemon:
    """One launcher command in a session of its own, its output in ``log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def check(self) -> None:
        """Raises ClusterError when the daemon has ended."""
        if self.process.poll() is not None:
            raise ClusterError(f"{self.name} ended ({self.process.returncode}), log {self.log}:\n{self.tail()}")

    def find(self, pattern: str, deadline: float) -> re.Match[str]:
        """Wait (until ``deadline``, monotonic) for a line of the log matching ``pattern``."""
        expression = re.compile(pattern)
        while True:
            found = expression.search(self.log.read_text(errors="replace"))
            if found:
                return found
            self.check()
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name}: no {pattern!r} in its log {self.log}:\n{self.tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill every process of the daemon's session, and wait until none is left."""
        deadline = time.monotonic() + 30
        while True:
            left = [p.pid for p in processes() if p.session == self.pid]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name}: processes {left} of its session outlived SIGKILL")
            time.sleep(0.1)
        self.process.wait()


def _environment(folder: Path, python: str) -> dict[str, str]:
    """The daemons' environment: loopback only, this Python for PySpark, scratch below
    ``folder``. Spark's configuration folder is the caller's, as for a driver started here: a
    folder of their own would come first on the JVMs' class path, which then no longer matches
    the drivers' (a class-data archive made by one cannot serve the other)."""
    scratch = folder / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return os.environ | {
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": python,
        "SPARK_DAEMON_MEMORY": "512m",  # the master's and workers' own JVMs; executors are sized apart
        "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={scratch}",
        # the master's REST submission server listens on the fixed port 6066 unless disabled
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }


def worker_launcher(folder: Path, python: str) -> Path:
    """A ``PYSPARK_PYTHON`` for a Spark driver that starts Python workers on this machine (a
    local master's, and a Connect server's ``foreachBatch`` worker, one per query start): it
    runs ``python`` without the entries that Spark puts first on the worker's ``PYTHONPATH``,
    its own ``pyspark.zip`` and ``py4j`` zip. Python compiles a module imported from a zip
    again at every start (it cannot cache the bytecode there): a worker's imports took
    1.8-2.2 s from the zip against 0.8 s from the installed, compiled copy, on a quiet 2-core
    machine, and the server gives a worker a fixed 10 s to connect back. ``python`` must have
    the same ``pyspark`` installed, as ``martinet[spark]`` does (the worker imports
    ``martinet`` anyway)."""
    zips = shlex.quote(str(spark_home() / "python" / "lib"))
    launcher = folder.resolve() / "worker-python"  # absolute: Spark's launch scripts change folder
    folder.mkdir(parents=True, exist_ok=True)
    launcher.write_text(
        "#!/bin/sh\n"
        "# Spark's pyspark.zip off PYTHONPATH: the installed pyspark is the same code, compiled once\n"
        "set -f\nkept=\nIFS=:\n"
        f'for entry in $PYTHONPATH; do case $entry in {zips}/*) ;; *) kept="${{kept:+$kept:}}$entry" ;; esac; done\n'
        'unset IFS\nif [ -n "$kept" ]; then export PYTHONPATH="$kept"; else unset PYTHONPATH; fi\n'
        f'exec {shlex.quote(python)} "$@"\n'
    )
    launcher.chmod(0o755)
    return launcher


class _Started:
    """Started on entering a ``with`` block, stopped (every process gone) on leaving it."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


class StandaloneCluster(_Started):
    """A Spark standalone master and ``workers`` workers (``cores`` and ``memory`` each) on
    127.0.0.1, in ``folder`` (``logs/``, ``work/worker-N``: the executors' stdout and stderr,
    ``local/worker-N``: their scratch). Executors run Python workers with ``python`` (the
    driver's ``PYSPARK_PYTHON`` decides, the workers' environment is the fallback)."""

    def __init__(
        self,
        folder: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        python: str = sys.executable,
        timeout: float = START_TIMEOUT,
    ) -> None:
        self.folder = folder
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.python = python
        self.timeout = timeout
        self.master_url = ""
        self.web_url = ""
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []

    def start(self) -> None:
        """Start the master, then the workers; return once every worker registered.

        Raises:
            ClusterError: Java is missing, or a daemon ended or did not start in time (the
                started ones are stopped).
        """
        reason = java_missing()
        if reason:
            raise ClusterError(reason)
        env = _environment(self.folder, self.python)
        launcher = str(spark_home() / "bin" / "spark-class")
        deadline = time.monotonic() + self.timeout
        try:
            self._master = _Daemon(
                "Spark master",
                [launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0"]
                + ["--webui-port", "0"],
                env,
                self.folder / "logs" / "master.log",
            )
            self.master_url = self._master.find(r"Starting Spark master at (spark://\S+)", deadline)[1]
            port = self._master.find(r"Successfully started service 'MasterUI' on port (\d+)", deadline)[1]
            self.web_url = f"http://127.0.0.1:{port}"
            for n in range(1, self.workers + 1):
                work, local = self.folder / "work" / f"worker-{n}", self.folder / "local" / f"worker-{n}"
                local.mkdir(parents=True, exist_ok=True)
                self._workers.append(
                    _Daemon(
                        f"Spark worker {n}",
                        [launcher, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0"]
                        + ["--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory]
                        + ["--work-dir", str(work), self.master_url],
                        env | {"SPARK_LOCAL_DIRS": str(local)},
                        self.folder / "logs" / f"worker-{n}.log",
                    )
                )
            self._wait_for_workers(deadline)
        except BaseException:
            self.stop()
            raise

    def _wait_for_workers(self, deadline: float) -> None:
        while True:
            try:
                alive = self.state()["aliveworkers"]
            except OSError:  # the web UI not answering yet
                alive = 0
            if alive == self.workers:
                return
            assert self._master is not None
            for daemon in (self._master, *self._workers):
                daemon.check()
            if time.monotonic() > deadline:
                logs = "\n".join(f"{d.name}:\n{d.tail()}" for d in self._workers)
                raise ClusterError(f"{alive} of {self.workers} Spark workers registered in {self.timeout:g} s\n{logs}")
            time.sleep(0.2)

    def state(self) -> Any:
        """The master's view (its web UI's ``/json/``): ``workers``, ``aliveworkers``,
        ``activeapps``, ``completedapps``…"""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            return json.load(response)

    @property
    def master_pid(self) -> int:
        assert self._master is not None
        return self._master.pid

    @property
    def worker_pids(self) -> list[int]:
        """The workers' JVMs; :func:`descendants` finds their executors and Python workers."""
        return [worker.pid for worker in self._workers]

    def executors(self) -> list[Process]:
        """The executor JVMs the workers started (``CoarseGrainedExecutorBackend``)."""
        return [
            p
            for pid in self.worker_pids
            for p in descendants(pid)
            if p.runs("org.apache.spark.executor.CoarseGrainedExecutorBackend")
        ]

    def python_workers(self) -> list[Process]:
        """The executors' Python processes (PySpark's daemon and the workers it forked)."""
        return [p for pid in self.worker_pids for p in descendants(pid) if p.runs("pyspark.daemon")]

    def stop(self) -> None:
        """Kill the workers (with their executors) and the master; nothing of them is left."""
        for daemon in (*self._workers, *([self._master] if self._master else [])):
            daemon.stop()
        self._workers = []
        self._master = None


class ConnectServer(_Started):
    """A Spark Connect server (``org.apache.spark.sql.connect.service.SparkConnectServer``,
    whose jar ships in ``pyspark``'s ``jars/``) on 127.0.0.1, running its Spark on ``master``;
    ``url`` is the ``sc://`` address clients use. ``conf``: more Spark settings of its session."""

    def __init__(
        self,
        folder: Path,
        *,
        master: str = "local[2]",
        python: str = sys.executable,
        conf: dict[str, str] | None = None,
        timeout: float = START_TIMEOUT,
    ) -> None:
        self.folder = folder
        self.master = master
        self.python = python
        self.conf = conf or {}
        self.timeout = timeout
        self.url = ""
        self._server: _Daemon | None = None

    def start(self) -> None:
        """Start the server; return once it listens.

        Raises:
            ClusterError: Java is missing, or the server ended or did not listen in time.
        """
        reason = java_missing()
        if reason:
            raise ClusterError(reason)
        env = _environment(self.folder, str(worker_launcher(self.folder, self.python)))
        scratch = self.folder / "tmp"
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",
            "spark.ui.enabled": "false",
            "spark.local.dir": str(scratch),
            "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
            "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
            "spark.sql.session.timeZone": "UTC",
        } | self.conf
        argv = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master]
        argv += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "Spark Connect server"]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        self._server = _Daemon("Spark Connect server", argv, env, self.folder / "logs" / "connect.log")
        try:
            port = self._server.find(r"Spark Connect server started at: \S*?:(\d+)", time.monotonic() + self.timeout)[1]
        except BaseException:
            self.stop()
            raise
        self.url = f"sc://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        assert self._server is not None
        return self._server.pid

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
