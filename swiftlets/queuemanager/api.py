"""The queue manager's public interface: what other swiftlets may call, the values they see
and the errors they catch.

A swiftlet gets the queue manager with ``context.lookup("sys$queuemanager", QueueManager)``
and uses only what is defined here; the rest of :mod:`swiftlets.queuemanager` is its inside
and may change. The protocols below describe the running objects (the manager, its queues,
consumers, deliveries and transactions) by what a caller may use of them.

Theory of operation, for callers
--------------------------------
**Names.** ``q`` and ``q@<this router>`` name the local queue ``q``; ``q@other`` goes to the
local queue a redirection names (routing installs ``%@other`` → ``rt$other``), or raises
:class:`QueueNotFound`. Unknown local queues are created on first use when the manager's
``auto-create-queues`` is on and there is room for their :class:`Creator` (``max-queues``,
of which clients have all but a reserve, and per user and per address) —
except temporary ones (``tmp$…``, :data:`TEMPORARY_PREFIX`), which only
:meth:`QueueManager.create_temporary_queue` makes. A valid name is what
:func:`check_queue_name` accepts. Names containing ``$`` are the router's (temporary,
durable-subscriber, routing and system queues); which clients may use them is the
listener's and the authentication swiftlet's business, not the queue manager's.

**Sending.** :meth:`QueueManager.send` returns once a persistent message is durable;
:meth:`QueueManager.send_nowait` returns at once and reports durability through a callback
(a listener settles the producer's delivery there); :meth:`QueueManager.send_to_queues`
fans one message out to several queues (a topic publish). A send returns a
:class:`SendResult`: the flow-control delay the producer should observe before its next
send, and whether the message was dropped as a duplicate. Every message is checked on the way
in (:meth:`~messaging.message.Message.check_sections`: framing, section order,
application-properties as part 3 §3.2.5 has them; then the header and properties the queue
reads): a malformed one raises :class:`QueueError` saying what is wrong and where, and
nothing of it is queued.

**Receiving.** ``queue(address).consumer(selector)`` attaches a :class:`Consumer`. It
receives only within its credit (AMQP link credit: :meth:`Consumer.flow`,
:meth:`Consumer.set_credit`), and every delivery — an :class:`Entry` — must be settled:
accepted, released, modified, rejected, or acknowledged in a :class:`Transaction`.
Closing a consumer gives its unsettled deliveries back to the queue.

**Transactions.** :meth:`QueueManager.transaction` stages sends and acknowledgements that
take effect together at :meth:`Transaction.commit`, or not at all; two-phase callers
(routing, XA) :meth:`Transaction.prepare` under an xid, and a prepared transaction
survives a restart until :meth:`QueueManager.resolve_prepared` commits or rolls it back.

**Threads and cancellation.** Everything runs in the router's trio thread and, except
the ``async`` methods, without waiting. The ``async`` methods wait for the store; once
the store has the data, cancelling the caller does not interrupt them: they finish (or
fail) as if uncancelled and the cancellation takes effect at the caller's next
checkpoint, so a sent message or a committed transaction is never half done.

**Errors.** Everything a caller may catch is a :class:`QueueError`; the subclasses say
what was refused. Store failures (:class:`~swiftlets.store.api.StoreError`) pass through
from the transaction methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import attrs

from martinet.messaging.message import AnnotationPatch, Message
from martinet.messaging.selector import Selector

from .config import QueueSettings

__all__ = [
    "check_queue_name",
    "TEMPORARY_PREFIX",
    "ROUTING_PREFIX",
    "Creator",
    "ROUTER",
    "QueueManager",
    "Queue",
    "Consumer",
    "Entry",
    "Transaction",
    "SendResult",
    "Rewrite",
    "QueueSettings",
    "QueueError",
    "QueueNotFound",
    "QueueFull",
    "MemoryFull",
    "DiskFull",
    "MemoryAlarm",
    "TooManyQueues",
    "MessageTooLarge",
    "MalformedMessage",
    "ConsumerRefused",
    "TransactionError",
]


# -- errors ---------------------------------------------------------------------------------


class QueueError(Exception):
    """A queue operation was refused; the message says why."""


class QueueNotFound(QueueError):
    """No such queue (and it may not be created), or no route to the router named."""


class QueueFull(QueueError):
    """The queue holds ``max-messages`` or ``max-bytes`` already; ``queue`` is its name (a
    sender that can wait asks :meth:`QueueManager.when_room`)."""

    def __init__(self, message: str, queue: str = ""):
        super().__init__(message)
        self.queue = queue


class MemoryFull(QueueFull):
    """The router's memory alarm is on (it holds more than its memory budget): a send of a
    memory-bound transaction (:meth:`QueueManager.transaction`) is refused until it is off.
    It names no queue; :meth:`QueueManager.when_room` calls back when the alarm is off."""


class DiskFull(QueueFull):
    """The store's disk alarm is on (its file system has less free space than
    ``disk-free-limit-kb``, or a commit met a full disk): a persistent message is refused
    until it ends. It names no queue; :meth:`QueueManager.when_room` calls back when the
    alarm is off."""


class TooManyQueues(QueueError):
    """No room for one more queue made on demand (auto-created, temporary, a durable
    subscription's): the router holds ``max-queues`` queues, or the creator is a client and
    the clients' share, its user's or its address's allowance is used up. The message
    names the limit."""


class MessageTooLarge(QueueError):
    """The message exceeds ``max-message-size``."""


class MalformedMessage(QueueError):
    """The message's bytes cannot be read as an AMQP 1.0 message; ``condition`` is what a
    listener answers: ``amqp:decode-error``, or ``amqp:invalid-field`` for a field of the
    wrong type or range."""

    def __init__(self, description: str, condition: str = "amqp:decode-error"):
        super().__init__(description)
        self.condition = condition


class ConsumerRefused(QueueError):
    """The queue's consumer mode does not allow another consumer."""


class TransactionError(QueueError):
    """The transaction is not in a state that allows the request."""


# -- names ----------------------------------------------------------------------------------

#: The prefix of temporary queue names (``tmp$<n>``); no other queue is given it.
TEMPORARY_PREFIX = "tmp$"

#: The prefix of routing's queues (``rt$<router>``): not counted in ``max-queues`` (routing
#: bounds them by the routers it knows), so a routing peer cannot use up the clients' room.
ROUTING_PREFIX = "rt$"


@attrs.frozen
class Creator:
    """Whom a queue made on demand is made for, which decides the budget it counts against.

    A client's queue (``reserved`` false) counts against the clients' share of
    ``max-queues`` (all of it but ``reserved-queues-percent``), against
    ``max-queues-per-user`` for ``user`` (the authenticated user; empty: none, as with
    authentication off) and ``max-queues-per-address`` for ``host`` (the address it connects
    from; empty: none), until the queue is deleted, whichever connection made it. The
    router's own needs (``reserved``: management's reply queue, temporary queues of users
    in management's groups) may use the whole of ``max-queues``, so that a router whose
    clients took their share can still be managed.
    """

    user: str = ""
    host: str = ""
    reserved: bool = False


#: The router's own needs, not a client's (see :class:`Creator`).
ROUTER = Creator(reserved=True)


def check_queue_name(name: str) -> None:
    """Whether ``name`` (a local name, without ``@router``) may name a queue: non-empty,
    without ``/``, ``@`` or white space. Anything that derives a queue name (a durable
    subscription's ``<client id>$<name>``) checks it here before it stores anything.

    Raises:
        QueueError: it may not, and why.
    """
    if not name or "/" in name or "@" in name or any(c.isspace() for c in name):
        raise QueueError(f"invalid queue name {name!r}: non-empty, without '/', '@' or spaces")


# -- values ---------------------------------------------------------------------------------


Rewrite = Callable[[str, Message, int, AnnotationPatch | None], Message]
"""What a redirection does to each message it takes: ``rewrite(address, message, now,
annotations)``, ``now`` its arrival (ms since the epoch, the clock the queue counts its
expiry from). ``annotations`` (or None) are the sender's, not yet in the message: the result
has them merged in too, as if ``annotations.apply(message)`` had been rewritten, which lets a
rewrite splice both in one copy."""


class SendResult(NamedTuple):
    """What a send returns: the flow-control delay (ms) the producer should observe, and
    whether the message was dropped as a duplicate."""

    delay_ms: int
    duplicate: bool = False


# QueueSettings (re-exported from the manager's config): a queue's settings, a frozen value
# (persistence mode, max-messages, flow-control start and max delay, consumer mode, …).


# -- the running objects --------------------------------------------------------------------


class Entry(Protocol):
    """A message in one queue, as a consumer receives it. Read-only."""

    @property
    def id(self) -> int:
        """Unique within the router, ascending in send order."""

    @property
    def message(self) -> Message:
        """The message (shared by every queue it is in; immutable). A modified outcome with
        message-annotations replaces it, for this entry only, by an annotated copy."""

    @property
    def priority(self) -> int:
        """0–9; 9 is delivered first."""

    @property
    def delivery_count(self) -> int:
        """Failed deliveries at this router so far (modified with delivery-failed, unsettled
        when its consumer went, or rolled back). The header's delivery-count as the producer
        sent it comes on top [3.2.1]: a listener delivers
        ``redelivered(entry.message, entry.delivery_count)`` once ``acquired``."""

    @property
    def redelivered(self) -> bool:
        """``delivery_count > 0``."""

    @property
    def swapped(self) -> bool:
        """The message's bytes are only in the store (the queue is beyond its
        ``cache-size``): ``message`` then holds only its leading sections — header,
        annotations, properties, application-properties, what selectors read — and no body.
        A delivered entry is never swapped out; a browsed one may be
        (:meth:`QueueManager.fetch_messages` reads it back)."""

    @property
    def acquired(self) -> bool:
        """A consumer has had it before (it came back: released, modified, rolled back, or
        recovered after a restart, where nobody knows): its next delivery must say
        first-acquirer false [3.2.1]. While false, the message goes out as it came in."""


class Consumer(Protocol):
    """A receiver on one queue. Deliveries need credit; every delivery must be settled.

    Settling an entry that is not an unsettled delivery of this consumer raises
    :class:`QueueError`.
    """

    #: A listener's wake-up: called when deliveries wait to be taken (the buffer was empty)
    #: and when the consumer is closed under its owner (its queue was deleted).
    notify: Callable[[], None] | None

    @property
    def queue(self) -> Queue:
        """The queue this consumer reads."""

    @property
    def selector(self) -> Selector | None:
        """Only entries this selector matches are delivered; None: all."""

    @property
    def owner(self) -> Any:
        """Whatever the caller gave as ``owner`` when attaching (a connection, a subscription)."""

    @property
    def credit(self) -> int:
        """Deliveries this consumer may still receive."""

    @property
    def closed(self) -> bool:
        """Closed by its owner, or because its queue was deleted."""

    @property
    def buffered(self) -> int:
        """Deliveries made to this consumer and not yet taken."""

    def flow(self, credit: int) -> None:
        """Add ``credit``; deliveries start at once if entries wait."""

    def set_credit(self, credit: int) -> None:
        """Set the credit to ``credit`` (AMQP link credit is absolute); 0 drains."""

    def drain(self) -> int:
        """Deliver what is available within the credit, then drop the rest of the credit
        (AMQP drain); returns the credit dropped."""

    def receive_nowait(self) -> Entry:
        """The next delivery.

        Raises:
            trio.WouldBlock: none is waiting.
            trio.ClosedResourceError: the consumer is closed.
        """

    async def receive(self) -> Entry:
        """The next delivery, waiting for one (it needs credit to come). Cancellation
        while waiting takes nothing.

        Raises:
            trio.ClosedResourceError: the consumer is (or gets) closed.
        """

    def take(self, limit: int) -> list[Entry]:
        """Up to ``limit`` deliveries, oldest first, without waiting; empty for a closed
        consumer."""

    def accept(self, entry: Entry) -> None:
        """Consumed: the entry leaves the queue (its deletion is persisted in the background)."""

    def release(self, entry: Entry) -> None:
        """Not processed: back to the queue, delivery count unchanged."""

    def modify(
        self,
        entry: Entry,
        *,
        delivery_failed: bool = True,
        undeliverable_here: bool = False,
        annotations: Mapping[Any, Any] | None = None,
    ) -> None:
        """Back to the queue, as AMQP's modified outcome says [3.4.5]. ``delivery_failed``
        counts a failed delivery (and may send the entry to routerdlq past
        ``max-delivery-count``); ``undeliverable_here``: this consumer never gets the entry
        again (another consumer does; until one comes, it waits in the queue);
        ``annotations`` are merged into the message-annotations of the entry's message
        (what it had keeps its bytes; stored for a persistent entry). Annotations that
        cannot be merged are logged and left out; the rest of the outcome still applies."""

    def reject(self, entry: Entry, reason: str = "rejected by the consumer") -> None:
        """Unprocessable: the entry goes to routerdlq with ``reason``."""

    def close(self) -> None:
        """Detach (idempotent); deliveries never taken go back as they were, taken but
        unsettled ones go back counted as a failed delivery."""


class Queue(Protocol):
    """A local queue, as other swiftlets see it."""

    @property
    def name(self) -> str:
        """The local name (without ``@router``)."""

    @property
    def settings(self) -> QueueSettings:
        """The queue's current settings."""

    @property
    def owner(self) -> Any:
        """A temporary queue's owner (it is deleted with it); None for other queues."""

    @property
    def size(self) -> int:
        """Entries not yet gone: available, delivered and unsettled, or held by a transaction."""

    @property
    def reserved(self) -> int:
        """Entries that transactions will add at their commit (prepared, or committing):
        counted against ``max-messages`` with :attr:`size`."""

    @property
    def available(self) -> int:
        """Entries waiting for a consumer (what a purge removes)."""

    @property
    def volatile(self) -> int:
        """Non-persistent messages waiting in the queue, or delivered and not settled: what
        a stop of the router loses."""

    @property
    def consumers(self) -> Sequence[Consumer]:
        """The attached consumers, in attach order (the first is the active one in
        active-standby mode)."""

    @property
    def deleted(self) -> bool:
        """The queue has been deleted; sends and new consumers are refused."""

    def consumer(self, selector: Selector | None = None, *, owner: Any = None) -> Consumer:
        """Attach a consumer (no credit yet: call :meth:`Consumer.flow`).

        Raises:
            ConsumerRefused: exclusive mode and a consumer is attached already.
            QueueError: the queue was deleted.
        """

    def browse(self, selector: Selector | None = None) -> Iterator[Entry]:
        """The available entries in delivery order (a snapshot; nothing is consumed). A
        swapped-out entry (:attr:`Entry.swapped`) has no body in ``message``: nothing is
        read back here (:meth:`QueueManager.fetch_messages` does)."""


class Transaction(Protocol):
    """A local transaction over any number of queues: sends and acknowledgements that take
    effect together at :meth:`commit`, or not at all.

    States: ``active`` → (``prepared``) → ``committed`` | ``rolled-back``; while a prepare,
    commit or rollback waits for the store, ``preparing``, ``committing`` or
    ``rolling-back`` (a second attempt then raises :class:`TransactionError`; a failed or
    cancelled one puts the state back).
    """

    @property
    def xid(self) -> str | None:
        """The xid it was prepared under; None before."""

    @property
    def state(self) -> str:
        """``active``, ``preparing``, ``prepared``, ``committing``, ``rolling-back``,
        ``committed`` or ``rolled-back``."""

    @property
    def prepared_at(self) -> float | None:
        """When it was prepared (epoch seconds), kept in the prepare record so it survives
        a restart; None before, and for a record written before the time was kept."""

    @property
    def sends(self) -> Mapping[str, int]:
        """The staged sends: how many to each queue (by local name). After a restart,
        persistent ones only (non-persistent messages do not survive it)."""

    @property
    def acknowledgements(self) -> Mapping[str, int]:
        """The acknowledged (held) entries: how many of each queue. After a restart,
        persistent ones only."""

    def send(
        self, address: str, message: Message, *, possible_duplicate: bool = False, limited: bool = True
    ) -> SendResult:
        """Stage a send; the message becomes visible at commit. ``limited=False``: the
        queue's ``max-messages`` and ``max-bytes`` are not checked (a routing batch larger
        than the whole queue, admitted alone into it once it is empty).

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError, TransactionError.
        """

    def dead_letter(self, message: Message, reason: str, queue: str) -> None:
        """Stage ``message`` for routerdlq with ``reason`` and ``queue`` (the one it was
        meant for) in the annotations every dead letter has (``x-opt-martinet-dlq-reason``,
        ``x-opt-martinet-dlq-queue``); it never expires there. Visible at commit (routing
        dead-letters a message that expired in transit this way, in the transfer's
        transaction).

        Raises:
            QueueFull, MalformedMessage, TransactionError.
        """

    def acknowledge(self, consumer: Consumer, entry: Entry) -> None:
        """Stage the acknowledgement of an unsettled delivery of ``consumer``; the entry is
        held (neither redelivered nor removed) until commit or rollback.

        Raises:
            QueueError: not an unsettled delivery of that consumer.
            TransactionError: the transaction is not active.
        """

    async def prepare(self, xid: str) -> None:
        """Phase one: make the transaction durable as prepared under ``xid``, with the
        time (:attr:`prepared_at`). Not interrupted by cancellation once the store has it
        (see the module header). Xids are free text; ``sys$xa``
        (:mod:`martinet.swiftlets.xa.api`) says which belong to routing.

        Raises:
            TransactionError: not active, or ``xid`` is in use.
            StoreError: the store failed (the transaction stays active).
        """

    async def commit(self) -> None:
        """Make every staged send visible and remove every acknowledged entry, durably. Not
        interrupted by cancellation once the store has it (see the module header).

        Raises:
            TransactionError: already committed or rolled back.
            StoreError: the store failed (nothing took effect).
        """

    def prepare_nowait(
        self, xid: str, on_done: Callable[[BaseException | None], None], *, transient_in_memory: bool = False
    ) -> None:
        """:meth:`prepare` without waiting: the write is queued to the store now, after every
        write queued before it (the store makes them durable in that order), and
        ``on_done(None)`` is called once it is durable and the transaction prepared,
        ``on_done(error)`` if the store failed (the transaction is active again). For callers
        with many transactions in flight that must stay in order (routing links).
        ``transient_in_memory``: a transaction with nothing persistent in it (no persistent
        send, no persistent acknowledgement) is prepared in memory only, at once (no store
        write; ``on_done(None)`` before this returns): a crash loses its non-persistent
        messages anyway, and its xid with them. Routing uses it; an XA client's prepare keeps
        its record.

        Raises:
            TransactionError: not active, or ``xid`` is in use (nothing was queued).
            StoreError: the store is not running.
        """

    def commit_nowait(self, on_done: Callable[[BaseException | None], None]) -> None:
        """:meth:`commit` without waiting, queued like :meth:`prepare_nowait`: once durable,
        the sends become visible, the acknowledged entries go and ``on_done(None)`` is
        called (``on_done(error)``: nothing took effect). With nothing to write (no
        persistent message), all of that happens before it returns.

        Raises:
            TransactionError: already committed or rolled back (nothing was queued).
            StoreError: the store is not running.
        """

    async def rollback(self) -> None:
        """Drop the staged sends and redeliver the acknowledged entries (as failed
        deliveries); a prepared transaction's record is removed from the store first.

        Raises:
            TransactionError: already committed or rolled back.
            StoreError: the store failed to forget a prepared transaction (it stays prepared).
        """

    def rollback_nowait(self) -> None:
        """Roll back an active transaction without waiting (it has written nothing yet);
        used when its session or connection is lost.

        Raises:
            TransactionError: the transaction is prepared (resolve it by xid instead).
        """


class MemoryAlarm(Protocol):
    """The router's memory budget (``memory-limit-kb``) and its alarm; see the queue
    manager's ``memory`` module. A listener withholds its publishers' credit while ``on``,
    tells it the bytes of incomplete messages it holds, and waits for the alarm to clear."""

    @property
    def on(self) -> bool:
        """The router holds more than its budget (and has not yet fallen under the low-water mark)."""

    @property
    def used(self) -> int:
        """The bytes accounted now."""

    #: ``memory-alarm-non-persistent="refuse"``: a listener refuses a client's non-persistent
    #: message while the alarm is on (and counts it in ``refused``).
    refuse_non_persistent: bool
    refused: int
    router: str

    def add_buffered(self, size: int) -> None:
        """A connection holds ``size`` more bytes of incomplete incoming messages (less, when negative)."""

    def when_clear(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While the alarm is on, call ``callback`` once it goes off and return a function
        that cancels the call; None when it is off."""


@runtime_checkable
class QueueManager(Protocol):
    """What ``context.lookup("sys$queuemanager", QueueManager)`` returns."""

    @property
    def memory(self) -> MemoryAlarm:
        """The router's memory budget and alarm."""

    @property
    def queues(self) -> Mapping[str, Queue]:
        """The local queues by name (read-only for callers)."""

    @property
    def max_message_size(self) -> int:
        """The largest message (its encoded bytes) a send accepts now: the manager's
        ``max-message-size``, which may change at runtime; a bigger one raises
        :class:`MessageTooLarge`."""

    def resolve(self, address: str) -> str:
        """The local queue that ``address`` (``q`` or ``q@router``) ends up in.

        Raises:
            QueueNotFound: ``q@other`` and no redirection covers it.
        """

    def queue(self, address: str, *, create: bool | None = None, creator: Creator | None = None) -> Queue:
        """The local queue for ``address``, created if allowed (``create`` overrides
        ``auto-create-queues``; a temporary name is never created on first use, only with
        ``create=True``). A queue auto-created (``create`` not given) counts as made for
        ``creator`` (None: a client not named); one created with ``create=True`` counts only
        if ``creator`` is given (after :meth:`check_room`).

        Raises:
            QueueNotFound: unknown and not to be created, or no route.
            TooManyQueues: unknown, to be auto-created (``create`` not given), and no room
                for ``creator`` (:meth:`check_room`).
            QueueError: an invalid queue name (:func:`check_queue_name`).
        """

    async def send(self, address: str, message: Message, *, possible_duplicate: bool = False) -> SendResult:
        """Put ``message`` into the queue for ``address``; a persistent message is durable
        when this returns. ``possible_duplicate`` marks a resend after a failure (checked
        against the queue's duplicate backlog). Once the message is taken, cancellation
        waits for its durability (see the module header).

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError: the message was not taken.
            StoreError: it was taken but could not be stored.
        """

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
        storing failed), for any other at once. ``annotations`` are merged into the message
        on the way (a listener's client id): a redirection's rewrite merges them with its own
        in one copy of the message.

        Raises:
            QueueNotFound, QueueFull, MessageTooLarge, QueueError: the message was not taken
                (``on_durable`` is not called).
            StoreError: the store is not running (the message was taken but is not stored).
        """

    def send_to_queues(
        self,
        queues: Sequence[Queue],
        message: Message,
        *,
        on_durable: Callable[[BaseException | None], None] | None = None,
    ) -> tuple[int, list[Queue]]:
        """Put one message into several local queues (a topic publish fans out this way);
        ``on_durable`` is called once when every persistent copy is stored. Returns the
        largest flow-control delay among the queues and the queues that were full (or
        deleted) and got no copy.

        Raises:
            MessageTooLarge, QueueError (malformed message): no queue got a copy.
        """

    def when_backlog_cleared(self, address: str, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While sends to ``address`` are slowed down, call ``callback`` once a consumed
        message brings its queue back to ``flowcontrol-start-queuesize``, and return a
        function that cancels the call; None when the queue is not slowing sends now."""

    def when_room(self, name: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` once queue ``name`` may have room again (an entry left it, a
        transaction's reservation ended, its limits changed, or it was deleted); at once if
        there is no such queue. While the memory alarm is on: once it is off, whatever the
        queue (a :class:`MemoryFull` names none). The caller tries again and asks again if it is still full
        (a routing link holds a batch that found its queue full this way, not refusing it)."""

    def check_room(self, name: str, creator: Creator | None = None) -> None:
        """Whether one more queue, ``name`` (for the message), made for ``creator`` (None:
        a client not named) fits in ``max-queues`` and the creator's allowances (see
        :class:`Creator`); the topic manager asks before it stores a new durable
        subscription, whose queue it then creates with ``create=True`` and the creator.

        Raises:
            TooManyQueues: no room; the message names the limit.
        """

    def create_temporary_queue(self, owner: Any, creator: Creator | None = None) -> Queue:
        """A new ``tmp$<n>`` queue (:data:`TEMPORARY_PREFIX`) whose :attr:`Queue.owner` is
        ``owner``, deleted by :meth:`delete_temporary_queues` (owner); it counts as made for
        ``creator`` (None: a client not named; :data:`ROUTER` for the router's own).

        Raises:
            TooManyQueues: no room for ``creator`` (:meth:`check_room`).
        """

    def delete_temporary_queues(self, owner: Any) -> None:
        """Delete every temporary queue created for ``owner`` (a lost connection)."""

    def delete_queue(self, name: str, *, quiet: bool = False) -> None:
        """Delete a queue with its messages; its consumers are closed. ``quiet``: without the
        log line (a caller deleting many at once says so in one).

        Raises:
            QueueNotFound: no such queue.
            QueueError: a predefined queue (``unroutable``, ``routerdlq``).
        """

    def add_redirection(self, predicate: str, target: str, rewrite: Rewrite | None = None) -> None:
        """Send everything addressed to names matching ``predicate`` (SQL-LIKE on the full
        ``q@router`` name) to local queue ``target``; routing uses ``%@R`` → ``rt$R``. Each
        message sent through it (``send``, ``send_nowait``, ``Transaction.send``) is first
        replaced by ``rewrite(address, message, now)`` (routing adds its annotations); a
        ``MessageError`` from it refuses the send as ``MalformedMessage``.

        Raises:
            LikePatternError: ``predicate`` is malformed.
        """

    def remove_redirection(self, predicate: str) -> None:
        """Undo :meth:`add_redirection` (nothing happens for an unknown predicate)."""

    def fetch_messages(self, entries: Sequence[Entry], on_done: Callable[[Mapping[int, Message]], None]) -> None:
        """The whole messages of ``entries`` (a browse's), without waiting: ``on_done({id:
        message})`` is called at once when none is swapped out, else once the store has read
        the swapped-out ones back (in the router's trio thread). An entry consumed meanwhile,
        or that cannot be read, is left out. Nothing read here enters the queue's cache."""

    def transaction(self, *, memory_bound: bool = False) -> Transaction:
        """A new local transaction. ``memory_bound``: a sender that can wait (a routing
        link's inbound batch) — while the memory alarm is on, :meth:`Transaction.send`
        (limited) raises :class:`MemoryFull`, and the sender waits with :meth:`when_room`."""

    def prepared_transactions(self) -> Mapping[str, Transaction]:
        """Prepared transactions by xid (including those recovered at start, and those
        being committed or rolled back right now: see :attr:`Transaction.state`)."""

    async def resolve_prepared(self, xid: str, *, commit: bool) -> None:
        """Commit or roll back the prepared transaction ``xid``.

        Raises:
            TransactionError: no prepared transaction has that xid, or it is being
                committed or rolled back already.
            StoreError: the store failed.
        """
