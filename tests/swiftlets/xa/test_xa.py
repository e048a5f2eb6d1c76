"""sys$xa on real stores and routers: the boot warning, the in-doubt list in usage, commit and
rollback through the management tree with their effect on real queues, claims, the xid
convention, and a real ``martinet run`` process restarted with a prepared transaction."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time

import pytest
import trio

from martinet.kernel import ManagementError, Veto
from martinet.messaging.message import build
from martinet.swiftlets.queuemanager.api import QueueManager, TransactionError
from martinet.swiftlets.xa.api import (
    CLIENT,
    ROUTING,
    RoutingXid,
    UnknownXid,
    XAError,
    XAResourceManager,
    owner_of,
    parse_routing_xid,
    routing_prefixes,
    routing_xid,
)

from tests.harness.polling import wait_until
from tests.harness.processes import free_port, router_xml

IN_DOUBT = "/sys$xa/usage/in-doubt"


def msg(n: int):
    return build(f"m{n}".encode(), message_id=f"id-{n}", durable=True)


def bodies(queue) -> list[str]:
    return [entry.message.body().decode() for entry in queue.browse()]


def parts(router) -> tuple[QueueManager, XAResourceManager]:
    queue_manager = router.swiftlet("sys$queuemanager")
    xa = router.swiftlet("sys$xa")
    assert isinstance(queue_manager, QueueManager) and isinstance(xa, XAResourceManager)
    return queue_manager, xa


async def prepare(
    queue_manager: QueueManager, xid: str, *, sends: dict[str, list[int]], ack_from: str | None = None, acks: int = 0
) -> None:
    """Prepare ``xid`` as routing will: sends to queues, acknowledgements of ``acks`` messages
    of ``ack_from`` (received by a consumer that is closed afterwards)."""
    transaction = queue_manager.transaction()
    for queue, numbers in sends.items():
        for n in numbers:
            transaction.send(queue, msg(n))
    if acks:
        consumer = queue_manager.queue(ack_from).consumer()
        consumer.flow(acks)
        for _ in range(acks):
            transaction.acknowledge(consumer, consumer.receive_nowait())
        consumer.close()
    await transaction.prepare(xid)


async def restart(network, router):
    name = router.name
    config = router.config
    await network.stop(name)
    return await network.start(config)


async def test_the_xid_convention():
    xid = routing_xid("paris", "tokyo", "1732350000000-17")
    assert xid == "routing:paris:tokyo:1732350000000-17"
    assert parse_routing_xid(xid) == RoutingXid("paris", "tokyo", "1732350000000-17")
    assert owner_of(xid) == ROUTING and owner_of("jms:abc") == CLIENT and owner_of("routing:x") == CLIENT
    assert parse_routing_xid("routing:a:b:c:d") == RoutingXid("a", "b", "c:d")
    assert routing_prefixes("paris", "tokyo") == ("routing:paris:tokyo:", "routing:tokyo:paris:")
    for bad in [("pa:ris", "tokyo", "1"), ("paris", "", "1"), ("paris", "tokyo", ""), ("paris", "tokyo", "a/b")]:
        with pytest.raises(ValueError):
            routing_xid(*bad)


async def test_restart_warns_lists_and_the_operator_commits_and_rolls_back(network, caplog):
    router = await network.start(network.config("r1"))
    queue_manager, xa = parts(router)
    assert router.management.get("/sys$xa/usage", "prepared") == 0
    for n in range(3):
        await queue_manager.send("in", msg(n))
    await prepare(queue_manager, "client-1", sends={"out": [10, 11], "audit": [12]}, ack_from="in", acks=1)
    await prepare(queue_manager, "client-2", sends={"out": [20]}, ack_from="in", acks=1)
    await prepare(queue_manager, routing_xid("paris", "r1", "1-1"), sends={"orders": [30, 31, 32]})
    await prepare(queue_manager, routing_xid("r1", "tokyo", "9-4"), sends={}, ack_from="in", acks=1)

    with caplog.at_level(logging.INFO):
        router = await restart(network, router)
    queue_manager, xa = parts(router)
    warnings = [r.getMessage() for r in caplog.records if r.name == "martinet.swiftlets.xa.manager"]
    assert warnings[-3:] == [
        "+++ WARNING! 4 prepared transactions found!",
        "+++          2 of them routing's (xids routing:…): recovered automatically when their peer router "
        "connects again.",
        "+++          Resolve the other 2: commit or rollback on /sys$xa/usage/in-doubt/<xid> in the management "
        "tree (a routing one only if its peer is not coming back).",
    ]
    tree = router.management
    assert sorted(tree.resolve(IN_DOUBT).children) == [
        "client-1",
        "client-2",
        "routing:paris:r1:1-1",
        "routing:r1:tokyo:9-4",
    ]
    entry = tree.resolve(f"{IN_DOUBT}/client-1").properties()
    prepared_at = time.strptime(entry.pop("prepared-at"), "%Y-%m-%dT%H:%M:%S")
    assert abs(time.mktime(prepared_at) - time.time()) < 30
    assert 0 <= entry.pop("age") < 30
    assert entry == {
        "xid": "client-1",
        "state": "prepared",
        "owner": "client",
        "peer": "",
        "queues": "audit, in, out",
        "messages": 3,
        "acknowledgements": 1,
    }
    assert tree.get(f"{IN_DOUBT}/routing:paris:r1:1-1", "owner") == "routing"
    assert tree.get(f"{IN_DOUBT}/routing:paris:r1:1-1", "peer") == "paris"
    assert tree.get(f"{IN_DOUBT}/routing:r1:tokyo:9-4", "peer") == "tokyo"
    assert tree.resolve("/sys$xa/usage").properties() == {
        "prepared": 4,
        "in-doubt": 4,
        "in-doubt-routing": 2,
        "claims": 0,
        "committed": 0,
        "rolled-back": 0,
    }
    assert sorted(tree.operations(f"{IN_DOUBT}/client-1")) == ["commit", "rollback"]
    # what is prepared is invisible, what is acknowledged is held
    assert bodies(queue_manager.queue("out")) == [] and bodies(queue_manager.queue("in")) == []

    with caplog.at_level(logging.WARNING):
        await tree.invoke(f"{IN_DOUBT}/client-1", "commit")
    assert "in-doubt transaction client-1 committed by the operator" in caplog.text
    assert bodies(queue_manager.queue("out")) == ["m10", "m11"] and bodies(queue_manager.queue("audit")) == ["m12"]
    assert "client-1" not in tree.resolve(IN_DOUBT).children
    await tree.invoke(f"{IN_DOUBT}/client-2", "rollback")
    assert bodies(queue_manager.queue("out")) == ["m10", "m11"]  # m20 discarded
    assert "client-2" not in tree.resolve(IN_DOUBT).children
    # m0 was committed as acknowledged (gone); m1 came back with the rollback; m2 stays held (routing's)
    consumer = queue_manager.queue("in").consumer()
    consumer.flow(10)
    again = consumer.receive_nowait()
    assert again.message.body() == b"m1" and again.redelivered
    with pytest.raises(trio.WouldBlock):
        consumer.receive_nowait()
    consumer.close()

    with pytest.raises(ManagementError, match=re.escape(f"no 'client-1' under {IN_DOUBT}; there is: routing:paris")):
        await tree.invoke(f"{IN_DOUBT}/client-1", "commit")
    with pytest.raises(ManagementError, match="no operation 'forget'; operations: commit, rollback"):
        await tree.invoke(f"{IN_DOUBT}/routing:paris:r1:1-1", "forget")
    assert tree.get("/sys$xa/usage", "committed") == 1 and tree.get("/sys$xa/usage", "rolled-back") == 1

    # the resolutions are durable; the rest is still in doubt after another restart
    router = await restart(network, router)
    queue_manager, xa = parts(router)
    assert bodies(queue_manager.queue("out")) == ["m10", "m11"] and bodies(queue_manager.queue("in")) == ["m1"]
    assert [p.xid for p in xa.in_doubt()] == ["routing:paris:r1:1-1", "routing:r1:tokyo:9-4"]
    await router.management.invoke(f"{IN_DOUBT}/routing:paris:r1:1-1", "commit")  # peer not coming back
    assert bodies(queue_manager.queue("orders")) == ["m30", "m31", "m32"]


async def test_claims_hide_an_owners_xids_and_refuse_the_operator(network):
    router = await network.start(network.config("r1"))
    queue_manager, xa = parts(router)
    tree = router.management
    await prepare(queue_manager, routing_xid("r1", "paris", "1-1"), sends={"q": [1]})
    await prepare(queue_manager, routing_xid("paris", "r1", "7-3"), sends={"q": [2]})
    await prepare(queue_manager, routing_xid("r1", "tokyo", "1-2"), sends={"q": [3]})
    await wait_until(lambda: len(tree.resolve(IN_DOUBT).children) == 3, what="prepared transactions listed")
    operator_path = f"{IN_DOUBT}/routing:r1:paris:1-1"
    entry = tree.resolve(operator_path)  # read by the operator before the link comes up

    claim = xa.claim("sys$routing", *routing_prefixes("r1", "paris"))
    assert sorted(tree.resolve(IN_DOUBT).children) == ["routing:r1:tokyo:1-2"]
    assert [p.xid for p in xa.in_doubt()] == ["routing:r1:tokyo:1-2"]
    assert {p.xid: p.claimed_by for p in xa.prepared("routing:r1:paris:")} == {"routing:r1:paris:1-1": "sys$routing"}
    assert tree.get("/sys$xa/usage", "claims") == 1 and tree.get("/sys$xa/usage", "in-doubt") == 1
    with pytest.raises(Veto, match="transaction 'routing:r1:paris:1-1' is being resolved by sys\\$routing"):
        await entry.operations["commit"].call()  # on a stale view of the list: refused, not resolved
    with pytest.raises(
        XAError,
        match="sys\\$other cannot claim the xids routing:paris:r1:7…: sys\\$routing claims routing:paris:r1:… already",
    ):
        xa.claim("sys$other", "routing:paris:r1:7")
    with pytest.raises(  # nor one whose prefix is shorter: it would cover sys$routing's xids too
        XAError, match="sys\\$other cannot claim the xids routing:…: sys\\$routing claims routing:r1:paris:… already"
    ):
        xa.claim("sys$other", "routing:")
    await xa.commit("routing:r1:paris:1-1")  # the owner resolves; claims do not stop it
    assert bodies(queue_manager.queue("q")) == ["m1"]
    claim.release()  # the link dropped: what is still prepared is in doubt again
    assert sorted(tree.resolve(IN_DOUBT).children) == ["routing:paris:r1:7-3", "routing:r1:tokyo:1-2"]
    with xa.claim("sys$routing", "routing:r1:tokyo:"):
        assert sorted(tree.resolve(IN_DOUBT).children) == ["routing:paris:r1:7-3"]
    assert len(tree.resolve(IN_DOUBT).children) == 2

    with pytest.raises(UnknownXid, match="no prepared transaction 'routing:r1:paris:1-1' on router r1"):
        await xa.rollback("routing:r1:paris:1-1")


async def test_the_list_follows_prepares_and_resolutions_made_through_the_queue_manager(network):
    router = await network.start(network.config("r1"))
    queue_manager, xa = parts(router)
    tree = router.management
    await prepare(queue_manager, "a/b%c", sends={"q": [1]})
    await wait_until(lambda: "a%2Fb%25c" in tree.resolve(IN_DOUBT).children, what="escaped xid listed")
    assert tree.get(f"{IN_DOUBT}/a%2Fb%25c", "xid") == "a/b%c"
    await queue_manager.resolve_prepared("a/b%c", commit=False)
    await wait_until(lambda: not tree.resolve(IN_DOUBT).children, what="resolved xid gone from the list")


async def test_a_second_resolution_while_the_first_waits_is_refused(network):
    router = await network.start(network.config("r1"))
    queue_manager, xa = parts(router)
    tree = router.management
    await prepare(queue_manager, "x1", sends={"q": [1]})
    xa.refresh()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tree.invoke, f"{IN_DOUBT}/x1", "commit")
        transaction = queue_manager.prepared_transactions()["x1"]
        with trio.fail_after(5):
            while transaction.state == "prepared":  # until the commit has begun (it waits for the store then)
                await trio.sleep(0)
        assert tree.get(f"{IN_DOUBT}/x1", "state") == "committing"
        with pytest.raises(
            ManagementError, match="operation 'rollback' refused: transaction 'x1' is committing already"
        ):
            await tree.invoke(f"{IN_DOUBT}/x1", "rollback")
    assert "x1" not in tree.resolve(IN_DOUBT).children
    assert bodies(queue_manager.queue("q")) == ["m1"]


PREPARE = """
import trio
from martinet.kernel import Router
from martinet.messaging.message import build

async def main():
    router = Router.from_file("router.xml")
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        queue_manager = router.swiftlet("sys$queuemanager")
        for xid in ("routing:paris:r1:5-1", "client-7"):
            transaction = queue_manager.transaction()
            transaction.send("out", build(xid.encode(), durable=True))
            await transaction.prepare(xid)
        router.request_stop()

trio.run(main)
"""

RESOLVE = """
import trio
from martinet.kernel import Router

async def main():
    router = Router.from_file("router.xml")
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        tree = router.management
        print(sorted(tree.resolve("/sys$xa/usage/in-doubt").children))
        await tree.invoke("/sys$xa/usage/in-doubt/client-7", "commit")
        await tree.invoke("/sys$xa/usage/in-doubt/routing:paris:r1:5-1", "rollback")
        queue = router.swiftlet("sys$queuemanager").queue("out")
        print([entry.message.body().decode() for entry in queue.browse()])
        router.request_stop()

trio.run(main)
"""


def run_script(script: str, cwd) -> str:
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_martinet_run_process_warns_after_a_restart_and_the_tree_resolves(router_processes):
    """A real ``martinet run`` router; prepared transactions are written (and later resolved
    through the management tree) by a router of the same config in another process while it
    is stopped, as remote management does not exist yet."""
    xml = router_xml("r1", amqp_port=free_port())
    assert "sys$xa" in xml  # the default stack has it
    process = router_processes.start(xml)
    assert "no prepared transactions found" in process.current()
    assert process.stop() == 0
    run_script(PREPARE, process.cwd)
    process.restart()
    log = process.current()
    assert "WARNING [r1] swiftlets.xa.manager: +++ WARNING! 2 prepared transactions found!" in log, log
    assert "+++          1 of them routing's" in log and "Resolve the other 1" in log
    assert process.stop() == 0
    assert run_script(RESOLVE, process.cwd).splitlines() == ["['client-7', 'routing:paris:r1:5-1']", "['client-7']"]
    process.restart()
    assert "no prepared transactions found" in process.current()
    assert process.stop() == 0


async def test_writes_queued_without_waiting_take_effect_in_the_order_queued(network):
    """prepare_nowait/commit_nowait (what a routing link pipelines): every write is queued
    at once; their callbacks come, and their messages become visible, in the order queued;
    a transaction prepared that way is committed later in its own turn."""
    router = await network.start(network.config("r1"))
    queue_manager, _ = parts(router)
    done: list[tuple[str, BaseException | None]] = []
    first = queue_manager.transaction()
    first.send("q", msg(0))
    await first.prepare("p-0")
    transactions = []
    for n in range(1, 6):
        transaction = queue_manager.transaction()
        transaction.send("q", msg(n))
        transactions.append(transaction)
    first.commit_nowait(lambda error: done.append(("p-0", error)))
    transactions[0].prepare_nowait("p-1", lambda error: done.append(("p-1", error)))
    assert transactions[0].state == "preparing" and first.state == "committing"
    with pytest.raises(TransactionError, match="prepared already"):
        queue_manager.transaction().prepare_nowait("p-1", done.append)
    for n, transaction in enumerate(transactions[1:], start=2):
        transaction.commit_nowait(lambda error, n=n: done.append((f"c-{n}", error)))
    assert bodies(queue_manager.queue("q")) == []  # nothing visible before it is durable
    with trio.fail_after(10):
        while len(done) < 6:
            await trio.sleep(0.01)
    assert done == [("p-0", None), ("p-1", None), ("c-2", None), ("c-3", None), ("c-4", None), ("c-5", None)]
    assert transactions[0].state == "prepared" and "p-1" in queue_manager.prepared_transactions()
    assert bodies(queue_manager.queue("q")) == ["m0", "m2", "m3", "m4", "m5"]
    await queue_manager.resolve_prepared("p-1", commit=True)
    assert bodies(queue_manager.queue("q")) == ["m0", "m2", "m3", "m4", "m5", "m1"]
