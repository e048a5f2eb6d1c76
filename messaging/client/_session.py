"""JMS sessions, producers, consumers, browsers and requestors over AMQP sessions and links
(the mapping is described in :mod:`._connection`)."""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from .. import amqp
from ..amqp import (
    DECLARE,
    DISCHARGE,
    MODIFIED,
    NO_LOCAL_FILTER,
    REJECTED,
    SELECTOR_FILTER,
    TRANSACTIONAL_STATE,
    Terminus,
)
from ..codec import Described, Symbol, ULong, encode
from ..message import AMQP_VALUE, MessageError
from ._errors import (
    AckMode,
    ConnectionLost,
    JMSError,
    TransactionRolledBack,
)
from ._links import Attaching, Outcome, ReceiverLink, SenderLink, receiver_link, sender_link
from ._messages import (
    DeliveryMode,
    Destination,
    Message,
    Queue,
    TemporaryQueue,
    TemporaryTopic,
    Topic,
    decode_message,
    new_message_id,
    now_ms,
)

if TYPE_CHECKING:
    from ._connection import Connection

log = logging.getLogger("martinet.messaging.client")


def _control(descriptor: int, fields: list[Any]) -> bytes:
    """A transaction controller's message [4.3]: ``declare`` or ``discharge`` as its amqp-value."""
    return encode(Described(ULong(AMQP_VALUE), Described(ULong(descriptor), fields)))


class Session:
    """A JMS session: transacted, or acknowledging in one of the :class:`AckMode` modes."""

    def __init__(self, connection: Connection, transacted: bool, ack_mode: AckMode):
        self.connection = connection
        self.transacted = transacted
        self.ack_mode = ack_mode
        self._session = connection.engine.session()
        self._consumers: list[Consumer] = []
        self._unacknowledged: list[tuple[ReceiverLink, int | None]] = []
        self._coordinator: SenderLink | None = None
        self._txn_id: bytes | None = None
        self._txn_failure: JMSError | None = None
        self._declaring: Outcome | None = None
        self._closed = False
        connection.wake()

    async def _attach_coordinator(self) -> None:
        link = sender_link(
            self._session,
            self.connection.name("txn"),
            Terminus(kind=amqp.COORDINATOR, capabilities=["amqp:local-transactions"]),
        )
        self._coordinator = SenderLink(self.connection, link)
        await self.connection.attach(self._coordinator)

    async def _transaction(self) -> bytes:
        """The current transaction's id, declared when first needed."""
        while self._txn_id is None:
            if self._declaring is None:
                assert self._coordinator is not None
                self._declaring = Outcome()
                declaring = self._declaring
                try:
                    outcome = await self._coordinator.send(_control(DECLARE, []))
                    self._txn_id = bytes((await outcome.wait())[0])
                    declaring.resolve()
                except BaseException as exc:
                    declaring.resolve(error=exc if isinstance(exc, JMSError) else ConnectionLost(str(exc)))
                    raise
                finally:
                    self._declaring = None
            else:
                await self._declaring.wait()
        return self._txn_id

    def _check(self) -> None:
        if self._closed:
            raise JMSError("the session is closed")
        self.connection.check()

    # -- factories ----------------------------------------------------------------------------

    def producer(
        self,
        destination: Destination | None = None,
        *,
        delivery_mode: DeliveryMode | None = None,
        priority: int | None = None,
        ttl: int | None = None,
    ) -> Attaching:
        """A producer for ``destination``, or an anonymous one (destination per send).

        Defaults not given come from the listener's connection-factory settings.
        """

        async def make() -> Producer:
            self._check()
            link = sender_link(self._session, self.connection.name("sender"), _terminus(amqp.TARGET, destination))
            producer = Producer(self, SenderLink(self.connection, link), destination, delivery_mode, priority, ttl)
            await self.connection.attach(producer._link)
            return producer

        return Attaching(make)

    def consumer(self, destination: Destination, *, selector: str | None = None, no_local: bool = False) -> Attaching:
        """A consumer of a queue or a (non-durable) topic subscriber.

        Raises (when awaited): InvalidDestination, InvalidSelector, SecurityError, JMSError.
        """
        return Attaching(
            lambda: self._consumer(self.connection.name("receiver"), destination, selector, no_local, durable=False)
        )

    def durable_subscriber(
        self, topic: Topic, name: str, *, selector: str | None = None, no_local: bool = False
    ) -> Attaching:
        """A durable subscriber: the subscription ``name`` of this client id keeps messages
        while no subscriber is connected. Closing it keeps the subscription; see
        :meth:`unsubscribe`. Same parameters resume it; others replace it."""
        return Attaching(lambda: self._consumer(name, topic, selector, no_local, durable=True))

    async def _consumer(
        self, name: str, destination: Destination, selector: str | None, no_local: bool, *, durable: bool
    ) -> Consumer:
        self._check()
        source = _terminus(amqp.SOURCE, destination, selector, no_local)
        if durable:
            source.durable, source.expiry_policy = 2, "never"  # unsettled-state, kept while detached
        link = receiver_link(self._session, name, source)
        state = ReceiverLink(self.connection, link, self.connection.consumer_cache_size)
        await self.connection.attach(state)
        state.top_up()
        consumer = Consumer(self, state, destination, durable=durable)
        self._consumers.append(consumer)
        return consumer

    async def unsubscribe(self, name: str) -> None:
        """Delete the durable subscription ``name`` of this client id.

        Raises:
            InvalidDestination: there is no such subscription.
            JMSError: it has an active subscriber.
        """
        self._check()
        if any(c.durable and c._link.link.name == name for c in self._consumers):
            raise JMSError(f"durable subscription {name!r} has an active subscriber in this session")
        link = receiver_link(self._session, name, None)  # a null source: look the subscription up
        state = ReceiverLink(self.connection, link, 0)
        await self.connection.attach(state)
        await state.close()
        if state.error is not None and state.remote_error is not None:
            raise state.error

    def browser(self, queue: Queue, *, selector: str | None = None) -> Attaching:
        """A browser: iterate copies of what the queue holds, without consuming."""

        async def make() -> Browser:
            self._check()
            source = _terminus(amqp.SOURCE, queue, selector)
            source.distribution_mode = "copy"
            link = receiver_link(self._session, self.connection.name("browser"), source)
            state = ReceiverLink(self.connection, link, self.connection.consumer_cache_size)
            await self.connection.attach(state)
            return Browser(state)

        return Attaching(make)

    async def create_temporary_queue(self) -> TemporaryQueue:
        """A queue that lives until the connection closes (or :meth:`delete_temporary`)."""
        self._check()
        return await self.connection.create_temporary(self._session, topic=False)  # type: ignore[return-value]

    async def create_temporary_topic(self) -> TemporaryTopic:
        self._check()
        return await self.connection.create_temporary(self._session, topic=True)  # type: ignore[return-value]

    async def delete_temporary(self, destination: Destination) -> None:
        await self.connection.delete_temporary(destination)

    def requestor(self, destination: Destination) -> Attaching:
        """A :class:`Requestor`: send requests to ``destination`` and await their replies."""

        async def make() -> Requestor:
            reply_to = await self.create_temporary_queue()
            producer = await self.producer(destination)
            consumer = await self.consumer(reply_to)
            return Requestor(self, producer, consumer, reply_to)

        return Attaching(make)

    # -- acknowledgement and transactions -----------------------------------------------------

    async def _delivered(self, link: ReceiverLink, delivery_id: int | None, message: Message) -> None:
        """Acknowledge per the session's mode what a consumer just handed to the application."""
        if self.transacted:
            txn_id = await self._transaction()
            link.settle(delivery_id, amqp.outcome(TRANSACTIONAL_STATE, txn_id, amqp.ACCEPTED))
        elif self.ack_mode is AckMode.CLIENT_ACKNOWLEDGE:
            self._unacknowledged.append((link, delivery_id))
            message._acknowledge = self.acknowledge
        else:
            link.settle(delivery_id, amqp.ACCEPTED)

    async def acknowledge(self, count: int | None = None) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message delivered so far in this session, or
        (``count``, a Martinet extension) only the ``count`` oldest not yet acknowledged — for a
        reader that must not acknowledge what it received after the work it has finished."""
        self._check()
        done = self._unacknowledged[:count]
        for link, delivery_id in done:
            link.settle(delivery_id, amqp.ACCEPTED)
        del self._unacknowledged[: len(done)]

    async def recover(self) -> None:
        """Redeliver every unacknowledged message, marked redelivered, from the oldest one."""
        self._check()
        if self.transacted:
            raise JMSError("recover() is for non-transacted sessions; use rollback()")
        failed = amqp.outcome(MODIFIED, True)  # delivery-failed: counted, so redelivered
        for link, delivery_id in self._unacknowledged:
            link.settle(delivery_id, failed)
        self._unacknowledged.clear()
        for consumer in self._consumers:
            consumer._link.release_buffered()

    async def commit(self) -> None:
        """Commit the session's transaction: its sends and acknowledgements take effect.

        Raises:
            TransactionRolledBack: something in it failed; everything was rolled back.
        """
        await self._discharge(fail=False)

    async def rollback(self) -> None:
        """Undo the transaction: sends are dropped, received messages come again."""
        await self._discharge(fail=True)

    async def _discharge(self, *, fail: bool) -> None:
        if self._closed:
            raise JMSError("the session is closed")
        if not self.transacted:
            raise JMSError("commit() and rollback() are for transacted sessions")
        failure, self._txn_failure = self._txn_failure, None
        if self._txn_id is not None and self.connection.lost is not None:
            self._txn_id = None
            raise TransactionRolledBack(f"the connection was lost: {self.connection.lost}")
        if self._txn_id is not None:
            txn_id, self._txn_id = self._txn_id, None
            assert self._coordinator is not None
            try:
                await (await self._coordinator.send(_control(DISCHARGE, [txn_id, fail or failure is not None]))).wait()
            except TransactionRolledBack:
                raise
            except JMSError as exc:  # incl. a connection lost meanwhile: the router rolls back
                raise TransactionRolledBack(f"the discharge failed: {exc}", exc.condition) from None
        if fail or failure is not None:
            for consumer in self._consumers:
                consumer._link.release_buffered()
        if failure is not None and not fail:
            raise TransactionRolledBack(f"a send in the transaction failed: {failure}")

    async def close(self) -> None:
        """Close the session: its consumers and producers; an open transaction rolls back."""
        if self._closed:
            return
        if self.transacted and self._txn_id is not None and self.connection.lost is None:
            with contextlib.suppress(JMSError):
                await self.rollback()
        self._closed = True
        for consumer in list(self._consumers):
            await consumer.close()
        if self.connection.lost is None:
            self._session.end()
            self.connection.wake()


def _terminus(
    kind: int, destination: Destination | None, selector: str | None = None, no_local: bool = False
) -> Terminus:
    """A source or target for ``destination`` (None: an anonymous target, routed by ``to``),
    with its kind as a capability and the JMS filters, as Qpid JMS sends them."""
    if destination is None:
        return Terminus(kind=kind)
    if not isinstance(destination, Destination):
        raise TypeError(f"a destination is a Queue or Topic, not {type(destination).__name__}")
    capability = {0: "queue", 1: "topic", 2: "temporary-queue", 3: "temporary-topic"}[destination.kind]
    filters = {}
    if selector:
        filters[Symbol("jms-selector")] = Described(SELECTOR_FILTER, selector)
    if no_local:
        filters[Symbol("no-local")] = Described(NO_LOCAL_FILTER, [])
    return Terminus(kind=kind, address=destination.name, capabilities=[capability], filter=filters or None)


# -- producers and consumers ---------------------------------------------------------------------


class Producer:
    """Sends messages; persistent sends wait until the router has the message stored."""

    def __init__(
        self,
        session: Session,
        link: SenderLink,
        destination: Destination | None,
        delivery_mode: DeliveryMode | None,
        priority: int | None,
        ttl: int | None,
    ):
        self.session = session
        self._link = link
        self.destination = destination
        defaults = session.connection.defaults
        self.delivery_mode = delivery_mode or DeliveryMode(defaults.get("martinet:default-delivery-mode", "persistent"))
        self.priority = int(defaults.get("martinet:default-priority", 4)) if priority is None else priority
        self.ttl = int(defaults.get("martinet:default-ttl", 0)) if ttl is None else ttl
        self._failure: JMSError | None = None

    async def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: DeliveryMode | None = None,
        priority: int | None = None,
        ttl: int | None = None,
    ) -> None:
        """Send ``message`` (its JMS headers are set on it).

        A persistent message outside a transaction is awaited until the router accepted it;
        a non-persistent one is not, and a refusal of it is raised by the next send or close.

        Raises:
            InvalidDestination, SecurityError, JMSError: the router refused the message.
            ConnectionLost: the connection ended.
        """
        session = self.session
        session._check()
        self._raise_failure()
        if destination is None:
            destination = self.destination
        elif self.destination is not None and destination != self.destination:
            raise JMSError(f"this producer sends to {self.destination}; use an anonymous producer")
        if destination is None:
            raise JMSError("an anonymous producer needs a destination per send")
        mode = delivery_mode or self.delivery_mode
        priority = self.priority if priority is None else priority
        if not 0 <= priority <= 9:
            raise ValueError(f"priority must be 0..9, not {priority}")
        payload = message.encode(
            message_id=new_message_id(),
            destination=destination,
            delivery_mode=mode,
            priority=priority,
            ttl=self.ttl if ttl is None else ttl,
            now_ms=now_ms(),
        )
        txn_id = await session._transaction() if session.transacted else None
        wait = mode is DeliveryMode.PERSISTENT and txn_id is None
        state = amqp.outcome(TRANSACTIONAL_STATE, txn_id) if txn_id is not None else None
        outcome = await self._link.send(payload, state=state, on_outcome=None if wait else self._remember)
        if wait:
            await outcome.wait()

    def _remember(self, outcome: Outcome) -> None:
        if isinstance(outcome.error, JMSError) and not isinstance(outcome.error, ConnectionLost):
            if self.session.transacted:
                self.session._txn_failure = self.session._txn_failure or outcome.error
            else:
                self._failure = self._failure or outcome.error

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    async def close(self) -> None:
        await self._link.close()
        self._raise_failure()


class Consumer:
    """Receives messages: :meth:`receive`, :meth:`receive_nowait` or ``async for``."""

    def __init__(self, session: Session, link: ReceiverLink, destination: Destination, *, durable: bool):
        self.session = session
        self._link = link
        self.destination = destination
        self.durable = durable
        self._closed = False

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; None if ``timeout`` seconds passed without one.

        Raises:
            JMSError: the router closed the consumer (e.g. its queue was deleted).
            ConnectionLost: the connection ended.
        """
        if self._closed:
            raise JMSError("the consumer is closed")
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        while True:
            item = await self._link.next(deadline)
            if item is None:
                return None
            delivery, raw = item
            try:
                message = decode_message(raw)
            except MessageError as exc:
                log.warning("message on %s rejected: %s", self.destination, exc)
                self._link.settle(delivery, amqp.outcome(REJECTED, amqp.Error(exc.condition, str(exc)).described()))
                continue
            await self.session._delivered(self._link, delivery, message)
            return message

    async def receive_nowait(self) -> Message | None:
        """A message already prefetched, or None (never waits for the router)."""
        return await self.receive(0)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        """The next message; the iteration ends when the consumer is closed."""
        while not self._closed:
            try:
                message = await self.receive()
            except JMSError:
                if self._closed:
                    break
                raise
            if message is not None:
                return message
        raise StopAsyncIteration

    async def close(self) -> None:
        """Close; prefetched messages go back to the queue. A durable subscriber's
        subscription stays (its link only detaches)."""
        if self._closed:
            return
        self._closed = True
        if self in self.session._consumers:
            self.session._consumers.remove(self)
        self._link.release_buffered()
        await self._link.close(detach_only=self.durable)


class Browser:
    """Copies of the messages a queue holds, in order, nothing consumed: ``async for``."""

    def __init__(self, link: ReceiverLink):
        self._link = link

    def __aiter__(self) -> Browser:
        return self

    async def __anext__(self) -> Message:
        """The next copy; the iteration ends when the router has sent all (a drain)."""
        link, engine_link = self._link, self._link.link
        if not link.buffer:
            if not (engine_link.drain and engine_link.credit > 0):
                engine_link.flow(link.window, drain=True)
                link.connection.wake()
            while not link.buffer and engine_link.drain and engine_link.credit > 0:
                link.check()
                await link.changed.wait()
            if not link.buffer:
                raise StopAsyncIteration
        _, raw = link.buffer.popleft()
        return decode_message(raw)

    async def close(self) -> None:
        await self._link.close()


class Requestor:
    """Request/reply over a temporary queue (JMS ``QueueRequestor``)."""

    def __init__(self, session: Session, producer: Producer, consumer: Consumer, reply_to: TemporaryQueue):
        self.session = session
        self._producer = producer
        self._consumer = consumer
        self.reply_to = reply_to

    async def request(self, message: Message, *, timeout: float | None = None) -> Message | None:
        """Send ``message`` with reply-to set; the reply whose correlation id is the
        request's message id, or None after ``timeout`` seconds."""
        message.reply_to = self.reply_to
        await self._producer.send(message)
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        while True:
            reply = await self._consumer.receive(
                max(0.0, deadline - trio.current_time()) if timeout is not None else None
            )
            if reply is None or reply.correlation_id == message.message_id:
                return reply
            log.info("reply %s to an earlier request dropped", reply.message_id)

    async def close(self) -> None:
        await self._consumer.close()
        await self._producer.close()
        await self.session.delete_temporary(self.reply_to)
