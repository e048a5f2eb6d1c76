"""Route changes summed up for the log: one INFO line per batch, with counts.

A peer may announce or withdraw thousands of routes in one go (a link coming up sends its
whole table; a hostile one sends 64-hop paths by the thousand). One line per route made
megabytes of log and cost more than the change itself, so the exchanger logs each route at
DEBUG only and :class:`RouteChanges` counts them per neighbour: once changes come in, it
waits ``interval`` seconds for the rest of the batch and writes one line for all of them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import trio

from .api import RouteAdded, RouteRemoved
from .exchange import Output

__all__ = ["RouteChanges"]

LISTED = 10  # neighbours named in one line; the rest are summed up


class RouteChanges:
    """Counts of routes added, removed and refused per neighbour, since the last line."""

    def __init__(self) -> None:
        self.added: Counter[str] = Counter()
        self.removed: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.lines = 0
        self._pending = trio.Event()

    def note(self, output: Output, neighbour: str | None = None) -> None:
        """Count what ``output`` changed (``neighbour``: whose announcement it answers)."""
        for event in output.events:
            if isinstance(event, RouteAdded):
                self.added[event.path[0]] += 1
            elif isinstance(event, RouteRemoved):
                self.removed[event.path[0]] += 1
        if output.refused and neighbour is not None:
            self.refused[neighbour] += output.refused
        if self.added or self.removed or self.refused:
            self._pending.set()

    def line(self, destinations: int, max_hops: int) -> str | None:
        """The line for what was counted (None: nothing), and the counts start again."""
        neighbours = sorted(self.added.keys() | self.removed.keys() | self.refused.keys())
        if not neighbours:
            return None
        parts = []
        for name in neighbours[:LISTED]:
            part = f"{name} +{self.added[name]} -{self.removed[name]}"
            if self.refused[name]:
                part += f" ({self.refused[name]} refused: longer than max-route-hops {max_hops})"
            parts.append(part)
        if len(neighbours) > LISTED:
            parts.append(f"{len(neighbours) - LISTED} more neighbours")
        added, removed, refused = (sum(c.values()) for c in (self.added, self.removed, self.refused))
        self.added, self.removed, self.refused = Counter(), Counter(), Counter()
        self.lines += 1
        return (
            f"routes changed: {added} added, {removed} removed, {refused} refused, "
            f"{destinations} destinations now; per neighbour: {', '.join(parts)}"
        )

    async def run(
        self, log: logging.Logger, interval: float, destinations: Callable[[], int], max_hops: Callable[[], int]
    ) -> None:
        """Write a line ``interval`` seconds after the first change of each batch."""
        while True:
            await self._pending.wait()
            await trio.sleep(interval)
            self._pending = trio.Event()
            text = self.line(destinations(), max_hops())
            if text is not None:
                log.info("%s", text)
