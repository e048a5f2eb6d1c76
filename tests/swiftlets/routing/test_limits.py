"""Every way a receiving router can turn routed messages away, over real links between
routers in one process: a full target queue (max-messages, max-bytes), a batch larger than
the whole queue, a message over the receiver's max-message-size (a refused XA
transaction), an unknown queue or router, a temporary queue that is gone. Each test counts
what arrives with numbered producers: nothing lost, nothing doubled, and the messages come
through later or sit in the right queue with the reason.
"""

from __future__ import annotations

import pytest
import trio

from martinet.messaging.message import build
from martinet.swiftlets.routing.linkwork import UNROUTABLE_REASON
from martinet.swiftlets.routing.routing_annotations import DESTINATION, HOPS, QUEUE, SOURCE
from martinet.swiftlets.routing.wire import DEFAULT_TRANSACTION_SIZE

from tests.harness.polling import wait_until
from tests.swiftlets.routing.test_transfer_network import consume, produce, start, verify, verify_set

XA = pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
USAGE = "/sys$routing/usage/connections/connector:b"


async def _linked(network, xa: bool, **queue_settings: str):
    """a → b, b's queue ``orders`` with ``queue_settings``; the queue managers."""
    await start(network, "a", "b", listener={"use_xa": xa})
    network.routers["b"].management.add("/sys$queuemanager/queues", "orders", queue_settings)
    network.connect("a", "b", **{"use-xa": str(xa).lower()})
    await network.settle({"a": {"b": 1}})
    return network.routers["a"].swiftlet("sys$queuemanager"), network.routers["b"].swiftlet("sys$queuemanager")


def _waiting_for_room(network, name: str) -> int:
    """Inbound batches waiting for room on router ``name``'s links."""
    links = network.routers[name].management.resolve("/sys$routing/usage/connections").children.values()
    return sum(link.properties().get("inbound-waiting-for-room", 0) for link in links)


async def _watch_size(queue, most: list[int], done: trio.Event) -> None:
    while not done.is_set():
        most[0] = max(most[0], queue.size)
        await trio.sleep(0.005)


@XA
@pytest.mark.parametrize("limit", ["max-messages", "max-bytes"])
async def test_a_full_queue_holds_the_link_back_until_it_has_room_and_nothing_is_lost(network, nursery, xa, limit):
    """A full target queue is not a refusal and does not end the link: the batch waits at
    the receiver for room (its limit holds while it waits), the batches behind it wait too,
    and once a consumer makes room every message arrives once, in order."""
    settings = {"max-messages": "10"} if limit == "max-messages" else {"max-bytes": "2000"}
    a, b = await _linked(network, xa, **settings)
    count = 60
    most, done = [0], trio.Event()
    nursery.start_soon(_watch_size, b.queues["orders"], most, done)
    await produce(network.url("a"), "orders@b", count)  # returns once a holds them all
    await wait_until(lambda: _waiting_for_room(network, "b"))
    orders = b.queues["orders"]
    assert a.queues["rt$b"].size + orders.size == count
    full = orders.size + orders.reserved
    assert (full <= 10) if limit == "max-messages" else (orders.bytes + orders.reserved_bytes <= 2000), full
    verify(await consume(network.url("b"), "orders", count), count)
    done.set()
    # batches of up to inbound-transaction-size piled up meanwhile: one larger than the whole
    # queue goes in alone once it is empty, never beside another
    assert most[0] <= DEFAULT_TRANSACTION_SIZE, most
    connector = network.routers["a"].management.resolve(USAGE).properties()
    assert connector["messages-out"] == count  # one link all along: it was never closed
    assert a.queues["rt$b"].size == 0


@XA
async def test_a_batch_larger_than_the_whole_queue_goes_in_alone_once_it_is_empty(network, xa):
    """Batches of 100 (inbound-transaction-size) for a queue of 3 could never fit: each goes in alone once the queue is
    empty (the queue's limit then holds but for that one batch), so the path never stalls."""
    await start(network, "a", "b", listener={"use_xa": xa})
    network.routers["b"].management.add("/sys$queuemanager/queues", "orders", {"max-messages": "3"})
    network.routers["a"].management.add("/sys$routing/static-routes", "b")  # they wait in rt$b: full batches
    count = 3 * DEFAULT_TRANSACTION_SIZE
    await produce(network.url("a"), "orders@b", count)
    network.connect("a", "b", **{"use-xa": str(xa).lower()})
    b = network.routers["b"].swiftlet("sys$queuemanager")
    await wait_until(lambda: b.queues["orders"].size > 3)
    assert b.queues["orders"].size <= DEFAULT_TRANSACTION_SIZE  # one batch
    verify(await consume(network.url("b"), "orders", count), count)


async def test_a_refused_transaction_is_rolled_back_and_sent_again_until_it_is_taken(network):
    """Messages over the receiver's max-message-size: it refuses each XA transaction (it
    holds nothing of it) and the sender rolls it back and sends it again later, taking
    nothing off its rt$b meanwhile; once the receiver's limit allows them every one arrives
    once. (A sender that committed a refused transaction would lose them here.)"""
    a, b = await _linked(network, True)
    network.routers["b"].management.set("/sys$queuemanager", "max-message-size", 100)
    count = 20
    await produce(network.url("a"), "orders@b", count)
    management = network.routers["a"].management
    await wait_until(lambda: management.resolve(USAGE).properties()["transactions-refused"] >= 2, timeout=20)
    assert a.queues["rt$b"].size == count and b.queues["orders"].size == 0
    network.routers["b"].management.set("/sys$queuemanager", "max-message-size", 10 * 1024 * 1024)
    # (in any order: a refused transaction's messages go again after those sent after it)
    verify_set(await consume(network.url("b"), "orders", count), count)
    assert a.queues["rt$b"].size == 0 and management.resolve(USAGE).properties()["messages-out"] == count


async def test_a_message_for_a_router_the_next_one_does_not_know_goes_to_its_unroutable(network):
    """A message that reaches a router with no route to its destination (a route that went
    while it travelled) is put into that router's unroutable with the reason, not dropped."""
    a, b = await _linked(network, True)
    annotations = {SOURCE: "a", DESTINATION: "c", QUEUE: "orders", HOPS: 0}
    await a.send("rt$b", build("for c", annotations=annotations, message_id="c-1"))  # on its way to c via b
    unroutable = b.queue("unroutable")
    await wait_until(lambda: unroutable.size == 1)
    [entry] = unroutable.browse()
    assert entry.message.body() == "for c" and entry.message.message_annotations[HOPS] == 1
    assert entry.message.message_annotations[UNROUTABLE_REASON] == "router 'c' is not known to router 'b'"
    assert a.queues["rt$b"].size == 0


async def test_a_reply_for_a_temporary_queue_that_is_gone_is_dropped_and_counted(network):
    """A temporary queue went with its requester: a reply routed to it has nobody to read
    it and is dropped (counted), not put into unroutable; the next message still arrives."""
    await start(network, "a", "b")  # (queues are made on first use there: not a temporary one)
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    await produce(network.url("a"), "tmp$999@b", 3, prefix="late")
    await produce(network.url("a"), "orders@b", 1)
    verify(await consume(network.url("b"), "orders", 1), 1)
    management = network.routers["b"].management
    assert management.get("/sys$routing/usage", "dropped") == 3
    assert management.get("/sys$routing/usage", "unroutable") == 0
    assert "tmp$999" not in network.routers["b"].swiftlet("sys$queuemanager").queues


@XA
async def test_a_link_cut_while_its_batches_wait_for_room_loses_and_doubles_nothing(network, nursery, xa):
    """Batches waiting for room hold nothing at the receiver: when the link ends they are
    given up there (the link's end waits for nothing that never comes) and the sender sends
    them again over the next link (XA: recovery finds them not prepared; non-XA: in doubt,
    the target queue drops the copies it has)."""
    await start(network, "a", "b", listener={"use_xa": xa})
    network.routers["b"].management.add(
        "/sys$queuemanager/queues", "orders", {"max-messages": "10", "duplicate-detection-enabled": "true"}
    )
    proxy = await network.connect_through_proxy(nursery, "a", "b", xa=xa)
    await network.settle({"a": {"b": 1}})
    count = 60
    await produce(network.url("a"), "orders@b", count)
    await wait_until(lambda: _waiting_for_room(network, "b"))
    proxy.cut()
    await network.settle({"a": {"b": 1}})  # a new link
    verify_set(await consume(network.url("b"), "orders", count), count)
