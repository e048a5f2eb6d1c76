"""A consumer of one queue: its credit, its deliveries and their settlement."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from martinet.messaging.message import MessageError
from martinet.messaging.selector import Selector

from .api import QueueError
from .entry import HELD, Entry

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

_serials = itertools.count(1)  # consumers, for Queue.excluded


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
        # with a selector: how many of its queue's fresh entries it has looked at, after a
        # look at every entry found none it selects (None: it must look at every entry)
        self.seen: int | None = None
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
