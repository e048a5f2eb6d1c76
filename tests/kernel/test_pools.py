"""Task pools: concurrency limits, FIFO serialisation at max 1, bounded queues, counters."""

from __future__ import annotations

import logging

import pytest
import trio

from martinet.kernel import Pool, PoolFull


@pytest.fixture
async def start_pool(nursery):
    async def start(max_concurrency: int, queue_size: int = 100) -> Pool:
        pool = Pool("test.pool", max_concurrency, queue_size)
        await nursery.start(pool.run)
        return pool

    return start


class Tracker:
    """Records job start/end order and the highest number running at once."""

    def __init__(self):
        self.running = 0
        self.peak = 0
        self.log: list[tuple[str, int]] = []

    async def job(self, n: int, duration: float = 1.0) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.log.append(("start", n))
        await trio.sleep(duration)
        self.log.append(("end", n))
        self.running -= 1


async def test_max_one_runs_jobs_strictly_in_order(start_pool, autojump_clock):
    pool = await start_pool(1)
    tracker = Tracker()
    for n in range(5):
        pool.submit_nowait(tracker.job, n, 1 + (n % 2))
    await trio.sleep(100)
    assert tracker.peak == 1
    assert tracker.log == [(what, n) for n in range(5) for what in ("start", "end")]
    assert pool.usage() == {
        "max-concurrency": 1,
        "running": 0,
        "queued": 0,
        "completed": 5,
        "failed": 0,
        "rejected": 0,
    }


async def test_concurrency_is_limited_and_used(start_pool, autojump_clock):
    pool = await start_pool(3)
    tracker = Tracker()
    for n in range(10):
        await pool.submit(tracker.job, n)
    await trio.sleep(0.5)
    assert (pool.running, pool.queued) == (3, 7)
    await trio.sleep(100)
    assert tracker.peak == 3
    starts = [n for what, n in tracker.log if what == "start"]
    # FIFO: jobs start in submission order, up to the order among those starting together.
    assert [sorted(starts[i : i + 3]) for i in range(0, 10, 3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert pool.completed == 10


async def test_full_queue_refuses_and_counts(start_pool, autojump_clock):
    pool = await start_pool(1, queue_size=2)
    tracker = Tracker()
    pool.submit_nowait(tracker.job, 0, 10)
    await trio.testing.wait_all_tasks_blocked()  # job 0 running, the queue is empty again
    pool.submit_nowait(tracker.job, 1)
    pool.submit_nowait(tracker.job, 2)
    assert (pool.running, pool.queued) == (1, 2)
    with pytest.raises(PoolFull, match="pool test.pool is full \\(2 jobs queued\\)"):
        pool.submit_nowait(tracker.job, 3)
    assert pool.rejected == 1
    await trio.sleep(100)
    assert pool.completed == 3


async def test_submit_waits_for_room(start_pool, autojump_clock):
    pool = await start_pool(1, queue_size=1)
    tracker = Tracker()
    start, returned = trio.current_time(), []
    for n in range(6):  # each job takes 1 s; one runs, one waits in the queue
        await pool.submit(tracker.job, n)  # waits instead of failing
        returned.append((trio.current_time() - start, pool.queued))
    # job 0 is taken at once, job 1 fills the queue; each later submit returns when a job ends
    assert returned == [(0, 0), (0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]
    await trio.sleep(100)
    assert pool.completed == 6 and pool.rejected == 0


async def test_a_failing_job_is_logged_and_the_pool_goes_on(start_pool, autojump_clock, caplog):
    pool = await start_pool(1)
    done = []

    async def bad():
        raise ValueError("broken job")

    async def good():
        done.append(True)

    with caplog.at_level(logging.ERROR):
        pool.submit_nowait(bad)
        pool.submit_nowait(good)
        await trio.sleep(1)
    assert done == [True]
    assert (pool.failed, pool.completed) == (1, 1)
    assert "pool test.pool failed" in caplog.text and "broken job" in caplog.text


async def test_resize_at_runtime(start_pool, autojump_clock):
    pool = await start_pool(1)
    tracker = Tracker()
    for n in range(8):
        pool.submit_nowait(tracker.job, n)  # each job takes 1 s
    await trio.sleep(0.5)
    assert pool.running == 1
    pool.resize(4)  # jobs 1-3 start at once (t=0.5)
    await trio.sleep(0.1)
    assert pool.running == 4
    pool.resize(2)  # running jobs finish; until then nothing new starts
    await trio.sleep(0.95)  # t=1.55: jobs 0-3 are done, jobs 4 and 5 run
    assert pool.running == 2 and pool.completed == 4
    await trio.sleep(100)
    assert tracker.peak == 4 and pool.completed == 8


async def test_cancelling_the_pool_cancels_its_jobs(autojump_clock):
    pool = Pool("p", 2, 10)
    cancelled = []

    async def forever():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        pool.submit_nowait(forever)
        pool.submit_nowait(forever)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert cancelled == [True, True]
    with pytest.raises(trio.BrokenResourceError):
        pool.submit_nowait(forever)
