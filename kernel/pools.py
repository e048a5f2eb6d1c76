"""Task pools: the trio counterpart of SwiftMQ's named thread pools.

Theory of operation
-------------------
A swiftlet declares its pools (:class:`PoolSpec`: name, default concurrency and queue
size); the kernel sizes them from the swiftlet's ``<pools>`` element and runs each one in
the swiftlet's own nursery, so a pool lives exactly as long as its swiftlet.

A :class:`Pool` is a bounded FIFO of jobs (a memory channel of ``queue-size``) and one
dispatcher task that takes jobs in order, waits for a slot of a :class:`trio.CapacityLimiter`
of ``max-concurrency`` tokens, and runs the job as a child task. Jobs therefore *start* in
submission order, at most ``max-concurrency`` run at once, and a pool of max 1 runs its jobs
strictly one after the other, as SwiftMQ's single-threaded pools do. ``max-concurrency``
can change at runtime (the limiter is resized); ``queue-size`` needs a reboot.

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
class PoolConfig:
    """The ``<pool>`` element of a swiftlet's ``<pools>`` list."""

    name: str = prop(description="Name of a pool the swiftlet declares, e.g. routing.service.")
    max_concurrency: int = prop(
        1, min=1, max=100_000, description="Jobs of this pool that may run at the same time."
    )
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
        return PoolConfig(
            name=self.name, max_concurrency=self.max_concurrency, queue_size=self.queue_size
        )


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
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _send: trio.MemorySendChannel = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel = attrs.field(init=False)

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
        """Dispatch queued jobs until cancelled; cancelling also cancels running jobs."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            async with self._receive:
                async for job, args in self._receive:
                    borrower = object()  # the slot belongs to the job, not to this task
                    await self._limiter.acquire_on_behalf_of(borrower)
                    self._running += 1
                    nursery.start_soon(self._run_job, job, args, borrower, name=f"{self.name}:{job!r}")

    async def _run_job(self, job: Job, args: tuple[Any, ...], borrower: object) -> None:
        try:
            await job(*args)
            self.completed += 1
        except Exception:
            self.failed += 1
            log.exception("job %r of pool %s failed", job, self.name)
        finally:
            self._running -= 1
            self._limiter.release_on_behalf_of(borrower)

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

