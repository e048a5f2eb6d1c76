"""The network harness (tests/netharness.py) in CI: real ``martinet run`` processes, faults
on a seeded schedule, counted traffic. The long version is ``bench/network_chaos.py``."""

from __future__ import annotations

import pytest

from netharness import TOPOLOGIES, Schedule, chaos, open_network

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
