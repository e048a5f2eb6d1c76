"""The queue manager: sending, and the parts it is made of.

Theory of operation
-------------------
**Parts.** :class:`QueueManager` is what other swiftlets look up (the protocol
:class:`.api.QueueManager`) and the :class:`.queue.QueueServices` its queues call; it
sends, and it holds the parts that do the rest: :mod:`.names` (which local queue an
address ends up in: ``q``, ``q@<this router>``, ``q@other`` through routing's
redirections), :mod:`.catalogue` (the queues by name: made on first use within the
budget, configured, deleted), :mod:`.persistence` (deferred writes and read-backs of
swapped-out bytes, in the background), :mod:`.deadletters` (routerdlq),
:mod:`.transactions` (local and prepared transactions) and :mod:`.recovery` (the queues
and prepared transactions rebuilt from the store at start). Where a part implements one
of the methods its queues call (``persist_removal``, ``expire``, …), the manager holds
that part's bound method, set once in ``__init__``: a delivery or a settlement calls the
part directly, with no call layer of the manager's in between; so do its own sends (and a
transaction's) when they look a queue up. The methods of :class:`.api.QueueManager` that
a part implements are the manager's own, each handing the call to the part (none is
called per message; :meth:`QueueManager.resolve`, which is, applies the redirections
itself).

**Persistence.** A persistent message is written to the store (``PutMessage``) before the
sender is told it is accepted; it is made available *first*, so a fast consumer may
receive and accept it before the write is durable — the store then drops the insert and
the delete together and the message never touches the disk. Settlements that only
remove or update messages are deferred (:mod:`.persistence`): a crash can redeliver a
message consumed just before it (at-least-once), never lose one that was accepted.

**Bodies beyond the cache.** Once a persistent send's commit is durable, a queue over its
``cache-size`` keeps only the leading sections of that message (:meth:`.queue.Queue.swap_out`);
the swapped-out bytes are read back for it in the background (:mod:`.persistence`). At
start the store hands over only leading sections, and before the queue manager counts as
started the bytes of each queue's first ``cache-size`` messages and of every prepared
transaction's messages are read back (:mod:`.recovery`).

**Duplicates.** Message ids are remembered per queue (persisted for persistent messages,
bounded by the backlog size); a send marked ``possible_duplicate`` (a resend after a
failure), or every send with ``duplicate-check="always"``, whose id is remembered is
dropped and reported as a duplicate.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from martinet.kernel import Change, SwiftletContext
from martinet.messaging.message import AnnotationPatch, Message, MessageError
from martinet.swiftlets.store.api import Op, PutMessage, Store

from .api import DiskFull, MalformedMessage, MessageTooLarge, SendResult
from .catalogue import Catalogue
from .config import QueueManagerConfig
from .deadletters import DeadLetters
from .memory import MemoryAlarm, machine_memory
from .names import Names
from .persistence import Persistence, put_ops
from .queue import AVAILABLE, NOT_DELAYED, Entry, Queue, delayed, now_ms
from .recovery import Recovery
from .transactions import Transaction, Transactions

log = logging.getLogger(__name__)

__all__ = ["QueueManager", "Transaction"]


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
        self.max_message_size = config.max_message_size
        self.memory = MemoryAlarm(
            *_memory_limits(config),
            router=self.router_name,
            refuse_non_persistent=config.memory_alarm_non_persistent == "refuse",
        )
        self._store: Store | None = None
        self.ids = itertools.count(1)  # entry ids; recovery moves the count past the stored ones
        self.names = names = Names(self.router_name)
        self.persistence = persistence = Persistence()
        self.dead_letters = dead_letters = DeadLetters(self, persistence)
        self.transactions = Transactions(self)
        self.catalogue = catalogue = Catalogue(context, self, persistence)
        self.queues = catalogue.queues
        self.budget = catalogue.budget
        # What a queue calls per message, and what sends call per message, bound once: the
        # part's method itself, with no call layer of the manager's in between.
        self._redirection = names.redirection
        self._redirected = names.redirected
        self.queue = catalogue.queue
        # and the rest of the parts' :class:`.api.QueueManager` methods, as they are
        self.add_redirection, self.remove_redirection = names.add_redirection, names.remove_redirection
        self.check_room = catalogue.check_room
        self.create_temporary_queue = catalogue.create_temporary_queue
        self.delete_temporary_queues = catalogue.delete_temporary_queues
        self.delete_queue = catalogue.delete_queue
        self.when_backlog_cleared, self.when_room = catalogue.when_backlog_cleared, catalogue.when_room
        self.fetch_messages = persistence.fetch_messages
        self.transaction = self.transactions.transaction
        self.prepared_transactions = self.transactions.prepared_transactions
        self.resolve_prepared = self.transactions.resolve_prepared
        self.settings_for = catalogue.settings_for
        self.persist_removal = persistence.persist_removal
        self.persist_delivery_count = persistence.persist_delivery_count
        self.persist_message = persistence.persist_message
        self.read_back = persistence.read_back
        self.expire = dead_letters.expire
        self.dead_letter = dead_letters.dead_letter

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._store = self.persistence.store = store = self.context.lookup("sys$store", Store)
        usage = self.context.usage.add_list("queues")
        self.context.usage.provide(self._manager_usage)
        self.context.entity.on_change(self._settings_changed)
        self.catalogue.start(usage)
        recovery = Recovery(self, store, self.transactions, self.persistence)
        prepared = recovery.recover()
        await recovery.read_back(prepared)
        try:
            async with trio.open_nursery() as nursery:
                self.persistence.nursery = nursery
                nursery.start_soon(self.persistence.flush_forever)
                nursery.start_soon(self.catalogue.tick_forever)
                task_status.started()
        finally:
            self.persistence.nursery = None
            if self.persistence.deferred:
                with self.context.shutdown_scope():
                    await self.persistence.flush()

    def _settings_changed(self, change: Change) -> None:
        if change.field == "auto_create_queues":
            self.catalogue.auto_create_queues = change.new
        elif change.field == "max_message_size":
            self.max_message_size = change.new
        elif change.field == "memory_alarm_non_persistent":
            self.memory.refuse_non_persistent = change.new == "refuse"
        elif change.field.startswith("memory_"):
            config = attrs.evolve(self.context.config, **{change.field: change.new})
            self.memory.set_limits(*_memory_limits(config))
        else:
            self.budget.set(change.field, change.new)

    # -- names ----------------------------------------------------------------------------------

    def resolve(self, address: str) -> str:
        """The local queue that ``address`` (``q`` or ``q@router``) ends up in.

        Raises:
            QueueNotFound: ``q@other`` and no redirection covers it (:mod:`.names`).
        """
        name, at, router = address.rpartition("@")
        if not at:
            return address
        if router == self.router_name:
            return name
        return self._redirection(address)[0]

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
        entry = Entry(next(self.ids), message, priority, expires, persistent)
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

    def queue_for(
        self, address: str, message: Message, now: int, annotations: AnnotationPatch | None = None
    ) -> tuple[Queue, Message]:
        """The queue a send of ``message`` to ``address`` goes into, and the message with
        ``annotations`` merged in and as a redirection rewrites it (``q@other``; ``now``: its
        arrival). The redirection is looked up once, for both.

        Raises:
            QueueNotFound, TooManyQueues, QueueError: as :meth:`queue`.
            MalformedMessage: the message could not be read to merge the annotations in, or
                by the redirection's rewrite.
        """
        queue = self.queues.get(address)
        if queue is None and "@" in address and not address.endswith(self._at_local):
            target, message = self._redirected(address, message, now, annotations)
            return self.queues.get(target) or self.queue(target), message
        if queue is None:
            queue = self.queue(address)
        if annotations is not None:
            try:
                message = annotations.apply(message)
            except MessageError as exc:
                raise MalformedMessage(f"message for {address!r}: {exc}", exc.condition) from None
        return queue, message

    def send_nowait(
        self,
        address: str,
        message: Message,
        *,
        possible_duplicate: bool = False,
        on_durable: Callable[[BaseException | None], None] | None = None,
        annotations: AnnotationPatch | None = None,
    ) -> SendResult:
        """Put ``message`` into the queue for ``address`` without waiting; for a persistent
        message ``on_durable(None)`` is called once it is stored (``on_durable(error)`` if
        storing failed), for any other at once. A listener settles the producer's delivery
        in that callback. ``annotations`` are merged into the message on the way (the
        listener's client id), by the redirection's rewrite when there is one (one copy).

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError: the message was not taken
                (``on_durable`` is not called).
        """
        now = now_ms()
        queue, message = self.queue_for(address, message, now, annotations)
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
            self._store.commit_nowait(put_ops(queue, entry, key), on_durable or _ignore)
        elif on_durable is not None:
            on_durable(None)
        return delayed(delay) if delay else NOT_DELAYED

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
            entry = Entry(next(self.ids), message, priority, expires, persistent)
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

    def _manager_usage(self) -> dict[str, Any]:
        return {
            "queues": len(self.queues),
            "messages": sum(queue.size for queue in self.queues.values()),  # the router's backlog
            "clients-queues": self.budget.clients_queues(),
            "routing-queues": self.budget.routing,
            "prepared-transactions": len(self.transactions.prepared),
            "deferred-operations": len(self.persistence.deferred),
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
