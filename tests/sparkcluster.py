"""Spark as separate processes for the pipeline's tests (:mod:`martinet.pipeline.cluster`):
``spark_cluster``, a standalone cluster on loopback (a master and two workers of 1 core and
1 GiB each: this machine has 2 cores), and ``spark_connect``, a Spark Connect server. One per
test module (each start costs 10-20 s); their logs and work folders stay in the module's
temp folder. Without Java they are skipped, unless CI is set: there a missing Java fails."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from martinet.pipeline.cluster import ConnectServer, StandaloneCluster, java_missing


def need_java() -> None:
    reason = java_missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: .ci/run installs default-jre-headless")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """A started :class:`StandaloneCluster`: ``.master_url`` (``spark://127.0.0.1:PORT``),
    ``.worker_pids``, ``.executors()`` and ``.python_workers()`` (their processes, to kill one),
    ``.state()`` (the master's JSON). Every process of it is killed at the module's end."""
    need_java()
    with StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spark_connect(tmp_path_factory) -> Iterator[ConnectServer]:
    """A started Spark Connect server on ``local[2]``: ``.url`` (``sc://127.0.0.1:PORT``)."""
    need_java()
    with ConnectServer(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server
