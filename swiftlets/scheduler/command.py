"""``martinet schedule next CONFIG [--count N] [--from TIME]``: the next planned starts of every
schedule of a config, without starting a router, so an operator can check an expression,
a calendar or a date range before deploying it.

It reads the config as ``martinet check`` does (every mistake with file:line, exit 2), asks
the installed plugins for their jobs (as the scheduler does when it starts) and prints, per
schedule, its job and the next ``N`` starts in the scheduler's time zone; a schedule that
could not run (unknown calendar or job, bad parameters) is reported with the file:line of its
element and makes the exit status 2. Disabled schedules are shown too, marked so.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from lxml import etree

from martinet.kernel import Command, ConfigErrors, PluginError, load_config, load_plugins
from martinet.kernel.xmlconfig import element_path

from .config import SchedulerConfig
from .plans import Plan, Zone, build_calendars, job_problem, plan_of

__all__ = ["SCHEDULE_COMMAND"]

EXIT_OK, EXIT_INVALID = 0, 2


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 10000, found {text!r}")
    return int(text)


def _configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="schedule_command", required=True)
    upcoming = actions.add_parser("next", help="print the next planned starts of every schedule of a config")
    upcoming.add_argument("config", type=Path, help="router config file")
    upcoming.add_argument("--count", type=_count, default=5, help="starts per schedule (default 5)")
    upcoming.add_argument(
        "--from",
        dest="start",
        default=None,
        metavar="TIME",
        help="count from this local time, yyyy-MM-ddTHH:mm[:ss] (default: now)",
    )


def _locations(path: Path) -> dict[str, tuple[int, str]]:
    """Each schedule element's line and path in the file, by schedule name."""
    root = etree.parse(str(path), etree.XMLParser(resolve_entities=False, no_network=True)).getroot()
    return {
        el.get("name"): (el.sourceline, element_path(el))
        for el in root.iterfind("swiftlet[@name='sys$scheduler']/schedules/schedule")
    }


def next_runs(path: Path, count: int, start: str | None, out=sys.stdout, err=sys.stderr) -> int:
    """Print the next ``count`` starts of every schedule in the config at ``path``; the exit
    status (2 when the config, or a schedule in it, is invalid)."""
    try:
        plugins = load_plugins()
        config = load_config(path, plugins.specs, hook=plugins.hook)
    except (ConfigErrors, PluginError) as exc:
        print(exc, file=err)
        return EXIT_INVALID
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror}", file=err)
        return EXIT_INVALID
    section = config.swiftlets.get("sys$scheduler")
    if section is None:
        print(f"{path}: no sys$scheduler: nothing is scheduled", file=err)
        return EXIT_INVALID
    scheduler: SchedulerConfig = section.config
    zone = Zone.named(scheduler.time_zone)
    try:
        after = datetime.fromisoformat(start) if start else zone.local(datetime.now(UTC))
    except ValueError:
        print(f"--from: expected yyyy-MM-ddTHH:mm[:ss], found {start!r}", file=err)
        return EXIT_INVALID
    groups = {group.name: group for offered in plugins.hook.martinet_scheduler_jobs() for group in offered}
    calendars = build_calendars(scheduler.calendars)
    locations = _locations(path)
    print(
        f"router {config.settings.name}: schedules from {after.isoformat(sep=' ', timespec='seconds')} "
        f"({zone.name} time)",
        file=out,
    )
    invalid = 0
    for name, schedule in scheduler.schedules.items():
        plan = plan_of(schedule, calendars)
        problem = plan if isinstance(plan, str) else job_problem(schedule, groups)
        if problem:
            line, where = locations.get(name, (None, f"/sys$scheduler/schedules/{name}"))
            print(f"{path}:{line}: {where}: {problem}", file=err)
            invalid += 1
            continue
        assert isinstance(plan, Plan)
        notes = [f"max-runtime {schedule.max_runtime}"] if schedule.max_runtime else []
        if not schedule.enabled:
            notes.append("disabled")
        print(
            f"{name}: {schedule.job_group} / {schedule.job_name}" + (f" ({', '.join(notes)})" if notes else ""),
            file=out,
        )
        starts = plan.next_after_many(after, count)
        for moment in starts:
            print(f"  {moment:%a %Y-%m-%d %H:%M:%S}", file=out)
        if len(starts) < count:
            print("  (no further start)", file=out)
    return EXIT_INVALID if invalid else EXIT_OK


SCHEDULE_COMMAND = Command(
    name="schedule",
    help="scheduler tools: 'schedule next CONFIG' prints the next planned starts",
    configure=_configure,
    run=lambda args: next_runs(args.config, args.count, args.start),
)
