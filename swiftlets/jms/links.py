"""The links of a client connection, by what the client attaches (the per-message work).

Theory of operation
-------------------
- :class:`IncomingLink` — the client *sends*: each complete transfer gets the
  producer's client id and goes to the queue or topic of the target (or of the message's
  ``to`` on an anonymous-relay link, or into a transaction); it is settled as accepted
  when durable (at once for a non-persistent one); credit is topped up to
  ``incoming-credit``. A dynamic target makes a temporary queue or topic that lives as
  long as the link (:mod:`.temporary`). Its attach announces the queue manager's
  max-message-size; the engine detaches it (amqp:link:message-size-exceeded) as soon as
  a message's frames pass that. A message that cannot be read is rejected
  (``amqp:decode-error``) and the link goes on: nothing about one message ends a
  connection.
- :class:`OutgoingLink` — the client *receives*: a queue consumer (a queue, a dynamic
  temporary queue, a topic subscription's queue, a durable subscription's queue) whose
  credit follows the link's; the client's outcome settles the queue entry (all of
  modified's fields [3.4.5]); closing the link or losing the connection releases what is
  unsettled. A message goes out as it came in, unless it was acquired before: then its
  header says so [3.2.1] (first-acquirer false, delivery-count counted on from the
  producer's).
- :class:`BrowsingLink` (distribution-mode copy); the transaction coordinator's link is
  :class:`.transactions.CoordinatorLink`.

Each calls its connection's attributes directly (no go-between per message): the
counters, ``wake``, ``route``, ``publish``, the queue manager.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from martinet.messaging import amqp
from martinet.messaging.amqp import (
    ACCEPTED,
    MODIFIED,
    REJECTED,
    RELEASED_CODE,
    TRANSACTIONAL_STATE,
    Error,
)
from martinet.messaging.codec import DecodeError, Described
from martinet.messaging.message import Message, MessageError, redelivered
from martinet.swiftlets.mgmt.api import is_management_address
from martinet.swiftlets.queuemanager.api import (
    Consumer,
    Entry,
    MalformedMessage,
    MemoryFull,
    MessageTooLarge,
    QueueError,
    QueueFull,
    QueueManager,
    QueueNotFound,
    SendResult,
)
from martinet.swiftlets.store.api import StoreError
from martinet.swiftlets.topicmanager.api import PublishResult, TopicError

from .access import Refused

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["BrowsingLink", "IncomingLink", "OutgoingLink"]

log = logging.getLogger(__name__)


def transaction_id(state: Any) -> bytes | None:
    """The txn-id of a transfer's or disposition's transactional state [4.5.5], else None."""
    if amqp.state_code(state) != TRANSACTIONAL_STATE or not isinstance(state.value, list) or not state.value:
        return None
    return state.value[0] if isinstance(state.value[0], bytes) else None


def rejected(condition: str, description: str) -> Described:
    return amqp.outcome(REJECTED, Error(condition, description).described())


class IncomingLink:
    """A link the client sends on: transfers go into a queue, to a topic, or — on an
    anonymous-relay link (no target) — wherever each message's ``to`` says."""

    def __init__(
        self,
        connection: AmqpConnection,
        link: amqp.Link,
        address: str | None,
        topic: bool,
        on_close: Callable[[], None] | None = None,
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
                link.settle(delivery_id, rejected("amqp:internal-error", str(error)) if error else ACCEPTED)
                connection.wake()

        try:
            message = Message(data)
            # the producer's client id (as SwiftMQ's JMS_SWIFTMQ_CID): a queue send merges it
            # in, in the same copy of the message as a routing rewrite's annotations; the
            # other ways take it at once
            client_id = connection.client_id_patch
            address, topic = self.address, self.topic
            if address is None:  # anonymous relay: route by the message's own address
                address, topic = connection.route(message)
            transactional = state is not None and amqp.state_code(state) == TRANSACTIONAL_STATE
            management = not topic and is_management_address(address)
            if client_id is not None and (topic or transactional or management):
                message, client_id = client_id.apply(message), None
            if management:
                message = connection.with_identity(message)
            if connection.held_by_memory() and connection.memory.refuse_non_persistent and not message.durable:
                connection.memory.refused += 1
                raise MemoryFull(
                    f"router {connection.memory.router} is above its memory budget and refuses "
                    "non-persistent messages (memory-alarm-non-persistent=refuse)"
                )
            if transactional:
                self._stage(delivery_id, address, topic, message, state, remotely_settled)
            else:
                result: SendResult | PublishResult
                if topic:
                    result = connection.publish(address, message, None if remotely_settled else durable)
                else:
                    result = connection.queue_manager.send_nowait(
                        address, message, on_durable=None if remotely_settled else durable, annotations=client_id
                    )
                if result.delay_ms > self.delay_ms:
                    self.delay_ms, self.delayed_queue = result.delay_ms, None if topic else address
        except (QueueError, TopicError, MessageError, DecodeError, Refused, StoreError) as exc:
            # (StoreError: the store failed, and the router is stopping: refused, not a traceback)
            connection.swiftlet.refusals.warn(
                connection.host, f"transfer to {self.address or '(anonymous relay)'}", exc
            )
            if not remotely_settled:
                link.settle(delivery_id, rejected(condition_of(exc), str(exc)))
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
            raise Refused("amqp:not-implemented", "transactional publishing to topics is not supported")
        txn_id = transaction_id(state)
        self.connection.transaction(txn_id).send(address, message)
        if not remotely_settled:
            self.link.settle(delivery_id, amqp.outcome(TRANSACTIONAL_STATE, txn_id, ACCEPTED))
            self.connection.wake()

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()


def condition_of(exc: Exception) -> str:
    """The AMQP error condition that refuses a transfer for ``exc``."""
    if isinstance(exc, (Refused, MalformedMessage, MessageError)):
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


def _outgoing(entry: Entry) -> Message:
    """The message of a queue entry as a delivery carries it: as it came in, or — acquired
    before — with first-acquirer false and the failed deliveries added to the producer's
    delivery-count [3.2.1].

    Raises:
        MessageError: its header cannot be read (the caller dead-letters it).
    """
    return redelivered(entry.message, entry.delivery_count) if entry.acquired else entry.message


class OutgoingLink:
    """A link the client receives on: a queue consumer whose credit follows the link's."""

    def __init__(
        self,
        connection: AmqpConnection,
        link: amqp.Link,
        consumer: Consumer,
        on_close: Callable[[], None] | None = None,
        durable: tuple[str, str] | None = None,
    ):
        self.connection = connection
        self.on_close = on_close  # ends a subscription or deletes a dynamic queue
        self.durable = durable  # (client id, subscription name) of a durable subscription
        self.link = link
        self.consumer = consumer
        self.unsettled: dict[int, Entry] = {}  # delivery id → queue entry
        consumer.notify = connection.wake

    def start(self) -> None:
        self.sync_credit()

    def sync_credit(self) -> None:
        self.consumer.set_credit(self.link.credit - self.consumer.buffered)

    def pump(self) -> None:
        """Send what the consumer received, within the link's credit and the session's window."""
        link, consumer = self.link, self.consumer
        if consumer.closed:  # the queue was deleted under the link
            self.connection.attaches.detach(self, "amqp:resource-deleted", f"queue {consumer.queue.name} was deleted")
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
        elif code == TRANSACTIONAL_STATE and (txn_id := transaction_id(state)) is not None:
            try:  # acknowledged within a transaction: held until discharge
                self.connection.transaction(txn_id).acknowledge(consumer, entry)
            except Refused:
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


class BrowsingLink:
    """A link with distribution-mode copy: settled copies of what the queue holds at attach
    time, in delivery order; nothing is consumed. A drain ends the browse: credit the client
    asks to drain is given back (delivery-count advanced) only once every copy was sent.

    The bytes of entries the queue keeps only in the store (swapped out) are read back for
    the browser, :data:`FETCH` entries at a time, ahead of the copies sent; what is read
    for a browser is the browser's and does not enter the queue's cache."""

    FETCH = 256

    def __init__(
        self, connection: AmqpConnection, link: amqp.Link, entries: Iterator[Entry], queue_manager: QueueManager
    ):
        self.connection = connection
        self.link = link
        self._entries = entries  # (Queue.browse: made as they are reached, so a deep queue costs little)
        self._ahead: deque[Entry] = deque()  # the next ones, at most FETCH
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
            ahead = self._fill()
            if not ahead:
                link.drained()
                return
            entry = ahead[0]
            message = self._fetched.pop(entry.id, None)
            if message is None:
                if entry.id in self._missing:
                    ahead.popleft()
                    continue
                if entry.swapped:
                    self._fetch()
                    return  # the fetch wakes the connection
                message = entry.message
            ahead.popleft()
            try:
                if entry.acquired:
                    message = redelivered(message, entry.delivery_count)
            except MessageError as exc:  # a copy nobody can read: left out of the browse
                log.warning("message %d not browsed: %s", entry.id, exc)
                continue
            link.send(message.raw, True)

    def _fill(self) -> deque[Entry]:
        """The next entries to send, topped up to :data:`FETCH` from the browse."""
        ahead = self._ahead
        if len(ahead) < self.FETCH:
            ahead.extend(itertools.islice(self._entries, self.FETCH - len(ahead)))
        return ahead

    def _fetch(self) -> None:
        if self._fetching:
            return
        self._fetching = True
        batch = list(self._fill())

        def fetched(messages: Mapping[int, Message]) -> None:
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
        self._entries = iter(())
        self._ahead.clear()
        self._fetched.clear()
