"""The AMQP 1.0 listener: accepted sockets, SASL, the engine, and links to queues and topics.

Theory of operation
-------------------
One :class:`AmqpConnection` per accepted socket, with two tasks: the reader feeds the
socket's bytes to SASL (:mod:`.sasl`) and then to the AMQP engine (:mod:`.amqp`), which
calls the links below for each message and leaves the rare events (attach, detach, …) to
handle after each read; the writer sends what the engine has to send whenever something
woke it (events handled, a queue delivered to one of our consumers, a message became
durable). Both run in the router's trio thread, so the engine needs no lock.

Links, by what the client attaches:

- :class:`IncomingLink` — the client *sends*: each complete transfer gets the
  producer's client id and goes to the queue or topic of the target (or of the message's
  ``to`` on an anonymous-relay link, or into a transaction); it is settled as accepted
  when durable (at once for a non-persistent one); credit is topped up to
  ``incoming-credit``. A dynamic target makes a temporary queue or topic that lives as
  long as the link (a temporary queue's address, as for a dynamic source, is
  ``tmp$<n>@<this router>``: a reply-to that leads back here from other routers). Its
  attach announces the queue manager's max-message-size; the engine detaches it
  (amqp:link:message-size-exceeded) as soon as a message's frames pass that.
  A message that cannot be read is rejected (``amqp:decode-error``) and the link goes on:
  nothing about one message ends a connection.
- :class:`OutgoingLink` — the client *receives*: a queue consumer (a queue, a dynamic
  temporary queue, a topic subscription's queue, a durable subscription's queue) whose
  credit follows the link's; the client's outcome settles the queue entry (all of
  modified's fields [3.4.5]); closing the link or losing the connection releases what is
  unsettled. A message goes out as it came in, unless it was acquired before: then its
  header says so [3.2.1] (first-acquirer false, delivery-count counted on from the
  producer's).
- :class:`BrowsingLink` (distribution-mode copy) and :class:`CoordinatorLink`
  (transactions).

Refused attaches answer with a null terminus and a detach carrying ``amqp:not-found``,
``amqp:unauthorized-access``, ``amqp:invalid-field``, ``amqp:resource-locked`` or
``amqp:resource-limit-exceeded``.

Limits: the engine gets the listener's ``max-sessions`` and
``max-links-per-session`` (announced as channel-max and handle-max; beyond them the
connection is closed with a framing error), the queue manager's ``max-message-size`` (a
larger multi-frame message detaches its link) and ``max-incoming-buffer`` (incomplete
messages of all links together; beyond it the connection is closed). A connection creates
at most ``max-auto-created-queues-per-connection`` queues (auto-created ones, and its
temporary ones alive); across connections the queue manager counts each queue for the
user and the address it was made for (:class:`Creator`: ``max-queues-per-user``,
``max-queues-per-address``, and the clients' share of ``max-queues``), while a temporary
queue of a user in one of sys$mgmt's groups uses the router's reserve, so that
management's own client is served when the clients' room is used up. When the
connection is over, :meth:`AmqpConnection.run` breaks the reference cycles between it, its
links, the engine and the driver, so the memory goes back at once (the running router's
collector is tuned to run full collections rarely: ``kernel/cli.py``).

Broken input never ends in a traceback: a connection closed because the peer broke SASL,
framing or the encoding (``amqp:decode-error``) is one WARNING line with the peer and the
reason (:class:`BrokenInputLog`: at most 10 a minute per host, then a count), and a
message whose metadata is malformed or of the wrong type is rejected with
``amqp:invalid-field``.

Queue access (:meth:`AmqpConnection._check_queue`) is decided before a queue is looked up
or created, so a refused attach leaves nothing behind. Names containing ``$`` are the
router's: a temporary queue (``tmp$…``) takes sends from anyone (a reply-to) and receivers
only from the connection that created it; a durable subscription's queue is used only as
the durable subscription (its topic, the client id that created it); any other ``$`` name
needs a grant naming it explicitly (:meth:`Principal.check_queue`), with authentication on
or off, and must exist: a client never creates a ``$`` queue.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import attrs
import trio

from martinet.kernel.logs import HostLimitedLog
from martinet.messaging import amqp
from martinet.messaging.amqp import (
    ACCEPTED,
    COORDINATOR,
    DECLARE,
    DECLARED,
    DISCHARGE,
    JMS_DEST,
    JMS_TEMPORARY_TOPIC,
    JMS_TOPIC,
    MODIFIED,
    NO_LOCAL_FILTER,
    NO_LOCAL_FILTER_CODE,
    QUEUE_PREFIX,
    REJECTED,
    RELEASED_CODE,
    SELECTOR_FILTER,
    SELECTOR_FILTER_CODE,
    SOLE_CONNECTION_FOR_CONTAINER,
    TOPIC_PREFIX,
    TRANSACTIONAL_STATE,
    Error,
)
from martinet.messaging.amqp.sasl import Credentials, SaslError, SaslServer
from martinet.messaging.amqp.wire import AMQP_HEADER, FRAME_HEADER
from martinet.messaging.codec import DecodeError, Described, Int, Symbol, ULong, encode
from martinet.messaging.io import Driver, lead_in
from martinet.messaging.message import AnnotationPatch, Message, MessageError
from martinet.messaging.selector import SelectorError, compile_selector
from martinet.swiftlets.authentication.api import AccessDenied, AuthenticationFailed
from martinet.swiftlets.mgmt.api import IDENTITY_ANNOTATION, MANAGEMENT_QUEUE, Identity, is_management_address
from martinet.swiftlets.queuemanager.api import (
    TEMPORARY_PREFIX,
    ConsumerRefused,
    Creator,
    MalformedMessage,
    MessageTooLarge,
    QueueError,
    QueueFull,
    QueueNotFound,
    TooManyQueues,
)
from martinet.swiftlets.store.api import StoreError
from martinet.swiftlets.topicmanager.api import (
    TopicError,
    TopicNameError,
    durable_queue_name,
    from_wildcards,
    parse_topic,
)

log = logging.getLogger(__name__)

SASL_TIMEOUT = 30.0
# Seconds from a connection's start to the client's open. Counted once, whatever arrives:
# the idle timeout is reset by any frame, so a client that sends the protocol header and
# then an empty frame now and then would otherwise hold a connection that never opens.
OPEN_TIMEOUT = 30.0
# Bytes a client connection reads (and so handles) in one step. A producer's 64 KiB are some
# 400 transfers, 2-3 ms of work during which nothing else on the router runs: routing links
# waiting for their answers among them (a one-hop transfer is bounded by its open
# transactions' round trip). 16 KiB cuts that to well under a millisecond at no measurable
# cost (bench/routing_bench.py, answers flushed at once: one hop, non-persistent, 59k -> 70k
# msgs/s, router CPU per message the same; a single router's figure unchanged).
CLIENT_READ_SIZE = 16384
_BROKEN_INPUT = ("amqp:decode-error", "amqp:connection:framing-error")  # closes logged as broken input


SELECTOR_FILTERS = (SELECTOR_FILTER, SELECTOR_FILTER_CODE)
NO_LOCAL_FILTERS = (NO_LOCAL_FILTER, NO_LOCAL_FILTER_CODE)
CLIENT_ID_ANNOTATION = Symbol("x-opt-martinet-cid")  # the producer's client id (SwiftMQ's JMS_SWIFTMQ_CID)
JMS_TOPIC_TYPES = (JMS_TOPIC, JMS_TEMPORARY_TOPIC)


class BrokenInputLog(HostLimitedLog):
    """The listener's per-host limited log (:class:`~kernel.logs.HostLimitedLog`): by
    default WARNING lines for connections closed because the peer sent what does not decode
    or breaks SASL or framing; ``line`` and ``counted`` make the same for other events a
    client can repeat at will (refused transfers and attaches, at INFO)."""

    def __init__(
        self,
        line: str = "%s from %s closed: %s",
        counted: str = "connections from %s closed for broken input",
        level: int = logging.WARNING,
    ) -> None:
        super().__init__(log, line, counted, level)


def _filters(source: amqp.Terminus) -> tuple[str | None, bool]:
    """(selector, no-local) from a source's filter set (the Qpid JMS filter descriptors)."""
    selector, no_local = None, False
    for value in (source.filter or {}).values():
        if isinstance(value, Described) and value.descriptor in SELECTOR_FILTERS:
            selector = str(value.value)
        elif isinstance(value, Described) and value.descriptor in NO_LOCAL_FILTERS:
            no_local = True
    return selector, no_local


def _transaction_id(state: Any) -> bytes | None:
    """The txn-id of a transfer's or disposition's transactional state [4.5.5], else None."""
    if amqp.state_code(state) != TRANSACTIONAL_STATE or not isinstance(state.value, list) or not state.value:
        return None
    return state.value[0] if isinstance(state.value[0], bytes) else None


def _rejected(condition: str, description: str) -> Described:
    return amqp.outcome(REJECTED, Error(condition, description).described())


def _destination(terminus: amqp.Terminus) -> tuple[str, bool]:
    """(name, is_topic) of a source or target: ``topic://`` or capability ``topic`` make a topic."""
    address = terminus.address or ""
    if address.startswith(TOPIC_PREFIX):
        return address[len(TOPIC_PREFIX) :], True
    if address.startswith(QUEUE_PREFIX):
        return address[len(QUEUE_PREFIX) :], False
    return address, bool({"topic", "temporary-topic"} & set(terminus.capabilities))


class _Deferred(Exception):
    """An attach that must await something (a durable subscription's store record) first."""

    def __init__(self, finish: Any):
        super().__init__("deferred attach")
        self.finish = finish


class _Refused(Exception):
    def __init__(self, condition: str, description: str):
        super().__init__(description)
        self.condition = condition


class IncomingLink:
    """A link the client sends on: transfers go into a queue, to a topic, or — on an
    anonymous-relay link (no target) — wherever each message's ``to`` says."""

    def __init__(
        self, connection: AmqpConnection, link: amqp.Link, address: str | None, topic: bool, on_close: Any = None
    ):
        self.connection = connection
        self.on_close = on_close  # deletes a temporary queue
        self.link = link
        self.address = address
        self.topic = topic
        self.window = connection.config.incoming_credit
        self.unreplenished = 0  # transfers since the credit was last topped up
        self.delay_ms = 0  # the largest flow-control delay a send got since then
        self.delayed_queue: str | None = None  # where that send went (None: a topic)
        self.throttled = False  # the top-up waits for the delay

    def start(self) -> None:
        if self.connection.held_by_memory():  # a new link is no way around the alarm
            self.throttled = True
            self.connection.throttle(self)
        else:
            self.link.flow(self.window)

    def on_transfer(self, delivery_id: int, data: bytes, remotely_settled: bool, state: Any) -> None:
        connection, link = self.connection, self.link
        connection.received += 1

        def durable(error: BaseException | None) -> None:
            if not connection.closed:
                link.settle(delivery_id, _rejected("amqp:internal-error", str(error)) if error else ACCEPTED)
                connection.wake()

        try:
            message = connection.with_client_id(Message(data))
            address, topic = self.address, self.topic
            if address is None:  # anonymous relay: route by the message's own address
                address, topic = connection.route(message)
            if not topic and is_management_address(address):
                message = connection.with_identity(message)
            if state is not None and amqp.state_code(state) == TRANSACTIONAL_STATE:
                self._stage(delivery_id, address, topic, message, state, remotely_settled)
            else:
                if topic:
                    result = connection.publish(address, message, None if remotely_settled else durable)
                else:
                    result = connection.queue_manager.send_nowait(
                        address, message, on_durable=None if remotely_settled else durable
                    )
                if result.delay_ms > self.delay_ms:
                    self.delay_ms, self.delayed_queue = result.delay_ms, None if topic else address
        except (QueueError, TopicError, MessageError, DecodeError, _Refused, StoreError) as exc:
            # (StoreError: the store failed, and the router is stopping: refused, not a traceback)
            connection.swiftlet.refusals.warn(
                connection.host, f"transfer to {self.address or '(anonymous relay)'}", exc
            )
            if not remotely_settled:
                link.settle(delivery_id, _rejected(_condition(exc), str(exc)))
        self.unreplenished += 1
        if self.unreplenished >= self.window // 2 and not self.throttled:  # half the window used
            if self.delay_ms or connection.held_by_memory():
                self.throttled = True
                connection.throttle(self)
            else:
                self.unreplenished = 0
                link.flow(self.window)

    def resume(self) -> None:
        """The flow-control wait is over: top the credit up."""
        self.delay_ms, self.delayed_queue, self.throttled, self.unreplenished = 0, None, False, 0
        self.link.flow(self.window)

    def _stage(
        self, delivery_id: int, address: str, topic: bool, message: Message, state: Any, remotely_settled: bool
    ) -> None:
        """A transactional transfer: staged in its transaction, accepted within it [4.4.1]."""
        if topic:
            raise _Refused("amqp:not-implemented", "transactional publishing to topics is not supported")
        txn_id = _transaction_id(state)
        self.connection.transaction(txn_id).send(address, message)
        if not remotely_settled:
            self.link.settle(delivery_id, amqp.outcome(TRANSACTIONAL_STATE, txn_id, ACCEPTED))
            self.connection.wake()

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()


def _condition(exc: Exception) -> str:
    """The AMQP error condition that refuses a transfer for ``exc``."""
    if isinstance(exc, (_Refused, MalformedMessage, MessageError)):
        return exc.condition
    if isinstance(exc, DecodeError):
        return "amqp:decode-error"
    if isinstance(exc, MessageTooLarge):
        return "amqp:link:message-size-exceeded"
    if isinstance(exc, QueueNotFound):  # e.g. a temporary queue gone, or its router no longer known
        return "amqp:not-found"
    if isinstance(exc, StoreError):
        return "amqp:internal-error"
    return "amqp:resource-limit-exceeded" if isinstance(exc, QueueFull) else "amqp:invalid-field"


def _outgoing(entry: Any) -> Message:
    """The message of a queue entry as a delivery carries it: as it came in, or — acquired
    before — with first-acquirer false and the failed deliveries added to the producer's
    delivery-count [3.2.1].

    Raises:
        MessageError: its header cannot be read (the caller dead-letters it).
    """
    return entry.message.redelivered(entry.delivery_count) if entry.acquired else entry.message


class OutgoingLink:
    """A link the client receives on: a queue consumer whose credit follows the link's."""

    def __init__(
        self,
        connection: AmqpConnection,
        link: amqp.Link,
        consumer: Any,
        on_close: Any = None,
        durable: tuple[str, str] | None = None,
    ):
        self.connection = connection
        self.on_close = on_close  # ends a subscription or deletes a dynamic queue
        self.durable = durable  # (client id, subscription name) of a durable subscription
        self.link = link
        self.consumer = consumer
        self.unsettled: dict[int, Any] = {}  # delivery id → queue entry
        consumer.notify = connection.wake

    def start(self) -> None:
        self.sync_credit()

    def sync_credit(self) -> None:
        self.consumer.set_credit(self.link.credit - self.consumer.buffered)

    def pump(self) -> None:
        """Send what the consumer received, within the link's credit and the session's window."""
        link, consumer = self.link, self.consumer
        if consumer.closed:  # the queue was deleted under the link
            self.connection.detach(self, "amqp:resource-deleted", f"queue {consumer.queue.name} was deleted")
            return
        credit = link.credit
        if credit > 0 and consumer.buffered and not link.session.blocked:
            presettled, unsettled, send = link.presettled, self.unsettled, link.send
            entries = consumer.take(min(credit, link.session.remote_incoming_window))
            sent = len(entries)
            for entry in entries:
                try:
                    raw = entry.message.raw if not entry.acquired else _outgoing(entry).raw
                except MessageError as exc:  # (no delivery was made: the link's credit stays)
                    log.error(
                        "message %d of queue %s cannot be delivered, moved to routerdlq: %s",
                        entry.id,
                        consumer.queue.name,
                        exc,
                    )
                    consumer.reject(entry, f"cannot be delivered: {exc}")
                    sent -= 1
                    continue
                delivery_id = send(raw, presettled)
                if presettled:
                    consumer.accept(entry)
                else:
                    unsettled[delivery_id] = entry
            self.connection.sent += sent
            if sent < len(entries):  # the link's credit for those is unused: the consumer gets it back
                self.sync_credit()
        if link.drain and link.credit > 0 and not consumer.buffered:
            consumer.drain()
            link.drained()

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        code = amqp.state_code(state)
        if not settled and (code is None or code == amqp.RECEIVED):
            return  # nothing the client decided yet
        entry = self.unsettled.pop(delivery_id, None)
        if entry is None:
            return  # settled before (by us, or sent settled)
        if not settled:
            self.link.settle(delivery_id)
        consumer = self.consumer
        if code == amqp.ACCEPTED_CODE:
            consumer.accept(entry)
        elif code == TRANSACTIONAL_STATE and (txn_id := _transaction_id(state)) is not None:
            try:  # acknowledged within a transaction: held until discharge
                self.connection.transaction(txn_id).acknowledge(consumer, entry)
            except _Refused:
                consumer.release(entry)
        elif code == RELEASED_CODE:
            consumer.release(entry)
        elif code == REJECTED:
            consumer.reject(entry, "rejected by the client")
        elif code == MODIFIED:  # [3.4.5] delivery-failed, undeliverable-here, message-annotations
            fields = (state.value if isinstance(state.value, list) else []) + [None, None, None]
            annotations = fields[2] if isinstance(fields[2], dict) else None
            consumer.modify(
                entry, delivery_failed=bool(fields[0]), undeliverable_here=bool(fields[1]), annotations=annotations
            )
        else:  # settled by the client without an outcome (or a transactional state without an id)
            consumer.accept(entry)

    def close(self) -> None:
        self.consumer.notify = None
        self.consumer.close()
        if self.on_close is not None:
            self.on_close()


class CoordinatorLink:
    """The transaction coordinator [4.2]: ``declare`` opens a transaction and answers
    ``declared`` with its id; ``discharge`` commits or rolls it back, answering accepted —
    or rejected with ``amqp:transaction:rollback`` if the commit failed."""

    def __init__(self, connection: AmqpConnection, link: amqp.Link):
        self.connection = connection
        self.link = link

    def start(self) -> None:
        self.link.flow(100)

    def on_transfer(self, delivery_id: int, data: bytes, remotely_settled: bool, state: Any) -> None:
        connection, link = self.connection, self.link
        try:
            control = Message(data).body()
            kind = amqp.descriptor_code(getattr(control, "descriptor", None))
            fields = getattr(control, "value", None)
            fields = fields if isinstance(fields, list) else []
            if kind == DECLARE:
                link.settle(delivery_id, amqp.outcome(DECLARED, connection.declare()))
            elif kind == DISCHARGE and fields and isinstance(fields[0], bytes):  # txn-id: binary [4.5.3]
                connection.discharge(link, delivery_id, fields[0], bool(fields[1]) if len(fields) > 1 else False)
            else:
                raise _Refused("amqp:invalid-field", f"not a declare or discharge: {control!r}"[:200])
        except (_Refused, MessageError, DecodeError) as exc:
            link.settle(delivery_id, _rejected(_condition(exc), str(exc)))
        if link.credit < 50:
            link.flow(100)
        connection.wake()

    def close(self) -> None:
        pass


class BrowsingLink:
    """A link with distribution-mode copy: settled copies of what the queue holds at attach
    time, in delivery order; nothing is consumed. A drain ends the browse: credit the client
    asks to drain is given back (delivery-count advanced) only once every copy was sent.

    The bytes of entries the queue keeps only in the store (swapped out) are read back for
    the browser, :data:`FETCH` entries at a time, ahead of the copies sent; what is read
    for a browser is the browser's and does not enter the queue's cache."""

    FETCH = 256

    def __init__(self, connection: AmqpConnection, link: amqp.Link, entries: list[Any], queue_manager: Any):
        self.connection = connection
        self.link = link
        self._entries = entries
        self._next = 0  # index of the next entry to send
        self._queue_manager = queue_manager
        self._fetched: dict[int, Message] = {}  # whole messages read back, by entry id
        self._missing: set[int] = set()  # entries the store no longer had (consumed meanwhile)
        self._fetching = False

    def start(self) -> None:
        self.sync_credit()

    def sync_credit(self) -> None:
        self.connection.wake()

    def pump(self) -> None:
        link = self.link
        while link.credit > 0 and not link.session.blocked:
            if self._next >= len(self._entries):
                link.drained()
                return
            entry = self._entries[self._next]
            message = self._fetched.pop(entry.id, None)
            if message is None:
                if entry.id in self._missing:
                    self._next += 1
                    continue
                if entry.swapped:
                    self._fetch()
                    return  # the fetch wakes the connection
                message = entry.message
            self._next += 1
            try:
                if entry.acquired:
                    message = message.redelivered(entry.delivery_count)
            except MessageError as exc:  # a copy nobody can read: left out of the browse
                log.warning("message %d not browsed: %s", entry.id, exc)
                continue
            link.send(message.raw, True)

    def _fetch(self) -> None:
        if self._fetching:
            return
        self._fetching = True
        batch = self._entries[self._next : self._next + self.FETCH]

        def fetched(messages: Any) -> None:
            self._fetching = False
            for entry in batch:
                message = messages.get(entry.id)
                if message is None:
                    self._missing.add(entry.id)
                else:
                    self._fetched[entry.id] = message
            self.connection.wake()

        self._queue_manager.fetch_messages(batch, fetched)

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        pass  # browsed copies go out settled

    def close(self) -> None:
        self._entries = []
        self._fetched.clear()


def refusal(container_id: str, condition: str, description: str) -> bytes:
    """What a server answers a client that sent the AMQP header but may not stay: our header,
    an ``open`` and a ``close`` with the error. "a peer that wishes to close the connection
    with an error … MUST first send an open frame" [2.4.1]; the close carries the condition
    [2.7.9], e.g. ``amqp:unauthorized-access`` or ``amqp:resource-limit-exceeded`` [2.8.15]."""
    frames = [
        Described(ULong(0x10), [container_id]),
        Described(ULong(0x18), [Described(ULong(0x1D), [Symbol(condition), description, None])]),
    ]
    out = bytearray(AMQP_HEADER)
    for performative in frames:
        body = encode(performative)
        out += FRAME_HEADER.pack(8 + len(body), 2, 0, 0) + body
    return bytes(out)


class _Login:
    """The lead-in stage of a client connection: SASL up to the client's credentials
    (:class:`messaging.io.Stage`). The decision on them comes after the stage, as the
    authentication swiftlet may check a password hash in a worker thread meanwhile; then
    :meth:`accept` or :meth:`refuse` answers. A refusal is held back (:attr:`refusal`) so
    that the connection can answer it after the authentication swiftlet's throttling delay."""

    def __init__(self, sasl: SaslServer):
        self._sasl = sasl
        self.credentials: Credentials | None = None
        self.refusal = b""

    def receive_data(self, data: bytes) -> bool:
        """Raises: SaslError (a broken exchange)."""
        self.credentials = self._sasl.receive_data(data)
        return self.credentials is not None

    @property
    def data_to_send(self) -> bytes:
        return self._sasl.data_to_send

    @property
    def remaining(self) -> bytes:
        return b""  # (what the client sent after SASL is the answer of accept())

    @property
    def skipped_sasl(self) -> bool:
        return self.credentials is not None and self.credentials.mechanism is None

    def accept(self) -> tuple[bytes, bytes]:
        """The outcome to write, and what the client sent after SASL (AMQP's input)."""
        self._sasl.accept()
        return self._sasl.data_to_send, self._sasl.remaining

    def refuse(self) -> None:
        self._sasl.refuse()
        self.refusal = self._sasl.data_to_send  # empty when the client skipped SASL


class AmqpConnection:
    """One client connection."""

    def __init__(self, swiftlet: Any, config: Any, stream: trio.abc.Stream, host: str):
        self.swiftlet = swiftlet
        self.config = config
        self.stream = stream
        self.host = host
        self.queue_manager = swiftlet.queue_manager
        self.topic_manager = swiftlet.topic_manager
        self.client_id: str | None = None
        self.sole = False  # the client asked to be the only connection of its container id
        self._client_id_patch: AnnotationPatch | None = None  # the client id annotation, once the client opened
        self.principal: Any = None
        self.authenticated = False
        self.creator = Creator(host=host)  # whom its queues count for: the user too, once logged in
        self.transactions: dict[bytes, Any] = {}
        self._transaction_ids = itertools.count(1)
        self._driver: Driver | None = None
        self.engine: amqp.Connection | None = None
        self.links: dict[amqp.Link, IncomingLink | OutgoingLink | BrowsingLink | CoordinatorLink] = {}
        self._pending: dict[amqp.Link, bool | None] = {}  # attaches that wait → the peer's detach (closed?)
        self.auto_created = 0  # queues auto-created for this connection (they outlive it)
        self.temporary = 0  # its temporary queues alive now
        self.closed = False
        self.opened = False  # the client's open was accepted (its closing is logged then)
        self.received = self.sent = 0  # messages from and to the client
        self.flow_control_waits = 0  # producer credit withheld for a flow-control delay
        self.memory_waits = 0  # producer credit withheld while the router's memory alarm was on
        self.memory = self.queue_manager.memory
        self._buffered = 0  # the engine's incomplete incoming bytes, as told to self.memory
        self.receive_rate = self.send_rate = 0.0
        self._rate_mark = (time.monotonic(), 0, 0)
        self.since = time.time()
        self._handlers = {
            amqp.ConnectionOpened: self._on_connection_open,
            amqp.ConnectionClosed: self._on_connection_closed,
            amqp.LinkAttached: self._on_link_open,
            amqp.LinkDetached: self._on_link_detach,
            amqp.LinkFlow: self._on_flow,
            amqp.SessionEnded: self._on_session_end,
        }

    @property
    def who(self) -> str:
        """The user, client id and listener, for the log."""
        user = getattr(self.principal, "user", "") or "anonymous"
        return f"user {user}, client id {self.client_id or '(none)'}, listener {self.config.name}"

    def wake(self) -> None:
        """Have the writer move deliveries onto links and write what the engine has (the
        driver's own ``wake`` replaces this method once the driver exists: it is called
        per message)."""

    def sample_rates(self) -> None:
        at, received, sent = self._rate_mark
        now = time.monotonic()
        if now > at:
            self.receive_rate = (self.received - received) / (now - at)
            self.send_rate = (self.sent - sent) / (now - at)
        self._rate_mark = (now, self.received, self.sent)

    def usage(self, listener: str) -> dict[str, Any]:
        return {
            "listener": listener,
            "host": self.host,
            "client-id": self.client_id or "",
            "user": getattr(self.principal, "user", "") or "",
            "connected-since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since)),
            "links": len(self.links),
            "transactions": len(self.transactions),
            "flow-control-waits": self.flow_control_waits,
            "memory-waits": self.memory_waits,
            "messages-received": self.received,
            "messages-sent": self.sent,
            "receive-rate": round(self.receive_rate, 1),
            "send-rate": round(self.send_rate, 1),
        }

    async def run(self) -> None:
        try:
            login = _Login(SaslServer())
            with trio.move_on_after(SASL_TIMEOUT) as timer:
                await lead_in(self.stream, login)
                # lead_in returns once the SASL stage is over, i.e. once it has the credentials
                assert login.credentials is not None
                try:
                    self.principal = await self.swiftlet.login(login.credentials, self.host)
                    # a user and password checked now (what a management request may rely on)
                    self.authenticated = self.swiftlet.authentication_enabled and login.credentials.mechanism == "PLAIN"
                    if self.authenticated:  # without a checked login every client is one "anonymous"
                        self.creator = Creator(user=getattr(self.principal, "user", "") or "", host=self.host)
                except AuthenticationFailed:
                    login.refuse()
                    raise
                outcome, remaining = login.accept()
                if outcome:
                    await self.stream.send_all(outcome)
            if timer.cancelled_caught:
                log.info("connection from %s closed: no SASL exchange within %.0f s", self.host, SASL_TIMEOUT)
                return
            config = self.config
            self.engine = amqp.Connection(
                container_id=f"martinet:{self.swiftlet.router_name}",
                idle_timeout=config.keepalive_interval / 1000,
                max_frame_size=config.max_frame_size,
                channel_max=config.max_sessions - 1,
                handle_max=config.max_links_per_session - 1,
                max_message_size=self.queue_manager.max_message_size,
                max_incoming_buffer=config.max_incoming_buffer,
            )
            self._driver = Driver(
                self.stream,
                self.engine,
                on_input=self._handle_events,
                before_write=self._before_write,
                read_size=CLIENT_READ_SIZE,
            )
            self.wake = self._driver.wake  # type: ignore[method-assign]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._open_deadline, self.engine)
                await self._driver.run(remaining)
                nursery.cancel_scope.cancel()
        except* SaslError as group:
            self.swiftlet.broken_input.warn(self.host, "connection (SASL)", group.exceptions[0])
        except* AuthenticationFailed as group:  # logged by the authentication swiftlet
            failure = group.exceptions[0]
            while isinstance(failure, ExceptionGroup):  # except* keeps the nesting of the groups it split
                failure = failure.exceptions[0]
            log.debug("login refused: %s", failure)
            await self._answer_refusal(login, failure)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.debug("connection from %s ended: %s", self.host, group.exceptions[0])
        finally:
            self._release()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()
            self._break_cycles()

    async def _open_deadline(self, engine: amqp.Connection) -> None:
        """Close the connection (amqp:resource-limit-exceeded) if the client has not opened
        it :data:`OPEN_TIMEOUT` seconds after it started."""
        await trio.sleep(OPEN_TIMEOUT)
        if engine.state not in (amqp.ConnectionState.START, amqp.ConnectionState.HDR_EXCH):
            return  # opened (or closing)
        log.info("connection from %s closed: no open within %.0f s", self.host, OPEN_TIMEOUT)
        engine.close(amqp.Error("amqp:resource-limit-exceeded", f"no open within {OPEN_TIMEOUT:.0f} s"))
        self.wake()

    def _break_cycles(self) -> None:
        """The connection is over: drop the references that make it a cycle (the engine's
        sessions and links and their handlers, which refer back here; the driver's and the
        event table's bound methods), so it is freed at once rather than at the next full
        collection, which the running router makes rare (237 MB were once held by closed
        connections, 39 MB after one gc.collect())."""
        if self.engine is not None:
            self.engine.release()
        self._driver = None
        self.__dict__.pop("wake", None)  # the driver's wake, bound in run
        self._handlers = {}

    async def _answer_refusal(self, login: _Login, failure: AuthenticationFailed) -> None:
        """Answer a refused login after the authentication swiftlet's delay for this address:
        a SASL outcome, or — a client that skipped SASL — an AMQP close [2.4.1]."""
        answer = login.refusal
        if login.skipped_sasl:
            answer = refusal(f"martinet:{self.swiftlet.router_name}", "amqp:unauthorized-access", failure.reason)
        try:
            with trio.move_on_after(SASL_TIMEOUT):
                await trio.sleep(self.swiftlet.refusal_delay(self.host))
                if answer:
                    await self.stream.send_all(answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client left without waiting

    def _before_write(self) -> None:
        # "Sending a close signals that the sender will not be sending any more frames" [2.7.9]:
        # a client that closed while it still had credit (proton's queue_browser.py does) used
        # to get transfers after our close.
        engine = self.engine
        assert engine is not None  # the driver, which calls this, runs only with an engine
        if engine.opened:
            for link in list(self.links.values()):
                if isinstance(link, (OutgoingLink, BrowsingLink)):
                    link.pump()
        self._handle_events()

    def _handle_events(self) -> None:
        engine = self.engine
        assert engine is not None
        buffered = engine.incoming_buffered
        if buffered != self._buffered:  # incomplete messages count against the router's memory budget
            self.memory.add_buffered(buffered - self._buffered)
            self._buffered = buffered
        engine.dispatch(self._handlers)

    # -- events ---------------------------------------------------------------------------------

    def _on_connection_open(self, event: amqp.ConnectionOpened) -> None:
        """A container id (the JMS client id) may be used by several connections at once, as
        proton and rhea do for all connections of one container; only a client that asks for
        ``sole-connection-for-container`` (Qpid JMS, when its application set a client id)
        gets it exclusively: it is refused while another connection uses the id, and a later
        one is refused while it does — unless the listener's ``allow-same-clientid``. Durable
        subscriptions are guarded per subscription (``_attach_durable``)."""
        engine = self.engine
        assert engine is not None  # events come from the engine
        client_id = engine.remote_container_id
        sole = SOLE_CONNECTION_FOR_CONTAINER in engine.remote_desired_capabilities
        engine.offered_capabilities = ["ANONYMOUS-RELAY"]
        if sole and not self.config.allow_same_clientid:
            engine.offered_capabilities.append(SOLE_CONNECTION_FOR_CONTAINER)  # it is enforced
        config = self.config  # the connection-factory settings, for clients that use them (ours)
        engine.properties = {
            Symbol("martinet:consumer-cache-size"): Int(config.consumer_cache_size),
            Symbol("martinet:default-delivery-mode"): config.jms_default_delivery_mode,
            Symbol("martinet:default-priority"): Int(config.jms_default_message_priority),
            Symbol("martinet:default-ttl"): ULong(config.jms_default_message_ttl),
            Symbol("martinet:router"): self.swiftlet.router_name,
        }
        others = self.swiftlet.client_ids.get(client_id, []) if client_id else []
        if others and not self.config.allow_same_clientid and (sole or any(other.sole for other in others)):
            log.info(
                "connection from %s refused: client id %r is in use%s",
                self.host,
                client_id,
                "" if sole else " by a connection that asked to be its only one",
            )
            engine.close(
                Error(
                    "amqp:invalid-field",
                    f"client id {client_id!r} is in use",
                    {Symbol("invalid-field"): Symbol("container-id")},
                )
            )
            return
        self.client_id, self.sole = client_id, sole
        self._client_id_patch = AnnotationPatch({CLIENT_ID_ANNOTATION: client_id})
        if client_id:
            self.swiftlet.client_ids.setdefault(client_id, []).append(self)
        engine.open()
        self.opened = True
        self.swiftlet.comings.warn(self.host, "client connection", f"opened: {self.who}")

    def _on_connection_closed(self, event: amqp.ConnectionClosed) -> None:
        self.closed = True  # late answers (settlements, attaches, credit) are not sent any more
        if event.error is not None and not event.by_peer:
            if event.error.condition in _BROKEN_INPUT:
                self.swiftlet.broken_input.warn(self.host, "connection", event.error)
            else:
                log.info("connection from %s closed: %s", self.host, event.error)

    def _on_link_open(self, event: amqp.LinkAttached) -> None:
        link = event.link
        try:
            if link.is_sender:
                state: IncomingLink | OutgoingLink | BrowsingLink | CoordinatorLink = self._attach_outgoing(link)
            else:
                state = self._attach_incoming(link)
        except _Refused as refusal:
            self._refuse(link, refusal)
            return
        except TooManyQueues as exc:  # a temporary queue (of a subscription, too) beyond max-queues
            self._refuse(link, _Refused("amqp:resource-limit-exceeded", str(exc)))
            return
        except _Deferred as deferred:
            self._pending[link] = None
            driver = self._driver
            assert driver is not None  # events come while the driver runs
            driver.start_soon(self._finish_attach, link, deferred.finish)
            return
        self._activate(link, state)

    def _activate(self, link: amqp.Link, state: Any) -> None:
        self.links[link] = state
        link.handler = state
        link.attach()
        state.start()

    def _refuse(self, link: amqp.Link, refusal: _Refused) -> None:
        """Answer with a null terminus and detach with the reason [2.6.3]."""
        self.swiftlet.refusals.warn(self.host, "attach", refusal)
        link.source, link.target = (None, link.remote_target) if link.is_sender else (link.remote_source, None)
        link.attach()
        link.detach(closed=True, error=Error(refusal.condition, str(refusal)))

    async def _finish_attach(self, link: amqp.Link, finish: Any) -> None:
        """Answer an attach that had to wait — and the peer's detach, if it came meanwhile
        (a client may send attach and detach in one go): a closing detach of a durable
        subscriber deletes the subscription that the attach created or resumed."""
        try:
            state = await finish()
        except _Refused as refusal:
            self._pending.pop(link, None)
            if not self.closed:
                self._refuse(link, refusal)
        else:
            detached = self._pending.pop(link, None)  # None: not detached; else closed or not
            if self.closed:
                state.close()
            elif detached is None:
                self._activate(link, state)
            else:
                state.close()
                link.attach()
                if detached and isinstance(state, OutgoingLink) and state.durable:
                    driver = self._driver
                    assert driver is not None  # this task runs in the driver's nursery
                    driver.start_soon(self._unsubscribe, link, *state.durable)  # detaches once it is gone
                else:
                    link.detach(closed=detached)
        self.wake()

    def _check(self, address: str | None, action: str, *, topic: bool = False) -> str:
        """The queue or topic an address names, once checked (a topic in the topic manager's
        syntax: with the listener's ``topic-wildcards``, ``*`` and ``#`` levels translated).

        Raises: _Refused, with the condition for the client.
        """
        if not address:
            raise _Refused("amqp:invalid-field", "an address is required")
        try:
            if topic:
                if self.topic_manager is None:
                    raise _Refused("amqp:not-found", "topics are not available: sys$topicmanager is not running")
                if self.config.topic_wildcards:
                    address = from_wildcards(address)
                parse_topic(address)
                if self.principal is not None:
                    self.principal.check_topic(address, action)
            else:
                self._check_queue(address, action)
        except _Refused:
            raise
        except QueueNotFound as exc:
            raise _Refused("amqp:not-found", str(exc)) from None
        except TooManyQueues as exc:
            raise _Refused("amqp:resource-limit-exceeded", str(exc)) from None
        except (QueueError, TopicNameError) as exc:
            raise _Refused("amqp:invalid-field", str(exc)) from None
        except AccessDenied as exc:
            raise _Refused("amqp:unauthorized-access", str(exc)) from None
        return address

    def _queue(self, address: str) -> Any:
        """The queue for ``address``; one to be auto-created counts towards the connection's
        ``max-auto-created-queues-per-connection``.

        Raises:
            _Refused: that limit is reached (amqp:resource-limit-exceeded).
            QueueError: as ``QueueManager.queue``.
        """
        manager = self.queue_manager
        queue = manager.queues.get(manager.resolve(address))
        if queue is not None:  # (as cheap as manager.queue: an anonymous relay's sends come here)
            return queue
        self._may_create(address)
        queue = manager.queue(address, creator=self.creator)
        self.auto_created += 1
        return queue

    def _may_create(self, name: str) -> None:
        """Raises _Refused (amqp:resource-limit-exceeded) once this connection has created
        ``max-auto-created-queues-per-connection`` queues (its live temporary ones included)."""
        limit = self.config.max_auto_created_queues_per_connection
        if 0 <= limit <= self.auto_created + self.temporary:
            raise _Refused(
                "amqp:resource-limit-exceeded",
                f"queue {name!r} not created: this connection "
                f"created max-auto-created-queues-per-connection {limit} queues already",
            )

    def _create_temporary_queue(self) -> Any:
        """A temporary queue of this connection, counted until :meth:`_delete_temporary`.

        Raises:
            _Refused: ``max-auto-created-queues-per-connection`` is reached.
            TooManyQueues: ``max-queues`` is reached.
        """
        self._may_create("tmp$<n>")
        queue = self.queue_manager.create_temporary_queue(self, self._temporary_creator())
        self.temporary += 1
        return queue

    def _temporary_creator(self) -> Creator:
        """Whom a temporary queue of this connection counts for: the router's reserve for a
        user of one of sys$mgmt's groups (its management client needs a reply queue when
        the clients have used their room), else this connection's user and address."""
        group = getattr(self.principal, "group", "") if self.authenticated else ""
        if group and self.swiftlet.manages(group):
            return attrs.evolve(self.creator, reserved=True)
        return self.creator

    def _temporary_address(self, name: str) -> str:
        """The address a client is given for its temporary queue ``name``: ``tmp$…@<router>``,
        so that as a reply-to it reaches this router from any other (the queue manager takes
        ``name@<this router>`` as ``name``)."""
        return f"{name}@{self.swiftlet.router_name}"

    def _check_queue(self, address: str, action: str, *, create: bool = True) -> None:
        """Whether this connection may ``action`` (send, receive, browse) queue ``address``;
        if so, the queue exists afterwards (created on first use where that is allowed, and
        ``create``: a management reply-to is checked without, as it must exist already).

        Everything is decided before the queue is looked up or created, so a refusal leaves
        nothing behind. Names containing ``$`` are the router's, with these rules whether
        authentication is on or off:

        - a temporary queue (``tmp$…``): anyone may send to it while it exists (it is a
          reply-to address); only the connection that created it may receive from or
          browse it;
        - ``sys$mgmt`` (here or ``@router``): anyone may send to it (each request is stamped
          with the sender's identity, and ``sys$mgmt`` decides whom it answers); nobody
          receives from it;
        - a durable subscription's queue: never as a queue; attach to its topic as a durable
          subscriber, with the client id that created it;
        - any other ``$`` name: only with a grant that names it explicitly
          (:meth:`Principal.check_queue`; without ``sys$authentication`` there are no grants,
          so never), and only if it exists: a client never creates a ``$`` queue.

        Receiving from or browsing a queue on another router (``q@other``) is refused.

        Raises:
            _Refused, AccessDenied, QueueNotFound, QueueError (mapped by :meth:`_check`).
        """
        name, at, router = address.rpartition("@")
        if not at:
            name = address
        remote = bool(at) and router != self.swiftlet.router_name
        if remote and action != "send":
            raise _Refused(
                "amqp:not-found",
                f"cannot {action} queue {address!r}: it is on router {router}, "
                f"and only queues of this router ({self.swiftlet.router_name}) can be read here",
            )
        if "$" not in name:
            if self.principal is not None:
                self.principal.check_queue(address, action)
            if create:
                self._queue(address)  # created on first use if auto-create-queues is on (counted)
            else:
                self.queue_manager.resolve(address) if remote else self.queue_manager.queue(address, create=False)
            return
        if name == MANAGEMENT_QUEUE and not create:  # a reply sent there would be served as a request
            raise AccessDenied(f"{address!r} is a management queue, not a reply-to")
        if name == MANAGEMENT_QUEUE and action == "send":  # sys$mgmt decides whom it answers
            self.queue_manager.resolve(address) if remote else self.queue_manager.queue(address, create=False)
            return
        if name.startswith(TEMPORARY_PREFIX):
            if remote:  # a reply-to on another router: routing takes it there, if it knows the router
                self.queue_manager.resolve(address)
                return
            queue = self.queue_manager.queues.get(name)
            if queue is None:
                raise QueueNotFound(f"temporary queue {name!r} does not exist on router {self.swiftlet.router_name}")
            if action != "send" and queue.owner is not self:
                raise AccessDenied(
                    f"cannot {action} temporary queue {name!r}: only the connection that created it may receive from it"
                )
            return
        if not remote and self.topic_manager is not None and self.topic_manager.is_durable_queue(name):
            raise AccessDenied(
                f"cannot {action} queue {name!r} as a queue: it is a durable subscription's; attach "
                "to its topic as a durable subscriber, with the client id that created it"
            )
        if self.principal is None:
            raise AccessDenied(
                f"cannot {action} queue {address!r}: a name with '$' is the router's, and without "
                "sys$authentication no grant can name it"
            )
        self.principal.check_queue(address, action)
        self.queue_manager.queue(address, create=False)  # a client never creates a '$' queue

    def _attach_incoming(self, link: amqp.Link) -> IncomingLink | CoordinatorLink:
        # Announced in our attach [2.7.3]: the engine detaches the link with
        # amqp:link:message-size-exceeded as soon as a message's frames pass it, so a client
        # learns early and the router never collects the whole of an oversized message.
        link.max_message_size = self.queue_manager.max_message_size
        link.source = link.remote_source
        link.target = target = (link.remote_target or amqp.Terminus(kind=amqp.TARGET)).copy()
        if target.kind == COORDINATOR:
            return CoordinatorLink(self, link)
        if target.dynamic:  # a temporary queue or topic, gone with this link (Qpid JMS style)
            return self._temporary_destination(link, target)
        if target.address is None:
            return IncomingLink(self, link, None, False)  # anonymous relay
        name, topic = _destination(target)
        address = self._check(name, "publish" if topic else "send", topic=topic)
        return IncomingLink(self, link, address, topic)

    def _delete_temporary(self, name: str) -> None:
        """A temporary queue goes with its link (unless the connection's end took it already)."""
        self.temporary -= 1
        if name in self.queue_manager.queues:
            self.queue_manager.delete_queue(name)

    def _temporary_destination(self, link: amqp.Link, target: amqp.Terminus) -> IncomingLink:
        """The temporary destination of a dynamic ``target`` (``link``'s target)."""
        if "temporary-topic" in target.capabilities:
            if self.topic_manager is None:
                raise _Refused("amqp:not-found", "topics are not available: sys$topicmanager is not running")
            name = self.swiftlet.temporary_topic_name()
            target.address = name
            return IncomingLink(self, link, name, True)
        queue = self._create_temporary_queue()
        target.address = self._temporary_address(queue.name)
        return IncomingLink(self, link, queue.name, False, on_close=lambda: self._delete_temporary(queue.name))

    def _attach_outgoing(self, link: amqp.Link) -> OutgoingLink | BrowsingLink:
        link.target = link.remote_target
        link.source = source = (link.remote_source or amqp.Terminus(kind=amqp.SOURCE)).copy()
        text, no_local = _filters(source)
        try:
            selector = compile_selector(text) if text else None
        except SelectorError as exc:
            raise _Refused("amqp:invalid-field", f"invalid selector: {exc}") from None
        if source.dynamic:  # a temporary queue, gone with the link
            queue = self._create_temporary_queue()
            link.source.address = self._temporary_address(queue.name)
            return OutgoingLink(
                self, link, queue.consumer(selector, owner=self), lambda: self._delete_temporary(queue.name)
            )
        if source.address is None:  # Qpid JMS looks a durable subscription up by link name
            return self._existing_durable(link)
        name, topic = _destination(source)
        if topic and source.durable:
            name = self._check(name, "durable", topic=True)
            raise _Deferred(lambda: self._attach_durable(link, name, text, no_local))
        if not topic and source.distribution_mode == "copy":
            address = self._check(name, "browse")
            return BrowsingLink(
                self, link, list(self.queue_manager.queue(address).browse(selector)), self.queue_manager
            )
        if topic:
            name = self._check(name, "subscribe", topic=True)
            subscription = self.topic_manager.subscribe(
                name, selector=text, no_local=no_local, client_id=self.client_id, owner=self, creator=self.creator
            )
            return OutgoingLink(self, link, subscription.consumer(), subscription.close)
        address = self._check(name, "receive")
        try:
            consumer = self.queue_manager.queue(address).consumer(selector, owner=self)
        except ConsumerRefused as exc:
            raise _Refused("amqp:resource-locked", str(exc)) from None
        return OutgoingLink(self, link, consumer)

    async def _attach_durable(self, link: amqp.Link, topic: str, selector: str | None, no_local: bool) -> Any:
        """A durable subscription named by the client id (container id) and the link name:
        created, resumed, or replaced when its topic or selector changed. One link at a time
        uses it: while another has it (the client id's other connection, say), the attach is
        refused with amqp:resource-locked."""
        if not self.client_id:
            raise _Refused("amqp:invalid-field", "a durable subscription needs a client id (container id)")
        self._check_not_in_use(link.name)  # (before: a changed one would be dropped otherwise)
        new = durable_queue_name(self.client_id, link.name) not in self.queue_manager.queues
        if new:  # its queue counts towards max-auto-created-queues-per-connection (and max-queues)
            self._may_create(durable_queue_name(self.client_id, link.name))
        try:
            subscription = await self.topic_manager.durable_subscribe(
                self.client_id, link.name, topic, selector=selector, no_local=no_local, creator=self.creator
            )
        except TopicError as exc:
            raise _Refused("amqp:invalid-field", str(exc)) from None
        except TooManyQueues as exc:
            raise _Refused("amqp:resource-limit-exceeded", str(exc)) from None
        if new:
            self.auto_created += 1
        self._check_not_in_use(link.name)  # (and after: another attach may have taken it meanwhile)
        return OutgoingLink(self, link, subscription.consumer(), durable=(self.client_id, link.name))

    def _check_not_in_use(self, name: str) -> None:
        """Raises _Refused (amqp:resource-locked) while a link consumes the client id's
        durable subscription ``name``."""
        subscription = self.topic_manager.durable_subscriptions().get(durable_queue_name(self.client_id or "", name))
        if subscription is not None and subscription.queue.consumers:
            raise _Refused(
                "amqp:resource-locked",
                f"durable subscription {name!r} of client {self.client_id!r} is in use by another link",
            )

    def _existing_durable(self, link: amqp.Link) -> OutgoingLink:
        subscription = (
            self.topic_manager.durable_subscriptions().get(durable_queue_name(self.client_id or "", link.name))
            if self.topic_manager
            else None
        )
        if subscription is None:
            raise _Refused("amqp:not-found", f"no durable subscription {link.name!r} for client {self.client_id!r}")
        self._check_not_in_use(link.name)

        self._check(subscription.topic.text, "durable", topic=True)  # the grant, as for the attach that made it
        link.source = amqp.Terminus(
            kind=amqp.SOURCE, address=f"{TOPIC_PREFIX}{subscription.topic.text}", durable=2, expiry_policy="never"
        )  # the request's source was null
        return OutgoingLink(self, link, subscription.consumer(), durable=(self.client_id or "", link.name))

    def route(self, message: Message) -> tuple[str, bool]:
        """Where an anonymous-relay message goes: its ``to``, as a topic or a queue."""
        to = message.properties.to
        if not to or not isinstance(to, str):
            raise _Refused("amqp:invalid-field", "a message on an anonymous relay link needs a 'to' address")
        if to.startswith(TOPIC_PREFIX):
            return self._check(to[len(TOPIC_PREFIX) :], "publish", topic=True), True
        if message.message_annotations.get(JMS_DEST) in JMS_TOPIC_TYPES:
            return self._check(to, "publish", topic=True), True
        return self._check(to[len(QUEUE_PREFIX) :] if to.startswith(QUEUE_PREFIX) else to, "send"), False

    def with_identity(self, message: Message) -> Message:
        """A management request with the sender's identity stamped, replacing whatever the client
        put there (:mod:`swiftlets.mgmt.api`: the router serving it trusts this stamp).

        The stamp names the request's reply-to only if this client may send there itself and
        it exists (:meth:`_check_queue` without creating): the serving router replies to
        nothing else, so a reply can neither put messages where its requester could not nor
        create a queue.
        """
        principal = self.principal
        reply_to = message.properties.reply_to
        if isinstance(reply_to, str) and reply_to:
            try:
                self._check_queue(reply_to, "send", create=False)
            except (_Refused, QueueError, AccessDenied):
                reply_to = ""
        identity = Identity(
            user=getattr(principal, "user", "") or "",
            group=getattr(principal, "group", "") or "",
            authenticated=self.authenticated,
            host=self.host,
            router=self.swiftlet.router_name,
            reply_to=reply_to if isinstance(reply_to, str) else "",
        )
        return message.with_annotations({IDENTITY_ANNOTATION: identity.annotation()})

    def with_client_id(self, message: Message) -> Message:
        """The message with the producer's client id annotated (as SwiftMQ's JMS_SWIFTMQ_CID)."""
        return message if self._client_id_patch is None else self._client_id_patch.apply(message)

    def declare(self) -> bytes:
        txn_id = f"txn-{next(self._transaction_ids)}".encode()
        self.transactions[txn_id] = self.queue_manager.transaction()
        return txn_id

    def transaction(self, txn_id: bytes | None) -> Any:
        """The open transaction ``txn_id`` names; a missing id (a transfer's state without
        one) is refused as an unknown one."""
        transaction = None if txn_id is None else self.transactions.get(txn_id)
        if transaction is None:
            raise _Refused("amqp:transaction:unknown-id", f"unknown transaction {txn_id!r}")
        return transaction

    def discharge(self, link: amqp.Link, delivery_id: int, txn_id: bytes, fail: bool) -> None:
        transaction = self.transaction(txn_id)
        del self.transactions[txn_id]
        driver = self._driver
        assert driver is not None  # a discharge arrives while the driver runs
        driver.start_soon(self._finish, link, delivery_id, transaction, fail)

    async def _finish(self, link: amqp.Link, delivery_id: int, transaction: Any, fail: bool) -> None:
        """Commit or roll back (the store is awaited), then answer the discharge."""
        try:
            await (transaction.rollback() if fail else transaction.commit())
        except (QueueError, StoreError) as exc:
            log.warning("transaction commit failed: %s", exc)
            if not self.closed:
                link.settle(delivery_id, _rejected("amqp:transaction:rollback", str(exc)))
        else:
            if not self.closed:
                link.settle(delivery_id, ACCEPTED)
        self.wake()

    def publish(self, topic: str, message: Message, on_durable: Any) -> Any:
        return self.topic_manager.publish(topic, message, client_id=self.client_id, on_durable=on_durable)

    def held_by_memory(self) -> bool:
        """The router's memory alarm is on and this connection's producers wait for it: all
        but those of a user in one of sys$mgmt's groups (management, as for the queues kept
        in reserve for it: an operator must be able to act on a router that is full)."""
        return self.memory.on and not self._temporary_creator().reserved

    def throttle(self, state: IncomingLink) -> None:
        driver = self._driver
        assert driver is not None  # a transfer, which this answers, arrives while the driver runs
        driver.start_soon(self._resume_after_delay, state)

    async def _resume_after_delay(self, state: IncomingLink) -> None:
        """SwiftMQ's producer flow control over AMQP: a producer whose sends got a
        flow-control delay gets no new credit until the delay has passed — or, when it sent
        to a queue, until a consumer brought that queue back to its
        ``flowcontrol-start-queuesize``, so a backlog that drains fast does not leave its
        consumers idle for the rest of the delay. Then, as RabbitMQ does, none while the
        router's memory alarm is on (its link stays attached; consumers drain meanwhile)."""
        if state.delay_ms:
            self.flow_control_waits += 1
            cleared = trio.Event()
            cancel = None
            if state.delayed_queue is not None:
                cancel = self.queue_manager.when_backlog_cleared(state.delayed_queue, cleared.set)
            if cancel is not None or state.delayed_queue is None:  # else the queue is not slowing sends now
                try:
                    with trio.move_on_after(state.delay_ms / 1000):
                        await cleared.wait()
                finally:  # (also when the connection ends meanwhile)
                    if cancel is not None:
                        cancel()
        if self.held_by_memory():
            self.memory_waits += 1
        while not self.closed and self.held_by_memory():
            clear = trio.Event()
            cancel = self.memory.when_clear(clear.set)
            try:
                await clear.wait()
            finally:
                if cancel is not None:
                    cancel()
        if not self.closed and self.links.get(state.link) is state:
            state.resume()
            self.wake()

    def _on_link_detach(self, event: amqp.LinkDetached) -> None:
        """The client detached the link, or its session ended, or the engine detached it
        because the client broke the protocol on it (``by_peer`` false). Its consumer,
        temporary queue or subscription goes with it. The client's detach keeps a durable
        subscription and its close (``closed=true``) deletes it; the engine's never does."""
        link, closed = event.link, event.closed
        if event.error is not None:
            log.info("link %r of %s detached: %s", link.name, self.host, event.error)
        state = self.links.pop(link, None)
        if state is not None:
            state.close()
            if (
                closed
                and event.by_peer
                and isinstance(state, OutgoingLink)
                and state.durable
                and self._driver is not None
            ):
                self._driver.start_soon(self._unsubscribe, link, *state.durable)
                return  # answered once the subscription is gone
        elif link in self._pending:  # answered with the attach, which waits (_finish_attach)
            self._pending[link] = closed and event.by_peer  # (the engine's detach deletes nothing)
            return
        if not link.attached:  # detached while its attach was pending: answer both
            link.attach()
        link.detach(closed=closed)  # (nothing where no answer is due: the engine's own detach)

    def _on_session_end(self, event: amqp.SessionEnded) -> None:
        """The client ended a session, or the engine did because the client broke the
        protocol on it. Its links' LinkDetached came first; any link of ours still on it
        is released here all the same, so no consumer outlives its session."""
        if not event.by_peer:
            log.info("session of %s ended: %s", self.host, event.error)
        for link in [link for link in self.links if link.session is event.session]:
            self.links.pop(link).close()

    def detach(self, state: OutgoingLink, condition: str, description: str) -> None:
        """End a link from our side, with an error condition."""
        self.links.pop(state.link, None)
        state.close()
        state.link.detach(closed=True, error=Error(condition, description))
        log.info("link %s of %s closed: %s", state.link.name, self.host, description)

    async def _unsubscribe(self, link: amqp.Link, client_id: str, name: str) -> None:
        """Delete a durable subscription, then answer the client's closing detach."""
        error = None
        try:
            await self.topic_manager.unsubscribe(client_id, name)
        except TopicError as exc:
            log.info("durable subscription %s/%s not deleted: %s", client_id, name, exc)
            error = Error("amqp:resource-locked", str(exc))
        if not self.closed:
            link.detach(closed=True, error=error)
            self.wake()

    def _on_flow(self, event: amqp.LinkFlow) -> None:
        state = self.links.get(event.link)
        if isinstance(state, (OutgoingLink, BrowsingLink)):
            state.sync_credit()

    def _release(self) -> None:
        self.closed = True
        if self._buffered:
            self.memory.add_buffered(-self._buffered)
            self._buffered = 0
        connections = self.swiftlet.client_ids.get(self.client_id) if self.client_id else None
        if connections is not None and self in connections:
            connections.remove(self)
            if not connections:
                del self.swiftlet.client_ids[self.client_id]
        for transaction in self.transactions.values():  # a lost connection rolls back
            transaction.rollback_nowait()
        self.transactions.clear()
        for state in self.links.values():
            state.close()
        self.links.clear()
        self.queue_manager.delete_temporary_queues(self)
        if self.topic_manager is not None:
            self.topic_manager.close_subscriptions(self)
