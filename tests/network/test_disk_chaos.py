"""A full disk as a fault of the network harness (tests/harness/netharness.py): each router's store on
a tmpfs of its own, filled to the last byte by the fault and freed when it ends, while
numbered producers send through the network. Its own file so that CI runs it beside the
other chaos tests (tests/network/test_routing_chaos.py), not after them."""

from __future__ import annotations

import os

import pytest

from tests.harness.netharness import TOPOLOGIES, Schedule, chaos, open_network

pytestmark = pytest.mark.slow


@pytest.fixture
def root():
    if os.geteuid() != 0:
        message = "a tmpfs per router's store needs root"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.parametrize("mode", ["queues", "topics"])
async def test_full_disks_among_kills_and_cuts_lose_and_duplicate_nothing(tmp_path, root, mode):
    """Queues: producers on a and b send to ``chaos@c``; topics: they publish, and every
    router has a durable and a non-durable subscriber. Seed 6 cuts a–b, kills b, then fills
    the disks of a (a source: its producers are refused meanwhile) and c (the destination:
    its commits wait, routing into it waits): every accepted message reaches each durable
    end exactly once."""
    schedule = Schedule(rounds=4, faults=("disk-full", "kill", "cut"), seed=6, mode=mode, down=2.0)
    async with open_network(tmp_path, TOPOLOGIES["triangle"], disks=True) as network:
        results = await chaos(network, schedule, print)
    print(results.table(f"{mode}, full disks"))
    assert results.sent > 0 and results.faults == {"cut": 1, "kill": 1, "disk-full": 2}
    assert (results.lost, results.duplicated) == (0, 0), results.table()
