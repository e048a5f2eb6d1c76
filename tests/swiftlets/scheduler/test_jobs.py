"""Jobs the swiftlets ship, run by sys$scheduler on real routers: the Routing Connector brings
a real link up for its window and down after it (routes appear and disappear); the queue
manager's purger, cleanups and mover do their work on real queues of a router with a store."""

from __future__ import annotations

import socket
from datetime import datetime

import pytest
import trio

from martinet.kernel import ManagementError, Router, load_plugins
from martinet.messaging.message import build
from martinet.swiftlets.routing.config import ConnectorConfig
from martinet.swiftlets.scheduler.api import JobFinished, JobStarted
from martinet.swiftlets.scheduler.config import ParameterConfig, ScheduleConfig, SchedulerConfig

from tests.harness.network import ROUTING_STACK, Network, routing_config
from tests.harness.wallclock import PARIS, ClockPlugin, TrioClock


@pytest.fixture
async def network(nursery, tmp_path):
    network = Network(nursery, tmp_path)
    yield network
    await network.stop_all()


async def test_the_routing_connector_job_brings_a_link_up_for_its_window(network, nursery):
    await network.start_routers("paris")
    connector = ConnectorConfig(
        name="paris", hostname="127.0.0.1", port=network.routing_port("paris"), enabled=False, retry_time=1000
    )
    window = ScheduleConfig(
        name="night-link",
        enabled=True,
        job_group="Routing",
        job_name="Routing Connector",
        time_expression="at 22:00",
        max_runtime="10s",
        parameters=[ParameterConfig(name="Connector Name", value="paris")],
    )
    config = network.config(
        "tokyo",
        startorder=(*ROUTING_STACK, "sys$scheduler"),
        swiftlets={
            "sys$routing": routing_config(connectors=[connector]),
            "sys$scheduler": SchedulerConfig(time_zone="Europe/Paris", schedules=[window]),
        },
    )
    # Real time (real sockets): the clock says 21:59:59 at the start, so the window opens in a second.
    plugins = load_plugins([ClockPlugin(TrioClock(datetime(2026, 3, 6, 21, 59, 59, tzinfo=PARIS)))])
    tokyo = Router(config, plugins.specs, hook=plugins.hook)
    started = tokyo.bus.subscribe(JobStarted, max_buffer=10)
    finished = tokyo.bus.subscribe(JobFinished, max_buffer=10)
    await nursery.start(tokyo.run)
    network.routers["tokyo"] = tokyo
    tree = tokyo.management
    assert tree.get("/sys$scheduler/usage/schedules/night-link", "next-start") == "2026-03-06T22:00:00"
    assert (network.table("tokyo"), network.table("paris")) == ({}, {})
    assert tree.get("/sys$routing/usage/connectors/paris", "state") == "disabled"

    with trio.fail_after(10):
        assert (await started.receive()).planned == "2026-03-06T22:00:00"
    await network.settle({"tokyo": {"paris": 1}, "paris": {"tokyo": 1}}, timeout=8)
    assert tree.get("/sys$scheduler/usage/schedules/night-link", "state") == "running"  # still in its window

    with trio.fail_after(20):
        ended = await finished.receive()
    assert (ended.job_group, ended.job_name, ended.outcome, ended.message) == (
        "Routing",
        "Routing Connector",
        "stopped",
        "max-runtime 10s reached",
    )
    await network.settle({"tokyo": {}, "paris": {}}, timeout=10)
    assert tree.get("/sys$routing/connectors/paris", "enabled") is False
    assert tree.get("/sys$routing/usage/connectors/paris", "state") == "disabled"
    assert tree.get("/sys$scheduler/usage/schedules/night-link", "next-start") == "2026-03-07T22:00:00"
    tokyo.request_stop()


async def test_the_routing_connector_job_ends_the_retries_at_its_stop(network, nursery):
    """Nobody listens at the connector's port: the connector retries during the job, and
    retries end when the job stops (as SwiftMQ's connector job does)."""
    with socket.socket() as placeholder:  # a port nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    connector = ConnectorConfig(name="gone", hostname="127.0.0.1", port=port, enabled=False, retry_time=1000)
    window = ScheduleConfig(
        name="try",
        job_group="Routing",
        job_name="Routing Connector",
        time_expression="at 22:00",
        max_runtime="3s",
        parameters=[ParameterConfig(name="Connector Name", value="gone")],
    )
    tokyo = await network.start(
        network.config(
            "tokyo",
            startorder=(*ROUTING_STACK, "sys$scheduler"),
            swiftlets={
                "sys$routing": routing_config(connectors=[connector]),
                "sys$scheduler": SchedulerConfig(schedules=[window]),
            },
        )
    )
    usage, tree = "/sys$routing/usage/connectors/gone", tokyo.management
    finished = tokyo.bus.subscribe(JobFinished, max_buffer=10)
    await tree.invoke("/sys$scheduler/usage/schedules/try", "start")
    with trio.fail_after(10):
        while tree.get(usage, "attempts") < 2:  # it retries during the job
            await trio.sleep(0.05)
        ended = await finished.receive()
    assert (ended.outcome, ended.message) == ("stopped", "max-runtime 3s reached")
    assert tree.get("/sys$routing/connectors/gone", "enabled") is False
    with trio.fail_after(5):  # the routing swiftlet ends the connector's task on the change
        while tree.get(usage, "state") != "disabled":
            await trio.sleep(0.05)
    assert (tree.get(usage, "next-attempt"), tree.get(usage, "attempts")) == ("", 0)
    await trio.sleep(1.5)  # one and a half retry-times: no attempt
    assert (tree.get(usage, "state"), tree.get(usage, "attempts")) == ("disabled", 0)


async def test_the_routing_connector_job_fails_for_an_unknown_connector(network, nursery):
    window = ScheduleConfig(
        name="typo",
        enabled=True,
        job_group="Routing",
        job_name="Routing Connector",
        time_expression="at 22:00",
        parameters=[ParameterConfig(name="Connector Name", value="pariss")],
    )
    config = network.config(
        "tokyo",
        startorder=(*ROUTING_STACK, "sys$scheduler"),
        swiftlets={"sys$routing": routing_config(), "sys$scheduler": SchedulerConfig(schedules=[window])},
    )
    tokyo = await network.start(config)
    finished = tokyo.bus.subscribe(JobFinished, max_buffer=10)
    await tokyo.management.invoke("/sys$scheduler/usage/schedules/typo", "start")
    with trio.fail_after(10):
        ended = await finished.receive()
    assert ended.outcome == "failed"
    assert ended.message.startswith("cannot enable connector 'pariss': no 'pariss' under /sys$routing/connectors")


# -- the Queue Manager group, on real queues of a router with a store -----------------------------

QUEUE_ROUTER = """
<router name="r1" startorder="sys$store sys$queuemanager sys$scheduler" shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$queuemanager">
    <queues><queue name="ttl"/><queue name="ttl-dlq"/></queues>
  </swiftlet>
  <swiftlet name="sys$scheduler">
    <schedules>
      <schedule name="purge" job-group="Queue Manager" job-name="Queue Purger" time-expression="at 03:00">
        <parameters><parameter name="Queue Name" value="orders.%"/></parameters>
      </schedule>
      <schedule name="cleanup" job-group="Queue Manager" job-name="Queue Cleanup" time-expression="at 03:00">
        <parameters><parameter name="Queue Name" value="ttl"/></parameters>
      </schedule>
      <schedule name="cleanup-dlq" job-group="Queue Manager" job-name="Queue Cleanup DLQ"
                time-expression="at 03:00">
        <parameters><parameter name="Queue Name" value="ttl-dlq"/></parameters>
      </schedule>
      <schedule name="move" job-group="Queue Manager" job-name="Queue Mover" time-expression="at 03:00">
        <parameters>
          <parameter name="Source Queue" value="in"/>
          <parameter name="Target Queue" value="out@r1"/>
          <parameter name="Selector" value="n &gt; 2"/>
        </parameters>
      </schedule>
    </schedules>
  </swiftlet>
</router>
"""


def message(n: int, **options):
    return build(f"m{n}".encode(), message_id=f"id-{n}", properties={"n": n}, **options)


@pytest.fixture
async def queue_router(nursery, write_config, tmp_path):
    router = Router.from_file(write_config(QUEUE_ROUTER.format(store=tmp_path / "store")))
    await nursery.start(router.run)
    yield router
    router.request_stop()


async def run_job(router: Router, schedule: str) -> JobFinished:
    """Start a schedule's job as an operator would and wait for its end."""
    finished = router.bus.subscribe(JobFinished, max_buffer=10)
    with finished:
        await router.management.invoke(f"/sys$scheduler/usage/schedules/{schedule}", "start")
        with trio.fail_after(10):
            return await finished.receive()


def messages(router: Router, queue: str) -> int:
    return router.management.get(f"/sys$queuemanager/usage/queues/{queue}", "messages")


async def test_the_queue_purger_empties_the_queues_a_predicate_matches(queue_router):
    queue_manager = queue_router.swiftlet("sys$queuemanager")
    for queue, count in (("orders.eu", 3), ("orders.us", 2), ("orders", 1)):
        for n in range(count):
            await queue_manager.send(queue, message(n))
    ended = await run_job(queue_router, "purge")
    assert (ended.outcome, ended.message) == ("success", "messages purged: orders.eu: 3, orders.us: 2")
    assert [messages(queue_router, q) for q in ("orders.eu", "orders.us", "orders")] == [0, 0, 1]


async def test_the_queue_cleanups_take_expired_messages_out_now(queue_router):
    queue_manager = queue_router.swiftlet("sys$queuemanager")
    for queue in ("ttl", "ttl-dlq"):
        await queue_manager.send(queue, message(1, ttl=50))
        await queue_manager.send(queue, message(2, ttl=50))
        await queue_manager.send(queue, message(3))
    await trio.sleep(0.1)  # real time: expiry is wall-clock time (nothing here measures it)
    ended = await run_job(queue_router, "cleanup")
    assert (ended.outcome, ended.message) == ("success", "expired messages removed: ttl: 2")
    assert (messages(queue_router, "ttl"), messages(queue_router, "routerdlq")) == (1, 0)  # dropped
    ended = await run_job(queue_router, "cleanup-dlq")
    assert (ended.outcome, ended.message) == ("success", "expired messages removed: ttl-dlq: 2")
    assert (messages(queue_router, "ttl-dlq"), messages(queue_router, "routerdlq")) == (1, 2)


async def test_the_queue_mover_moves_what_the_selector_matches(queue_router):
    queue_manager = queue_router.swiftlet("sys$queuemanager")
    for n in range(6):
        await queue_manager.send("in", message(n))
    ended = await run_job(queue_router, "move")
    assert (ended.outcome, ended.message) == ("success", "3 messages moved from in to out@r1")
    consumer = queue_manager.queue("out").consumer()
    consumer.flow(10)
    assert [entry.message.body() for entry in consumer.take(10)] == [b"m3", b"m4", b"m5"]
    assert messages(queue_router, "in") == 3


async def test_bad_job_parameters_are_refused_at_once(queue_router):
    tree = queue_router.management
    with pytest.raises(ManagementError, match="parameter 'Selector': .*"):
        tree.set("/sys$scheduler/schedules/move/parameters/Selector", "value", "n >")
    with pytest.raises(ManagementError, match="parameter 'Target Queue': invalid queue name 'a b'"):
        tree.set("/sys$scheduler/schedules/move/parameters/Target Queue", "value", "a b@r2")


async def test_the_queue_mover_moves_to_a_queue_of_another_router(network):
    await network.start_routers("paris")
    mover = ScheduleConfig(
        name="offload",
        job_group="Queue Manager",
        job_name="Queue Mover",
        time_expression="at 03:00",
        parameters=[
            ParameterConfig(name="Source Queue", value="in"),
            ParameterConfig(name="Target Queue", value="out@paris"),
            ParameterConfig(name="Selector", value="n >= 2"),
        ],
    )
    tokyo = await network.start(
        network.config(
            "tokyo",
            startorder=(*ROUTING_STACK, "sys$scheduler"),
            swiftlets={"sys$routing": routing_config(), "sys$scheduler": SchedulerConfig(schedules=[mover])},
        )
    )
    network.connect("tokyo", "paris")
    await network.settle({"tokyo": {"paris": 1}, "paris": {"tokyo": 1}})
    for n in range(5):
        await tokyo.swiftlet("sys$queuemanager").send("in", message(n, durable=True))
    ended = await run_job(tokyo, "offload")
    assert (ended.outcome, ended.message) == ("success", "3 messages moved from in to out@paris")
    assert messages(tokyo, "in") == 2
    paris = network.routers["paris"].swiftlet("sys$queuemanager")
    with trio.fail_after(10):
        while "out" not in paris.queues or messages(network.routers["paris"], "out") < 3:
            await trio.sleep(0.05)
    consumer = paris.queue("out").consumer()
    consumer.flow(10)
    assert [entry.message.body() for entry in consumer.take(10)] == [b"m2", b"m3", b"m4"]


# -- Topic Manager: Delete Durable; Scheduler: Message Sender ---------------------------------------

TOPIC_ROUTER = """
<router name="r1" startorder="sys$store sys$queuemanager sys$topicmanager sys$scheduler" shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$scheduler">
    <schedules>
      <schedule name="sunday-cleanup" job-group="Topic Manager" job-name="Delete Durable" time-expression="at 03:00">
        <parameters><parameter name="Client Id" value="shop-%"/></parameters>
      </schedule>
      <schedule name="tick" job-group="Scheduler" job-name="Message Sender" time-expression="at 03:00">
        <parameters><parameter name="Destination" value="ticks"/><parameter name="Body" value="tick"/></parameters>
      </schedule>
      <schedule name="news" job-group="Scheduler" job-name="Message Sender" time-expression="at 03:00">
        <parameters>
          <parameter name="Destination" value="topic://news.daily"/><parameter name="Body" value="hello"/>
          <parameter name="Persistent" value="false"/>
        </parameters>
      </schedule>
    </schedules>
  </swiftlet>
</router>
"""


@pytest.fixture
async def topic_router(nursery, write_config, tmp_path):
    router = Router.from_file(write_config(TOPIC_ROUTER.format(store=tmp_path / "store")))
    await nursery.start(router.run)
    yield router
    router.request_stop()


async def test_delete_durable_removes_the_matching_durable_subscriptions(topic_router):
    topics = topic_router.swiftlet("sys$topicmanager")
    for client_id, name in (("shop-1", "orders"), ("shop-2", "orders"), ("shop-3", "audit"), ("bank", "orders")):
        await topics.durable_subscribe(client_id, name, "shop.orders")
    topics.publish("shop.orders", message(1, durable=True))
    busy = topics.durable_subscriptions()["shop-3$audit"].consumer()
    ended = await run_job(topic_router, "sunday-cleanup")
    assert (ended.outcome, ended.message) == (
        "success",
        "deleted: shop-1/orders, shop-2/orders; left: shop-3/audit (durable subscription "
        "shop-3$audit has 1 active consumer(s): close them first)",
    )
    assert sorted(topics.durable_subscriptions()) == ["bank$orders", "shop-3$audit"]
    assert "shop-1$orders" not in topic_router.swiftlet("sys$queuemanager").queues
    busy.close()


async def test_the_message_sender_sends_to_a_queue_and_a_topic(topic_router):
    topics = topic_router.swiftlet("sys$topicmanager")
    subscription = topics.subscribe("news.%")
    assert (await run_job(topic_router, "tick")).message == "sent to ticks"
    assert (await run_job(topic_router, "news")).message == "sent to topic://news.daily"
    queue_manager = topic_router.swiftlet("sys$queuemanager")
    consumer = queue_manager.queue("ticks").consumer()
    consumer.flow(5)
    [tick] = consumer.take(5)
    assert (tick.message.body(), tick.message.durable, tick.message.properties.subject) == ("tick", True, "tick")
    news = subscription.consumer()
    news.flow(5)
    [hello] = news.take(5)
    assert (hello.message.body(), hello.message.durable) == ("hello", False)


# -- Store: Backup and Vacuum ----------------------------------------------------------------------

STORE_ROUTER = """
<router name="r1" startorder="sys$store sys$queuemanager sys$scheduler" shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$scheduler">
    <schedules>
      <schedule name="backup" job-group="Store" job-name="Backup" time-expression="at 03:00">
        <parameters><parameter name="Folder" value="{backups}"/><parameter name="Generations" value="2"/></parameters>
      </schedule>
      <schedule name="vacuum" job-group="Store" job-name="Vacuum" time-expression="at 04:00"/>
    </schedules>
  </swiftlet>
</router>
"""


async def test_backups_are_consistent_copies_and_only_the_newest_are_kept(write_config, tmp_path, monkeypatch):
    backups = tmp_path / "backups"
    path = write_config(STORE_ROUTER.format(store=tmp_path / "store", backups=backups))
    router = Router.from_file(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        queue_manager = router.swiftlet("sys$queuemanager")
        for n in range(100):
            await queue_manager.send("orders", build(bytes(2000), durable=True, message_id=f"id-{n}"))
        stamps = iter(["20260306-030000", "20260307-030000", "20260308-030000"])
        monkeypatch.setattr("martinet.swiftlets.store.jobs.time.strftime", lambda _: next(stamps))
        for _ in range(3):
            ended = await run_job(router, "backup")
            assert ended.outcome == "success", ended.message
        assert sorted(p.name for p in backups.iterdir()) == ["r1-20260307-030000.sqlite", "r1-20260308-030000.sqlite"]
        assert ended.message.startswith(f"{backups}/r1-20260308-030000.sqlite (") and ended.message.endswith("2 kept")

        consumer = queue_manager.queue("orders").consumer()
        consumer.flow(100)
        for entry in consumer.take(100):
            consumer.accept(entry)
        await trio.sleep(0.2)  # the deletes are committed in the background
        ended = await run_job(router, "vacuum")
        assert ended.outcome == "success" and ended.message.endswith(" bytes freed")
        assert int(ended.message.split()[0]) > 0  # the pages of the deleted messages
        router.request_stop()

    # The newest copy, put in place of the database, is a store holding the 100 messages.
    (backups / "r1-20260308-030000.sqlite").replace(tmp_path / "store" / "r1.sqlite")
    restored = Router.from_file(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(restored.run)
        assert messages(restored, "orders") == 100
        restored.request_stop()


async def test_a_backup_folder_that_cannot_be_written_fails_the_job_plainly(write_config, tmp_path, caplog):
    backups = tmp_path / "backups"
    backups.write_text("a file where the folder should be")
    router = Router.from_file(write_config(STORE_ROUTER.format(store=tmp_path / "store", backups=backups / "daily")))
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        ended = await run_job(router, "backup")
        assert (ended.outcome, ended.message) == ("failed", f"cannot write to {backups / 'daily'}: Not a directory")
        router.request_stop()
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []  # bad input: no traceback in the log
