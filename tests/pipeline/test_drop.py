"""``martinet-pipeline --drop``: the live source's durable subscriptions, abandoned, are seen
growing (usage, /metrics, one WARNING line) and are deleted through the real CLI with the
product's confirmation. No Spark: the drop path does not start it, and the subscriptions are
made by a real AMQP client exactly as the live source makes them (same client ids and names,
from :func:`martinet.pipeline.drop.subscription`, which the source uses; the Spark test of the
live source drops the ones Spark made)."""

from __future__ import annotations

import logging
import sys

import trio

from martinet.messaging.client import Topic, connect
from martinet.pipeline.drop import TABLES, subscription
from martinet.swiftlets.spark.config import SparkConfig
from martinet.swiftlets.topicmanager.config import TopicManagerConfig
from martinet.swiftlets.web.config import WebConfig

from tests.harness.network import STACK
from tests.harness.polling import wait_until
from tests.swiftlets.web.test_web import fetch, samples, value

DURABLES = "/sys$topicmanager/usage/durable-subscribers"
ROWS, EVENTS = "spark-rows$spark-rows", "spark-events$spark-events"


async def pipeline(*args: str) -> tuple[int, str, str]:
    """``martinet-pipeline ARGS`` as a process: exit status, stdout, stderr."""
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, "-m", "martinet.pipeline", *args], capture_stdout=True, capture_stderr=True, check=False
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_the_abandoned_pipelines_subscriptions_are_reported_and_dropped_with_a_confirmation(network, caplog):
    configs = {
        "sys$spark": SparkConfig(collect_interval=100, output="none", include_swiftlets="sys$store"),
        "sys$topicmanager": TopicManagerConfig(unconsumed_backlog_warning=3, backlog_check_interval=100),
        "sys$web": WebConfig(enabled=True, port=0),
    }
    startorder = (*STACK, "sys$mgmt", "sys$spark", "sys$web")
    router = await network.start(network.config("r1", startorder=startorder, swiftlets=configs))
    tree, url = router.management, network.url("r1")
    with caplog.at_level(logging.WARNING, logger="martinet.swiftlets.topicmanager.backlogs"):
        for table in TABLES:  # as the live source subscribes; then the pipeline is given up
            client_id, name = subscription(table)
            async with connect(url, client_id=client_id) as connection, connection.session() as session:
                await (await session.durable_subscriber(Topic("martinet.metrics"), name)).close()
        # published only once both exist: a backlog check between the two would warn of one alone
        tree.set("/sys$spark", "output", "topic")

        await wait_until(
            lambda: tree.get("/sys$topicmanager/usage", "durable-backlogs-growing") == 2,
            what="both backlogs seen growing",
        )
        metrics = samples((await fetch(router.swiftlet("sys$web").url + "/metrics"))[2])
    for queue in (ROWS, EVENTS):
        assert tree.get(f"{DURABLES}/{queue}", "backlog-growing") is True
        growing = "martinet_topicmanager_durable_subscribers_backlog_growing"
        assert value(metrics, growing, router="r1", durable_subscriber=queue) == 1
    assert value(metrics, "martinet_topicmanager_durable_backlogs_growing", router="r1") == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "martinet.swiftlets.topicmanager.backlogs"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "2 durable subscription(s) without a consumer keep growing past unconsumed-backlog-warning 3: "
    )
    assert ROWS in warnings[0] and EVENTS in warnings[0]

    tree.set("/sys$spark", "output", "none")  # nothing more published: the backlogs hold still
    held = {queue: tree.get(f"{DURABLES}/{queue}", "messages") for queue in (ROWS, EVENTS)}
    assert min(held.values()) >= 3

    status, out, err = await pipeline("--source", "live", "--url", url, "--drop")
    assert (status, out) == (1, "")
    assert err.splitlines() == [
        f"martinet-pipeline: {queue} not dropped: r1: delete of {DURABLES}/{queue} drops {held[queue]} message(s): "
        "not done without force (a confirmation); add --force to do it"
        for queue in (ROWS, EVENTS)
    ]
    assert sorted(tree.resolve(DURABLES).children) == [EVENTS, ROWS]

    client_id, name = subscription("events")
    async with connect(url, client_id=client_id) as connection, connection.session() as session:
        await session.durable_subscriber(Topic("martinet.metrics"), name)  # the pipeline runs again
        status, out, err = await pipeline("--url", url, "--drop", "--force")
        assert status == 1
        assert out == f"router r1: durable subscription {ROWS} dropped with {held[ROWS]} message(s)\n"
        assert err == (
            f"martinet-pipeline: {EVENTS} not dropped: r1: {DURABLES}/{EVENTS}: operation 'delete' refused: "
            f"durable subscription {EVENTS} has 1 active consumer(s): close them first\n"
        )
    await wait_until(lambda: tree.get(f"{DURABLES}/{EVENTS}", "consumers") == 0, what="the consumer gone")
    left = tree.get(f"{DURABLES}/{EVENTS}", "messages")
    status, out, err = await pipeline("--url", url, "--drop", "--force")
    assert (status, err) == (0, "")
    assert out == f"router r1: durable subscription {EVENTS} dropped with {left} message(s)\n"
    assert tree.resolve(DURABLES).children == {}
    assert tree.get("/sys$topicmanager/usage", "durable-subscribers") == 0

    status, out, err = await pipeline("--url", url, "--drop")
    assert (status, out, err) == (0, "router r1: no durable subscription of the pipeline, nothing to drop\n", "")
    status, out, err = await pipeline("--drop")
    assert status == 2 and "--drop needs --url" in err
