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
