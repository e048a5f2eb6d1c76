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
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

from martinet.kernel import ManagementError, UsageList
from martinet.kernel.mgmt import Tree

__all__ = ["INTERVAL", "POINTS", "TRACKED", "History", "sparkline"]

INTERVAL = 10.0  # seconds between two points
POINTS = 360  # points kept: an hour

#: The usage lists followed, and which of their entries' values.
TRACKED: dict[str, tuple[str, ...]] = {
    "/sys$queuemanager/usage/queues": ("messages", "send-rate", "receive-rate"),
    "/sys$routing/usage/connections": ("messages-out-rate", "messages-in-rate"),
    "/sys$routing/usage/routing-table": ("backlog",),
    "/sys$jms/usage/connections": ("receive-rate", "send-rate"),
}

Key = tuple[str, str, str]  # (list path, entry name, value name)


class History:
    """The series of :data:`TRACKED` values of one router (see the module header)."""

    def __init__(self, tree: Tree, points: int = POINTS):
        self.tree = tree
        self.points = points
        self._series: dict[Key, array[float]] = {}

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
        for key in self._series.keys() - seen:
            del self._series[key]


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
