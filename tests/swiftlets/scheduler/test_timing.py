"""sys$scheduler's pure parts: time expressions, calendars, next start, and their config errors.

Table-driven cases name the rule they check. Against an independent reference — one that
reads a calendar's config words and decides each day with date arithmetic of its own, and
walks minute by minute asking whether each minute *is* a start — two tests check schedules
configured the way an operator does (config objects, ``build_plans``, the plan's next start):
every calendar rule alone on every day of ten years and of 2099-2101, and Hypothesis over
random expressions (windows over midnight included), calendars (with bases) and date
ranges, from instants biased towards month ends.
"""

from __future__ import annotations

import functools
from datetime import date, datetime, time, timedelta

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.kernel import ConfigErrors, load_config, load_swiftlet_specs
from martinet.swiftlets.scheduler.config import (
    CalendarConfig,
    CalendarType,
    DateRange,
    ScheduleConfig,
    SchedulerConfig,
)
from martinet.swiftlets.scheduler.plans import Plan, build_plans
from martinet.swiftlets.scheduler.timing import (
    HORIZON_DAYS,
    AtTimes,
    Calendar,
    Window,
    missed_starts,
    next_start,
    next_starts,
    parse_annual_days,
    parse_duration,
    parse_month_days,
    parse_time_expression,
    parse_weekdays,
    resolve_calendars,
)

D = datetime  # brevity in tables

# -- parsing ----------------------------------------------------------------------------------

GOOD_EXPRESSIONS = [
    ("at 22:00", AtTimes((79200,))),
    ("at 06:30:15, 22:00,06:30:15", AtTimes((23415, 79200))),  # sorted, repeats dropped
    ("at 0:05", AtTimes((300,))),
    ("start 22:00 stop 02:00 delay 1h", Window(79200, 7200, 3600)),
    ("start 09:00 stop 17:00 delay 30m repeat 16", Window(32400, 61200, 1800, 16)),
    ("start 00:00 stop 00:00 delay 10s", Window(0, 0, 10)),
]


@pytest.mark.parametrize(("text", "expected"), GOOD_EXPRESSIONS, ids=[c[0] for c in GOOD_EXPRESSIONS])
def test_time_expressions_parse(text, expected):
    assert parse_time_expression(text) == expected


BAD_EXPRESSIONS = [
    ("", "empty time expression"),
    ("at", "'at' needs at least one time"),
    ("at 24:00", "at: '24:00' is not a time of day"),
    ("at 12:60", "is not a time of day"),
    ("at noon", "at: expected HH:mm or HH:mm:ss, found 'noon'"),
    ("at 10:00,", "at: expected HH:mm or HH:mm:ss, found ''"),
    ("every 5m", "a time expression starts with 'at' or 'start', found 'every'"),
    ("start 10:00 stop 11:00", "expected 'start HH:mm[:ss] stop HH:mm[:ss] delay <n>h|m|s [repeat <n>]'"),
    ("start 10:00 until 11:00 delay 5m", "expected 'start HH:mm"),
    ("start 10:00 stop 11:00 delay 5d", "delay: expected <n>h, <n>m or <n>s, found '5d'"),
    ("start 10:00 stop 11:00 delay 0s", "delay: a duration must be more than 0"),
    ("start 10:00 stop 11:00 delay 5m repeat 0", "repeat: expected a whole number of starts, at least 1"),
    ("start 25:00 stop 11:00 delay 5m", "start: '25:00' is not a time of day"),
]


@pytest.mark.parametrize(("text", "message"), BAD_EXPRESSIONS, ids=[c[0] or "empty" for c in BAD_EXPRESSIONS])
def test_bad_time_expressions_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace("|", r"\|")):
        parse_time_expression(text)


def test_durations_days_and_dates_parse():
    assert [parse_duration(t) for t in ("2h", "90m", "15s")] == [7200, 5400, 15]
    assert parse_weekdays("sun Monday, fri") == {6, 0, 4}
    assert parse_month_days("1 15 last") == ({1, 15}, True)
    assert parse_annual_days("02-29 12-25") == {(2, 29), (12, 25)}
    for call, text, message in [
        (parse_weekdays, "mon funday", "unknown weekday 'funday'"),
        (parse_month_days, "0", "1 to 31 or 'last'"),
        (parse_annual_days, "02-30", "no day of any year"),
        (parse_annual_days, "2-3", "MM-dd"),
    ]:
        with pytest.raises(ValueError, match=message):
            call(text)


# -- next start: tables -----------------------------------------------------------------------

WEEKDAYS_ONLY = Calendar(weekdays=frozenset(range(5)))
LAST_DAY = Calendar(last_day=True)
HOLIDAYS_OFF = Calendar(include=False, annual_days=frozenset({(12, 25)}), base=WEEKDAYS_ONLY)

NEXT_CASES = [
    # (id, expression, after, keyword bounds, expected)
    ("at-later-today", "at 10:00, 22:00", D(2026, 3, 2, 12, 0), {}, D(2026, 3, 2, 22, 0)),
    ("at-strictly-after", "at 22:00", D(2026, 3, 2, 22, 0), {}, D(2026, 3, 3, 22, 0)),
    ("window-first-start", "start 22:00 stop 02:00 delay 1h", D(2026, 3, 2, 12, 0), {}, D(2026, 3, 2, 22, 0)),
    ("window-after-midnight", "start 22:00 stop 02:00 delay 1h", D(2026, 3, 3, 0, 30), {}, D(2026, 3, 3, 1, 0)),
    ("window-stop-excluded", "start 22:00 stop 02:00 delay 1h", D(2026, 3, 3, 1, 0), {}, D(2026, 3, 3, 22, 0)),
    ("window-repeat-caps", "start 09:00 stop 17:00 delay 1h repeat 2", D(2026, 3, 2, 10, 0), {}, D(2026, 3, 3, 9, 0)),
    ("window-whole-day", "start 00:00 stop 00:00 delay 8h", D(2026, 3, 2, 16, 0), {}, D(2026, 3, 3, 0, 0)),
    # A window belongs to the day it opens: Friday's window runs into Saturday, Saturday's never opens.
    (
        "window-calendar-judges-opening-day",
        "start 23:00 stop 01:00 delay 30m",
        D(2026, 3, 7, 0, 10),
        {"allows": WEEKDAYS_ONLY.allows},
        D(2026, 3, 7, 0, 30),
    ),
    (
        "window-calendar-skips-weekend",
        "start 23:00 stop 01:00 delay 30m",
        D(2026, 3, 7, 0, 40),
        {"allows": WEEKDAYS_ONLY.allows},
        D(2026, 3, 9, 23, 0),
    ),
    ("last-day-of-february", "at 08:00", D(2026, 2, 1), {"allows": LAST_DAY.allows}, D(2026, 2, 28, 8, 0)),
    ("last-day-leap-year", "at 08:00", D(2028, 2, 1), {"allows": LAST_DAY.allows}, D(2028, 2, 29, 8, 0)),
    ("last-day-of-a-31-day-month", "at 08:00", D(2026, 2, 28, 9), {"allows": LAST_DAY.allows}, D(2026, 3, 31, 8, 0)),
    (
        "leap-day-only",
        "at 08:00",
        D(2026, 3, 1),
        {"allows": Calendar(annual_days=frozenset({(2, 29)})).allows},
        D(2028, 2, 29, 8, 0),
    ),
    ("base-calendar-chain", "at 08:00", D(2026, 12, 24, 9), {"allows": HOLIDAYS_OFF.allows}, D(2026, 12, 28, 8, 0)),
    ("date-from-in-future", "at 08:00", D(2026, 3, 2), {"first_day": date(2026, 4, 1)}, D(2026, 4, 1, 8, 0)),
    ("date-to-passed", "at 08:00", D(2026, 3, 2, 9), {"last_day": date(2026, 3, 2)}, None),
    (
        "date-to-keeps-its-window",
        "start 23:00 stop 01:00 delay 1h",
        D(2026, 3, 2, 23, 30),
        {"last_day": date(2026, 3, 2)},
        D(2026, 3, 3, 0, 0),
    ),
    ("calendar-allows-nothing", "at 08:00", D(2026, 3, 2), {"allows": Calendar().allows}, None),
    (
        "calendar-date-range-includes-its-last-day",
        "at 08:00",
        D(2026, 3, 3, 9),
        {"allows": Calendar(date_ranges=((date(2026, 3, 2), date(2026, 3, 4)),)).allows},
        D(2026, 3, 4, 8, 0),
    ),
]


@pytest.mark.parametrize(
    ("expression", "after", "bounds", "expected"), [c[1:] for c in NEXT_CASES], ids=[c[0] for c in NEXT_CASES]
)
def test_next_start(expression, after, bounds, expected):
    assert next_start(parse_time_expression(expression), after, **bounds) == expected


def test_next_starts_and_missed_starts():
    expression = parse_time_expression("at 06:00, 18:00")
    assert next_starts(expression, D(2026, 1, 31, 12), 3) == [D(2026, 1, 31, 18), D(2026, 2, 1, 6), D(2026, 2, 1, 18)]
    kept, total = missed_starts(expression, D(2026, 1, 1, 7), D(2026, 1, 3, 6), limit=2)
    assert (kept, total) == ([D(2026, 1, 2, 18), D(2026, 1, 3, 6)], 4)


def test_calendar_chains_refuse_unknown_bases_and_cycles():
    def plain(base):
        return Calendar(weekdays=frozenset({0}), base=base)

    built = resolve_calendars(
        {"a": plain, "b": plain, "c": plain, "d": plain}, {"a": "b", "b": "a", "c": "nope", "d": ""}
    )
    assert built["a"] == "calendars form a cycle through base-calendar: a -> b -> a"
    assert built["b"] == "calendars form a cycle through base-calendar: a -> b -> a"
    assert built["c"] == "calendar 'c': base-calendar 'nope' does not exist"
    assert built["d"] == plain(None)


# -- next start against an independent reference ------------------------------------------------
#
# The reference decides everything itself: which days a calendar allows (from the calendar's
# config text, with date arithmetic of its own) and which minutes are starts. The scheduler's
# side goes the way a configured schedule goes: config objects -> build_plans -> next_start.
# A reference that asked the scheduler's Calendar which days it allows would agree with any
# bug in it.

#: A day known to be a Sunday (checked against strftime below): weekdays are counted from it.
_A_SUNDAY = date(2024, 1, 7)
_DAY_NAMES = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
assert _A_SUNDAY.strftime("%A").lower() == _DAY_NAMES[0]


@attrs.frozen
class CalendarSpec:
    """A calendar as an operator writes it: words, numbers and ISO dates, a base below it."""

    include: bool = True
    weekdays: tuple[str, ...] = ()  # as written: "mon", "Friday", …
    month_days: tuple[str, ...] = ()  # "1" … "31", "last"
    annual_days: tuple[str, ...] = ()  # "MM-dd"
    date_ranges: tuple[tuple[str, str], ...] = ()  # ("yyyy-MM-dd", "yyyy-MM-dd"), both included
    base: CalendarSpec | None = None

    def reference_allows(self, day: date) -> bool:
        """The reference: whether ``day`` is allowed, from the words alone."""
        if self.base is not None and not self.base.reference_allows(day):
            return False
        name = _DAY_NAMES[(day - _A_SUNDAY).days % 7]
        written = {word.lower() for word in self.weekdays}
        selected = (
            name in written
            or name[:3] in written
            or str(day.day) in self.month_days
            or ("last" in self.month_days and (day + timedelta(days=1)).day == 1)
            or f"{day.month:02d}-{day.day:02d}" in self.annual_days
            or any(first <= day.isoformat() <= last for first, last in self.date_ranges)
        )
        return selected if self.include else not selected

    def configs(self, name: str) -> dict[str, CalendarConfig]:
        """This calendar and its bases as config objects (``name``, ``name-base``, …)."""
        below = self.base.configs(f"{name}-base") if self.base is not None else {}
        config = CalendarConfig(
            name=name,
            type=CalendarType.INCLUDE if self.include else CalendarType.EXCLUDE,
            base_calendar=f"{name}-base" if self.base is not None else "",
            weekdays=" ".join(self.weekdays),
            month_days=", ".join(self.month_days),
            annual_days=" ".join(self.annual_days),
            date_ranges={
                f"r{i}": DateRange(name=f"r{i}", date_from=first, date_to=last)
                for i, (first, last) in enumerate(self.date_ranges)
            },
        )
        return {name: config, **below}


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _expression_text(expression) -> str:
    """The config text of an expression drawn as numbers (the reference reads the numbers)."""
    if isinstance(expression, AtTimes):
        return "at " + ", ".join(_clock(s) for s in expression.seconds)
    text = f"start {_clock(expression.start)} stop {_clock(expression.stop)} delay {expression.delay // 60}m"
    return text if expression.repeat is None else f"{text} repeat {expression.repeat}"


def _plan(expression, calendar: CalendarSpec | None, first: date | None = None, last: date | None = None) -> Plan:
    """The scheduler's plan for a schedule configured with these values."""
    schedule = ScheduleConfig(
        name="s",
        job_group="g",
        job_name="j",
        time_expression=_expression_text(expression),
        calendar="c" if calendar is not None else "",
        date_from=first.isoformat() if first is not None else "now",
        date_to=last.isoformat() if last is not None else "forever",
    )
    calendars = calendar.configs("c") if calendar is not None else {}
    plan = build_plans(SchedulerConfig(calendars=calendars, schedules={"s": schedule}))["s"]
    assert isinstance(plan, Plan), plan
    return plan


def _is_start(expression, moment: datetime, day_ok) -> bool:
    """Whether ``moment`` is a start: asked of the windows of its own day and the day before."""
    for opening in (moment.date(), moment.date() - timedelta(days=1)):
        if not day_ok(opening):
            continue
        offset = (moment - datetime.combine(opening, time())).total_seconds()
        if isinstance(expression, AtTimes):
            if opening == moment.date() and offset in expression.seconds:
                return True
            continue
        since_open = offset - expression.start
        length = (expression.stop - expression.start) % 86400 or 86400
        if (
            0 <= since_open < length
            and since_open % expression.delay == 0
            and (expression.repeat is None or since_open // expression.delay < expression.repeat)
        ):
            return True
    return False


def _brute_force(expression, after: datetime, day_ok, minutes: int) -> datetime | None:
    moment = after.replace(second=0, microsecond=0)
    for _ in range(minutes + 1):
        moment += timedelta(minutes=1)
        if _is_start(expression, moment, day_ok):
            return moment
    return None


# Every rule of a calendar alone, on every day of ten years (three leap years, every weekday
# on every day of every month) and of 2099-2101 (2100 is not a leap year): each rule is
# checked everywhere, not where a random draw happened to land.
SPANS = [(date(2023, 1, 1), date(2032, 12, 31)), (date(2099, 11, 1), date(2101, 3, 31))]
NOON = AtTimes((12 * 3600,))
_RANGES = (("2024-02-27", "2024-03-02"), ("2028-12-31", "2028-12-31"), ("2100-02-27", "2100-03-01"))
EVERY_RULE = [
    *[(f"weekday-{n}", CalendarSpec(weekdays=(n,))) for n in ("sun", "mon", "tue", "wed", "thu", "fri", "sat")],
    ("weekdays-full-names", CalendarSpec(weekdays=("Monday", "WEDNESDAY", "saturday"))),
    *[(f"month-day-{d}", CalendarSpec(month_days=(str(d),))) for d in range(1, 32)],
    ("last-day", CalendarSpec(month_days=("last",))),
    ("last-day-and-30", CalendarSpec(month_days=("30", "last"))),
    ("annual-days", CalendarSpec(annual_days=("01-01", "02-28", "02-29", "03-01", "12-31"))),
    ("date-ranges", CalendarSpec(date_ranges=_RANGES)),
    ("exclude-weekend-and-last-day", CalendarSpec(include=False, weekdays=("sat", "sun"), month_days=("last",))),
    (
        "exclude-holidays-from-working-days",
        CalendarSpec(
            include=False,
            annual_days=("12-25", "01-01"),
            date_ranges=(("2026-08-03", "2026-08-14"),),
            base=CalendarSpec(weekdays=("mon", "tue", "wed", "thu", "fri")),
        ),
    ),
    (
        "three-deep-chain",
        CalendarSpec(
            month_days=("1", "15", "last"),
            base=CalendarSpec(
                include=False, weekdays=("sun",), base=CalendarSpec(include=False, annual_days=("02-29",))
            ),
        ),
    ),
]


@pytest.mark.parametrize("calendar", [c[1] for c in EVERY_RULE], ids=[c[0] for c in EVERY_RULE])
def test_each_calendar_rule_allows_exactly_the_days_the_reference_allows(calendar):
    plan = _plan(NOON, calendar)
    for first, last in SPANS:
        since = datetime.combine(first - timedelta(days=1), time(23))
        until = datetime.combine(last, time(23))
        starts, total = missed_starts(plan.expression, since, until, limit=10_000, **plan.bounds())
        assert total == len(starts)
        expected = [
            datetime.combine(first + timedelta(days=n), time(12))
            for n in range((last - first).days + 1)
            if calendar.reference_allows(first + timedelta(days=n))
        ]
        assert starts == expected


minutes_of_day = st.integers(0, 1439).map(lambda m: m * 60)
expressions = st.one_of(
    st.builds(lambda times: AtTimes(tuple(sorted(set(times)))), st.lists(minutes_of_day, min_size=1, max_size=4)),
    st.builds(
        Window,
        minutes_of_day,
        minutes_of_day,
        st.sampled_from([1, 5, 7, 45, 60, 90, 300, 1440]).map(lambda m: m * 60),
        st.one_of(st.none(), st.integers(1, 12)),
    ),
)


@st.composite
def instants(draw):
    year = draw(st.integers(2023, 2030))
    month = draw(st.integers(1, 12))
    last = (date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)).day
    day = draw(st.one_of(st.integers(1, last), st.integers(max(1, last - 2), last)))  # month ends often
    return datetime(year, month, day, draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 59)))


WEEKDAY_WORDS = [*(n[:3] for n in _DAY_NAMES), *_DAY_NAMES, "Mon", "FRIDAY"]


@st.composite
def calendars(draw, around: date, depth: int = 1):
    def day_text(shift: int) -> str:
        return (around + timedelta(days=shift)).isoformat()

    ranges = []
    for _ in range(draw(st.integers(0, 2))):
        start = draw(st.integers(-3, 3))
        ranges.append((day_text(start), day_text(start + draw(st.integers(0, 2)))))
    near = [(around + timedelta(days=d)).strftime("%m-%d") for d in range(-1, 4)]
    return CalendarSpec(
        include=draw(st.booleans()),
        weekdays=tuple(draw(st.lists(st.sampled_from(WEEKDAY_WORDS), max_size=4))),
        month_days=tuple(draw(st.lists(st.sampled_from(["1", "2", "15", "28", "29", "30", "31", "last"]), max_size=3))),
        annual_days=tuple(
            draw(st.lists(st.sampled_from(["01-01", "02-28", "02-29", "03-01", "12-31", *near]), max_size=2))
        ),
        date_ranges=tuple(ranges),
        base=draw(st.one_of(st.none(), calendars(around, depth - 1))) if depth > 0 else None,
    )


@st.composite
def cases(draw):
    expression = draw(expressions)
    after = draw(instants())
    mode = draw(st.sampled_from(["anywhere", "near-a-start", "past-midnight"]))
    if mode == "past-midnight":  # inside the part of yesterday's window after midnight
        opens = draw(st.integers(720, 1439)) * 60
        expression = Window(
            opens,
            draw(st.integers(1, 720)) * 60,
            draw(st.sampled_from([5, 30, 60, 120])) * 60,
            draw(st.one_of(st.none(), st.integers(2, 40))),
        )
        second = draw(st.integers(0, expression.stop - 1))
    elif mode == "near-a-start":
        if isinstance(expression, AtTimes):
            near = draw(st.sampled_from(expression.seconds))
        else:
            near = expression.start + draw(
                st.one_of(st.integers(0, 6).map(lambda k: k * expression.delay), st.integers(0, expression.length))
            )
        second = (near + draw(st.integers(-90, 90))) % 86400
    if mode != "anywhere":
        after = datetime.combine(after.date(), time(second // 3600, second // 60 % 60, second % 60))
    calendar = draw(st.one_of(st.none(), calendars(after.date())))
    first = draw(st.one_of(st.none(), st.integers(-2, 2).map(lambda d: after.date() + timedelta(days=d))))
    last = draw(st.one_of(st.none(), st.integers(-2, 4).map(lambda d: after.date() + timedelta(days=d))))
    if first is not None and last is not None and last < first:
        first, last = last, first  # an empty date range is a config error, not a plan
    return expression, after, calendar, first, last


SEARCH_DAYS = 4


@settings(max_examples=150, deadline=None)
@given(cases())
def test_next_start_matches_a_minute_by_minute_reference(case):
    expression, after, calendar, first, last = case

    @functools.cache
    def day_ok(day: date) -> bool:
        return (
            (calendar is None or calendar.reference_allows(day))
            and (first is None or day >= first)
            and (last is None or day <= last)
        )

    expected = _brute_force(expression, after, day_ok, SEARCH_DAYS * 1440)
    found = _plan(expression, calendar, first, last).next_after(after)
    if expected is not None:
        assert found == expected
    else:  # nothing within the reference's reach: none at all, or later
        assert found is None or found > after + timedelta(days=SEARCH_DAYS)
        assert found is None or found <= after + timedelta(days=HORIZON_DAYS + 1)


# -- config: a mistake is reported with file:line ------------------------------------------------

SCHEDULER = '<router name="r1" startorder="sys$scheduler">\n<swiftlet name="sys$scheduler"{}>\n'

CONFIG_CASES = [
    (
        "bad-expression",
        '<schedules>\n<schedule name="s" job-group="g" job-name="j" time-expression="at 25:00"/>\n</schedules>',
        4,
        "time-expression",
        "at: '25:00' is not a time of day",
    ),
    (
        "bad-max-runtime",
        '<schedules>\n\n<schedule name="s" job-group="g" job-name="j" time-expression="at 01:00" '
        'max-runtime="2d"/></schedules>',
        5,
        "max-runtime",
        "expected <n>h, <n>m or <n>s, found '2d'",
    ),
    (
        "bad-date-from",
        '<schedules>\n<schedule name="s" job-group="g" job-name="j" time-expression="at 01:00" '
        'date-from="tomorrow"/></schedules>',
        4,
        "date-from",
        "expected a date yyyy-MM-dd, found 'tomorrow' (or 'now')",
    ),
    (
        "impossible-date-to",
        '<schedules><schedule name="s" job-group="g" job-name="j" time-expression="at 01:00" '
        'date-to="2026-02-30"/></schedules>',
        3,
        "date-to",
        "'2026-02-30' is not a date",
    ),
    (
        "bad-weekday",
        '<calendars>\n<calendar name="c" weekdays="mon fry"/></calendars>',
        4,
        "weekdays",
        "unknown weekday 'fry'",
    ),
    (
        "bad-date-range",
        '<calendars><calendar name="c"><date-ranges>\n<date-range name="x" date-from="2026-1-1" '
        'date-to="2026-01-02"/></date-ranges></calendar></calendars>',
        4,
        "date-from",
        "expected a date yyyy-MM-dd",
    ),
    ("unknown-zone", "", 2, "time-zone", "unknown time zone 'Mars/Olympus'"),
]


@pytest.mark.parametrize(
    ("body", "line", "attribute", "message"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_config_mistakes_are_reported_with_file_and_line(write_config, body, line, attribute, message):
    head = SCHEDULER.format(' time-zone="Mars/Olympus"' if attribute == "time-zone" else "")
    path = write_config(f"{head}{body}</swiftlet></router>")
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, load_swiftlet_specs())
    errors = caught.value.errors
    assert len(errors) == 1, str(caught.value)
    assert (errors[0].line, errors[0].attribute) == (line, attribute)
    assert message in errors[0].message
    assert str(errors[0]).startswith(f"{path}:{line}: /router[@name='r1']/swiftlet[@name='sys$scheduler']")


def test_a_config_object_with_a_bad_expression_cannot_exist():
    with pytest.raises(ValueError, match="a time expression starts with 'at' or 'start'"):
        ScheduleConfig(name="s", job_group="g", job_name="j", time_expression="soon")
