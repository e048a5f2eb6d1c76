"""Real ``martinet run`` processes for tests: started, waited for, killed, restarted.

:class:`RouterProcess` is one ``python -m martinet.kernel run ARGS`` in a working directory,
its stderr (the log) in a file there; every wait is a poll with a deadline, and a failed wait
raises AssertionError carrying the log. :class:`RouterProcesses` runs several of them from
XML config texts, each router in a folder of its own (config, log, relative store paths),
and kills whatever still runs at :meth:`RouterProcesses.close` (the ``router_processes``
fixture in conftest.py does that at teardown). :func:`router_xml` writes the default stack of
conf/router.xml with a given name, AMQP port and store, and :func:`free_port` finds a port for
it.

These helpers block (``time.sleep``, ``Popen.wait``): use them from synchronous tests, or
through :func:`trio.to_thread.run_sync`.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from lxml import etree


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_EPHEMERAL_LOW = _ephemeral_low()
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now, for config files that need a fixed port.

    Chosen below the kernel's ephemeral range (``ip_local_port_range``): a port from that
    range (what binding port 0 gives) stays exposed to every outgoing connection until the
    router binds it — and again whenever a test stops or kills that router and restarts it
    — and a proxy's or client's connect took one (``Address already in use`` at a restart).
    Ports below it are never handed to outgoing connections; none is handed out twice in
    this process.
    """
    low = max(1024, _EPHEMERAL_LOW - 12000)
    for _ in range(1000):
        port = random.randrange(low, _EPHEMERAL_LOW)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port found in {low}-{_EPHEMERAL_LOW - 1}")


ROUTER_XML = """\
<router name="{name}"
        startorder="sys$log sys$store sys$authentication sys$queuemanager sys$xa sys$topicmanager sys$jms">
  <swiftlet name="sys$log" level="INFO"/>
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$jms">
    <listeners>
      <listener name="amqp" port="{amqp_port}" bind-address="127.0.0.1"/>
    </listeners>
  </swiftlet>
</router>
"""


def router_xml(name: str, *, amqp_port: int, store: str | Path = "store") -> str:
    """The default stack of conf/router.xml as router ``name``, its AMQP listener on
    ``127.0.0.1:amqp_port``, its store in ``store`` (relative: to the router's folder)
    with ``sync="normal"`` (survives a killed process, not an OS crash)."""
    return ROUTER_XML.format(name=name, amqp_port=amqp_port, store=store)


class RouterProcess:
    """``python -m martinet.kernel run ARGS`` in ``cwd``, stderr appended to ``cwd/log``.

    The process starts at construction. ``name`` (the router's name) is needed only by
    :meth:`wait_started` and :meth:`restart`'s wait. Not thread-safe.
    """

    def __init__(
        self, args: list[str], cwd: Path, env: dict | None = None, *, log: str = "stderr.log", name: str | None = None
    ):
        self.args = list(args)
        self.cwd = cwd
        self.env = env
        self.name = name
        self.log = cwd / log
        self.proc: subprocess.Popen
        self._offset = 0
        self.start()

    def start(self) -> None:
        """Start the process (again, after it ended: same args, folder, environment and so
        the same config and store). The log is appended to; :meth:`wait_for` reads from here.

        Raises: RuntimeError if it is still running.
        """
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self} is still running")
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "martinet.kernel", "run", *self.args],
                cwd=self.cwd,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, **(self.env or {})},
            )

    def text(self) -> str:
        """The whole log, every run of this process."""
        return self.log.read_text(errors="replace")

    def current(self) -> str:
        """The log of the latest run (since the latest :meth:`start`)."""
        with self.log.open("rb") as log:
            log.seek(self._offset)
            return log.read().decode(errors="replace")

    def wait_for(self, needle: str, timeout: float = 30) -> None:
        """Wait until the latest run has logged ``needle``.

        Raises: AssertionError, with the exit code and the whole log, if the process ends
        first or ``timeout`` seconds pass.
        """
        deadline = time.monotonic() + timeout
        while needle not in self.current():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not logged; exit {self.proc.poll()}; log:\n{self.text()}")
            time.sleep(0.05)

    def wait_started(self, timeout: float = 30) -> None:
        """Wait for ``router NAME started``: every swiftlet, its listeners included, is up."""
        if self.name is None:
            raise ValueError("wait_started needs the router's name")
        self.wait_for(f"router {self.name} started", timeout)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``signum`` and wait for the exit (subprocess.TimeoutExpired after ``timeout``);
        returns the exit code: 0 for an orderly stop on SIGTERM or SIGINT."""
        self.proc.send_signal(signum)
        return self.proc.wait(timeout)

    def kill(self, timeout: float = 30) -> int:
        """SIGKILL, a crash without any cleanup; returns the exit code (``-SIGKILL``)."""
        return self.stop(signal.SIGKILL, timeout)

    def restart(self, timeout: float = 30) -> None:
        """:meth:`start` again on the same config and store, and, if ``name`` is known,
        wait until the router has started."""
        self.start()
        if self.name is not None:
            self.wait_started(timeout)

    def close(self) -> None:
        """Kill the process if it still runs (teardown)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __repr__(self) -> str:
        return f"<RouterProcess {self.name or self.args} pid {self.proc.pid} in {self.cwd}>"


class RouterProcesses:
    """Real routers from XML config texts, each in the folder ``folder/NAME``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.started: list[RouterProcess] = []

    def start(
        self, xml: str, *args: str, env: dict | None = None, wait: bool = True, timeout: float = 30
    ) -> RouterProcess:
        """Write ``xml`` to ``folder/NAME/router.xml`` (NAME: the router's ``name``
        attribute), run ``martinet run router.xml ARGS`` in that folder and, with ``wait``,
        wait until the router has started (AssertionError with the log if it does not)."""
        name = etree.fromstring(xml.encode()).get("name")
        cwd = self.folder / name
        cwd.mkdir(parents=True, exist_ok=True)
        (cwd / "router.xml").write_text(xml)
        process = RouterProcess(["router.xml", *args], cwd, env, name=name)
        self.started.append(process)
        if wait:
            process.wait_started(timeout)
        return process

    def logs(self) -> str:
        """Every router's log, one after the other: for an assertion message."""
        return "\n".join(f"--- {process.name} ({process.log}):\n{process.text()}" for process in self.started)

    def close(self) -> None:
        """Kill every process still running."""
        for process in self.started:
            process.close()
