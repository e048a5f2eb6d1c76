"""Jobs the swiftlets ship, run by sys$scheduler on real routers: the Routing Connector brings
a real link up for its window and down after it (routes appear and disappear)."""

from __future__ import annotations

from datetime import datetime

import pytest
import trio

from martinet.kernel import Router, load_plugins
from martinet.swiftlets.routing.config import ConnectorConfig
from martinet.swiftlets.scheduler.api import JobFinished, JobStarted
from martinet.swiftlets.scheduler.config import ParameterConfig, ScheduleConfig, SchedulerConfig

from network import ROUTING_STACK, Network, routing_config
from wallclock import PARIS, ClockPlugin, TrioClock


@pytest.fixture
async def network(nursery, tmp_path):
    network = Network(nursery, tmp_path)
    yield network
    await network.stop_all()


async def test_the_routing_connector_job_brings_a_link_up_for_its_window(network, nursery):
    await network.start_routers("paris")
    connector = ConnectorConfig(name="paris", hostname="127.0.0.1", port=network.routing_port("paris"),
                                enabled=False, retry_time=1000)
    window = ScheduleConfig(name="night-link", enabled=True, job_group="Routing", job_name="Routing Connector",
                            time_expression="at 22:00", max_runtime="10s",
                            parameters=[ParameterConfig(name="Connector Name", value="paris")])
    config = network.config("tokyo", startorder=(*ROUTING_STACK, "sys$scheduler"), swiftlets={
        "sys$routing": routing_config(connectors=[connector]),
        "sys$scheduler": SchedulerConfig(time_zone="Europe/Paris", schedules=[window])})
    # Real time (real sockets): the clock says 21:59:59 at the start, so the window opens in a second.
    plugins = load_plugins([ClockPlugin(TrioClock(datetime(2026, 3, 6, 21, 59, 59, tzinfo=PARIS)))])
    tokyo = Router(config, plugins.specs, hook=plugins.hook)
    started = tokyo.bus.subscribe(JobStarted, max_buffer=10)
    finished = tokyo.bus.subscribe(JobFinished, max_buffer=10)
    await nursery.start(tokyo.run)
    network.routers["tokyo"] = tokyo
    tree = tokyo.management
    assert tree.get("/sys$scheduler/usage/schedules/night-link", "next-start") == "2026-03-06T22:00:00"
    assert (network.table("tokyo"), network.table("paris")) == ({}, {})
    assert tree.get("/sys$routing/usage/connectors/paris", "state") == "disabled"

    with trio.fail_after(10):
        assert (await started.receive()).planned == "2026-03-06T22:00:00"
    await network.settle({"tokyo": {"paris": 1}, "paris": {"tokyo": 1}}, timeout=8)
    assert tree.get("/sys$scheduler/usage/schedules/night-link", "state") == "running"  # still in its window

    with trio.fail_after(20):
        ended = await finished.receive()
    assert (ended.job_group, ended.job_name, ended.outcome, ended.message) == (
        "Routing", "Routing Connector", "stopped", "max-runtime 10s reached")
    await network.settle({"tokyo": {}, "paris": {}}, timeout=10)
    assert tree.get("/sys$routing/connectors/paris", "enabled") is False
    assert tree.get("/sys$routing/usage/connectors/paris", "state") == "disabled"
    assert tree.get("/sys$scheduler/usage/schedules/night-link", "next-start") == "2026-03-07T22:00:00"
    tokyo.request_stop()


async def test_the_routing_connector_job_fails_for_an_unknown_connector(network, nursery):
    window = ScheduleConfig(name="typo", enabled=True, job_group="Routing", job_name="Routing Connector",
                            time_expression="at 22:00", parameters=[ParameterConfig(name="Connector Name",
                                                                                    value="pariss")])
    config = network.config("tokyo", startorder=(*ROUTING_STACK, "sys$scheduler"), swiftlets={
        "sys$routing": routing_config(), "sys$scheduler": SchedulerConfig(schedules=[window])})
    tokyo = await network.start(config)
    finished = tokyo.bus.subscribe(JobFinished, max_buffer=10)
    await tokyo.management.invoke("/sys$scheduler/usage/schedules/typo", "start")
    with trio.fail_after(10):
        ended = await finished.receive()
    assert ended.outcome == "failed"
    assert ended.message.startswith("cannot enable connector 'pariss': no 'pariss' under /sys$routing/connectors")
