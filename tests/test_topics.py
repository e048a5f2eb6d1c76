"""sys$topicmanager: hierarchy rules, predicates, subscriptions, durable life cycle,
no-local, selectors, interest events, slow subscribers, bad input."""

from __future__ import annotations

import pytest
import trio

from martinet.messaging.message import build
from martinet.swiftlets.topicmanager import TopicError, TopicInterestChanged
from martinet.swiftlets.topicmanager.hierarchy import TopicNameError, matches, parse_topic

from conftest import RunningRouter, drain

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
    def tm(self):
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


# -- the hierarchy, table-driven (seed 001: "Publishing and subscribing rules") -------------

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
    # predicates, on either side (seed 001: "SQL-Like Predicate Topic Addressing")
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


@pytest.mark.parametrize(("name", "message"), [
    ("", "cannot be empty"),
    ("iit..sales", "has an empty level"),
    ("iit.", "has an empty level"),
    ("%.sales", "the root level '%' may not be a predicate"),
    ("ii_t.sales", "may not be a predicate"),
    ("iit.sales\\", "ends with a lone escape"),
])
def test_bad_topic_names(name, message):
    with pytest.raises(TopicNameError, match=message.replace("(", "\\(")):
        parse_topic(name)


async def test_publish_reaches_the_hierarchy_through_real_queues(topics):
    tm = topics.tm
    subscribers = {name: tm.subscribe(name) for name in ("iit", "iit.sales", "iit.sales.US", "iit.projects")}
    for topic in ("iit", "iit.sales", "iit.sales.US", "iit.projects.x"):
        tm.publish(topic, build(topic.encode()))
    assert received(subscribers["iit"]) == ["iit", "iit.sales", "iit.sales.US", "iit.projects.x"]
    assert received(subscribers["iit.sales"]) == ["iit", "iit.sales", "iit.sales.US"]
    assert received(subscribers["iit.sales.US"]) == ["iit", "iit.sales", "iit.sales.US"]
    assert received(subscribers["iit.projects"]) == ["iit", "iit.projects.x"]


async def test_a_subscriber_receives_a_message_once_however_many_subscriptions_match(topics):
    tm = topics.tm
    first = tm.subscribe("iit.sales")
    tm.subscribe("iit.%", queue=first.queue)  # the same subscriber, overlapping subscriptions
    tm.subscribe("iit", queue=first.queue)
    result = tm.publish("iit.sales.US", build(b"once"))
    assert result.deliveries == 1
    assert received(first) == ["once"]


async def test_no_local_and_selectors(topics):
    tm = topics.tm
    mine = tm.subscribe("news", no_local=True, client_id="c1")
    others = tm.subscribe("news", client_id="c1")
    greens = tm.subscribe("news", selector="colour = 'green'")
    tm.publish("news", build(b"from-c1-red", properties={"colour": "red"}), client_id="c1")
    tm.publish("news", build(b"from-c2-green", properties={"colour": "green"}), client_id="c2")
    assert received(mine) == ["from-c2-green"]
    assert received(others) == ["from-c1-red", "from-c2-green"]
    assert received(greens) == ["from-c2-green"]


async def test_closing_a_subscription_drops_its_queue(topics):
    tm = topics.tm
    subscription = tm.subscribe("news")
    consumer = subscription.consumer()
    tm.publish("news", build(b"x"))
    subscription.close()
    assert subscription.queue.name not in topics.qm.queues and consumer.closed
    assert tm.publish("news", build(b"y")).deliveries == 0


async def test_durable_subscription_life_cycle(topics):
    tm = topics.tm
    durable = await tm.durable_subscribe("client-1", "orders", "shop.orders", selector="amount > 10")
    assert durable.queue.name == "client-1$orders"
    tm.publish("shop.orders", build(b"big", durable=True, properties={"amount": 50}))
    tm.publish("shop.orders", build(b"small", durable=True, properties={"amount": 5}))
    tm.publish("shop.orders.eu", build(b"big-eu", durable=True, properties={"amount": 11}))
    await trio.sleep(0.05)  # the copies are stored in the background of publish
    await topics.restart()  # it keeps receiving while nobody is connected, and survives restarts
    tm = topics.tm
    assert sorted(tm.durable_subscriptions()) == ["client-1$orders"]
    tm.publish("shop.orders", build(b"after-restart", properties={"amount": 99}))
    resumed = await tm.durable_subscribe("client-1", "orders", "shop.orders", selector="amount > 10")
    assert received(resumed) == ["big", "big-eu", "after-restart"]

    tm.publish("shop.orders", build(b"pending", properties={"amount": 99}))
    changed = await tm.durable_subscribe("client-1", "orders", "shop.orders")  # other selector: new one
    assert changed is not resumed and changed.queue.size == 0
    tm.publish("shop.orders", build(b"any", properties={"amount": 1}))
    consumer = changed.consumer()
    with pytest.raises(TopicError, match="has 1 active consumer"):
        await tm.unsubscribe("client-1", "orders")
    consumer.close()
    await tm.unsubscribe("client-1", "orders")
    assert "client-1$orders" not in topics.qm.queues and tm.durable_subscriptions() == {}
    with pytest.raises(TopicError, match="no durable subscription 'client-1\\$orders'"):
        await tm.unsubscribe("client-1", "orders")
    await topics.restart()
    assert topics.tm.durable_subscriptions() == {}


async def test_durable_subscriptions_can_be_managed_without_a_client(topics):
    tm = topics.tm
    created = await tm.durable_subscribe("admin@r1", "audit", "shop")  # the router suffix is dropped
    assert created.queue.name == "admin$audit"
    usage = topics.router.management.resolve("/sys$topicmanager/usage/durable-subscribers/admin$audit")
    assert usage.properties()["topic"] == "shop"
    await tm.unsubscribe("admin", "audit")
    with pytest.raises(TopicError, match="invalid durable subscription"):
        await tm.durable_subscribe("c", "a$b", "shop")


async def test_interest_events(topics):
    tm = topics.tm
    events = topics.router.bus.subscribe(TopicInterestChanged)
    first = tm.subscribe("iit.sales")
    second = tm.subscribe("iit")
    durable = await tm.durable_subscribe("c", "d", "other.x")
    assert tm.interest() == {"iit", "other"}
    first.close()
    second.close()
    await tm.unsubscribe("c", "d")
    assert tm.interest() == frozenset()
    assert [(e.root, e.interested) for e in drain(events)] == [
        ("iit", True), ("other", True), ("iit", False), ("other", False)]
    assert durable.closed


async def test_slow_subscribers(make_topics):
    running = make_topics(children="""<slow-subscriber-conditions>
        <slow-subscriber-condition name="drops" max-messages="2" action="drop"/>
        <slow-subscriber-condition name="cuts" max-messages="2" action="disconnect"/>
        <slow-subscriber-condition name="waits" max-messages="2"/>
      </slow-subscriber-conditions>""")
    await running.start()
    tm = running.tm
    dropping = tm.subscribe("drops")
    durable = await tm.durable_subscribe("c", "keep", "drops")
    results = [tm.publish("drops", build(b"x")) for _ in range(4)]
    assert [r.dropped for r in results] == [0, 0, 1, 1]
    assert dropping.queue.size == 2 and durable.queue.size == 4  # durable: never dropped
    assert results[-1].delay_ms == 5000  # ... but publishers are told to wait

    cut = tm.subscribe("cuts")
    consumer = cut.consumer()
    for _ in range(3):
        tm.publish("cuts", build(b"x"))
    assert cut.closed and consumer.closed
    waiting = tm.subscribe("waits")
    delays = [tm.publish("waits", build(b"x")).delay_ms for _ in range(3)]
    assert delays == [0, 0, 5000] and waiting.queue.size == 3
    usage = running.router.management.resolve("/sys$topicmanager/usage/topics/cuts").properties()
    assert (usage["disconnected"], usage["published"]) == (1, 3)
    await running.stop()


async def test_bad_input(make_topics):
    running = make_topics(manager='auto-create-topics="false"', children='<topics><topic name="known.x"/></topics>')
    await running.start()
    tm = running.tm
    with pytest.raises(TopicError, match="root topic 'unknown' is not defined on router r1"):
        tm.publish("unknown", build(b"x"))
    with pytest.raises(TopicError, match="root topic 'unknown' is not defined"):
        tm.subscribe("unknown.y")
    assert tm.publish("known.y", build(b"x")).deliveries == 0  # the root is defined
    with pytest.raises(TopicError, match="may not be a predicate"):
        tm.subscribe("%")
    with pytest.raises(TopicError, match="at position"):
        tm.subscribe("known", selector="colour = ")
    with pytest.raises(Exception, match="may not be a predicate"):
        running.router.management.add("/sys$topicmanager/topics", "_bad")
    await running.stop()
