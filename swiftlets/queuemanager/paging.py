"""A queue's bodies beyond its cache: swapping out and reading back.

Theory of operation
-------------------
A queue keeps the bytes of at most ``cache-size`` messages (and ``cache-size-bytes-kb``)
in memory. A persistent message that arrives beyond that, once the store has it (its
send's commit is durable), is *swapped out*: its entry keeps only the sections before the
body — header, annotations, properties, application-properties
(:func:`messaging.message.head_length`; about 100 bytes for a JMS-like message with a uuid
message-id and two properties) — so priority, expiry, selectors and the redelivery header
still work without the store, and ``Entry.swapped`` is set; its level keeps it packed with
the swapped-out entries around it, in arrays (:mod:`.level`). The bytes are read back through the store process
(never on this loop's thread) in batches of the cache's size, one read at a time, ahead of
the consumers: once fewer entries (and bytes) than a batch are left in memory, a delivery
asks for the next batch — for a consumer with a selector, the next swapped entries its
selector matches — and the consumers go on with what is in memory meanwhile; so at most
two batches are in memory. Only when dispatch reaches a swapped entry whose bytes are not
back does it stop (order is kept: nothing behind it is delivered first), asking for the
batch that starts there if no read is under way, and it dispatches again when the bytes
are back. A delivered entry always has its bytes (a listener sends ``entry.message.raw``);
:meth:`Queue.browse` does not read anything back (a browser that needs the bytes asks
:meth:`QueueManager.fetch_messages`). Non-persistent messages have no store copy and
always stay. After a restart a queue starts with the first ``cache-size`` messages in
delivery order read back and the rest swapped out (the store hands over only the leading
sections at recovery).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from martinet.messaging.message import Message, MessageError, head_length
from martinet.messaging.selector import Selector, message_identifiers

from .entry import AVAILABLE, GONE, Entry
from .state import QueueState

__all__ = ["Paging"]

log = logging.getLogger(__name__)


class Paging(QueueState):
    """The part of a queue that keeps at most its cache's bytes in memory: swaps durable
    entries out and has their bytes read back ahead of the consumers."""

    def over_cache(self) -> bool:
        """The queue keeps more messages in memory than ``cache-size`` allows (counting its
        :attr:`backlog`'s entries not swapped out: those held in transactions cannot be
        swapped out, and a routing link's window holds thousands across a long round trip,
        which would push every new entry out to be read back at once), or more bytes than
        ``cache-size-bytes-kb`` (every entry not swapped out)."""
        settings = self.settings
        limit, limit_kb = settings.cache_size, settings.cache_size_bytes_kb
        in_memory = self.size - self.swapped
        return (
            0 <= limit < in_memory
            and limit < self.backlog - self.swapped
            or 0 <= limit_kb
            and limit_kb * 1024 < self.bytes - self.swapped_bytes
        )

    def swap_out(self, entry: Entry) -> None:
        """``entry`` is durable in the store: if it is still available and the queue is over
        its cache, keep only the leading sections of its message in memory. (The manager
        calls this once the send's commit is done; before, the store could not give the bytes
        back.)"""
        if entry.swapped or entry.state != AVAILABLE or self.deleted or not self.over_cache():
            return
        raw = entry._message.raw  # type: ignore[union-attr]  # (not swapped: a Message)
        try:
            head = head_length(raw)
        except MessageError:  # checked on the way in, so not expected: keep it as it is
            return
        if head == len(raw):
            return  # no body: nothing to gain
        entry.swap(raw[:head])
        self.swapped += 1
        self.swapped_bytes += entry.bytes
        self.swapped_out += 1
        self.memory += head - entry.bytes
        self._memory.add(head - entry.bytes)
        self._levels[entry.priority].note_swapped()
        if self.swapped == 1:
            self._read_ahead_below = self._batch()

    def _batch(self) -> tuple[int, int]:
        """How many entries, and about how many bytes, one read-back asks for: the cache's
        entries (10 to 2000) and half its bytes (at most 64 MiB; at least one entry). Each
        read is a round trip through the store process whose fixed part, on a busy machine,
        costs as much as reading hundreds of bodies: fewer, larger reads consume faster
        (bench/memory_bench.py)."""
        settings = self.settings
        count = 2000 if settings.cache_size < 0 else min(max(settings.cache_size, 10), 2000)
        kb = settings.cache_size_bytes_kb
        return count, 1 << 26 if kb < 0 else min(max(kb * 512, 1), 1 << 26)

    def _running_low(self) -> bool:
        """Fewer available entries, and fewer bytes, in memory than one batch holds: time to
        read the next one, while the consumers still have these; so at most two batches are
        in memory. (Counted over every entry not swapped out, wherever it is in delivery
        order: enough to keep a batch ahead of the consumers.)"""
        count, size = self._read_ahead_below
        return self.available - self.swapped < count and self.bytes - self.swapped_bytes < size

    def _read_ahead(self, first: Entry | None = None, selector: Selector | None = None) -> None:
        """Ask for the bytes of the next batch of swapped-out entries in delivery order — from
        ``first`` on (else from the front), only those ``selector`` matches — unless a read is
        under way (the dispatch after it asks again if need be)."""
        if self._reading or not self.swapped:
            return
        most, most_bytes = self._batch()
        if first is None and selector is None:  # the front: taken out of the packs as it is found
            batch: list[Entry] = []
            for level in self._highest_first:
                if len(batch) < most and most_bytes > 0:
                    found, size = level.swapped_front(most - len(batch), most_bytes)
                    batch += found
                    most_bytes -= size
        else:
            batch = self._unpacked(self._selected(first, selector, most, most_bytes))
        if batch:
            self._reading = True
            self.reads += 1
            self.manager.read_back(self, batch)  # type: ignore[arg-type]  # (self is a Queue)

    def _selected(self, first: Entry | None, selector: Selector | None, most: int, most_bytes: int) -> list[Entry]:
        """Swapped-out entries in delivery order from ``first`` on (``first`` itself
        included), those after it only if ``selector`` matches them: at most ``most`` of
        them, or as many as reach ``most_bytes``."""
        batch: list[Entry] = []
        total = 0
        started = first is None
        first_id = -1 if first is None else first.id  # (a packed entry is a new Entry each time: see .level)
        for level in self._highest_first:
            for entry in level:
                if not started:
                    if entry.id != first_id:
                        continue
                    started = True
                if not entry.swapped:
                    continue
                if selector is not None and entry.id != first_id:
                    try:
                        if not selector.matches(message_identifiers(entry.message, entry.delivery_count)):
                            continue
                    except (ValueError, TypeError):
                        continue
                batch.append(entry)
                total += entry.bytes
                if len(batch) >= most or total >= most_bytes:
                    return batch
        return batch

    def fill(self, entries: list[Entry], bodies: Mapping[int, bytes] | None) -> None:
        """The store's answer to :meth:`QueueServices.read_back`: give the swapped-out
        ``entries`` still here their bytes back and dispatch; ``bodies`` None: the read
        failed (logged by the manager; the next dispatch asks again)."""
        self._reading = False
        if bodies is None or self.deleted:
            return
        for entry in entries:
            if not entry.swapped or entry.state == GONE:
                continue
            body = bodies.get(entry.id)
            if body is None:  # deleted from the store under us: it cannot be delivered any more
                log.error("queue %s: message %d is no longer in the store; dropped", self.name, entry.id)
                if entry.state == AVAILABLE:
                    self._levels[entry.priority].remove(entry)
                    self.available -= 1
                    self.uncount(entry)
                    entry.state = GONE
                continue
            self.swap_in(entry, body)
            self.read_back_count += 1
        self._read_ahead_below = self._batch()
        if self._ready and self.available:
            self._dispatch()

    def swap_in(self, entry: Entry, body: bytes) -> None:
        """The swapped-out ``entry`` (counted here) has its bytes, ``body``, back."""
        grown = entry.bytes - entry.resident
        entry.message = Message(body)
        entry.swapped = False
        self.swapped -= 1
        self.swapped_bytes -= entry.bytes
        self.memory += grown
        self._memory.add(grown)

    def cache_front(self) -> list[Entry]:
        """The swapped-out entries among the first in delivery order that fit in the cache
        besides what is in memory already (a restarted queue reads these back)."""
        settings = self.settings
        room = None if settings.cache_size < 0 else settings.cache_size - (self.backlog - self.swapped)
        room_bytes = (
            None
            if settings.cache_size_bytes_kb < 0
            else (settings.cache_size_bytes_kb * 1024 - (self.bytes - self.swapped_bytes))
        )
        front: list[Entry] = []
        for level in self._highest_first:
            for entry in level:
                if not entry.swapped:
                    continue
                if room is not None:
                    if room <= 0:
                        return self._unpacked(front)
                    room -= 1
                if room_bytes is not None:
                    if room_bytes < entry.bytes:
                        return self._unpacked(front)
                    room_bytes -= entry.bytes
                front.append(entry)
        return self._unpacked(front)

    def _unpacked(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` (swapped out, as iterating the levels gave them), each taken out of its
        pack if it is in one, so that filling it in place fills the entry the queue keeps."""
        for priority in {entry.priority for entry in entries}:
            self._levels[priority].unpack(entry for entry in entries if entry.priority == priority)
        return entries
