"""kill -9 at a chosen frame: each crash state of the routing recovery tables, reached on
purpose with real ``martinet run`` processes (tests/netharness.py: a → b through a fault
proxy). The proxy holds the nth frame of a kind on the wire (tests/faultproxy.py), so the
link stands with one chosen transaction in exactly that state and those before it answered;
then a router is SIGKILLed there and restarted on its store. Its recovery must find the
transaction where the crash left it and the exact outcome follows: every message once, the
held transaction committed or rolled back on each side as the table says (their log lines
per xid), and, without XA, the resent messages dropped as duplicates by doubt.

The in-process tests (test_routing_fault_points.py) cut the link at the same states; these
add what only a crash can break: what each store kept."""

from __future__ import annotations

import pytest
import trio
from test_routing_transfer_network import consume, produce, verify_set

from martinet.swiftlets.routing.wire import FrameType

from netharness import Topology, open_network

COUNT = 300  # 15 transactions of 20: the held one has answered ones before it and open ones after it
LINK = ("a", "b")
TOPOLOGY = Topology(("a", "b"), (LINK,), sources=("a",), destination="b", queue="orders")

CASES = {
    # b prepared it (durably, before its answer), a never heard; a crashes: a's store has it
    # prepared too, and recovery commits it on both sides
    "prepare-reply, kill a": (
        True,
        ("to_client", FrameType.PREPARE_REPLY, 3),
        "a",
        ["to b committed"],
        ["from a committed"],
    ),
    # the same state, b crashes: b's store has it prepared, b lists it, both commit
    "prepare-reply, kill b": (
        True,
        ("to_client", FrameType.PREPARE_REPLY, 3),
        "b",
        ["to b committed"],
        ["from a committed"],
    ),
    # a prepared it (durably, before sending), b never had it; a crashes: recovery rolls it
    # back at a and its messages go again
    "transaction, kill a": (
        True,
        ("to_target", FrameType.TRANSACTION, 3),
        "a",
        ["to b rolled back (its messages go again)"],
        [],
    ),
}


def recovered(log: str, xid: str) -> list[str]:
    return [
        line.split("] ", 1)[-1].split(": ", 1)[-1]
        for line in log.splitlines()
        if f"{xid} " in line and "in recovery" in line
    ]


@pytest.mark.parametrize("case", list(CASES))
async def test_xa_a_crash_in_each_recovery_state(tmp_path, case):
    xa, rule, victim, at_a, at_b = CASES[case]
    async with open_network(tmp_path, TOPOLOGY, xa=xa) as network:
        direction, frame, nth = rule
        held = network.proxies[LINK].hold(direction, frame.value, nth)
        await produce(network.url("a"), "orders@b", COUNT)  # a holds them all; the link stalls at the held frame
        with trio.fail_after(30):
            await held.seen.wait()
        xid = held.fields["xid"]
        await network.kill(victim)
        await network.restart(victim)
        verify_set(await consume(network.url("b"), "orders", COUNT, timeout=60), COUNT)
        assert recovered(network.routers["a"].current(), xid) == [
            f"routing transaction {xid} {what} in recovery" for what in at_a
        ]
        assert recovered(network.routers["b"].current(), xid) == [
            f"routing transaction {xid} {what} in recovery" for what in at_b
        ]


async def test_non_xa_a_crash_after_the_receiver_committed_drops_exactly_the_copies(tmp_path):
    """b committed the batch and its NONXA_COMMIT is held; a crashes. a's store still has
    every message b did not acknowledge, and a sends them again in doubt: b's queue drops
    the copies it has (their message-ids are in its duplicate backlog) and every message
    arrives once."""
    async with open_network(tmp_path, TOPOLOGY, xa=False) as network:
        held = network.proxies[LINK].hold("to_client", FrameType.NONXA_COMMIT.value, 3)
        await produce(network.url("a"), "orders@b", COUNT)
        with trio.fail_after(30):
            await held.seen.wait()
        await network.kill("a")
        await network.restart("a")
        verify_set(await consume(network.url("b"), "orders", COUNT, timeout=60), COUNT)
