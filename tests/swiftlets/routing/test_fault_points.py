"""Each state of the routing recovery tables, reached on purpose: the fault proxy holds the
nth frame of a kind on the wire (tests/harness/faultproxy.py), so a link is cut with one chosen
transaction in exactly that state and those before it answered; the exact outcome is
checked: every message once and in order, the held transaction committed or rolled back as
the table says (XA), exactly the copies the receiver already had dropped by doubt (non-XA).

Routers a and b in one process; a dials b through the proxy (a sends: to_target carries
a's TRANSACTION / COMMIT / NONXA_TRANSACTION, to_client b's answers)."""

from __future__ import annotations

import logging

import pytest
import trio

from martinet.swiftlets.routing.api import routing_queue
from martinet.swiftlets.routing.wire import FrameType

from tests.harness.faultproxy import FaultProxy, Held
from tests.harness.network import ROUTING_STACK, routing_config
from tests.swiftlets.routing.test_transfer_network import consume, produce, verify

COUNT = 300  # 15 transactions of 20: the held one has answered ones before it and open ones after it


async def linked(network, nursery, *, xa: bool, rule: tuple[str, FrameType, int]) -> tuple[FaultProxy, Held]:
    """Routers a and b, a's connector to b through a proxy that arms ``rule`` (direction,
    frame type, nth) before the link's first frame; a has a static route to b, so that
    messages wait in rt$b while the link is down."""
    for name in ("a", "b"):
        config = routing_config(listener={"use_xa": xa})
        await network.start(network.config(name, startorder=ROUTING_STACK, swiftlets={"sys$routing": config}))
    proxy = FaultProxy("127.0.0.1", network.routing_port("b"))
    await nursery.start(proxy.run)
    direction, frame, nth = rule
    held = proxy.hold(direction, frame.value, nth)
    network.routers["a"].management.add("/sys$routing/static-routes", "b")
    network.routers["a"].management.add(
        "/sys$routing/connectors",
        "b",
        {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000", "use-xa": str(xa).lower()},
    )
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    return proxy, held


def bodies(network, router: str, queue: str) -> set[str]:
    manager = network.routers[router].swiftlet("sys$queuemanager")
    return {entry.message.body() for entry in manager.queue(queue).browse()}


async def cut(network, proxy: FaultProxy) -> None:
    """End the link where it stands and keep it down until :func:`heal`."""
    proxy.refuse(True)
    proxy.cut()
    with trio.fail_after(20):
        while network.routers["a"].management.resolve("/sys$routing/usage/connections").children:
            await trio.sleep(0.01)


def prepared_with(network, router: str, xid: str) -> bool:
    return xid in network.routers[router].swiftlet("sys$queuemanager").prepared_transactions()


XA_CASES = {
    # the receiver prepared it, the sender never heard: row "prepared / listed", committed
    # on both sides in recovery
    "prepare-reply": (("to_client", FrameType.PREPARE_REPLY, 3), ["to b committed"], ["from a committed"]),
    # the receiver never had it: row "prepared / not listed", rolled back and sent again
    "transaction": (("to_target", FrameType.TRANSACTION, 3), ["to b rolled back (its messages go again)"], []),
    # the sender committed, its COMMIT was lost: row "not held / listed", the receiver commits
    "commit": (("to_target", FrameType.COMMIT, 3), [], ["from a committed"]),
    # both committed, the answer was lost: nothing left to resolve
    "commit-reply": (("to_client", FrameType.COMMIT_REPLY, 3), [], []),
}


@pytest.mark.parametrize("case", list(XA_CASES))
async def test_xa_each_recovery_state_on_purpose(network, nursery, caplog, case):
    rule, sender, receiver = XA_CASES[case]
    proxy, held = await linked(network, nursery, xa=True, rule=rule)
    caplog.set_level(logging.INFO, logger="martinet.swiftlets.routing")
    async with trio.open_nursery() as producing:
        producing.start_soon(produce, network.url("a"), "orders@b", COUNT)
        with trio.fail_after(30):
            await held.seen.wait()
        xid = held.fields["xid"]
        if case == "commit":  # prepared at b only: a committed (its messages left rt$b) before the COMMIT
            with trio.fail_after(10):
                while prepared_with(network, "a", xid):
                    await trio.sleep(0.01)
            assert prepared_with(network, "b", xid)
        if case == "prepare-reply":  # prepared on both sides
            assert prepared_with(network, "a", xid) and prepared_with(network, "b", xid)
        if case == "transaction":  # prepared at a, never seen by b
            assert prepared_with(network, "a", xid) and not prepared_with(network, "b", xid)
        if case == "commit-reply":  # over at a; b commits what it received
            with trio.fail_after(10):
                while prepared_with(network, "b", xid) or prepared_with(network, "a", xid):
                    await trio.sleep(0.01)
        await cut(network, proxy)
        proxy.heal()
    verify(await consume(network.url("b"), "orders", COUNT), COUNT)
    recovered = [r.getMessage() for r in caplog.records if f"{xid} " in r.getMessage() and "recovery" in r.getMessage()]
    assert recovered == [f"routing transaction {xid} {what} in recovery" for what in sender + receiver]
    for name in ("a", "b"):
        assert not network.routers[name].swiftlet("sys$queuemanager").prepared_transactions()


NON_XA_CASES = {
    # b committed the batch, a never heard: a sends it again in doubt, b drops exactly those
    "commit": ("to_client", FrameType.NONXA_COMMIT, 3),
    # b never had it: sent again in doubt, nothing to drop
    "transaction": ("to_target", FrameType.NONXA_TRANSACTION, 3),
}


@pytest.mark.parametrize("case", list(NON_XA_CASES))
async def test_non_xa_each_doubt_state_on_purpose(network, nursery, case):
    proxy, held = await linked(network, nursery, xa=False, rule=NON_XA_CASES[case])
    await produce(network.url("a"), "orders@b", COUNT)  # the link stalls at the held frame; the rest waits in rt$b
    with trio.fail_after(30):
        await held.seen.wait()
    # what b has committed when the link is cut, and what a gets back to send again
    await cut(network, proxy)
    at_b = bodies(network, "b", "orders")
    again = bodies(network, "a", routing_queue("b"))
    assert at_b and again and at_b | again == {f"m{n}" for n in range(COUNT)}
    expected_duplicates = len(at_b & again)
    assert (expected_duplicates > 0) == (case == "commit")
    proxy.heal()
    verify(await consume(network.url("b"), "orders", COUNT), COUNT)
    duplicates = network.routers["b"].management.get("/sys$queuemanager/usage/queues/orders", "duplicates-dropped")
    assert duplicates == expected_duplicates
