"""sys$topicmanager: hierarchy rules, predicates, subscriptions, durable life cycle,
no-local, selectors, interest events, slow subscribers, bad input."""

from __future__ import annotations

import logging

import pytest
import trio

from martinet.messaging.message import build
from martinet.swiftlets.topicmanager.api import (
    TopicError,
    TopicInterestChanged,
    TopicNameError,
    from_wildcards,
    matches,
    parse_topic,
)
from martinet.swiftlets.topicmanager.backlogs import BacklogWatch

from tests.harness.polling import drain, wait_until
from tests.harness.routers import RunningRouter

TOPIC_ROUTER = """
<router name="r1" startorder="sys$store sys$queuemanager sys$topicmanager" shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$topicmanager" {manager}>{children}</swiftlet>
</router>
"""


class TopicRouter(RunningRouter):
    def __init__(self, nursery, tmp_path, manager="", children=""):
        super().__init__(nursery, tmp_path)
        self.path.write_text(TOPIC_ROUTER.format(store=tmp_path / "store", manager=manager, children=children))

    @property
    def topic_manager(self):
        return self.router.swiftlet("sys$topicmanager")


@pytest.fixture
def make_topics(nursery, tmp_path):
    return lambda manager="", children="": TopicRouter(nursery, tmp_path, manager, children)


@pytest.fixture
async def topics(make_topics):
    running = make_topics()
    await running.start()
    yield running
    if not running._done.is_set():
        await running.stop()


def received(subscription, credit=100):
    consumer = subscription.consumer()
    consumer.flow(credit)
    got = []
    while True:
        try:
            got.append(consumer.receive_nowait().message.body().decode())
        except trio.WouldBlock:
            consumer.close()
            return got


# -- the hierarchy, table-driven (the JMS hierarchy's publishing and subscribing rules) -------------

HIERARCHY = [
    # (published to, subscribed to, received?)
    ("iit", "iit", True),
    ("iit", "iit.sales", True),  # a subscriber receives what is published to its parents
    ("iit", "iit.sales.US", True),
    ("iit.sales", "iit", True),  # publishing to a node reaches its sub-nodes' subscribers... and parents'
    ("iit.sales", "iit.sales", True),
    ("iit.sales", "iit.sales.US", True),
    ("iit.sales", "iit.sales.EU", True),
    ("iit.sales", "iit.projects", False),
    ("iit.sales.US", "iit.sales.US", True),
    ("iit.sales.US", "iit.sales", True),
    ("iit.sales.US", "iit", True),
    ("iit.sales.US", "iit.sales.EU", False),
    ("iit.projects", "iit.sales.US", False),
    ("iit.projects.swiftmq", "iit.sales", False),
    ("other", "iit", False),
    ("iit2", "iit", False),
    ("iit.sales.US.east", "iit.sales.US", True),
    ("iit.sales.US", "iit.sales.US.east", True),
    # predicates, on either side (SwiftMQ's SQL-like predicate topic addressing)
    ("iit.sales.US", "iit.s%s._S", True),
    ("iit.sales.EU", "iit.s%s._S", False),
    ("iit.s%s._S", "iit.sales.US", True),
    ("iit.projects.swiftmq", "iit.%.swiftmq", True),
    ("iit.sales.swiftmq", "iit.%.swiftmq", True),
    ("iit.sales.other", "iit.%.swiftmq", False),
    ("iit.sales", "iit.%.swiftmq", True),  # common prefix only
    ("iit.%", "iit.sales", True),
    ("iit.%", "iit.projects.x", True),
    ("iit.sa_es", "iit.sales", True),
    ("iit.sa_es", "iit.saXXes", False),
    ("iit.%.US", "iit.%.US", True),  # equal predicates agree
    ("iit.s%", "iit.%", True),  # one predicate matches the other's text
    ("iit.x%", "iit.y%", False),
    ("iit.a\\%b", "iit.a%b", True),  # an escaped % is a plain character
    ("iit.a\\%b", "iit.axb", False),
]


@pytest.mark.parametrize(("published", "subscribed", "expected"), HIERARCHY)
def test_hierarchy_rules(published, subscribed, expected):
    assert matches(parse_topic(subscribed), parse_topic(published)) is expected


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "cannot be empty"),
        ("iit..sales", "has an empty level"),
        ("iit.", "has an empty level"),
        ("%.sales", "the root level '%' may not be a predicate"),
        ("ii_t.sales", "may not be a predicate"),
        ("iit.sales\\", "ends with a lone escape"),
    ],
)
def test_bad_topic_names(name, message):
    with pytest.raises(TopicNameError, match=message.replace("(", "\\(")):
        parse_topic(name)


@pytest.mark.parametrize(
    ("written", "native"),
    [
        ("PRICE.STOCK.NYSE.*", "PRICE.STOCK.NYSE.%"),  # one level
        ("PRICE.*.NYSE.*", "PRICE.%.NYSE.%"),
        ("PRICE.#", "PRICE"),  # zero or more levels: a node reaches everything below it
        ("PRICE.STOCK.*.#", "PRICE.STOCK.%"),
        ("PRICE.STOCK", "PRICE.STOCK"),
        ("PRICE.ST*.N#", "PRICE.ST*.N#"),  # wildcards are whole levels; these are plain characters
        ("PRICE.st_ck", "PRICE.st_ck"),  # native predicates keep their meaning
    ],
)
def test_wildcards_translate_to_native_names(written, native):
    assert from_wildcards(written) == native


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("*.STOCK", "the root level may not be a wildcard"),
        ("#", "the root level may not be a wildcard"),
        ("PRICE.#.IBM", "'#' is supported as the last level only"),
        ("PRICE.#.#", "'#' is supported as the last level only"),
    ],
)
def test_wildcards_the_hierarchy_cannot_express(written, message):
    with pytest.raises(TopicNameError, match=message):
        from_wildcards(written)


async def test_publish_reaches_the_hierarchy_through_real_queues(topics):
    topic_manager = topics.topic_manager
    subscribers = {name: topic_manager.subscribe(name) for name in ("iit", "iit.sales", "iit.sales.US", "iit.projects")}
    for topic in ("iit", "iit.sales", "iit.sales.US", "iit.projects.x"):
        topic_manager.publish(topic, build(topic.encode()))
    assert received(subscribers["iit"]) == ["iit", "iit.sales", "iit.sales.US", "iit.projects.x"]
    assert received(subscribers["iit.sales"]) == ["iit", "iit.sales", "iit.sales.US"]
    assert received(subscribers["iit.sales.US"]) == ["iit", "iit.sales", "iit.sales.US"]
    assert received(subscribers["iit.projects"]) == ["iit", "iit.projects.x"]


async def test_a_subscriber_receives_a_message_once_however_many_subscriptions_match(topics):
    topic_manager = topics.topic_manager
    first = topic_manager.subscribe("iit.sales")
    topic_manager.subscribe("iit.%", queue=first.queue)  # the same subscriber, overlapping subscriptions
    topic_manager.subscribe("iit", queue=first.queue)
    result = topic_manager.publish("iit.sales.US", build(b"once"))
    assert result.deliveries == 1
    assert received(first) == ["once"]


async def test_no_local_and_selectors(topics):
    topic_manager = topics.topic_manager
    mine = topic_manager.subscribe("news", no_local=True, client_id="c1")
    others = topic_manager.subscribe("news", client_id="c1")
    greens = topic_manager.subscribe("news", selector="colour = 'green'")
    topic_manager.publish("news", build(b"from-c1-red", properties={"colour": "red"}), client_id="c1")
    topic_manager.publish("news", build(b"from-c2-green", properties={"colour": "green"}), client_id="c2")
    assert received(mine) == ["from-c2-green"]
    assert received(others) == ["from-c1-red", "from-c2-green"]
    assert received(greens) == ["from-c2-green"]


async def test_closing_a_subscription_drops_its_queue(topics):
    topic_manager = topics.topic_manager
    subscription = topic_manager.subscribe("news")
    consumer = subscription.consumer()
    topic_manager.publish("news", build(b"x"))
    subscription.close()
    assert subscription.queue.name not in topics.queue_manager.queues and consumer.closed
    assert topic_manager.publish("news", build(b"y")).deliveries == 0


async def test_durable_subscription_life_cycle(topics):
    topic_manager = topics.topic_manager
    durable = await topic_manager.durable_subscribe("client-1", "orders", "shop.orders", selector="amount > 10")
    assert durable.queue.name == "client-1$orders"

    def store_operations():
        return topics.router.management.get("/sys$store/usage", "operations")

    before = store_operations()
    topic_manager.publish("shop.orders", build(b"big", durable=True, properties={"amount": 50}))
    topic_manager.publish("shop.orders", build(b"small", durable=True, properties={"amount": 5}))
    topic_manager.publish("shop.orders.eu", build(b"big-eu", durable=True, properties={"amount": 11}))
    await wait_until(lambda: store_operations() == before + 2)  # the two copies, stored in the background
    await topics.restart()  # it keeps receiving while nobody is connected, and survives restarts
    topic_manager = topics.topic_manager
    assert sorted(topic_manager.durable_subscriptions()) == ["client-1$orders"]
    topic_manager.publish("shop.orders", build(b"after-restart", properties={"amount": 99}))
    resumed = await topic_manager.durable_subscribe("client-1", "orders", "shop.orders", selector="amount > 10")
    assert received(resumed) == ["big", "big-eu", "after-restart"]

    topic_manager.publish("shop.orders", build(b"pending", properties={"amount": 99}))
    changed = await topic_manager.durable_subscribe("client-1", "orders", "shop.orders")  # other selector: new one
    assert changed is not resumed and changed.queue.size == 0
    topic_manager.publish("shop.orders", build(b"any", properties={"amount": 1}))
    consumer = changed.consumer()
    with pytest.raises(TopicError, match="has 1 active consumer"):
        await topic_manager.unsubscribe("client-1", "orders")
    consumer.close()
    await topic_manager.unsubscribe("client-1", "orders")
    assert "client-1$orders" not in topics.queue_manager.queues and topic_manager.durable_subscriptions() == {}
    with pytest.raises(TopicError, match="no durable subscription 'client-1\\$orders'"):
        await topic_manager.unsubscribe("client-1", "orders")
    await topics.restart()
    assert topics.topic_manager.durable_subscriptions() == {}


async def test_durable_subscriptions_can_be_managed_without_a_client(topics):
    topic_manager = topics.topic_manager
    created = await topic_manager.durable_subscribe("admin@r1", "audit", "shop")  # the router suffix is dropped
    assert created.queue.name == "admin$audit"
    usage = topics.router.management.resolve("/sys$topicmanager/usage/durable-subscribers/admin$audit")
    assert usage.properties()["topic"] == "shop"
    await topic_manager.unsubscribe("admin", "audit")
    with pytest.raises(TopicError, match="invalid durable subscription"):
        await topic_manager.durable_subscribe("c", "a$b", "shop")


async def test_interest_events(topics):
    topic_manager = topics.topic_manager
    events = topics.router.bus.subscribe(TopicInterestChanged)
    first = topic_manager.subscribe("iit.sales")
    second = topic_manager.subscribe("iit")
    durable = await topic_manager.durable_subscribe("c", "d", "other.x")
    assert topic_manager.interest() == {"iit", "other"}
    first.close()
    second.close()
    await topic_manager.unsubscribe("c", "d")
    assert topic_manager.interest() == frozenset()
    assert [(e.root, e.interested) for e in drain(events)] == [
        ("iit", True),
        ("other", True),
        ("iit", False),
        ("other", False),
    ]
    assert durable.closed


async def test_slow_subscribers(make_topics):
    running = make_topics(
        children="""<slow-subscriber-conditions>
        <slow-subscriber-condition name="drops" max-messages="2" action="drop"/>
        <slow-subscriber-condition name="cuts" max-messages="2" action="disconnect"/>
        <slow-subscriber-condition name="waits" max-messages="2"/>
      </slow-subscriber-conditions>"""
    )
    await running.start()
    topic_manager = running.topic_manager
    dropping = topic_manager.subscribe("drops")
    durable = await topic_manager.durable_subscribe("c", "keep", "drops")
    results = [topic_manager.publish("drops", build(b"x")) for _ in range(4)]
    assert [r.dropped for r in results] == [0, 0, 1, 1]
    assert dropping.queue.size == 2 and durable.queue.size == 4  # durable: never dropped
    assert results[-1].delay_ms == 5000  # ... but publishers are told to wait

    cut = topic_manager.subscribe("cuts")
    consumer = cut.consumer()
    for _ in range(3):
        topic_manager.publish("cuts", build(b"x"))
    assert cut.closed and consumer.closed
    waiting = topic_manager.subscribe("waits")
    delays = [topic_manager.publish("waits", build(b"x")).delay_ms for _ in range(3)]
    assert delays == [0, 0, 5000] and waiting.queue.size == 3
    usage = running.router.management.resolve("/sys$topicmanager/usage/topics/cuts").properties()
    assert (usage["disconnected"], usage["published"]) == (1, 3)
    await running.stop()


async def test_bad_input(make_topics):
    running = make_topics(manager='auto-create-topics="false"', children='<topics><topic name="known.x"/></topics>')
    await running.start()
    topic_manager = running.topic_manager
    with pytest.raises(TopicError, match="root topic 'unknown' is not defined on router r1"):
        topic_manager.publish("unknown", build(b"x"))
    with pytest.raises(TopicError, match="root topic 'unknown' is not defined"):
        topic_manager.subscribe("unknown.y")
    assert topic_manager.publish("known.y", build(b"x")).deliveries == 0  # the root is defined
    with pytest.raises(TopicError, match="may not be a predicate"):
        topic_manager.subscribe("%")
    with pytest.raises(TopicError, match="at position"):
        topic_manager.subscribe("known", selector="colour = ")
    with pytest.raises(Exception, match="may not be a predicate"):
        running.router.management.add("/sys$topicmanager/topics", "_bad")
    await running.stop()


# -- durable subscriptions nobody consumes (backlogs.py) --------------------------------------


def test_a_backlog_grows_past_the_threshold_without_a_consumer_and_is_named_once_an_hour(caplog):
    """The baseline is the smallest backlog since the last consumer (or the first look): a
    stable backlog after a restart is not growing; a consumer resets it; the flag holds while
    nobody consumes, without flapping; a warning names a subscription at most once an hour."""
    state: dict[str, tuple[int, bool]] = {}
    watch = BacklogWatch(
        lambda: ((n, size, consumed) for n, (size, consumed) in state.items()),
        threshold=lambda: 10,
        interval=lambda: 1000,
    )

    def check(now: float, **backlogs: tuple[int, bool]) -> dict[str, int]:
        state.clear()
        state.update(backlogs)
        watch.check(now)
        return watch.growing

    with caplog.at_level(logging.WARNING, logger="martinet.swiftlets.topicmanager.backlogs"):
        assert check(0, old=(50, False), live=(5, True), small=(2, False)) == {}  # first look: the baselines
        assert check(60, old=(50, False), live=(40, True), small=(8, False)) == {}  # still; consumed; below 10
        assert check(120, old=(51, False), live=(40, False), small=(12, False)) == {"old": 51, "small": 12}
        assert check(180, old=(51, False), live=(41, False), small=(12, False)) == {"old": 51, "small": 12, "live": 41}
        assert check(240, old=(51, True), live=(41, False), small=(12, False)) == {"small": 12, "live": 41}
        assert check(300, old=(52, False), live=(41, False), small=(9, False)) == {"old": 52, "live": 41}
        assert check(3800, old=(53, False), live=(41, False)) == {"old": 53, "live": 41}  # small deleted
    assert [r.getMessage().partition(": ")[2] for r in caplog.records] == [
        "old (51 messages), small (12 messages); delete an abandoned one with martinet admin delete "
        "'/sys$topicmanager/usage/durable-subscribers' NAME --force",
        "old (51 messages), live (41 messages), small (12 messages); delete an abandoned one with martinet admin "
        "delete '/sys$topicmanager/usage/durable-subscribers' NAME --force",
        # (240, 300: old and live were named within the hour, small is not growing at 300)
        "old (53 messages), live (41 messages); delete an abandoned one with martinet admin delete "
        "'/sys$topicmanager/usage/durable-subscribers' NAME --force",
    ]
    assert (
        caplog.records[0]
        .getMessage()
        .startswith("2 durable subscription(s) without a consumer keep growing past unconsumed-backlog-warning 10: ")
    )
    state.clear()
    state.update({f"q{n}": (100 + n, False) for n in range(7)})
    watch.check(10_000)  # the first look at these
    state.update({f"q{n}": (200 + n, False) for n in range(7)})
    watch.check(10_060)
    assert (
        caplog.records[-1]
        .getMessage()
        .partition(": ")[2]
        .startswith(
            "q6 (206 messages), q5 (205 messages), q4 (204 messages), q3 (203 messages), q2 (202 messages) and 2 more; "
        )
    )


async def test_growing_durable_backlogs_show_in_usage_and_follow_the_settings(make_topics, caplog):
    running = make_topics(manager='unconsumed-backlog-warning="3" backlog-check-interval="100"')
    await running.start()
    topic_manager, tree = running.topic_manager, running.router.management

    def growing(queue: str) -> bool:
        return tree.get(f"/sys$topicmanager/usage/durable-subscribers/{queue}", "backlog-growing")

    async def publish_until(queue: str, flagged: bool) -> None:
        """Publish to ``news`` until ``queue``'s flag is ``flagged`` (a check saw it)."""
        with trio.fail_after(10):
            while growing(queue) != flagged:
                topic_manager.publish("news", build(b"x"))
                await trio.sleep(0.05)

    gone = await topic_manager.durable_subscribe("app", "gone", "news")
    live = await topic_manager.durable_subscribe("app", "live", "news")
    await topic_manager.durable_subscribe("app", "small", "quiet")
    reading = live.consumer()  # no credit: its backlog grows too, but it has a consumer
    topic_manager.publish("quiet", build(b"x"))
    with caplog.at_level(logging.WARNING, logger="martinet.swiftlets.topicmanager.backlogs"):
        await publish_until("app$gone", True)
        assert (growing("app$live"), growing("app$small")) == (False, False)  # (judged in the same check)
        assert live.queue.size >= 3 and tree.get("/sys$topicmanager/usage", "durable-backlogs-growing") == 1

        consumer = gone.consumer()  # the subscriber is back: no longer flagged ...
        await wait_until(lambda: not growing("app$gone"), what="app$gone consumed")
        consumer.close()  # ... and gone again: flagged once it grows, not named again within the hour
        await publish_until("app$gone", True)
        reading.close()
        await publish_until("app$live", True)  # a new one: a new warning line, naming both
    lines = [r.getMessage().partition(": ")[2] for r in caplog.records if r.name.endswith(".backlogs")]
    assert len(lines) == 2 and lines[0].startswith("app$gone (") and "app$live (" in lines[1], lines

    tree.set("/sys$topicmanager", "unconsumed-backlog-warning", "-1")  # off
    await wait_until(lambda: tree.get("/sys$topicmanager/usage", "durable-backlogs-growing") == 0)
    assert not growing("app$gone") and not growing("app$live")
    await running.stop()
