"""The third-party example xt$echo, pip-installed from examples/plugins, loaded by entry point."""

from __future__ import annotations

from datetime import datetime

import pytest
import trio

from martinet.kernel import ConfigErrors, ManagementError, Router, load_config, load_swiftlet_specs
from martinet.swiftlets.scheduler.api import JobFinished

from tests.harness.paths import ECHO_PLUGIN
from tests.harness.polling import wait_until
from tests.harness.wallclock import PARIS, ClockPlugin, TrioClock

ECHO_XML = ECHO_PLUGIN / "echo-router.xml"


def test_without_the_package_the_swiftlet_is_unknown():
    specs = load_swiftlet_specs()
    assert "xt$echo" not in specs and "sys$log" in specs
    with pytest.raises(ConfigErrors, match="unknown swiftlet 'xt\\$echo'; installed: .*sys\\$log"):
        load_config(ECHO_XML, specs)


def test_the_entry_point_provides_the_swiftlet(echo_site, monkeypatch):
    monkeypatch.syspath_prepend(str(echo_site))
    spec = load_swiftlet_specs()["xt$echo"]
    assert spec.config.__module__ == "martinet_echo"
    assert [p.name for p in spec.pools] == ["echo.worker"]


async def test_the_example_swiftlet_runs_from_xml(echo_site, monkeypatch):
    monkeypatch.syspath_prepend(str(echo_site))
    router = Router.from_file(ECHO_XML)
    tree = router.management
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        lifecycle = "/xt$echo/usage/counters/lifecycle"
        # Its own start, sys$log's start and the router's start: counted by its own pool.
        await wait_until(lambda: tree.get(lifecycle, "count") == 3)
        assert tree.get(lifecycle, "last-event") == "RouterStarted"

        tree.set("/sys$log", "level", "WARNING")
        await wait_until(lambda: tree.get("/xt$echo/usage/counters/changes", "count") == 1)

        with pytest.raises(ManagementError, match="unknown event type\\(s\\) \\['Nonsense'\\]"):
            tree.add("/xt$echo/counters", "bad", {"event-types": "Nonsense"})
        tree.add("/xt$echo/counters", "everything", {"event-types": "Event"})
        tree.set("/xt$echo", "greeting", "hi")  # counted by 'everything' and 'changes'
        await wait_until(lambda: tree.get("/xt$echo/usage/counters/everything", "count") == 2)  # its own add too
        with pytest.raises(ManagementError, match="change refused: unknown event type"):
            tree.set("/xt$echo/counters/everything", "event-types", "Bogus")
        tree.remove("/xt$echo/counters", "everything")
        assert "everything" not in tree.resolve("/xt$echo/usage/counters").children

        # seven events, each counted once: three starts, the level, the added counter, the
        # greeting and the removed counter
        pool = "/xt$echo/usage/pools/echo.worker"
        await wait_until(lambda: tree.get(pool, "completed") == 7)
        assert tree.resolve(pool).properties() == {
            "max-concurrency": 1,
            "running": 0,
            "queued": 0,
            "completed": 7,
            "failed": 0,
            "rejected": 0,
        }
        assert (tree.get("/xt$echo/usage", "received"), tree.get("/xt$echo/usage", "dropped")) == (7, 0)
        assert tree.get("/xt$echo/usage/counters/changes", "count") == 4
        router.request_stop()


async def test_the_example_plugin_offers_a_job_that_a_schedule_runs(
    echo_site, monkeypatch, write_config, autojump_clock
):
    """A third-party job, registered through the hook, run on a mocked clock at 09:00."""
    monkeypatch.syspath_prepend(str(echo_site))
    path = write_config("""
<router name="echo1" startorder="xt$echo sys$scheduler">
  <swiftlet name="sys$scheduler" time-zone="Europe/Paris">
    <schedules>
      <schedule name="morning" enabled="true" job-group="Echo" job-name="Greet" time-expression="at 09:00">
        <parameters><parameter name="Text" value="good morning"/></parameters>
      </schedule>
    </schedules>
  </swiftlet>
</router>""")
    router = Router.from_file(path, plugins=[ClockPlugin(TrioClock(datetime(2026, 3, 6, 8, 0, tzinfo=PARIS)))])
    finished = router.bus.subscribe(JobFinished, max_buffer=10)
    tree = router.management
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        assert tree.get("/sys$scheduler/usage/job-groups/Echo/jobs/Greet", "parameters") == "Text=hello (mandatory)"
        ended = await finished.receive()
        assert (ended.job_group, ended.job_name, ended.outcome, ended.message) == (
            "Echo",
            "Greet",
            "success",
            "echo: good morning",
        )
        assert tree.get("/xt$echo/usage", "greetings") == 1
        assert tree.get("/sys$scheduler/usage/history/00000001", "start") == "2026-03-06T09:00:00"
        router.request_stop()
    assert tree.resolve("/sys$scheduler/usage/job-groups").children == {}  # gone with the scheduler
