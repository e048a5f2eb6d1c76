"""Messages between routers: real routers in one process, real AMQP clients.

Numbered producers and a verifying consumer count what arrives: every test checks that
nothing is lost, nothing is duplicated and the order is kept where the path does not
change.
"""

from __future__ import annotations

import gc
import itertools

import pytest
import trio

from martinet.messaging.client import DeliveryMode, Queue, TextMessage, connect
from martinet.messaging.codec import UInt
from martinet.messaging.message import Message, build
from martinet.swiftlets.queuemanager.config import QueueManagerConfig
from martinet.swiftlets.routing.linkwork import UNROUTABLE_REASON
from martinet.swiftlets.routing.routing_annotations import DESTINATION, HOPS, QUEUE, SOURCE

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import ROUTING_STACK, routing_config
from tests.harness.polling import wait_until


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
        await network.start(
            network.config(name, startorder=ROUTING_STACK, swiftlets={"sys$routing": routing_config(**routing)})
        )


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


@pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
async def test_routed_messages_are_freed_by_reference_counting_not_left_in_cycles(network, xa):
    # A link's inbound batch and its write's callback referred to each other: every
    # transaction's messages waited for the cyclic collector, which a router then ran every
    # couple of hundred transactions (7 % of the receiving router's CPU). Counted: routing
    # 400 messages leaves none of them to it.
    await start(network, "a", "m", "b", listener={"use_xa": xa})
    network.connect("a", "m", **{"use-xa": str(xa).lower()})
    network.connect("m", "b", **{"use-xa": str(xa).lower()})
    await network.settle({"a": {"m": 1, "b": 2}, "m": {"a": 1, "b": 1}, "b": {"m": 1, "a": 2}})
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await produce(network.url("a"), "orders@b", 400, persistent=False)
        verify(await consume(network.url("b"), "orders", 400), 400)
        gc.collect()
        left = sum(isinstance(thing, Message) for thing in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == 0, f"{left} messages were freed only by the cyclic collector"


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


def verify_set(received: list[str], count: int, prefix: str = "m") -> None:
    """Nothing lost, nothing duplicated (the order may change where the path changed)."""
    expected = {f"{prefix}{n}" for n in range(count)}
    lost = sorted(expected - set(received))
    duplicated = sorted({m for m in received if received.count(m) > 1})
    assert not lost and not duplicated and len(received) == count, (
        f"lost {len(lost)} {lost[:10]}, duplicated {len(duplicated)} {duplicated[:10]}"
    )


async def test_failover_in_a_triangle_when_the_shortest_link_is_cut_mid_transfer(network, nursery):
    await start(network, "a", "b", "c", roundrobin_enabled=False)
    proxy = FaultProxy("127.0.0.1", network.routing_port("c"))
    await nursery.start(proxy.run)
    network.routers["a"].management.add(
        "/sys$routing/connectors", "c", {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000"}
    )
    network.connect("a", "b")
    network.connect("b", "c")
    await network.settle({"a": {"b": 1, "c": 1}, "c": {"a": 1, "b": 1}})
    count = 3000
    queue_b = network.routers["b"].swiftlet("sys$queuemanager")

    async def cut_when_flowing() -> None:
        target = network.routers["c"].swiftlet("sys$queuemanager")
        with trio.fail_after(30):
            while (q := target.queues.get("orders")) is None or q.size < 200:
                await trio.sleep(0.005)
        proxy.refuse(True)
        proxy.cut()  # transactions in flight over a-c stay prepared until the link is back

    async with trio.open_nursery() as inner:
        inner.start_soon(cut_when_flowing)
        inner.start_soon(produce, network.url("a"), "orders@c", count)
    await network.settle({"a": {"b": 1, "c": 2}})
    with trio.fail_after(30):  # the rest travels a-b-c
        while (
            "rt$c" not in queue_b.queues
            or network.routers["b"].management.get("/sys$routing/usage/connections/connector:c", "messages-out") == 0
        ):
            await trio.sleep(0.02)
    proxy.heal()  # recovery resolves what was in flight over a-c
    await network.settle({"a": {"b": 1, "c": 1}})
    verify_set(await consume(network.url("c"), "orders", count), count)
    assert not network.routers["a"].swiftlet("sys$queuemanager").prepared_transactions()
    assert not network.routers["c"].swiftlet("sys$queuemanager").prepared_transactions()


@pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
async def test_a_cut_while_several_transactions_are_in_flight_loses_and_duplicates_nothing(network, nursery, xa):
    """The link's store writes are pipelined: cut it while several transactions are open
    (prepared, committing, or sent and awaiting their answer) and heal it: recovery (XA) or
    the resend in doubt (non-XA) sorts them out, and the order holds (the path is the same)."""
    await start(network, "a", "b", listener={"use_xa": xa})
    proxy = await network.connect_through_proxy(nursery, "a", "b", xa=xa)
    network.routers["a"].management.add("/sys$routing/static-routes", "b")  # (sending goes on while cut)
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    proxy.delay(0.02)  # answers come late: transactions pile up open
    count = 2000
    open_at_cut = []

    async def cut_with_several_open() -> None:
        with trio.fail_after(30):
            while (
                found := network.routers["a"].management.get(
                    "/sys$routing/usage/connections/connector:b", "open-transactions"
                )
            ) < 3:
                await trio.sleep(0.001)
        open_at_cut.append(found)
        proxy.refuse(True)
        proxy.cut()
        await network.settle({"a": {}})
        proxy.heal()

    async with trio.open_nursery() as inner:
        inner.start_soon(cut_with_several_open)
        inner.start_soon(produce, network.url("a"), "orders@b", count)
    assert open_at_cut[0] >= 3
    verify(await consume(network.url("b"), "orders", count), count)
    for name in ("a", "b"):
        assert not network.routers[name].swiftlet("sys$queuemanager").prepared_transactions()


async def test_round_robin_over_two_equal_links(network):
    await start(network, "a", roundrobin_enabled=True)
    await start(network, "b", "c", "d")
    for x, y in (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")):
        network.connect(x, y)
    await network.settle({"a": {"b": 1, "c": 1, "d": 2}})
    await produce(network.url("a"), "orders@d", 1000)
    verify_set(await consume(network.url("d"), "orders", 1000), 1000)
    management = network.routers["a"].management
    over_b = management.get("/sys$routing/usage/connections/connector:b", "messages-out")
    over_c = management.get("/sys$routing/usage/connections/connector:c", "messages-out")
    # one batch each in turn: an even split (taking the first link with room gives about 760/240)
    assert over_b + over_c == 1000 and 400 <= over_b <= 600, (over_b, over_c)


async def test_a_message_for_a_missing_queue_goes_to_unroutable_with_the_reason(network):
    await start(network, "a")
    await network.start(
        network.config(
            "b",
            startorder=ROUTING_STACK,
            swiftlets={
                "sys$routing": routing_config(),
                "sys$queuemanager": QueueManagerConfig(auto_create_queues=False),
            },
        )
    )
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    await produce(network.url("a"), "missing@b", 3)
    unroutable = network.routers["b"].swiftlet("sys$queuemanager").queues["unroutable"]
    with trio.fail_after(20):
        while unroutable.size < 3:
            await trio.sleep(0.02)
    annotations = next(iter(unroutable.browse())).message.message_annotations
    assert annotations[UNROUTABLE_REASON] == "queue 'missing' does not exist on router b"
    assert annotations[SOURCE] == "a" and annotations[QUEUE] == "missing" and annotations[HOPS] == 1
    assert network.routers["b"].management.get("/sys$routing/usage", "unroutable") == 3


@pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
async def test_a_routed_message_naming_an_invalid_queue_goes_to_unroutable_and_the_link_goes_on(network, xa):
    """A peer's routed message may name a queue no queue may be named ('\\x0bzq': white
    space). It went to the queue manager, which refused the whole batch: the link was closed
    with an ERROR as if this router's store had failed, and the peer sent the batch again
    on the next link, for ever (the routing frame fuzzer found it). Now it goes to
    unroutable with the reason, as a message for a missing queue does, and the messages
    around it arrive. The message is put into a's rt$b as it stands, as a peer would send it."""
    await start(network, "a", "b", listener={"use_xa": xa})
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    link = "/sys$routing/usage/connections/connector:b"
    connected = network.routers["a"].management.get(link, "connecttime")
    manager = network.routers["a"].swiftlet("sys$queuemanager")
    for text, queue in (("before", "orders"), ("bad", "\x0bzq"), ("after", "orders")):
        annotations = {SOURCE: "a", DESTINATION: "b", QUEUE: queue, HOPS: UInt(0)}
        await manager.send("rt$b", build(text, annotations=annotations, message_id=text, durable=True))
    assert await consume(network.url("b"), "orders", 2) == ["before", "after"]
    unroutable = network.routers["b"].swiftlet("sys$queuemanager").queue("unroutable")
    await wait_until(lambda: unroutable.size == 1)
    [entry] = unroutable.browse()
    assert entry.message.body() == "bad"
    assert entry.message.message_annotations[UNROUTABLE_REASON] == (
        "invalid queue name '\\x0bzq': non-empty, without '/', '@' or spaces"
    )
    assert network.routers["a"].management.get(link, "connecttime") == connected  # the same link


@pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
async def test_across_a_50_ms_round_trip_the_window_grows_past_its_start(network, nursery, xa):
    """A link carries at most its window per round trip, so across distance the window
    grows past the 10 transactions it starts with (``inbound-window-size``): counted, not
    timed. The messages wait in rt$b first, so that the link always has more to send than
    its window; every one arrives once, in order."""
    await start(network, "a", "b", listener={"use_xa": xa})
    network.routers["a"].management.add("/sys$routing/static-routes", "b")  # messages wait in rt$b meanwhile
    count = 4000
    await produce(network.url("a"), "orders@b", count, persistent=False)
    proxy = FaultProxy("127.0.0.1", network.routing_port("b"))
    await nursery.start(proxy.run)
    proxy.delay(0.025)  # each way: a 50 ms round trip
    network.routers["a"].management.add(
        "/sys$routing/connectors",
        "b",
        {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000", "use-xa": str(xa).lower()},
    )
    usage = "/sys$routing/usage/connections/connector:b"
    most = {"window": 0, "transactions-in-flight": 0}
    done = trio.Event()

    async def watch() -> None:
        tree = network.routers["a"].management
        while not done.is_set():
            try:
                values = tree.resolve(usage).properties()
            except Exception:  # (not connected yet)
                values = {}
            for name in most:
                most[name] = max(most[name], values.get(name, 0))
            await trio.sleep(0.002)

    nursery.start_soon(watch)
    received = await consume(network.url("b"), "orders", count, timeout=60)
    done.set()
    verify(received, count)
    assert most["window"] > 10 and most["transactions-in-flight"] > 10, most


async def send_across_the_hop_limit(network, chain: tuple[str, ...], hops: int, stops_at: str):
    """Routers ``chain`` linked in a line; from the first, two messages already travelling
    to ``orders@<last>`` with ``hops`` and ``hops + 1`` routers counted so far: the first
    must arrive, the second go to unroutable at ``stops_at``; that entry."""
    await start(network, *chain)
    for x, y in itertools.pairwise(chain):
        network.connect(x, y)
    first, last = chain[0], chain[-1]
    await network.settle(
        {
            first: {r: n for n, r in enumerate(chain) if n},
            last: {r: len(chain) - 1 - n for n, r in enumerate(chain) if r != last},
        }
    )
    manager = network.routers[first].swiftlet("sys$queuemanager")
    for text, counted in (("arrives", hops), ("too far", hops + 1)):
        annotations = {SOURCE: first, DESTINATION: last, QUEUE: "orders", HOPS: UInt(counted)}
        await manager.send(f"orders@{last}", build(text, annotations=annotations, message_id=text))
    assert await consume(network.url(last), "orders", 1) == ["arrives"]
    unroutable = network.routers[stops_at].swiftlet("sys$queuemanager").queue("unroutable")
    await wait_until(lambda: unroutable.size >= 1)
    [entry] = unroutable.browse()
    assert entry.message.body() == "too far"
    assert entry.message.message_annotations[UNROUTABLE_REASON] == "it passed 64 routers (a loop?)"
    return entry


async def test_a_message_that_passed_too_many_routers_goes_to_unroutable_where_it_reaches_the_limit(network):
    """The hop check on the way (a loop's net): every router a message passes counts it, and
    one that would pass the limit (64 routers) is put into unroutable with the reason
    instead of being forwarded; one router fewer and it arrives."""
    entry = await send_across_the_hop_limit(network, ("a", "b", "c"), 62, "b")
    assert entry.message.message_annotations[HOPS] == 64


async def test_every_router_that_forwards_a_message_counts_its_hop(network):
    """Each forwarding router passes the message on with its hop count raised, so the limit
    holds over any number of them: in a chain a-b-c-d, a message that arrives at b with 61
    hops reaches d; one with 62 reaches the limit at c (b forwarded it with 63), not at d. A
    router that forwarded the count it received would let a loop circle for ever."""
    await send_across_the_hop_limit(network, ("a", "b", "c", "d"), 61, "c")
    assert network.routers["b"].swiftlet("sys$queuemanager").queue("unroutable").size == 0
