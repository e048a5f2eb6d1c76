"""The routing swiftlet's public interface: the routing table as others see it, and its events.

The transfer (routing part 2), the queue manager's redirection of ``q@R`` and the topic
manager's interest exchange use only what is defined here: they get the swiftlet with
``context.lookup("sys$routing", Routing)`` and follow the bus events below.

Vocabulary
----------
- A **route** to a destination router is its *path*: the routers a message passes, from the
  neighbour it is handed to (``path[0]``, the *next hop*) to the destination (``path[-1]``).
  Its hop count is ``len(path)``; the direct route to a neighbour ``N`` is ``(N,)``.
- A destination is **known** while it has a route or a static route, and **active** while it
  has a route (routes exist only over links in the delivery stage, so active means a
  message for it can leave now).

Events are published on the router's bus in the order the changes happen: a destination is
added before its first activation, deactivated before its removal.

Addressing
----------
While a destination ``R`` is known, the routing swiftlet keeps the persistent local queue
``rt$R`` (:func:`routing_queue`) and the queue manager's redirection
:func:`redirection_predicate` (``%@R``) → ``rt$R``, so a send to ``q@R`` lands in
``rt$R``, unchanged; both are in place before :class:`DestinationAdded` is published. When
``R`` is removed the redirection goes (a send to ``q@R`` is refused again: the router is
unknown) but ``rt$R`` stays with its messages, for when ``R`` comes back. Every router with
routing and a queue manager also has the queue ``unroutable``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from martinet.kernel import Event
from martinet.messaging.like import like_escape

__all__ = [
    "ROUTING_QUEUE_PREFIX",
    "UNROUTABLE",
    "routing_queue",
    "redirection_predicate",
    "Routing",
    "Destination",
    "LinkState",
    "DestinationAdded",
    "DestinationRemoved",
    "DestinationActivated",
    "DestinationDeactivated",
    "RouteAdded",
    "RouteRemoved",
    "LinkStateChanged",
]


#: The prefix of routing queues: ``rt$R`` holds the messages waiting to go to router ``R``.
ROUTING_QUEUE_PREFIX = "rt$"

#: The queue of messages that could not be routed (DESIGN §2.2).
UNROUTABLE = "unroutable"


def routing_queue(router: str) -> str:
    """The local queue holding the messages for router ``router``: ``rt$<router>``."""
    return f"{ROUTING_QUEUE_PREFIX}{router}"


def redirection_predicate(router: str) -> str:
    """The queue manager redirection (SQL-LIKE on ``q@router``) that sends every address on
    ``router`` to :func:`routing_queue`: ``%@<router>``, with ``_``, ``%`` and ``\\`` in the
    name escaped (``_`` alone matches any character). The one place the pattern is built,
    for installing and for removing it (SwiftMQ removed ``%@`` + the queue name instead)."""
    return f"%@{like_escape(router)}"


@attrs.frozen(kw_only=True)
class Destination:
    """One row of the routing table: a router we can (or may later) reach.

    Attributes:
        name: the destination router.
        routes: every route, shortest first, newest first among equal hop counts.
        static: a static route names it (it stays known without routes).
        next_hop: the neighbour the shortest route leads to; None while inactive.
        rotation: with ``roundrobin-enabled``, the neighbours that have any route to it, in the
            order a dispatcher rotates through them; else ``(next_hop,)`` or empty.
    """

    name: str
    routes: tuple[tuple[str, ...], ...]
    static: bool
    next_hop: str | None
    rotation: tuple[str, ...]

    @property
    def active(self) -> bool:
        return bool(self.routes)


@runtime_checkable
class Routing(Protocol):
    """What ``sys$routing`` offers other swiftlets. All calls are synchronous, cheap and
    never block; they read the table as it is now (follow the events for changes)."""

    def destination(self, router: str) -> Destination | None:
        """The table's row for ``router``; None if it is not known (no route, no static route)."""

    def destinations(self) -> Sequence[Destination]:
        """Every known destination, sorted by name."""


@attrs.frozen(kw_only=True)
class DestinationAdded(Event):
    """``router`` became known (its first route, or a static route for it)."""

    router: str


@attrs.frozen(kw_only=True)
class DestinationRemoved(Event):
    """``router`` is no longer known (its last route went and no static route names it)."""

    router: str


@attrs.frozen(kw_only=True)
class DestinationActivated(Event):
    """``router`` got its first route: messages for it can leave now."""

    router: str


@attrs.frozen(kw_only=True)
class DestinationDeactivated(Event):
    """``router`` lost its last route: messages for it wait until a route appears."""

    router: str


@attrs.frozen(kw_only=True)
class RouteAdded(Event):
    """A route ``path`` to ``router`` was learned (or a link to the neighbour came up)."""

    router: str
    path: tuple[str, ...]


@attrs.frozen(kw_only=True)
class RouteRemoved(Event):
    """The route ``path`` to ``router`` was withdrawn or its link went down."""

    router: str
    path: tuple[str, ...]


class LinkState(enum.Enum):
    """The state of a routing link, listener side or connector side (SwiftMQ's link states).

    WAITING: a connector waits for its next attempt (retry-time or backoff).
    CONNECTING: a socket is being opened or the handshake stages run.
    OPERATIONAL: the delivery stage runs; routes flow.
    FAILED: the last attempt failed (the reason is the link's last error); a connector
        retries after its delay.
    CLOSED: the link ended (listener side) or the swiftlet stops.
    DISABLED: the connector is disabled; it does not connect.
    """

    WAITING = "waiting"
    CONNECTING = "connecting"
    OPERATIONAL = "operational"
    FAILED = "failed"
    CLOSED = "closed"
    DISABLED = "disabled"


@attrs.frozen(kw_only=True)
class LinkStateChanged(Event):
    """A link changed state.

    Attributes:
        link: ``connector:<name>`` or ``listener:<name>:<n>`` (the usage entry of the link).
        peer: the remote router's name once known, else None.
        state: the new state.
        error: why it failed or closed (None when it did not).
        since: when the state began, seconds since the epoch (a connector's retries do not
            move it); None: now.
    """

    link: str
    peer: str | None
    state: LinkState
    error: str | None = None
    since: float | None = None
