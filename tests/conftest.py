"""The tests' fixtures, for every test module; the helpers they build on live in
``tests/harness`` (test modules import those from there, never from here)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from martinet.kernel import Router, load_swiftlet_specs
from martinet.pipeline.cluster import ConnectServer, StandaloneCluster, worker_launcher

from tests.harness import probe_plugin
from tests.harness.network import Network
from tests.harness.paths import ECHO_PLUGIN
from tests.harness.processes import RouterProcesses
from tests.harness.routers import AmqpBroker, RunningRouter
from tests.harness.sparkcluster import need_java
from tests.harness.sparkjvm import cluster_daemon_options

PIPELINE = Path(__file__).parent / "pipeline"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: those that start Spark, then the others marked slow, then the
    rest (each group in its own order). The suite's workers take files in this order
    (``--dist loadfile --no-loadscope-reorder``), so the last files to start are short ones
    and no worker runs a long file while the others are done."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is None:
            return 2
        return 0 if item.path.is_relative_to(PIPELINE) else 1

    items.sort(key=rank)


@pytest.fixture
def write_config(tmp_path):
    """Write XML text to a file in the test's temp dir and return its path."""

    def write(text: str, name: str = "router.xml") -> Path:
        path = tmp_path / name
        path.write_text(text.strip() + "\n")
        return path

    return write


@pytest.fixture
def make_router(write_config):
    """A Router from XML text, with the probe swiftlets test$a … test$e available."""

    def make(text: str) -> Router:
        return Router.from_file(write_config(text), plugins=[probe_plugin])

    return make


@pytest.fixture
def probe_specs():
    return load_swiftlet_specs([probe_plugin])


@pytest.fixture(scope="session")
def echo_site(tmp_path_factory) -> Path:
    """The example plugin pip-installed (for real, from its own pyproject) into a folder.

    Putting the folder on sys.path (or PYTHONPATH) makes its entry point visible; without
    it the plugin is not installed, so each test decides which world it runs in.
    """
    target = tmp_path_factory.mktemp("echo-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(ECHO_PLUGIN),
        ],
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
        timeout=300,
    )
    return target


@pytest.fixture
async def broker(nursery, tmp_path):
    """A started router with sys$store and sys$queuemanager (stopped after the test)."""
    running = RunningRouter(nursery, tmp_path)
    await running.start()
    yield running
    if not running._done.is_set():
        await running.stop()


@pytest.fixture
def make_broker(nursery, tmp_path):
    """Build (not start) a RunningRouter with extra manager attributes and queue elements."""
    return lambda manager="", queues="", sync="normal": RunningRouter(nursery, tmp_path, manager, queues, sync)


@pytest.fixture
def amqp_broker(nursery, tmp_path):
    """``await amqp_broker(auth="true", ...)``: a started :class:`AmqpBroker`."""
    return lambda **options: AmqpBroker(nursery, tmp_path, **options).start()


@pytest.fixture
async def network(nursery, tmp_path):
    """A :class:`tests.harness.network.Network`: routers built from RouterConfig objects, in this process."""
    routers = Network(nursery, tmp_path)
    yield routers
    await routers.stop_all()


@pytest.fixture
def router_processes(tmp_path):
    """A :class:`tests.harness.processes.RouterProcesses` in the test's temp dir: real ``martinet run``
    processes, ``router_processes.start(xml)``; every one still running is killed at teardown."""
    routers = RouterProcesses(tmp_path / "routers")
    yield routers
    routers.close()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """A started :class:`StandaloneCluster`: ``.master_url`` (``spark://127.0.0.1:PORT``),
    ``.worker_pids``, ``.executors()`` and ``.python_workers()`` (their processes, to kill one),
    ``.state()`` (the master's JSON). Every process of it is killed at the module's end.

    Its daemons and the executors they start take the tests' JVM options and class-data
    archive (``cluster_daemon_options``). Its executors run on this machine, so the pipelines
    the tests start (their drivers' Python is what the executors run) take the launcher that
    keeps Spark's ``pyspark.zip`` off the Python workers' path, as a local master does
    (``worker_launcher``)."""
    need_java()
    folder = tmp_path_factory.mktemp("spark-cluster")
    with ExitStack() as stack:
        with pytest.MonkeyPatch.context() as daemons:  # the daemons' environment only
            for name, value in cluster_daemon_options().items():
                daemons.setenv(name, value)
            cluster = stack.enter_context(StandaloneCluster(folder))
        drivers = stack.enter_context(pytest.MonkeyPatch.context())
        drivers.setenv("PYSPARK_PYTHON", str(worker_launcher(folder / "python", sys.executable)))
        yield cluster


@pytest.fixture(scope="module")
def spark_connect(tmp_path_factory) -> Iterator[ConnectServer]:
    """A started Spark Connect server on ``local[2]``: ``.url`` (``sc://127.0.0.1:PORT``).

    Its Python runs the shell script ``.folder / "before-foreach-batch-worker.sh"``, when a
    test has written one, before each ``foreachBatch`` worker starts (one server for every
    test of a module: a server's start costs some 12 s of CPU)."""
    need_java()
    folder = tmp_path_factory.mktemp("spark-connect")
    python = folder / "server-python"
    script = folder / "before-foreach-batch-worker.sh"
    python.write_text(
        f'#!/bin/sh\ncase "$*" in *foreach_batch_worker*) [ -e {script} ] && . {script};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    with ConnectServer(folder, python=str(python)) as server:
        yield server
