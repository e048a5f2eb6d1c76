"""Kernel hot paths: event-bus publish and pool job dispatch. Prints its figures.

    .venv/bin/python bench/kernel_bench.py

Measures in one trio process on this machine (no timing is asserted anywhere):
- bus: events/s published to N subscribers, each drained by its own task;
- pool: trivial jobs/s through a pool of max 1 and of max 8 (submit + dispatch + run).
"""

from __future__ import annotations

import time

import attrs
import trio
import trio.testing

from martinet.kernel import Event, EventBus, Overflow, Pool


@attrs.frozen(kw_only=True)
class Tick(Event):
    n: int


async def bench_bus(subscribers: int, events: int) -> float:
    bus = EventBus()
    subs = [bus.subscribe(Tick, max_buffer=1024, overflow=Overflow.FAIL) for _ in range(subscribers)]

    async def drain(sub):
        async for _ in sub:
            pass

    async with trio.open_nursery() as nursery:
        for sub in subs:
            nursery.start_soon(drain, sub)
        begin = time.perf_counter()
        for n in range(events):
            bus.publish(Tick(n=n))
            if n % 512 == 511:
                # Bursts of 512, then wait until every subscriber has drained them all:
                # the figure covers publishing *and* delivery.
                await trio.testing.wait_all_tasks_blocked()
        for sub in subs:
            sub.close()
    elapsed = time.perf_counter() - begin
    assert all(sub.dropped == 0 for sub in subs)
    return events / elapsed


async def bench_pool(max_concurrency: int, jobs: int) -> float:
    pool = Pool("bench", max_concurrency, 10_000)
    done = trio.Event()

    async def job(n: int) -> None:
        if n == jobs - 1:
            done.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        begin = time.perf_counter()
        for n in range(jobs):
            await pool.submit(job, n)
        await done.wait()
        elapsed = time.perf_counter() - begin
        nursery.cancel_scope.cancel()
    return jobs / elapsed


async def main() -> None:
    for subscribers in (1, 10):
        rate = await bench_bus(subscribers, 200_000)
        print(
            f"bus publish, {subscribers:>2} subscriber(s): {rate:>10,.0f} events/s "
            f"({rate * subscribers:,.0f} deliveries/s)"
        )
    for size in (1, 8):
        rate = await bench_pool(size, 100_000)
        print(f"pool jobs, max-concurrency {size}:      {rate:>10,.0f} jobs/s")


if __name__ == "__main__":
    trio.run(main)
