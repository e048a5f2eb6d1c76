"""What a queue holds and counts, and what it needs from the manager that holds it.

Theory of operation
-------------------
A queue counts its entries not yet gone (``size``, ``bytes``, and of those the swapped-out
ones) against ``max-messages`` and ``max-bytes``, together with what transactions will add
at their commit (``reserved``); what its entries keep in memory counts against the
router's memory budget (:mod:`.memory`). Senders waiting for room are called back when
entries leave, a reservation ends, or the limits change; producers held back by flow
control when the backlog is down again (:meth:`QueueState.check_backlog`). Message ids are
remembered for duplicate detection, the oldest forgotten beyond the backlog size.
"""

from __future__ import annotations

import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .api import QueueError, QueueFull
from .config import QueueSettings
from .entry import Entry
from .flow import FlowController
from .level import Level
from .memory import ENTRY_COST, PACKED_COST, MemoryAlarm

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue import Queue

__all__ = ["QueueServices", "QueueState"]

_FRESH_TRIM = 256  # QueueState._fresh: what every selector consumer has seen is dropped from this length on
_FRESH_MOST = 4096  # and it is never longer


def _weakly(method: Callable[[int], None]) -> Callable[[int], None]:
    """``method`` (a queue's) called through a weak reference: a queue and its levels would
    otherwise be a reference cycle, which only the cyclic collector frees, and the running
    router runs that rarely (each connection's temporary queues are deleted with it)."""
    reference = weakref.WeakMethod(method)

    def call(count: int) -> None:
        bound = reference()
        if bound is not None:
            bound(count)

    return call


class QueueServices(Protocol):
    """What a queue needs from the manager that holds it: persistence of what leaves or
    changes, and dead letters; the manager implements it. Each method is called
    synchronously, in the router's trio thread, and raises nothing.
    """

    def expire(self, queue: Queue, entry: Entry, to_dlq: bool | None = None) -> None:
        """``entry``, just taken out of ``queue``'s levels, has expired: count it, adjust the
        queue's size, and drop it or move it to routerdlq (as ``to_dlq`` says, else as the
        queue's ``expired-to-dlq`` does)."""

    def dead_letter(self, source: Queue, entry: Entry, reason: str) -> None:
        """Move ``entry``, which left ``source`` (its size already adjusted), to routerdlq
        with ``reason`` (or drop it, logged, when routerdlq refuses it)."""

    def persist_removal(self, entry: Entry) -> None:
        """A persistent ``entry`` was consumed: delete it from the store (in the background)."""

    def persist_delivery_count(self, entry: Entry) -> None:
        """A persistent ``entry``'s delivery count changed: store it (in the background)."""

    def persist_message(self, entry: Entry) -> None:
        """A persistent ``entry``'s message was replaced (annotated): store its bytes (in the
        background)."""

    @property
    def memory(self) -> MemoryAlarm:
        """The router's memory budget, which a queue's entries count against."""

    def read_back(self, queue: Queue, entries: list[Entry]) -> None:
        """Read the stored bytes of the swapped-out ``entries`` of ``queue`` back from the
        store, in the background, and hand them to :meth:`Queue.fill` (None if the read
        failed)."""


class QueueState(ABC):
    """A queue's state, its counts and its limits: the base of :class:`.queue.Queue`, whose
    other parts (:class:`.paging.Paging`, :class:`.dispatch.Dispatcher`) build on it."""

    def __init__(self, manager: QueueServices, name: str, settings: QueueSettings, *, owner: Any = None):
        self.manager = manager
        self.name = name
        self.settings = settings
        self.owner = owner  # a temporary queue's owner (deleted with it)
        packed = _weakly(self._packed)  # (levels must not keep their queue alive: see _weakly)
        self._levels = [Level(priority, packed) for priority in range(10)]
        self._highest_first = self._levels[::-1]  # the same levels, in delivery order
        self.available = 0  # entries in the levels
        self.size = 0  # entries of this queue not yet gone (available, delivered, held)
        self.bytes = 0  # their Entry.bytes, for max-bytes
        self.swapped = 0  # of those, entries whose bytes are only in the store (Entry.swapped)
        self.swapped_bytes = 0  # and their Entry.bytes
        self.packed = 0  # of those, entries kept in a level's packs (see .level)
        self._memory = manager.memory
        self.memory = 0  # what its entries count against the router's memory budget (see .memory)
        self._reading = False  # a read_back is under way
        self._read_ahead_below = (0, 0)  # (entries, bytes) in memory under which the next batch is read
        self.consumers: list[Consumer] = []
        self._ready: deque[Consumer] = deque()
        self._parked: list[Consumer] = []
        self.flow = FlowController()
        self._ids: set[str] = set()
        self._id_order: deque[str] = deque()
        self.deleted = False
        self.backlog_callbacks: list[Callable[[], None]] = []  # see QueueManager.when_backlog_cleared
        self.room_callbacks: list[Callable[[], None]] = []  # see QueueManager.when_room
        # entry id → the serials of consumers that must not get it (undeliverable-here): rare
        self.excluded: dict[int, tuple[int, ...]] = {}
        # what transactions will add at their commit (prepared, or committing to the store):
        # counted against max-messages/max-bytes, or several would each find room for themselves
        self.reserved = self.reserved_bytes = 0
        self._unselectable: set[str] = set()  # selectors that met an entry they could not evaluate (logged)
        # entries made available since the selector consumers last looked (Consumer.seen):
        # kept while the queue has such consumers (_selective), at most _FRESH_MOST of them
        self._fresh: list[Entry] = []
        self._selective = 0
        # counters
        self.enqueued = self.dequeued = self.expired = self.dead_lettered = self.duplicates = 0
        self.swapped_out = self.reads = self.read_back_count = 0
        self.send_rate = self.receive_rate = 0.0
        self._rate_mark = (time.monotonic(), 0, 0)
        self.next_cleanup = time.monotonic() + settings.cleanup_interval / 1000

    def __repr__(self) -> str:
        return f"<Queue {self.name} size={self.size}>"

    @property
    def volatile(self) -> int:
        """Non-persistent messages waiting, or delivered and not settled: what a stop loses
        (counted when asked: an operator's halt, a stopping router's last transfers)."""
        waiting = sum(not entry.persistent for level in self._levels for entry in level.in_memory())
        return waiting + sum(not entry.persistent for c in self.consumers for entry in c.unsettled.values())

    @property
    def backlog(self) -> int:
        """What flow control measures: the entries waiting for a consumer or delivered and
        unsettled, not those held in transactions. A routing link holds a window's worth of
        messages in its transactions for as long as a round trip takes (thousands, across
        continents): counted, they would slow the link's producers while it is doing well.
        What transactions hold is bounded by their owners (a link's window)."""
        backlog = self.available
        for consumer in self.consumers:  # (a loop: asked for each message sent to a busy queue)
            backlog += len(consumer.unsettled)
        return backlog

    def flow_delay(self, now: int) -> int:
        """The flow-control delay for a producer sending now (ms; ``now`` in ms since the epoch)."""
        start = self.settings.flowcontrol_start_queuesize
        if start < 0 or self.size <= start:  # (the backlog is never larger than the size)
            return 0
        backlog = self.backlog  # (below the start, as often in a routing queue whose entries are held: no delay)
        return 0 if backlog <= start else self.flow.delay(self.settings, backlog, len(self.consumers), now)

    def _note_fresh(self, entry: Entry) -> None:
        """``entry`` became available: the selector consumers that looked at every entry
        before look only at it and the others since (:meth:`.dispatch.Dispatcher._take`).
        What all of them have seen is forgotten; one that has not looked for a long time
        (it has no credit) looks at every entry again rather than keep more."""
        fresh = self._fresh
        fresh.append(entry)
        if len(fresh) < _FRESH_TRIM:
            return
        seen = min((c.seen for c in self.consumers if c.seen is not None), default=len(fresh))
        del fresh[:seen]
        too_many = len(fresh) >= _FRESH_MOST
        for consumer in self.consumers:
            if consumer.seen is not None:
                consumer.seen = None if too_many else consumer.seen - seen
        if too_many:
            fresh.clear()

    def _packed(self, count: int) -> None:
        """``count`` of this queue's entries went into packs (negative: came out): they cost
        :data:`.memory.PACKED_COST` instead of :data:`.memory.ENTRY_COST` each."""
        self.packed += count
        if not self.deleted:
            saved = count * (ENTRY_COST - PACKED_COST)
            self.memory -= saved
            self._memory.add(-saved)

    def check_room(self, extra: int = 1, extra_bytes: int = 0) -> None:
        """Raises: QueueFull when ``extra`` more messages of ``extra_bytes`` together would
        exceed ``max-messages`` or ``max-bytes``."""
        settings = self.settings
        if self.size + self.reserved + extra > settings.max_messages >= 0:
            raise QueueFull(f"queue {self.name} is full ({settings.max_messages} messages)", self.name)
        if self.bytes + self.reserved_bytes + extra_bytes > settings.max_bytes >= 0:
            raise QueueFull(f"queue {self.name} is full ({settings.max_bytes} bytes)", self.name)
        if self.deleted:
            raise QueueError(f"queue {self.name} has been deleted")

    def is_duplicate(self, key: str | None, possible_duplicate: bool) -> bool:
        if key is None or not self.settings.duplicate_detection_enabled:
            return False
        if possible_duplicate or self.settings.duplicate_check == "always":
            return key in self._ids
        return False

    def remember(self, key: str) -> None:
        if key in self._ids:
            return
        self._ids.add(key)
        self._id_order.append(key)
        if len(self._id_order) > self.settings.duplicate_detection_backlog_size:
            self._ids.discard(self._id_order.popleft())

    def count(self, entry: Entry) -> None:
        """``entry`` is one of this queue's now (in its size, bytes and swapped counts, and
        in the router's memory)."""
        self.size += 1
        self.bytes += entry.bytes
        if entry.swapped:
            self.swapped += 1
            self.swapped_bytes += entry.bytes
            resident = len(entry._message) + ENTRY_COST  # (Entry.resident, inlined: this runs per message)
        else:
            resident = entry.bytes + ENTRY_COST
        if not self.deleted:
            self.memory += resident
            self._memory.add(resident)

    def uncount(self, entry: Entry) -> None:
        """``entry`` left this queue (consumed, expired, dead-lettered): out of its counts."""
        self.size -= 1
        self.bytes -= entry.bytes
        if entry.swapped:
            self.swapped -= 1
            self.swapped_bytes -= entry.bytes
            resident = len(entry._message) + ENTRY_COST
        else:
            resident = entry.bytes + ENTRY_COST
        if not self.deleted:  # (a deleted queue gave its whole share back at once: drop_all)
            self.memory -= resident
            self._memory.add(-resident)
        if self.excluded:
            self.excluded.pop(entry.id, None)
        if self.room_callbacks:
            self.room_made()

    def reserve(self, count: int, size: int) -> None:
        """A transaction will add ``count`` entries of ``size`` bytes at its commit."""
        self.reserved += count
        self.reserved_bytes += size

    def unreserve(self, count: int, size: int) -> None:
        """What :meth:`reserve` counted was added, or will not be."""
        self.reserved -= count
        self.reserved_bytes -= size
        if self.room_callbacks:
            self.room_made()

    def room_made(self) -> None:
        """Entries left, a reservation ended, the limits or the queue itself changed: the
        senders waiting for room look again (each calls back when it finds none)."""
        callbacks, self.room_callbacks = self.room_callbacks, []
        for callback in callbacks:
            callback()

    def check_backlog(self) -> None:
        """Entries left or went into a transaction: call the producers' flow-control waits
        back once the backlog is down to ``flowcontrol-start-queuesize`` (see
        QueueManager.when_backlog_cleared)."""
        if self.backlog_callbacks and self.backlog <= self.settings.flowcontrol_start_queuesize:
            callbacks, self.backlog_callbacks = self.backlog_callbacks, []
            for callback in callbacks:
                callback()

    @abstractmethod
    def _dispatch(self) -> None:
        """Give available entries to ready consumers (:class:`.dispatch.Dispatcher`)."""
