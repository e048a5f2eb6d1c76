"""The pipeline on a Spark standalone cluster (a master and two workers on loopback, separate
processes: ``spark_cluster``): the driver here, the executors and their Python workers in the
workers' process trees, sharing the checkpoint, the replay folder and the tables through the
file system as they would through a shared mount. The tests of test_spark_pipeline.py, with
the same assertions as on ``local[2]``."""

from __future__ import annotations

import time

import pytest
from test_spark_pipeline import KILLS, known_load, live_kills, three_routers

from martinet.pipeline.cluster import StandaloneCluster

pytestmark = pytest.mark.slow

#: The kill points where a cluster differs: a batch logged and not committed, whose replay then
#: runs in an executor on a worker, not in the driver's process tree: killed there, and in the
#: last run replayed there.
CLUSTER_KILLS = [kill for kill in KILLS if kill[0] in ("commit:before:2", "readBetweenOffsets:before:1")]


def applications(cluster: StandaloneCluster) -> dict[str, dict]:
    """The applications the master ran or runs, by id."""
    state = cluster.state()
    return {app["id"]: app for app in state["activeapps"] + state["completedapps"]}


def ran_on_the_cluster(cluster: StandaloneCluster, before: dict[str, dict], runs: int) -> None:
    """The pipeline's ``runs`` runs since ``before`` were applications of the cluster, each
    with the executors of both workers (a core each), and ended (a killed driver too: the
    master sees its connection go)."""
    deadline = time.monotonic() + 30
    while True:
        new = [app for id, app in applications(cluster).items() if id not in before]
        if len(new) == runs and all(app["state"] == "FINISHED" for app in new) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [(app["name"], app["state"], app["cores"]) for app in new] == [("martinet-pipeline", "FINISHED", 2)] * runs


async def test_known_load_on_the_cluster(network, tmp_path, spark_cluster):
    before = applications(spark_cluster)
    await known_load(network, tmp_path, spark_cluster.master_url)
    ran_on_the_cluster(spark_cluster, before, 3)  # live, then files twice


async def test_the_live_source_on_the_cluster_delivers_every_row_once_across_kills(network, tmp_path, spark_cluster):
    before = applications(spark_cluster)
    await live_kills(network, tmp_path, spark_cluster.master_url, CLUSTER_KILLS)
    ran_on_the_cluster(spark_cluster, before, len(CLUSTER_KILLS) + 1)


async def test_three_routers_collected_on_the_cluster(network, tmp_path, spark_cluster):
    before = applications(spark_cluster)
    await three_routers(network, tmp_path, spark_cluster.master_url)
    ran_on_the_cluster(spark_cluster, before, 1)
