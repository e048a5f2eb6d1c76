"""The store's disk: its free space against ``disk-free-limit-kb``, and a disk found full.

Theory of operation
-------------------
A full disk must not stop the router nor lose a message. Two lines of defence:

- **The alarm, before the disk fills** (as RabbitMQ's disk alarm): every
  ``disk-check-interval`` the free space of the store's file system is read (``statvfs``, in a
  worker thread: on a network file system it may block). Under ``disk-free-limit-kb`` the
  alarm goes on: the queue manager refuses new persistent messages with an error the
  producer sees (``amqp:resource-limit-exceeded``, naming the router and the free space),
  routing links hold the batches they receive (as for a full queue: the sending router keeps
  them), and consumers go on draining. It goes off once the free space is above the limit by
  :data:`MARGIN` of it (at least :data:`MIN_MARGIN`), so that it does not flap at the edge.
  Between two readings each batch sent to the store is subtracted (:meth:`SpaceAlarm.spend`),
  so the alarm goes on in time however fast the producers are.
- **A commit that meets a full disk anyway** (another process filled it between two
  checks, or the limit is 0): SQLite rolls the batch back whole, and the store process keeps
  trying it again (:mod:`.dbprocess`) instead of failing the store. It says so once
  (:meth:`SpaceAlarm.set_full`), which turns the alarm on too; the batch's producers wait for
  their answer meanwhile (nothing they sent is lost or answered before it is on disk), and
  when a retry succeeds, the alarm's full state ends.

Everything but the ``statvfs`` runs in the router's trio thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

__all__ = ["SpaceAlarm"]

log = logging.getLogger(__name__)

MARGIN = 10  # percent of the limit above it that the free space must reach for the alarm to end
MIN_MARGIN = 1 << 20  # bytes: the least margin (a small limit would flap with every commit)


class SpaceAlarm:
    """Free bytes of the store's file system, the limit, and who waits for the alarm to end.

    ``limit``: bytes; 0 means no alarm on low space (only a disk found full turns it on).
    """

    def __init__(self, folder: Path, limit: int, router: str = ""):
        self.folder = folder
        self.router = router
        self.limit = limit
        self.free = -1  # bytes; -1 until first read
        self.low = False  # the free space is under the limit (and has not risen past the margin)
        self.full: str | None = None  # what the store process said of a commit that met a full disk
        self.alarms = 0
        self._waiting: list[Callable[[], None]] = []

    @property
    def on(self) -> bool:
        """New persistent messages are refused now."""
        return self.low or self.full is not None

    def describe(self) -> str:
        """Why the alarm is on, for an error or a log line."""
        if self.full is not None:
            return f"the disk of its store ({self.folder}) is full"
        return (
            f"the disk of its store ({self.folder}) has {_size(self.free)} free, "
            f"under disk-free-limit-kb ({_size(self.limit)})"
        )

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        if self.free >= 0:
            self.set_free(self.free)

    def set_free(self, free: int) -> None:
        """The file system has ``free`` bytes available now."""
        self.free = free
        was = self.on
        if not self.low and free < self.limit:
            self.low = True
        elif self.low and free >= self.limit + max(self.limit * MARGIN // 100, MIN_MARGIN):
            self.low = False
        self._changed(was)

    def spend(self, size: int) -> None:
        """A batch of ``size`` bytes goes to the store: until the next reading, the free space
        is taken to be that much less, twice (SQLite writes it to its log, then to the
        database), so that a fast producer cannot fill the disk between two readings. (Deletes
        count too, though they free space in the end: erring low is the safe side.)"""
        if self.free >= 0:
            self.set_free(max(self.free - 2 * size, 0))

    def set_full(self, text: str | None) -> None:
        """A commit met a full disk (``text``: the store process's words), or, with None,
        one went through after that."""
        was = self.on
        if text is not None and self.full is None:
            log.warning(
                "router %s: a commit met a full disk (%s); the store tries it again until space returns",
                self.router,
                text,
            )
        elif text is None and self.full is not None:
            log.info("router %s: the commit that met a full disk went through", self.router)
        self.full = text
        self._changed(was)

    def when_clear(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While the alarm is on, call ``callback`` once it ends and return a function that
        cancels the call; None when it is off."""
        if not self.on:
            return None
        self._waiting.append(callback)

        def cancel() -> None:
            if callback in self._waiting:
                self._waiting.remove(callback)

        return cancel

    def _changed(self, was: bool) -> None:
        if self.on and not was:
            self.alarms += 1
            log.warning(
                "router %s disk alarm on: %s; persistent messages are refused and routing links hold "
                "their transfers until it ends",
                self.router,
                self.describe(),
            )
        elif was and not self.on:
            log.info(
                "router %s disk alarm off: %s free; persistent messages are taken again", self.router, _size(self.free)
            )
            waiting, self._waiting = self._waiting, []
            for callback in waiting:
                callback()

    async def check(self) -> None:
        """Read the free space now (in a worker thread)."""
        self.set_free(await trio.to_thread.run_sync(_free, self.folder))

    def usage(self) -> dict[str, Any]:
        return {
            "disk-free": self.free,
            "disk-free-limit": self.limit,
            "disk-alarm": self.on,
            "disk-full": self.full is not None,
            "disk-alarms": self.alarms,
        }


def _free(folder: Path) -> int:
    """Bytes available to an unprivileged writer (what SQLite, run by the router's user, gets
    when it is not root; for root a little more: the reserved blocks)."""
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize


def _size(count: int) -> str:
    if count < 0:
        return "unknown"
    return f"{count / 2**20:,.1f} MiB" if count >= 2**20 else f"{count / 1024:,.1f} KiB"
