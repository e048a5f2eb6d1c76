"""The XA recovery table (docs/routing-protocol.md §7.2), each case forced at a chosen frame.

Router ``a`` dials ``b`` through a fault proxy that follows the routing frames and holds
the first frame of a chosen type (:meth:`faultproxy.FaultProxy.hold`); ``a`` sends to
``recovered@b``. Where the frame is held fixes who holds the transaction prepared:

- PREPARE_REPLY held (b → a): ``b`` has prepared durably (it answers only then), ``a`` has
  prepared before sending the TRANSACTION and not yet committed → **both prepared**: the
  recovery commits on both sides.
- TRANSACTION held (a → b): ``a`` has prepared, ``b`` never saw it → **only the sender
  (requester) prepared**: ``a`` rolls back and the messages go again.
- COMMIT held (a → b): ``a`` has committed durably (it sends COMMIT only then), ``b`` is
  still prepared → **only the peer prepared**: ``a`` holds nothing, ``b`` lists the xid, ``a``
  tells it to commit.
- COMMIT_REPLY held (b → a): ``b`` answers once its commit is queued, not once durable
  (routing-protocol §8.1), so killed then it may still hold the xid prepared (the case
  above: committed in recovery) or have committed it; either way exactly once.

Either router is then killed (SIGKILL, processes) or the link stays refused (in one
process, for the operator's resolution through ``sys$xa``).
"""

from __future__ import annotations

import pytest
import trio

from martinet.messaging.client import Queue, TextMessage, connect
from martinet.swiftlets.routing.wire import FrameType
from martinet.swiftlets.xa.manager import entry_name

from tests.harness.faultproxy import FaultProxy
from tests.harness.netharness import Consumer, Producer, Topology, drain, open_network, verdict

PAIR = Topology(("a", "b"), (("a", "b"),), sources=("a",), destination="b", queue="recovered")
CASES = {  # case: (frame held, its direction, what a logs, what b logs, about the held xid)
    "both prepared": (
        FrameType.PREPARE_REPLY,
        "to_client",
        "to b committed in recovery",
        "from a committed in recovery",
    ),
    "only the sender prepared": (FrameType.TRANSACTION, "to_target", "to b rolled back (its messages go again)", None),
    "only the receiver prepared": (FrameType.COMMIT, "to_target", None, "from a committed in recovery"),
    "receiver answered its commit": (FrameType.COMMIT_REPLY, "to_client", None, ...),  # ...: either
}


async def killed_at_the_held_frame(network, direction: str, code: FrameType, victim: str, count: int = 60):
    """60 numbered messages from a to recovered@b; the first ``code`` frame going
    ``direction`` is held, ``victim`` is SIGKILLed there and restarted (the held frame gone
    with the connection); a consumer on b drains. The verdict and the held frame."""
    held = network.proxies[("a", "b")].hold(direction, code)
    producer = Producer("p", network.url("a"), "recovered@b", count=count)
    consumer = Consumer(network.url("b"), "recovered")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer.run, trio.Event())
        with trio.fail_after(30):
            await held.seen.wait()
        await network.kill(victim)
        network.proxies[("a", "b")].cut()
        await network.restart(victim)
        stop = trio.Event()
        nursery.start_soon(consumer.run, stop)
        with trio.fail_after(60):
            while len(producer.sent) + len(producer.in_doubt) < count:
                await trio.sleep(0.1)
        await drain([producer], [consumer], timeout=60)
        stop.set()
    return verdict([producer], [consumer]), held


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["a", "b"])
@pytest.mark.parametrize("case", list(CASES))
async def test_each_case_of_the_recovery_table_after_a_sigkill_at_the_chosen_frame(tmp_path, case, victim):
    code, direction, sender_line, receiver_line = CASES[case]
    async with open_network(tmp_path, PAIR) as network:
        results, held = await killed_at_the_held_frame(network, direction, code, victim)
        xid = held.fields["xid"]
        assert (results.lost, results.duplicated) == (0, 0), results.table()
        assert results.received == results.sent + results.producer_in_doubt_arrived, results.table()
        for name, line in (("a", sender_line), ("b", receiver_line)):
            text = network.routers[name].text()
            if line is ...:
                continue
            if line is not None:
                assert f"routing transaction {xid} {line}" in text, network.logs()
            else:
                assert f"routing transaction {xid} " not in text, network.logs()
        for name in ("a", "b"):  # nothing is left prepared: an orderly restart finds none
            await network.stop(name)
            await network.restart(name)
            assert "no prepared transactions found" in network.routers[name].current(), network.logs()


@pytest.mark.slow
async def test_non_xa_what_rt_held_at_a_sigkill_goes_again_in_doubt(tmp_path):
    """Non-XA: b committed a batch and its NONXA_COMMIT is held, so a is killed (-9) before it
    hears: the batch is back in a's rt$b at the restart, its delivery never counted (the
    rollback never happened). The restarted a sends everything its rt$b recovered marked in
    doubt, as the peer may have it: b's queue drops the copies it had, nothing is doubled or
    lost."""
    async with open_network(tmp_path, PAIR, xa=False) as network:
        results, _ = await killed_at_the_held_frame(network, "to_client", FrameType.NONXA_COMMIT, "a")
        assert (results.lost, results.duplicated) == (0, 0), results.table()


async def bodies(url: str, queue: str) -> list[str]:
    """Everything in ``queue`` now (received and acknowledged)."""
    got = []
    async with connect(url) as connection, connection.session() as session:
        async with session.consumer(Queue(queue)) as consumer:
            while (message := await consumer.receive(0.5)) is not None:
                got.append(message.text)
    return got


def available(router, queue: str) -> list[str]:
    """The bodies of the messages available in a queue of an in-process router."""
    return [entry.message.body() for entry in router.swiftlet("sys$queuemanager").queues[queue].browse()]


async def in_doubt(router, xid: str) -> dict:
    """The ``sys$xa`` in-doubt entry of ``xid`` (waits, bounded, until it is listed)."""
    path = f"/sys$xa/usage/in-doubt/{entry_name(xid)}"
    with trio.fail_after(10):
        while entry_name(xid) not in router.management.resolve("/sys$xa/usage/in-doubt").children:
            await trio.sleep(0.05)
    return router.management.resolve(path).properties()


@pytest.mark.parametrize("decision", ["commit", "rollback"])
async def test_the_operator_resolves_a_routing_xid_whose_peer_never_comes_back(network, nursery, decision):
    """Both sides hold a real routing xid prepared (PREPARE_REPLY held), the link is then
    refused for good: each side lists it in doubt with its queue and message, and the
    operator's decision (the same on both sides) is what happens: commit → the message is
    in ``orders`` at b and gone from ``rt$b`` at a; rollback → it is back in ``rt$b``, and
    once the link is back it is sent again and arrives once."""
    await network.start_routers("a", "b")
    proxy = FaultProxy("127.0.0.1", network.routing_port("b"))
    await nursery.start(proxy.run)
    network.connect("a", "b", port=str(proxy.port), **{"retry-time": "1000"})
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    held = proxy.hold("to_client", FrameType.PREPARE_REPLY)
    async with connect(network.url("a")) as connection, connection.session() as session:
        async with session.producer(Queue("orders@b")) as producer:
            await producer.send(TextMessage("m0"))
    with trio.fail_after(10):
        await held.seen.wait()
    xid = held.fields["xid"]
    proxy.refuse(True)
    proxy.cut()

    a, b = network.routers["a"], network.routers["b"]
    assert await in_doubt(a, xid) | {"age": 0, "prepared-at": ""} == {
        "xid": xid,
        "state": "prepared",
        "owner": "routing",
        "peer": "b",
        "queues": "rt$b",
        "messages": 0,
        "acknowledgements": 1,
        "age": 0,
        "prepared-at": "",
    }
    assert await in_doubt(b, xid) | {"age": 0, "prepared-at": ""} == {
        "xid": xid,
        "state": "prepared",
        "owner": "routing",
        "peer": "a",
        "queues": "orders",
        "messages": 1,
        "acknowledgements": 0,
        "age": 0,
        "prepared-at": "",
    }
    assert available(a, "rt$b") == [] and a.swiftlet("sys$queuemanager").queues["rt$b"].size == 1  # held

    for router in (a, b):
        await router.management.invoke(f"/sys$xa/usage/in-doubt/{entry_name(xid)}", decision)
        assert entry_name(xid) not in router.management.resolve("/sys$xa/usage/in-doubt").children
    if decision == "commit":
        assert a.swiftlet("sys$queuemanager").queues["rt$b"].size == 0
        assert await bodies(network.url("b"), "orders") == ["m0"]
    else:
        assert available(a, "rt$b") == ["m0"]
        assert await bodies(network.url("b"), "orders") == []
    proxy.heal()  # the peer is back after all: recovery finds nothing prepared on either side
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    expected = [] if decision == "commit" else ["m0"]
    with trio.fail_after(20):
        while b.swiftlet("sys$queuemanager").queue("orders").size < len(expected):
            await trio.sleep(0.05)
    assert await bodies(network.url("b"), "orders") == expected
    assert a.swiftlet("sys$queuemanager").queues["rt$b"].size == 0
    assert not a.swiftlet("sys$queuemanager").prepared_transactions()
    assert not b.swiftlet("sys$queuemanager").prepared_transactions()
