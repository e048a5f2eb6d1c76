"""One queue: its messages by priority, its consumers, credit-driven delivery and outcomes.

Theory of operation
-------------------
A message in a queue is an :class:`Entry` (the shared, immutable
:class:`messaging.message.Message` plus this queue's state of it). An entry is, in turn:

- **available**: in its priority level (ten levels, 9 served first; within a level
  ascending id, so FIFO; swapped-out entries packed there: :mod:`.level`);
- **delivered**: handed to one consumer, which must settle it (accept, release, reject,
  modify) — or a transaction that acknowledged it holds it (**held**);
- **gone**: accepted, expired or dead-lettered.

An entry leaves its level when it is delivered and goes back to its place (by id) when
it is released, so order and priority survive redelivery. Going back marks it
``acquired`` (AMQP 1.0 §3.2.1: its next delivery must say first-acquirer false) and, for a
failed delivery, counts it in ``delivery_count`` (the consumer's listener adds that to the
count the producer put in the header). A consumer that answers modified with
undeliverable-here (§3.4.5) is put on the entry's list in ``Queue.excluded``: dispatch passes that
consumer over for that entry, which waits for another consumer if need be; the list
names consumers by serial number, so a closed consumer's entry is simply never matched
again.

Delivery is credit-driven (:mod:`.dispatch`); a queue keeps at most its cache's bytes in
memory (:mod:`.paging`); its counts and limits are in :mod:`.state`, its entries in
:mod:`.entry`, its consumers in :mod:`.consumer`, flow control in :mod:`.flow`.

Expired entries are never delivered: dispatch and the periodic cleanup remove them
(optionally to ``routerdlq``). Everything here is synchronous and runs in the router's
trio thread; persistence and dead letters are the manager's business (:mod:`.persistence`,
:mod:`.deadletters`, held by :mod:`.manager`), which a queue reaches only through the small
:class:`QueueServices` interface it is given.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

from martinet.messaging.selector import Selector, message_identifiers

from .consumer import Consumer
from .dispatch import Dispatcher
from .entry import AVAILABLE, DELIVERED, GONE, HELD, NOT_DELAYED, Entry, delayed, now_ms
from .flow import FlowController
from .state import QueueServices

__all__ = [
    "AVAILABLE",
    "DELIVERED",
    "GONE",
    "HELD",
    "NOT_DELAYED",
    "Consumer",
    "Entry",
    "FlowController",
    "Queue",
    "QueueServices",
    "delayed",
    "now_ms",
]

log = logging.getLogger(__name__)


class Queue(Dispatcher):
    """A local queue. Created and owned by the queue manager, which it reaches only as
    ``manager``, a :class:`QueueServices`."""

    # -- entering ---------------------------------------------------------------------------

    def add(self, entry: Entry) -> None:
        """Make a new entry available (it is counted as enqueued) and dispatch."""
        self.count(entry)
        self.enqueued += 1
        self.flow.sent += 1
        self._levels[entry.priority].append(entry)
        self._became_available(entry)

    def restore(self, entry: Entry) -> None:
        """Put a recovered or held entry back in its place (not counted as enqueued)."""
        self.count(entry)
        self._reinsert(entry)

    def _reinsert(self, entry: Entry) -> None:
        entry.state = AVAILABLE
        self._levels[entry.priority].insert_in_order(entry)
        self._became_available(entry)

    def _became_available(self, entry: Entry) -> None:
        """One more entry is in the levels: parked consumers may want it; dispatch."""
        self.available += 1
        if self._selective:
            self._note_fresh(entry)
        if self._parked:
            self._ready.extend(self._parked)
            self._parked.clear()
        if self._ready:
            self._dispatch()

    # -- settling -----------------------------------------------------------------------------

    def remove(self, entry: Entry) -> None:
        """An entry was consumed (accepted, or acknowledged by a committed transaction)."""
        entry.state = GONE
        self.uncount(entry)
        self.dequeued += 1
        if entry.persistent:
            self.manager.persist_removal(entry)
        self.check_backlog()

    def release(
        self, entry: Entry, *, count_delivery: bool, acquired: bool = True, exclude: Consumer | None = None
    ) -> None:
        """Give an entry back to the queue, counting a failed delivery if asked to; past
        ``max-delivery-count`` it goes to routerdlq instead. ``acquired``: a client had it
        (first-acquirer is false from now on); ``exclude``: a consumer that must not get it
        again (undeliverable-here)."""
        if acquired:
            entry.acquired = True
        if exclude is not None:
            self.excluded[entry.id] = (*self.excluded.get(entry.id, ()), exclude.serial)
        if count_delivery:
            entry.delivery_count += 1
            limit = self.settings.max_delivery_count
            if limit >= 0 and entry.delivery_count >= limit:
                self.uncount(entry)
                self.manager.dead_letter(
                    self, entry, f"delivered {entry.delivery_count} times (max-delivery-count {limit})"
                )
                return
            if entry.persistent:
                self.manager.persist_delivery_count(entry)
        if self.deleted:
            return
        self._reinsert(entry)

    # -- browsing, cleanup, usage --------------------------------------------------------------

    def browse(self, selector: Selector | None = None) -> Iterator[Entry]:
        """The available entries in delivery order (a snapshot when the first is asked for;
        nothing is consumed). A packed entry is made as it is reached (a browse of a deep
        queue holds about one pack's worth of them at a time), and those consumed meanwhile
        are left out. A swapped-out entry's ``message`` has only its leading sections:
        nothing is read back here (see :meth:`QueueManager.fetch_messages`)."""
        now = now_ms()
        snapshot = [level.snapshot() for level in self._highest_first]
        for entry in itertools.chain.from_iterable(snapshot):
            if entry.state != AVAILABLE or (entry.expires is not None and entry.expires <= now):
                continue
            if selector is None:
                yield entry
                continue
            try:
                selected = selector.matches(message_identifiers(entry.message, entry.delivery_count))
            except (ValueError, TypeError) as exc:  # unreadable sections: not selected
                selected = self._unselectable_entry(selector, entry, exc)
            if selected:
                yield entry

    def remove_expired(self, to_dlq: bool | None = None) -> int:
        """Remove every expired available entry; how many there were. ``to_dlq``: move them
        to routerdlq (True) or drop them (False) whatever ``expired-to-dlq`` says."""
        now = now_ms()
        removed = 0
        for level in self._levels:
            for entry in level.take_expired(now):
                self.available -= 1
                self.manager.expire(self, entry, to_dlq)
                removed += 1
        return removed

    def drop_all(self) -> list[Entry]:
        """Empty the queue (it is being deleted); the entries that were in it."""
        entries = [entry for level in self._levels for entry in level]
        for level in self._levels:
            level.clear()
        self.available = 0
        self.size = self.bytes = self.swapped = self.swapped_bytes = 0
        self._memory.add(-self.memory)  # (entries held in transactions too: they count no more)
        self.memory = 0
        self.excluded.clear()
        self._fresh.clear()
        return entries

    def sample_rates(self) -> None:
        at, enqueued, dequeued = self._rate_mark
        now = time.monotonic()
        span = now - at
        if span > 0:
            self.send_rate = (self.enqueued - enqueued) / span
            self.receive_rate = (self.dequeued - dequeued) / span
        self._rate_mark = (now, self.enqueued, self.dequeued)

    def usage(self) -> dict[str, Any]:
        return {
            "messages": self.size,
            "bytes": self.bytes,
            "available": self.available,
            "enqueued": self.enqueued,
            "dequeued": self.dequeued,
            "expired": self.expired,
            "dead-lettered": self.dead_lettered,
            "duplicates-dropped": self.duplicates,
            "consumers": len(self.consumers),
            "cached": self.size - self.swapped,
            "cached-bytes": self.bytes - self.swapped_bytes,
            "swapped": self.swapped,
            "swapped-bytes": self.swapped_bytes,
            "packed": self.packed,
            "memory": self.memory,
            "swapped-out": self.swapped_out,
            "read-back": self.read_back_count,
            "reads": self.reads,
            "send-rate": round(self.send_rate, 1),
            "receive-rate": round(self.receive_rate, 1),
            "temporary": self.owner is not None,
        }
