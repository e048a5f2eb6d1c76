"""The last hour of this router's rates and backlogs, and their sparklines.

At each :meth:`History.sample` (every :data:`INTERVAL` seconds, by the swiftlet) it reads
the values of :data:`TRACKED` from the management tree (each entry of those usage lists: a
queue's backlog and rates, a routing link's messages/s each way, a destination's ``rt$``
backlog, a client connection's rates) and appends one point to each entry's series, keeping
the last :data:`POINTS` (an hour). A series is an ``array('f')`` (4 bytes a point, about
1.5 KiB for an hour), and the series of an entry that is gone are dropped at the next
sample, so the memory is bounded by the entries that exist (``bench/web_bench.py
--history`` measures it).

:func:`sparkline` draws a series as a small inline SVG on the server: no script, nothing
fetched, so the pages work with no network beyond the router.

Other routers' pages are drawn by this router's web view from what those routers' own web
views keep: each history is also in its router's management tree, one usage list per
followed list (:data:`LISTED`, e.g. ``/sys$web/usage/history-queues/<queue>``, whose values
are the entry's series), which this router reads through ``sys$mgmt`` like any other usage.
There a series has one point a minute (the mean of its six): an hour of a value is 60
numbers, so even a router with thousands of queues answers within one management reply.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from functools import partial

from martinet.kernel import ManagementError, Usage, UsageList
from martinet.kernel.mgmt import Tree

__all__ = ["INTERVAL", "LISTED", "PER_MINUTE", "POINTS", "TRACKED", "History", "sparkline"]

INTERVAL = 10.0  # seconds between two points
POINTS = 360  # points kept: an hour

#: The usage lists followed, and which of their entries' values.
TRACKED: dict[str, tuple[str, ...]] = {
    "/sys$queuemanager/usage/queues": ("messages", "send-rate", "receive-rate"),
    "/sys$routing/usage/connections": ("messages-out-rate", "messages-in-rate"),
    "/sys$routing/usage/routing-table": ("backlog",),
    "/sys$jms/usage/connections": ("receive-rate", "send-rate"),
}

#: The usage list of ``sys$web`` that holds each followed list's series, by its path.
LISTED: dict[str, str] = {
    "/sys$queuemanager/usage/queues": "history-queues",
    "/sys$routing/usage/connections": "history-links",
    "/sys$routing/usage/routing-table": "history-routes",
    "/sys$jms/usage/connections": "history-connections",
}
PER_MINUTE = 6  # points of :data:`INTERVAL` in one point of a series read by another router

Key = tuple[str, str, str]  # (list path, entry name, value name)


class History:
    """The series of :data:`TRACKED` values of one router (see the module header)."""

    def __init__(self, tree: Tree, points: int = POINTS):
        self.tree = tree
        self.points = points
        self._series: dict[Key, array[float]] = {}
        self._lists: dict[str, UsageList] = {}  # the usage lists of LISTED, once published
        self._listed: set[tuple[str, str]] = set()  # (list path, entry name) in them
        self._minutes: dict[Key, array[float]] = {}  # once published: a point a minute, an hour of them
        self._sampled: dict[Key, int] = {}  # points taken of each, for the minutes

    def publish(self, usage: Usage) -> None:
        """Keep the series in ``usage`` (``sys$web``'s) too, for other routers' web views."""
        self._lists = {path: usage.add_list(name) for path, name in LISTED.items()}

    def minutes(self, path: str, entry: str) -> dict[str, list[float]]:
        """The series of one entry of the list at ``path``, a point a minute (the mean of each
        :data:`PER_MINUTE` points, kept as they come: a read costs no arithmetic), by value name."""
        found: dict[str, list[float]] = {}
        for value in TRACKED[path]:
            minutes = self._minutes.get((path, entry, value))
            if minutes:
                found[value] = list(minutes)
        return found

    def series(self, path: str, entry: str, name: str) -> Sequence[float]:
        """The points of one value, oldest first (empty if it is not followed)."""
        return self._series.get((path, entry, name), ())

    def sample(self) -> None:
        """Append one point to every followed value; drop the series of entries gone."""
        seen: set[Key] = set()
        for path, names in TRACKED.items():
            try:
                node = self.tree.resolve(path)
            except ManagementError:  # that swiftlet does not run here
                continue
            assert isinstance(node, UsageList)
            for entry_name, entry in node.children.items():
                values = entry.properties()
                for name in names:
                    value = values.get(name)
                    if not isinstance(value, int | float) or isinstance(value, bool):
                        continue
                    key = (path, entry_name, name)
                    seen.add(key)
                    points = self._series.get(key)
                    if points is None:
                        points = self._series[key] = array("f")
                    points.append(float(value))
                    if len(points) > self.points:
                        del points[0]
                    if self._lists:
                        self._minute(key, points)
        for key in self._series.keys() - seen:
            del self._series[key]
            self._minutes.pop(key, None)
            self._sampled.pop(key, None)
        if self._lists:
            self._list({(path, entry) for path, entry, _ in seen})

    def _minute(self, key: Key, points: array[float]) -> None:
        """After every :data:`PER_MINUTE` points of ``key``, their mean as a point a minute."""
        taken = self._sampled[key] = self._sampled.get(key, 0) + 1
        if taken % PER_MINUTE == 0:
            minutes = self._minutes.get(key)
            if minutes is None:
                minutes = self._minutes[key] = array("d")  # (doubles: the rounded value, exactly)
            minutes.append(float(f"{sum(points[-PER_MINUTE:]) / PER_MINUTE:.4g}"))
            if len(minutes) > self.points // PER_MINUTE:
                del minutes[0]

    def _list(self, entries: set[tuple[str, str]]) -> None:
        """Bring the usage lists in line with the entries that have series now."""
        for path, entry in self._listed - entries:
            self._lists[path].remove(entry)
        for path, entry in entries - self._listed:
            self._lists[path].add(entry, partial(self.minutes, path, entry))
        self._listed = entries


WIDTH, HEIGHT = 120, 22


def sparkline(points: Sequence[float], span: int = POINTS) -> str:
    """``points`` (oldest first, one per :data:`INTERVAL`) as an inline SVG polyline over the
    last ``span`` intervals, right-aligned (a series younger than that starts later); its
    title says the last and the highest value. "" for no points."""
    if not points:
        return ""
    top = max(points)
    scale = (HEIGHT - 2) / top if top > 0 else 0.0
    step = WIDTH / max(span - 1, 1)
    first = span - len(points)
    coordinates = " ".join(
        f"{(first + index) * step:.1f},{HEIGHT - 1 - value * scale:.1f}" for index, value in enumerate(points)
    )
    last = points[-1]
    title = f"last hour: now {_number(last)}, highest {_number(top)}"
    x, y = coordinates.rsplit(" ", 1)[-1].split(",")
    return (
        f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'data-points="{len(points)}" data-last="{_number(last)}"><title>{title}</title>'
        f'<polyline points="{coordinates}" fill="none" stroke="#4a78c8"/>'
        f'<circle cx="{x}" cy="{y}" r="1.5" fill="#4a78c8"/></svg>'
    )


def _number(value: float) -> str:
    return str(int(value)) if math.isfinite(value) and value == int(value) else f"{value:.1f}"
