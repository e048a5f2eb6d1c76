"""The pipeline on a Spark standalone cluster (a master and two workers on loopback, separate
processes: ``spark_cluster``): the driver here, the executors and their Python workers in the
workers' process trees, sharing the checkpoint, the replay folder and the tables through the
file system as they would through a shared mount. The tests of test_pipeline.py, with
the same assertions as on ``local[2]``, and executors killed in the middle of a batch."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio

from martinet.messaging.client import Topic, connect
from martinet.pipeline.cluster import StandaloneCluster, descendants
from martinet.swiftlets.spark.config import SparkConfig

from tests.harness.network import STACK
from tests.pipeline.test_pipeline import (
    FAULT_SETTINGS,
    KILLS,
    failure,
    fault_env,
    keys_of,
    known_load,
    live_kills,
    pipeline_command,
    poll_pipeline,
    three_routers,
)

pytestmark = pytest.mark.slow

#: The kill points where a cluster differs: a batch logged and not committed, whose replay then
#: reads its part files in executors on the workers, not in the driver's process tree: killed
#: at the replay's first read there, and in the last run replayed there. (The other points are
#: in the driver's source runner, as on ``local[2]``.)
CLUSTER_KILLS = [kill for kill in KILLS if kill[0] in ("commit:before:2", "read:before:1")]


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
    # without the router's restart: the reader reconnects in the driver's source runner, as
    # on local[2]
    await live_kills(network, tmp_path, spark_cluster.master_url, CLUSTER_KILLS, restart_router=False)
    ran_on_the_cluster(spark_cluster, before, len(CLUSTER_KILLS) + 1)


async def test_three_routers_collected_on_the_cluster(network, tmp_path, spark_cluster):
    before = applications(spark_cluster)
    await three_routers(network, tmp_path, spark_cluster.master_url)
    ran_on_the_cluster(spark_cluster, before, 1)


async def test_the_live_source_on_the_cluster_delivers_every_row_once_when_an_executor_is_killed_mid_batch(
    network, tmp_path, spark_cluster
):
    """Two partitions per batch on a standalone cluster of two workers: the first two reads
    of a part file hold (not read yet); the test SIGKILLs the executor JVM running the first
    (with its Python workers) and the Python worker running the second. Spark runs the tasks
    again, on an executor that is left or is started anew, from the same part files, and the
    query goes on: every row once."""
    spark = SparkConfig(collect_interval=100, output="none", events_enabled=False, include_swiftlets="sys$store")
    router = await network.start(network.config("r1", startorder=(*STACK, "sys$spark"), swiftlets={"sys$spark": spark}))
    url = network.url("r1")
    async with connect(url, client_id="spark-rows") as connection, connection.session() as session:
        await (await session.durable_subscriber(Topic("martinet.metrics"), "spark-rows")).close()
    first = router.management.get("/sys$spark/usage", "rows") + 1  # no await in between: no sample
    router.management.set("/sys$spark", "output", "topic")
    epoch = router.management.get("/sys$spark/usage", "epoch")

    output, mark = tmp_path / "analysis", tmp_path / "held"
    env = fault_env("read:hold:2", mark)
    # the executors' Python workers take the fault points from the executors' environment
    executors = [f"--conf=spark.executorEnv.{name}={env[name]}" for name in FAULT_SETTINGS]
    arguments = ["--source", "live", "--url", url, "--output", str(output), "--partitions", "2", "--interval", "1"]
    log = tmp_path / "pipeline.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            pipeline_command(*arguments, *executors, master=spark_cluster.master_url),
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:

        def held(number: int) -> int | None:
            """The Python worker holding at the ``number``-th read, once it does."""
            text = Path(f"{mark}-{number}").read_text() if Path(f"{mark}-{number}").exists() else ""
            return int(text.split()[1]) if len(text.split()) == 2 else None

        await poll_pipeline(process, log, lambda: held(1) is not None, "a task holding in read")
        worker = held(1)
        executor = [e for e in spark_cluster.executors() if worker in {p.pid for p in descendants(e.pid)}]
        assert len(executor) == 1, f"the held task's process {worker} is not below one executor of the cluster"
        os.kill(executor[0].pid, signal.SIGKILL)
        await poll_pipeline(
            process, log, lambda: executor[0].pid not in {e.pid for e in spark_cluster.executors()}, "the executor gone"
        )
        await poll_pipeline(process, log, lambda: held(2) is not None, "a second task holding in read")
        worker = held(2)
        assert worker in {p.pid for p in spark_cluster.python_workers()}, f"{worker} is no executor's Python worker"
        os.kill(worker, signal.SIGKILL)

        seen = router.management.get("/sys$spark/usage", "rows")
        await poll_pipeline(process, log, lambda: (epoch, seen) in keys_of(output), "rows published after the kill")
        router.management.set("/sys$spark", "output", "none")
        published = router.management.get("/sys$spark/usage", "rows")
        await poll_pipeline(process, log, lambda: (epoch, published) in keys_of(output), "every published row")
        process.send_signal(signal.SIGINT)  # Ctrl-C: the queries stop, the job ends
        with trio.fail_after(120):
            code = await trio.to_thread.run_sync(process.wait)
        assert code == 0, failure(log.read_text(errors="replace"))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(process.wait)
    keys = keys_of(output)
    assert len(keys) == len(set(keys)), "a row was delivered twice"
    assert set(keys) == {(epoch, seq) for seq in range(first, published + 1)}
    driver = log.read_text(errors="replace")
    assert "ExecutorLostFailure" in driver, "the driver did not notice the killed executor"
    assert "Python worker exited unexpectedly" in driver, "the driver did not notice the killed Python worker"
