"""Recovery at start: the queues and prepared transactions rebuilt from the store.

Theory of operation
-------------------
The store hands over what it kept (:attr:`Store.recovered`): the messages (only their
leading sections when they are long), the prepare records of prepared transactions, the
remembered message ids and the next free id. A stored message goes back to its queue
(created if it is not defined), to the sends of the prepared transaction that tagged it,
or — acknowledged by a prepared transaction — is held by that transaction. A recovered
entry counts as acquired (a delivery unsettled at a crash was never counted), and a
message the store cannot give back readable, or a prepared send without a prepare record,
is deleted. Then, before the queue manager counts as started, the bytes of each queue's
first ``cache-size`` messages in delivery order and of every prepared transaction's
messages are read back; the rest stay swapped out.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from martinet.messaging.message import Message, MessageError
from martinet.swiftlets.store.api import DeleteMessage, Store

from .persistence import Persistence
from .queue import HELD, Entry, Queue, now_ms
from .transactions import Transaction, Transactions

if TYPE_CHECKING:
    from .manager import QueueManager

log = logging.getLogger(__name__)

__all__ = ["Recovery"]


class Recovery:
    """Rebuilds a restarted queue manager's queues and prepared transactions from ``store``
    (:meth:`recover`), then reads back what they keep in memory (:meth:`read_back`)."""

    def __init__(self, manager: QueueManager, store: Store, transactions: Transactions, persistence: Persistence):
        self._manager = manager
        self._store = store
        self._transactions = transactions
        self._persistence = persistence

    def recover(self) -> dict[str, Transaction]:
        """Put the stored messages back; the prepared transactions, by xid."""
        manager = self._manager
        recovered = self._store.recovered
        manager.ids = itertools.count(max(next(manager.ids), recovered.next_id))
        prepared: dict[str, Transaction] = {}
        held: dict[int, str] = {}
        for xid, record in recovered.records.get("xa", {}).items():
            transaction, acks = self._transactions.recovered(xid, record)
            prepared[xid] = transaction
            for message_id in acks:
                held[message_id] = xid
        now = now_ms()
        orphans = []
        messages = self._store.take_recovered_messages()  # ours now: freed as they are consumed
        for stored in messages:
            queue = manager.queues.get(stored.queue) or manager.queue(stored.queue, create=True)
            message = Message(stored.body)
            try:
                _, priority, expires, _ = message.queue_info(now)
            except MessageError as exc:
                log.error("stored message %d of %s is unreadable (%s); dropped", stored.id, stored.queue, exc)
                orphans.append(DeleteMessage(stored.id))
                continue
            # Acquired, for all we know: a delivery unsettled at a crash was never counted, and
            # first-acquirer false is always true [3.2.1: "MAY have previously been acquired"].
            # Swapped out unless the store gave the whole message (Entry: size).
            entry = Entry(
                stored.id, message, priority, expires, True, stored.delivery_count, acquired=True, size=stored.size
            )
            if stored.txid is not None:
                txn = prepared.get(stored.txid)
                if txn is None:  # prepared sends without a prepare record: never prepared
                    orphans.append(DeleteMessage(stored.id))
                    continue
                txn._sends.append((queue, entry))
            elif stored.id in held:
                entry.state = HELD
                queue.count(entry)
                prepared[held[stored.id]]._acks.append((queue, entry))
            else:
                queue.restore(entry)
        for queue_name, ids in recovered.remembered_ids.items():
            known = manager.queues.get(queue_name)
            if known is not None:
                for key in ids:
                    known.remember(key)
        self._transactions.prepared.update(prepared)
        if orphans:
            self._persistence.defer(*orphans)
        log.info(
            "queue manager recovered %d messages in %d queues, %d prepared transaction(s)",
            len(messages) - len(orphans),
            len(manager.queues),
            len(prepared),
        )
        return prepared

    async def read_back(self, prepared: Mapping[str, Transaction]) -> None:
        """Read back what a restarted router keeps in memory: each queue's first messages in
        delivery order up to its cache, and the messages of prepared transactions (few, and
        a resolution moves them)."""
        queues = self._manager.queues
        wanted: list[tuple[Queue | None, Entry]] = []
        for transaction in prepared.values():
            wanted.extend((None, entry) for _, entry in transaction._sends if entry.swapped)
            wanted.extend((queue, entry) for queue, entry in transaction._acks if entry.swapped)
        for queue in queues.values():
            wanted.extend((queue, entry) for entry in queue.cache_front())
        begin, read = time.monotonic(), 0
        for start in range(0, len(wanted), 1000):
            chunk = wanted[start : start + 1000]
            bodies = await self._store.read_messages([entry.id for _, entry in chunk])
            for holder, entry in chunk:  # (holder: the queue, None for a prepared send)
                body = bodies.get(entry.id)
                if body is None:
                    continue  # left swapped out: a dispatch that reaches it reports and drops it
                read += 1
                if holder is None:
                    entry.message, entry.swapped = Message(body), False
                else:
                    holder.swap_in(entry, body)
        if wanted:
            log.info(
                "queue manager read back %d recovered message(s) in %.2f s; %d stay in the store only",
                read,
                time.monotonic() - begin,
                sum(queue.swapped for queue in queues.values()),
            )
