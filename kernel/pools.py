"""Task pools: the trio counterpart of SwiftMQ's named thread pools.

Theory of operation
-------------------
A swiftlet declares its pools (:class:`PoolSpec`: name, default concurrency and queue
size); the kernel sizes them from the swiftlet's ``<pools>`` element and runs each one in
the swiftlet's own nursery, so a pool lives exactly as long as its swiftlet.

A :class:`Pool` is a bounded FIFO of jobs (a memory channel of ``queue-size``) served by
``max-concurrency`` long-lived worker tasks (no task is spawned per job: spawning would
cost more than most jobs). A worker takes the next job, waits for a slot of a
:class:`trio.CapacityLimiter` of ``max-concurrency`` tokens and runs it. Jobs therefore
*start* in submission order, at most ``max-concurrency`` run at once, and a pool of max 1
runs its jobs strictly one after the other, as SwiftMQ's single-threaded pools do.
``max-concurrency`` can change at runtime (the limiter is resized, workers are added or
retire after their current job); ``queue-size`` needs a reboot.

Backpressure is explicit: :meth:`Pool.submit_nowait` refuses a job when the queue is full
(raising :class:`PoolFull` and counting it as rejected), :meth:`Pool.submit` waits for room.
A job that raises is logged with its traceback and counted as failed; the pool goes on, as
a thread pool does — a job's owner that must react to failure catches inside the job.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .schema import config_class, prop

__all__ = ["PoolSpec", "PoolConfig", "Pool", "PoolFull"]

log = logging.getLogger(__name__)

Job = Callable[..., Awaitable[Any]]


@config_class
@attrs.frozen(kw_only=True)
class PoolConfig:
    """The ``<pool>`` element of a swiftlet's ``<pools>`` list."""

    name: str = prop(description="Name of a pool the swiftlet declares, e.g. routing.service.")
    max_concurrency: int = prop(1, min=1, max=100_000, description="Jobs of this pool that may run at the same time.")
    queue_size: int = prop(
        1000,
        min=1,
        max=10_000_000,
        reboot_required=True,
        description="Jobs that may wait for a free slot before submitters are refused or wait.",
    )


@attrs.frozen
class PoolSpec:
    """A pool declared by a swiftlet, with the defaults its config entry starts from."""

    name: str
    description: str
    max_concurrency: int = 1
    queue_size: int = 1000

    def default_config(self) -> PoolConfig:
        return PoolConfig(name=self.name, max_concurrency=self.max_concurrency, queue_size=self.queue_size)


class PoolFull(Exception):
    """A job was refused because the pool's queue was full."""


@attrs.define(eq=False)
class Pool:
    """A named pool of concurrently running jobs; start it with ``nursery.start(pool.run)``."""

    name: str
    max_concurrency: int
    queue_size: int
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    _running: int = attrs.field(default=0, init=False)
    _workers: int = attrs.field(default=0, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _send: trio.MemorySendChannel[Any] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[Any] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.max_concurrency)
        self._send, self._receive = trio.open_memory_channel(self.queue_size)

    @classmethod
    def from_config(cls, config: PoolConfig) -> Pool:
        return cls(config.name, config.max_concurrency, config.queue_size)

    @property
    def running(self) -> int:
        """Jobs running now."""
        return self._running

    @property
    def queued(self) -> int:
        """Jobs waiting for a free slot."""
        return self._send.statistics().current_buffer_used

    def resize(self, max_concurrency: int) -> None:
        """Change the concurrency limit; running jobs finish, new ones obey the new limit."""
        self._limiter.total_tokens = max_concurrency
        self.max_concurrency = max_concurrency
        self._add_workers()

    def submit_nowait(self, job: Job, *args: Any) -> None:
        """Queue ``job(*args)`` without waiting.

        Raises:
            PoolFull: the queue holds ``queue-size`` jobs already (counted as rejected).
            trio.BrokenResourceError: the pool has stopped.
        """
        try:
            self._send.send_nowait((job, args))
        except trio.WouldBlock:
            self.rejected += 1
            raise PoolFull(f"pool {self.name} is full ({self.queue_size} jobs queued)") from None

    async def submit(self, job: Job, *args: Any) -> None:
        """Queue ``job(*args)``, waiting while the queue is full.

        Raises:
            trio.BrokenResourceError: the pool has stopped.
        """
        await self._send.send((job, args))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run queued jobs until cancelled; cancelling also cancels running jobs.

        Once the pool has stopped, submitting raises :class:`trio.BrokenResourceError`.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._add_workers()
                task_status.started()
        finally:
            self._nursery = None
            self._receive.close()

    def _add_workers(self) -> None:
        while self._nursery is not None and self._workers < self.max_concurrency:
            self._workers += 1
            self._nursery.start_soon(self._work, name=f"pool {self.name}")

    async def _work(self) -> None:
        """One long-lived worker: take the next job, wait for a slot, run it.

        Workers take jobs in FIFO order and wait for the limiter in that order too, so jobs
        start in submission order; the limiter (not the number of workers) enforces the
        limit, which keeps it exact while the pool is being resized.
        """
        try:
            async for job, args in self._receive:
                async with self._limiter:
                    self._running += 1
                    try:
                        await job(*args)
                        self.completed += 1
                    except Exception:
                        self.failed += 1
                        log.exception("job %r of pool %s failed", job, self.name)
                    finally:
                        self._running -= 1
                if self._workers > self.max_concurrency:
                    return  # the pool shrank: this worker retires
        finally:
            self._workers -= 1

    def usage(self) -> dict[str, int]:
        """The counters shown under ``usage/pools/<name>``."""
        return {
            "max-concurrency": self.max_concurrency,
            "running": self.running,
            "queued": self.queued,
            "completed": self.completed,
            "failed": self.failed,
            "rejected": self.rejected,
        }
