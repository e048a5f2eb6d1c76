"""Spark as separate processes for the pipeline's tests (:mod:`martinet.pipeline.cluster`):
the fixtures ``spark_cluster``, a standalone cluster on loopback (a master and two workers of
1 core and 1 GiB each: this machine has 2 cores), and ``spark_connect``, a Spark Connect
server, are declared in ``tests/conftest.py`` on :func:`need_java`. One per test module (each
start costs 10-20 s); their logs and work folders stay in the module's temp folder. Without
Java they are skipped, unless CI is set: there a missing Java fails."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from martinet.pipeline.cluster import ConnectServer, java_missing


def need_java() -> None:
    reason = java_missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: .ci/run installs default-jre-headless")
    pytest.skip(reason)


@contextlib.contextmanager
def python_workers_explained(server: ConnectServer) -> Iterator[None]:
    """On a failed assertion inside, add what the Connect server's log says of its Python
    workers (their own output, which the server copies into its log undated, and the lines of
    the runners that start them) and how long this Python takes to import what a
    ``foreachBatch`` worker imports before it connects back: the server gives it a fixed 10 s,
    and a worker that crashes looks to the client like a late one."""
    try:
        yield
    except AssertionError as exc:
        log = server.folder / "logs" / "connect.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        runners = ("PythonWorkerFactory", "StreamingPythonRunner", "StreamingForeachBatchHelper", " WARN ", " ERROR ")
        own = ("Traceback", "Error", "worker", 'File "')  # a Python worker's output, undated in the log

        def of_workers(line: str) -> bool:
            return any(word in line for word in (runners if line[:2].isdigit() else own))

        lines = [line for line in text.splitlines() if of_workers(line)]
        begin = time.monotonic()
        imported = subprocess.run(
            [sys.executable, "-c", "import pyspark.sql.connect.streaming.worker.foreach_batch_worker"],
            capture_output=True,
            text=True,
        )
        took = f"{time.monotonic() - begin:.1f} s, exit {imported.returncode} {imported.stderr[-500:]}"
        report = "\n".join(lines[-60:])
        raise AssertionError(  # the report first: a long assertion's tail may be cut when shown
            f"a foreachBatch worker's imports here: {took}\n--- the Connect server's Python workers ({log}):\n"
            f"{report}\n--- the failure:\n{exc}"
        ) from exc
