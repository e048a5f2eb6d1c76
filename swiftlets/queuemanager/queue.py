"""One queue: its messages by priority, its consumers, credit-driven delivery and outcomes.

Theory of operation
-------------------
A message in a queue is an :class:`Entry` (the shared, immutable
:class:`messaging.message.Message` plus this queue's state of it). An entry is, in turn:

- **available**: in the deque of its priority level (ten levels, 9 served first; within
  a level ascending id, so FIFO);
- **delivered**: handed to one consumer, which must settle it (accept, release, reject,
  modify) — or a transaction that acknowledged it holds it (**held**);
- **gone**: accepted, expired or dead-lettered.

An entry leaves its deque when it is delivered and goes back to its place (by id) when
it is released, so order and priority survive redelivery. Going back marks it
``acquired`` (AMQP 1.0 §3.2.1: its next delivery must say first-acquirer false) and, for a
failed delivery, counts it in ``delivery_count`` (the consumer's listener adds that to the
count the producer put in the header). A consumer that answers modified with
undeliverable-here (§3.4.5) is put on the entry's list in ``Queue.excluded``: dispatch passes that
consumer over for that entry, which waits for another consumer if need be; the list
names consumers by serial number, so a closed consumer's entry is simply never matched
again.

Delivery is credit-driven, as AMQP links are: a consumer receives at most as many entries
as it has credit. Consumers with credit wait in a round-robin ``ready`` ring; every new
entry and every new credit runs :meth:`Queue._dispatch`, which gives the next available
entry to the next ready consumer (shared mode), to the only consumer (exclusive), or to
the first consumer only (active-standby: the others wait to take over). A consumer whose
selector matches nothing available is parked until a new entry arrives. An entry a
selector cannot be evaluated on (its sections do not decode: a message stored before the
queue manager checked messages on the way in) is not selected, and stays for consumers
without a selector; that is logged once per queue and selector, never per entry.

**Bodies beyond the cache**. A queue keeps the bytes of at most
``cache-size`` messages (and ``cache-size-bytes-kb``) in memory. A persistent message that
arrives beyond that, once the store has it (its send's commit is durable), is *swapped
out*: its entry keeps a :class:`Message` of only the sections before the body — header,
annotations, properties, application-properties (:func:`messaging.message.head_length`;
46 bytes for a JMS-like message with two properties) — so priority, expiry, selectors
and the redelivery header still work without the store, and ``Entry.swapped`` is set. The
bytes are read back through the store process (never on this loop's thread) in batches of
the cache's size, one read at a time, ahead of the consumers: once fewer entries (and
bytes) than a batch are left in memory, a delivery asks for the next batch — for a
consumer with a selector, the next swapped entries its selector matches — and the
consumers go on with what is in memory meanwhile; so at most two batches are in memory.
Only when dispatch reaches a swapped entry whose bytes are not back does it stop (order is
kept: nothing behind it is delivered first), asking for the batch that starts there if no
read is under way, and it dispatches again when the bytes are back. A delivered entry
always has its bytes (a listener sends ``entry.message.raw``); :meth:`Queue.browse` does
not read anything back (a browser that needs the bytes asks
:meth:`QueueManager.fetch_messages`). Non-persistent messages have no store copy and always
stay. After a restart a queue starts with the first ``cache-size``
messages in delivery order read back and the rest swapped out (the store hands over only
the leading sections at recovery).

Expired entries are never delivered: dispatch and the periodic cleanup remove them
(optionally to ``routerdlq``). Everything here is synchronous and runs in the router's
trio thread; persistence and dead letters are the manager's business (:mod:`.manager`),
which a queue reaches only through the small :class:`QueueServices` interface it is given.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import trio

from martinet.messaging.message import Message, MessageError, head_length
from martinet.messaging.selector import Selector, message_identifiers

from .api import ConsumerRefused, QueueError, QueueFull
from .config import QueueSettings
from .memory import ENTRY_COST, MemoryAlarm

__all__ = ["Entry", "Queue", "Consumer", "QueueServices", "FlowController"]

log = logging.getLogger(__name__)

AVAILABLE, DELIVERED, HELD, GONE = 0, 1, 2, 3
_WAIT: Any = object()  # _take: the entry to deliver next is swapped out; dispatch resumes once it is read back
_serials = itertools.count(1)  # consumers, for Queue.excluded


class QueueServices(Protocol):
    """What a queue needs from the manager that holds it: persistence of what leaves or
    changes, and dead letters; the manager implements it. Each method is called
    synchronously, in the router's trio thread, and raises nothing.
    """

    def expire(self, queue: Queue, entry: Entry, to_dlq: bool | None = None) -> None:
        """``entry``, just taken out of ``queue``'s deques, has expired: count it, adjust the
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


class Entry:
    """A message in one queue. Public, read-only: ``id``, ``message``, ``priority``,
    ``delivery_count``, ``redelivered``, ``acquired``; ``bytes`` is the encoded size counted
    against the queue's ``max-bytes``.

    An entry made with a delivery count (recovered, moved to routerdlq) has been acquired
    before: say so with ``acquired=True``, since only that flag makes a listener rewrite
    the header. The consumers that must not get it (undeliverable-here) are in its queue's
    ``excluded``, not here: a slot costs every stored message 8 bytes or more.

    ``swapped``: the message's bytes are only in the store; ``message`` holds its leading
    sections (what selectors and the header rewrite read) and ``bytes`` is still the size
    of the whole. Only an available (or, after a restart, held) entry is ever swapped out:
    a delivered one has its bytes. ``size`` gives ``bytes`` when ``message`` is such a
    head.

    What a swapped-out entry keeps is what a queue holds per stored message, so it is only
    the head's bytes: ``message`` makes a :class:`Message` of them for each use, and what
    that decodes (a selector's properties) goes with it instead of staying in memory."""

    __slots__ = (
        "id",
        "_message",  # a Message; the head's bytes while swapped out
        "priority",
        "expires",
        "delivery_count",
        "state",
        "persistent",
        "acquired",
        "bytes",
        "swapped",
    )

    def __init__(
        self,
        id: int,
        message: Message,
        priority: int,
        expires: int | None,
        persistent: bool,
        delivery_count: int = 0,
        *,
        acquired: bool = False,
        size: int | None = None,
    ):
        self.id = id
        self.priority = priority
        self.expires = expires
        self.persistent = persistent
        self.delivery_count = delivery_count
        self.state = AVAILABLE
        self.acquired = acquired
        self.bytes = len(message.raw) if size is None else size
        self.swapped = size is not None and size != len(message.raw)
        self._message: Message | bytes = message.raw if self.swapped else message

    @property
    def message(self) -> Message:
        message = self._message
        return Message(message) if message.__class__ is bytes else message  # type: ignore[return-value]

    @message.setter
    def message(self, message: Message) -> None:
        self._message = message

    def swap(self, head: bytes) -> None:
        """Keep only ``head``, the leading sections of the message (its bytes are in the store)."""
        self._message = head
        self.swapped = True

    @property
    def resident(self) -> int:
        """The message bytes this entry keeps in memory."""
        message = self._message
        return len(message) if message.__class__ is bytes else self.bytes

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0

    def __repr__(self) -> str:
        return f"<Entry {self.id} p{self.priority} dc{self.delivery_count}>"


def now_ms() -> int:
    return int(time.time() * 1000)


class FlowController:
    """SwiftMQ's flow-control delay: how long a producer should wait before its next send.

    Zero while the queue's backlog (:attr:`Queue.backlog`: its entries but those held in
    transactions) is at most ``flowcontrol-start-queuesize``. Otherwise, over the
    current window: with send period ``stp = Δt / sent`` and receive period ``rtp = Δt /
    received``, ``d = rtp - stp`` and ``delay = d · sent / send-calls + (d + 2) · (size -
    start)`` — here every send is one call, so the first term is ``d`` — clamped to ``[0,
    max-flowcontrol-delay]``; without receives in the window the delay grows by 10 ms per
    call. The window restarts every second.

    Unlike SwiftMQ (no delay without receivers), a queue *without* receivers above its start
    size slows its producers too, as a window without receives does: a flood into a queue
    nobody reads is held back by the producers' credit long before it reaches the queue's
    ``max-messages``/``max-bytes`` (where sends are refused).
    """

    WINDOW_MS = 1000

    def __init__(self) -> None:
        self._reset(now_ms())

    def _reset(self, now: int) -> None:
        self._start, self.sent, self.received, self._growing = now, 0, 0, 0

    def delay(self, settings: QueueSettings, size: int, receivers: int, now: int) -> int:
        """The delay in ms for a producer sending at ``now`` (ms since the epoch)."""
        start = settings.flowcontrol_start_queuesize
        if start < 0 or size <= start:
            return 0
        if now - self._start >= self.WINDOW_MS:
            self._reset(now)
        if self.received == 0 or receivers == 0:
            self._growing += 10
            return min(self._growing, settings.max_flowcontrol_delay)
        self._growing = 0
        span = now - self._start
        if span < 1:
            span = 1
        d = span / self.received - span / (self.sent or 1)
        value = d + (d + 2) * (size - start)
        if value <= 0:
            return 0
        limit = settings.max_flowcontrol_delay
        return limit if value >= limit else int(value)


class Queue:
    """A local queue. Created and owned by the queue manager, which it reaches only as
    ``manager``, a :class:`QueueServices`."""

    def __init__(self, manager: QueueServices, name: str, settings: QueueSettings, *, owner: Any = None):
        self.manager = manager
        self.name = name
        self.settings = settings
        self.owner = owner  # a temporary queue's owner (deleted with it)
        self._levels: list[deque[Entry]] = [deque() for _ in range(10)]
        self._highest_first = self._levels[::-1]  # the same deques, in delivery order
        self.available = 0  # entries in the deques
        self.size = 0  # entries of this queue not yet gone (available, delivered, held)
        self.bytes = 0  # their Entry.bytes, for max-bytes
        self.swapped = 0  # of those, entries whose bytes are only in the store (Entry.swapped)
        self.swapped_bytes = 0  # and their Entry.bytes
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
        waiting = sum(not entry.persistent for level in self._levels for entry in level)
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

    # -- entering ---------------------------------------------------------------------------

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

    def add(self, entry: Entry) -> None:
        """Make a new entry available (it is counted as enqueued) and dispatch."""
        self.count(entry)
        self.enqueued += 1
        self.flow.sent += 1
        self._levels[entry.priority].append(entry)
        self._became_available()

    def restore(self, entry: Entry) -> None:
        """Put a recovered or held entry back in its place (not counted as enqueued)."""
        self.count(entry)
        self._reinsert(entry)

    def _reinsert(self, entry: Entry) -> None:
        level = self._levels[entry.priority]
        entry.state = AVAILABLE
        if not level or level[-1].id < entry.id:
            level.append(entry)
        else:
            index = 0
            for index, queued in enumerate(level):  # noqa: B007 - the index is the result
                if queued.id > entry.id:
                    break
            level.insert(index, entry)
        self._became_available()

    def _became_available(self) -> None:
        """One more entry is in the deques: parked consumers may want it; dispatch."""
        self.available += 1
        if self._parked:
            self._ready.extend(self._parked)
            self._parked.clear()
        if self._ready:
            self._dispatch()

    # -- bodies beyond the cache ----------------------------------------------------------------

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
        batch: list[Entry] = []
        total = 0
        started = first is None
        for level in self._highest_first:
            for entry in level:
                if not started:
                    if entry is not first:
                        continue
                    started = True
                if not entry.swapped:
                    continue
                if selector is not None and entry is not first:
                    try:
                        if not selector.matches(message_identifiers(entry.message, entry.delivery_count)):
                            continue
                    except (ValueError, TypeError):
                        continue
                batch.append(entry)
                total += entry.bytes
                if len(batch) >= most or total >= most_bytes:
                    break
            else:
                continue
            break
        if batch:
            self._reading = True
            self.reads += 1
            self.manager.read_back(self, batch)

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
                        return front
                    room -= 1
                if room_bytes is not None:
                    if room_bytes < entry.bytes:
                        return front
                    room_bytes -= entry.bytes
                front.append(entry)
        return front

    # -- delivering ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        ready = self._ready
        while ready and self.available:
            consumer = ready[0]
            entry = self._take(consumer)
            if entry is None:  # nothing this consumer selects: wait for new entries
                ready.popleft()
                self._parked.append(consumer)
                continue
            if entry is _WAIT:  # its bytes are being read back: fill() dispatches again
                return
            entry.state = DELIVERED
            consumer._deliver(entry)
            self.flow.received += 1
            if self.swapped and not self._reading and self._running_low():
                self._read_ahead(selector=consumer.selector)  # the next batch, for the same taste
            if consumer.credit <= 0:
                ready.popleft()
            elif len(ready) > 1:
                ready.rotate(-1)

    def _take(self, consumer: Consumer) -> Entry | None:
        """The next available entry for ``consumer`` (its selector matches, it is not
        excluded from it), out of its deque; None if there is none; ``_WAIT`` if it is
        swapped out (its bytes are asked for, and it stays where it is)."""
        selector, now, excluded = consumer.selector, 0, self.excluded
        for level in self._highest_first:
            if not level:
                continue
            if selector is None:
                while level:
                    entry = level.popleft()
                    if entry.expires is not None and entry.expires <= (now or (now := now_ms())):
                        self.available -= 1
                        self.manager.expire(self, entry)
                        continue
                    if excluded and consumer.serial in excluded.get(entry.id, ()):
                        level.appendleft(entry)
                        break  # not for this consumer: look along the level (below)
                    if entry.swapped:
                        level.appendleft(entry)
                        self._read_ahead()
                        return _WAIT
                    self.available -= 1
                    return entry
                else:
                    continue
            for index, entry in enumerate(level):
                if entry.expires is not None and entry.expires <= (now or (now := now_ms())):
                    continue  # left for the cleanup
                if excluded and consumer.serial in excluded.get(entry.id, ()):
                    continue
                try:
                    selected = selector is None or selector.matches(
                        message_identifiers(entry.message, entry.delivery_count)
                    )
                except (ValueError, TypeError) as exc:  # a section no one could read: not selected
                    assert selector is not None  # (only its matching raises)
                    selected = self._unselectable_entry(selector, entry, exc)
                if selected:
                    if entry.swapped:
                        self._read_ahead(entry, selector)
                        return _WAIT
                    del level[index]
                    self.available -= 1
                    return entry
        return None

    def _unselectable_entry(self, selector: Selector, entry: Entry, error: Exception) -> bool:
        """A selector could not be evaluated on ``entry``: it is not selected (False); the
        first time for this selector on this queue, that is logged."""
        if selector.text not in self._unselectable:
            self._unselectable.add(selector.text)
            log.warning(
                "queue %s: selector %r cannot be evaluated on message %d (%s); such messages are not "
                "selected by it and stay for other consumers (logged once per queue and selector)",
                self.name,
                selector.text,
                entry.id,
                error,
            )
        return False

    def _ready_up(self, consumer: Consumer) -> None:
        if consumer in self._ready or consumer in self._parked or consumer.closed:
            return
        if self.settings.consumer_mode == "activestandby" and self.consumers[0] is not consumer:
            return  # a standby consumer receives nothing until it becomes the active one
        self._ready.append(consumer)
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

    def check_backlog(self) -> None:
        """Entries left or went into a transaction: call the producers' flow-control waits
        back once the backlog is down to ``flowcontrol-start-queuesize`` (see
        QueueManager.when_backlog_cleared)."""
        if self.backlog_callbacks and self.backlog <= self.settings.flowcontrol_start_queuesize:
            callbacks, self.backlog_callbacks = self.backlog_callbacks, []
            for callback in callbacks:
                callback()

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

    # -- consumers ---------------------------------------------------------------------------

    def consumer(self, selector: Selector | None = None, *, owner: Any = None) -> Consumer:
        """Attach a consumer (no credit yet: call :meth:`Consumer.flow`).

        Raises:
            ConsumerRefused: exclusive mode and a consumer is attached already.
            QueueError: the queue was deleted.
        """
        if self.deleted:
            raise QueueError(f"queue {self.name} has been deleted")
        if self.settings.consumer_mode == "exclusive" and self.consumers:
            raise ConsumerRefused(f"queue {self.name} is exclusive and has a consumer already")
        consumer = Consumer(self, selector, owner)
        self.consumers.append(consumer)
        return consumer

    def _detach(self, consumer: Consumer) -> None:
        was_active = bool(self.consumers) and self.consumers[0] is consumer
        self.consumers.remove(consumer)
        if consumer in self._ready:
            self._ready.remove(consumer)
        if consumer in self._parked:
            self._parked.remove(consumer)
        if was_active and self.consumers and self.settings.consumer_mode == "activestandby":
            standby = self.consumers[0]
            if standby.credit > 0:
                self._ready_up(standby)

    # -- browsing, cleanup, usage --------------------------------------------------------------

    def browse(self, selector: Selector | None = None) -> Iterator[Entry]:
        """The available entries in delivery order (a snapshot; nothing is consumed). A
        swapped-out entry's ``message`` has only its leading sections: nothing is read back
        here (see :meth:`QueueManager.fetch_messages`)."""
        now = now_ms()
        snapshot = [entry for level in self._highest_first for entry in level]
        for entry in snapshot:
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
            if any(e.expires is not None and e.expires <= now for e in level):
                keep: deque[Entry] = deque()
                for entry in level:
                    if entry.expires is not None and entry.expires <= now:
                        self.available -= 1
                        self.manager.expire(self, entry, to_dlq)
                        removed += 1
                    else:
                        keep.append(entry)
                level.clear()
                level.extend(keep)
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
            "memory": self.memory,
            "swapped-out": self.swapped_out,
            "read-back": self.read_back_count,
            "reads": self.reads,
            "send-rate": round(self.send_rate, 1),
            "receive-rate": round(self.receive_rate, 1),
            "temporary": self.owner is not None,
        }


class Consumer:
    """A receiver on one queue. Deliveries need credit; every delivery must be settled.

    Deliveries are :class:`Entry` objects; settle them with :meth:`accept`,
    :meth:`release`, :meth:`reject` or :meth:`modify` (or acknowledge them in a
    transaction). Closing releases what is unsettled.
    """

    def __init__(self, queue: Queue, selector: Selector | None, owner: Any):
        self.queue = queue
        self.selector = selector
        self.owner = owner
        self.serial = next(_serials)  # what Queue.excluded names this consumer by
        self.credit = 0
        self.closed = False
        self._buffer: deque[Entry] = deque()
        self.unsettled: dict[int, Entry] = {}
        self._waiter: trio.Event | None = None
        # A listener's wake-up: called when deliveries wait to be taken (the buffer was empty)
        # and when the consumer is closed under its owner.
        self.notify: Callable[[], None] | None = None

    def flow(self, credit: int) -> None:
        """Add ``credit`` (AMQP link credit); deliveries start at once if entries wait."""
        if credit <= 0:
            return
        self.credit += credit
        self.queue._ready_up(self)

    def set_credit(self, credit: int) -> None:
        """Set the credit to ``credit`` (AMQP link credit is absolute)."""
        self.credit = max(credit, 0)
        if self.credit:
            self.queue._ready_up(self)
        else:
            self.drain()

    def drain(self) -> int:
        """Deliver what is available within the credit, then drop the rest of the credit
        (AMQP drain); returns the credit dropped."""
        dropped, self.credit = self.credit, 0
        if self in self.queue._ready:
            self.queue._ready.remove(self)
        if self in self.queue._parked:
            self.queue._parked.remove(self)
        return dropped

    def _deliver(self, entry: Entry) -> None:
        self.credit -= 1
        self.unsettled[entry.id] = entry
        self._buffer.append(entry)
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None
        if self.notify is not None and len(self._buffer) == 1:
            self.notify()

    def receive_nowait(self) -> Entry:
        """The next delivery.

        Raises:
            trio.WouldBlock: none is waiting.
            trio.ClosedResourceError: the consumer is closed.
        """
        if self.closed:
            raise trio.ClosedResourceError(f"consumer on {self.queue.name} is closed")
        if not self._buffer:
            raise trio.WouldBlock
        return self._buffer.popleft()

    @property
    def buffered(self) -> int:
        """Deliveries made to this consumer and not yet taken."""
        return len(self._buffer)

    def take(self, limit: int) -> list[Entry]:
        """Up to ``limit`` deliveries, oldest first, without waiting (a listener's batch
        version of :meth:`receive_nowait`); empty for a closed consumer."""
        buffer = self._buffer
        if limit >= len(buffer):
            taken = list(buffer)
            buffer.clear()
            return taken
        return [buffer.popleft() for _ in range(limit)]

    async def receive(self) -> Entry:
        """The next delivery, waiting for one (it needs credit to come).

        Raises:
            trio.ClosedResourceError: the consumer is (or gets) closed.
        """
        while not self._buffer:
            if self.closed:
                raise trio.ClosedResourceError(f"consumer on {self.queue.name} is closed")
            self._waiter = trio.Event()
            await self._waiter.wait()
        return self.receive_nowait()

    def _settle(self, entry: Entry) -> Entry:
        settled = self.unsettled.pop(entry.id, None)
        if settled is None:
            raise QueueError(f"delivery {entry.id} is not unsettled on this consumer of {self.queue.name}")
        return settled

    def accept(self, entry: Entry) -> None:
        """Consumed: the entry leaves the queue (its deletion is persisted in the background)."""
        self.queue.remove(self._settle(entry))

    def release(self, entry: Entry) -> None:
        """Not processed: back to the queue, delivery count unchanged."""
        self.queue.release(self._settle(entry), count_delivery=False)

    def modify(
        self,
        entry: Entry,
        *,
        delivery_failed: bool = True,
        undeliverable_here: bool = False,
        annotations: Mapping[Any, Any] | None = None,
    ) -> None:
        """Back to the queue, as AMQP's modified outcome says [3.4.5]: ``delivery_failed``
        counts a failed delivery (and max-delivery-count); ``undeliverable_here``: never
        again to this consumer (another one gets it; with none, it waits for one);
        ``annotations`` are merged into the entry's message-annotations (spliced: what the
        message had keeps its bytes; stored for a persistent entry). Annotations that
        cannot be merged (no AMQP encoding, or the message's own are unreadable) are logged
        and left out; the rest of the outcome still applies."""
        entry = self._settle(entry)
        if annotations:
            try:
                entry.message = entry.message.with_annotations(annotations)
            except MessageError as exc:
                log.warning(
                    "queue %s: annotations of a modified outcome not merged into message %d: %s",
                    self.queue.name,
                    entry.id,
                    exc,
                )
            else:
                if entry.persistent:
                    self.queue.manager.persist_message(entry)
        self.queue.release(entry, count_delivery=delivery_failed, exclude=self if undeliverable_here else None)

    def reject(self, entry: Entry, reason: str = "rejected by the consumer") -> None:
        """Unprocessable: the entry goes to routerdlq with ``reason``."""
        self._settle(entry)
        self.queue.uncount(entry)
        self.queue.manager.dead_letter(self.queue, entry, reason)

    def hold(self, entry: Entry) -> Entry:
        """Hand an unsettled delivery to a transaction (it stays out of the queue)."""
        settled = self._settle(entry)
        settled.state = HELD
        self.queue.check_backlog()
        return settled

    def close(self) -> None:
        """Detach; deliveries never received go back as they were, received but unsettled
        ones go back counted as a failed delivery."""
        if self.closed:
            return
        self.closed = True
        self.credit = 0
        never_seen = {entry.id for entry in self._buffer}
        self._buffer.clear()
        self.queue._detach(self)
        for entry in sorted(self.unsettled.values(), key=lambda e: e.id):
            taken = entry.id not in never_seen
            self.queue.release(entry, count_delivery=taken, acquired=taken)
        self.unsettled.clear()
        if self.notify is not None:  # closed under its owner (the queue was deleted): tell it
            self.notify()
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None
