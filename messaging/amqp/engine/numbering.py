"""The numbering of our channels and handles. After the peer's detach (end) answers ours,
the handle (channel) is free for a new link (session). Ours are the lowest free ones,
taken in O(log n) (:class:`_Numbered`), and a peer's attach finds the link of ours it
answers by name in O(1) (:attr:`.Session._awaiting`): a peer with thousands of sessions or
links costs linear time, never quadratic."""

from __future__ import annotations

import heapq
from typing import Any


class _Numbered(dict[int, Any]):
    """Our channels (a connection's sessions) or handles (a session's links), by number.
    :meth:`take` gives the lowest number not in use — a freed one (a heap) if any, else the
    next never used — in O(log n); :meth:`free` gives one back. (A scan from 0 made a peer
    attaching 30,000 links on one session, or beginning thousands of sessions, cost
    quadratic time and stalled the router.)"""

    __slots__ = ("_freed", "_next")

    def __init__(self) -> None:
        super().__init__()
        self._freed: list[int] = []  # a heap of numbers given back
        self._next = 0  # the lowest number never taken

    def take(self) -> int:
        """The number for a new entry (set it before the next :meth:`take`)."""
        if self._freed:
            return heapq.heappop(self._freed)
        self._next += 1
        return self._next - 1

    def free(self, number: int) -> None:
        """Forget the entry of ``number``; it is taken again before any higher one."""
        del self[number]
        heapq.heappush(self._freed, number)

    def clear(self) -> None:
        super().clear()
        self._freed.clear()
        self._next = 0
