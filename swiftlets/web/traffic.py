"""What the network map writes on its links and routers: messages/s over each link (both
ways) and the messages waiting in each router's queues.

This router's own are measured here, at each sample of the history (every 10 s): its live
routing links' rates from ``sys$routing``'s usage, its backlog from ``sys$queuemanager``'s.
Other routers' come with each crawl of the map (:meth:`Traffic.crawled`): a link's rate as
its dialing router reported it (:attr:`~martinet.swiftlets.mgmt.api.Link.rate`), a router's
backlog asked of it (``get /sys$queuemanager/usage``, read-only, this router's identity). A
router that does not answer has no backlog shown, rather than an old one.

Each sample also appends what is shown then, for every link and router, to a series of the
last hour (as :mod:`.history` keeps the pages' values; dropped with the link or router), and
the map carries each as a sparkline drawn here (``rate-history``, ``backlog-history``): the
map shows every rate and backlog with its last hour, the other routers' included.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import trio

from martinet.kernel import ManagementError, SwiftletContext, UsageList
from martinet.swiftlets.mgmt.api import NetworkMap, RequestFailed, link_rate

from .history import POINTS, sparkline

__all__ = ["Traffic"]


def _key(a: str, b: str) -> str:
    """A link's key as the map's edges have it: ``a|b``, the names in order."""
    return "|".join(sorted((a, b)))


class Traffic:
    """Rates by link and backlogs by router, for the map (see the module header)."""

    def __init__(self, context: SwiftletContext, changed: Callable[[], None]):
        self.context = context
        self.local = context.router_name
        self._changed = changed  # called when what is shown changes
        self.rates: dict[str, float] = {}
        self.backlogs: dict[str, int] = {}
        self._rate_history: dict[str, array[float]] = {}
        self._backlog_history: dict[str, array[float]] = {}

    def data(self) -> dict[str, Any]:
        return {
            "rates": self.rates,
            "backlogs": self.backlogs,
            "rate-history": {key: sparkline(points) for key, points in self._rate_history.items()},
            "backlog-history": {key: sparkline(points) for key, points in self._backlog_history.items()},
        }

    def _record(self) -> None:
        """One point of what is shown now, for each link and router; the series of those gone go."""
        for series, values in ((self._rate_history, self.rates), (self._backlog_history, self.backlogs)):
            for key in series.keys() - values.keys():
                del series[key]
            for key, value in values.items():
                points = series.get(key)
                if points is None:
                    points = series[key] = array("f")
                points.append(float(value))
                if len(points) > POINTS:
                    del points[0]

    def sample(self) -> None:
        """Measure this router's links and backlog now."""
        rates = {key: rate for key, rate in self.rates.items() if self.local not in key.split("|")}
        backlogs = dict(self.backlogs)
        tree = self.context.management
        try:
            backlogs[self.local] = int(tree.get("/sys$queuemanager/usage", "messages"))
        except ManagementError:
            pass
        try:
            links = tree.resolve("/sys$routing/usage/connections")
        except ManagementError:
            links = None
        if isinstance(links, UsageList):
            for entry in links.children.values():
                values = entry.properties()
                peer = values.get("routername")
                if peer and values.get("state") == "operational":
                    key = _key(self.local, peer)
                    rates[key] = rates.get(key, 0.0) + link_rate(values)
        self.rates, self.backlogs = rates, backlogs
        self._record()
        self._changed()  # (a new point of history, whether or not the values changed)

    async def crawled(self, network: NetworkMap, ask: Callable[..., Any], concurrency: int) -> None:
        """Take other routers' figures from a crawl, and ask each that answered for its backlog
        (``ask(router, verb, **args)``, up to ``concurrency`` at once)."""
        rates = {key: rate for key, rate in self.rates.items() if self.local in key.split("|")}
        for link in network.links:
            if self.local not in (link.source, link.target) and link.state == "operational":
                rates[_key(link.source, link.target)] = link.rate
        found = {self.local: self.backlogs[self.local]} if self.local in self.backlogs else {}
        limit = trio.CapacityLimiter(concurrency)

        async def backlog_of(router: str) -> None:
            try:
                async with limit:
                    found[router] = int(
                        (await ask(router, "get", path="/sys$queuemanager/usage"))["properties"]["messages"]
                    )
            except (RequestFailed, KeyError, TypeError, ValueError):  # not answering, or of an older release
                pass

        async with trio.open_nursery() as nursery:
            for router in network.routers:
                if router != self.local:
                    nursery.start_soon(backlog_of, router)
        self._set(rates, found)

    def _set(self, rates: dict[str, float], backlogs: dict[str, int]) -> None:
        if (rates, backlogs) != (self.rates, self.backlogs):
            self.rates, self.backlogs = rates, backlogs
            self._changed()
