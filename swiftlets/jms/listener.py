"""The AMQP 1.0 listener: accepted sockets, SASL, the engine, and links to queues and topics.

Theory of operation
-------------------
One :class:`AmqpConnection` per accepted socket, with two tasks: the reader feeds the
socket's bytes to SASL (:mod:`.login`) and then to the AMQP engine (:mod:`messaging.amqp`),
which calls the links (:mod:`.links`) for each message and leaves the rare events (attach,
detach, …) to handle after each read; the writer sends what the engine has to send
whenever something woke it (events handled, a queue delivered to one of our consumers, a
message became durable). Both run in the router's trio thread, so the engine needs no lock.

The connection keeps what its links use per message (the counters, ``wake``, ``route``,
the open transactions' look-up, the flow-control checks, the queue and topic managers) as
its own attributes (bound to the part that serves them, not reached through it), and
gives each rarer job to a part of its own, one per module:

- :class:`.login.ClientLogin` — SASL and the login decision;
- :class:`.attach.Attaches` — the client's attaches and detaches, and the link state
  (:mod:`.links`) serving each link;
- :class:`.addresses.Addresses` — the access policy (:mod:`.access`, pure functions)
  applied to an address, and the queues auto-created on first use;
- :class:`.temporary.TemporaryQueues` — dynamic sources and targets;
- :class:`.durable.DurableSubscriptions` — durable subscriptions;
- :class:`.transactions.Transactions` — the transaction coordinator's transactions;
- :class:`.flow.ProducerFlow` — producer credit withheld for a flow-control delay or
  while the router's memory alarm is on;
- :class:`.usage.ConnectionUsage` — what management shows of the connection.

Limits: the engine gets the listener's ``max-sessions`` and
``max-links-per-session`` (announced as channel-max and handle-max; beyond them the
connection is closed with a framing error), the queue manager's ``max-message-size`` (a
larger multi-frame message detaches its link) and ``max-incoming-buffer`` (incomplete
messages of all links together; beyond it the connection is closed). A connection creates
at most ``max-auto-created-queues-per-connection`` queues (:mod:`.addresses`). When the
connection is over, :meth:`AmqpConnection.run` breaks the reference cycles between it, its
parts, its links, the engine and the driver, so the memory goes back at once (the running
router's collector is tuned to run full collections rarely: ``kernel/cli.py``).

Broken input never ends in a traceback: a connection closed because the peer broke SASL,
framing or the encoding (``amqp:decode-error``) is one WARNING line with the peer and the
reason (:class:`BrokenInputLog`: at most 10 a minute per host, then a count), and a
message whose metadata is malformed or of the wrong type is rejected with
``amqp:invalid-field``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from martinet.kernel.logs import HostLimitedLog
from martinet.messaging import amqp
from martinet.messaging.amqp import SOLE_CONNECTION_FOR_CONTAINER, Error
from martinet.messaging.amqp.sasl import SaslError
from martinet.messaging.codec import Int, Symbol, ULong
from martinet.messaging.io import Driver
from martinet.messaging.message import AnnotationPatch, Message
from martinet.swiftlets.authentication.api import AuthenticationFailed, Principal
from martinet.swiftlets.mgmt.api import IDENTITY_ANNOTATION, Identity
from martinet.swiftlets.queuemanager.api import Creator, QueueError, Transaction
from martinet.swiftlets.topicmanager.api import PublishResult

from .access import Refused
from .addresses import Addresses
from .attach import Attaches, LinkState
from .config import ListenerConfig
from .durable import DurableSubscriptions
from .flow import ProducerFlow
from .links import BrowsingLink, IncomingLink, OutgoingLink
from .login import ClientLogin
from .temporary import TemporaryQueues
from .transactions import Transactions
from .usage import ConnectionUsage

if TYPE_CHECKING:
    from collections.abc import Callable

    from .swiftlet import JmsSwiftlet

__all__ = ["AmqpConnection", "BrokenInputLog"]

log = logging.getLogger(__name__)

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

CLIENT_ID_ANNOTATION = Symbol("x-opt-martinet-cid")  # the producer's client id (SwiftMQ's JMS_SWIFTMQ_CID)


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


class AmqpConnection:
    """One client connection."""

    # What the links call per message are plain attributes, bound in __init__ to the part
    # that serves them: no go-between on the per-message path.
    route: Callable[[Message], tuple[str, bool]]
    transaction: Callable[[bytes | None], Transaction]
    held_by_memory: Callable[[], bool]
    throttle: Callable[[IncomingLink], None]

    def __init__(self, swiftlet: JmsSwiftlet, config: ListenerConfig, stream: trio.abc.Stream, host: str):
        self.swiftlet = swiftlet
        self.config = config
        self.stream = stream
        self.host = host
        self.queue_manager = swiftlet.queue_manager
        self.topic_manager = swiftlet.topic_manager
        self.client_id: str | None = None
        self.sole = False  # the client asked to be the only connection of its container id
        self.client_id_patch: AnnotationPatch | None = None  # the client id annotation, once the client opened
        self.principal: Principal | None = None
        self.authenticated = False
        self.creator = Creator(host=host)  # whom its queues count for: the user too, once logged in
        self.driver: Driver | None = None
        self.engine: amqp.Connection | None = None
        self.links: dict[amqp.Link, LinkState] = {}
        self.closed = False
        self.opened = False  # the client's open was accepted (its closing is logged then)
        self.received = self.sent = 0  # messages from and to the client
        self.flow_control_waits = 0  # producer credit withheld for a flow-control delay
        self.memory_waits = 0  # producer credit withheld while the router's memory alarm was on
        self.memory = self.queue_manager.memory
        self._buffered = 0  # the engine's incomplete incoming bytes, as told to self.memory
        self.addresses = Addresses(self)
        self.temporaries = TemporaryQueues(self)
        self.durables = DurableSubscriptions(self)
        self.transactions = Transactions(self)
        self.attaches = Attaches(self)
        self.meter = ConnectionUsage(self)
        self.flow = ProducerFlow(self)
        self.route = self.addresses.route
        self.transaction = self.transactions.get
        self.held_by_memory = self.flow.held_by_memory
        self.throttle = self.flow.throttle
        self._handlers = {
            amqp.ConnectionOpened: self._on_connection_open,
            amqp.ConnectionClosed: self._on_connection_closed,
            amqp.LinkAttached: self.attaches.on_link_open,
            amqp.LinkDetached: self.attaches.on_link_detach,
            amqp.LinkFlow: self.attaches.on_flow,
            amqp.SessionEnded: self.attaches.on_session_end,
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

    async def run(self) -> None:
        login = ClientLogin(self)
        try:
            remaining = await login.run()
            if remaining is None:
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
            self.driver = Driver(
                self.stream,
                self.engine,
                on_input=self._handle_events,
                before_write=self._before_write,
                read_size=CLIENT_READ_SIZE,
            )
            self.wake = self.driver.wake  # type: ignore[method-assign]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._open_deadline, self.engine)
                await self.driver.run(remaining)
                nursery.cancel_scope.cancel()
        except* SaslError as group:
            self.swiftlet.broken_input.warn(self.host, "connection (SASL)", group.exceptions[0])
        except* AuthenticationFailed as group:  # logged by the authentication swiftlet
            failure = group.exceptions[0]
            while isinstance(failure, ExceptionGroup):  # except* keeps the nesting of the groups it split
                failure = failure.exceptions[0]
            log.debug("login refused: %s", failure)
            await login.answer_refusal(failure)
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
        sessions and links and their handlers, which refer back here; the driver's, the
        event table's and the parts' bound methods; the parts, which refer back here), so it
        is freed at once rather than at the next full collection, which the running router
        makes rare (237 MB were once held by closed connections, 39 MB after one gc.collect())."""
        if self.engine is not None:
            self.engine.release()
        self.driver = None
        parts = ("addresses", "temporaries", "durables", "transactions", "attaches", "meter", "flow")
        for name in ("wake", "route", "transaction", "held_by_memory", "throttle", *parts):
            self.__dict__.pop(name, None)  # (wake: the driver's, bound in run)
        self._handlers = {}

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
        self.client_id_patch = AnnotationPatch({CLIENT_ID_ANNOTATION: client_id})
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

    # -- what the links ask -------------------------------------------------------------------

    def with_identity(self, message: Message) -> Message:
        """A management request with the sender's identity stamped, replacing whatever the client
        put there (:mod:`swiftlets.mgmt.api`: the router serving it trusts this stamp).

        The stamp names the request's reply-to only if this client may send there itself and
        it exists (:meth:`.addresses.Addresses.check_queue` without creating): the serving router replies to
        nothing else, so a reply can neither put messages where its requester could not nor
        create a queue.
        """
        principal = self.principal
        reply_to = message.properties.reply_to
        if isinstance(reply_to, str) and reply_to:
            try:
                self.addresses.check_queue(reply_to, "send", create=False)
            except (Refused, QueueError):
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

    def publish(
        self, topic: str, message: Message, on_durable: Callable[[BaseException | None], None] | None
    ) -> PublishResult:
        # (per message: no check here that the topic manager runs; a topic link or message
        # was refused unless it does)
        return self.topic_manager.publish(  # type: ignore[union-attr]
            topic, message, client_id=self.client_id, on_durable=on_durable
        )

    def _release(self) -> None:
        self.closed = True
        if self._buffered:
            self.memory.add_buffered(-self._buffered)
            self._buffered = 0
        client_ids = self.swiftlet.client_ids
        connections = client_ids.get(self.client_id) if self.client_id else None
        if connections is not None and self in connections:
            connections.remove(self)
            if not connections and self.client_id:
                del client_ids[self.client_id]
        self.transactions.rollback_all()  # a lost connection rolls back
        for state in self.links.values():
            state.close()
        self.links.clear()
        self.queue_manager.delete_temporary_queues(self)
        if self.topic_manager is not None:
            self.topic_manager.close_subscriptions(self)
