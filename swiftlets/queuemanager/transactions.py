"""Transactions: sends and acknowledgements over any number of queues, applied together.

Theory of operation
-------------------
A :class:`Transaction` stages sends (invisible) and acknowledgements (the entries are
held, not redelivered). ``commit`` writes everything in one store commit and then makes
the sends visible and removes the acknowledged entries; ``rollback`` drops the sends and
redelivers the acknowledged entries (counted as a failed delivery). ``prepare(xid)``
first writes the sends tagged with ``xid`` and a prepare record (store record kind
``xa``, key the xid) naming the acknowledged entries and the prepare time; a prepared
transaction survives a restart (rebuilt at start from the store, its prepare time with
it: :mod:`.recovery`) and is then committed or rolled back by xid. While a commit or
rollback waits for the store the transaction is ``committing`` or ``rolling-back``, so a
second one is refused instead of applying it twice (likewise ``preparing``); a failed (or
cancelled, before the store had it) attempt puts it back as it was.

:class:`Transactions` makes them and keeps the prepared ones by xid (and the xids whose
prepare waits for the store, so that an xid is never prepared twice).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from martinet.messaging.message import Message, MessageError
from martinet.swiftlets.store.api import DeleteMessage, DeleteRecord, Op, PutRecord, SetTransaction, StoreError

from .api import ROUTING_PREFIX, MalformedMessage, MemoryFull, QueueError, SendResult, TransactionError
from .deadletters import DLQ_QUEUE, DLQ_REASON
from .persistence import put_ops
from .queue import GONE, HELD, NOT_DELAYED, Consumer, Entry, Queue, delayed, now_ms

if TYPE_CHECKING:
    from .manager import QueueManager

__all__ = ["Transaction", "Transactions"]


class Transactions:
    """The queue manager's transactions: it makes them, and keeps the prepared ones by xid
    (including those recovered at start)."""

    def __init__(self, manager: QueueManager):
        self.manager = manager  # what the transactions send through and store with
        self.prepared: dict[str, Transaction] = {}
        self.preparing: set[str] = set()  # xids whose prepare waits for the store

    def transaction(self, *, memory_bound: bool = False) -> Transaction:
        """A new local transaction; ``memory_bound``: its sends are refused while the
        memory alarm is on (see :meth:`Transaction.send`)."""
        return Transaction(self, memory_bound=memory_bound)

    def prepared_transactions(self) -> Mapping[str, Transaction]:
        """Prepared transactions by xid (including those recovered at start)."""
        return dict(self.prepared)

    async def resolve_prepared(self, xid: str, *, commit: bool) -> None:
        """Commit or roll back the prepared transaction ``xid``.

        Raises:
            TransactionError: no prepared transaction has that xid.
        """
        transaction = self.prepared.get(xid)
        if transaction is None:
            raise TransactionError(f"no prepared transaction {xid!r} on router {self.manager.router_name}")
        if commit:
            await transaction.commit()
        else:
            await transaction.rollback()

    @staticmethod
    def record(xid: str, acks: list[int], prepared_at: int) -> PutRecord:
        """The prepare record of ``xid``: the ids of its persistent acknowledged entries, and
        when it was prepared (epoch ms)."""
        return PutRecord("xa", xid, json.dumps({"acks": acks, "prepared-at": prepared_at}).encode())

    def recovered(self, xid: str, record: bytes) -> tuple[Transaction, list[int]]:
        """The prepared transaction ``xid`` as its prepare record describes it (its sends and
        acknowledgements are still to be added), and the ids of its acknowledged entries."""
        fields = json.loads(record)
        transaction = Transaction(self, xid=xid, state="prepared")
        at = fields.get("prepared-at")  # epoch ms; absent in records written before it was kept
        transaction.prepared_at = at / 1000 if at is not None else None
        return transaction, fields["acks"]


class StagedRoom:
    """What a transaction's staged sends will add to each queue (``[count, bytes]`` by
    queue), and whether that is reserved there (:meth:`.queue.Queue.reserve`): from its
    prepare, or while its commit waits for the store, until it ends, so that other senders
    do not fill the room meanwhile."""

    __slots__ = ("staged", "reserved")

    def __init__(self) -> None:
        self.staged: dict[Queue, list[int]] = {}  # queue → [sends, bytes] staged to it
        self.reserved = False  # the staged sends count against their queues' limits

    def reserve(self) -> None:
        if not self.reserved:
            self.reserved = True
            for queue, (count, size) in self.staged.items():
                queue.reserve(count, size)

    def unreserve(self) -> None:
        if self.reserved:
            self.reserved = False
            for queue, (count, size) in self.staged.items():
                queue.unreserve(count, size)


def _count(names: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


async def _outcome(issue: Callable[..., None], *args: Any) -> None:
    """Call ``issue(*args, on_done)`` and wait for ``on_done``, shielded (once the store has
    the write, its outcome is awaited whatever happens to the caller).

    Raises:
        StoreError: what ``on_done`` was given, as the store's ``commit`` raises it.
    """
    outcome: list[BaseException | None] = []
    done = trio.Event()

    def finished(error: BaseException | None) -> None:
        outcome.append(error)
        done.set()

    issue(*args, finished)
    with trio.CancelScope(shield=True):
        await done.wait()
    if outcome[0] is not None:
        raise StoreError(f"commit failed: {outcome[0]}") from outcome[0]


class Transaction:
    """A local transaction over any number of queues: sends and acknowledgements that take
    effect together at :meth:`commit`, or not at all.

    States: ``active`` → (``prepared``) → ``committed`` | ``rolled-back``; ``preparing``,
    ``committing`` and ``rolling-back`` while a prepare, commit or rollback waits for the
    store.
    """

    def __init__(
        self, transactions: Transactions, *, xid: str | None = None, state: str = "active", memory_bound: bool = False
    ):
        self._transactions = transactions
        self._manager = transactions.manager
        self._memory_bound = memory_bound
        self.xid = xid
        self.state = state
        self.prepared_at: float | None = None  # epoch seconds, from the prepare record
        self._sends: list[tuple[Queue, Entry]] = []
        self._room = StagedRoom()
        self._staged = self._room.staged  # (the same dict: Transaction.send looks it up per send)
        self._keys: dict[int, str] = {}
        self._acks: list[tuple[Queue, Entry]] = []
        self._logged = True  # prepared with a record in the store (not in memory only)

    def __repr__(self) -> str:
        return f"<Transaction {self.xid or id(self)} {self.state}: {len(self._sends)} sends, {len(self._acks)} acks>"

    def _require(self, *states: str) -> None:
        if self.state not in states:
            raise TransactionError(f"transaction is {self.state}, not {' or '.join(states)}")

    @property
    def sends(self) -> dict[str, int]:
        """Staged sends by queue name (how many to each)."""
        return _count(queue.name for queue, _ in self._sends)

    @property
    def acknowledgements(self) -> dict[str, int]:
        """Acknowledged (held) entries by queue name (how many of each)."""
        return _count(queue.name for queue, _ in self._acks)

    def send(
        self, address: str, message: Message, *, possible_duplicate: bool = False, limited: bool = True
    ) -> SendResult:
        """Stage a send; the message becomes visible at commit (``limited``: see the API).

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError, TransactionError.
        """
        self._require("active")
        manager = self._manager
        if self._memory_bound and limited and manager.memory.on:
            raise MemoryFull(
                f"router {manager.router_name} is above its memory budget "
                f"({manager.memory.used} of {manager.memory.limit} bytes accounted)"
            )
        now = now_ms()
        queue, message = manager.queue_for(address, message, now)
        staged = self._staged.get(queue)  # (a scan of the sends per send made a batch cost its square)
        if staged is None:
            staged = self._staged[queue] = [0, 0]
        if limited:
            queue.check_room(staged[0] + 1, staged[1] + len(message.raw))
        elif queue.deleted:
            raise QueueError(f"queue {queue.name} has been deleted")
        entry, key, duplicate = self._manager._entry(queue, message, possible_duplicate, now, limited=limited)
        if entry is None:
            return SendResult(0, duplicate)
        self._sends.append((queue, entry))
        staged[0] += 1
        staged[1] += entry.bytes
        if key is not None:
            self._keys[entry.id] = key
        delay = queue.flow_delay(now)
        return delayed(delay) if delay else NOT_DELAYED

    def dead_letter(self, message: Message, reason: str, queue: str) -> None:
        """Stage ``message`` for routerdlq with ``reason`` and ``queue`` (the one it was
        meant for) in the annotations the manager's own dead letters have; it never expires
        there. Visible at commit.

        Raises:
            QueueFull, MalformedMessage, TransactionError.
        """
        self._require("active")
        manager = self._manager
        dlq = manager.queues["routerdlq"]
        try:
            message = message.with_annotations({DLQ_REASON: reason, DLQ_QUEUE: queue})
            durable, priority, _, _ = message.queue_info(now_ms(), check=True)
        except MessageError as exc:
            raise MalformedMessage(f"malformed message for routerdlq: {exc}", exc.condition) from None
        staged = [entry for q, entry in self._sends if q is dlq]
        dlq.check_room(len(staged) + 1, sum(entry.bytes for entry in staged) + len(message.raw))
        mode = dlq.settings.persistence_mode
        persistent = durable if mode == "as_message" else mode == "persistent"
        self._sends.append((dlq, Entry(next(manager.ids), message, priority, None, persistent)))

    def acknowledge(self, consumer: Consumer, entry: Entry) -> None:
        """Stage the acknowledgement of an unsettled delivery of ``consumer``; the entry is
        held (neither redelivered nor removed) until commit or rollback.

        Raises:
            QueueError: not an unsettled delivery of that consumer.
            TransactionError: the transaction is not active.
        """
        self._require("active")
        self._acks.append((consumer.queue, consumer.hold(entry)))

    async def prepare(self, xid: str) -> None:
        """Phase one: make the transaction durable as prepared under ``xid``.

        Raises:
            TransactionError: not active, or ``xid`` is in use.
            StoreError: the store failed (the transaction stays active).
        """
        await _outcome(self.prepare_nowait, xid)

    def prepare_nowait(
        self, xid: str, on_done: Callable[[BaseException | None], None], *, transient_in_memory: bool = False
    ) -> None:
        """:meth:`prepare` without waiting: the write is queued to the store now (after every
        write queued before it), and ``on_done(None)`` is called once it is durable and the
        transaction is prepared, ``on_done(error)`` if the store failed (it is active again).
        ``transient_in_memory``: a transaction with nothing persistent in it (no persistent
        send, no persistent acknowledgement) is prepared in memory only, before this returns
        (``on_done(None)`` called at once): a crash loses its messages anyway, and so its xid.

        Raises:
            TransactionError: not active, or ``xid`` is in use (nothing was queued).
            StoreError: the store is not running.
        """
        self._require("active")
        manager = self._manager
        transactions = self._transactions
        if xid in transactions.prepared or xid in transactions.preparing:
            raise TransactionError(f"a transaction {xid!r} is prepared already")
        if (
            transient_in_memory
            and not any(entry.persistent for _, entry in self._sends)
            and not any(entry.persistent for _, entry in self._acks)
        ):
            self.xid, self.state, self.prepared_at, self._logged = xid, "prepared", time.time(), False
            transactions.prepared[xid] = self
            self._room.reserve()
            on_done(None)
            return
        ops: list[Op] = []
        for queue, entry in self._sends:
            ops.extend(put_ops(queue, entry, None, txid=xid))
        self._room.reserve()
        prepared_at = now_ms()
        ops.append(transactions.record(xid, [entry.id for _, entry in self._acks if entry.persistent], prepared_at))

        def durable(error: BaseException | None) -> None:
            transactions.preparing.discard(xid)
            if error is None:
                self.xid, self.state, self.prepared_at = xid, "prepared", prepared_at / 1000
                transactions.prepared[xid] = self
            else:
                self.state = "active"
                self._room.unreserve()
            on_done(error)

        assert manager._store is not None
        self.state = "preparing"
        transactions.preparing.add(xid)
        try:
            manager._store.commit_nowait(ops, durable)
        except BaseException:
            self.state = "active"
            self._room.unreserve()
            transactions.preparing.discard(xid)
            raise

    async def commit(self) -> None:
        """Make every staged send visible and remove every acknowledged entry, durably.

        Raises:
            TransactionError: already committed or rolled back.
            StoreError: the store failed (nothing took effect).
        """
        await _outcome(self.commit_nowait)

    def commit_nowait(self, on_done: Callable[[BaseException | None], None]) -> None:
        """:meth:`commit` without waiting: the write is queued to the store now (after every
        write queued before it); once it is durable the sends become visible, the
        acknowledged entries go, and ``on_done(None)`` is called; ``on_done(error)`` if the
        store failed (nothing took effect). Without anything to write (no persistent
        message), all of that happens before this returns.

        Raises:
            TransactionError: already committed or rolled back (nothing was queued).
            StoreError: the store is not running.
        """
        self._require("active", "prepared")
        manager = self._manager
        ops: list[Op] = []
        if self.state == "active":
            for queue, entry in self._sends:
                ops.extend(put_ops(queue, entry, self._keys.get(entry.id)))
        else:
            ops.extend(SetTransaction(entry.id, None) for _, entry in self._sends if entry.persistent)
            if self._logged:
                ops.append(DeleteRecord("xa", self.xid or ""))
        ops.extend(DeleteMessage(entry.id) for _, entry in self._acks if entry.persistent)
        if not ops:
            self._committed()
            on_done(None)
            return
        was = self.state

        def durable(error: BaseException | None) -> None:
            if error is None:
                self._committed()
            else:
                self.state = was
                if was == "active":
                    self._room.unreserve()
            on_done(error)

        assert manager._store is not None
        self._room.reserve()  # (the store's write may take a while: other senders must not fill the room meanwhile)
        self.state = "committing"
        try:
            manager._store.commit_nowait(ops, durable)
        except BaseException:
            self.state = was
            if was == "active":
                self._room.unreserve()
            raise

    def _committed(self) -> None:
        manager, transactions = self._manager, self._transactions
        self.state = "committed"
        self._room.unreserve()
        transactions.prepared.pop(self.xid or "", None)
        for queue, entry in self._sends:
            if queue.deleted and queue.name.startswith(ROUTING_PREFIX):
                # routing retires an idle rt$R of a router gone; a send staged before (a
                # long or in-doubt transaction) must still reach R when it comes back
                queue = manager.queue(queue.name, create=True)
            key = self._keys.get(entry.id)
            if key is not None:
                queue.remember(key)
            if not queue.deleted:
                queue.add(entry)
                if entry.persistent:
                    queue.swap_out(entry)  # durable: out of memory at once if beyond the cache
        for queue, entry in self._acks:
            entry.state = GONE
            queue.uncount(entry)
            queue.dequeued += 1
        for queue in {queue for queue, _ in self._acks}:  # (a consumer's commit frees a backlog too)
            queue.check_backlog()

    async def rollback(self) -> None:
        """Drop the staged sends and redeliver the acknowledged entries (as failed deliveries).

        Raises:
            TransactionError: already committed or rolled back.
        """
        self._require("active", "prepared")
        manager, transactions = self._manager, self._transactions
        if self.state == "prepared" and not self._logged:
            transactions.prepared.pop(self.xid or "", None)
        elif self.state == "prepared":
            ops: list[Op] = [DeleteMessage(entry.id) for _, entry in self._sends if entry.persistent]
            ops.append(DeleteRecord("xa", self.xid or ""))
            assert manager._store is not None
            self.state = "rolling-back"
            try:
                await manager._store.commit(ops)
            except BaseException:
                self.state = "prepared"
                raise
            transactions.prepared.pop(self.xid or "", None)
        self._undo()

    def rollback_nowait(self) -> None:
        """Roll back an active transaction without waiting (it has written nothing yet);
        used when its session or connection is lost.

        Raises:
            TransactionError: the transaction is prepared (resolve it by xid instead).
        """
        self._require("active")
        self._undo()

    def _undo(self) -> None:
        self.state = "rolled-back"
        self._room.unreserve()
        for queue, entry in self._acks:
            if entry.state == HELD:
                queue.release(entry, count_delivery=True)
        self._sends.clear()
