"""The route exchange and the routing table of ``sys$routing``: path vector, sans-IO.

Theory of operation
-------------------
One :class:`RouteExchanger` per router holds its routing table (a :class:`RoutingTable`)
and decides what each neighbour is told. It does no I/O and knows no time: the swiftlet feeds it the link events
and the announcements that arrive, and writes out what it returns. Every input method
returns an :class:`Output`: the announcements to send, ``(neighbour, Announcement)`` in
order, and the bus events of :mod:`.api` the change produced, in causal order.

Vocabulary (as :mod:`.api`): a **route** is its path, from the next hop (``path[0]``, a
neighbour) to the destination (``path[-1]``); the hop count is ``len(path)``. The direct
route to neighbour ``N`` is ``(N,)``. Every route the router has lies in the table, learned
over the link to ``path[0]`` (the direct route is learned by the link coming up).

**Announcements** carry the sender's own path: router ``S`` holding ``(N,)`` tells ``R``
``Announcement(add=True, destination=N, path=(N,))``, and ``R`` stores ``(S, N)``. What a
peer sends is checked (:class:`BadAnnouncement`: the caller closes that link); an ADD for a
route already held and a REMOVE for one not held are ignored, so both are idempotent.

**Triggers** (SwiftMQ's ``RouteExchanger``, its dynamic routing):

- ``link_up(N)``: insert ``(N,)`` (announced to the others), then send ``N`` every route
  it may have, shortest first;
- ``link_down(N)``: drop every route learned over ``N``; withdraw each one from the
  neighbours it was announced to;
- ``receive(N, announcement)``: add or drop the route; announce or withdraw it elsewhere;
- ``set_hop_limit`` / ``set_filters``: re-evaluate the neighbours concerned and send only
  the differences (SwiftMQ needs the links re-established for that);
- ``add_static`` / ``remove_static``: a destination known without routes; never announced.

**Output rules.** Neighbour ``N`` should have route ``P`` of this router unless one of
:func:`refusal`'s reasons holds (hop limit reached, ``N`` is the next hop, ``N`` is on the
path, ``N``'s filter rejects it). The exchanger keeps, per neighbour, the set of routes it
announced; after a change it sends ADD for a route that should be there and is not, REMOVE
for one that is there and should not be. So an ADD is never sent twice on a link and a
REMOVE only follows its ADD. A route change touches one route, so it costs one rule check
per neighbour; only link-up and runtime reconfiguration look at the whole table.

The rules depend on nothing but the route itself (every route is announced, not only the
best, so that every router's table shows every path): adding a route never withdraws
another and removing one never adds another. After the network settles, each router holds
exactly the simple paths built hop by hop by these rules, whatever order the messages came
in (per link they arrive in order, as TCP delivers them).

**Table.** Per destination: every route, shortest first, newest first among equal hop
counts (a learn sequence number). ``next_hop`` is the first route's ``path[0]``; with
round robin ``rotation`` is every neighbour with a route, sorted by name (stable while
routes come and go); otherwise ``(next_hop,)``. Events: ``DestinationAdded``, then
``RouteAdded``, then ``DestinationActivated`` for a first route; ``RouteRemoved``, then
``DestinationDeactivated``, then ``DestinationRemoved`` for a last one (static routes keep a
destination known, so they suppress the added/removed pair).

**Route length.** A route longer than ``max_hops`` (``max-route-hops``) is not stored:
its ADD is ignored and counted in :attr:`Output.refused` (the link stays: a correct peer
of a large network with an unlimited announce hop limit may send one), and a route of
``max_hops`` is not passed on (it would be longer at the neighbour). Longer than
:data:`MAX_PATH` breaks the protocol.

Logging: one DEBUG line per route added or removed (INFO with ``log_each``) and per send
decision; the swiftlet sums the changes up (one INFO line per batch, with counts).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator, Mapping

import attrs

from martinet.kernel import Event

from .api import (
    Destination,
    DestinationActivated,
    DestinationAdded,
    DestinationDeactivated,
    DestinationRemoved,
    RouteAdded,
    RouteRemoved,
)

__all__ = [
    "RouteExchanger",
    "RoutingTable",
    "Announcement",
    "Output",
    "RouteFilter",
    "FilterType",
    "BadAnnouncement",
    "MAX_PATH",
    "refusal",
]

MAX_PATH = 64
"""The longest route (hops) a router stores; a peer announcing a longer one breaks the protocol
(and a route this long is not passed on: it would become longer)."""

Path = tuple[str, ...]


class BadAnnouncement(ValueError):
    """A peer sent an announcement no correct router sends (malformed, a loop, a path through
    the receiver, too long). The caller should close the link to that peer."""


class FilterType(enum.StrEnum):
    """The four route filter types of SwiftMQ (``route-filter`` ``type`` attribute)."""

    INCLUDE_BY_HOP = "include_by_hop"
    EXCLUDE_BY_HOP = "exclude_by_hop"
    INCLUDE_BY_DESTINATION = "include_by_destination"
    EXCLUDE_BY_DESTINATION = "exclude_by_destination"


# type -> (which router of the path the filter tests, whether being in its set lets the route pass)
FILTER_RULES: dict[FilterType, tuple[int, bool]] = {
    FilterType.INCLUDE_BY_HOP: (0, True),  # the next hop: a "subnet" behind one neighbour
    FilterType.EXCLUDE_BY_HOP: (0, False),
    FilterType.INCLUDE_BY_DESTINATION: (-1, True),
    FilterType.EXCLUDE_BY_DESTINATION: (-1, False),
}


def _router_set(routers: Iterable[str]) -> frozenset[str]:
    if isinstance(routers, str):
        raise TypeError(f"a route filter takes a set of router names, not the string {routers!r}")
    return frozenset(routers)


@attrs.frozen
class RouteFilter:
    """A filter on what is announced to the neighbour it is named after.

    Attributes:
        type: which router of a route it tests (next hop or destination) and how.
        routers: the router names it tests against.
    """

    type: FilterType = attrs.field(converter=FilterType)
    routers: frozenset[str] = attrs.field(converter=_router_set)

    def passes(self, path: Path) -> bool:
        """Whether route ``path`` may be announced to the filter's neighbour."""
        index, member = FILTER_RULES[self.type]
        return (path[index] in self.routers) is member


@attrs.frozen
class Announcement:
    """One route exchange message: ``add`` (else remove) the sender's route ``path`` to
    ``destination`` (which is ``path[-1]``). Built by anyone; checked by the receiver."""

    add: bool
    destination: str
    path: Path


@attrs.frozen
class Output:
    """What an input produced.

    Attributes:
        sends: announcements to send, ``(neighbour, announcement)``, in this order (the order
            matters per neighbour only).
        events: the :mod:`.api` bus events, in the order the changes happened.
    """

    sends: list[tuple[str, Announcement]] = attrs.Factory(list)
    events: list[Event] = attrs.Factory(list)
    refused: int = 0  # routes received longer than max_hops, not stored


def refusal(
    neighbour: str, path: Path, hop_limit: int, route_filter: RouteFilter | None, max_hops: int = MAX_PATH
) -> str | None:
    """Why route ``path`` must not be announced to ``neighbour``, or None if it may be.

    The output rules of SwiftMQ's ``RouteExchanger`` (reference §2.6), in this order:
    ``hop_limit`` > 0 and hop count >= ``hop_limit``; the route has ``max_hops`` (the
    longest stored: it would be longer at the neighbour); the neighbour is the next hop; the
    neighbour is on the path (loop prevention); the neighbour's filter rejects the route.
    """
    if 0 < hop_limit <= len(path):
        return "hop limit"
    if len(path) >= max_hops:
        return "longest path"
    if path[0] == neighbour:
        return "its next hop"
    if neighbour in path:
        return "on its path"
    if route_filter is not None and not route_filter.passes(path):
        return f"filter {route_filter.type.value}"
    return None


def _check_name(router: object) -> str:
    if not isinstance(router, str) or not router:
        raise ValueError(f"a router name is a non-empty string, not {router!r}")
    return router


def _check_hop_limit(hop_limit: object) -> int:
    if not isinstance(hop_limit, int) or isinstance(hop_limit, bool) or hop_limit < -1:
        raise ValueError(f"the hop limit is an int >= -1 (-1: unlimited), not {hop_limit!r}")
    return hop_limit


def _check_filters(filters: Mapping[str, RouteFilter]) -> dict[str, RouteFilter]:
    checked = {}
    for neighbour, route_filter in filters.items():
        _check_name(neighbour)
        if not isinstance(route_filter, RouteFilter):
            raise TypeError(f"the filter for {neighbour} is not a RouteFilter: {route_filter!r}")
        checked[neighbour] = route_filter
    return checked


def _hops(path: Path) -> str:
    """``2 hops: lyon paris`` for the log."""
    return f"{len(path)} hop{'s' if len(path) > 1 else ''}: {' '.join(path)}"


def _order(paths: Iterable[Path]) -> list[Path]:
    """Shortest first, then by name: a stable order to send a batch of routes in."""
    return sorted(paths, key=lambda path: (len(path), path))


class RoutingTable:
    """The table itself: per destination every route with its learn sequence, and the
    static routes; a destination's row (:class:`Destination`) is built when read and kept
    until the destination changes. Each change appends its bus events to ``events``, in the
    order of the module docstring."""

    def __init__(self, *, round_robin: bool):
        self.round_robin = round_robin
        self._routes: dict[str, dict[Path, int]] = {}  # destination -> {route: learn sequence}; no empty dicts
        self._static: set[str] = set()
        self._rows: dict[str, Destination] = {}  # cache of destination(); dropped on every change
        self._seq = 0

    def destination(self, router: str) -> Destination | None:
        """The row for ``router``; None if it is not known (no route, no static route)."""
        row = self._rows.get(router)
        if row is not None:
            return row
        routes = self._routes.get(router)
        static = router in self._static
        if routes is None and not static:
            return None
        ordered = tuple(sorted(routes, key=lambda path: (len(path), -routes[path]))) if routes else ()
        next_hop = ordered[0][0] if ordered else None
        if self.round_robin:
            rotation = tuple(sorted({path[0] for path in ordered}))
        else:
            rotation = (next_hop,) if next_hop is not None else ()
        row = Destination(name=router, routes=ordered, static=static, next_hop=next_hop, rotation=rotation)
        self._rows[router] = row
        return row

    def known(self) -> int:
        """How many destinations are known (as ``len(destinations())``, without building rows)."""
        return len(self._routes) + sum(1 for router in self._static if router not in self._routes)

    def destinations(self) -> list[Destination]:
        """Every known destination, sorted by name."""
        rows: list[Destination] = []
        for name in sorted(self._routes.keys() | self._static):
            row = self.destination(name)
            assert row is not None  # it has routes or a static route: it is known
            rows.append(row)
        return rows

    def paths(self) -> Iterator[Path]:
        """Every route held."""
        return (path for routes in self._routes.values() for path in routes)

    def add(self, path: Path, events: list[Event]) -> None:
        destination = path[-1]
        routes = self._routes.get(destination)
        if routes is None:
            routes = self._routes[destination] = {}
            if destination not in self._static:
                events.append(DestinationAdded(router=destination))
        self._seq += 1
        routes[path] = self._seq
        self._rows.pop(destination, None)
        events.append(RouteAdded(router=destination, path=path))
        if len(routes) == 1:
            events.append(DestinationActivated(router=destination))

    def remove(self, path: Path, events: list[Event]) -> None:
        destination = path[-1]
        routes = self._routes[destination]
        del routes[path]
        self._rows.pop(destination, None)
        events.append(RouteRemoved(router=destination, path=path))
        if not routes:
            del self._routes[destination]
            events.append(DestinationDeactivated(router=destination))
            if destination not in self._static:
                events.append(DestinationRemoved(router=destination))

    def add_static(self, router: str, events: list[Event]) -> None:
        """Raises: ValueError: a static route to ``router`` exists already."""
        if router in self._static:
            raise ValueError(f"a static route to {router} exists already")
        self._static.add(router)
        self._rows.pop(router, None)
        if router not in self._routes:
            events.append(DestinationAdded(router=router))

    def remove_static(self, router: str, events: list[Event]) -> None:
        """Raises: ValueError: there is no static route to ``router``."""
        if router not in self._static:
            raise ValueError(f"no static route to {router!r}")
        self._static.remove(router)
        self._rows.pop(router, None)
        if router not in self._routes:
            events.append(DestinationRemoved(router=router))


class RouteExchanger:
    """One router's route exchange and routing table (see the module docstring).

    Not thread-safe and not reentrant: one task feeds it (the swiftlet serialises the
    link events and announcements of all links through it). The read methods
    (:meth:`destination`, :meth:`destinations`) are what ``api.Routing`` offers.
    """

    def __init__(
        self,
        local: str,
        *,
        hop_limit: int = 3,
        filters: Mapping[str, RouteFilter] | None = None,
        round_robin: bool = False,
        max_routes_per_link: int = 10_000,
        max_hops: int = MAX_PATH,
        log_each: bool = False,
        log: logging.Logger | None = None,
    ):
        """
        Args:
            local: this router's name.
            hop_limit: ``route-announce-hop-limit``: routes of this many hops or more are not
                announced; 0 or -1 means unlimited.
            filters: ``route-filters``, by the name of the neighbour they apply to.
            round_robin: ``roundrobin-enabled``: :attr:`Destination.rotation` lists every
                neighbour with a route instead of the next hop alone.
            max_routes_per_link: ``max-routes-per-link``: a neighbour announcing more routes
                breaks the protocol (:class:`BadAnnouncement`): one peer cannot fill every
                router's table (may be changed at any time: it applies to further ADDs).
            max_hops: ``max-route-hops``: the longest route stored (1 to :data:`MAX_PATH`);
                a longer one received is ignored and counted (may be changed at any time:
                it applies to further ADDs; :meth:`set_max_hops` sends the differences).
            log_each: ``route-log="each"``: each route added or removed at INFO, not DEBUG
                (may be changed at any time).
            log: the logger for route changes (default: this module's).

        Raises:
            ValueError: an empty name or a hop limit below -1.
            TypeError: a filter that is not a :class:`RouteFilter`.
        """
        self.local = _check_name(local)
        self._hop_limit = _check_hop_limit(hop_limit)
        self._filters = _check_filters(filters or {})
        self.table = RoutingTable(round_robin=round_robin)
        self.max_routes_per_link = max_routes_per_link
        self.max_hops = max_hops
        self.log_each = log_each
        self._log = log or logging.getLogger(__name__)
        self._learned: dict[str, set[Path]] = {}  # neighbour -> the routes learned over its link
        self._announced: dict[str, set[Path]] = {}  # neighbour -> the routes it was sent (and not withdrawn)
        self._sends: list[tuple[str, Announcement]] = []
        self._events: list[Event] = []

    # -- configuration ---------------------------------------------------------------------

    @property
    def hop_limit(self) -> int:
        return self._hop_limit

    @property
    def filters(self) -> Mapping[str, RouteFilter]:
        return dict(self._filters)

    @property
    def round_robin(self) -> bool:
        """Fixed at construction (``roundrobin-enabled`` is reboot-required in SwiftMQ too)."""
        return self.table.round_robin

    @property
    def neighbours(self) -> tuple[str, ...]:
        """The neighbours whose links are up, sorted."""
        return tuple(sorted(self._learned))

    # -- reading the table -----------------------------------------------------------------

    def destination(self, router: str) -> Destination | None:
        """The table's row for ``router``; None if it is not known (no route, no static route)."""
        return self.table.destination(router)

    def known(self) -> int:
        """How many destinations are known (as ``len(destinations())``, without building rows)."""
        return self.table.known()

    def destinations(self) -> list[Destination]:
        """Every known destination, sorted by name."""
        return self.table.destinations()

    def announced_to(self, neighbour: str) -> frozenset[Path]:
        """The routes (as held here) announced to ``neighbour`` and not withdrawn.

        Raises:
            ValueError: ``neighbour``'s link is not up.
        """
        if neighbour not in self._announced:
            raise ValueError(f"{neighbour} is not a neighbour of {self.local}")
        return frozenset(self._announced[neighbour])

    # -- inputs ----------------------------------------------------------------------------

    def link_up(self, neighbour: str) -> Output:
        """The link to ``neighbour`` reached its delivery stage: add the direct route and
        send the neighbour every route it should have (shortest first).

        Raises:
            ValueError: ``neighbour`` is this router, not a name, or its link is up already.
        """
        _check_name(neighbour)
        if neighbour == self.local:
            raise ValueError(f"{self.local} cannot link to itself")
        if neighbour in self._learned:
            raise ValueError(f"the link to {neighbour} is up already")
        self._learned[neighbour] = set()
        self._announced[neighbour] = set()
        self._add_route((neighbour,))
        for path in _order(self.table.paths()):
            self._offer(neighbour, path)
        return self._flush()

    def link_down(self, neighbour: str) -> Output:
        """The link to ``neighbour`` is gone: drop the routes learned over it (longest first,
        the direct route last) and withdraw them where they were announced.

        Raises:
            ValueError: the link to ``neighbour`` is not up.
        """
        if neighbour not in self._learned:
            raise ValueError(f"the link to {neighbour!r} is not up")
        learned = self._learned.pop(neighbour)
        del self._announced[neighbour]  # nothing to withdraw over a link that is gone
        for path in reversed(_order(learned)):
            self._remove_route(path)
        return self._flush()

    def receive(self, neighbour: str, announcement: Announcement) -> Output:
        """An announcement arrived over the link to ``neighbour``.

        Raises:
            BadAnnouncement: the peer broke the protocol (see :meth:`check`); nothing changed.
            ValueError: the link to ``neighbour`` is not up (a local error).
        """
        learned = self._learned.get(neighbour)
        if learned is None:
            raise ValueError(f"an announcement from {neighbour!r}, whose link is not up")
        path = self.check(neighbour, announcement)
        if announcement.add and len(path) > self.max_hops:
            if self._log.isEnabledFor(logging.DEBUG):
                self._log.debug("route from %s refused: %s (max-route-hops %d)", neighbour, _hops(path), self.max_hops)
            output = self._flush()
            return attrs.evolve(output, refused=1)
        if announcement.add:
            if path not in learned:
                if len(learned) >= self.max_routes_per_link:
                    raise BadAnnouncement(
                        f"{neighbour} announced more than max-routes-per-link {self.max_routes_per_link} routes"
                    )
                self._add_route(path)
        elif path in learned:
            self._remove_route(path)
        return self._flush()

    def set_max_hops(self, max_hops: int) -> Output:
        """Change ``max-route-hops`` at runtime: further ADDs are checked against it, and
        what the neighbours were announced follows it (routes stored stay until withdrawn)."""
        self.max_hops = max_hops
        for neighbour in self.neighbours:
            self._reconcile(neighbour)
        return self._flush()

    def set_hop_limit(self, hop_limit: int) -> Output:
        """Change ``route-announce-hop-limit`` at runtime: announce and withdraw the differences.

        Raises:
            ValueError: not an int >= -1.
        """
        self._hop_limit = _check_hop_limit(hop_limit)
        for neighbour in self.neighbours:
            self._reconcile(neighbour)
        return self._flush()

    def set_filters(self, filters: Mapping[str, RouteFilter]) -> Output:
        """Replace the route filters at runtime: announce and withdraw the differences, to
        the neighbours whose filter changed.

        Raises:
            TypeError, ValueError: as the constructor.
        """
        new = _check_filters(filters)
        changed = {name for name in new.keys() | self._filters.keys() if new.get(name) != self._filters.get(name)}
        self._filters = new
        for neighbour in self.neighbours:
            if neighbour in changed:
                self._reconcile(neighbour)
        return self._flush()

    def add_static(self, router: str) -> Output:
        """A static route: ``router`` is known (addressable) without routes. Not announced.

        Raises:
            ValueError: ``router`` is this router, not a name, or static already.
        """
        _check_name(router)
        if router == self.local:
            raise ValueError(f"a static route to the local router {router}")
        self.table.add_static(router, self._events)
        self._log.info("static route to %s added", router)
        return self._flush()

    def remove_static(self, router: str) -> Output:
        """Drop the static route to ``router``; it stays known while it has routes.

        Raises:
            ValueError: there is no static route to ``router``.
        """
        self.table.remove_static(router, self._events)
        self._log.info("static route to %s removed", router)
        return self._flush()

    def check(self, neighbour: str, announcement: Announcement) -> Path:
        """The route ``announcement`` from ``neighbour`` describes, as this router holds it
        (``(neighbour, *announcement.path)``).

        Raises:
            BadAnnouncement: not an :class:`Announcement`; ``add`` not a bool; the path empty,
                not a tuple or list of non-empty strings, or longer than :data:`MAX_PATH` once
                stored; the destination not its last router; a router twice in the stored
                path, or this router in it.
        """
        if not isinstance(announcement, Announcement):
            raise BadAnnouncement(f"not an announcement: {announcement!r}"[:200])
        raw = announcement.path
        if not isinstance(announcement.add, bool) or not isinstance(raw, tuple | list) or not raw:
            raise BadAnnouncement(f"malformed announcement from {neighbour}: {announcement!r}"[:200])
        if len(raw) >= MAX_PATH:
            raise BadAnnouncement(f"a route of {len(raw)} hops from {neighbour} (at most {MAX_PATH - 1})")
        if not all(isinstance(router, str) and router for router in raw):
            raise BadAnnouncement(f"a route with a bad router name from {neighbour}: {announcement!r}"[:200])
        path = (neighbour, *raw)
        if announcement.destination != path[-1]:
            raise BadAnnouncement(
                f"a route from {neighbour} to {announcement.destination!r} that ends at {path[-1]!r}"[:200]
            )
        if len(set(path)) != len(path) or self.local in path:
            raise BadAnnouncement(f"a looping route from {neighbour}: {path!r}"[:200])
        return path

    # -- the work --------------------------------------------------------------------------

    def _flush(self) -> Output:
        output = Output(sends=self._sends, events=self._events)
        self._sends, self._events = [], []
        return output

    def _add_route(self, path: Path) -> None:
        self.table.add(path, self._events)
        self._learned[path[0]].add(path)
        self._log_route(path, "added")
        for neighbour in self._announced:
            self._offer(neighbour, path)

    def _remove_route(self, path: Path) -> None:
        """Drop ``path`` from the table; the caller removed it from ``_learned`` (or the
        whole link entry), so this works during a link-down as well."""
        self.table.remove(path, self._events)
        learned = self._learned.get(path[0])
        if learned is not None:
            learned.discard(path)
        self._log_route(path, "removed")
        for neighbour, announced in self._announced.items():
            if path in announced:
                self._withdraw(neighbour, path)

    def _log_route(self, path: Path, what: str) -> None:
        level = logging.INFO if self.log_each else logging.DEBUG
        if self._log.isEnabledFor(level):
            self._log.log(level, "route to %s via %s (%s) %s", path[-1], path[0], _hops(path), what)

    def _offer(self, neighbour: str, path: Path) -> None:
        """Announce ``path`` to ``neighbour`` if the rules let it and it was not announced."""
        if path in self._announced[neighbour]:
            return
        why = refusal(neighbour, path, self._hop_limit, self._filters.get(neighbour), self.max_hops)
        if why is None:
            self._announced[neighbour].add(path)
            self._sends.append((neighbour, Announcement(add=True, destination=path[-1], path=path)))
        if self._log.isEnabledFor(logging.DEBUG):  # one decision per neighbour and change: keep it cheap
            if why is None:
                self._log.debug("announce %s to %s", " ".join(path), neighbour)
            else:
                self._log.debug("do not announce %s to %s: %s", " ".join(path), neighbour, why)

    def _withdraw(self, neighbour: str, path: Path) -> None:
        self._announced[neighbour].remove(path)
        self._sends.append((neighbour, Announcement(add=False, destination=path[-1], path=path)))
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("withdraw %s from %s", " ".join(path), neighbour)

    def _reconcile(self, neighbour: str) -> None:
        """Bring what ``neighbour`` was announced in line with the rules: withdrawals first,
        then additions, each shortest first."""
        announced = self._announced[neighbour]
        route_filter = self._filters.get(neighbour)
        wanted = {
            path
            for path in self.table.paths()
            if refusal(neighbour, path, self._hop_limit, route_filter, self.max_hops) is None
        }
        for path in _order(announced - wanted):
            self._withdraw(neighbour, path)
        for path in _order(wanted - announced):
            self._offer(neighbour, path)
