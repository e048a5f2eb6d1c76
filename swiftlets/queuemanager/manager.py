"""The queue manager: names, queues, sending, transactions, persistence and recovery.

Theory of operation
-------------------
**Names.** ``q`` and ``q@<this router>`` name the local queue ``q``; ``q@other`` is
resolved through the redirections routing installs (``%@paris`` → ``rt$paris``), or is
unknown. A queue not defined in the config is created on first use when
``auto-create-queues`` is on, with the settings of the first queue controller (in name
order) whose predicate matches its name — unless there is no room for it (then neither an
auto-created nor a temporary queue is made: ``TooManyQueues``): the router holds
``max-queues`` queues (routing's ``rt$`` queues not counted), or it is made for a client
and the clients' share of ``max-queues`` (all but ``reserved-queues-percent``, kept for the
router's own needs), its user's ``max-queues-per-user`` or its address's
``max-queues-per-address`` is used up (:mod:`.budget`).

**Persistence.** A persistent message is written to the store (``PutMessage``) before the
sender is told it is accepted; it is made available *first*, so a fast consumer may
receive and accept it before the write is durable — the store then drops the insert and
the delete together and the message never touches the disk. Settlements that only
remove or update messages (accept, redelivery counts, dead-lettering, expiry) are
deferred: collected and committed by a background task, never awaited by the consumer.
A crash can therefore redeliver a message consumed just before it (at-least-once), never
lose one that was accepted.

**Bodies beyond the cache.** Once a persistent send's commit is durable, a queue over its
``cache-size`` keeps only the leading sections of that message (:meth:`.queue.Queue.swap_out`);
the manager reads swapped-out bytes back for it, in a task of its own, through
:meth:`Store.read_messages` (the store process reads; this loop never waits on disk). At
start the store hands over only leading sections, and the manager reads back, before the
queue manager counts as started, the bytes of each queue's first ``cache-size`` messages
and of every prepared transaction's messages.

**Transactions.** A :class:`Transaction` stages sends (invisible) and acknowledgements
(the entries are held, not redelivered). ``commit`` writes everything in one store commit
and then makes the sends visible and removes the acknowledged entries; ``rollback``
drops the sends and redelivers the acknowledged entries (counted as a failed delivery).
``prepare(xid)`` first writes the sends tagged with ``xid`` and a prepare record (store
record kind ``xa``, key the xid) naming the acknowledged entries and the prepare time; a
prepared transaction survives a restart (rebuilt at start from the store, its prepare time
with it) and is then committed or rolled back by xid. While a commit or rollback waits for
the store the transaction is ``committing`` or ``rolling-back``, so a second one is refused
instead of applying it twice (likewise ``preparing``); a failed (or cancelled, before the
store had it) attempt puts it back as it was.

**Duplicates.** Message ids are remembered per queue (persisted for persistent messages,
bounded by the backlog size); a send marked ``possible_duplicate`` (a resend after a
failure), or every send with ``duplicate-check="always"``, whose id is remembered is
dropped and reported as a duplicate.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from martinet.kernel import Change, Entity, SwiftletContext, UsageList, Veto
from martinet.messaging.codec import Symbol
from martinet.messaging.like import LikePattern, like_pattern
from martinet.messaging.message import Message, MessageError
from martinet.swiftlets.store.api import (
    DeleteMessage,
    DeleteRecord,
    Op,
    PutMessage,
    PutRecord,
    RememberId,
    SetDeliveryCount,
    SetMessageBody,
    SetTransaction,
    Store,
    StoreError,
)

from .api import (
    ROUTING_PREFIX,
    TEMPORARY_PREFIX,
    Creator,
    DiskFull,
    MalformedMessage,
    MemoryFull,
    MessageTooLarge,
    QueueError,
    QueueNotFound,
    Rewrite,
    SendResult,
    TransactionError,
    check_queue_name,
)
from .budget import QueueBudget
from .config import QueueManagerConfig, QueueSettings
from .memory import MemoryAlarm, machine_memory, wait_in
from .operations import offer_operations
from .queue import AVAILABLE, DELIVERED, GONE, HELD, Consumer, Entry, Queue, now_ms

log = logging.getLogger(__name__)

__all__ = ["QueueManager", "Transaction"]

PREDEFINED = ("unroutable", "routerdlq")
DLQ_REASON = Symbol("x-opt-martinet-dlq-reason")
DLQ_QUEUE = Symbol("x-opt-martinet-dlq-queue")
REDIRECTIONS_KEPT = 4096  # addresses whose redirection is remembered (each message to q@R looks it up)


_NOT_DELAYED = SendResult(0)
_DELAYED: dict[int, SendResult] = {}  # one result per delay value (at most max-flowcontrol-delay + 1)


def _delayed(delay: int) -> SendResult:
    """The result for a delay, made once: a queue above its flow-control start returns one
    per send, and a NamedTuple costs more to make than the rest of the check."""
    result = _DELAYED.get(delay)
    if result is None:
        result = _DELAYED[delay] = SendResult(delay)
    return result


def _ignore(error: BaseException | None) -> None:
    if error is not None:
        log.error("a message could not be stored: %s", error)


def _swapping(
    entries: Sequence[tuple[Queue, Entry]], then: Callable[[BaseException | None], None]
) -> Callable[[BaseException | None], None]:
    """A durability callback that first swaps ``entries`` out (each queue decides whether it
    is still over its cache), then calls ``then``."""

    def durable(error: BaseException | None) -> None:
        if error is None:
            for queue, entry in entries:
                queue.swap_out(entry)
        then(error)

    return durable


def _whole_router(predicate: str) -> str | None:
    """``R`` if ``predicate`` is ``%@R`` with no wildcard in ``R`` (``\\`` escapes one):
    every queue of router R; else None."""
    if not predicate.startswith("%@"):
        return None
    name, escaped = [], False
    for char in predicate[2:]:
        if escaped:
            name.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "%_":
            return None
        else:
            name.append(char)
    return None if escaped or not name else "".join(name)


def id_key(message_id: Any) -> str | None:
    """A message-id as a string key for the duplicate backlog (type-tagged unless a string)."""
    if message_id is None:
        return None
    if isinstance(message_id, str):
        return message_id
    if isinstance(message_id, bytes):
        return f"binary:{message_id.hex()}"
    return f"{type(message_id).__name__}:{message_id}"


class QueueManager:
    """``sys$queuemanager``: what ``context.lookup("sys$queuemanager", QueueManager)`` returns
    (it provides the protocol :class:`.api.QueueManager`), and the
    :class:`.queue.QueueServices` its queues call."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.router_name = context.router_name
        self._at_local = f"@{self.router_name}"
        config: QueueManagerConfig = context.config
        self.auto_create_queues = config.auto_create_queues
        self.max_message_size = config.max_message_size
        self.budget = QueueBudget.of(config)
        self.memory = MemoryAlarm(*_memory_limits(config), router=self.router_name)
        self.queues: dict[str, Queue] = {}
        self._store: Store | None = None
        self._ids = itertools.count(1)  # entry ids; recovery moves the count past the stored ones
        self._temporary = 0
        # (predicate, its pattern, target queue, rewrite of the messages redirected or None)
        # predicate → (its pattern, target queue, rewrite), in the order added
        self._redirections: dict[str, tuple[LikePattern, str, Rewrite | None]] = {}
        # ``%@R`` (every queue of one router: routing's) by R, found without a scan, so that a
        # table of thousands of destinations costs each change and each new address O(1)
        self._router_redirections: dict[str, tuple[str, Rewrite | None]] = {}
        self._redirected: dict[str, tuple[str, Rewrite | None]] = {}  # address → its redirection, as found
        self._deferred: list[Op] = []
        self._deferred_wakeup = trio.Event()
        self._swap_after_flush: list[tuple[Queue, Entry]] = []  # (dead letters) to swap out once stored
        self._prepared: dict[str, Transaction] = {}
        self._preparing: set[str] = set()  # xids whose prepare waits for the store
        self._usage: UsageList | None = None
        self._nursery: trio.Nursery | None = None  # read-backs run here

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._store = self.context.lookup("sys$store", Store)
        self._usage = self.context.usage.add_list("queues")
        self.context.usage.provide(self._manager_usage)
        self.context.entity.on_change(self._settings_changed)
        for name in PREDEFINED:
            self.queue(name, create=True)
        self.context.entity.entity_list("queues").bind(
            self._queue_configured, self._queue_unconfigured, destroys=self._messages_of
        )
        prepared = self._recover()
        await self._read_back_recovered(prepared)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._flush_forever)
                nursery.start_soon(self._tick_forever)
                task_status.started()
        finally:
            self._nursery = None
            if self._deferred:
                with self.context.shutdown_scope():
                    ops, self._deferred = self._deferred, []
                    await self._store.commit(ops)

    def _settings_changed(self, change: Change) -> None:
        if change.field == "auto_create_queues":
            self.auto_create_queues = change.new
        elif change.field == "max_message_size":
            self.max_message_size = change.new
        elif change.field.startswith("memory_"):
            config = attrs.evolve(self.context.config, **{change.field: change.new})
            self.memory.set_limits(*_memory_limits(config))
        else:
            self.budget.set(change.field, change.new)

    async def _flush_forever(self) -> None:
        assert self._store is not None
        while True:
            await self._deferred_wakeup.wait()
            self._deferred_wakeup = trio.Event()
            ops, self._deferred = self._deferred, []
            swap, self._swap_after_flush = self._swap_after_flush, []
            await self._store.commit(ops)
            for queue, entry in swap:  # stored now: out of memory if the queue is beyond its cache
                queue.swap_out(entry)

    async def _tick_forever(self) -> None:
        while True:
            await trio.sleep(1)
            clock = time.monotonic()
            for queue in list(self.queues.values()):
                queue.sample_rates()
                if clock >= queue.next_cleanup:
                    queue.next_cleanup = clock + queue.settings.cleanup_interval / 1000
                    removed = queue.remove_expired()
                    if removed:
                        log.info("queue %s: %d expired message(s) removed", queue.name, removed)

    def _defer(self, *ops: Op) -> None:
        self._deferred.extend(ops)
        self._deferred_wakeup.set()

    def persist_removal(self, entry: Entry) -> None:
        """(:class:`.queue.QueueServices`) Delete a consumed persistent entry, in the background."""
        self._defer(DeleteMessage(entry.id))

    def persist_delivery_count(self, entry: Entry) -> None:
        """(:class:`.queue.QueueServices`) Store an entry's new delivery count, in the background."""
        self._defer(SetDeliveryCount(entry.id, entry.delivery_count))

    def persist_message(self, entry: Entry) -> None:
        """(:class:`.queue.QueueServices`) Store an entry's replaced (annotated) message, in
        the background."""
        self._defer(SetMessageBody(entry.id, entry.message.raw))

    def read_back(self, queue: Queue, entries: list[Entry]) -> None:
        """(:class:`.queue.QueueServices`) Read swapped-out bytes back, in the background."""
        if self._nursery is None:  # stopping
            queue.fill(entries, None)
            return
        self._nursery.start_soon(self._read_back, queue, entries)

    async def _read_back(self, queue: Queue, entries: list[Entry]) -> None:
        assert self._store is not None
        try:
            bodies = await self._store.read_messages([entry.id for entry in entries])
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
        if self._nursery is None:
            on_done(messages)
            return

        async def fetch() -> None:
            assert self._store is not None
            try:
                bodies = await self._store.read_messages([entry.id for entry in wanted])
            except StoreError as exc:
                log.error("%d stored message(s) could not be read back for a browser: %s", len(wanted), exc)
                bodies = {}
            for entry in wanted:
                if not entry.swapped:
                    messages[entry.id] = entry.message  # read back for the queue meanwhile
                elif entry.id in bodies:
                    messages[entry.id] = Message(bodies[entry.id])
            on_done(messages)

        self._nursery.start_soon(fetch)

    # -- recovery -----------------------------------------------------------------------------

    def _recover(self) -> dict[str, Transaction]:
        assert self._store is not None
        recovered = self._store.recovered
        self._ids = itertools.count(max(next(self._ids), recovered.next_id))
        prepared: dict[str, Transaction] = {}
        held: dict[int, str] = {}
        for xid, record in recovered.records.get("xa", {}).items():
            fields = json.loads(record)
            transaction = prepared[xid] = Transaction(self, xid=xid, state="prepared")
            at = fields.get("prepared-at")  # epoch ms; absent in records written before it was kept
            transaction.prepared_at = at / 1000 if at is not None else None
            for message_id in fields["acks"]:
                held[message_id] = xid
        now = now_ms()
        orphans = []
        messages = self._store.take_recovered_messages()  # ours now: freed as they are consumed
        for stored in messages:
            queue = self.queues.get(stored.queue) or self.queue(stored.queue, create=True)
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
            known = self.queues.get(queue_name)
            if known is not None:
                for key in ids:
                    known.remember(key)
        self._prepared.update(prepared)
        if orphans:
            self._defer(*orphans)
        log.info(
            "queue manager recovered %d messages in %d queues, %d prepared transaction(s)",
            len(messages) - len(orphans),
            len(self.queues),
            len(prepared),
        )
        return prepared

    async def _read_back_recovered(self, prepared: Mapping[str, Transaction]) -> None:
        """Read back what a restarted router keeps in memory: each queue's first messages in
        delivery order up to its cache, and the messages of prepared transactions (few, and
        a resolution moves them)."""
        assert self._store is not None
        wanted: list[tuple[Queue | None, Entry]] = []
        for transaction in prepared.values():
            wanted.extend((None, entry) for _, entry in transaction._sends if entry.swapped)
            wanted.extend((queue, entry) for queue, entry in transaction._acks if entry.swapped)
        for queue in self.queues.values():
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
                sum(queue.swapped for queue in self.queues.values()),
            )

    # -- names and queues -----------------------------------------------------------------------

    def resolve(self, address: str) -> str:
        """The local queue that ``address`` (``q`` or ``q@router``) ends up in.

        Raises:
            QueueNotFound: ``q@other`` and no redirection covers it.
        """
        name, at, router = address.rpartition("@")
        if not at:
            return address
        if router == self.router_name:
            return name
        return self._redirection(address)[0]

    def _redirection(self, address: str) -> tuple[str, Rewrite | None]:
        """The target queue and rewrite of the redirection covering ``q@other`` (remembered
        per address until the redirections change: every message to ``q@other`` asks)."""
        router = address.rpartition("@")[2]
        found = self._router_redirections.get(router) or self._redirected.get(address)
        if found is not None:
            return found
        for pattern, target, rewrite in self._redirections.values():
            if pattern.matches(address):
                if len(self._redirected) >= REDIRECTIONS_KEPT:
                    self._redirected.clear()
                found = self._redirected[address] = target, rewrite
                return found
        raise QueueNotFound(
            f"router {router!r} is not known to router {self.router_name!r} (no route and no "
            f"static route), so {address!r} cannot be reached"
        )

    def add_redirection(self, predicate: str, target: str, rewrite: Rewrite | None = None) -> None:
        """Send everything addressed to names matching ``predicate`` (SQL-LIKE on the full
        ``q@router`` name) to local queue ``target``, each message first passed through
        ``rewrite(address, message)``; routing uses ``%@R`` → ``rt$R``."""
        self.remove_redirection(predicate)
        router = _whole_router(predicate)
        if router is not None:
            self._router_redirections[router] = target, rewrite
            return
        self._redirections[predicate] = like_pattern(predicate), target, rewrite
        self._redirected.clear()

    def _rewritten(self, address: str, message: Message) -> Message:
        """``message`` as the redirection of ``address`` (``q@other``) rewrites it.

        Raises: MalformedMessage (the rewrite could not read the message)."""
        _, rewrite = self._redirection(address)
        if rewrite is None:
            return message
        try:
            return rewrite(address, message)
        except MessageError as exc:
            raise MalformedMessage(f"message for {address!r}: {exc}", exc.condition) from None

    def remove_redirection(self, predicate: str) -> None:
        router = _whole_router(predicate)
        if router is not None:
            self._router_redirections.pop(router, None)
        elif self._redirections.pop(predicate, None) is not None:
            self._redirected.clear()

    def settings_for(self, name: str) -> QueueSettings:
        """The settings of queue ``name``: its own definition, else the first controller
        (in name order) whose predicate matches."""
        entity = self.context.entity
        defined = entity.entity_list("queues").entities.get(name)
        if defined is not None:
            return defined.config
        controllers = entity.entity_list("queue-controllers").entities
        for controller_name in sorted(controllers):
            controller = controllers[controller_name]
            if like_pattern(controller.get("predicate")).matches(name):
                return controller.config
        return QueueSettings()

    def queue(self, address: str, *, create: bool | None = None, creator: Creator | None = None) -> Queue:
        """The local queue for ``address``, created if allowed (``create`` overrides
        ``auto-create-queues``).

        A temporary name (``tmp$…``) is never created on first use: its queue went with its
        owner, and a send to it must fail rather than make a queue nobody reads.

        Raises:
            QueueNotFound: unknown and not to be created, or no route.
            TooManyQueues: unknown, to be auto-created (``create`` not given), and no room
                for ``creator`` (:meth:`check_room`).
            QueueError: an invalid queue name.
        """
        name = self.resolve(address)
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        if create is None and name.startswith(TEMPORARY_PREFIX):  # deleted with its owner: not made anew
            raise QueueNotFound(
                f"temporary queue {name!r} does not exist on router {self.router_name} "
                "(it was deleted with the connection or link that created it)"
            )
        if not (self.auto_create_queues if create is None else create):
            raise QueueNotFound(f"queue {name!r} does not exist on router {self.router_name}")
        check_queue_name(name)
        if create is None:  # auto-created (explicit creates: recovery; durable subscriptions check_room first)
            self.check_room(name, creator)
            creator = creator or Creator()
        return self._create(name, self.settings_for(name), creator=creator)

    def when_backlog_cleared(self, address: str, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While sends to ``address`` are slowed down — its queue's backlog (:attr:`Queue.backlog`) is above its
        ``flowcontrol-start-queuesize``, with or without consumers — call ``callback`` once a consumed message
        brings it back to that size, and return a function that cancels the call; None when
        the queue is not slowing sends now. (A listener holding a producer back for a
        flow-control delay lets it go early with this.)"""
        try:
            queue = self.queues.get(self.resolve(address))
        except QueueError:  # no route any more
            return None
        if queue is None or not 0 <= queue.settings.flowcontrol_start_queuesize < queue.backlog:
            return None
        return wait_in(queue.backlog_callbacks, callback)

    def when_room(self, name: str, callback: Callable[[], None]) -> None:
        if self.memory.when_clear(callback) is not None:  # (a MemoryFull names no queue)
            return
        if self._store is not None and self._store.space.when_clear(callback) is not None:  # (nor a DiskFull)
            return
        queue = self.queues.get(name)
        if queue is None:
            callback()
        else:
            queue.room_callbacks.append(callback)

    def check_room(self, name: str, creator: Creator | None = None) -> None:
        """Raises TooManyQueues unless one more queue (auto-created, temporary, or a new
        durable subscription's) for ``creator`` (None: a client not named) fits: see
        :class:`.budget.QueueBudget`. (Queues defined in the config, and those recovered at
        start, are created regardless.)"""
        self.budget.check(name, creator or Creator(), len(self.queues), self.router_name)

    def _create(self, name: str, settings: QueueSettings, owner: Any = None, creator: Creator | None = None) -> Queue:
        queue = self.queues[name] = Queue(self, name, settings, owner=owner)
        self.budget.created(name, creator)
        if self._usage is not None:
            # The api protocols take back any Entry or Consumer; the implementation only its own
            # (those it handed out), so mypy does not count it as one (context.lookup casts too).
            offer_operations(self, queue, self._usage.add(name, queue.usage))  # type: ignore[arg-type]
        return queue

    def create_temporary_queue(self, owner: Any, creator: Creator | None = None) -> Queue:
        """A new ``tmp$<n>`` queue, deleted by :meth:`delete_temporary_queues` (owner), made
        for ``creator`` (None: a client not named).

        Raises:
            TooManyQueues: no room for ``creator`` (:meth:`check_room`).
        """
        creator = creator or Creator()
        self.check_room("tmp$<n>", creator)
        self._temporary += 1
        name = f"{TEMPORARY_PREFIX}{self._temporary}"
        while name in self.queues:
            self._temporary += 1
            name = f"{TEMPORARY_PREFIX}{self._temporary}"
        return self._create(name, self.settings_for(name), owner, creator)

    def delete_temporary_queues(self, owner: Any) -> None:
        for queue in [q for q in self.queues.values() if q.owner is owner]:
            self.delete_queue(queue.name)

    def delete_queue(self, name: str, *, quiet: bool = False) -> None:
        """Delete a queue with its messages; its consumers are closed.

        Raises:
            QueueNotFound: no such queue.
            QueueError: a predefined queue.
        """
        if name in PREDEFINED:
            raise QueueError(f"queue {name} is predefined and cannot be deleted")
        queue = self.queues.pop(name, None)
        if queue is None:
            raise QueueNotFound(f"queue {name!r} does not exist on router {self.router_name}")
        queue.deleted = True
        self.budget.deleted(name)
        for consumer in list(queue.consumers):
            consumer.close()
        dropped = queue.drop_all()
        queue.room_made()  # (those waiting find it gone)
        self._defer(*(DeleteMessage(entry.id) for entry in dropped if entry.persistent))
        if self._usage is not None:
            self._usage.remove(name)
        # every client's temporary queue goes when it leaves (each admin call's reply queue),
        # and routing retires the empty queues of routers gone (their count is logged): routine,
        # unless it took messages with it
        routine = quiet or (queue.owner is not None and not dropped)
        log.log(
            logging.DEBUG if routine else logging.INFO, "queue %s deleted (%d message(s) dropped)", name, len(dropped)
        )

    def _queue_configured(self, entity: Entity) -> None:
        settings = entity.config
        queue = self.queues.get(entity.name)
        if queue is None:
            self._create(entity.name, settings)
        else:
            queue.settings = settings
            queue.room_made()
        entity.on_change(lambda change: self._queue_changed(entity.name, change))

    def _queue_changed(self, name: str, change: Change) -> None:
        queue = self.queues.get(name)
        if queue is not None:  # listeners run before the change is committed: apply it
            queue.settings = attrs.evolve(queue.settings, **{change.field: change.new})
            queue.room_made()  # (a waiting sender looks again in a job of its own, after this)

    def _messages_of(self, entity: Entity) -> int:
        """What deleting the queue of ``entity`` drops."""
        queue = self.queues.get(entity.name)
        return queue.size if queue is not None else 0

    def _queue_unconfigured(self, entity: Entity) -> None:
        queue = self.queues.get(entity.name)
        if queue is not None and queue.consumers:
            raise Veto(f"queue {entity.name} has {len(queue.consumers)} consumer(s)")
        if queue is not None:
            self.delete_queue(entity.name)

    # -- sending ------------------------------------------------------------------------------

    def _entry(
        self, queue: Queue, message: Message, possible_duplicate: bool, now: int, *, limited: bool = True
    ) -> tuple[Entry | None, str | None, bool]:
        """``(entry, duplicate key, is duplicate)`` for ``message`` in ``queue``; no entry
        for a duplicate, or a message that expired before it arrived.

        Raises:
            MessageTooLarge, QueueFull, MalformedMessage.
        """
        size = len(message.raw)
        if size > self.max_message_size:
            raise MessageTooLarge(
                f"message of {size} bytes exceeds max-message-size {self.max_message_size} (queue {queue.name})"
            )
        if limited:
            queue.check_room(1, size)
        try:
            # with check: what consumers and selectors will read must be readable (check_sections)
            durable, priority, expires, message_id = message.queue_info(now, check=True)
        except MessageError as exc:
            raise MalformedMessage(f"malformed message for queue {queue.name}: {exc}", exc.condition) from None
        settings = queue.settings
        key = id_key(message_id) if settings.duplicate_detection_enabled else None
        if key is not None and queue.is_duplicate(key, possible_duplicate):
            queue.duplicates += 1
            return None, key, True
        mode = settings.persistence_mode
        persistent = durable if mode == "as_message" else mode == "persistent"
        if persistent and limited:
            self._check_space()
        entry = Entry(next(self._ids), message, priority, expires, persistent)
        if expires is not None and expires <= now:
            queue.expired += 1
            if settings.expired_to_dlq:
                self.dead_letter(queue, entry, "expired before it arrived")
            return None, key, False
        return entry, key, False

    def _check_space(self) -> None:
        """Raises DiskFull while the store's disk alarm is on (a persistent message is not taken)."""
        if self._store is not None and self._store.space.on:
            raise DiskFull(f"router {self.router_name} refuses persistent messages: {self._store.space.describe()}")

    def _put_ops(self, queue: Queue, entry: Entry, key: str | None, txid: str | None = None) -> list[Op]:
        if not entry.persistent:
            return []
        ops: list[Op] = [PutMessage(entry.id, queue.name, entry.message.raw, entry.delivery_count, txid)]
        if key is not None and txid is None:
            ops.append(RememberId(queue.name, key, queue.settings.duplicate_detection_backlog_size))
        return ops

    async def send(self, address: str, message: Message, *, possible_duplicate: bool = False) -> SendResult:
        """Put ``message`` into the queue for ``address``; a persistent message is durable
        when this returns.

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError: the message was not taken.
        """
        done = trio.Event()
        failure: list[BaseException] = []

        def durable(error: BaseException | None) -> None:
            if error is not None:
                failure.append(error)
            done.set()

        result = self.send_nowait(address, message, possible_duplicate=possible_duplicate, on_durable=durable)
        with trio.CancelScope(shield=True):  # once taken, learn whether it became durable
            await done.wait()
        if failure:
            raise failure[0]
        return result

    def send_nowait(
        self,
        address: str,
        message: Message,
        *,
        possible_duplicate: bool = False,
        on_durable: Callable[[BaseException | None], None] | None = None,
    ) -> SendResult:
        """Put ``message`` into the queue for ``address`` without waiting; for a persistent
        message ``on_durable(None)`` is called once it is stored (``on_durable(error)`` if
        storing failed), for any other at once. A listener settles the producer's delivery
        in that callback.

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError: the message was not taken
                (``on_durable`` is not called).
        """
        queue = self.queues.get(address) or self.queue(address)
        if queue.name != address and "@" in address and not address.endswith(self._at_local):
            message = self._rewritten(address, message)
        now = now_ms()
        entry, key, duplicate = self._entry(queue, message, possible_duplicate, now)
        if entry is None:
            if on_durable is not None:
                on_durable(None)
            return SendResult(0, duplicate)
        if key is not None:
            queue.remember(key)
        delay = queue.flow_delay(now)
        queue.add(entry)
        if entry.persistent:
            assert self._store is not None
            if entry.state == AVAILABLE and queue.over_cache():  # beyond the cache: out once stored
                on_durable = _swapping(((queue, entry),), on_durable or _ignore)
            self._store.commit_nowait(self._put_ops(queue, entry, key), on_durable or _ignore)
        elif on_durable is not None:
            on_durable(None)
        return _delayed(delay) if delay else _NOT_DELAYED

    def send_to_queues(
        self,
        queues: Sequence[Queue],
        message: Message,
        *,
        on_durable: Callable[[BaseException | None], None] | None = None,
    ) -> tuple[int, list[Queue]]:
        """Put one message into several local queues (a topic publish fans out this way).

        The message's metadata is read once; each queue gets its own entry (persistent
        where its persistence mode says so). ``on_durable`` is called once when every
        persistent copy is stored. Returns the largest flow-control delay among the queues
        and the queues that were full (or deleted) and got no copy.

        Raises:
            MessageTooLarge, QueueError (malformed message): no queue got a copy.
        """
        if len(message.raw) > self.max_message_size:
            raise MessageTooLarge(
                f"message of {len(message.raw)} bytes exceeds max-message-size {self.max_message_size}"
            )
        now = now_ms()
        try:
            durable, priority, expires, _ = message.queue_info(now, check=True)
        except MessageError as exc:
            raise MalformedMessage(f"malformed message: {exc}", exc.condition) from None
        if expires is not None and expires <= now:
            if on_durable is not None:
                on_durable(None)
            return 0, []
        if self._store is not None and self._store.space.on:  # refused before any queue got a copy
            modes = {queue.settings.persistence_mode for queue in queues}
            if "persistent" in modes or (durable and "as_message" in modes):
                self._check_space()
        ops: list[Op] = []
        skipped: list[Queue] = []
        swap: list[tuple[Queue, Entry]] = []
        delay = 0
        for queue in queues:
            limit, limit_bytes = queue.settings.max_messages, queue.settings.max_bytes
            if queue.deleted or 0 <= limit <= queue.size or 0 <= limit_bytes < queue.bytes + len(message.raw):
                skipped.append(queue)
                continue
            mode = queue.settings.persistence_mode
            persistent = durable if mode == "as_message" else mode == "persistent"
            entry = Entry(next(self._ids), message, priority, expires, persistent)
            if persistent:
                ops.append(PutMessage(entry.id, queue.name, message.raw))
            delay = max(delay, queue.flow_delay(now))
            queue.add(entry)
            if persistent and entry.state == AVAILABLE and queue.over_cache():
                swap.append((queue, entry))
        if ops:
            assert self._store is not None
            if swap:
                on_durable = _swapping(swap, on_durable or _ignore)
            self._store.commit_nowait(ops, on_durable or _ignore)
        elif on_durable is not None:
            on_durable(None)
        return delay, skipped

    def transaction(self, *, memory_bound: bool = False) -> Transaction:
        """A new local transaction; ``memory_bound``: its sends are refused while the
        memory alarm is on (see :meth:`Transaction.send`)."""
        return Transaction(self, memory_bound=memory_bound)

    def prepared_transactions(self) -> Mapping[str, Transaction]:
        """Prepared transactions by xid (including those recovered at start)."""
        return dict(self._prepared)

    async def resolve_prepared(self, xid: str, *, commit: bool) -> None:
        """Commit or roll back the prepared transaction ``xid``.

        Raises:
            TransactionError: no prepared transaction has that xid.
        """
        transaction = self._prepared.get(xid)
        if transaction is None:
            raise TransactionError(f"no prepared transaction {xid!r} on router {self.router_name}")
        if commit:
            await transaction.commit()
        else:
            await transaction.rollback()

    # -- leaving without being consumed ----------------------------------------------------------

    def expire(self, queue: Queue, entry: Entry, to_dlq: bool | None = None) -> None:
        """(:class:`.queue.QueueServices`) An entry taken out of ``queue`` has expired."""
        queue.expired += 1
        queue.uncount(entry)
        if (queue.settings.expired_to_dlq if to_dlq is None else to_dlq) and queue.name != "routerdlq":
            self.dead_letter(queue, entry, "expired", count=False)
        else:
            entry.state = GONE
            if entry.persistent:
                self.persist_removal(entry)

    def dead_letter(self, source: Queue, entry: Entry, reason: str, *, count: bool = True) -> None:
        """(:class:`.queue.QueueServices`) Move an entry that left ``source`` (its size
        already adjusted) to routerdlq; ``count`` it as dead-lettered by ``source``."""
        if count:
            source.dead_lettered += 1
        acquired = entry.acquired or entry.state in (DELIVERED, HELD)  # a consumer had it
        entry.state = GONE
        if entry.swapped:  # its bytes first (it left the queue's counts already)
            if self._nursery is None:
                log.error(
                    "message %d of queue %s not dead-lettered (%s): the queue manager is stopping",
                    entry.id,
                    source.name,
                    reason,
                )
                return
            self._nursery.start_soon(self._dead_letter_swapped, source, entry, reason, acquired)
            return
        self._move_to_dlq(source, entry, reason, acquired)

    async def _dead_letter_swapped(self, source: Queue, entry: Entry, reason: str, acquired: bool) -> None:
        assert self._store is not None
        try:
            body = (await self._store.read_messages([entry.id])).get(entry.id)
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
        dlq = self.queues["routerdlq"]
        try:
            if source is dlq:
                raise QueueError("it was rejected from routerdlq itself")
            message = entry.message.with_annotations({DLQ_REASON: reason, DLQ_QUEUE: source.name})
            dlq.check_room(1, len(message.raw))
        except (QueueError, MessageError) as exc:
            log.error(
                "message %d of queue %s dropped instead of dead-lettered (%s): %s", entry.id, source.name, reason, exc
            )
            self._defer(*ops)
            return
        moved = Entry(
            next(self._ids), message, entry.priority, None, entry.persistent, entry.delivery_count, acquired=acquired
        )
        if moved.persistent:
            ops.append(PutMessage(moved.id, dlq.name, message.raw, moved.delivery_count))
        dlq.add(moved)
        if moved.persistent and moved.state == AVAILABLE and dlq.over_cache():
            self._swap_after_flush.append((dlq, moved))
        self._defer(*ops)
        log.warning("message %d of queue %s moved to routerdlq: %s", entry.id, source.name, reason)

    def _manager_usage(self) -> dict[str, Any]:
        return {
            "queues": len(self.queues),
            "messages": sum(queue.size for queue in self.queues.values()),  # the router's backlog
            "clients-queues": self.budget.clients_queues(),
            "routing-queues": self.budget.routing,
            "prepared-transactions": len(self._prepared),
            "deferred-operations": len(self._deferred),
            **self.memory.usage(),
        }


def _memory_limits(config: QueueManagerConfig) -> tuple[int, int]:
    """The memory alarm's high-water mark in bytes (-1: none) and its low-water percentage."""
    if config.memory_limit_kb >= 0:
        limit = config.memory_limit_kb * 1024
    elif config.memory_limit_percent:
        limit = machine_memory() * config.memory_limit_percent // 100
    else:
        limit = -1
    return limit, config.memory_low_watermark_percent


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
        self, manager: QueueManager, *, xid: str | None = None, state: str = "active", memory_bound: bool = False
    ):
        self._manager = manager
        self._memory_bound = memory_bound
        self.xid = xid
        self.state = state
        self.prepared_at: float | None = None  # epoch seconds, from the prepare record
        self._sends: list[tuple[Queue, Entry]] = []
        self._staged: dict[Queue, list[int]] = {}  # queue → [sends, bytes] staged to it
        self._keys: dict[int, str] = {}
        self._acks: list[tuple[Queue, Entry]] = []
        self._logged = True  # prepared with a record in the store (not in memory only)
        self._reserved = False  # its staged sends count against their queues' limits (Queue.reserve)

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
        queue = manager.queue(address)
        if queue.name != address and "@" in address and not address.endswith(manager._at_local):
            message = manager._rewritten(address, message)
        staged = self._staged.get(queue)  # (a scan of the sends per send made a batch cost its square)
        if staged is None:
            staged = self._staged[queue] = [0, 0]
        if limited:
            queue.check_room(staged[0] + 1, staged[1] + len(message.raw))
        elif queue.deleted:
            raise QueueError(f"queue {queue.name} has been deleted")
        now = now_ms()
        entry, key, duplicate = self._manager._entry(queue, message, possible_duplicate, now, limited=limited)
        if entry is None:
            return SendResult(0, duplicate)
        self._sends.append((queue, entry))
        staged[0] += 1
        staged[1] += entry.bytes
        if key is not None:
            self._keys[entry.id] = key
        delay = queue.flow_delay(now)
        return _delayed(delay) if delay else _NOT_DELAYED

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
        self._sends.append((dlq, Entry(next(manager._ids), message, priority, None, persistent)))

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
        if xid in manager._prepared or xid in manager._preparing:
            raise TransactionError(f"a transaction {xid!r} is prepared already")
        if (
            transient_in_memory
            and not any(entry.persistent for _, entry in self._sends)
            and not any(entry.persistent for _, entry in self._acks)
        ):
            self.xid, self.state, self.prepared_at, self._logged = xid, "prepared", time.time(), False
            manager._prepared[xid] = self
            self._reserve()
            on_done(None)
            return
        ops: list[Op] = []
        for queue, entry in self._sends:
            ops.extend(manager._put_ops(queue, entry, None, txid=xid))
        self._reserve()
        prepared_at = now_ms()
        record = {"acks": [entry.id for _, entry in self._acks if entry.persistent], "prepared-at": prepared_at}
        ops.append(PutRecord("xa", xid, json.dumps(record).encode()))

        def durable(error: BaseException | None) -> None:
            manager._preparing.discard(xid)
            if error is None:
                self.xid, self.state, self.prepared_at = xid, "prepared", prepared_at / 1000
                manager._prepared[xid] = self
            else:
                self.state = "active"
                self._unreserve()
            on_done(error)

        assert manager._store is not None
        self.state = "preparing"
        manager._preparing.add(xid)
        try:
            manager._store.commit_nowait(ops, durable)
        except BaseException:
            self.state = "active"
            self._unreserve()
            manager._preparing.discard(xid)
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
                ops.extend(manager._put_ops(queue, entry, self._keys.get(entry.id)))
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
                    self._unreserve()
            on_done(error)

        assert manager._store is not None
        self._reserve()  # (the store's write may take a while: other senders must not fill the room meanwhile)
        self.state = "committing"
        try:
            manager._store.commit_nowait(ops, durable)
        except BaseException:
            self.state = was
            if was == "active":
                self._unreserve()
            raise

    def _committed(self) -> None:
        manager = self._manager
        self.state = "committed"
        self._unreserve()
        manager._prepared.pop(self.xid or "", None)
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
        manager = self._manager
        if self.state == "prepared" and not self._logged:
            manager._prepared.pop(self.xid or "", None)
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
            manager._prepared.pop(self.xid or "", None)
        self._undo()

    def rollback_nowait(self) -> None:
        """Roll back an active transaction without waiting (it has written nothing yet);
        used when its session or connection is lost.

        Raises:
            TransactionError: the transaction is prepared (resolve it by xid instead).
        """
        self._require("active")
        self._undo()

    def _reserve(self) -> None:
        if not self._reserved:
            self._reserved = True
            for queue, (count, size) in self._staged.items():
                queue.reserve(count, size)

    def _unreserve(self) -> None:
        if self._reserved:
            self._reserved = False
            for queue, (count, size) in self._staged.items():
                queue.unreserve(count, size)

    def _undo(self) -> None:
        self.state = "rolled-back"
        self._unreserve()
        for queue, entry in self._acks:
            if entry.state == HELD:
                queue.release(entry, count_delivery=True)
        self._sends.clear()
