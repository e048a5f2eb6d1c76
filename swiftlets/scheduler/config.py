"""``sys$scheduler`` configuration: calendars, schedules and their job parameters.

Names follow SwiftMQ's scheduler, so that its users find them: a schedule
has ``enabled`` (default false), ``logging-enabled``, ``calendar``, ``job-group``,
``job-name``, ``date-from`` (``now`` or a date), ``date-to`` (``forever`` or a date),
``max-runtime`` and ``time-expression``, plus ``parameters``. Calendars are ours in form:
SwiftMQ switches each weekday and month day on with a flag of its own, we list them
(``weekdays="mon tue"``, ``month-days="1 15 last"``, ``annual-days="12-25"``), with date
ranges as a list.

Every value with a meaning beyond its type — time expressions, durations, dates, day lists,
time zones — is checked by :mod:`.timing` through ``prop(check=…)``, so a mistake is reported
with file:line when the file is read and refused when management sets it. What needs more
than one value (a calendar that names a missing base, a schedule's unknown calendar or job,
its job parameters) is checked by the running swiftlet, which refuses such a change and
shows a configured one as ``invalid`` in usage.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Mapping
from enum import StrEnum

import attrs

from martinet.kernel import config_class, entity_list, prop

from .timing import (
    parse_annual_days,
    parse_date,
    parse_date_bound,
    parse_duration,
    parse_month_days,
    parse_time_expression,
    parse_weekdays,
)


def check_time_zone(name: str) -> None:
    """An IANA zone name, or "" for the router's local zone.

    Raises:
        ValueError: no such zone.
    """
    if name:
        try:
            zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {name!r}; use an IANA name such as Europe/Zurich") from None


def check_max_runtime(text: str) -> None:
    if text:
        parse_duration(text)


class CalendarType(StrEnum):
    INCLUDE = "include"
    EXCLUDE = "exclude"


@config_class
@attrs.frozen(kw_only=True)
class DateRange:
    name: str = prop(description="Name of this date range.")
    date_from: str = prop(check=parse_date, description="First day of the range, yyyy-MM-dd.")
    date_to: str = prop(check=parse_date, description="Last day of the range (included), yyyy-MM-dd.")


@config_class
@attrs.frozen(kw_only=True)
class CalendarConfig:
    name: str = prop(description="Name of this calendar, as schedules and other calendars name it.")
    type: CalendarType = prop(
        CalendarType.INCLUDE,
        choices=CalendarType,
        description="include: schedules on this calendar run on the days it selects; exclude: on every other day.",
    )
    base_calendar: str = prop(
        "",
        description="A calendar below this one: a day is allowed only if the base "
        "allows it too (e.g. holidays excluded from business days). Empty: none.",
    )
    weekdays: str = prop(
        "",
        check=parse_weekdays,
        description="Weekdays selected: sun mon tue wed thu fri sat (or the full names), separated by spaces.",
    )
    month_days: str = prop(
        "",
        check=parse_month_days,
        description="Days of the month selected: 1 to 31 and 'last' (each month's last day), separated by spaces.",
    )
    annual_days: str = prop(
        "", check=parse_annual_days, description="Days of the year selected, MM-dd (e.g. '12-25 01-01')."
    )
    date_ranges: Mapping[str, DateRange] = entity_list(
        DateRange, item="date-range", description="Date ranges selected (both ends included)."
    )


@config_class
@attrs.frozen(kw_only=True)
class ParameterConfig:
    name: str = prop(description="Name of the job parameter.")
    value: str = prop("", description="Its value (checked against the job's declaration when it runs).")


@config_class
@attrs.frozen(kw_only=True)
class ScheduleConfig:
    name: str = prop(description="Name of this schedule.")
    enabled: bool = prop(False, description="Enables/disables this schedule (SwiftMQ's default: disabled).")
    logging_enabled: bool = prop(False, description="Log each start and end of this schedule's job at INFO.")
    calendar: str = prop("", description="Calendar deciding on which days it runs; empty: every day.")
    job_group: str = prop(description="Job group of the job to run, e.g. Routing.")
    job_name: str = prop(description="Name of the job to run, e.g. Routing Connector.")
    date_from: str = prop(
        "now",
        check=lambda text: parse_date_bound(text, "now"),
        description="First day it runs, yyyy-MM-dd; 'now': from today.",
    )
    date_to: str = prop(
        "forever",
        check=lambda text: parse_date_bound(text, "forever"),
        description="Last day it runs (included), yyyy-MM-dd; 'forever': no end.",
    )
    max_runtime: str = prop(
        "",
        check=check_max_runtime,
        description="Longest run, <n>h, <n>m or <n>s; a job still running then is stopped. Empty: no limit.",
    )
    time_expression: str = prop(
        check=parse_time_expression,
        description="'at HH:mm[:ss][, …]' (start times "
        "of each day) or 'start HH:mm[:ss] stop HH:mm[:ss] delay <n>h|m|s [repeat <n>]' "
        "(a window, which may wrap past midnight, with a start every delay, at most "
        "repeat starts).",
    )
    parameters: Mapping[str, ParameterConfig] = entity_list(
        ParameterConfig, item="parameter", description="Parameters passed to the job."
    )


@config_class
@attrs.frozen(kw_only=True)
class SchedulerConfig:
    time_zone: str = prop(
        "",
        check=check_time_zone,
        description="(Martinet) IANA time zone in which time "
        "expressions, dates and calendars are read; empty: the router's local zone.",
    )
    history_size: int = prop(
        100, min=1, max=100_000, description="(Martinet) Runs kept in usage/history (the oldest go first)."
    )
    calendars: Mapping[str, CalendarConfig] = entity_list(
        CalendarConfig, item="calendar", description="Calendar definitions."
    )
    schedules: Mapping[str, ScheduleConfig] = entity_list(
        ScheduleConfig, item="schedule", description="Schedule definitions."
    )
