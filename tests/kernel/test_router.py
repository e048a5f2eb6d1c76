"""Router lifecycle: start order, reverse stop, failures, bounded cleanup, several routers."""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

import pytest
import trio

from martinet.kernel import Router, SwiftletFailed, SwiftletStarted, SwiftletStopped

from tests.harness import probe_plugin
from tests.harness.polling import drain


def lifecycle(events) -> list[tuple[str, str]]:
    out = []
    for event in events:
        if isinstance(event, SwiftletStarted):
            out.append(("started", event.name))
        elif isinstance(event, SwiftletStopped):
            out.append(("stopped", event.name))
    return out


async def test_start_in_order_and_stop_in_reverse(make_router):
    router = make_router('<router name="r1" startorder="test$c test$a sys$log test$b"/>')
    events = router.bus.subscribe(max_buffer=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        assert [
            router.management.get(f"/usage/swiftlets/{n}", "state") for n in ("test$c", "test$a", "sys$log", "test$b")
        ] == ["running"] * 4
        router.request_stop("test is done")
    assert lifecycle(drain(events)) == [
        ("started", "test$c"),
        ("started", "test$a"),
        ("started", "sys$log"),
        ("started", "test$b"),
        ("stopped", "test$b"),
        ("stopped", "sys$log"),
        ("stopped", "test$a"),
        ("stopped", "test$c"),
    ]
    assert router.management.get("/usage/swiftlets/test$a", "state") == "stopped"


async def test_a_swiftlet_failing_to_start_stops_the_started_ones_in_reverse(make_router, caplog):
    router = make_router("""
<router name="r1" startorder="test$a test$b test$c test$d">
  <swiftlet name="test$c" fail="start"/>
</router>""")
    events = router.bus.subscribe(max_buffer=100)
    with pytest.raises(SwiftletFailed) as caught:
        await router.run()
    assert str(caught.value) == "swiftlet test$c failed to start: OSError: test$c cannot bind its port"
    assert caught.value.swiftlet == "test$c" and isinstance(caught.value.cause, OSError)
    assert lifecycle(drain(events)) == [
        ("started", "test$a"),
        ("started", "test$b"),
        ("stopped", "test$b"),
        ("stopped", "test$a"),
    ]
    states = {
        n: router.management.get(f"/usage/swiftlets/{n}", "state") for n in ("test$a", "test$b", "test$c", "test$d")
    }
    assert states == {"test$a": "stopped", "test$b": "stopped", "test$c": "failed", "test$d": "stopped"}
    assert "swiftlet test$c failed to start" in caplog.text


async def test_a_swiftlet_failing_while_running_stops_the_router(make_router, autojump_clock):
    router = make_router("""
<router name="r1" startorder="test$a test$b test$c">
  <swiftlet name="test$b" fail="run"/>
</router>""")
    events = router.bus.subscribe(max_buffer=100)
    with pytest.raises(SwiftletFailed, match="swiftlet test\\$b failed: ValueError: test\\$b lost its mind"):
        await router.run()
    assert lifecycle(drain(events)) == [
        ("started", "test$a"),
        ("started", "test$b"),
        ("started", "test$c"),
        ("stopped", "test$b"),
        ("stopped", "test$c"),
        ("stopped", "test$a"),
    ]
    assert router.management.get("/usage/swiftlets/test$b", "error") == "ValueError: test$b lost its mind"


async def test_a_swiftlet_returning_from_run_stops_the_router(make_router):
    router = make_router(
        '<router name="r1" startorder="test$a test$b"><swiftlet name="test$b" fail="return"/></router>'
    )
    with pytest.raises(SwiftletFailed, match="run\\(\\) returned while the router was running"):
        await router.run()


async def test_failure_inside_a_nursery_is_an_exception_group(make_router):
    router = make_router('<router name="r1" startorder="test$a"><swiftlet name="test$a" fail="start"/></router>')
    with pytest.RaisesGroup(pytest.RaisesExc(SwiftletFailed, match="test\\$a failed to start")):
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)


async def test_cleanup_may_await_but_is_bounded_by_shutdown_timeout(make_router, autojump_clock):
    router = make_router("""
<router name="r1" startorder="test$a test$b" shutdown-timeout="2000">
  <swiftlet name="test$a" cleanup-ms="500"/>
  <swiftlet name="test$b" cleanup-ms="60000"/>
</router>""")
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        a, b = router.swiftlet("test$a"), router.swiftlet("test$b")
        begin = trio.current_time()
        router.request_stop()
    assert a.cleanup_finished  # finished its 0.5 s of cleanup
    assert b.cleaned_up and not b.cleanup_finished  # cut off after 2 s
    assert trio.current_time() - begin == pytest.approx(2.5)


async def test_stop_requested_before_start_starts_nothing(make_router):
    router = make_router('<router name="r1" startorder="test$a test$b"/>')
    events = router.bus.subscribe(max_buffer=100)
    router.request_stop("SIGTERM during boot")
    await router.run()
    assert lifecycle(drain(events)) == []


async def test_lookup_finds_running_swiftlets_only(make_router):
    router = make_router('<router name="r1" startorder="test$a"/>')
    with pytest.raises(LookupError, match="swiftlet test\\$a is not running on router r1"):
        router.swiftlet("test$a")
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        probe = router.swiftlet("test$a")
        assert probe.context.lookup("test$a", probe_plugin.ProbeSwiftlet) is probe
        assert probe.context.config.fail == "never"
        router.request_stop()


@runtime_checkable
class Probing(Protocol):
    cleaned_up: bool

    async def run(self, *, task_status) -> None: ...


@runtime_checkable
class Publishing(Protocol):
    def publish(self, topic: str) -> None: ...

    @property
    def interest(self) -> frozenset[str]: ...


class Unchecked(Protocol):
    def run(self) -> None: ...


async def test_lookup_returns_the_interface_asked_for_or_says_what_is_missing(make_router):
    router = make_router('<router name="r1" startorder="test$a test$b"/>')
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        context = router.swiftlet("test$b").context
        probe = router.swiftlet("test$a")
        assert context.lookup("test$a", Probing) is probe
        with pytest.raises(TypeError) as caught:
            context.lookup("test$a", Publishing)
        assert str(caught.value) == (
            "swiftlet test$a on router r1 (tests.harness.probe_plugin.ProbeSwiftlet) does not provide the "
            "interface tests.kernel.test_router.Publishing: it lacks interest, publish"
        )
        with pytest.raises(TypeError, match="test_router.Unchecked must be a class or a @runtime_checkable"):
            context.lookup("test$a", Unchecked)
        with pytest.raises(LookupError, match="swiftlet test\\$c is not running on router r1"):
            context.lookup("test$c", Probing)
        router.request_stop()


async def test_two_routers_in_one_process_are_independent(make_router, write_config, caplog):
    from tests.harness import probe_plugin

    paris = Router.from_file(
        write_config('<router name="paris" startorder="test$a sys$log"/>', "p.xml"), plugins=[probe_plugin]
    )
    tokyo = Router.from_file(
        write_config('<router name="tokyo" startorder="test$a"/>', "t.xml"), plugins=[probe_plugin]
    )
    with caplog.at_level(logging.INFO):
        async with trio.open_nursery() as nursery:
            await nursery.start(paris.run)
            await nursery.start(tokyo.run)
            paris.management.set("/test$a", "note", "paris only")
            assert tokyo.management.get("/test$a", "note") == ""
            assert paris.swiftlet("test$a") is not tokyo.swiftlet("test$a")
            paris.request_stop()
            tokyo.request_stop()
    started = {r.router for r in caplog.records if r.getMessage() == "swiftlet test$a started"}
    assert started == {"paris", "tokyo"}
    for record in caplog.records:
        if record.getMessage().startswith("router "):
            assert record.getMessage().split()[1] == record.router


async def test_a_router_runs_once(make_router):
    router = make_router('<router name="r1" startorder="test$a"/>')
    router.request_stop()
    await router.run()
    with pytest.raises(RuntimeError, match="router r1 has run already; build a new Router"):
        await router.run()


async def test_listeners_of_a_stopped_swiftlet_are_forgotten(make_router):
    router = make_router('<router name="r1" startorder="test$a"/>')
    calls = []
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        router.management.entity("/test$a").on_change(calls.append)
        router.management.set("/test$a", "note", "while running")
        router.request_stop()
    router.management.set("/test$a", "note", "after stop")
    router.management.set("/test$a/pools/a.wide", "max-concurrency", "2")
    assert [c.new for c in calls] == ["while running"]
    assert router.management.get("/test$a", "note") == "after stop"
