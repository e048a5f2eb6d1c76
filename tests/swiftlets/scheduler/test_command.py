"""``martinet schedule next CONFIG``: the next planned starts, without starting a router."""

from __future__ import annotations

import subprocess
import sys

import pytest

CONFIG = """
<router name="r1" startorder="sys$scheduler">
  <swiftlet name="sys$scheduler" time-zone="Europe/Zurich">
    <calendars>
      <calendar name="business-days" weekdays="mon tue wed thu fri"/>
      <calendar name="holidays" type="exclude" annual-days="12-25 12-26 01-01" base-calendar="business-days"/>
    </calendars>
    <schedules>
      <schedule name="branch-office-link" enabled="true" calendar="holidays" job-group="Routing"
                job-name="Routing Connector" time-expression="at 22:00" max-runtime="4h">
        <parameters><parameter name="Connector Name" value="acme"/></parameters>
      </schedule>
      <schedule name="night-window" job-group="Routing" job-name="Routing Connector"
                time-expression="start 23:30 stop 00:30 delay 20m" date-to="2026-12-25">
        <parameters><parameter name="Connector Name" value="acme"/></parameters>
      </schedule>
      {extra}
    </schedules>
  </swiftlet>
</router>
"""


def schedule_next(path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "schedule", "next", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_next_starts_of_every_schedule_are_printed(write_config):
    done = schedule_next(write_config(CONFIG.format(extra="")), "--count", "4", "--from", "2026-12-24T12:00")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "router r1: schedules from 2026-12-24 12:00:00 (Europe/Zurich time)",
        "branch-office-link: Routing / Routing Connector (max-runtime 4h)",
        "  Thu 2026-12-24 22:00:00",
        "  Mon 2026-12-28 22:00:00",  # Christmas and Boxing Day excluded, then the weekend
        "  Tue 2026-12-29 22:00:00",
        "  Wed 2026-12-30 22:00:00",
        "night-window: Routing / Routing Connector (disabled)",
        "  Thu 2026-12-24 23:30:00",
        "  Thu 2026-12-24 23:50:00",
        "  Fri 2026-12-25 00:10:00",
        "  Fri 2026-12-25 23:30:00",
    ]


@pytest.mark.parametrize(
    ("group", "job", "problem"),
    [
        (
            "Routing",
            "Routing Conector",
            "attribute 'job-name': job group 'Routing' has no job 'Routing Conector' (jobs: Routing Connector)",
        ),  # a config error, as martinet check and martinet run report it
        ("Routng", "Routing Connector", "no job group 'Routng' registered (groups: "),  # the router would start
    ],
)
def test_a_schedule_that_cannot_run_is_reported_with_its_line(write_config, group, job, problem):
    extra = f'<schedule name="typo" job-group="{group}" job-name="{job}" time-expression="at 01:00"/>'
    path = write_config(CONFIG.format(extra=extra))
    done = schedule_next(path, "--from", "2026-12-24T12:00")
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"{path}:16: /router[@name='r1']/swiftlet[@name='sys$scheduler']/schedules/schedule[@name='typo']: " + problem
    )


def test_a_bad_expression_is_reported_with_file_and_line(write_config):
    extra = '<schedule name="bad" job-group="Routing" job-name="Routing Connector" time-expression="at 7pm"/>'
    path = write_config(CONFIG.format(extra=extra))
    done = schedule_next(path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"{path}:16: /router[@name='r1']/swiftlet[@name='sys$scheduler']/schedules/schedule[@name='bad']: "
        "attribute 'time-expression': at: expected HH:mm or HH:mm:ss, found '7pm'"
    )


def test_a_bad_count_is_refused(write_config):
    done = schedule_next(write_config(CONFIG.format(extra="")), "--count", "0")
    assert done.returncode == 2
    assert "argument --count: expected a whole number from 1 to 10000, found '0'" in done.stderr
