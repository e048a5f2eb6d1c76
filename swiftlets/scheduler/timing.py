"""When a schedule runs: time expressions, calendars, date ranges and the next start (pure).

Theory of operation
-------------------
Everything here works on *naive local* datetimes: the wall-clock time of the scheduler's
time zone. The swiftlet converts the clock's aware "now" into that zone before asking and
the answer back into an instant before sleeping, so this module knows nothing of zones,
clocks or trio, and the tests compare it with a brute-force reference minute by minute.

Time expressions (checked by :func:`parse_time_expression`, which the config calls, so a
bad one is reported with file:line):

- ``at HH:mm[:ss][, HH:mm[:ss] …]`` — starts at those times of every allowed day.
- ``start HH:mm[:ss] stop HH:mm[:ss] delay <n>h|m|s [repeat <n>]`` — a window opening at
  ``start`` on an allowed day D and closing at ``stop`` (on D, or on D+1 when ``stop`` is
  not later than ``start``: the window wraps past midnight; ``stop`` equal to ``start`` is
  a window of a whole day). Starts are ``start``, ``start + delay``, … strictly before the
  window closes, at most ``repeat`` of them. A window belongs to the day it opens on: the
  calendar and the date range judge D, also for the starts after midnight.

A :class:`Calendar` selects days by weekday, day of the month (``last`` included), day of
the year (``MM-dd``) and date range; an ``include`` calendar allows the selected days, an
``exclude`` calendar every other day; a calendar with a base allows a day only if its base
does too (the chain is resolved by :func:`resolve_calendars`, which refuses unknown names
and cycles).

:func:`next_start` returns the first start strictly after a given time, walking day by day
(windows of consecutive days never overlap, so day order is time order) for at most
:data:`HORIZON_DAYS` days; ``None`` when there is none (a date range that has ended, a
calendar that allows no day). Each day costs a few arithmetic steps, whatever the delay.
"""

from __future__ import annotations

import calendar as _calendar
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta

import attrs

__all__ = [
    "AtTimes",
    "Window",
    "TimeExpression",
    "Calendar",
    "HORIZON_DAYS",
    "WEEKDAYS",
    "parse_time_expression",
    "parse_duration",
    "parse_date",
    "parse_date_bound",
    "parse_weekdays",
    "parse_month_days",
    "parse_annual_days",
    "resolve_calendars",
    "next_start",
    "next_starts",
    "missed_starts",
]

#: How far ahead :func:`next_start` looks: beyond eight years, so that a calendar allowing
#: only 29 February still finds its day (1900 and 2100 are not leap years).
HORIZON_DAYS = 8 * 366 + 1

#: Weekday names in the config, Sunday first as in SwiftMQ; the value is Python's weekday().
WEEKDAYS = {"sun": 6, "mon": 0, "tue": 1, "wed": 2, "thu": 3, "fri": 4, "sat": 5}

_WEEKDAY_NAMES = {
    **WEEKDAYS,
    "sunday": 6,
    "monday": 0,
    "tuesday": 1,
    "wednesday": 2,
    "thursday": 3,
    "friday": 4,
    "saturday": 5,
}
_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\Z")
_DURATION = re.compile(r"(\d+)\s*([hms])\Z")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})\Z")
_ANNUAL = re.compile(r"(\d{2})-(\d{2})\Z")
_UNITS = {"h": 3600, "m": 60, "s": 1}
DAY = 86_400


@attrs.frozen
class AtTimes:
    """``at …``: seconds after midnight, ascending, without repeats."""

    seconds: tuple[int, ...]


@attrs.frozen
class Window:
    """``start … stop … delay … [repeat …]``, all in seconds (``stop`` may be below start)."""

    start: int
    stop: int
    delay: int
    repeat: int | None = None

    @property
    def length(self) -> int:
        """Seconds the window is open: up to a whole day."""
        return (self.stop - self.start) % DAY or DAY

    @property
    def starts(self) -> int:
        """Starts per window: every delay strictly before it closes, at most ``repeat``."""
        count = -(-self.length // self.delay)
        return count if self.repeat is None else min(count, self.repeat)


TimeExpression = AtTimes | Window


def _parse_time(text: str, what: str) -> int:
    match = _TIME.match(text.strip())
    if match is None:
        raise ValueError(f"{what}: expected HH:mm or HH:mm:ss, found {text.strip()!r}")
    hours, minutes, seconds = int(match[1]), int(match[2]), int(match[3] or 0)
    if hours > 23 or minutes > 59 or seconds > 59:
        raise ValueError(f"{what}: {text.strip()!r} is not a time of day (00:00:00 to 23:59:59)")
    return hours * 3600 + minutes * 60 + seconds


def parse_duration(text: str) -> int:
    """``<n>h``, ``<n>m`` or ``<n>s`` in seconds (more than 0).

    Raises:
        ValueError: saying what was expected and what was found.
    """
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"expected <n>h, <n>m or <n>s, found {text!r}")
    seconds = int(match[1]) * _UNITS[match[2]]
    if seconds <= 0:
        raise ValueError(f"a duration must be more than 0, found {text!r}")
    return seconds


def parse_time_expression(text: str) -> TimeExpression:
    """Parse a time expression (see the module header).

    Raises:
        ValueError: naming the part that is wrong and what was expected there.
    """
    words = text.split()
    if not words:
        raise ValueError("empty time expression: expected 'at HH:mm[, …]' or 'start HH:mm stop HH:mm delay <n>h|m|s'")
    if words[0] == "at":
        parts = text.strip()[2:].split(",")
        if not "".join(parts).strip():
            raise ValueError("'at' needs at least one time, e.g. 'at 22:00, 06:30:15'")
        return AtTimes(tuple(sorted({_parse_time(part, "at") for part in parts})))
    if words[0] == "start":
        grammar = "start HH:mm[:ss] stop HH:mm[:ss] delay <n>h|m|s [repeat <n>]"
        if (
            len(words) not in (6, 8)
            or words[2] != "stop"
            or words[4] != "delay"
            or (len(words) == 8 and words[6] != "repeat")
        ):
            raise ValueError(f"expected {grammar!r}, found {text.strip()!r}")
        start, stop = _parse_time(words[1], "start"), _parse_time(words[3], "stop")
        try:
            delay = parse_duration(words[5])
        except ValueError as exc:
            raise ValueError(f"delay: {exc}") from None
        repeat = None
        if len(words) == 8:
            if not words[7].isdigit() or int(words[7]) < 1:
                raise ValueError(f"repeat: expected a whole number of starts, at least 1, found {words[7]!r}")
            repeat = int(words[7])
        return Window(start, stop, delay, repeat)
    raise ValueError(f"a time expression starts with 'at' or 'start', found {words[0]!r}")


def parse_date(text: str) -> date:
    """``yyyy-MM-dd``.

    Raises:
        ValueError: not such a date.
    """
    match = _DATE.match(text.strip())
    if match is None:
        raise ValueError(f"expected a date yyyy-MM-dd, found {text!r}")
    try:
        return date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a date: {exc}") from None


def parse_date_bound(text: str, open_word: str) -> date | None:
    """A date, or ``None`` for ``open_word`` (``now`` for date-from, ``forever`` for date-to).

    Raises:
        ValueError: neither.
    """
    if text.strip() == open_word:
        return None
    try:
        return parse_date(text)
    except ValueError as exc:
        raise ValueError(f"{exc} (or '{open_word}')") from None


def parse_weekdays(text: str) -> frozenset[int]:
    """Weekday names separated by spaces or commas (``mon tue``), as Python weekday numbers.

    Raises:
        ValueError: an unknown name.
    """
    days = set()
    for word in re.split(r"[\s,]+", text.strip().lower()):
        if word:
            if word not in _WEEKDAY_NAMES:
                raise ValueError(f"unknown weekday {word!r}; use {', '.join(WEEKDAYS)} (or the full names)")
            days.add(_WEEKDAY_NAMES[word])
    return frozenset(days)


def parse_month_days(text: str) -> tuple[frozenset[int], bool]:
    """Days of the month (``1 15 last``): the numbers, and whether ``last`` is among them.

    Raises:
        ValueError: not a number from 1 to 31 nor ``last``.
    """
    numbers, last = set(), False
    for word in re.split(r"[\s,]+", text.strip().lower()):
        if word == "last":
            last = True
        elif word:
            if not word.isdigit() or not 1 <= int(word) <= 31:
                raise ValueError(f"a day of the month is 1 to 31 or 'last', found {word!r}")
            numbers.add(int(word))
    return frozenset(numbers), last


def parse_annual_days(text: str) -> frozenset[tuple[int, int]]:
    """Days of the year as ``MM-dd`` (``12-25 01-01``), as (month, day) pairs.

    Raises:
        ValueError: not a day that exists in some year (``02-29`` does, ``02-30`` not).
    """
    days = set()
    for word in re.split(r"[\s,]+", text.strip()):
        if word:
            match = _ANNUAL.match(word)
            if match is None:
                raise ValueError(f"a day of the year is MM-dd, e.g. 12-25, found {word!r}")
            month, day = int(match[1]), int(match[2])
            if not 1 <= month <= 12 or not 1 <= day <= _calendar.monthrange(2000, month)[1]:
                raise ValueError(f"{word!r} is no day of any year")
            days.add((month, day))
    return frozenset(days)


@attrs.frozen
class Calendar:
    """Which days a schedule may run on (see the module header).

    Attributes:
        include: True for an include calendar, False for an exclude calendar.
        weekdays: Python weekday numbers (Monday 0).
        month_days: days of the month; ``last_day`` adds each month's last day.
        annual_days: (month, day) pairs.
        date_ranges: (first, last) pairs, both days included.
        base: the calendar below this one, if any.
    """

    include: bool = True
    weekdays: frozenset[int] = frozenset()
    month_days: frozenset[int] = frozenset()
    last_day: bool = False
    annual_days: frozenset[tuple[int, int]] = frozenset()
    date_ranges: tuple[tuple[date, date], ...] = ()
    base: Calendar | None = None

    def selects(self, day: date) -> bool:
        """Whether one of this calendar's own parts names ``day``."""
        return (
            day.weekday() in self.weekdays
            or day.day in self.month_days
            or (self.last_day and day.day == _calendar.monthrange(day.year, day.month)[1])
            or (day.month, day.day) in self.annual_days
            or any(first <= day <= last for first, last in self.date_ranges)
        )

    def allows(self, day: date) -> bool:
        """Whether a schedule on this calendar may run on ``day``."""
        if self.base is not None and not self.base.allows(day):
            return False
        return self.selects(day) == self.include


def resolve_calendars(
    definitions: Mapping[str, Callable[[Calendar | None], Calendar]], bases: Mapping[str, str]
) -> dict[str, Calendar | str]:
    """Build every calendar with its chain of bases.

    ``definitions[name](base)`` builds calendar ``name`` on top of its resolved ``base``;
    ``bases[name]`` names its base calendar ("" for none). A calendar that cannot be built
    maps to the reason instead: a base calendar that does not exist, or a cycle (each
    calendar on the cycle, and each one resting on it, gets the reason).
    """
    built: dict[str, Calendar | str] = {}

    def build(name: str, chain: tuple[str, ...]) -> Calendar | str:
        if name in built:
            return built[name]
        if name in chain:
            return f"calendars form a cycle through base-calendar: {' -> '.join((*chain, name))}"
        base_name = bases.get(name, "")
        base: Calendar | str | None = None
        if base_name:
            if base_name not in definitions:
                base = f"calendar {name!r}: base-calendar {base_name!r} does not exist"
            else:
                base = build(base_name, (*chain, name))
        built[name] = base if isinstance(base, str) else definitions[name](base)
        return built[name]

    return {name: build(name, ()) for name in definitions}  # in the order defined


def _first_after(expression: TimeExpression, day: date, after: datetime) -> datetime | None:
    """The first start of ``day``'s window (or at-times) strictly after ``after``; O(1) for
    a window, whatever its delay."""
    midnight = datetime.combine(day, time())
    if isinstance(expression, AtTimes):
        return next((t for t in (midnight + timedelta(seconds=s) for s in expression.seconds) if t > after), None)
    opens = midnight + timedelta(seconds=expression.start)
    index = 0
    if after >= opens:
        index = int((after - opens).total_seconds()) // expression.delay + 1
    return opens + timedelta(seconds=index * expression.delay) if index < expression.starts else None


def next_start(
    expression: TimeExpression,
    after: datetime,
    *,
    allows: Callable[[date], bool] | None = None,
    first_day: date | None = None,
    last_day: date | None = None,
) -> datetime | None:
    """The first start strictly after ``after`` (naive local time), or ``None``.

    ``allows`` is the calendar's test (every day when ``None``); ``first_day`` and
    ``last_day`` bound the days a window may open on (both included; ``None``: open).
    Looks :data:`HORIZON_DAYS` ahead at most.
    """
    day = after.date() - timedelta(days=1)  # yesterday's window may still be open
    if first_day is not None and day < first_day:
        day = first_day
    end = after.date() + timedelta(days=HORIZON_DAYS)
    if last_day is not None and last_day < end:
        end = last_day
    while day <= end:
        if allows is None or allows(day):
            found = _first_after(expression, day, after)
            if found is not None:
                return found
        day += timedelta(days=1)
    return None


def next_starts(expression: TimeExpression, after: datetime, count: int, **bounds: object) -> list[datetime]:
    """The next ``count`` starts after ``after`` (fewer if there are no more); the
    keyword arguments are :func:`next_start`'s."""
    found: list[datetime] = []
    while len(found) < count:
        start = next_start(expression, after, **bounds)  # type: ignore[arg-type]
        if start is None:
            break
        found.append(start)
        after = start
    return found


def missed_starts(
    expression: TimeExpression, since: datetime, until: datetime, limit: int, **bounds: object
) -> tuple[list[datetime], int]:
    """Starts in (``since``, ``until``]: the last ``limit`` of them and how many in all."""
    kept: list[datetime] = []
    total = 0
    after = since
    while True:
        start = next_start(expression, after, **bounds)  # type: ignore[arg-type]
        if start is None or start > until:
            return kept, total
        total += 1
        kept = (kept + [start])[-limit:] if limit > 0 else []
        after = start
