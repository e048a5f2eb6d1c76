"""The network harness (tests/harness/netharness.py) in CI: real ``martinet run`` processes, faults
on a seeded schedule, counted traffic. The long version is ``bench/network_chaos.py``."""

from __future__ import annotations

import pytest
import trio

from martinet.messaging.client import Queue, TextMessage, connect

from tests.harness.netharness import TOPOLOGIES, Consumer, Producer, Schedule, chaos, drain, open_network, verdict

pytestmark = pytest.mark.slow


def show(results, title: str) -> None:
    print(results.table(title))


async def test_xa_triangle_under_every_kind_of_fault_loses_and_duplicates_nothing(tmp_path):
    schedule = Schedule(rounds=5, faults=("kill", "kill-store", "cut", "blackhole", "delay"), seed=3)
    async with open_network(tmp_path, TOPOLOGIES["triangle"]) as network:
        results = await chaos(network, schedule, print)
    show(results, "XA triangle")
    assert results.sent > 0 and results.faults and sum(results.faults.values()) == 5
    assert (results.lost, results.duplicated) == (0, 0), results.table()


async def test_topics_durable_subscribers_on_every_router_lose_and_duplicate_nothing_under_kills(tmp_path):
    """Topic mode: publishers on a and b, a durable and a non-durable subscriber on each
    router; a link cut, b's store engine killed, a (a publisher's router) and c (a
    subscriber's only) SIGKILLed while they publish. Every durable subscriber gets every
    accepted publication exactly once; the non-durable ones lose what came while they
    were away (reported), never get one twice."""
    schedule = Schedule(rounds=4, faults=("kill", "kill-store", "cut"), seed=6, mode="topics")
    async with open_network(tmp_path, TOPOLOGIES["triangle"]) as network:
        results = await chaos(network, schedule, print)
    show(results, "topics, XA triangle")
    assert results.faults == {"cut": 1, "kill-store": 1, "kill": 2}, results.table()
    assert results.sent > 0 and (results.lost, results.duplicated) == (0, 0), results.table()
    assert {name for name, durable, _ in results.subscribers if durable} == {"a durable", "b durable", "c durable"}
    for _, durable, r in results.subscribers:
        assert r.duplicated == 0 and (r.lost == 0 or not durable) and r.received > 0, results.table()


async def test_routers_whose_store_engine_dies_mid_transfer_stop_themselves_and_lose_nothing(tmp_path):
    """Regression: when its store died, b's link to c closed (a commit failed), and b's
    dispatcher for rt$c turned to the route via a: every prepare there failed at once, and
    the dispatcher took the same messages again without a checkpoint, so the router spun,
    logging ~100 MB a second, and never stopped. It needs a prepare in flight at the kill:
    b, the intermediate router with its own producers, has its store engine killed 4 times."""
    schedule = Schedule(rounds=4, faults=("kill-store",), spare=("a", "c"))
    async with open_network(tmp_path, TOPOLOGIES["triangle"]) as network:
        results = await chaos(network, schedule, print)
    show(results, "store engines killed mid-transfer")
    assert results.faults == {"kill-store": 4}
    assert (results.lost, results.duplicated) == (0, 0), results.table()


async def test_xa_chain_survives_kills_of_the_intermediate_and_the_destination_router(tmp_path):
    schedule = Schedule(rounds=4, faults=("kill", "kill-store", "cut"), spare=("a",), seed=2)
    async with open_network(tmp_path, TOPOLOGIES["chain"]) as network:
        results = await chaos(network, schedule, print)
    show(results, "XA chain")
    assert results.sent > 0 and sum(results.faults.values()) == 4
    assert (results.lost, results.duplicated) == (0, 0), results.table()


async def test_non_xa_triangle_loses_nothing_and_reports_its_duplicates(tmp_path):
    """Non-XA promises at least once: duplicates are dropped only while the target queue's
    duplicate backlog remembers them, so a duplicate is reported here, not failed on.

    Regression (seed 4 lost 1–2 messages in every run): c was killed while a's batch to it
    was in flight; a sent it again, in doubt, via b; b, without a link to c, sent it back via
    a, whose rt$c remembered the id from the producer's send and dropped it as a duplicate.
    Only the target queue checks duplicates now."""
    schedule = Schedule(rounds=4, faults=("kill", "cut", "blackhole"), seed=4)
    async with open_network(tmp_path, TOPOLOGIES["triangle"], xa=False) as network:
        assert "xa False" in network.routers["a"].current()
        results = await chaos(network, schedule, print)
    show(results, "non-XA triangle")
    assert results.sent > 0 and results.lost == 0, results.table()


async def test_non_xa_chain_drops_the_resends_of_a_killed_intermediate_router(tmp_path):
    """Regression: b, killed after c had committed a batch from rt$c but before b's own
    commit, sent those messages again after its restart without the doubt flag (a
    recovered message had no redelivery mark), so c's duplicate detection let them in.
    Recovered messages in rt$ queues now go marked in doubt."""
    schedule = Schedule(rounds=4, faults=("kill",), spare=("a", "c"), seed=5)
    async with open_network(tmp_path, TOPOLOGIES["chain"], xa=False) as network:
        results = await chaos(network, schedule, print)
    show(results, "non-XA chain, b killed")
    assert results.faults == {"kill": 4}
    assert (results.lost, results.duplicated) == (0, 0), results.table()


async def test_store_and_forward_the_destination_is_down_while_the_source_sends(tmp_path):
    """c is stopped; a's producer sends 300 messages to chaos@c (they wait in rt$c on the way);
    c comes back and every message arrives once, in order (the path never changed)."""
    async with open_network(tmp_path, TOPOLOGIES["chain"]) as network:
        await network.stop("c")
        producer = Producer("p", network.url("a"), "chaos@c", count=300)
        with trio.fail_after(60):
            await producer.run(trio.Event())
        await network.restart("c")
        consumer = Consumer(network.url("c"), "chaos")
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer.run, stop)
            await drain([producer], [consumer], timeout=60)
            stop.set()
    results = verdict([producer], [consumer])
    show(results, "store and forward")
    assert (results.sent, results.received, results.lost, results.duplicated) == (300, 300, 0, 0), results.table()
    assert results.out_of_order == 0 and results.producer_in_doubt == 0, results.table()


async def test_the_harness_settles_a_batch_in_doubt_at_the_consumer_by_its_receipt(network):
    """The verdict counts a message received only once its batch is known committed: a batch
    whose commit did not come back is settled by its receipt, which its transaction sent to
    the consumer's receipts queue (here: batch 1 has one, batch 2 has none). Batch 1's
    messages are received (a copy of one that comes again is a duplicate); batch 2's are due
    again, and lost if they never come."""
    await network.start(network.config("c"))
    producer = Producer("p", network.url("c"), "chaos", count=4)
    await producer.run(trio.Event())
    consumer = Consumer(network.url("c"), "chaos")
    async with connect(network.url("c")) as connection, connection.session() as session:
        async with session.producer(Queue(consumer.receipts)) as receipts:
            await receipts.send(TextMessage("1"))  # batch 1 was committed, its answer lost
    consumer._doubtful = {1: [("p", 1), ("p", 2)], 2: [("p", 3), ("p", 4)]}
    consumer.in_doubt = {("p", 1), ("p", 2), ("p", 3), ("p", 4)}
    assert all(consumer.has(("p", seq)) for seq in (1, 2, 3, 4))  # the drain waits for none of them yet
    assert await consumer.settle_doubt() and not await consumer.settle_doubt()
    assert consumer.has(("p", 1)) and consumer.has(("p", 2)) and not consumer.has(("p", 3))
    consumer._committed([("p", 2)])  # batch 1's message came again: a duplicate of the network's
    results = verdict([producer], [consumer])
    assert (results.received, results.lost, results.duplicated, results.consumer_in_doubt) == (2, 2, 1, 2)
    assert results.examples["lost"] == [("p", 3), ("p", 4)], results.table()
