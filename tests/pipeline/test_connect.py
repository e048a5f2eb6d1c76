"""The pipeline as a Spark Connect client (``martinet-pipeline --remote sc://…``): its queries
run in the Spark of a Connect server (``spark_connect``, a separate process on ``local[2]``),
the live source's reader and the analyses' Python functions in the server's Python workers.
The known-load test of test_pipeline.py, live and from files across a restart, with the
same assertions as on ``local[2]`` and the same tables from both sources; then the server's
Python workers late or broken (the tests share one server, which takes 12 s of CPU to start)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from martinet.pipeline.cluster import ConnectServer, spark_home, worker_launcher

from tests.harness.processes import free_port
from tests.harness.sparkcluster import python_workers_explained
from tests.pipeline.test_pipeline import PIPELINE_TIMEOUT, failure, known_load

pytestmark = pytest.mark.slow


async def test_known_load_through_spark_connect(network, tmp_path, spark_connect):
    with python_workers_explained(spark_connect):
        await known_load(network, tmp_path, spark_connect.url)


def one_line_failure(*args: str) -> str:
    """``martinet-pipeline`` that must fail with one line: that line."""
    result = subprocess.run(
        [sys.executable, "-m", "martinet.pipeline", *args], capture_output=True, text=True, timeout=PIPELINE_TIMEOUT
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert lines[0] == "martinet-pipeline: starting Spark" and len(lines) == 2, result.stderr[-3000:]
    return lines[1]


def test_a_remote_without_a_server_fails_at_once_with_one_line(tmp_path):
    """The Connect client would retry a refused connection for minutes, silently."""
    port = free_port()  # nothing listens there
    files = ["--source", "files", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--once"]
    assert one_line_failure("--remote", f"sc://127.0.0.1:{port}", *files) == (
        f"martinet-pipeline: no Spark Connect server at sc://127.0.0.1:{port}: Connection refused"
    )
    assert one_line_failure("--remote", "http://127.0.0.1:15002", *files) == (
        "martinet-pipeline: --remote 'http://127.0.0.1:15002' is not a Spark Connect address (like sc://host:15002)"
    )


def test_a_setting_the_server_fixed_is_refused_with_one_line(tmp_path, spark_connect):
    files = ["--source", "files", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--once"]
    line = one_line_failure("--remote", spark_connect.url, "--conf", "spark.executor.memory=2g", *files)
    assert line.startswith(
        "martinet-pipeline: --conf spark.executor.memory=2g: the Spark Connect server refused it: "
        "[CANNOT_MODIFY_CONFIG]"
    ), line


@contextmanager
def before_foreach_batch_workers(server: ConnectServer, script: str) -> Iterator[None]:
    """The shell ``script`` runs in ``server``'s Python before each ``foreachBatch`` worker
    starts (``spark_connect`` sources it; its ``exit`` ends the worker), until the end."""
    path = server.folder / "before-foreach-batch-worker.sh"
    path.write_text(script + "\n")
    try:
        yield
    finally:
        path.unlink()


def run_on(server: ConnectServer, folder: Path) -> subprocess.CompletedProcess[str]:
    """The pipeline once over an empty folder of files, through ``server``."""
    (folder / "in").mkdir()
    files = ["--source", "files", "--input", str(folder / "in"), "--output", str(folder / "out"), "--once"]
    return subprocess.run(
        [sys.executable, "-m", "martinet.pipeline", "--remote", server.url, *files],
        capture_output=True,
        text=True,
        timeout=PIPELINE_TIMEOUT,
    )


def test_a_late_python_worker_of_the_server_is_started_again(tmp_path, spark_connect):
    """The Connect server gives the Python worker of a ``foreachBatch`` query a fixed 10 s to
    connect back; a loaded server's may be later. Here the server's first such worker sleeps
    12 s before it starts: the query's start fails, the pipeline says so and starts it again."""
    late = f"[ -e {tmp_path}/slept ] || {{ touch {tmp_path}/slept; sleep 12; }}"
    with before_foreach_batch_workers(spark_connect, late), python_workers_explained(spark_connect):
        result = run_on(spark_connect, tmp_path)
        assert result.returncode == 0, failure(result.stderr)
    assert (tmp_path / "slept").exists()
    retries = [line for line in result.stderr.splitlines() if "did not connect back" in line]
    assert retries == [
        "martinet-pipeline: the Spark server's Python worker for the series query did not connect back in time "
        "(attempt 1 of 5); starting it again"
    ]


def test_a_python_worker_that_never_starts_fails_the_pipeline_with_one_line_after_five_attempts(
    tmp_path, spark_connect
):
    log = spark_connect.folder / "logs" / "connect.log"
    before = log.read_text().count("no pyspark here")
    broken = f"echo started >> {tmp_path}/starts; echo 'no pyspark here' >&2; exit 1"
    with before_foreach_batch_workers(spark_connect, broken):
        result = run_on(spark_connect, tmp_path)
    assert result.returncode == 2, failure(result.stderr)
    assert result.stderr.splitlines()[-1] == (
        "martinet-pipeline: the Spark Connect server's Python worker for the series query did not connect back within "
        "Spark's fixed 10 s, 5 times: the server is overloaded, or its Python cannot start the worker (the server's "
        "log has the worker's error; its PYSPARK_PYTHON needs martinet[spark])"
    )
    assert (tmp_path / "starts").read_text() == "started\n" * 5
    assert log.read_text().count("no pyspark here") - before == 5


def test_the_servers_python_workers_import_the_installed_pyspark_not_sparks_zip(tmp_path):
    """Spark puts its ``pyspark.zip`` first on a worker's ``PYTHONPATH``; Python compiles
    every module imported from a zip again at each start, which more than doubled a
    ``foreachBatch`` worker's start against the 10 s the server allows. The launcher
    ``ConnectServer`` gives the server drops Spark's zips and keeps every other entry."""
    zips = spark_home() / "python" / "lib"
    other = tmp_path / "other"
    other.mkdir()
    (other / "marker_module.py").write_text("")
    launcher = worker_launcher(tmp_path, sys.executable)
    probe = "import os, pyspark, py4j, marker_module; print(os.environ['PYTHONPATH'], pyspark.__file__, py4j.__file__)"
    path = os.pathsep.join([str(zips / "pyspark.zip"), str(other), *map(str, sorted(zips.glob("py4j-*.zip")))])
    result = subprocess.run(
        [str(launcher), "-c", probe],
        env=os.environ | {"SPARK_HOME": str(spark_home()), "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    import py4j
    import pyspark

    assert result.stdout.split() == [str(other), pyspark.__file__, py4j.__file__]
