"""The event bus: typed events from any part of a router to whoever subscribed.

Theory of operation
-------------------
Events are frozen attrs classes deriving from :class:`Event`. A subscriber names an event
type and receives every event of that type *or a subclass of it* through its own bounded
memory channel; subscribing to :class:`Event` itself receives everything.

Publishing is synchronous and never blocks or fails the publisher: the event is offered
to each matching subscription with ``send_nowait``. Which subscriptions match a type is
computed once per event type and cached until the set of subscriptions changes, so a
publish costs one dict lookup plus one channel send per subscriber.

A subscriber that cannot keep up fills its channel. What happens then is chosen by the
subscriber, explicitly, with :class:`Overflow`:

- ``FAIL`` (the default): the subscription is closed; the subscriber's next receive raises
  :class:`SubscriberOverflow` after the events still buffered. For subscribers that track
  state from events (interest, routes) a silent gap would be a bug, so they learn of it.
- ``DROP_NEWEST``: the new event is not delivered to this subscriber.
- ``DROP_OLDEST``: the oldest buffered event is discarded to make room (for samplers and
  monitors, which want the latest).

Dropped events are counted on the subscription (``dropped``), never hidden.
"""

from __future__ import annotations

import enum
from typing import Any, Generic, TypeVar

import attrs
import trio

__all__ = [
    "Event",
    "EventBus",
    "Overflow",
    "Subscription",
    "SubscriberOverflow",
    "event_types",
    "SwiftletStarted",
    "SwiftletStopped",
    "RouterStarted",
    "RouterStopping",
    "PropertyChanged",
    "EntityAdded",
    "EntityRemoved",
]

E = TypeVar("E", bound="Event")


@attrs.frozen(kw_only=True)
class Event:
    """Base of all bus events."""


class Overflow(enum.Enum):
    """What a full subscription does with the next event."""

    FAIL = "fail"
    DROP_NEWEST = "drop-newest"
    DROP_OLDEST = "drop-oldest"


class SubscriberOverflow(Exception):
    """Raised to a FAIL-policy subscriber whose channel overflowed; events were lost."""


class Subscription(Generic[E]):
    """One subscriber's bounded stream of events; async-iterate it or call :meth:`receive`.

    Use it as a context manager (``with bus.subscribe(...) as sub:``) or call
    :meth:`close` to unsubscribe.
    """

    def __init__(self, bus: EventBus, event_type: type[E], max_buffer: int, overflow: Overflow):
        self.event_type = event_type
        self.overflow = overflow
        self.max_buffer = max_buffer
        self.dropped = 0
        self._bus = bus
        self._send, self._receive = trio.open_memory_channel[E](max_buffer)
        self._overflowed = False

    def _offer(self, event: E) -> None:
        try:
            self._send.send_nowait(event)
            return
        except trio.WouldBlock:
            pass
        except trio.ClosedResourceError:
            return
        self.dropped += 1
        if self.overflow is Overflow.DROP_OLDEST:
            self._receive.receive_nowait()
            self._send.send_nowait(event)
        elif self.overflow is Overflow.FAIL:
            self._overflowed = True
            self._bus._remove(self)
            self._send.close()

    async def receive(self) -> E:
        """The next event, waiting for one.

        Raises:
            SubscriberOverflow: (FAIL policy) the buffer overflowed and events were lost;
                raised once the events buffered before the overflow have been received.
            trio.EndOfChannel: the subscription was closed and is drained.
        """
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise self._end() from None

    def receive_nowait(self) -> E:
        """The next event if one is buffered.

        Raises:
            trio.WouldBlock: nothing is buffered.
            SubscriberOverflow, trio.EndOfChannel: as for :meth:`receive`.
        """
        try:
            return self._receive.receive_nowait()
        except trio.EndOfChannel:
            raise self._end() from None

    def _end(self) -> Exception:
        if self._overflowed:
            return SubscriberOverflow(
                f"subscriber to {self.event_type.__name__} fell {self.max_buffer} events behind and was dropped"
            )
        return trio.EndOfChannel()

    def __aiter__(self) -> Subscription[E]:
        return self

    async def __anext__(self) -> E:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Unsubscribe; buffered events can still be received, then iteration ends."""
        self._bus._remove(self)
        self._send.close()

    def __enter__(self) -> Subscription[E]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventBus:
    """One router's event bus. Not thread-safe: publish from trio tasks of the router."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription[Any]] = []
        self._routes: dict[type, tuple[Subscription[Any], ...]] = {}

    def subscribe(
        self,
        event_type: type[E] = Event,  # type: ignore[assignment]
        *,
        max_buffer: int = 1000,
        overflow: Overflow = Overflow.FAIL,
    ) -> Subscription[E]:
        """Receive every future event that is an instance of ``event_type``."""
        if max_buffer < 1:
            raise ValueError("max_buffer must be at least 1")
        subscription = Subscription(self, event_type, max_buffer, overflow)
        self._subscriptions.append(subscription)
        self._routes.clear()
        return subscription

    def publish(self, event: Event) -> None:
        """Offer ``event`` to every matching subscriber; never blocks, never raises."""
        kind = type(event)
        targets = self._routes.get(kind)
        if targets is None:
            targets = tuple(s for s in self._subscriptions if issubclass(kind, s.event_type))
            self._routes[kind] = targets
        for subscription in targets:
            subscription._offer(event)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscriptions)

    def _remove(self, subscription: Subscription[Any]) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
            self._routes.clear()


def event_types() -> dict[str, type[Event]]:
    """Every event class currently defined, by class name (for config that names events)."""
    found: dict[str, type[Event]] = {}
    pending = [Event]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


# -- events the kernel publishes -------------------------------------------------------


@attrs.frozen(kw_only=True)
class SwiftletStarted(Event):
    """A swiftlet finished starting."""

    name: str


@attrs.frozen(kw_only=True)
class SwiftletStopped(Event):
    """A swiftlet stopped; ``error`` says why if it failed."""

    name: str
    error: str | None = None


@attrs.frozen(kw_only=True)
class RouterStarted(Event):
    """Every swiftlet in the start order is running."""

    router: str


@attrs.frozen(kw_only=True)
class RouterStopping(Event):
    """The router began to stop its swiftlets."""

    router: str
    reason: str


@attrs.frozen(kw_only=True)
class PropertyChanged(Event):
    """A management property was changed (after the owner accepted it)."""

    path: str
    name: str
    old: object
    new: object


@attrs.frozen(kw_only=True)
class EntityAdded(Event):
    """An entity was added to the entity list at ``path``."""

    path: str
    name: str


@attrs.frozen(kw_only=True)
class EntityRemoved(Event):
    """An entity was removed from the entity list at ``path``."""

    path: str
    name: str
