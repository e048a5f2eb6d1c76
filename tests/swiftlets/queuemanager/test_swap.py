"""Persistent message bodies beyond a queue's ``cache-size`` leave
memory — kept in the store, read back in batches when consumers get to them — on a real
store (SQLite file, store process), with real AMQP clients (python-qpid-proton) where
delivery over the wire is concerned.

Every test checks the queue's own accounting (``/sys$queuemanager/usage/queues/<q>``:
``cached`` messages whose bytes are in memory, ``swapped`` ones only in the store) and the
whole delivered result: every message, in order, byte for byte.
"""

from __future__ import annotations

import pytest
import trio
from proton import Message as ProtonMessage
from proton.reactor import Copy, Selector
from proton.utils import BlockingConnection

from martinet.messaging.message import build
from martinet.messaging.selector import compile_selector
from martinet.swiftlets.queuemanager.api import QueueFull
from martinet.swiftlets.queuemanager.level import PACK_AFTER

from tests.harness.polling import wait_until


def msg(n: int, *, priority: int | None = None, size: int = 1024, **kwargs):
    """A persistent message whose body says which it is (and is ``size`` bytes long)."""
    body = f"m{n}:".encode().ljust(size, b"x")
    return build(
        body,
        durable=True,
        message_id=f"id-{n}",
        priority=priority,
        properties={"n": n, "kind": "b" if n % 5 == 0 else "a"},
        **kwargs,
    )


def usage(running, queue: str) -> dict:
    return running.router.management.resolve(f"/sys$queuemanager/usage/queues/{queue}").properties()


def delivery_order(count: int, high: set[int]) -> list[int]:
    """Priority 9 first (in send order), then the rest in send order."""
    return sorted(high) + [n for n in range(count) if n not in high]


async def test_bodies_beyond_the_cache_leave_memory_and_come_back_in_order(make_broker):
    running = make_broker(queues='<queue name="big" cache-size="20"/>')
    await running.start()
    queue_manager = running.queue_manager
    sent = {}
    high = {n for n in range(300) if n % 7 == 3}
    for n in range(300):
        sent[n] = msg(n, priority=9 if n in high else 4)
        await queue_manager.send("big", sent[n])
        assert usage(running, "big")["cached"] <= 20  # after every send: the bodies in memory
    figures = usage(running, "big")
    assert (figures["messages"], figures["cached"], figures["swapped"]) == (300, 20, 280)
    assert figures["packed"] > 280 - 2 * PACK_AFTER  # (the last few loose: packed when enough gather, per level)
    assert figures["bytes"] == sum(len(m.raw) for m in sent.values())  # max-bytes counts swapped ones whole
    assert figures["cached-bytes"] + figures["swapped-bytes"] == figures["bytes"]
    queue = queue_manager.queue("big")
    swapped = [entry for entry in queue.browse() if entry.swapped]
    assert len(swapped) == 280 and all(len(entry.message.raw) < 100 for entry in swapped)  # heads only
    assert {entry.message.application_properties["n"] for entry in swapped} <= set(range(300))

    consumer = queue.consumer()
    got = []
    for n in range(300):
        consumer.flow(1)
        with trio.fail_after(10):
            entry = await consumer.receive()
        assert not entry.swapped and entry.message == sent[entry.message.application_properties["n"]]
        if n == 0:  # given back: redelivered first, from memory
            consumer.release(entry)
            consumer.flow(1)
            entry = await consumer.receive()
            assert entry.message == sent[delivery_order(300, high)[0]]
        got.append(entry.message.application_properties["n"])
        consumer.accept(entry)
        assert usage(running, "big")["cached"] <= 2 * 20 + 1  # a batch (the cache) and the next read ahead
    assert got == delivery_order(300, high)
    figures = usage(running, "big")
    assert (figures["messages"], figures["cached"], figures["swapped"], figures["swapped-bytes"]) == (0, 0, 0, 0)
    assert figures["read-back"] == 280 and figures["reads"] <= 280 // 20 + 3  # in batches of the cache
    await running.restart()  # every deletion reached the store
    assert running.store.recovered.message_count == 0


async def test_the_next_batch_is_read_while_the_consumer_still_has_bodies_in_memory(make_broker):
    """Consuming from the store stalled: the next batch (half the cache) was asked for only
    when dispatch reached a swapped-out entry, or once half of the last batch was delivered,
    and the consumers waited for every read. Now a batch (the cache) is asked for as soon as
    fewer than that are in memory, and the consumer goes on with those meanwhile."""
    running = make_broker(queues='<queue name="ahead" cache-size="40"/>')
    await running.start()
    queue_manager = running.queue_manager
    sent = [msg(n) for n in range(200)]
    for message in sent:
        await queue_manager.send("ahead", message)
    assert usage(running, "ahead")["swapped"] == 160
    consumer = queue_manager.queue("ahead").consumer()
    got = []
    consumer.flow(1)
    got.append(consumer.receive_nowait())
    assert usage(running, "ahead")["reads"] == 1  # 39 bodies left in memory: the next batch is on its way
    for _ in range(39):  # no checkpoint in this loop: the read cannot have come back
        consumer.flow(1)
        got.append(consumer.receive_nowait())  # the consumer did not wait for it
    assert usage(running, "ahead")["reads"] == 1  # one read at a time
    for _ in range(160):
        consumer.flow(1)
        with trio.fail_after(10):
            got.append(await consumer.receive())
    assert [entry.message for entry in got] == sent
    for entry in got:
        consumer.accept(entry)
    figures = usage(running, "ahead")
    assert (figures["messages"], figures["read-back"]) == (0, 160)
    assert figures["reads"] <= 160 // 40 + 1  # batches of the cache, each asked for before it was due


async def test_a_selector_consumer_reads_back_only_what_it_selects(make_broker):
    running = make_broker(queues='<queue name="sel" cache-size="10"/>')
    await running.start()
    queue_manager = running.queue_manager
    sent = [msg(n, size=2000) for n in range(200)]
    for message in sent:
        await queue_manager.send("sel", message)
    assert usage(running, "sel")["swapped"] == 190
    queue = queue_manager.queue("sel")
    picky = queue.consumer(compile_selector("kind = 'b' AND n >= 50"))
    picky.flow(1000)
    await wait_until(lambda: picky.buffered == 30, what="the 30 selected messages")
    got = [picky.receive_nowait() for _ in range(30)]
    assert [entry.message for entry in got] == [sent[n] for n in range(50, 200, 5)]
    assert usage(running, "sel")["read-back"] == 30  # nothing it does not select came back for it
    for entry in got:
        picky.accept(entry)
    assert usage(running, "sel")["swapped"] == 160
    everyone = queue.consumer()
    everyone.flow(1000)
    await wait_until(lambda: everyone.buffered == 170, what="the other 170 messages")
    rest = [everyone.receive_nowait() for _ in range(170)]
    assert [entry.message for entry in rest] == [m for n, m in enumerate(sent) if not (n >= 50 and n % 5 == 0)]
    for entry in rest:
        everyone.accept(entry)
    assert usage(running, "sel")["swapped"] == 0


async def test_a_restarted_big_queue_reads_back_only_its_cache(make_broker):
    running = make_broker(queues='<queue name="big" cache-size="25"/><queue name="all" cache-size="-1"/>')
    await running.start()
    sent = [msg(n, priority=7 if n % 50 == 49 else None) for n in range(500)]
    for message in sent:
        await running.queue_manager.send("big", message)
    for message in sent[:40]:
        await running.queue_manager.send("all", message)
    assert usage(running, "all")["swapped"] == 0  # cache-size -1: everything stays
    await running.restart()
    assert running.store.recovered.message_count == 540
    figures = usage(running, "big")
    assert (figures["messages"], figures["cached"], figures["swapped"], figures["read-back"]) == (500, 25, 475, 0)
    assert (usage(running, "all")["cached"], usage(running, "all")["swapped"]) == (40, 0)
    queue = running.queue_manager.queue("big")
    front = [entry for entry in queue.browse()][:25]  # the first 25 in delivery order came back
    high = [n for n in range(500) if n % 50 == 49]
    assert [entry.message for entry in front] == [sent[n] for n in delivery_order(500, set(high))[:25]]
    assert all(not entry.swapped for entry in front) and all(e.redelivered is False for e in front)
    consumer = queue.consumer()
    consumer.flow(100)
    got = []
    while len(got) < 500:
        with trio.fail_after(10):
            entry = await consumer.receive()
        got.append(entry.message)
        consumer.accept(entry)
        consumer.flow(1)
    assert got == [sent[n] for n in delivery_order(500, set(high))]
    assert (usage(running, "big")["messages"], usage(running, "big")["swapped"]) == (0, 0)


async def test_expiry_dead_letters_transactions_and_limits_with_swapped_bodies(make_broker):
    running = make_broker(
        queues='<queue name="ttl" cache-size="5" expired-to-dlq="true"/>'
        '<queue name="routerdlq" cache-size="10"/>'
        '<queue name="tx" cache-size="5"/>'
        '<queue name="full" cache-size="5" max-messages="30"/>'
    )
    await running.start()
    queue_manager = running.queue_manager
    expiring = [msg(n, ttl=1000) for n in range(200)]
    for message in expiring:
        await queue_manager.send("ttl", message)
    assert usage(running, "ttl")["swapped"] == 195 and usage(running, "ttl")["packed"] > 0
    await trio.sleep(1.1)
    assert queue_manager.queue("ttl").remove_expired() == 200  # packed ones too
    dlq = queue_manager.queue("routerdlq")
    await wait_until(lambda: dlq.size == 200, what="all 200 in routerdlq (195 read back first)")
    assert usage(running, "ttl")["swapped"] == 0 and usage(running, "ttl")["messages"] == 0
    await wait_until(lambda: usage(running, "routerdlq")["swapped"] == 190, what="dead letters beyond the cache out")
    moved = sorted(dlq.browse(), key=lambda entry: entry.message.application_properties["n"])
    fetched = trio.Event()
    whole = {}
    queue_manager.fetch_messages(moved, lambda messages: (whole.update(messages), fetched.set()))
    with trio.fail_after(10):
        await fetched.wait()
    assert [whole[entry.id].body() for entry in moved] == [message.body() for message in expiring]  # intact
    assert usage(running, "routerdlq")["swapped"] == 190  # what a browser reads is not the queue's

    for n in range(20):  # a transaction's sends beyond the cache leave memory at commit
        await queue_manager.send("tx", msg(n))
    transaction = queue_manager.transaction()
    for n in range(20, 30):
        transaction.send("tx", msg(n))
    await transaction.commit()
    assert usage(running, "tx")["swapped"] == 25
    consumer = queue_manager.queue("tx").consumer()
    consumer.flow(30)
    await wait_until(lambda: consumer.buffered == 30)
    entries = [consumer.receive_nowait() for _ in range(30)]
    assert [entry.message for entry in entries] == [msg(n) for n in range(30)]
    rollback = queue_manager.transaction()
    for entry in entries[:10]:
        rollback.acknowledge(consumer, entry)
    await rollback.rollback()  # back, redelivered, in their place
    for entry in entries[10:]:
        consumer.accept(entry)
    consumer.flow(10)
    await wait_until(lambda: consumer.buffered == 10)
    again = [consumer.receive_nowait() for _ in range(10)]
    assert [(entry.message, entry.redelivered) for entry in again] == [(msg(n), True) for n in range(10)]

    for n in range(30):  # max-messages counts swapped-out messages
        await queue_manager.send("full", msg(n))
    assert usage(running, "full")["swapped"] == 25
    with pytest.raises(QueueFull):
        await queue_manager.send("full", msg(30))
    queue_manager.delete_queue("full")  # dropped with its swapped messages, from the store too
    await running.restart()
    assert "full" not in running.queue_manager.queues or running.queue_manager.queue("full").size == 0


async def test_non_persistent_messages_stay_in_memory(make_broker):
    running = make_broker(queues='<queue name="mixed" cache-size="5"/>')
    await running.start()
    for n in range(20):
        await running.queue_manager.send("mixed", build(f"t{n}".encode() * 100, durable=False))
    await running.queue_manager.send("mixed", msg(99))
    assert (usage(running, "mixed")["cached"], usage(running, "mixed")["swapped"]) == (20, 1)


# -- over AMQP -------------------------------------------------------------------------------


def send_all(url: str, address: str, messages: list[ProtonMessage]) -> None:
    connection = BlockingConnection(url, timeout=30)
    try:
        sender = connection.create_sender(address)
        for message in messages:
            sender.send(message)  # waits for the router's settlement: the message is stored
    finally:
        connection.close()


def receive_all(url: str, address: str, count: int, selector: str | None = None) -> list[ProtonMessage]:
    connection = BlockingConnection(url, timeout=30)
    try:
        receiver = connection.create_receiver(address, credit=100, options=Selector(selector) if selector else None)
        got = []
        for _ in range(count):
            got.append(receiver.receive(timeout=10))
            receiver.accept()
        return got
    finally:
        connection.close()


def browse_all(url: str, address: str) -> list[ProtonMessage]:
    connection = BlockingConnection(url, timeout=30)
    try:
        receiver = connection.create_receiver(address, credit=50, options=Copy())
        got = []
        while True:
            try:
                got.append(receiver.receive(timeout=2))
            except Exception:  # noqa: BLE001 - proton's Timeout: the browse is over
                return got
    finally:
        connection.close()


async def test_amqp_clients_get_swapped_out_messages_in_order_intact(amqp_broker):
    running = await amqp_broker(queues='<queues><queue name="big" cache-size="50"/></queues>')
    count = 1000
    messages = [
        ProtonMessage(
            id=f"id-{n}",
            body=f"m{n}:".encode().ljust(1024, b"y"),
            durable=True,
            priority=9 if n % 10 == 0 else 4,
            properties={"n": n, "pick": n % 3 == 0},
        )
        for n in range(count)
    ]
    await trio.to_thread.run_sync(send_all, running.url, "big", messages)
    figures = running.usage("big")
    assert (figures["messages"], figures["cached"], figures["swapped"]) == (count, 50, count - 50)

    browsed = await trio.to_thread.run_sync(browse_all, running.url, "big")
    order = delivery_order(count, {n for n in range(count) if n % 10 == 0})
    assert [m.properties["n"] for m in browsed] == order
    assert all(m.body == messages[m.properties["n"]].body for m in browsed)
    assert running.usage("big")["swapped"] == count - 50  # a browse reads back for itself only

    picked = await trio.to_thread.run_sync(receive_all, running.url, "big", 334, "pick = TRUE")
    assert [m.properties["n"] for m in picked] == [n for n in order if n % 3 == 0]
    rest = await trio.to_thread.run_sync(receive_all, running.url, "big", count - 334)
    assert [m.properties["n"] for m in rest] == [n for n in order if n % 3]
    assert all(
        m.body == messages[m.properties["n"]].body and m.priority == messages[m.properties["n"]].priority
        for m in picked + rest
    )
    await wait_until(lambda: running.connections() == 0)
    figures = running.usage("big")
    assert (figures["messages"], figures["cached"], figures["swapped"]) == (0, 0, 0)


async def test_entries_held_in_transactions_leave_the_cache_to_the_backlog(make_broker):
    """A routing link holds its window's messages in transactions across a round trip:
    those (in memory, never swapped out) must not push every new arrival out of the cache
    to be read back at once; the cache counts the entries waiting or delivered."""
    running = make_broker(queues='<queue name="rt" cache-size="10"/>')
    await running.start()
    queue_manager = running.queue_manager
    for n in range(30):
        await queue_manager.send("rt", msg(n, size=200))
    queue = queue_manager.queue("rt")
    consumer = queue.consumer()
    consumer.flow(30)
    transaction = queue_manager.transaction()
    with trio.fail_after(10):
        for _ in range(30):  # (the swapped-out ones read back on the way)
            transaction.acknowledge(consumer, await consumer.receive())  # held, as a link's window
    for n in range(30, 40):  # ten arrive while the thirty are held: they fit the cache
        await queue_manager.send("rt", msg(n, size=200))
    assert (usage(running, "rt")["swapped"], usage(running, "rt")["messages"]) == (0, 40)
    for n in range(40, 45):  # past the cache: the backlog's own entries go out
        await queue_manager.send("rt", msg(n, size=200))
    assert usage(running, "rt")["swapped"] == 5
    await transaction.commit()
    assert usage(running, "rt")["messages"] == 15
