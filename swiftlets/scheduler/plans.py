"""From config to plans: each schedule's expression, calendar and date range, ready to ask
for the next start (pure; used by the running swiftlet and by ``schedule next``).

A :class:`Plan` answers "when next?" in naive local time (:mod:`.timing`); a :class:`Zone`
converts between that and instants. :func:`build_plans` turns a whole
:class:`~.config.SchedulerConfig` into plans, or, for a schedule that cannot run, the
reason (an unknown or broken calendar): the problems that need more than one value.
:func:`check_config` reports those problems, and the jobs' ones, with file:line.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator, Mapping
from datetime import date, datetime, tzinfo
from typing import Any

import attrs

from martinet.kernel import ConfigProblem

from .api import JobGroup
from .config import CalendarConfig, CalendarType, ScheduleConfig, SchedulerConfig
from .timing import (
    AtTimes,
    Calendar,
    TimeExpression,
    next_start,
    next_starts,
    parse_annual_days,
    parse_date,
    parse_date_bound,
    parse_duration,
    parse_month_days,
    parse_time_expression,
    parse_weekdays,
    resolve_calendars,
)

__all__ = ["Plan", "Zone", "build_calendars", "build_plans", "plan_of", "job_problem", "check_config"]


@attrs.frozen
class Zone:
    """The scheduler's time zone: an IANA zone, or (``None``) the system's local zone."""

    zone: tzinfo | None = None

    @classmethod
    def named(cls, name: str) -> Zone:
        return cls(zoneinfo.ZoneInfo(name) if name else None)

    @property
    def name(self) -> str:
        return str(self.zone) if self.zone is not None else "local"

    def local(self, instant: datetime) -> datetime:
        """``instant`` (aware) as naive wall-clock time of this zone."""
        return instant.astimezone(self.zone).replace(tzinfo=None)

    def instant(self, local: datetime) -> datetime:
        """Naive wall-clock time of this zone as an aware instant (a time skipped by a DST
        change is read with the offset before it, one that occurs twice as its first)."""
        return local.replace(tzinfo=self.zone) if self.zone is not None else local.astimezone()


@attrs.frozen
class Plan:
    """When one schedule starts its job."""

    expression: TimeExpression
    calendar: Calendar | None = None
    first_day: date | None = None
    last_day: date | None = None
    max_runtime: float | None = None  # seconds

    @property
    def is_at(self) -> bool:
        return isinstance(self.expression, AtTimes)

    def bounds(self) -> dict:
        """The keyword arguments of :func:`.timing.next_start` for this plan."""
        return {
            "allows": self.calendar.allows if self.calendar is not None else None,
            "first_day": self.first_day,
            "last_day": self.last_day,
        }

    def next_after(self, after: datetime) -> datetime | None:
        return next_start(self.expression, after, **self.bounds())

    def next_after_many(self, after: datetime, count: int) -> list[datetime]:
        return next_starts(self.expression, after, count, **self.bounds())


def _calendar_builder(config: CalendarConfig):
    def build(base: Calendar | None) -> Calendar:
        numbers, last = parse_month_days(config.month_days)
        return Calendar(
            include=config.type is CalendarType.INCLUDE,
            weekdays=parse_weekdays(config.weekdays),
            month_days=numbers,
            last_day=last,
            annual_days=parse_annual_days(config.annual_days),
            date_ranges=tuple((parse_date(r.date_from), parse_date(r.date_to)) for r in config.date_ranges.values()),
            base=base,
        )

    return build


def build_calendars(calendars: Mapping[str, CalendarConfig]) -> dict[str, Calendar | str]:
    """Every calendar, or the reason it cannot be built (see :func:`.timing.resolve_calendars`)."""
    return resolve_calendars(
        {name: _calendar_builder(c) for name, c in calendars.items()},
        {name: c.base_calendar for name, c in calendars.items()},
    )


def plan_of(schedule: ScheduleConfig, calendars: Mapping[str, Calendar | str]) -> Plan | str:
    """The plan of ``schedule``, or why it cannot run (its calendar is unknown or broken)."""
    calendar = None
    if schedule.calendar:
        found = calendars.get(schedule.calendar)
        if found is None:
            known = ", ".join(calendars) or "none"
            return f"unknown calendar {schedule.calendar!r} (calendars: {known})"
        if isinstance(found, str):
            return f"calendar {schedule.calendar!r} is broken: {found}"
        calendar = found
    first = parse_date_bound(schedule.date_from, "now")
    last = parse_date_bound(schedule.date_to, "forever")
    if first is not None and last is not None and last < first:
        return f"date-to {schedule.date_to} is before date-from {schedule.date_from}"
    return Plan(
        expression=parse_time_expression(schedule.time_expression),
        calendar=calendar,
        first_day=first,
        last_day=last,
        max_runtime=parse_duration(schedule.max_runtime) if schedule.max_runtime else None,
    )


def build_plans(config: SchedulerConfig) -> dict[str, Plan | str]:
    """Every schedule's plan (enabled or not), or why it cannot run."""
    calendars = build_calendars(config.calendars)
    return {name: plan_of(schedule, calendars) for name, schedule in config.schedules.items()}


def job_problem(schedule: ScheduleConfig, groups: Mapping[str, JobGroup], *, complete: bool | None = None) -> str:
    """Why ``schedule``'s job cannot run with its parameters, given the ``groups`` offered;
    "" if it can. Mandatory parameters may be missing while the schedule is disabled
    (``complete``: whether they must be there; default: when it is enabled)."""
    group = groups.get(schedule.job_group)
    if group is None:
        return f"no job group {schedule.job_group!r} registered (groups: {', '.join(sorted(groups)) or 'none'})"
    job = group.job(schedule.job_name)
    if job is None:
        return (
            f"job group {schedule.job_group!r} has no job {schedule.job_name!r} "
            f"(jobs: {', '.join(j.name for j in group.jobs)})"
        )
    try:
        job.resolve(
            {p.name: p.value for p in schedule.parameters.values()},
            complete=schedule.enabled if complete is None else complete,
        )
    except ValueError as exc:
        return str(exc)
    return ""


def check_config(config: Any, hook: Any) -> Iterator[ConfigProblem]:
    """``sys$scheduler``'s rules across values (``SwiftletSpec.check``: ``martinet check``
    and every start report them with file:line): base calendars exist and make no cycle;
    a schedule's calendar exists and its date range is not empty; and, with the plugins'
    ``hook``, a schedule naming an offered job group names one of its jobs with parameters
    the job accepts. A group nobody offers is left to the running swiftlet (a swiftlet may
    register it later: the schedule waits, ``invalid``)."""
    own: SchedulerConfig = config.swiftlets["sys$scheduler"].config
    calendars = build_calendars(own.calendars)
    for name, calendar in calendars.items():
        if isinstance(calendar, str):
            yield ConfigProblem(("calendars", name), calendar, "base-calendar")
    groups = (
        {group.name: group for offered in hook.martinet_scheduler_jobs() for group in offered}
        if hook is not None
        else {}
    )
    for name, schedule in own.schedules.items():
        where = ("schedules", name)
        plan = plan_of(schedule, calendars)
        if isinstance(plan, str):
            broken = schedule.calendar and not isinstance(calendars.get(schedule.calendar), Calendar)
            yield ConfigProblem(where, plan, "calendar" if broken else "date-to")
        if schedule.job_group in groups:
            problem = job_problem(schedule, groups)
            if problem:
                yield ConfigProblem(
                    where, problem, None if groups[schedule.job_group].job(schedule.job_name) else "job-name"
                )
