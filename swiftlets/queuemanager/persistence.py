"""What the queues ask of the store in the background: deferred writes and read-backs.

Theory of operation
-------------------
**Deferred writes.** Settlements that only remove or update messages (accept, redelivery
counts, replaced annotations, dead-lettering, expiry) are deferred: collected and
committed by a background task, never awaited by the consumer. A crash can therefore
redeliver a message consumed just before it (at-least-once), never lose one that was
accepted. A dead letter that lands beyond routerdlq's cache is swapped out once the commit
that stores it is done. What is still deferred when the queue manager stops is committed
before it has stopped.

**Read-backs.** A swapped-out entry's bytes (:meth:`.queue.Queue.swap_out`) are read back
for its queue, in a task of its own, through :meth:`Store.read_messages` (the store
process reads; this loop never waits on disk); a browser's swapped-out entries are read
for it alone (:meth:`Persistence.fetch_messages`), without counting against the queue's
cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import trio

from martinet.messaging.message import Message
from martinet.swiftlets.store.api import (
    DeleteMessage,
    Op,
    PutMessage,
    RememberId,
    SetDeliveryCount,
    SetMessageBody,
    Store,
    StoreError,
)

from .queue import Entry, Queue

log = logging.getLogger(__name__)

__all__ = ["Persistence", "put_ops"]


class Persistence:
    """The store traffic of the queues that nobody waits for: the deferred writes, committed
    by :meth:`flush_forever`, and the read-backs of swapped-out bytes, run in ``nursery``
    (None while the queue manager is not running: nothing is read back then)."""

    def __init__(self) -> None:
        self.store: Store | None = None  # set when the queue manager starts
        self.nursery: trio.Nursery | None = None  # read-backs run here
        self.deferred: list[Op] = []
        self._deferred_wakeup = trio.Event()
        self.swap_after_flush: list[tuple[Queue, Entry]] = []  # (dead letters) to swap out once stored

    async def flush_forever(self) -> None:
        assert self.store is not None
        while True:
            await self._deferred_wakeup.wait()
            self._deferred_wakeup = trio.Event()
            ops, self.deferred = self.deferred, []
            swap, self.swap_after_flush = self.swap_after_flush, []
            await self.store.commit(ops)
            for queue, entry in swap:  # stored now: out of memory if the queue is beyond its cache
                queue.swap_out(entry)

    async def flush(self) -> None:
        """Commit what is deferred now (the queue manager is stopping)."""
        assert self.store is not None
        ops, self.deferred = self.deferred, []
        await self.store.commit(ops)

    def defer(self, *ops: Op) -> None:
        self.deferred.extend(ops)
        self._deferred_wakeup.set()

    def persist_removal(self, entry: Entry) -> None:
        """(:class:`.queue.QueueServices`) Delete a consumed persistent entry, in the background."""
        self.defer(DeleteMessage(entry.id))

    def persist_delivery_count(self, entry: Entry) -> None:
        """(:class:`.queue.QueueServices`) Store an entry's new delivery count, in the background."""
        self.defer(SetDeliveryCount(entry.id, entry.delivery_count))

    def persist_message(self, entry: Entry) -> None:
        """(:class:`.queue.QueueServices`) Store an entry's replaced (annotated) message, in
        the background."""
        self.defer(SetMessageBody(entry.id, entry.message.raw))

    def read_back(self, queue: Queue, entries: list[Entry]) -> None:
        """(:class:`.queue.QueueServices`) Read swapped-out bytes back, in the background."""
        if self.nursery is None:  # stopping
            queue.fill(entries, None)
            return
        self.nursery.start_soon(self._read_back, queue, entries)

    async def _read_back(self, queue: Queue, entries: list[Entry]) -> None:
        assert self.store is not None
        try:
            bodies = await self.store.read_messages([entry.id for entry in entries])
        except StoreError as exc:
            log.error("queue %s: %d stored message(s) could not be read back: %s", queue.name, len(entries), exc)
            queue.fill(entries, None)
            return
        queue.fill(entries, bodies)

    def fetch_messages(self, entries: Sequence[Entry], on_done: Callable[[Mapping[int, Message]], None]) -> None:
        """The whole messages of ``entries`` (a browse's), without waiting: ``on_done({id:
        message})`` is called when they are at hand — at once if none is swapped out, else
        once the store has read the swapped-out ones back. An entry consumed meanwhile (or
        that the store cannot give back: logged) is left out. The entries stay as they are:
        what is read back for a browser does not count against the queue's cache."""
        messages = {entry.id: entry.message for entry in entries if not entry.swapped}
        wanted = [entry for entry in entries if entry.swapped]
        if not wanted:
            on_done(messages)
            return
        if self.nursery is None:
            on_done(messages)
            return

        async def fetch() -> None:
            assert self.store is not None
            try:
                bodies = await self.store.read_messages([entry.id for entry in wanted])
            except StoreError as exc:
                log.error("%d stored message(s) could not be read back for a browser: %s", len(wanted), exc)
                bodies = {}
            for entry in wanted:
                if not entry.swapped:
                    messages[entry.id] = entry.message  # read back for the queue meanwhile
                elif entry.id in bodies:
                    messages[entry.id] = Message(bodies[entry.id])
            on_done(messages)

        self.nursery.start_soon(fetch)


def put_ops(queue: Queue, entry: Entry, key: str | None, txid: str | None = None) -> list[Op]:
    """The store writes that keep a new ``entry`` of ``queue`` (none unless it is persistent),
    ``key`` remembered for duplicate detection unless it is a prepared send (``txid``)."""
    if not entry.persistent:
        return []
    ops: list[Op] = [PutMessage(entry.id, queue.name, entry.message.raw, entry.delivery_count, txid)]
    if key is not None and txid is None:
        ops.append(RememberId(queue.name, key, queue.settings.duplicate_detection_backlog_size))
    return ops
