"""sys$scheduler running: schedules fire on a mocked clock, max-runtime stops jobs, history,
usage, bus events, missed starts, runtime changes and vetoes, jobs offered by plugins.

The wall clock is a plugin's (``martinet_scheduler_clock``, :mod:`wallclock`): it starts at
a chosen date in Europe/Paris and follows trio's clock, so under ``autojump_clock`` a night
passes in no time and every time asserted is computed, never measured.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import trio

from martinet.kernel import ConfigErrors, ManagementError, Router, hookimpl
from martinet.swiftlets.scheduler.api import (
    Job,
    JobError,
    JobFinished,
    JobGroup,
    JobParameter,
    JobRun,
    JobStarted,
    RunsMissed,
    Scheduler,
)

from tests.harness.polling import drain, wait_until
from tests.harness.wallclock import PARIS, ClockPlugin, TrioClock


def _positive(text: str) -> None:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a positive whole number, found {text!r}")


class JobsPlugin(ClockPlugin):
    """A plugin, registered in-process, offering the group ``Test`` and the clock."""

    def __init__(self, clock: TrioClock):
        super().__init__(clock)
        self.runs: list[tuple[str, dict]] = []
        self.cleaned_up: list[str] = []

    async def record(self, run: JobRun) -> str:
        self.runs.append((run.schedule, dict(run.parameters)))
        return f"recorded {run.parameters['Times']}"

    async def forever(self, run: JobRun) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with run.cleanup_scope():
                await trio.sleep(1)  # cleanup that awaits, under the shielded scope
                self.cleaned_up.append(run.schedule)

    async def give_up(self, run: JobRun) -> None:
        raise JobError("the target is gone", further_runs=False)

    async def needs(self, run: JobRun) -> str:
        return f"to {run.parameters['Target']}"

    @hookimpl
    def martinet_scheduler_jobs(self) -> list[JobGroup]:
        return [
            JobGroup(
                name="Test",
                jobs=[
                    Job(
                        name="Record",
                        description="Remembers its run.",
                        run=self.record,
                        parameters=[
                            JobParameter(name="Times", description="A positive number.", default="1", check=_positive),
                            JobParameter(name="Note", description="Optional text.", mandatory=False),
                        ],
                    ),
                    Job(name="Forever", description="Runs until stopped.", run=self.forever),
                    Job(name="Give Up", description="Fails and forbids further runs.", run=self.give_up),
                    Job(
                        name="Needs",
                        description="Has a mandatory parameter without default.",
                        run=self.needs,
                        parameters=[JobParameter(name="Target", description="Where to.")],
                    ),
                ],
            )
        ]


def _router_xml(schedules: str = "", calendars: str = "", *, store: str = "", scheduler: str = "") -> str:
    startorder = "sys$store sys$scheduler" if store else "sys$scheduler"
    store_element = f'<swiftlet name="sys$store" path="{store}" sync="normal"/>' if store else ""
    return f"""
<router name="r1" startorder="{startorder}" shutdown-timeout="5000">
  {store_element}
  <swiftlet name="sys$scheduler" time-zone="Europe/Paris" {scheduler}>
    <calendars>{calendars}</calendars>
    <schedules>{schedules}</schedules>
  </swiftlet>
</router>"""


def _schedule(name: str, expression: str, job: str = "Record", **attributes: str) -> str:
    extra = " ".join(f'{key.replace("_", "-")}="{value}"' for key, value in attributes.items())
    return (
        f'<schedule name="{name}" enabled="true" job-group="Test" job-name="{job}" '
        f'time-expression="{expression}" {extra}/>'
    )


@pytest.fixture
def start_router(nursery, write_config):
    """Start a router from XML text with the Test jobs and a clock starting at ``start``."""

    async def start(xml: str, start: datetime) -> tuple[Router, JobsPlugin, list]:
        jobs = JobsPlugin(TrioClock(start))
        router = Router.from_file(write_config(xml), plugins=[jobs])
        events = router.bus.subscribe(JobStarted, max_buffer=1000)
        finished = router.bus.subscribe(JobFinished, max_buffer=1000)
        await nursery.start(router.run)
        return router, jobs, [events, finished]

    return start


def history(router: Router) -> list[dict]:
    entries = router.management.resolve("/sys$scheduler/usage/history").children
    return [entries[key].properties() for key in sorted(entries)]


def schedule_usage(router: Router, name: str) -> dict:
    return router.management.resolve(f"/sys$scheduler/usage/schedules/{name}").properties()


async def test_an_at_schedule_fires_on_time_with_its_parameters(start_router, autojump_clock):
    xml = _router_xml(
        _schedule("nightly", "at 22:00, 06:00", logging_enabled="true").replace(
            "/>", '><parameters><parameter name="Times" value="3"/></parameters></schedule>'
        )
    )
    router, jobs, (started, finished) = await start_router(xml, datetime(2026, 3, 6, 21, 0, tzinfo=PARIS))
    assert schedule_usage(router, "nightly")["next-start"] == "2026-03-06T22:00:00"
    assert schedule_usage(router, "nightly")["state"] == "scheduled"
    await wait_until(lambda: len(jobs.runs) == 2, timeout=12 * 3600, step=60)
    assert jobs.runs == [("nightly", {"Times": "3"}), ("nightly", {"Times": "3"})]
    assert [(e["planned"], e["start"], e["outcome"], e["message"]) for e in history(router)] == [
        ("2026-03-06T22:00:00", "2026-03-06T22:00:00", "success", "recorded 3"),
        ("2026-03-07T06:00:00", "2026-03-07T06:00:00", "success", "recorded 3"),
    ]
    assert [e.planned for e in drain(started)] == ["2026-03-06T22:00:00", "2026-03-07T06:00:00"]
    assert [(e.schedule, e.job_group, e.job_name, e.outcome) for e in drain(finished)] == [
        ("nightly", "Test", "Record", "success")
    ] * 2
    usage = schedule_usage(router, "nightly")
    assert (usage["runs"], usage["next-start"], usage["last-outcome"]) == (2, "2026-03-07T22:00:00", "success")
    scheduler = router.swiftlet("sys$scheduler")
    assert isinstance(scheduler, Scheduler)
    assert scheduler.next_starts("nightly", 3) == [
        datetime(2026, 3, 7, 22, 0, tzinfo=PARIS),
        datetime(2026, 3, 8, 6, 0, tzinfo=PARIS),
        datetime(2026, 3, 8, 22, 0, tzinfo=PARIS),
    ]
    router.request_stop()


async def test_a_window_over_midnight_repeats_until_it_closes(start_router, autojump_clock):
    xml = _router_xml(_schedule("late", "start 23:30 stop 00:30 delay 20m"), scheduler='history-size="2"')
    router, jobs, (started, _) = await start_router(xml, datetime(2026, 3, 6, 23, 0, tzinfo=PARIS))
    await wait_until(lambda: len(jobs.runs) == 3, timeout=7200, step=1)
    await trio.sleep(3 * 3600)  # the window has closed: nothing more until tomorrow night
    assert [e.planned for e in drain(started)] == ["2026-03-06T23:30:00", "2026-03-06T23:50:00", "2026-03-07T00:10:00"]
    assert [e["planned"] for e in history(router)] == ["2026-03-06T23:50:00", "2026-03-07T00:10:00"]  # bounded
    assert schedule_usage(router, "late")["next-start"] == "2026-03-07T23:30:00"
    router.request_stop()


async def test_starts_in_hours_a_dst_change_skips_or_repeats_run_once(start_router, autojump_clock):
    """Europe/Paris: 02:30 does not exist on 2026-03-29 (read as 03:30 summer time) and occurs
    twice on 2026-10-25 (the first one counts; the clock going back does not start it again)."""
    xml = _router_xml(_schedule("dst", "at 02:30", date_from="2026-03-29"))
    router, jobs, (started, _) = await start_router(xml, datetime(2026, 3, 28, 23, 0, tzinfo=PARIS))
    await wait_until(lambda: len(jobs.runs) == 1, timeout=6 * 3600, step=60)
    assert [(e["planned"], e["start"]) for e in history(router)] == [("2026-03-29T02:30:00", "2026-03-29T03:30:00")]
    router.request_stop()


async def test_a_start_in_the_hour_that_occurs_twice_runs_once(start_router, autojump_clock):
    xml = _router_xml(_schedule("dst", "at 02:30"))
    router, jobs, _ = await start_router(xml, datetime(2026, 10, 25, 0, 0, tzinfo=PARIS))
    await trio.sleep(6 * 3600)  # 00:00 to 05:00 local: the hour from 02:00 comes twice
    assert [(e["planned"], e["start"]) for e in history(router)] == [("2026-10-25T02:30:00", "2026-10-25T02:30:00")]
    assert schedule_usage(router, "dst")["next-start"] == "2026-10-26T02:30:00"
    router.request_stop()


async def test_max_runtime_stops_a_job(start_router, autojump_clock):
    xml = _router_xml(_schedule("window", "at 22:00", job="Forever", max_runtime="90m"))
    router, jobs, (started, finished) = await start_router(xml, datetime(2026, 3, 6, 21, 59, tzinfo=PARIS))
    await wait_until(lambda: drain(started), timeout=120, step=1)
    assert schedule_usage(router, "window")["state"] == "running"
    assert router.management.get("/sys$scheduler/usage", "running") == 1
    with trio.fail_after(2 * 3600):
        ended = await finished.receive()
    assert (ended.outcome, ended.message) == ("stopped", "max-runtime 90m reached")
    assert jobs.cleaned_up == ["window"]
    [entry] = history(router)
    assert (entry["start"], entry["end"]) == ("2026-03-06T22:00:00", "2026-03-06T23:30:01")  # + 1 s of cleanup
    assert schedule_usage(router, "window")["state"] == "scheduled"
    router.request_stop()


async def test_a_job_running_when_the_router_stops_is_recorded_stopped(start_router, autojump_clock):
    router, jobs, (started, _) = await start_router(
        _router_xml(_schedule("long", "at 22:00", job="Forever")), datetime(2026, 3, 6, 21, 59, tzinfo=PARIS)
    )
    await started.receive()
    router.request_stop()
    await wait_until(lambda: history(router), timeout=60, step=1)
    [entry] = history(router)
    assert (entry["outcome"], entry["message"]) == ("stopped", "the scheduler stopped")
    assert jobs.cleaned_up == ["long"]


async def test_operators_start_and_stop_jobs(start_router, autojump_clock):
    xml = _router_xml(_schedule("manual", "at 03:00", job="Forever"))
    router, jobs, (_, finished) = await start_router(xml, datetime(2026, 3, 6, 12, 0, tzinfo=PARIS))
    tree = router.management
    path = "/sys$scheduler/usage/schedules/manual"
    assert await tree.invoke(path, "start") == "job Test/Forever started"
    await wait_until(lambda: schedule_usage(router, "manual")["state"] == "running", step=1)
    with pytest.raises(ManagementError, match="its job is running already"):
        await tree.invoke(path, "start")
    assert await tree.invoke(path, "stop") == "schedule manual: job stopped"
    ended = await finished.receive()
    assert (ended.outcome, ended.message) == ("stopped", "stopped by an operator")
    with pytest.raises(ManagementError, match="no job is running"):
        await tree.invoke(path, "stop")
    router.request_stop()


async def test_a_job_may_forbid_further_runs(start_router, autojump_clock):
    xml = _router_xml(_schedule("doomed", "start 10:00 stop 12:00 delay 10m", job="Give Up"))
    router, jobs, (_, finished) = await start_router(xml, datetime(2026, 3, 6, 9, 0, tzinfo=PARIS))
    ended = await finished.receive()
    assert (ended.outcome, ended.message) == ("failed", "the target is gone (the job forbids further runs)")
    await trio.sleep(3600)
    assert drain(finished) == []
    usage = schedule_usage(router, "doomed")
    assert (usage["state"], usage["next-start"], usage["runs"]) == ("finished", "", 1)
    router.management.set("/sys$scheduler/schedules/doomed", "time-expression", "at 11:30")  # the operator acts
    await wait_until(lambda: schedule_usage(router, "doomed")["state"] == "scheduled", step=1)
    assert schedule_usage(router, "doomed")["next-start"] == "2026-03-06T11:30:00"
    router.request_stop()


async def test_runtime_changes_apply_at_once_and_bad_ones_are_refused(start_router, autojump_clock):
    calendars = '<calendar name="weekdays" weekdays="mon tue wed thu fri"/>'
    router, jobs, (started, _) = await start_router(
        _router_xml(calendars=calendars), datetime(2026, 3, 6, 12, 0, tzinfo=PARIS)
    )  # a Friday
    tree = router.management
    schedules = "/sys$scheduler/schedules"
    tree.add(
        schedules,
        "soon",
        {
            "enabled": "true",
            "job-group": "Test",
            "job-name": "Record",
            "time-expression": "at 12:30",
            "calendar": "weekdays",
        },
    )
    await wait_until(lambda: "soon" in tree.resolve("/sys$scheduler/usage/schedules").children, step=1)
    assert schedule_usage(router, "soon")["next-start"] == "2026-03-06T12:30:00"
    tree.set(f"{schedules}/soon", "time-expression", "at 12:10")
    await wait_until(lambda: schedule_usage(router, "soon")["next-start"] == "2026-03-06T12:10:00", step=1)
    await wait_until(lambda: len(jobs.runs) == 1, timeout=3600, step=1)
    assert schedule_usage(router, "soon")["next-start"] == "2026-03-09T12:10:00"  # Monday: the calendar
    tree.set(f"{schedules}/soon", "enabled", "false")
    await wait_until(lambda: schedule_usage(router, "soon")["state"] == "disabled", step=1)

    with pytest.raises(ManagementError, match="unknown calendar 'holidays' \\(calendars: weekdays\\)"):
        tree.set(f"{schedules}/soon", "calendar", "holidays")
    tree.add(schedules, "bad", {"job-group": "Test", "job-name": "Record", "time-expression": "at 01:00"})
    with pytest.raises(ManagementError, match="parameter 'Times': expected a positive whole number, found 'x'"):
        tree.add(f"{schedules}/bad/parameters", "Times", {"value": "x"})
    with pytest.raises(ManagementError, match="unknown parameter 'Colour' \\(parameters: Times, Note\\)"):
        tree.add(f"{schedules}/bad/parameters", "Colour", {"value": "red"})
    tree.add(f"{schedules}/bad/parameters", "Times", {"value": "2"})
    with pytest.raises(ManagementError, match="parameter 'Times': expected a positive whole number, found '-2'"):
        tree.set(f"{schedules}/bad/parameters/Times", "value", "-2")
    with pytest.raises(ManagementError, match="time-expression.*a time expression starts with 'at' or 'start'"):
        tree.set(f"{schedules}/soon", "time-expression", "hourly")
    with pytest.raises(ManagementError, match="calendar weekdays is used by schedule soon"):
        tree.remove("/sys$scheduler/calendars", "weekdays")
    tree.add("/sys$scheduler/calendars", "a", {"base-calendar": "weekdays"})
    with pytest.raises(ManagementError, match="cycle through base-calendar"):
        tree.set("/sys$scheduler/calendars/weekdays", "base-calendar", "a")
    with pytest.raises(ManagementError, match="base-calendar 'nope' does not exist"):
        tree.add("/sys$scheduler/calendars", "b", {"base-calendar": "nope"})

    tree.remove(schedules, "soon")
    await wait_until(lambda: "soon" not in tree.resolve("/sys$scheduler/usage/schedules").children, step=1)
    router.request_stop()


async def test_calendar_and_time_zone_changes_apply_at_once(start_router, autojump_clock):
    calendars = '<calendar name="days" weekdays="mon"/>'
    xml = _router_xml(_schedule("noon", "at 12:30", calendar="days"), calendars)
    router, _, _ = await start_router(xml, datetime(2026, 3, 6, 12, 0, tzinfo=PARIS))  # a Friday
    tree = router.management
    assert schedule_usage(router, "noon")["next-start"] == "2026-03-09T12:30:00"
    tree.set("/sys$scheduler/calendars/days", "weekdays", "mon fri")
    await wait_until(lambda: schedule_usage(router, "noon")["next-start"] == "2026-03-06T12:30:00", step=1)
    tree.add("/sys$scheduler/calendars/days/date-ranges", "today", {"date-from": "2026-03-06", "date-to": "2026-03-06"})
    tree.set("/sys$scheduler/calendars/days", "type", "exclude")  # every day but Mondays, Fridays and today
    await wait_until(lambda: schedule_usage(router, "noon")["next-start"] == "2026-03-07T12:30:00", step=1)
    tree.set("/sys$scheduler", "time-zone", "America/New_York")  # 06:00 there, still Friday
    await wait_until(lambda: router.management.get("/sys$scheduler/usage", "time-zone") == "America/New_York", step=1)
    assert router.management.get("/sys$scheduler/usage", "now").startswith("2026-03-06T06:00:")
    assert schedule_usage(router, "noon")["next-start"] == "2026-03-07T12:30:00"
    scheduler: Scheduler = router.swiftlet("sys$scheduler")
    assert scheduler.next_starts("noon", 1) == [datetime(2026, 3, 7, 12, 30, tzinfo=ZoneInfo("America/New_York"))]
    with pytest.raises(ManagementError, match="unknown time zone 'Europe/Zurch'"):
        tree.set("/sys$scheduler", "time-zone", "Europe/Zurch")
    router.request_stop()


async def test_a_start_after_a_time_zone_change_is_the_next_one_of_the_new_zone(start_router, autojump_clock):
    router, jobs, _ = await start_router(
        _router_xml(_schedule("noon", "at 12:30")), datetime(2026, 3, 6, 12, 0, tzinfo=PARIS)
    )
    await wait_until(lambda: len(jobs.runs) == 1, timeout=3600, step=1)  # 12:30 in Paris
    router.management.set("/sys$scheduler", "time-zone", "America/New_York")  # 06:30 there
    await wait_until(lambda: schedule_usage(router, "noon")["next-start"] == "2026-03-06T12:30:00", step=1)
    await wait_until(lambda: len(jobs.runs) == 2, timeout=7 * 3600, step=1)
    assert [e["planned"] for e in history(router)] == ["2026-03-06T12:30:00"] * 2  # each in its zone
    router.request_stop()


def test_schedules_that_cannot_run_are_config_errors_with_file_and_line(write_config):
    """Checked with the jobs the plugins offer (the hook), when the file is read: by
    ``martinet check``, ``martinet run`` and a reboot alike."""
    with_times = '><parameters><parameter name="Times" value="0"/></parameters></schedule>'
    xml = _router_xml(
        "\n"
        + _schedule("lost", "at 01:00", calendar="nope")
        + "\n"
        + _schedule("nojob", "at 01:00", job="Dance")
        + "\n"
        + _schedule("noparam", "at 01:00").replace("/>", with_times)
        + "\n"
        + _schedule("empty", "at 01:00", date_from="2026-03-06", date_to="2026-03-05")
        + "\n"
        + _schedule("incomplete", "at 01:00", job="Needs")
        + "\n"
        + _schedule("draft", "at 01:00", job="Needs").replace('enabled="true"', 'enabled="false"'),
        '\n<calendar name="a" base-calendar="b"/>\n<calendar name="b" base-calendar="a"/>'
        '\n<calendar name="c" base-calendar="gone"/>',
    )
    path = write_config(xml)
    with pytest.raises(ConfigErrors) as caught:
        Router.from_file(path, plugins=[JobsPlugin(TrioClock(datetime(2026, 3, 6, tzinfo=PARIS)))])
    schedule, calendar = (
        "/router[@name='r1']/swiftlet[@name='sys$scheduler']/schedules/schedule",
        "/router[@name='r1']/swiftlet[@name='sys$scheduler']/calendars/calendar",
    )
    assert str(caught.value).splitlines() == [
        f"{path}:5: {calendar}[@name='a']: attribute 'base-calendar': calendars form a cycle through "
        "base-calendar: a -> b -> a",
        f"{path}:6: {calendar}[@name='b']: attribute 'base-calendar': calendars form a cycle through "
        "base-calendar: a -> b -> a",
        f"{path}:7: {calendar}[@name='c']: attribute 'base-calendar': calendar 'c': base-calendar 'gone' does "
        "not exist",
        f"{path}:9: {schedule}[@name='lost']: attribute 'calendar': unknown calendar 'nope' (calendars: a, b, c)",
        f"{path}:10: {schedule}[@name='nojob']: attribute 'job-name': job group 'Test' has no job 'Dance' (jobs: "
        "Record, Forever, Give Up, Needs)",
        f"{path}:11: {schedule}[@name='noparam']: parameter 'Times': expected a positive whole number, found '0'",
        f"{path}:12: {schedule}[@name='empty']: attribute 'date-to': date-to 2026-03-05 is before date-from 2026-03-06",
        f"{path}:13: {schedule}[@name='incomplete']: parameter 'Target' missing (Where to.)",
    ]  # "draft" is disabled: its mandatory parameter may be missing until it is enabled


async def test_an_operator_builds_a_schedule_up_at_runtime(start_router, autojump_clock):
    """As ``martinet admin`` does it, one entity at a time: the schedule is added disabled,
    its parameters after it, and it is enabled once complete."""
    router, jobs, (started, finished) = await start_router(_router_xml(), datetime(2026, 3, 6, 12, 0, tzinfo=PARIS))
    tree, schedules = router.management, "/sys$scheduler/schedules"
    with pytest.raises(ManagementError, match="job group 'Test' has no job 'Need' \\(jobs: Record, Forever"):
        tree.add(schedules, "typo", {"job-group": "Test", "job-name": "Need", "time-expression": "at 12:30"})
    with pytest.raises(ManagementError, match="parameter 'Target' missing \\(Where to.\\)"):
        tree.add(
            schedules,
            "at-once",
            {"enabled": "true", "job-group": "Test", "job-name": "Needs", "time-expression": "at 12:30"},
        )
    tree.add(schedules, "link", {"job-group": "Test", "job-name": "Needs", "time-expression": "at 12:30"})
    await wait_until(lambda: "link" in tree.resolve("/sys$scheduler/usage/schedules").children, step=1)
    assert schedule_usage(router, "link")["state"] == "disabled"
    with pytest.raises(ManagementError, match="parameter 'Target' missing"):
        tree.set(f"{schedules}/link", "enabled", True)
    with pytest.raises(ManagementError, match="start.*parameter 'Target' missing"):
        await tree.invoke("/sys$scheduler/usage/schedules/link", "start")
    tree.add(f"{schedules}/link/parameters", "Target", {"value": "branch"})
    tree.set(f"{schedules}/link", "enabled", True)
    await wait_until(lambda: schedule_usage(router, "link")["next-start"] == "2026-03-06T12:30:00", step=1)
    with pytest.raises(ManagementError, match="parameter 'Target' missing"):  # it is enabled now
        tree.remove(f"{schedules}/link/parameters", "Target")
    with trio.fail_after(3600):
        ended = await finished.receive()
    assert (ended.schedule, ended.outcome, ended.message) == ("link", "success", "to branch")
    router.request_stop()


async def test_a_schedule_of_a_group_nobody_offers_waits_invalid(start_router, autojump_clock, caplog):
    xml = _router_xml(_schedule("typo", "at 01:00").replace('job-group="Test"', 'job-group="Tset"'))
    router, _, _ = await start_router(xml, datetime(2026, 3, 6, 12, 0, tzinfo=PARIS))
    usage = schedule_usage(router, "typo")
    assert usage["state"] == "invalid"
    assert usage["error"].startswith("no job group 'Tset' registered (groups: Queue Manager, Routing, Scheduler, ")
    assert [r.getMessage() for r in caplog.records if "will not run" in r.getMessage()] == [  # once
        f"schedule /sys$scheduler/schedules/typo is invalid and will not run: {usage['error']}"
    ]
    router.request_stop()


async def test_a_group_registered_at_runtime_is_planned_and_withdrawn(start_router, autojump_clock):
    xml = _router_xml(_schedule("later", "at 13:00").replace('job-group="Test"', 'job-group="Late"'))
    router, _, (_, finished) = await start_router(xml, datetime(2026, 3, 6, 12, 0, tzinfo=PARIS))
    assert schedule_usage(router, "later")["state"] == "invalid"
    scheduler: Scheduler = router.swiftlet("sys$scheduler")
    done = []

    async def work(run: JobRun) -> str:
        done.append(run.schedule)
        return "done"

    scheduler.register(JobGroup(name="Late", jobs=[Job(name="Record", description="d", run=work)]))
    with pytest.raises(ValueError, match="job group 'Late' is registered already"):
        scheduler.register(JobGroup(name="Late", jobs=[]))
    await wait_until(lambda: schedule_usage(router, "later")["state"] == "scheduled", step=1)
    assert router.management.get("/sys$scheduler/usage/job-groups/Late/jobs/Record", "description") == "d"
    await wait_until(lambda: done == ["later"], timeout=7200, step=1)
    scheduler.unregister("Late")
    await wait_until(lambda: schedule_usage(router, "later")["state"] == "invalid", step=1)
    assert "Late" not in scheduler.job_groups()
    router.request_stop()


async def test_at_starts_missed_while_the_router_was_down_are_reported_not_run(write_config, tmp_path):
    """Real time (the store is a process): the first router is only started and stopped."""
    xml = _router_xml(
        _schedule("daily", "at 22:00, 23:00") + _schedule("window", "start 22:00 stop 23:00 delay 1h"),
        store=str(tmp_path / "store"),
    )
    path = write_config(xml)
    first = JobsPlugin(TrioClock(datetime(2026, 3, 6, 21, 0, tzinfo=PARIS)))
    router = Router.from_file(path, plugins=[first])
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        router.request_stop()

    second = JobsPlugin(TrioClock(datetime(2026, 3, 8, 22, 30, tzinfo=PARIS)))  # down for two days
    router = Router.from_file(path, plugins=[second])
    missed = router.bus.subscribe(RunsMissed, max_buffer=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        assert [(e.schedule, e.count, e.first, e.last) for e in drain(missed)] == [
            ("daily", 5, "2026-03-06T22:00:00", "2026-03-08T22:00:00")
        ]
        assert [(e["planned"], e["outcome"]) for e in history(router)] == [
            (f"2026-03-0{day}T{hour}:00:00", "missed") for day, hour in [(6, 22), (6, 23), (7, 22), (7, 23), (8, 22)]
        ]
        assert second.runs == []  # nothing run in a burst
        assert schedule_usage(router, "daily")["next-start"] == "2026-03-08T23:00:00"
        router.request_stop()

    third = JobsPlugin(TrioClock(datetime(2026, 3, 8, 22, 40, tzinfo=PARIS)))  # reported once only
    router = Router.from_file(path, plugins=[third])
    missed = router.bus.subscribe(RunsMissed, max_buffer=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        assert drain(missed) == []
        router.request_stop()
