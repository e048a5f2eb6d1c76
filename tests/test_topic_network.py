"""Publish/subscribe across the router network (issue 17): real routers in one process, real
AMQP clients. Every test counts what each subscriber receives: each message exactly once,
nothing a subscriber should not see."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import trio

from martinet.messaging.client import DeliveryMode, TextMessage, Topic, connect

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

    def __init__(self, network, router: str, topic: str, *, selector: str | None = None, no_local: bool = False,
                 client_id: str | None = None, durable: str | None = None):
        self.network, self.router, self.topic = network, router, topic
        self.selector, self.no_local, self.client_id, self.durable = selector, no_local, client_id, durable
        self.received: list[str] = []
        self.ready = trio.Event()

    async def run(self, count: int, *, timeout: float = 40) -> None:
        """Receive ``count`` messages (bounded), then check that no further one comes."""
        async with connect(self.network.url(self.router), client_id=self.client_id) as connection, \
                connection.session() as session:
            if self.durable:
                consumer = await session.durable_subscriber(Topic(self.topic), self.durable, selector=self.selector,
                                                            no_local=self.no_local)
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


async def publish(network, router: str, topic: str, texts: Iterable[str], *, client_id: str | None = None,
                  persistent: bool = False, properties: Mapping[str, object] | None = None) -> None:
    mode = DeliveryMode.PERSISTENT if persistent else DeliveryMode.NON_PERSISTENT
    async with connect(network.url(router), client_id=client_id) as connection, connection.session() as session:
        producer = await session.producer(Topic(topic), delivery_mode=mode)
        for text in texts:
            await producer.send(TextMessage(text, properties=properties))


def assert_exactly(subscriber: Subscriber, expected: Iterable[str]) -> None:
    expected = sorted(expected)
    received = sorted(subscriber.received)
    wrong = [m for m in received if received.count(m) > 1 or m not in expected]
    assert received == expected, \
        f"{subscriber}: missing {sorted(set(expected) - set(received))[:10]}, unexpected or twice {wrong[:10]}"


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
    subscribers[Subscriber(network, routers[2], "iit.sales", selector="n < 10")] = \
        [m for m in eu + us if int(m.rsplit("-", 1)[1]) < 10]
    subscribers[Subscriber(network, routers[1], "news")] = []
    async with trio.open_nursery() as nursery:
        for subscriber, expected in subscribers.items():
            nursery.start_soon(subscriber.run, len(expected))
        for subscriber in subscribers:
            await subscriber.ready.wait()
        others = {r: [x for x in routers if x != r] for r in routers}
        await wait_interest(network, {r: {o: ["iit"] + (["news"] if o == routers[1] else []) for o in others[r]}
                                      for r in routers})
        async with trio.open_nursery() as publishers:
            for router in routers[:2]:
                publishers.start_soon(publish_numbered, network, router, "iit.sales.eu", f"{router}-eu-", count, True)
            publishers.start_soon(publish_numbered, network, routers[-1], "iit.sales.us", f"{routers[-1]}-us-", count,
                                  False)
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
