"""Publish/subscribe across the router network: real routers in one process, real
AMQP clients. Every test counts what each subscriber receives: each message exactly once,
nothing a subscriber should not see."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Mapping

import pytest
import trio

from martinet.kernel import ManagementError, SwiftletFailed
from martinet.messaging.client import DeliveryMode, TextMessage, Topic, connect
from martinet.messaging.codec import UInt
from martinet.messaging.message import Message
from martinet.messaging.message import build as build_message
from martinet.swiftlets.routing.config import StaticRoute
from martinet.swiftlets.routing.wire import DEFAULT_MAX_FRAME_SIZE, FrameType, unpack_messages
from martinet.swiftlets.store.api import PutRecord
from martinet.swiftlets.store.dbprocess import COMMIT_GATE_ENV
from martinet.swiftlets.topicmanager.config import (
    AnnounceFilter,
    StaticRemoteRouterSubscription,
    StaticTopicSubscription,
    TopicManagerConfig,
)
from martinet.swiftlets.topicmanager.federation import DESTINATION, HOPS, INTEREST_QUEUE, QUEUE, SOURCE, TOPIC

from tests.harness.network import ROUTING_STACK, routing_config

Interest = Mapping[str, Iterable[str]]  # remote router → roots


def remote_subscriptions(network, router: str) -> dict[str, set[str]]:
    """Router ``router``'s remote router subscriptions, from its usage: router → roots."""
    listing = network.routers[router].management.resolve("/sys$topicmanager/usage/remote-router-subscriptions")
    return {name: set(entry.children["topics"].children) for name, entry in listing.children.items()}


async def wait_interest(network, expected: Mapping[str, Interest], timeout: float = 20) -> None:
    """Wait (bounded) until each router named has exactly those remote subscriptions."""
    wanted = {router: {r: set(roots) for r, roots in interest.items()} for router, interest in expected.items()}
    with trio.move_on_after(timeout):
        while any(remote_subscriptions(network, router) != interest for router, interest in wanted.items()):
            await trio.sleep(0.02)
        return
    actual = {router: remote_subscriptions(network, router) for router in expected}
    raise AssertionError(f"remote subscriptions did not settle in {timeout} s: {actual} != {wanted}")


class Subscriber:
    """A subscriber on ``router`` that collects message texts; ``ready`` once attached."""

    def __init__(
        self,
        network,
        router: str,
        topic: str,
        *,
        selector: str | None = None,
        no_local: bool = False,
        client_id: str | None = None,
        durable: str | None = None,
    ):
        self.network, self.router, self.topic = network, router, topic
        self.selector, self.no_local, self.client_id, self.durable = selector, no_local, client_id, durable
        self.received: list[str] = []
        self.ready = trio.Event()

    async def run(self, count: int, *, timeout: float = 40) -> None:
        """Receive ``count`` messages (bounded), then check that no further one comes."""
        async with (
            connect(self.network.url(self.router), client_id=self.client_id) as connection,
            connection.session() as session,
        ):
            if self.durable:
                consumer = await session.durable_subscriber(
                    Topic(self.topic), self.durable, selector=self.selector, no_local=self.no_local
                )
            else:
                consumer = await session.consumer(Topic(self.topic), selector=self.selector, no_local=self.no_local)
            self.ready.set()
            with trio.fail_after(timeout):
                while len(self.received) < count:
                    message = await consumer.receive(timeout)
                    assert message is not None, f"{self}: only {len(self.received)} of {count} arrived"
                    self.received.append(message.text)
            extra = await consumer.receive(0.5)
            assert extra is None, f"{self}: a duplicate or stray message arrived: {extra.text}"
            await consumer.close()

    def __repr__(self) -> str:
        return f"<subscriber on {self.router} to {self.topic} selector={self.selector!r}>"


async def publish(
    network,
    router: str,
    topic: str,
    texts: Iterable[str],
    *,
    client_id: str | None = None,
    persistent: bool = False,
    properties: Mapping[str, object] | None = None,
) -> None:
    mode = DeliveryMode.PERSISTENT if persistent else DeliveryMode.NON_PERSISTENT
    async with connect(network.url(router), client_id=client_id) as connection, connection.session() as session:
        producer = await session.producer(Topic(topic), delivery_mode=mode)
        for text in texts:
            await producer.send(TextMessage(text, properties=properties))


def assert_exactly(subscriber: Subscriber, expected: Iterable[str]) -> None:
    expected = sorted(expected)
    received = sorted(subscriber.received)
    wrong = [m for m in received if received.count(m) > 1 or m not in expected]
    assert received == expected, (
        f"{subscriber}: missing {sorted(set(expected) - set(received))[:10]}, unexpected or twice {wrong[:10]}"
    )


RING = ("a", "b", "c", "d")
MESH = ("a", "b", "c", "d", "e")


async def build(network, routers: tuple[str, ...], links: Iterable[tuple[str, str]]) -> None:
    await network.start_routers(*routers)
    for x, y in links:
        network.connect(x, y)


def ring_links(routers: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(routers[i], routers[(i + 1) % len(routers)]) for i in range(len(routers))]


async def fan_out_everywhere(network, routers: tuple[str, ...]) -> None:
    """Subscribers on every router — plain, predicate, selector, a second root — and
    publishers on several routers: each subscriber gets exactly what it subscribed to."""
    count = 60
    subscribers: dict[Subscriber, list[str]] = {}
    eu = [f"{p}-eu-{n}" for p in routers[:2] for n in range(count)]
    us = [f"{routers[-1]}-us-{n}" for n in range(count)]
    for router in routers:
        subscribers[Subscriber(network, router, "iit")] = eu + us
        subscribers[Subscriber(network, router, "iit.%.eu")] = eu
    subscribers[Subscriber(network, routers[2], "iit.sales", selector="n < 10")] = [
        m for m in eu + us if int(m.rsplit("-", 1)[1]) < 10
    ]
    subscribers[Subscriber(network, routers[1], "news")] = []
    async with trio.open_nursery() as nursery:
        for subscriber, expected in subscribers.items():
            nursery.start_soon(subscriber.run, len(expected))
        for subscriber in subscribers:
            await subscriber.ready.wait()
        others = {r: [x for x in routers if x != r] for r in routers}
        await wait_interest(
            network, {r: {o: ["iit"] + (["news"] if o == routers[1] else []) for o in others[r]} for r in routers}
        )
        async with trio.open_nursery() as publishers:
            for router in routers[:2]:
                publishers.start_soon(publish_numbered, network, router, "iit.sales.eu", f"{router}-eu-", count, True)
            publishers.start_soon(
                publish_numbered, network, routers[-1], "iit.sales.us", f"{routers[-1]}-us-", count, False
            )
    for subscriber, expected in subscribers.items():
        assert_exactly(subscriber, expected)


async def publish_numbered(network, router: str, topic: str, prefix: str, count: int, persistent: bool) -> None:
    mode = DeliveryMode.PERSISTENT if persistent else DeliveryMode.NON_PERSISTENT
    async with connect(network.url(router)) as connection, connection.session() as session:
        producer = await session.producer(Topic(topic), delivery_mode=mode)
        for n in range(count):
            await producer.send(TextMessage(f"{prefix}{n}", properties={"n": n}))


async def test_ring_of_four_every_subscriber_gets_every_message_once(network):
    await build(network, RING, ring_links(RING))
    await network.settle({"a": {"b": 1, "c": 2, "d": 1}, "c": {"a": 2, "b": 1, "d": 1}})
    await fan_out_everywhere(network, RING)


async def test_full_mesh_of_five_every_subscriber_gets_every_message_once(network):
    await build(network, MESH, itertools.combinations(MESH, 2))
    await network.settle({r: {o: 1 for o in MESH if o != r} for r in MESH})
    await fan_out_everywhere(network, MESH)


async def start(network, name: str, *, static_routes: Iterable[str] = (), **topicmanager: object) -> None:
    """Router ``name`` with routing (``static_routes``) and ``topicmanager``'s settings."""
    swiftlets = {"sys$routing": routing_config(static_routes=[StaticRoute(name=r) for r in static_routes])}
    if topicmanager:
        swiftlets["sys$topicmanager"] = TopicManagerConfig(**topicmanager)
    await network.start(network.config(name, startorder=ROUTING_STACK, swiftlets=swiftlets))


def static(router: str, *roots: str, keep: bool = False) -> StaticRemoteRouterSubscription:
    return StaticRemoteRouterSubscription(
        name=router,
        static_topic_subscriptions=[StaticTopicSubscription(name=root, keep_on_unsubscribe=keep) for root in roots],
    )


async def durable_subscription(network, router: str, client_id: str, name: str, topic: str) -> None:
    """Create a durable subscription and leave it without a subscriber."""
    async with connect(network.url(router), client_id=client_id) as connection, connection.session() as session:
        await (await session.durable_subscriber(Topic(topic), name)).close()


def queue_size(network, router: str, queue: str) -> int:
    queues = network.routers[router].swiftlet("sys$queuemanager").queues
    return queues[queue].size if queue in queues else 0


async def test_no_local_uses_the_original_publishers_client_id(network):
    await network.start_routers("a", "b")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    not_mine = Subscriber(network, "b", "iit", no_local=True, client_id="me")
    everything = Subscriber(network, "b", "iit.%")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(not_mine.run, 5)
        nursery.start_soon(everything.run, 10)
        await not_mine.ready.wait()
        await everything.ready.wait()
        await wait_interest(network, {"a": {"b": ["iit"]}})
        await publish(network, "a", "iit.x", [f"mine-{n}" for n in range(5)], client_id="me")
        await publish(network, "a", "iit.x", [f"theirs-{n}" for n in range(5)], client_id="other")
    assert_exactly(not_mine, [f"theirs-{n}" for n in range(5)])
    assert_exactly(everything, [f"{who}-{n}" for who in ("mine", "theirs") for n in range(5)])


async def test_a_forwarded_publication_leaves_tpc_only_with_the_transaction_that_delivers_it(network, monkeypatch):
    """A persistent publication another router forwarded (in ``tpc$<root>``) is acknowledged
    in the local transaction that delivers it to the subscribers, never on its own: while that
    transaction waits for the store, the publication is still in ``tpc$iit``, held by it (a
    crash or a failed commit there leaves it to be delivered again, and a delivery made durable
    takes it out in the same write); once the write is done the subscriber has it once and
    ``tpc$iit`` is empty. b's store engine holds every commit while the gate file exists."""
    gate = network.folder / "commit-gate"
    monkeypatch.setenv(COMMIT_GATE_ENV, str(gate))  # read by the store engine b starts
    await start(network, "b")
    manager = network.routers["b"].swiftlet("sys$queuemanager")
    tpc = manager.queue("tpc$iit", create=True)  # as routing puts it there; nobody consumes it yet
    annotations = {TOPIC: "iit.sales", SOURCE: "a", DESTINATION: "b", QUEUE: "tpc$iit", HOPS: UInt(1)}
    await manager.send("tpc$iit", build_message("forwarded", durable=True, message_id="f-1", annotations=annotations))
    gate.touch()
    subscriber = Subscriber(network, "b", "iit")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscriber.run, 1)
            with trio.fail_after(20):  # the subscription's interest starts the consumer of tpc$iit
                while tpc.available:
                    await trio.sleep(0.01)
            assert tpc.size == 1 and not subscriber.received  # taken into the delivery, which waits for the store
            gate.unlink()
    finally:
        gate.unlink(missing_ok=True)  # (else b could not stop: its store would hold the commits of its stop)
    assert_exactly(subscriber, ["forwarded"])
    with trio.fail_after(10):
        while tpc.size:
            await trio.sleep(0.01)


async def test_interest_is_withdrawn_and_announced_again_after_a_link_flap(network):
    await network.start_routers("a", "b")
    network.connect("b", "a")
    async with connect(network.url("a")) as connection, connection.session() as session:
        subscriber = await session.consumer(Topic("iit.sales"))
        await wait_interest(network, {"b": {"a": ["iit"]}, "a": {}})
        await subscriber.close()
        await wait_interest(network, {"b": {}})  # the last subscriber left
        subscriber = await session.consumer(Topic("iit"))
        await wait_interest(network, {"b": {"a": ["iit"]}})
        network.routers["b"].management.remove("/sys$routing/connectors", "a")
        await network.settle({"b": {}, "a": {}})
        await subscriber.close()  # while the link is down: only a whole record after it can tell b
        news = await session.consumer(Topic("news"))
        network.connect("b", "a")
        await wait_interest(network, {"b": {"a": ["news"]}})
        await publish(network, "b", "news.today", ["n0", "n1"])
        await publish(network, "b", "iit", ["not for a"])
        with trio.fail_after(20):
            assert [(await news.receive(20)).text for _ in range(2)] == ["n0", "n1"]
        assert await news.receive(0.5) is None
    usage = network.routers["b"].management.get("/sys$topicmanager/usage/topics/iit", "published")
    assert usage == 1


async def test_delete_of_a_remote_router_subscription_until_the_router_announces_again(network):
    await network.start_routers("a", "b")
    network.connect("b", "a")
    management = network.routers["b"].management
    async with connect(network.url("a")) as connection, connection.session() as session:
        subscriber = await session.consumer(Topic("iit"))
        await wait_interest(network, {"b": {"a": ["iit"]}})
        await publish(network, "b", "iit", ["before"])
        entry = "/sys$topicmanager/usage/remote-router-subscriptions/a/topics/iit"
        assert management.get(entry, "forwarded") == 1
        await management.invoke(entry, "delete")
        assert remote_subscriptions(network, "b") == {}
        # not forwarded, so lost: the deleted entry stands until a tells its interest again
        await publish(network, "b", "iit", ["while deleted"])
        news = await session.consumer(Topic("news"))  # a's interest changes: b gets the whole record
        await wait_interest(network, {"b": {"a": ["iit", "news"]}})
        await publish(network, "b", "iit", ["after"])
        with trio.fail_after(20):
            assert [(await subscriber.receive(20)).text for _ in range(2)] == ["before", "after"]
        assert await subscriber.receive(0.5) is None
        # read while a's subscribers are there: once they close, a announces no interest and
        # b drops the entry
        assert management.get(entry, "forwarded") == 1
        await news.close()


def carries_interest(fields: dict) -> bool:
    """Whether a TRANSACTION frame's fields hold a topic interest record (a message to the
    federation's queue)."""
    messages = unpack_messages(tuple(fields["messages"]), fields.get("compressed", False), DEFAULT_MAX_FRAME_SIZE)
    return any(Message(raw).message_annotations.get(QUEUE) == INTEREST_QUEUE for raw in messages)


async def test_an_interest_record_lost_with_its_link_is_told_again_on_the_next(network, nursery):
    # b's new durable subscription is held in the proxy on its way to a, and the link is cut
    # with it: a never hears of it there. The routing transaction that carried it is rolled
    # back, so the next link brings it. What a published in between is not forwarded (a
    # router forwards on the interest it knows); what it publishes after is, exactly once.
    await network.start_routers("a", "b")
    proxy = await network.connect_through_proxy(nursery, "a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    subscriber = Subscriber(network, "b", "iit", client_id="d", durable="w")
    async with connect(network.url("b")) as connection, connection.session() as session:
        await session.consumer(Topic("news"))  # (open until the end)
        await wait_interest(network, {"a": {"b": ["news"]}})  # b's records reach a
        held = proxy.hold("to_client", FrameType.TRANSACTION, where=carries_interest)
        async with trio.open_nursery() as receiving:
            receiving.start_soon(subscriber.run, 10)
            with trio.fail_after(20):
                await held.seen.wait()
            assert remote_subscriptions(network, "a") == {"b": {"news"}}
            await publish(network, "a", "iit", [f"early-{n}" for n in range(10)], persistent=True)
            proxy.cut()
            await wait_interest(network, {"a": {"b": ["news", "iit"]}})
            assert proxy.accepted == 2  # told on the next link
            await publish(network, "a", "iit", [f"late-{n}" for n in range(10)], persistent=True)
    assert_exactly(subscriber, [f"late-{n}" for n in range(10)])


async def test_static_remote_subscriptions_forward_before_the_first_connect(network):
    await start(network, "b")
    await durable_subscription(network, "b", "d", "w", "iit.sales")
    await start(network, "a", static_routes=["b"], static_remote_router_subscriptions=[static("b", "iit")])
    assert remote_subscriptions(network, "a") == {"b": {"iit"}}
    await publish(network, "a", "iit.sales", [f"m{n}" for n in range(20)], persistent=True)
    assert queue_size(network, "a", "rt$b") == 20  # waiting for b's first connect
    network.connect("a", "b")
    received = Subscriber(network, "b", "iit.sales", client_id="d", durable="w")
    await received.run(20)
    assert_exactly(received, [f"m{n}" for n in range(20)])
    async with connect(network.url("b"), client_id="d") as connection, connection.session() as session:
        await session.unsubscribe("w")
    await wait_interest(network, {"a": {}})  # b has spoken: the static subscription is over


async def test_a_router_without_interest_ends_static_subscriptions_when_it_first_connects(network):
    await start(
        network,
        "a",
        static_routes=["b"],
        static_remote_router_subscriptions=[static("b", "iit"), static("b", "news", keep=True)],
    )
    await start(network, "b")  # no subscriptions: it has never announced anything
    network.connect("b", "a")
    await wait_interest(network, {"a": {"b": ["news"]}})  # a asked, b answered: none
    assert (
        network.routers["a"].management.get(
            "/sys$topicmanager/usage/remote-router-subscriptions/b/topics/news", "announced"
        )
        is False
    )


async def test_keep_on_unsubscribe_delivers_to_a_durable_subscriber_across_an_orderly_shutdown(network):
    await start(network, "a", static_routes=["b"], static_remote_router_subscriptions=[static("b", "iit", keep=True)])
    await start(network, "b")
    await durable_subscription(network, "b", "d", "w", "iit")
    network.connect("b", "a")
    await wait_interest(network, {"a": {"b": ["iit"]}})
    await network.stop("b")  # b unsubscribes everywhere while it stops
    await network.settle({"a": {}})
    await publish(network, "a", "iit.sales.eu", [f"m{n}" for n in range(50)], persistent=True)
    assert remote_subscriptions(network, "a") == {"b": {"iit"}}
    assert queue_size(network, "a", "rt$b") >= 50
    await start(network, "b")  # the same store: the durable subscription and its queue come back
    network.connect("b", "a")
    received = Subscriber(network, "b", "iit", client_id="d", durable="w")
    await received.run(50)
    assert_exactly(received, [f"m{n}" for n in range(50)])
    assert (
        network.routers["a"].management.get(
            "/sys$topicmanager/usage/remote-router-subscriptions/b/topics/iit", "forwarded"
        )
        == 50
    )


async def test_an_orderly_stop_keeps_durable_interest_without_keep_on_unsubscribe(network):
    await start(network, "a", static_routes=["b"])
    await start(network, "b")
    await durable_subscription(network, "b", "d", "w", "iit")
    network.connect("b", "a")
    await wait_interest(network, {"a": {"b": ["iit"]}})
    await network.stop("b")  # its goodbye names the durable subscription's root, if it gets out at all
    await network.settle({"a": {}})
    await publish(network, "a", "iit.sales.eu", [f"m{n}" for n in range(30)], persistent=True)
    assert remote_subscriptions(network, "a") == {"b": {"iit"}}
    assert queue_size(network, "a", "rt$b") >= 30
    await start(network, "b")
    network.connect("b", "a")
    received = Subscriber(network, "b", "iit", client_id="d", durable="w")
    await received.run(30)
    assert_exactly(received, [f"m{n}" for n in range(30)])


async def test_an_orderly_stop_tells_the_neighbours_that_only_durable_interest_stays(network, nursery):
    """A stopping router's last record keeps its durable subscriptions' roots and withdraws
    what only its (connected) non-durable subscribers wanted; it leaves before the routing
    links close (the links carry it while every swiftlet still runs). Before, the links
    closed first and the neighbour went on forwarding to the gone subscriber's root."""
    await start(network, "a")
    await start(network, "b")
    await durable_subscription(network, "a", "d", "w", "iit")
    subscribed = trio.Event()

    async def non_durable_subscriber() -> None:
        with contextlib.suppress(Exception):  # (its router stops under it)
            async with connect(network.url("a")) as connection, connection.session() as session:
                await session.consumer(Topic("news"))
                subscribed.set()
                await trio.sleep_forever()

    nursery.start_soon(non_durable_subscriber)
    await subscribed.wait()
    network.connect("a", "b")
    await wait_interest(network, {"b": {"a": ["iit", "news"]}})
    await network.stop("a")
    await wait_interest(network, {"b": {"a": ["iit"]}})


async def test_interest_is_announced_again_after_a_router_restart(network):
    await start(network, "a")
    await start(network, "b")
    await durable_subscription(network, "a", "d", "w", "iit")
    network.connect("a", "b")
    await wait_interest(network, {"b": {"a": ["iit"]}})
    await network.stop("a")
    await network.settle({"b": {}})
    # a's durable interest stays at b while a is down: forget it by hand to see it announced anew
    await network.routers["b"].management.invoke("/sys$topicmanager/usage/remote-router-subscriptions/a", "delete")
    assert remote_subscriptions(network, "b") == {}
    await start(network, "a")
    network.connect("a", "b")
    await wait_interest(network, {"b": {"a": ["iit"]}})  # a's durable subscriber, announced anew
    received = Subscriber(network, "a", "iit", client_id="d", durable="w")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(received.run, 3)
        await received.ready.wait()
        await publish(network, "b", "iit.x", ["r0", "r1", "r2"], persistent=True)
    assert_exactly(received, ["r0", "r1", "r2"])


async def test_a_restarted_router_forwards_to_the_interest_it_knew_before_it_hears_again(network, caplog):
    """Regression (the network harness in topic mode, seed 11: 26 publications of a's lost at
    b's and c's durable subscribers): remote subscriptions lived in memory only, so a router
    restarted after a crash forwarded nothing of what its publishers sent until the other
    routers' records came back (0.1–0.2 s after every restart there). Each router's newest
    record is kept in the store and applied at start, before anything is published."""
    await start(network, "a", static_routes=["b"])
    await start(network, "b")
    await durable_subscription(network, "b", "d", "w", "iit")
    network.connect("a", "b")
    await wait_interest(network, {"a": {"b": ["iit"]}})
    await network.stop("a")
    await start(network, "a", static_routes=["b"])  # the same store; no link to b (its connector was added at run time)
    assert remote_subscriptions(network, "a") == {"b": {"iit"}}
    await publish(network, "a", "iit.sales", [f"m{n}" for n in range(20)], persistent=True)
    assert queue_size(network, "a", "rt$b") == 20  # waiting for b
    network.connect("a", "b")
    received = Subscriber(network, "b", "iit", client_id="d", durable="w")
    await received.run(20)
    assert_exactly(received, [f"m{n}" for n in range(20)])
    # the operator's delete forgets the stored record too: a restart does not bring it back
    await network.routers["a"].management.invoke("/sys$topicmanager/usage/remote-router-subscriptions/b", "delete")
    # and a stored record it cannot read is skipped with a warning (the router starts)
    await network.routers["a"].swiftlet("sys$store").commit([PutRecord("federation", "interest:x", b"{torn")])
    await network.stop("a")
    await start(network, "a", static_routes=["b"])
    assert remote_subscriptions(network, "a") == {}
    assert "stored interest record interest:x ignored: malformed interest record: JSONDecodeError" in caplog.text


async def test_a_static_remote_subscription_needs_a_static_route(network):
    with pytest.raises(
        SwiftletFailed,
        match=r"static-remote-router-subscriptions/b: a static remote subscription "
        r"needs a static route to b",
    ):
        await start(network, "a", static_remote_router_subscriptions=[static("b", "iit")])
    await start(network, "c", static_routes=["b"])
    with pytest.raises(ManagementError, match="needs a static route to x"):
        network.routers["c"].management.add("/sys$topicmanager/static-remote-router-subscriptions", "x")
    network.routers["c"].management.add("/sys$topicmanager/static-remote-router-subscriptions", "b")
    network.routers["c"].management.add(
        "/sys$topicmanager/static-remote-router-subscriptions/b/static-topic-subscriptions",
        "iit",
        {"keep-on-unsubscribe": "true"},
    )
    assert remote_subscriptions(network, "c") == {"b": {"iit"}}


async def test_announce_filters_keep_a_root_local_to_a_region(network):
    await start(network, "a")
    await start(network, "b", announce_filters=[AnnounceFilter(name="c", roots="local", mode="exclude")])
    await start(network, "c")
    network.connect("a", "b")
    network.connect("b", "c")
    local = Subscriber(network, "b", "local")
    shared = Subscriber(network, "b", "iit")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(local.run, 1)
        nursery.start_soon(shared.run, 2)
        await local.ready.wait()
        await shared.ready.wait()
        await wait_interest(network, {"a": {"b": ["iit", "local"]}, "c": {"b": ["iit"]}})
        for router in ("a", "c"):
            await publish(network, router, "local.news", [f"local from {router}"])
            await publish(network, router, "iit", [f"iit from {router}"])
    assert_exactly(local, ["local from a"])  # c does not know b has subscribers under "local"
    assert_exactly(shared, ["iit from a", "iit from c"])
    management = network.routers["b"].management
    async with connect(network.url("b")) as connection, connection.session() as session:
        await session.consumer(Topic("iit"))
        await session.consumer(Topic("local"))
        await wait_interest(network, {"a": {"b": ["iit", "local"]}, "c": {"b": ["iit"]}})
        management.add("/sys$topicmanager/announce-filters", "a", {"roots": "iit", "mode": "include"})
        await wait_interest(network, {"a": {"b": ["iit"]}, "c": {"b": ["iit"]}})
        management.set("/sys$topicmanager/announce-filters/a", "roots", "local")  # changed at runtime
        await wait_interest(network, {"a": {"b": ["local"]}, "c": {"b": ["iit"]}})
        management.remove("/sys$topicmanager/announce-filters", "c")
        await wait_interest(network, {"a": {"b": ["local"]}, "c": {"b": ["iit", "local"]}})


async def test_a_temporary_topic_receives_publications_from_another_router(network):
    await network.start_routers("a", "b")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    async with connect(network.url("a")) as on_a, connect(network.url("b")) as on_b:
        session_a, session_b = await on_a.session(), await on_b.session()
        replies = await session_a.create_temporary_topic()
        assert replies.name == "tmp$topic$a$1"  # unique in the network: it carries the router
        own = await session_b.create_temporary_topic()  # b's first one: another name, another topic
        consumer = await session_a.consumer(replies)
        own_consumer = await session_b.consumer(own)
        await wait_interest(network, {"b": {"a": [replies.name]}, "a": {"b": [own.name]}})
        await (await session_b.producer(replies)).send(TextMessage("reply from b"))
        received = await consumer.receive(20)
        assert received.text == "reply from b" and received.destination.is_topic
        assert await own_consumer.receive(0.3) is None
        await consumer.close()
        await own_consumer.close()
    await wait_interest(network, {"b": {}, "a": {}})
    assert "tpc$" + replies.name not in network.routers["a"].swiftlet("sys$queuemanager").queues
