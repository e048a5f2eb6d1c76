"""The runs of ``sys$scheduler``'s schedules as they end: each schedule's last run in its
usage, and the history (``/sys$scheduler/usage/history``), oldest first out past
``history-size``; each run announced on the bus (:class:`.api.JobFinished`) and, when the
schedule logs or the run went wrong, in the log."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
import trio

from martinet.kernel import SwiftletContext

from .api import Job, JobFinished, JobGroup
from .config import ScheduleConfig

__all__ = ["History", "Run", "Schedule", "iso"]


def iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else ""


@attrs.define(eq=False)
class Run:
    """A run in progress (queued in the pool or running)."""

    job: Job
    group: JobGroup
    planned: datetime
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    stopped_by: str = ""
    started: datetime | None = None


@attrs.define(eq=False)
class Schedule:
    """What the planner knows of one schedule beyond its config."""

    name: str
    state: str = "disabled"
    next: datetime | None = None  # naive local
    last_planned: datetime | None = None
    error: str = ""
    run: Run | None = None
    runs: int = 0
    last_start: str = ""
    last_end: str = ""
    last_outcome: str = ""
    last_message: str = ""
    finished_config: ScheduleConfig | None = None  # a job forbade further runs of this config

    def usage(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "next-start": iso(self.next),
            "error": self.error,
            "runs": self.runs,
            "last-start": self.last_start,
            "last-end": self.last_end,
            "last-outcome": self.last_outcome,
            "last-message": self.last_message,
        }


class History:
    """Records ended runs (``now``: the scheduler's local time)."""

    def __init__(self, context: SwiftletContext, now: Callable[[], datetime]):
        self.context = context
        self._now = now
        self._entries: collections.deque[dict[str, Any]] = collections.deque()
        self._sequence = 0
        self._usage = context.usage.add_list("history")

    def record(
        self,
        schedule: Schedule,
        config: ScheduleConfig,
        planned: datetime,
        started: datetime | None,
        outcome: str,
        message: str,
    ) -> None:
        """Add a run to the history, the schedule's usage, the bus and (optionally) the log."""
        ended = self._now()
        if outcome != "missed":
            schedule.runs += 1
        schedule.last_start, schedule.last_end = iso(started), iso(ended)
        schedule.last_outcome, schedule.last_message = outcome, message
        entry = {
            "schedule": schedule.name,
            "job-group": config.job_group,
            "job-name": config.job_name,
            "planned": iso(planned),
            "start": iso(started),
            "end": iso(ended) if started else "",
            "outcome": outcome,
            "message": message,
        }
        self._add(entry)
        if outcome != "missed":
            self.context.bus.publish(
                JobFinished(
                    schedule=schedule.name,
                    job_group=config.job_group,
                    job_name=config.job_name,
                    outcome=outcome,
                    message=message,
                )
            )
        if config.logging_enabled or outcome in ("failed", "invalid", "rejected"):
            level = logging.INFO if outcome in ("success", "stopped") else logging.WARNING
            self.context.log.log(
                level,
                "schedule %s: job %s/%s %s%s",
                schedule.name,
                config.job_group,
                config.job_name,
                outcome,
                f": {message}" if message else "",
            )

    def trim(self) -> None:
        """Drop the oldest entries past ``history-size`` (it may have been lowered)."""
        while len(self._entries) > self.context.config.history_size:
            self._usage.remove(self._entries.popleft()["key"])

    def _add(self, entry: dict[str, Any]) -> None:
        self._sequence += 1
        key = f"{self._sequence:08d}"
        self._entries.append({"key": key, **entry})
        self._usage.add(key, lambda: entry)
        self.trim()
