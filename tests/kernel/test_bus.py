"""The event bus: typed subscriptions, synchronous publishing, explicit overflow policies."""

from __future__ import annotations

import attrs
import pytest
import trio

from martinet.kernel import Event, EventBus, Overflow, SubscriberOverflow, event_types

from tests.harness.polling import drain


@attrs.frozen(kw_only=True)
class Ping(Event):
    n: int


@attrs.frozen(kw_only=True)
class LoudPing(Ping):
    volume: int = 11


@attrs.frozen(kw_only=True)
class Other(Event):
    pass


async def test_subscribers_get_their_type_and_its_subclasses():
    bus = EventBus()
    pings = bus.subscribe(Ping)
    everything = bus.subscribe(Event)
    louds = bus.subscribe(LoudPing)
    events = [Ping(n=1), LoudPing(n=2), Other()]
    for event in events:
        bus.publish(event)
    assert drain(pings) == events[:2]
    assert drain(everything) == events
    assert drain(louds) == [events[1]]


async def test_async_iteration_ends_when_closed():
    bus = EventBus()
    received = []
    with bus.subscribe(Ping) as subscription:
        bus.publish(Ping(n=1))
        bus.publish(Ping(n=2))
    bus.publish(Ping(n=3))  # after unsubscribing: not delivered
    async for event in subscription:
        received.append(event.n)
    assert received == [1, 2]
    assert bus.subscriber_count == 0


async def test_fail_policy_reports_the_gap_after_the_buffered_events():
    bus = EventBus()
    subscription = bus.subscribe(Ping, max_buffer=2)
    for n in range(5):
        bus.publish(Ping(n=n))  # never blocks the publisher
    assert subscription.dropped == 1
    assert (await subscription.receive()).n == 0
    assert (await subscription.receive()).n == 1
    with pytest.raises(SubscriberOverflow, match="fell 2 events behind"):
        await subscription.receive()
    assert bus.subscriber_count == 0


async def test_drop_newest_keeps_the_first_events():
    bus = EventBus()
    subscription = bus.subscribe(Ping, max_buffer=3, overflow=Overflow.DROP_NEWEST)
    for n in range(10):
        bus.publish(Ping(n=n))
    assert [e.n for e in drain(subscription)] == [0, 1, 2]
    assert subscription.dropped == 7


async def test_drop_oldest_keeps_the_latest_events():
    bus = EventBus()
    subscription = bus.subscribe(Ping, max_buffer=3, overflow=Overflow.DROP_OLDEST)
    for n in range(10):
        bus.publish(Ping(n=n))
    assert [e.n for e in drain(subscription)] == [7, 8, 9]
    assert subscription.dropped == 7


async def test_a_slow_subscriber_does_not_affect_others():
    bus = EventBus()
    slow = bus.subscribe(Ping, max_buffer=1)
    fast = bus.subscribe(Ping, max_buffer=100)
    for n in range(50):
        bus.publish(Ping(n=n))
    assert [e.n for e in drain(fast)] == list(range(50))
    assert slow.receive_nowait().n == 0
    with pytest.raises(SubscriberOverflow):
        slow.receive_nowait()


async def test_a_blocked_receiver_is_woken_by_publish():
    bus = EventBus()
    subscription = bus.subscribe(Ping)
    got = []

    async def consume():
        got.append(await subscription.receive())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        bus.publish(Ping(n=7))
    assert got == [Ping(n=7)]


def test_event_types_are_found_by_name():
    found = event_types()
    assert found["Ping"] is Ping and found["LoudPing"] is LoudPing
    assert found["PropertyChanged"].__module__ == "martinet.kernel.bus"


def test_events_are_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Ping(n=1).n = 2  # type: ignore[misc]


def test_buffer_must_hold_something():
    with pytest.raises(ValueError):
        EventBus().subscribe(Ping, max_buffer=0)
