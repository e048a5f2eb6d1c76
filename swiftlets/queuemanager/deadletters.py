"""routerdlq: where messages go that leave a queue without being consumed.

Theory of operation
-------------------
An entry that expired (with ``expired-to-dlq``), was rejected, or was delivered
``max-delivery-count`` times leaves its queue (its size adjusted there) and moves to
routerdlq as a new entry: its message annotated with the reason (:data:`DLQ_REASON`) and
the queue it left (:data:`DLQ_QUEUE`), its priority, persistence and delivery count kept,
no expiry, and ``acquired`` if a consumer had it. The store deletes the old one and puts
the new one in one deferred commit. A swapped-out entry's bytes are read back first, in a
task of its own (not while the queue manager stops: then it is logged and left). What
routerdlq refuses (full, rejected from routerdlq itself, unreadable annotations) is
dropped and logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from martinet.messaging.codec import Symbol
from martinet.messaging.message import Message, MessageError
from martinet.swiftlets.store.api import DeleteMessage, Op, PutMessage, StoreError

from .api import QueueError
from .persistence import Persistence
from .queue import AVAILABLE, DELIVERED, GONE, HELD, Entry, Queue

if TYPE_CHECKING:
    from .manager import QueueManager

log = logging.getLogger(__name__)

__all__ = ["DLQ_QUEUE", "DLQ_REASON", "DeadLetters"]

DLQ_REASON = Symbol("x-opt-martinet-dlq-reason")
DLQ_QUEUE = Symbol("x-opt-martinet-dlq-queue")


class DeadLetters:
    """Moves entries that leave their queues unconsumed to routerdlq (or drops them); the
    ``expire`` and ``dead_letter`` of :class:`.queue.QueueServices`."""

    def __init__(self, manager: QueueManager, persistence: Persistence):
        self._manager = manager  # its queues, and the entry ids it hands out
        self._persistence = persistence

    def expire(self, queue: Queue, entry: Entry, to_dlq: bool | None = None) -> None:
        """(:class:`.queue.QueueServices`) An entry taken out of ``queue`` has expired."""
        queue.expired += 1
        queue.uncount(entry)
        if (queue.settings.expired_to_dlq if to_dlq is None else to_dlq) and queue.name != "routerdlq":
            self.dead_letter(queue, entry, "expired", count=False)
        else:
            entry.state = GONE
            if entry.persistent:
                self._persistence.persist_removal(entry)

    def dead_letter(self, source: Queue, entry: Entry, reason: str, *, count: bool = True) -> None:
        """(:class:`.queue.QueueServices`) Move an entry that left ``source`` (its size
        already adjusted) to routerdlq; ``count`` it as dead-lettered by ``source``."""
        if count:
            source.dead_lettered += 1
        acquired = entry.acquired or entry.state in (DELIVERED, HELD)  # a consumer had it
        entry.state = GONE
        if entry.swapped:  # its bytes first (it left the queue's counts already)
            nursery = self._persistence.nursery
            if nursery is None:
                log.error(
                    "message %d of queue %s not dead-lettered (%s): the queue manager is stopping",
                    entry.id,
                    source.name,
                    reason,
                )
                return
            nursery.start_soon(self._dead_letter_swapped, source, entry, reason, acquired)
            return
        self._move_to_dlq(source, entry, reason, acquired)

    async def _dead_letter_swapped(self, source: Queue, entry: Entry, reason: str, acquired: bool) -> None:
        store = self._persistence.store
        assert store is not None
        try:
            body = (await store.read_messages([entry.id])).get(entry.id)
        except StoreError as exc:
            log.error("message %d of queue %s not dead-lettered (%s): %s", entry.id, source.name, reason, exc)
            return
        if body is None:
            log.error(
                "message %d of queue %s not dead-lettered (%s): no longer in the store", entry.id, source.name, reason
            )
            return
        entry.message, entry.swapped = Message(body), False
        self._move_to_dlq(source, entry, reason, acquired)

    def _move_to_dlq(self, source: Queue, entry: Entry, reason: str, acquired: bool) -> None:
        ops: list[Op] = [DeleteMessage(entry.id)] if entry.persistent else []
        dlq = self._manager.queues["routerdlq"]
        try:
            if source is dlq:
                raise QueueError("it was rejected from routerdlq itself")
            message = entry.message.with_annotations({DLQ_REASON: reason, DLQ_QUEUE: source.name})
            dlq.check_room(1, len(message.raw))
        except (QueueError, MessageError) as exc:
            log.error(
                "message %d of queue %s dropped instead of dead-lettered (%s): %s", entry.id, source.name, reason, exc
            )
            self._persistence.defer(*ops)
            return
        moved = Entry(
            next(self._manager.ids),
            message,
            entry.priority,
            None,
            entry.persistent,
            entry.delivery_count,
            acquired=acquired,
        )
        if moved.persistent:
            ops.append(PutMessage(moved.id, dlq.name, message.raw, moved.delivery_count))
        dlq.add(moved)
        if moved.persistent and moved.state == AVAILABLE and dlq.over_cache():
            self._persistence.swap_after_flush.append((dlq, moved))
        self._persistence.defer(*ops)
        log.warning("message %d of queue %s moved to routerdlq: %s", entry.id, source.name, reason)
