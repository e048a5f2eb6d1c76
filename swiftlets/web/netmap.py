"""The network map as data: routers and links with their states, built from what a router knows.

Theory of operation
-------------------
:func:`build_map` is pure: it takes one router's view — its own links with their exact
states (:class:`LinkView`, kept from ``sys$routing``'s ``LinkStateChanged`` events) and its
routing table (every known destination with its routes, each route a path of routers from
the next hop to the destination) — plus the map it built last time, and returns the new
:class:`NetworkMap`. Fed with the same kind of data gathered from other routers (a
management crawl), it draws their links the same way.

- A **local link** (this router to a neighbour) has the state the link reports
  (``operational``, ``connecting``, ``failed``, … see ``LinkState``), with its last error.
- A **reported link** (between two other routers) has the state its dialing router reports
  through ``sys$mgmt`` (``remote``: the last crawl's answers), exact as of that crawl.
- Any other **remote link** is inferred from the routes: each pair of routers next to each
  other on a path (this router prepended) is a link that carried that route announcement, so
  it was ``operational`` when the route came. Its state between announcements is not known
  here: only that it is in some path or not (no crawl, or a router that did not answer).
- A link seen before that is now in no path and no live local link is ``down``, with the
  time it went (``since``). It stays on the map as down; a link that comes back is
  operational again, with a new ``since``.

Routers: this one (``local``), every router on a path (``reachable``, with its smallest hop
count), and every other router known — a destination without routes (a static route), an
end of a down link, or one seen before (``unreachable``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["LinkView", "MapRouter", "MapEdge", "NetworkMap", "build_map", "DOWN", "OPERATIONAL"]

#: The state of a remote link inferred from routes (the link state's own name).
OPERATIONAL = "operational"
#: The state of a link seen before and in no route nor live local link now.
DOWN = "down"


@attrs.frozen(kw_only=True)
class LinkView:
    """This router's link to neighbour ``peer``: its state (a ``LinkState`` value), its
    last error, and since when (seconds since the epoch) it is in that state."""

    peer: str
    state: str
    since: float
    error: str = ""


@attrs.frozen(kw_only=True)
class MapRouter:
    """A router on the map: ``local``, ``reachable`` (``hops`` away) or ``unreachable``."""

    name: str
    state: str
    hops: int | None = None


@attrs.frozen(kw_only=True)
class MapEdge:
    """A link between routers ``a`` < ``b`` (names sorted: links have no direction here).

    Attributes:
        state: a ``LinkState`` value for a local link, ``operational`` for a link inferred
            from routes, ``down`` for one seen before and gone.
        since: when it got this state (seconds since the epoch).
        local: whether one end is the router that built the map (its state is exact).
        error: the link's last error (local links), or why it is shown down.
    """

    a: str
    b: str
    state: str
    since: float
    local: bool
    error: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.a, self.b


@attrs.frozen(kw_only=True)
class NetworkMap:
    """The routers and links as one router sees them; :meth:`to_json` for the web page."""

    local: str
    routers: tuple[MapRouter, ...] = ()
    edges: tuple[MapEdge, ...] = ()

    def edge(self, a: str, b: str) -> MapEdge | None:
        key = (min(a, b), max(a, b))
        return next((edge for edge in self.edges if edge.key == key), None)

    def router(self, name: str) -> MapRouter | None:
        return next((router for router in self.routers if router.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "local": self.local,
            "routers": [attrs.asdict(router) for router in self.routers],
            "edges": [attrs.asdict(edge) for edge in self.edges],
        }


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def build_map(
    local: str,
    links: Mapping[str, LinkView],
    routes: Mapping[str, Sequence[Sequence[str]]],
    previous: NetworkMap | None,
    now: float,
    remote: Mapping[str, Sequence[LinkView]] | None = None,
) -> NetworkMap:
    """The map of router ``local`` (see the module header).

    Args:
        local: the router whose view this is.
        links: its links by neighbour name (one per neighbour: the one that counts).
        routes: every known destination with its routes (paths from the next hop to the
            destination; empty for a destination known only by a static route).
        previous: the map built last time (None at first): links it had that are gone now
            are shown ``down``; unchanged states keep their ``since``.
        now: the time of this view, seconds since the epoch.
        remote: links other routers report, by router (each link once, by its dialing
            router; where both dial each other, an operational one counts). They replace the
            inferred state; this router's own links are not taken from here.
    """
    before = {edge.key: edge for edge in previous.edges} if previous is not None else {}
    edges: dict[tuple[str, str], MapEdge] = {}
    for peer, view in links.items():
        key = _key(local, peer)
        edges[key] = MapEdge(a=key[0], b=key[1], state=view.state, since=view.since, local=True, error=view.error)
    for router, views in (remote or {}).items():
        for view in views:
            key = _key(router, view.peer)
            if local in key or edges.get(key, None) is not None and edges[key].state == OPERATIONAL:
                continue
            edges[key] = MapEdge(a=key[0], b=key[1], state=view.state, since=view.since, local=False, error=view.error)
    hops: dict[str, int] = {}
    for paths in routes.values():
        for path in paths:  # the hot loop: every hop of every route (inlined for speed)
            a = local
            for count, b in enumerate(path, 1):
                if hops.get(b, count) >= count:
                    hops[b] = count
                key = (a, b) if a < b else (b, a)
                if key not in edges:
                    old = before.get(key)
                    since = old.since if old is not None and old.state == OPERATIONAL else now
                    edges[key] = MapEdge(a=key[0], b=key[1], state=OPERATIONAL, since=since, local=local in key)
                a = b
    for key, old in before.items():
        if key not in edges:
            edges[key] = (
                old
                if old.state == DOWN
                else attrs.evolve(old, state=DOWN, since=now, error=f"in no route of {local} since then")
            )
    routers = {local: MapRouter(name=local, state="local", hops=0)}
    for name, count in hops.items():
        if name != local:
            routers[name] = MapRouter(name=name, state="reachable", hops=count)
    known = set(routes) | {name for key in edges for name in key}
    if previous is not None:
        known.update(router.name for router in previous.routers)
    for name in known - routers.keys():
        routers[name] = MapRouter(name=name, state="unreachable")
    return NetworkMap(
        local=local,
        routers=tuple(sorted(routers.values(), key=lambda r: r.name)),
        edges=tuple(edges[key] for key in sorted(edges)),
    )
