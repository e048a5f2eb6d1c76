"""Messages between routers (issue 16): real routers in one process, real AMQP clients.

Numbered producers and a verifying consumer count what arrives: every test checks that
nothing is lost, nothing is duplicated and the order is kept where the path does not
change.
"""

from __future__ import annotations

import trio

from martinet.messaging.client import DeliveryMode, Queue, TextMessage, connect

from network import ROUTING_STACK, routing_config


async def produce(url: str, address: str, count: int, *, prefix: str = "m", persistent: bool = True) -> None:
    async with connect(url) as connection, connection.session() as session:
        mode = DeliveryMode.PERSISTENT if persistent else DeliveryMode.NON_PERSISTENT
        async with session.producer(Queue(address), delivery_mode=mode) as producer:
            for n in range(count):
                await producer.send(TextMessage(f"{prefix}{n}"))


async def consume(url: str, queue: str, count: int, *, timeout: float = 30) -> list[str]:
    """Receive ``count`` messages (bounded), then check for one more (there must be none)."""
    received = []
    async with connect(url) as connection, connection.session() as session:
        async with session.consumer(Queue(queue)) as consumer:
            with trio.fail_after(timeout):
                while len(received) < count:
                    received.append((await consumer.receive(timeout)).text)
            extra = await consumer.receive(0.5)
            assert extra is None, f"a duplicate or stray message arrived: {extra.text}"
    return received


def verify(received: list[str], count: int, prefix: str = "m") -> None:
    expected = [f"{prefix}{n}" for n in range(count)]
    lost = sorted(set(expected) - set(received))
    duplicated = sorted({m for m in received if received.count(m) > 1})
    assert not lost and not duplicated, f"lost {lost[:10]}…, duplicated {duplicated[:10]}…"
    assert received == expected  # and in order


async def start(network, *names, **routing):
    for name in names:
        await network.start(network.config(name, startorder=ROUTING_STACK,
                                           swiftlets={"sys$routing": routing_config(**routing)}))


async def test_one_hop_xa(network):
    await start(network, "a", "b")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    await produce(network.url("a"), "orders@b", 500)
    verify(await consume(network.url("b"), "orders", 500), 500)
    usage = network.routers["a"].management.resolve("/sys$routing/usage/connections/connector:b").properties()
    assert usage["messages-out"] == 500 and usage["in-doubt"] == 0


async def test_one_hop_both_directions_non_xa(network):
    await start(network, "a", "b", listener={"use_xa": False})
    network.connect("a", "b", **{"use-xa": "false"})
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce, network.url("a"), "inbox@b", 300)
        nursery.start_soon(produce, network.url("b"), "inbox@a", 300)
    verify(await consume(network.url("b"), "inbox", 300), 300)
    verify(await consume(network.url("a"), "inbox", 300), 300)


async def test_three_hops_along_a_chain(network):
    await start(network, "a", "b", "c", "d")
    for x, y in (("a", "b"), ("b", "c"), ("c", "d")):
        network.connect(x, y)
    await network.settle({"a": {"b": 1, "c": 2, "d": 3}})
    await produce(network.url("a"), "far@d", 300, persistent=False)
    verify(await consume(network.url("d"), "far", 300), 300)


async def test_messages_wait_while_there_is_no_route(network):
    await start(network, "a", "b")
    network.routers["a"].management.add("/sys$routing/static-routes", "b")
    await produce(network.url("a"), "later@b", 100)
    assert network.routers["a"].swiftlet("sys$queuemanager").queues["rt$b"].size == 100
    network.connect("a", "b")
    verify(await consume(network.url("b"), "later", 100), 100)
