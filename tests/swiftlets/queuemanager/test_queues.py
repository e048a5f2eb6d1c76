"""sys$queuemanager on a real store: delivery, consumer modes, outcomes, expiry, DLQ,
duplicates, transactions (incl. prepare → restart), persistence, bad input."""

from __future__ import annotations

import functools
import time

import pytest
import trio

from martinet.messaging.codec import Symbol
from martinet.messaging.message import build
from martinet.messaging.selector import SelectorError, compile_selector
from martinet.swiftlets.queuemanager.api import (
    ConsumerRefused,
    MessageTooLarge,
    QueueError,
    QueueFull,
    QueueNotFound,
    TransactionError,
)

from tests.harness.polling import wait_until


def msg(n, **kwargs):
    return build(f"m{n}".encode(), message_id=f"id-{n}", properties={"n": n}, **kwargs)


def bodies(entries):
    return [entry.message.body().decode() for entry in entries]


def take(consumer, count):
    return [consumer.receive_nowait() for _ in range(count)]


async def test_send_and_receive_in_order(broker):
    queue_manager = broker.queue_manager
    for n in range(5):
        await queue_manager.send("orders", msg(n))
    consumer = queue_manager.queue("orders").consumer()
    with pytest.raises(trio.WouldBlock):
        consumer.receive_nowait()  # no credit, no delivery
    consumer.flow(3)
    got = take(consumer, 3)
    assert bodies(got) == ["m0", "m1", "m2"]
    with pytest.raises(trio.WouldBlock):
        consumer.receive_nowait()
    for entry in got:
        consumer.accept(entry)
    consumer.flow(10)
    assert bodies(take(consumer, 2)) == ["m3", "m4"]
    assert broker.router.management.get("/sys$queuemanager/usage/queues/orders", "messages") == 2


async def test_names_resolve_against_the_local_router(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("orders@r1", msg(1))
    assert queue_manager.queue("orders").size == 1
    with pytest.raises(QueueNotFound, match=r"router 'paris' is not known to router 'r1' \(no route and no static"):
        await queue_manager.send("orders@paris", msg(2))
    queue_manager.add_redirection("%@paris", "rt$paris")
    await queue_manager.send("orders@paris", msg(3))
    assert (
        queue_manager.queue("rt$paris").size == 1
        and queue_manager.queue("rt$paris").settings.persistence_mode == "as_message"
    )
    queue_manager.add_redirection("orders@paris", "rt$special")  # (remembered redirections are forgotten)
    assert queue_manager.resolve("orders@paris") == "rt$paris"  # the first added still covers it
    queue_manager.remove_redirection("%@paris")
    assert queue_manager.resolve("orders@paris") == "rt$special"
    queue_manager.remove_redirection("orders@paris")
    with pytest.raises(QueueNotFound, match="router 'paris' is not known"):
        queue_manager.resolve("orders@paris")


async def test_priority_order_then_fifo(broker):
    queue_manager = broker.queue_manager
    for n, priority in enumerate([4, 9, 0, 9, 4, 7]):
        await queue_manager.send("p", msg(n, priority=priority))
    consumer = queue_manager.queue("p").consumer()
    consumer.flow(10)
    assert bodies(take(consumer, 6)) == ["m1", "m3", "m5", "m0", "m4", "m2"]


async def test_shared_consumers_take_turns(broker):
    queue_manager = broker.queue_manager
    queue = queue_manager.queue("shared")
    first, second = queue.consumer(), queue.consumer()
    first.flow(10)
    second.flow(10)
    for n in range(6):
        await queue_manager.send("shared", msg(n))
    assert bodies(take(first, 3)) == ["m0", "m2", "m4"]
    assert bodies(take(second, 3)) == ["m1", "m3", "m5"]


async def test_exclusive_queue_refuses_a_second_consumer(make_broker):
    running = make_broker(queues='<queue name="solo" consumer-mode="exclusive"/>')
    await running.start()
    queue = running.queue_manager.queue("solo")
    queue.consumer()
    with pytest.raises(ConsumerRefused, match="queue solo is exclusive and has a consumer already"):
        queue.consumer()
    await running.stop()


async def test_active_standby_takes_over_when_the_active_leaves(make_broker):
    running = make_broker(queues='<queue name="ha" consumer-mode="activestandby"/>')
    await running.start()
    queue_manager = running.queue_manager
    active, standby = queue_manager.queue("ha").consumer(), queue_manager.queue("ha").consumer()
    active.flow(10)
    standby.flow(10)
    for n in range(3):
        await queue_manager.send("ha", msg(n))
    assert bodies(take(active, 3)) == ["m0", "m1", "m2"]
    with pytest.raises(trio.WouldBlock):
        standby.receive_nowait()
    active.close()  # received but unsettled: back to the queue, counted as redelivered
    got = take(standby, 3)
    assert bodies(got) == ["m0", "m1", "m2"] and all(entry.redelivered for entry in got)
    await running.stop()


async def test_outcomes(broker):
    queue_manager = broker.queue_manager
    for n in range(4):
        await queue_manager.send("work", msg(n))
    consumer = queue_manager.queue("work").consumer()
    consumer.flow(1)
    first = consumer.receive_nowait()
    consumer.release(first)  # not delivered: back in place, count unchanged
    consumer.flow(1)
    again = consumer.receive_nowait()
    assert bodies([again]) == ["m0"] and again.delivery_count == 0 and not again.redelivered
    consumer.modify(again)  # failed delivery: counted
    consumer.flow(1)
    third = consumer.receive_nowait()
    assert (third.id, third.delivery_count, third.redelivered) == (first.id, 1, True)
    consumer.reject(third, "cannot parse it")
    dlq = queue_manager.queue("routerdlq")
    [dead] = list(dlq.browse())
    assert dead.message.body() == b"m0"
    assert dead.message.message_annotations == {
        "x-opt-martinet-dlq-reason": "cannot parse it",
        "x-opt-martinet-dlq-queue": "work",
    }
    consumer.flow(1)
    fourth = consumer.receive_nowait()
    consumer.accept(fourth)
    with pytest.raises(QueueError, match="is not unsettled on this consumer"):
        consumer.accept(fourth)
    usage = broker.router.management.resolve("/sys$queuemanager/usage/queues/work").properties()
    assert (usage["messages"], usage["dequeued"], usage["dead-lettered"]) == (2, 1, 1)


async def test_max_delivery_count_sends_to_the_dlq(make_broker):
    running = make_broker(queues='<queue name="poison" max-delivery-count="2"/>')
    await running.start()
    queue_manager = running.queue_manager
    await queue_manager.send("poison", msg(1))
    consumer = queue_manager.queue("poison").consumer()
    for _ in range(2):
        consumer.flow(1)
        consumer.modify(consumer.receive_nowait())
    assert queue_manager.queue("poison").size == 0
    [dead] = list(queue_manager.queue("routerdlq").browse())
    assert "max-delivery-count 2" in dead.message.message_annotations["x-opt-martinet-dlq-reason"]
    await running.stop()


async def test_closing_returns_what_was_never_received_without_counting(broker):
    queue_manager = broker.queue_manager
    for n in range(3):
        await queue_manager.send("c", msg(n))
    consumer = queue_manager.queue("c").consumer()
    consumer.flow(3)
    received = consumer.receive_nowait()  # m0 seen; m1, m2 delivered but never received
    assert received.delivery_count == 0
    consumer.close()
    with pytest.raises(trio.ClosedResourceError):
        consumer.receive_nowait()
    counts = [(e.message.body(), e.delivery_count) for e in queue_manager.queue("c").browse()]
    assert counts == [(b"m0", 1), (b"m1", 0), (b"m2", 0)]


async def test_a_waiting_receiver_is_woken(broker):
    queue_manager = broker.queue_manager
    consumer = queue_manager.queue("wake").consumer()
    consumer.flow(1)
    async with trio.open_nursery() as nursery:
        got = []

        async def wait():
            got.append(await consumer.receive())

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        await queue_manager.send("wake", msg(1))
    assert bodies(got) == ["m1"]


async def test_batch_take_and_notification_when_deliveries_start_waiting(broker):
    queue_manager = broker.queue_manager
    consumer = queue_manager.queue("batch").consumer()
    wakeups = []
    consumer.notify = lambda: wakeups.append(consumer.buffered)
    consumer.flow(10)
    for n in range(4):
        await queue_manager.send("batch", msg(n))
    assert consumer.buffered == 4 and wakeups == [1]  # once, when the first one arrived
    assert bodies(consumer.take(3)) == ["m0", "m1", "m2"]
    assert bodies(consumer.take(10)) == ["m3"] and consumer.take(10) == []
    await queue_manager.send("batch", msg(4))
    assert wakeups == [1, 1] and bodies(consumer.take(1)) == ["m4"]


async def test_drain_drops_unused_credit(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("d", msg(1))
    consumer = queue_manager.queue("d").consumer()
    consumer.flow(5)
    assert consumer.drain() == 4
    await queue_manager.send("d", msg(2))
    assert bodies(take(consumer, 1)) == ["m1"]
    with pytest.raises(trio.WouldBlock):
        consumer.receive_nowait()


async def test_selectors_on_consumers_and_browsers(broker):
    queue_manager = broker.queue_manager
    for n in range(6):
        await queue_manager.send("sel", build(b"x", properties={"n": n, "colour": "green" if n % 2 else "red"}))
    queue = queue_manager.queue("sel")
    browsed = [e.message.application_properties["n"] for e in queue.browse(compile_selector("n > 2"))]
    assert browsed == [3, 4, 5]
    greens = queue.consumer(compile_selector("colour = 'green'"))
    greens.flow(10)
    assert [e.message.application_properties["n"] for e in take(greens, 3)] == [1, 3, 5]
    reds = queue.consumer(compile_selector("colour = 'red' AND n >= 2"))
    reds.flow(10)
    assert [e.message.application_properties["n"] for e in take(reds, 2)] == [2, 4]
    await queue_manager.send("sel", build(b"x", properties={"n": 8, "colour": "red"}))  # wakes the parked consumer
    assert reds.receive_nowait().message.application_properties["n"] == 8
    assert [e.message.application_properties["n"] for e in queue.browse()] == [0]  # the rest is delivered
    with pytest.raises(SelectorError):
        compile_selector("colour = ")


async def test_expired_messages_are_never_delivered(make_broker):
    running = make_broker(queues='<queue name="ttl" expired-to-dlq="true"/><queue name="drop"/>')
    await running.start()
    queue_manager = running.queue_manager
    past = int(time.time() * 1000) - 1
    await queue_manager.send("ttl", msg(1, absolute_expiry_time=past))  # expired on arrival
    await queue_manager.send("ttl", msg(2, ttl=100))
    await queue_manager.send("ttl", msg(3))
    await queue_manager.send("drop", msg(4, ttl=100))
    await trio.sleep(0.2)  # real time: expiry is wall-clock time
    consumer = queue_manager.queue("ttl").consumer()
    consumer.flow(10)
    assert bodies(take(consumer, 1)) == ["m3"]
    assert queue_manager.queue("drop").remove_expired() == 1
    usage = queue_manager.queue("ttl").usage()
    assert (usage["expired"], usage["messages"]) == (2, 1)
    reasons = [
        e.message.message_annotations["x-opt-martinet-dlq-reason"] for e in queue_manager.queue("routerdlq").browse()
    ]
    assert reasons == ["expired before it arrived", "expired"]
    await running.stop()


async def test_duplicates_are_dropped_when_in_doubt(broker):
    queue_manager = broker.queue_manager
    assert not (await queue_manager.send("dup", msg(1, durable=True))).duplicate
    assert not (await queue_manager.send("dup", msg(1, durable=True))).duplicate  # no doubt: a normal send
    assert (await queue_manager.send("dup", msg(1, durable=True), possible_duplicate=True)).duplicate
    assert not (await queue_manager.send("dup", msg(2, durable=True), possible_duplicate=True)).duplicate
    assert queue_manager.queue("dup").size == 3 and queue_manager.queue("dup").duplicates == 1
    await broker.restart()  # the backlog survives
    queue_manager = broker.queue_manager
    assert (await queue_manager.send("dup", msg(2, durable=True), possible_duplicate=True)).duplicate
    assert not (await queue_manager.send("dup", msg(3, durable=True), possible_duplicate=True)).duplicate


async def test_duplicate_check_always(make_broker):
    running = make_broker(queues='<queue name="strict" duplicate-check="always" duplicate-detection-backlog-size="2"/>')
    await running.start()
    queue_manager = running.queue_manager
    results = [(await queue_manager.send("strict", msg(n))).duplicate for n in (1, 1, 2, 3, 1)]
    assert results == [False, True, False, False, False]  # id-1 fell out of the backlog of 2
    await running.stop()


async def test_persistent_messages_survive_a_restart(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("keep", msg(1, durable=True))
    await queue_manager.send("keep", msg(2))  # non-persistent
    await queue_manager.send("keep", msg(3, durable=True, priority=8))

    def store_operations():
        return broker.router.management.get("/sys$store/usage", "operations")

    before = store_operations()
    consumer = queue_manager.queue("keep").consumer()
    consumer.flow(1)
    consumer.modify(consumer.receive_nowait())  # m3 delivered once
    consumer.close()
    await wait_until(lambda: store_operations() == before + 1)  # the count is stored in the background
    await broker.restart()
    consumer = broker.queue_manager.queue("keep").consumer()
    consumer.flow(10)
    got = take(consumer, 2)
    assert [(b, e.delivery_count) for b, e in zip(bodies(got), got, strict=True)] == [("m3", 1), ("m1", 0)]


async def test_forced_persistence_modes(make_broker):
    running = make_broker(
        queues='<queue name="always" persistence-mode="persistent"/>'
        '<queue name="never" persistence-mode="non_persistent"/>'
    )
    await running.start()
    await running.queue_manager.send("always", msg(1))
    await running.queue_manager.send("never", msg(2, durable=True))
    await running.restart()
    assert running.queue_manager.queue("always").size == 1 and running.queue_manager.queue("never").size == 0
    await running.stop()


async def test_transaction_spanning_queues_commits_together(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("in", msg(0, durable=True))
    consumer = queue_manager.queue("in").consumer()
    consumer.flow(1)
    entry = consumer.receive_nowait()
    transaction = queue_manager.transaction()
    transaction.acknowledge(consumer, entry)
    transaction.send("out-a", msg(1, durable=True))
    transaction.send("out-b", msg(2))
    assert queue_manager.queue("out-a").size == 0  # invisible until commit
    await transaction.commit()
    assert (queue_manager.queue("in").size, queue_manager.queue("out-a").size, queue_manager.queue("out-b").size) == (
        0,
        1,
        1,
    )
    with pytest.raises(TransactionError, match="transaction is committed, not active"):
        transaction.send("out-a", msg(3))
    await broker.restart()
    assert (broker.queue_manager.queue("in").size, broker.queue_manager.queue("out-a").size) == (0, 1)


async def test_a_send_staged_before_its_routing_queue_was_retired_still_lands_there(broker):
    # Routing deletes an empty rt$R of a router gone for a while; a transaction that staged
    # a send to q@R before must not lose it at commit: the queue is made anew.
    queue_manager = broker.queue_manager
    queue_manager.queue("rt$gone", create=True)
    queue_manager.add_redirection("%@gone", "rt$gone")
    transaction = queue_manager.transaction()
    transaction.send("q@gone", msg(1, durable=True))
    queue_manager.remove_redirection("%@gone")
    queue_manager.delete_queue("rt$gone", quiet=True)
    await transaction.commit()
    assert queue_manager.queues["rt$gone"].size == 1
    await broker.restart()
    assert broker.queue_manager.queues["rt$gone"].size == 1


async def test_redirections_of_whole_routers_and_patterns(broker):
    queue_manager = broker.queue_manager
    for name in ("rt$a_b", "rt$p", "other"):
        queue_manager.queue(name, create=True)
    queue_manager.add_redirection("%@a\\_b", "rt$a_b")  # a whole router, '_' escaped
    queue_manager.add_redirection("%@p%", "rt$p")  # a pattern: scanned
    assert queue_manager.resolve("q@a_b") == "rt$a_b"
    assert queue_manager.resolve("q@p1") == queue_manager.resolve("q@p") == "rt$p"
    with pytest.raises(QueueNotFound):
        queue_manager.resolve("q@axb")  # '_' is not a wildcard here
    queue_manager.add_redirection("%@p1", "other")  # the whole router's wins over a pattern
    assert queue_manager.resolve("q@p1") == "other"
    queue_manager.remove_redirection("%@p1")
    assert queue_manager.resolve("q@p1") == "rt$p"
    queue_manager.remove_redirection("%@a\\_b")
    with pytest.raises(QueueNotFound):
        queue_manager.resolve("q@a_b")


async def test_rollback_redelivers_and_drops_sends(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("in", msg(0, durable=True))
    consumer = queue_manager.queue("in").consumer()
    consumer.flow(2)
    entry = consumer.receive_nowait()
    transaction = queue_manager.transaction()
    transaction.acknowledge(consumer, entry)
    transaction.send("out", msg(1, durable=True))
    await transaction.rollback()
    again = consumer.receive_nowait()
    assert again.id == entry.id and again.redelivered
    assert queue_manager.queue("out").size == 0


async def test_what_prepared_and_committing_transactions_will_add_counts_against_the_limits(broker):
    """Two transactions each staging 6 messages into a queue of 10 would both fit the queue
    as it is; once the first is prepared its 6 are reserved, so the second's 5th send finds
    the queue full. The reservation ends with the commit or rollback, and whoever waits for
    room (QueueManager.when_room) is called then."""
    queue_manager = broker.queue_manager
    broker.router.management.add("/sys$queuemanager/queues", "capped", {"max-messages": "10"})
    first, second = queue_manager.transaction(), queue_manager.transaction()
    for n in range(6):
        first.send("capped", msg(n, durable=True))
    await first.prepare("xid-first")
    queue = queue_manager.queue("capped")
    assert (queue.size, queue.reserved) == (0, 6)
    for n in range(4):
        second.send("capped", msg(10 + n))
    with pytest.raises(QueueFull, match="queue capped is full \\(10 messages\\)") as full:
        second.send("capped", msg(14))
    assert full.value.queue == "capped"
    called = []
    queue_manager.when_room("capped", lambda: called.append("room"))
    await first.rollback()
    assert (queue.size, queue.reserved, called) == (0, 0, ["room"])
    second.send("capped", msg(14))
    await second.commit()
    assert (queue.size, queue.reserved) == (5, 0)


async def test_a_lost_session_rolls_back_without_waiting(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("in", msg(0))
    consumer = queue_manager.queue("in").consumer()
    consumer.flow(2)
    transaction = queue_manager.transaction()
    transaction.acknowledge(consumer, consumer.receive_nowait())
    transaction.rollback_nowait()
    assert consumer.receive_nowait().redelivered and transaction.state == "rolled-back"
    with pytest.raises(TransactionError, match="transaction is rolled-back, not active"):
        transaction.rollback_nowait()


async def test_prepared_transactions_survive_a_restart(broker):
    queue_manager = broker.queue_manager
    for n in range(2):
        await queue_manager.send("in", msg(n, durable=True))
    consumer = queue_manager.queue("in").consumer()
    consumer.flow(2)
    first, second = take(consumer, 2)
    commit_me, roll_me_back = queue_manager.transaction(), queue_manager.transaction()
    commit_me.acknowledge(consumer, first)
    commit_me.send("out", msg(10, durable=True))
    roll_me_back.acknowledge(consumer, second)
    roll_me_back.send("out", msg(11, durable=True))
    await commit_me.prepare("xid-commit")
    await roll_me_back.prepare("xid-rollback")
    with pytest.raises(TransactionError, match="a transaction 'xid-commit' is prepared already"):
        await queue_manager.transaction().prepare("xid-commit")
    prepared_at = commit_me.prepared_at
    assert time.time() - 5 < prepared_at <= time.time()
    await broker.restart()
    queue_manager = broker.queue_manager
    assert sorted(queue_manager.prepared_transactions()) == ["xid-commit", "xid-rollback"]
    assert queue_manager.queue("out").size == 0 and queue_manager.queue("in").available == 0  # sends hidden, acks held
    recovered = queue_manager.prepared_transactions()["xid-commit"]
    assert recovered.prepared_at == pytest.approx(prepared_at, abs=0.001)  # kept in the prepare record
    assert recovered.sends == {"out": 1} and recovered.acknowledgements == {"in": 1}
    async with trio.open_nursery() as nursery:  # a second resolution while the first waits for the store
        nursery.start_soon(functools.partial(queue_manager.resolve_prepared, "xid-commit", commit=True))
        with trio.fail_after(5):
            while recovered.state == "prepared":  # until the commit has begun (it waits for the store then)
                await trio.sleep(0)
        assert recovered.state == "committing"
        with pytest.raises(TransactionError, match="transaction is committing, not active or prepared"):
            await queue_manager.resolve_prepared("xid-commit", commit=False)
    await queue_manager.resolve_prepared("xid-rollback", commit=False)
    with pytest.raises(TransactionError, match="no prepared transaction 'xid-commit'"):
        await queue_manager.resolve_prepared("xid-commit", commit=True)
    assert bodies(queue_manager.queue("out").browse()) == ["m10"]
    assert bodies(queue_manager.queue("in").browse()) == ["m1"]
    await broker.restart()
    queue_manager = broker.queue_manager
    assert queue_manager.prepared_transactions() == {}
    assert bodies(queue_manager.queue("out").browse()) == ["m10"] and bodies(queue_manager.queue("in").browse()) == [
        "m1"
    ]


async def test_a_transient_transaction_is_prepared_in_memory_only_when_asked(broker):
    """``transient_in_memory`` (routing): nothing persistent → prepared at once, no store
    record (a restart forgets it, as it forgets its non-persistent messages); commit and
    rollback work as for a logged one. Anything persistent in it → logged as ever."""
    queue_manager = broker.queue_manager
    for n in range(3):
        await queue_manager.send("in", msg(n))
    consumer = queue_manager.queue("in").consumer()
    consumer.flow(3)
    entries = take(consumer, 3)
    done: list[BaseException | None] = []
    transactions = []
    for n, entry in enumerate(entries):
        transaction = queue_manager.transaction()
        transaction.acknowledge(consumer, entry)
        transaction.send("out", msg(10 + n, durable=n == 2))
        transaction.prepare_nowait(f"xid-{n}", done.append, transient_in_memory=True)
        transactions.append(transaction)
    assert done == [None, None] and [t.state for t in transactions] == ["prepared", "prepared", "preparing"]
    await wait_until(lambda: len(done) == 3)
    assert done == [None] * 3 and sorted(queue_manager.prepared_transactions()) == ["xid-0", "xid-1", "xid-2"]
    await queue_manager.resolve_prepared("xid-0", commit=True)
    await queue_manager.resolve_prepared("xid-1", commit=False)
    assert bodies(queue_manager.queue("out").browse()) == ["m10"]
    assert bodies(queue_manager.queue("in").browse()) == ["m1"]  # given back to the queue
    await broker.restart()
    assert sorted(broker.queue_manager.prepared_transactions()) == ["xid-2"]  # only the logged one


async def test_temporary_queues_go_with_their_owner(broker):
    queue_manager = broker.queue_manager
    owner = object()
    temporary = queue_manager.create_temporary_queue(owner)
    assert temporary.name.startswith("tmp$") and temporary.settings.persistence_mode == "non_persistent"
    await queue_manager.send(temporary.name, msg(1))
    consumer = temporary.consumer()
    queue_manager.delete_temporary_queues(owner)
    assert temporary.name not in queue_manager.queues and consumer.closed
    with pytest.raises(QueueError, match="has been deleted"):
        temporary.consumer()


async def test_bad_input_is_refused_clearly(make_broker):
    running = make_broker(
        manager='auto-create-queues="false" max-message-size="1000"', queues='<queue name="small" max-messages="2"/>'
    )
    await running.start()
    queue_manager = running.queue_manager
    with pytest.raises(QueueNotFound, match="queue 'nope' does not exist on router r1"):
        await queue_manager.send("nope", msg(1))
    with pytest.raises(MessageTooLarge, match="message of 2\\d\\d\\d bytes exceeds max-message-size 1000"):
        await queue_manager.send("small", build(b"x" * 2000))
    await queue_manager.send("small", msg(1))
    await queue_manager.send("small", msg(2))
    with pytest.raises(QueueFull, match="queue small is full \\(2 messages\\)"):
        await queue_manager.send("small", msg(3))
    from martinet.messaging.message import Message

    with pytest.raises(QueueError, match="malformed message for queue unroutable"):
        await queue_manager.send("unroutable", Message(b"\x00\x53\x70\xc0\x09"))
    with pytest.raises(QueueError, match="routerdlq is predefined"):
        queue_manager.delete_queue("routerdlq")
    assert queue_manager.queue("small").size == 2  # nothing lost
    await running.stop()


async def test_flow_control_asks_producers_to_slow_down(make_broker):
    running = make_broker(queues='<queue name="slow" flowcontrol-start-queuesize="5" max-flowcontrol-delay="300"/>')
    await running.start()
    queue_manager = running.queue_manager
    queue_manager.queue("slow").consumer().flow(1)  # a receiver that takes one and stops
    delays = [(await queue_manager.send("slow", msg(n))).delay_ms for n in range(20)]
    assert delays[:6] == [0] * 6
    assert 0 < delays[-1] <= 300 and delays == sorted(delays)
    await running.stop()


async def test_flow_control_slows_producers_of_a_queue_nobody_reads(make_broker):
    """Unlike SwiftMQ, a queue without consumers above its
    flowcontrol-start-queuesize slows its producers as well (its delay grows per send, as
    without receives), and a listener may wait for its backlog to clear; a consumer that
    brings it back to the start size ends the wait."""
    running = make_broker(queues='<queue name="unread" flowcontrol-start-queuesize="5" max-flowcontrol-delay="300"/>')
    await running.start()
    queue_manager = running.queue_manager
    delays = [(await queue_manager.send("unread", msg(n))).delay_ms for n in range(40)]
    assert delays[:6] == [0] * 6  # up to the start size: not slowed
    assert all(delay > 0 for delay in delays[6:]) and delays[-1] == 300 and delays == sorted(delays)
    calls = []
    assert queue_manager.when_backlog_cleared("unread", lambda: calls.append("cleared")) is not None
    consumer = queue_manager.queue("unread").consumer()
    consumer.flow(40)
    for entry in take(consumer, 40):
        consumer.accept(entry)
    assert calls == ["cleared"]
    assert (await queue_manager.send("unread", msg(99))).delay_ms == 0  # back below the start size
    await running.stop()


async def test_queues_have_a_finite_memory_budget_by_default(make_broker):
    """Every queue, defined or from a default controller, is capped (100,000
    messages, 256 MiB); a send past max-messages or max-bytes is refused with QueueFull and
    nothing of it is kept; what leaves the queue (consumed, dead-lettered, rolled back) gives
    its bytes back."""
    running = make_broker(queues='<queue name="small" max-bytes="300" max-messages="-1"/>')
    await running.start()
    queue_manager = running.queue_manager
    for name in ("plain", "tmp$1", "sys$x", "rt$paris", "unroutable", "client$durable", "routerdlq"):
        settings = queue_manager.settings_for(name)
        assert (settings.max_messages, settings.max_bytes) == (100_000, 256 * 1024 * 1024), name
    small = queue_manager.queue("small")
    sizes = []
    while True:
        message = msg(len(sizes))
        try:
            await queue_manager.send("small", message)
        except QueueFull as exc:
            assert str(exc) == "queue small is full (300 bytes)"
            break
        sizes.append(len(message.raw))
    assert sum(sizes) <= 300 < sum(sizes) + len(msg(len(sizes)).raw)
    assert small.size == len(sizes) and small.bytes == sum(sizes)
    assert running.router.management.get("/sys$queuemanager/usage/queues/small", "bytes") == sum(sizes)
    transaction = queue_manager.transaction()
    with pytest.raises(QueueFull, match=r"\(300 bytes\)"):
        transaction.send("small", msg(100))
    consumer = small.consumer()
    consumer.flow(2)
    first, second = take(consumer, 2)
    consumer.accept(first)  # consumed
    consumer.reject(second)  # dead-lettered
    assert small.bytes == sum(sizes[2:])
    assert len(msg(8).raw) == sizes[0] and len(msg(9).raw) == sizes[1]
    transaction.send("small", msg(8))  # room again, for exactly what left
    transaction.send("small", msg(9))
    with pytest.raises(QueueFull):
        transaction.send("small", build(b"x" * 200))  # the staged sends count
    await transaction.commit()
    assert small.bytes == sum(sizes)
    consumer.close()
    rest = small.consumer()
    rest.flow(100)
    for entry in take(rest, small.size):
        rest.accept(entry)
    assert (small.size, small.bytes) == (0, 0)
    await running.stop()


async def test_a_slowed_queue_calls_back_when_consumers_bring_it_back(make_broker):
    running = make_broker(queues='<queue name="slow" flowcontrol-start-queuesize="2"/>')
    await running.start()
    queue_manager = running.queue_manager
    calls = []
    await queue_manager.send("slow", msg(0))
    assert queue_manager.when_backlog_cleared("slow", lambda: calls.append("early")) is None  # at most 2: not slowed
    consumer = queue_manager.queue("slow").consumer()
    assert queue_manager.when_backlog_cleared("slow", lambda: calls.append("small")) is None  # at most 2: not slowed
    for n in range(1, 5):
        await queue_manager.send("slow", msg(n))
    cancel = queue_manager.when_backlog_cleared("slow@r1", lambda: calls.append("cancelled"))
    cancel()
    queue_manager.when_backlog_cleared("slow", lambda: calls.append("cleared"))
    consumer.flow(5)
    entries = [consumer.receive_nowait() for _ in range(5)]
    for entry, size_after in zip(entries, (4, 3, 2, 1, 0), strict=True):
        consumer.accept(entry)
        assert calls == ([] if size_after > 2 else ["cleared"])  # once, when the size came back to 2
    await running.stop()


async def test_a_transactional_consumer_calls_back_too(make_broker):
    """The routing dispatcher consumes in transactions: what they hold leaves the backlog
    (a link's window across a long round trip), and lets producers waiting on it go."""
    running = make_broker(queues='<queue name="slow" flowcontrol-start-queuesize="2"/>')
    await running.start()
    queue_manager = running.queue_manager
    consumer = queue_manager.queue("slow").consumer()
    for n in range(5):
        await queue_manager.send("slow", msg(n))
    calls = []
    assert queue_manager.when_backlog_cleared("slow", lambda: calls.append("cleared")) is not None
    consumer.flow(5)
    transaction = queue_manager.transaction()
    for entry, calls_after in zip([consumer.receive_nowait() for _ in range(3)], ([], [], ["cleared"]), strict=True):
        transaction.acknowledge(consumer, entry)
        assert calls == calls_after  # held in the transaction: out of the backlog (2 left)
    await transaction.commit()
    assert calls == ["cleared"]
    await running.stop()


async def test_queues_in_the_management_tree(broker):
    tree = broker.router.management
    tree.add("/sys$queuemanager/queues", "managed", {"max-messages": "1"})
    queue_manager = broker.queue_manager
    await queue_manager.send("managed", msg(1))
    with pytest.raises(QueueFull):
        await queue_manager.send("managed", msg(2))
    tree.set("/sys$queuemanager/queues/managed", "max-messages", "5")  # applies at once
    await queue_manager.send("managed", msg(2))
    queue_manager.queue("managed").consumer()
    with pytest.raises(Exception, match="queue managed has 1 consumer"):
        tree.remove("/sys$queuemanager/queues", "managed")
    assert tree.get("/sys$queuemanager/usage/queues/managed", "messages") == 2
    assert tree.get("/sys$queuemanager/usage", "queues") == 3  # with the predefined unroutable and routerdlq


async def test_controllers_give_settings_to_unlisted_queues(make_broker):
    running = make_broker(manager="", queues="")
    await running.start()
    queue_manager = running.queue_manager
    assert queue_manager.create_temporary_queue(object()).settings.persistence_mode == "non_persistent"
    assert queue_manager.queue("plain").settings.consumer_mode == "shared"
    assert queue_manager.settings_for("routerdlq").name == "06"
    assert queue_manager.settings_for("rt$paris").cache_size == 5000  # a transit queue: read back costs most
    running.router.management.add(
        "/sys$queuemanager/queue-controllers", "00", {"predicate": "audit%", "max-messages": "7"}
    )
    assert queue_manager.queue("audit-log").settings.max_messages == 7
    await running.stop()


async def test_dead_letter_annotations_keep_the_message(broker):
    queue_manager = broker.queue_manager
    original = build(b"payload", durable=True, message_id="keep-me", annotations={Symbol("x-opt-a"): 1})
    await queue_manager.send("x", original)
    consumer = queue_manager.queue("x").consumer()
    consumer.flow(1)
    consumer.reject(consumer.receive_nowait())
    [dead] = list(queue_manager.queue("routerdlq").browse())
    assert dead.message.message_id == "keep-me" and dead.message.body() == b"payload"
    assert dead.message.message_annotations["x-opt-a"] == 1 and dead.persistent


async def test_undeliverable_here_passes_the_consumer_over_for_that_entry_only(broker):
    """[3.4.5] modified with undeliverable-here: that consumer (with or without a selector)
    never gets the entry again, other entries still; another consumer gets it."""
    queue_manager = broker.queue_manager
    for n in range(2):
        await queue_manager.send("picky", msg(n))
    queue = queue_manager.queue("picky")
    first = queue.consumer(compile_selector("n >= 0"))
    first.flow(1)
    refused = first.receive_nowait()
    assert not refused.acquired
    first.modify(refused, delivery_failed=False, undeliverable_here=True)
    first.flow(2)
    assert bodies(take(first, 1)) == ["m1"]  # passed over m0, took the next
    with pytest.raises(trio.WouldBlock):
        first.receive_nowait()
    second = queue.consumer()
    second.flow(1)
    again = second.receive_nowait()
    assert (again.id, again.delivery_count, again.acquired) == (refused.id, 0, True)
    second.release(again)  # back again: still not for the first consumer
    assert queue.available == 1 and first.credit == 1 and not first.buffered


async def test_modified_annotations_are_spliced_into_the_entry_only(broker):
    queue_manager = broker.queue_manager
    await queue_manager.send("noted", msg(1, annotations={Symbol("x-opt-a"): 1}))
    consumer = queue_manager.queue("noted").consumer()
    consumer.flow(1)
    entry = consumer.receive_nowait()
    original = entry.message
    consumer.modify(entry, annotations={Symbol("x-opt-b"): "two"})
    consumer.flow(1)
    again = consumer.receive_nowait()
    assert again.message.message_annotations == {"x-opt-a": 1, "x-opt-b": "two"}
    assert again.message.raw.startswith(original.raw[: original.sections()[0x72][1]])  # the section before
    consumer.modify(again, annotations={Symbol("x-opt-c"): object()})  # no AMQP encoding: left out
    consumer.flow(1)
    assert consumer.receive_nowait().message.message_annotations == {"x-opt-a": 1, "x-opt-b": "two"}
