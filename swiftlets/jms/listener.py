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
  long as the link.
- :class:`OutgoingLink` — the client *receives*: a queue consumer (a queue, a dynamic
  temporary queue, a topic subscription's queue, a durable subscription's queue) whose
  credit follows the link's; the client's outcome settles the queue entry; closing the
  link or losing the connection releases what is unsettled.
- :class:`BrowsingLink` (distribution-mode copy) and :class:`CoordinatorLink`
  (transactions).

Refused attaches answer with a null terminus and a detach carrying ``amqp:not-found``,
``amqp:unauthorized-access``, ``amqp:invalid-field`` or ``amqp:resource-locked``.

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
from collections.abc import Callable
from typing import Any

import trio

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
    TOPIC_PREFIX,
    TRANSACTIONAL_STATE,
    Error,
)
from martinet.messaging.amqp.sasl import Credentials, SaslError, SaslServer
from martinet.messaging.codec import Described, Int, Symbol, ULong
from martinet.messaging.io import Driver, lead_in
from martinet.messaging.message import Message, MessageError, AnnotationPatch
from martinet.messaging.selector import SelectorError, compile_selector
from martinet.swiftlets.authentication.api import AccessDenied, AuthenticationFailed
from martinet.swiftlets.queuemanager.api import (
    TEMPORARY_PREFIX,
    ConsumerRefused,
    QueueError,
    QueueFull,
    QueueNotFound,
)
from martinet.swiftlets.store.api import StoreError
from martinet.swiftlets.topicmanager.api import TopicError, TopicNameError, durable_queue_name, parse_topic

log = logging.getLogger(__name__)

SASL_TIMEOUT = 30.0


SELECTOR_FILTERS = (SELECTOR_FILTER, SELECTOR_FILTER_CODE)
NO_LOCAL_FILTERS = (NO_LOCAL_FILTER, NO_LOCAL_FILTER_CODE)
CLIENT_ID_ANNOTATION = Symbol("x-opt-martinet-cid")  # the producer's client id (SwiftMQ's JMS_SWIFTMQ_CID)
JMS_TOPIC_TYPES = (JMS_TOPIC, JMS_TEMPORARY_TOPIC)


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
        return address[len(TOPIC_PREFIX):], True
    if address.startswith(QUEUE_PREFIX):
        return address[len(QUEUE_PREFIX):], False
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

    def __init__(self, connection: AmqpConnection, link: amqp.Link, address: str | None, topic: bool,
                 on_close: Any = None):
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
            if state is not None and amqp.state_code(state) == TRANSACTIONAL_STATE:
                self._stage(delivery_id, address, topic, message, state, remotely_settled)
            else:
                if topic:
                    result = connection.publish(address, message, None if remotely_settled else durable)
                else:
                    result = connection.queue_manager.send_nowait(address, message,
                                                                  on_durable=None if remotely_settled else durable)
                if result.delay_ms > self.delay_ms:
                    self.delay_ms, self.delayed_queue = result.delay_ms, None if topic else address
        except (QueueError, TopicError, MessageError, _Refused) as exc:
            log.info("transfer to %s refused: %s", self.address or "(anonymous relay)", exc)
            if not remotely_settled:
                name = (exc.condition if isinstance(exc, _Refused) else
                        "amqp:resource-limit-exceeded" if isinstance(exc, QueueFull) else "amqp:invalid-field")
                link.settle(delivery_id, _rejected(name, str(exc)))
        self.unreplenished += 1
        if self.unreplenished >= self.window // 2 and not self.throttled:  # half the window used
            if self.delay_ms:
                self.throttled = True
                connection.throttle(self)
            else:
                self.unreplenished = 0
                link.flow(self.window)

    def resume(self) -> None:
        """The flow-control wait is over: top the credit up."""
        self.delay_ms, self.delayed_queue, self.throttled, self.unreplenished = 0, None, False, 0
        self.link.flow(self.window)

    def _stage(self, delivery_id: int, address: str, topic: bool, message: Message, state: Any,
               remotely_settled: bool) -> None:
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


class OutgoingLink:
    """A link the client receives on: a queue consumer whose credit follows the link's."""

    def __init__(self, connection: AmqpConnection, link: amqp.Link, consumer: Any, on_close: Any = None,
                 durable: tuple[str, str] | None = None):
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
            for entry in entries:
                message = entry.message if not entry.delivery_count else entry.message.with_delivery_count(
                    entry.delivery_count)
                delivery_id = send(message.raw, presettled)
                if presettled:
                    consumer.accept(entry)
                else:
                    unsettled[delivery_id] = entry
            self.connection.sent += len(entries)
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
        elif code == MODIFIED:
            fields = (state.value if isinstance(state.value, list) else []) + [None, None]
            consumer.modify(entry, delivery_failed=bool(fields[0]), undeliverable_here=bool(fields[1]))
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
            fields = list(getattr(control, "value", None) or [])
            if kind == DECLARE:
                link.settle(delivery_id, amqp.outcome(DECLARED, connection.declare()))
            elif kind == DISCHARGE and fields:
                connection.discharge(link, delivery_id, bytes(fields[0]), bool(fields[1]) if len(fields) > 1 else False)
            else:
                raise _Refused("amqp:invalid-field", f"not a declare or discharge: {control!r}"[:200])
        except (_Refused, MessageError) as exc:
            link.settle(delivery_id, _rejected(getattr(exc, "condition", "amqp:invalid-field"), str(exc)))
        if link.credit < 50:
            link.flow(100)
        connection.wake()

    def close(self) -> None:
        pass


class BrowsingLink:
    """A link with distribution-mode copy: settled copies of what the queue holds at attach
    time, in delivery order; nothing is consumed. A drain ends the browse."""

    def __init__(self, connection: AmqpConnection, link: amqp.Link, entries: Any):
        self.connection = connection
        self.link = link
        self._entries = entries

    def start(self) -> None:
        self.sync_credit()

    def sync_credit(self) -> None:
        self.connection.wake()

    def pump(self) -> None:
        link = self.link
        while link.credit > 0 and not link.session.blocked:
            entry = next(self._entries, None)
            if entry is None:
                link.drained()
                return
            link.send(entry.message.raw, True)

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        pass  # browsed copies go out settled

    def close(self) -> None:
        self._entries = iter(())


class _Login:
    """The lead-in stage of a client connection: SASL, with the authentication swiftlet's
    decision on the credentials (:class:`messaging.io.Stage`)."""

    def __init__(self, sasl: SaslServer, login: Callable[[Credentials], Any]):
        self._sasl = sasl
        self._login = login
        self.principal: Any = None

    def receive_data(self, data: bytes) -> bool:
        """Raises: SaslError (a broken exchange), AuthenticationFailed (refused)."""
        credentials = self._sasl.receive_data(data)
        if credentials is None:
            return False
        try:
            self.principal = self._login(credentials)
        except AuthenticationFailed:
            self._sasl.refuse()
            raise
        self._sasl.accept()
        return True

    @property
    def data_to_send(self) -> bytes:
        return self._sasl.data_to_send

    @property
    def remaining(self) -> bytes:
        return self._sasl.remaining


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
        self._client_id_patch: AnnotationPatch | None = None  # the client id annotation, once the client opened
        self.principal: Any = None
        self.transactions: dict[bytes, Any] = {}
        self._transaction_ids = itertools.count(1)
        self._driver: Driver | None = None
        self.engine: amqp.Connection | None = None
        self.links: dict[amqp.Link, IncomingLink | OutgoingLink | BrowsingLink | CoordinatorLink] = {}
        self.closed = False
        self.received = self.sent = 0  # messages from and to the client
        self.flow_control_waits = 0  # producer credit withheld for a flow-control delay
        self.receive_rate = self.send_rate = 0.0
        self._rate_mark = (time.monotonic(), 0, 0)
        self.since = time.time()
        self._handlers = {
            amqp.ConnectionOpened: self._on_connection_open,
            amqp.ConnectionClosed: self._on_connection_closed,
            amqp.LinkAttached: self._on_link_open,
            amqp.LinkDetached: self._on_link_detach,
            amqp.LinkFlow: self._on_flow,
        }

    def wake(self) -> None:
        """Have the writer move deliveries onto links and write what the engine has."""
        if self._driver is not None:
            self._driver.wake()

    def sample_rates(self) -> None:
        at, received, sent = self._rate_mark
        now = time.monotonic()
        if now > at:
            self.receive_rate = (self.received - received) / (now - at)
            self.send_rate = (self.sent - sent) / (now - at)
        self._rate_mark = (now, self.received, self.sent)

    def usage(self, listener: str) -> dict[str, Any]:
        return {"listener": listener, "host": self.host, "client-id": self.client_id or "",
                "user": getattr(self.principal, "user", "") or "",
                "connected-since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since)),
                "links": len(self.links), "transactions": len(self.transactions),
                "flow-control-waits": self.flow_control_waits,
                "messages-received": self.received, "messages-sent": self.sent,
                "receive-rate": round(self.receive_rate, 1), "send-rate": round(self.send_rate, 1)}

    async def run(self) -> None:
        try:
            login = _Login(SaslServer(), lambda credentials: self.swiftlet.login(credentials, self.host))
            with trio.move_on_after(SASL_TIMEOUT) as timer:
                remaining = await lead_in(self.stream, login)
            if timer.cancelled_caught:
                log.info("connection from %s closed: no SASL exchange within %.0f s", self.host, SASL_TIMEOUT)
                return
            self.principal = login.principal
            self.engine = amqp.Connection(container_id=f"martinet:{self.swiftlet.router_name}",
                                          idle_timeout=self.config.keepalive_interval / 1000,
                                          max_frame_size=self.config.max_frame_size)
            self._driver = Driver(self.stream, self.engine, on_input=self._handle_events,
                                  before_write=self._before_write)
            await self._driver.run(remaining)
        except* SaslError as group:
            log.info("connection from %s refused: %s", self.host, group.exceptions[0])
        except* AuthenticationFailed as group:  # logged by the authentication swiftlet
            log.debug("login refused: %s", group.exceptions[0])
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.debug("connection from %s ended: %s", self.host, group.exceptions[0])
        finally:
            self._release()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()

    def _before_write(self) -> None:
        for link in list(self.links.values()):
            if isinstance(link, (OutgoingLink, BrowsingLink)):
                link.pump()
        self._handle_events()

    def _handle_events(self) -> None:
        assert self.engine is not None
        self.engine.dispatch(self._handlers)

    # -- events ---------------------------------------------------------------------------------

    def _on_connection_open(self, event: amqp.ConnectionOpened) -> None:
        engine = self.engine
        client_id = engine.remote_container_id
        engine.offered_capabilities = ["ANONYMOUS-RELAY"]
        config = self.config  # the connection-factory settings, for clients that use them (ours)
        engine.properties = {
            Symbol("martinet:consumer-cache-size"): Int(config.consumer_cache_size),
            Symbol("martinet:default-delivery-mode"): config.jms_default_delivery_mode,
            Symbol("martinet:default-priority"): Int(config.jms_default_message_priority),
            Symbol("martinet:default-ttl"): ULong(config.jms_default_message_ttl),
            Symbol("martinet:router"): self.swiftlet.router_name,
        }
        in_use = self.swiftlet.client_ids
        if client_id and in_use.get(client_id) and not self.config.allow_same_clientid:
            log.info("connection from %s refused: client id %r is in use", self.host, client_id)
            engine.close(Error("amqp:invalid-field", f"client id {client_id!r} is in use",
                               {Symbol("invalid-field"): Symbol("container-id")}))
            return
        self.client_id = client_id
        self._client_id_patch = AnnotationPatch({CLIENT_ID_ANNOTATION: client_id})
        if client_id:
            in_use[client_id] = in_use.get(client_id, 0) + 1
        engine.open()

    def _on_connection_closed(self, event: amqp.ConnectionClosed) -> None:
        if event.error is not None and not event.by_peer:
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
        except _Deferred as deferred:
            self._driver.start_soon(self._finish_attach, link, deferred.finish)
            return
        self._activate(link, state)

    def _activate(self, link: amqp.Link, state: Any) -> None:
        self.links[link] = state
        link.handler = state
        link.attach()
        state.start()

    def _refuse(self, link: amqp.Link, refusal: _Refused) -> None:
        """Answer with a null terminus and detach with the reason [2.6.3]."""
        log.info("attach from %s refused: %s", self.host, refusal)
        link.source, link.target = (None, link.remote_target) if link.is_sender else (link.remote_source, None)
        link.attach()
        link.detach(closed=True, error=Error(refusal.condition, str(refusal)))

    async def _finish_attach(self, link: amqp.Link, finish: Any) -> None:
        try:
            state = await finish()
        except _Refused as refusal:
            if not self.closed:
                self._refuse(link, refusal)
        else:
            if self.closed or not link.remote_attached:
                state.close()
            else:
                self._activate(link, state)
        self.wake()

    def _check(self, address: str | None, action: str, *, topic: bool = False) -> str:
        if not address:
            raise _Refused("amqp:invalid-field", "an address is required")
        try:
            if topic:
                if self.topic_manager is None:
                    raise _Refused("amqp:not-found", "topics are not available: sys$topicmanager is not running")
                parse_topic(address)
                if self.principal is not None:
                    self.principal.check_topic(address, action)
            else:
                self._check_queue(address, action)
        except _Refused:
            raise
        except QueueNotFound as exc:
            raise _Refused("amqp:not-found", str(exc)) from None
        except (QueueError, TopicNameError) as exc:
            raise _Refused("amqp:invalid-field", str(exc)) from None
        except AccessDenied as exc:
            raise _Refused("amqp:unauthorized-access", str(exc)) from None
        return address

    def _check_queue(self, address: str, action: str) -> None:
        """Whether this connection may ``action`` (send, receive, browse) queue ``address``;
        if so, the queue exists afterwards (created on first use where that is allowed).

        Everything is decided before the queue is looked up or created, so a refusal leaves
        nothing behind. Names containing ``$`` are the router's, with these rules whether
        authentication is on or off:

        - a temporary queue (``tmp$…``): anyone may send to it while it exists (it is a
          reply-to address); only the connection that created it may receive from or
          browse it;
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
            raise _Refused("amqp:not-found", f"cannot {action} queue {address!r}: it is on router {router}, "
                           f"and only queues of this router ({self.swiftlet.router_name}) can be read here")
        if "$" not in name:
            if self.principal is not None:
                self.principal.check_queue(address, action)
            self.queue_manager.queue(address)  # created on first use if auto-create-queues is on
            return
        if name.startswith(TEMPORARY_PREFIX):
            if remote:
                return  # a reply-to on another router: routing takes it there
            queue = self.queue_manager.queues.get(name)
            if queue is None:
                raise QueueNotFound(f"temporary queue {name!r} does not exist on router {self.swiftlet.router_name}")
            if action != "send" and queue.owner is not self:
                raise AccessDenied(f"cannot {action} temporary queue {name!r}: only the connection that created "
                                   "it may receive from it")
            return
        if not remote and self.topic_manager is not None and self.topic_manager.is_durable_queue(name):
            raise AccessDenied(f"cannot {action} queue {name!r} as a queue: it is a durable subscription's; attach "
                               "to its topic as a durable subscriber, with the client id that created it")
        if self.principal is None:
            raise AccessDenied(f"cannot {action} queue {address!r}: a name with '$' is the router's, and without "
                               "sys$authentication no grant can name it")
        self.principal.check_queue(address, action)
        self.queue_manager.queue(address, create=False)  # a client never creates a '$' queue

    def _attach_incoming(self, link: amqp.Link) -> IncomingLink | CoordinatorLink:
        link.source = link.remote_source
        link.target = target = (link.remote_target or amqp.Terminus(kind=amqp.TARGET)).copy()
        if target.kind == COORDINATOR:
            return CoordinatorLink(self, link)
        if target.dynamic:  # a temporary queue or topic, gone with this link (Qpid JMS style)
            return self._temporary_destination(link)
        if target.address is None:
            return IncomingLink(self, link, None, False)  # anonymous relay
        name, topic = _destination(target)
        address = self._check(name, "publish" if topic else "send", topic=topic)
        return IncomingLink(self, link, address, topic)

    def _delete_temporary(self, name: str) -> None:
        """A temporary queue goes with its link (unless the connection's end took it already)."""
        if name in self.queue_manager.queues:
            self.queue_manager.delete_queue(name)

    def _temporary_destination(self, link: amqp.Link) -> IncomingLink:
        if "temporary-topic" in link.target.capabilities:
            if self.topic_manager is None:
                raise _Refused("amqp:not-found", "topics are not available: sys$topicmanager is not running")
            name = self.swiftlet.temporary_topic_name()
            link.target.address = name
            return IncomingLink(self, link, name, True)
        queue = self.queue_manager.create_temporary_queue(self)
        link.target.address = queue.name
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
            queue = self.queue_manager.create_temporary_queue(self)
            link.source.address = queue.name
            return OutgoingLink(self, link, queue.consumer(selector, owner=self),
                                lambda: self._delete_temporary(queue.name))
        if source.address is None:  # Qpid JMS looks a durable subscription up by link name
            return self._existing_durable(link)
        name, topic = _destination(source)
        if topic and source.durable:
            self._check(name, "durable", topic=True)
            raise _Deferred(lambda: self._attach_durable(link, name, text, no_local))
        if not topic and source.distribution_mode == "copy":
            address = self._check(name, "browse")
            return BrowsingLink(self, link, iter(list(self.queue_manager.queue(address).browse(selector))))
        if topic:
            self._check(name, "subscribe", topic=True)
            subscription = self.topic_manager.subscribe(name, selector=text, no_local=no_local,
                                                        client_id=self.client_id, owner=self)
            return OutgoingLink(self, link, subscription.consumer(), subscription.close)
        address = self._check(name, "receive")
        try:
            consumer = self.queue_manager.queue(address).consumer(selector, owner=self)
        except ConsumerRefused as exc:
            raise _Refused("amqp:resource-locked", str(exc)) from None
        return OutgoingLink(self, link, consumer)

    async def _attach_durable(self, link: amqp.Link, topic: str, selector: str | None, no_local: bool) -> Any:
        """A durable subscription named by the client id (container id) and the link name:
        created, resumed, or replaced when its topic or selector changed."""
        if not self.client_id:
            raise _Refused("amqp:invalid-field", "a durable subscription needs a client id (container id)")
        try:
            subscription = await self.topic_manager.durable_subscribe(self.client_id, link.name, topic,
                                                                      selector=selector, no_local=no_local)
        except TopicError as exc:
            raise _Refused("amqp:invalid-field", str(exc)) from None
        return OutgoingLink(self, link, subscription.consumer(), durable=(self.client_id, link.name))

    def _existing_durable(self, link: amqp.Link) -> OutgoingLink:
        subscription = self.topic_manager.durable_subscriptions().get(
            durable_queue_name(self.client_id or "", link.name)) if self.topic_manager else None
        if subscription is None:
            raise _Refused("amqp:not-found", f"no durable subscription {link.name!r} for client {self.client_id!r}")
        self._check(subscription.topic.text, "durable", topic=True)  # the grant, as for the attach that made it
        link.source = amqp.Terminus(kind=amqp.SOURCE, address=f"{TOPIC_PREFIX}{subscription.topic.text}",
                                    durable=2, expiry_policy="never")  # the request's source was null
        return OutgoingLink(self, link, subscription.consumer(), durable=(self.client_id or "", link.name))

    def route(self, message: Message) -> tuple[str, bool]:
        """Where an anonymous-relay message goes: its ``to``, as a topic or a queue."""
        to = message.properties.to
        if not to:
            raise _Refused("amqp:invalid-field", "a message on an anonymous relay link needs a 'to' address")
        if to.startswith(TOPIC_PREFIX):
            return self._check(to[len(TOPIC_PREFIX):], "publish", topic=True), True
        if message.message_annotations.get(JMS_DEST) in JMS_TOPIC_TYPES:
            return self._check(to, "publish", topic=True), True
        return self._check(to[len(QUEUE_PREFIX):] if to.startswith(QUEUE_PREFIX) else to, "send"), False

    def with_client_id(self, message: Message) -> Message:
        """The message with the producer's client id annotated (as SwiftMQ's JMS_SWIFTMQ_CID)."""
        return message if self._client_id_patch is None else self._client_id_patch.apply(message)

    def declare(self) -> bytes:
        txn_id = f"txn-{next(self._transaction_ids)}".encode()
        self.transactions[txn_id] = self.queue_manager.transaction()
        return txn_id

    def transaction(self, txn_id: bytes) -> Any:
        transaction = self.transactions.get(txn_id)
        if transaction is None:
            raise _Refused("amqp:transaction:unknown-id", f"unknown transaction {txn_id!r}")
        return transaction

    def discharge(self, link: amqp.Link, delivery_id: int, txn_id: bytes, fail: bool) -> None:
        transaction = self.transaction(txn_id)
        del self.transactions[txn_id]
        self._driver.start_soon(self._finish, link, delivery_id, transaction, fail)

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

    def throttle(self, state: IncomingLink) -> None:
        self._driver.start_soon(self._resume_after_delay, state)

    async def _resume_after_delay(self, state: IncomingLink) -> None:
        """SwiftMQ's producer flow control over AMQP: a producer whose sends got a
        flow-control delay gets no new credit until the delay has passed — or, when it sent
        to a queue, until a consumer brought that queue back to its
        ``flowcontrol-start-queuesize``, so a backlog that drains fast does not leave its
        consumers idle for the rest of the delay."""
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
        if self.links.get(state.link) is state:
            state.resume()
            self.wake()

    def _on_link_detach(self, event: amqp.LinkDetached) -> None:
        """Detach keeps a durable subscription; close (``closed=true``) deletes it."""
        link, closed = event.link, event.closed
        state = self.links.pop(link, None)
        if state is not None:
            state.close()
            if closed and isinstance(state, OutgoingLink) and state.durable and self._driver is not None:
                self._driver.start_soon(self._unsubscribe, link, *state.durable)
                return  # answered once the subscription is gone
        if not link.attached:  # detached while its attach was pending: answer both
            link.attach()
        link.detach(closed=closed)

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
        if self.client_id:
            in_use = self.swiftlet.client_ids
            in_use[self.client_id] -= 1
            if not in_use[self.client_id]:
                del in_use[self.client_id]
        for transaction in self.transactions.values():  # a lost connection rolls back
            transaction.rollback_nowait()
        self.transactions.clear()
        for state in self.links.values():
            state.close()
        self.links.clear()
        self.queue_manager.delete_temporary_queues(self)
        if self.topic_manager is not None:
            self.topic_manager.close_subscriptions(self)
