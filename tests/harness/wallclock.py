"""A wall clock for sys$scheduler tests: a chosen date that follows trio's clock.

Given to the scheduler through the ``martinet_scheduler_clock`` hook (:class:`ClockPlugin`,
registered in-process), it makes the scheduler's "now" a date and zone of the test's
choosing; under ``autojump_clock`` a night then passes in no time, and every time a test
asserts is computed, never measured.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import trio

from martinet.kernel import hookimpl

PARIS = ZoneInfo("Europe/Paris")


class TrioClock:
    """Wall time that is ``start`` when first read and then follows trio's clock (kept in
    UTC: aware arithmetic in a zone would add wall-clock time across a DST change)."""

    def __init__(self, start: datetime):
        self.start = start.astimezone(UTC)
        self.origin: float | None = None

    def now(self) -> datetime:
        if self.origin is None:
            self.origin = trio.current_time()
        return self.start + timedelta(seconds=trio.current_time() - self.origin)

    async def sleep_until(self, when: datetime) -> None:
        self.now()
        await trio.sleep_until(self.origin + (when - self.start).total_seconds())


class ClockPlugin:
    """A plugin that gives the scheduler ``clock``."""

    def __init__(self, clock: TrioClock):
        self.clock = clock

    @hookimpl
    def martinet_scheduler_clock(self) -> TrioClock:
        return self.clock
