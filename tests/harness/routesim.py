"""An in-memory network of route exchangers, and an independent reference of what it must converge to.

Used by tests/swiftlets/routing/test_exchange.py and bench/route_convergence.py. Nothing here is timed or
threaded: a :class:`Network` holds one :class:`RouteExchanger` per router and a FIFO per
directed link; :meth:`Network.deliver` hands over messages in random order across links but
in order on each link (what TCP gives). A link going down drops what was in flight on it,
both ways, and both ends learn at once; or one end learns first (a half-closed link: what it
sent earlier still arrives, what the other end sends meanwhile is lost).

The network checks the wire as it goes: an ADD sent twice on one link (between its coming up
and going down) or a REMOVE of a route not announced on it fails at once, and so does an
event sequence that breaks the order promised by ``api`` (:class:`TableFollower`).

:func:`reference_routes` computes, without the exchanger's code, the routes every router
must hold once the network is quiet: the simple paths ``v1 … vk`` from router ``v0`` along
up links where every ``v_i`` (i >= 1) may announce its route ``v_{i+1} … vk`` to ``v_{i-1}``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping

from martinet.swiftlets.routing.api import (
    DestinationActivated,
    DestinationAdded,
    DestinationDeactivated,
    DestinationRemoved,
    RouteAdded,
    RouteRemoved,
)
from martinet.swiftlets.routing.exchange import Announcement, Output, RouteExchanger, RouteFilter

Path = tuple[str, ...]
Filters = Mapping[str, Mapping[str, RouteFilter]]  # router -> neighbour -> filter


class TableFollower:
    """Rebuilds one router's table from its events alone, asserting their order."""

    def __init__(self, name: str):
        self.name = name
        self.known: set[str] = set()
        self.active: set[str] = set()
        self.routes: dict[str, set[Path]] = {}

    def follow(self, events: Iterable[object]) -> None:
        for event in events:
            router = event.router
            where = f"{self.name}: {event!r}"
            match event:
                case DestinationAdded():
                    assert router not in self.known, where
                    self.known.add(router)
                    self.routes[router] = set()
                case DestinationRemoved():
                    assert router in self.known and router not in self.active, where
                    assert not self.routes[router], where
                    self.known.remove(router)
                    del self.routes[router]
                case RouteAdded():
                    assert router in self.known and event.path[-1] == router, where
                    assert event.path not in self.routes[router], where
                    self.routes[router].add(event.path)
                case DestinationActivated():
                    assert router in self.known and router not in self.active and self.routes[router], where
                    self.active.add(router)
                case RouteRemoved():
                    assert event.path in self.routes[router], where
                    self.routes[router].remove(event.path)
                case DestinationDeactivated():
                    assert router in self.active and not self.routes[router], where
                    self.active.remove(router)
                case _:
                    raise AssertionError(f"unexpected event {where}")

    def check(self, exchanger: RouteExchanger) -> None:
        """The events told the whole story: they rebuild the exchanger's table."""
        rows = exchanger.destinations()
        assert {row.name for row in rows} == self.known
        assert {row.name for row in rows if row.active} == self.active
        for row in rows:
            assert set(row.routes) == self.routes[row.name], row.name
            assert len(row.routes) == len(set(row.routes))


class Network:
    """Routers ``names`` with their exchangers, links, and the messages in flight."""

    def __init__(
        self,
        names: Iterable[str],
        *,
        hop_limits: int | Mapping[str, int] = 3,
        filters: Filters | None = None,
        round_robin: bool = False,
        rng: random.Random | None = None,
    ):
        filters = filters or {}
        self.rng = rng or random.Random(0)
        self.routers: dict[str, RouteExchanger] = {}
        for name in names:
            limit = hop_limits if isinstance(hop_limits, int) else hop_limits[name]
            self.routers[name] = RouteExchanger(
                name, hop_limit=limit, filters=filters.get(name, {}), round_robin=round_robin
            )
        self.followers = {name: TableFollower(name) for name in self.routers}
        self.links: set[frozenset[str]] = set()  # up at both ends
        self.closing: dict[frozenset[str], str] = {}  # link -> the end that dropped it (the other has not yet)
        self.queues: dict[tuple[str, str], deque[Announcement]] = {}
        self.wire: dict[tuple[str, str], set[Path]] = {}  # what was announced on the link now up
        self._busy: list[tuple[str, str]] = []  # directed links with messages in flight
        self._busy_at: dict[tuple[str, str], int] = {}
        self.adds = self.removes = self.lost = 0

    @property
    def sent(self) -> int:
        return self.adds + self.removes

    # -- links -----------------------------------------------------------------------------

    def link_up(self, a: str, b: str) -> None:
        key = frozenset((a, b))
        assert key not in self.links and key not in self.closing and a != b
        self.links.add(key)
        for pair in ((a, b), (b, a)):
            self.queues[pair] = deque()
            self.wire[pair] = set()
        self.apply(a, self.routers[a].link_up(b))
        self.apply(b, self.routers[b].link_up(a))

    def link_down(self, a: str, b: str, *, half: bool = False) -> None:
        """The link between ``a`` and ``b`` fails: both ends learn at once; with ``half``, ``a``
        only: what it sent before still reaches ``b``, what ``b`` sends now is lost, until
        :meth:`link_down` is called again for the link (``b`` learns too). On a half-closed
        link, that is all one can do (the connect stage admits a router name only once)."""
        key = frozenset((a, b))
        if key in self.closing:
            first = self.closing.pop(key)
            other = b if first == a else a
            self._drop(first, other)
            self._drop(other, first)
            self.apply(other, self.routers[other].link_down(first))
            return
        self.links.remove(key)
        if half:
            self.closing[key] = a
            self._drop(b, a, keep_wire=True)  # b still sends (into the void) until it learns
            self.apply(a, self.routers[a].link_down(b))
            return
        self._drop(a, b)
        self._drop(b, a)
        self.apply(a, self.routers[a].link_down(b))
        self.apply(b, self.routers[b].link_down(a))

    def _drop(self, sender: str, receiver: str, *, keep_wire: bool = False) -> None:
        pair = (sender, receiver)
        if pair in self.queues:
            self.lost += len(self.queues.pop(pair))
            if pair in self._busy_at:
                self._idle(pair)
        if not keep_wire:
            self.wire.pop(pair, None)

    # -- messages --------------------------------------------------------------------------

    def apply(self, name: str, output: Output) -> None:
        """Follow ``name``'s events and put its announcements on the wire, checking both."""
        self.followers[name].follow(output.events)
        for neighbour, announcement in output.sends:
            pair = (name, neighbour)
            assert pair in self.wire, f"{name} sent to {neighbour} without a link"
            wire = self.wire[pair]
            if announcement.add:
                assert announcement.path not in wire, f"{name} sent ADD {announcement.path} to {neighbour} twice"
                wire.add(announcement.path)
                self.adds += 1
            else:
                assert announcement.path in wire, f"{name} withdrew {announcement.path} from {neighbour} unannounced"
                wire.remove(announcement.path)
                self.removes += 1
            if pair not in self.queues:  # the neighbour dropped the link already
                self.lost += 1
                continue
            self.queues[pair].append(announcement)
            if pair not in self._busy_at:
                self._busy_at[pair] = len(self._busy)
                self._busy.append(pair)

    def _idle(self, pair: tuple[str, str]) -> None:
        index = self._busy_at.pop(pair)
        last = self._busy.pop()
        if last != pair:
            self._busy[index] = last
            self._busy_at[last] = index

    @property
    def pending(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def deliver(self, count: int | None = None) -> int:
        """Deliver up to ``count`` messages (all, with None), each from a random busy link."""
        delivered = 0
        while self._busy and (count is None or delivered < count):
            pair = self._busy[self.rng.randrange(len(self._busy))]
            queue = self.queues[pair]
            announcement = queue.popleft()
            if not queue:
                self._idle(pair)
            sender, receiver = pair
            self.apply(receiver, self.routers[receiver].receive(sender, announcement))
            delivered += 1
        return delivered

    def settle(self) -> int:
        """Deliver until nothing is in flight; the number of messages delivered."""
        return self.deliver()

    # -- reading -----------------------------------------------------------------------------

    def routes(self, name: str) -> frozenset[Path]:
        """Every route ``name`` holds."""
        return frozenset(path for row in self.routers[name].destinations() for path in row.routes)

    def check_events(self) -> None:
        for name, follower in self.followers.items():
            follower.check(self.routers[name])


# -- the reference ---------------------------------------------------------------------------


def may_announce(holder: str, receiver: str, route: Path, hop_limits: Mapping[str, int], filters: Filters) -> bool:
    """The output rules, written out again for the reference (not the exchanger's code)."""
    limit = hop_limits[holder]
    if limit > 0 and len(route) >= limit:
        return False
    if receiver in route:
        return False
    route_filter = filters.get(holder, {}).get(receiver)
    if route_filter is None:
        return True
    kind = route_filter.type.value
    tested = route[0] if kind.endswith("_by_hop") else route[-1]
    inside = tested in route_filter.routers
    return inside if kind.startswith("include") else not inside


def reference_routes(
    names: Iterable[str], links: Iterable[frozenset[str]], hop_limits: Mapping[str, int], filters: Filters
) -> dict[str, frozenset[Path]]:
    """Router -> every route it must hold once the network is quiet (see the module docstring)."""
    names = list(names)
    neighbours: dict[str, set[str]] = {name: set() for name in names}
    for link in links:
        a, b = sorted(link)
        neighbours[a].add(b)
        neighbours[b].add(a)

    def valid(origin: str, path: Path) -> bool:
        chain = (origin, *path)
        return all(
            may_announce(chain[i], chain[i - 1], chain[i + 1 :], hop_limits, filters) for i in range(1, len(chain) - 1)
        )

    def limit_passed(origin: str, path: Path) -> bool:
        """Some router on ``path`` already holds too long a route: longer paths fail too."""
        chain = (origin, *path)
        return any(0 < hop_limits[chain[i]] <= len(chain) - 1 - i for i in range(1, len(chain) - 1))

    result = {}
    for origin in names:
        found: set[Path] = set()
        stack: list[Path] = [(n,) for n in neighbours[origin]]
        while stack:
            path = stack.pop()
            if limit_passed(origin, path):
                continue  # the hop limits only get worse as the path grows
            if valid(origin, path):
                found.add(path)
            for nxt in neighbours[path[-1]]:
                if nxt != origin and nxt not in path:
                    stack.append((*path, nxt))
        result[origin] = frozenset(found)
    return result


def reference_announced(
    routes: Mapping[str, frozenset[Path]],
    links: Iterable[frozenset[str]],
    hop_limits: Mapping[str, int],
    filters: Filters,
) -> dict[tuple[str, str], frozenset[Path]]:
    """(holder, neighbour) -> the routes the holder should have announced over each up link."""
    result = {}
    for link in links:
        a, b = sorted(link)
        for holder, receiver in ((a, b), (b, a)):
            result[holder, receiver] = frozenset(
                path for path in routes[holder] if may_announce(holder, receiver, path, hop_limits, filters)
            )
    return result


def shortest(routes: Iterable[Path]) -> dict[str, int]:
    """Destination -> its shortest hop count."""
    best: dict[str, int] = {}
    for path in routes:
        best[path[-1]] = min(best.get(path[-1], len(path)), len(path))
    return best


def ring(count: int) -> tuple[list[str], list[tuple[str, str]]]:
    names = [f"r{i:02d}" for i in range(count)]
    return names, [(names[i], names[(i + 1) % count]) for i in range(count)]


def mesh(count: int) -> tuple[list[str], list[tuple[str, str]]]:
    names = [f"m{i:02d}" for i in range(count)]
    return names, [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
