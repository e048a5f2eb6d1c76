"""The running ``sys$jms``: its listeners, the connections they accept, and what those share.

Theory of operation
-------------------
At start :class:`JmsSwiftlet` looks up the queue manager (required), the topic manager
and the authentication swiftlet (both optional: without the one there are no topics over
AMQP, without the other every client is let in), then opens every configured listener.
A listener checks each accepted socket against its host access list and
``max-connections`` and hands it to an :class:`~.listener.AmqpConnection`, which runs
SASL, the AMQP engine and the links until the client goes. The swiftlet keeps what the
connections share: the client ids in use (by which connections), the temporary topic names, the peers above,
and per-connection usage, whose message rates are sampled every ``collect-interval``; each
connection's usage entry offers ``delete`` (management closes it: its task is cancelled, so
what it held is released as for a lost connection). Listeners change only at the next start.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from typing import Any

import trio

from martinet.kernel import Entity, SwiftletContext, UsageList, Veto
from martinet.messaging.amqp.sasl import Credentials, SaslError, SaslServer
from martinet.messaging.amqp.sasl import State as SaslState
from martinet.messaging.amqp.wire import AMQP_HEADER
from martinet.messaging.like import like_pattern
from martinet.messaging.listening import Accepted, listen, port_of
from martinet.swiftlets.authentication.api import Authentication, Principal
from martinet.swiftlets.mgmt.api import Management
from martinet.swiftlets.queuemanager.api import QueueManager
from martinet.swiftlets.topicmanager.api import TopicManager

from .config import ListenerConfig
from .listener import AmqpConnection, BrokenInputLog
from .login import refusal

__all__ = ["JmsSwiftlet"]

log = logging.getLogger(__name__)

# What a listener accepts: a TCP connection, with TLS on top when the listener has a certificate.


class JmsSwiftlet:
    """``sys$jms``."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.router_name = context.router_name
        self.queue_manager: QueueManager  # looked up in run()
        self.topic_manager: TopicManager | None = None  # None: sys$topicmanager is not running
        self._auth: Authentication | None = None
        self._nursery: trio.Nursery | None = None
        self._usage: UsageList | None = None
        self._listeners: dict[str, dict[str, Any]] = {}
        self._serving: dict[str, trio.CancelScope] = {}  # listener name → the scope that serves it
        self.client_ids: dict[str, list[AmqpConnection]] = {}  # client id → the connections using it
        self._connections: UsageList | None = None
        self._connection_ids = itertools.count(1)
        self._live: set[AmqpConnection] = set()
        self._temporary_topics = 0
        self.broken_input = BrokenInputLog()  # one WARNING line per broken connection, rate-limited per host
        # one INFO line per refused transfer or attach, rate-limited per host likewise
        self.refusals = BrokenInputLog(
            "%s from %s refused: %s", "refusals of transfers or attaches from %s", logging.INFO
        )
        # who comes and goes, for the operator; a client reconnecting in a loop must not flood
        # the log, hence the same per-host limit
        self.comings = BrokenInputLog("%s from %s %s", "client connections opened or closed from %s", logging.INFO)

    def temporary_topic_name(self) -> str:
        """``tmp$topic$<router>$<n>``: unique in the network, since a reply-to temporary topic
        receives publications from every router (the topic managers' interest exchange)."""
        self._temporary_topics += 1
        return f"tmp$topic${self.router_name}${self._temporary_topics}"

    def refusal_delay(self, host: str) -> float:
        """Seconds to wait before answering a refused login from ``host``."""
        return self._auth.refusal_delay(host) if self._auth is not None else 0.0

    def manages(self, group: str) -> bool:
        """Whether users of ``group`` may manage this router (one of sys$mgmt's groups)."""
        try:
            management = self.context.lookup("sys$mgmt", Management)
        except LookupError:  # not running (yet, or at all): nobody manages through it
            return False
        return management.manages(group)

    @property
    def authentication_enabled(self) -> bool:
        """Whether logins check users and passwords now."""
        return self._auth is not None and self._auth.enabled

    async def login(self, credentials: Credentials, host: str) -> Principal | None:
        """A principal for the credentials, or raise; everyone is let in without sys$authentication."""
        if self._auth is None:
            return None
        user = credentials.user if credentials.mechanism == "PLAIN" else None
        return await self._auth.login(user, credentials.password, host)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.queue_manager = self.context.lookup("sys$queuemanager", QueueManager)
        try:
            self.topic_manager = self.context.lookup("sys$topicmanager", TopicManager)
        except LookupError:
            log.info("sys$topicmanager is not running: no topics over AMQP")
        try:
            self._auth = self.context.lookup("sys$authentication", Authentication)
        except LookupError:
            log.warning("sys$authentication is not running: every client is let in")
        self._usage = self.context.usage.add_list("listeners")
        self._connections = self.context.usage.add_list("connections")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for entity in self.context.entity.entity_list("listeners").entities.values():
                self._start(entity, self._bind(entity.config))  # a failure here stops the start
            self.context.entity.entity_list("listeners").bind(self._listener_added, self._listener_removed)
            nursery.start_soon(self._collect_forever)
            task_status.started()

    async def _collect_forever(self) -> None:
        """Sample each connection's message counts into rates every collect-interval."""
        while True:
            await trio.sleep(self.context.config.collect_interval / 1000)
            for connection in self._live:
                connection.meter.sample_rates()

    def _listener_added(self, entity: Entity) -> None:
        """Bind a listener added at runtime now, so that an add with a port in use or a
        certificate that does not load is refused with the reason."""
        if entity.name in self._serving:  # bound at start, before the list was bound
            return
        try:
            listeners = self._bind(entity.config)
        except (OSError, ssl.SSLError) as exc:
            raise Veto(str(exc)) from None
        self._start(entity, listeners)

    def _listener_removed(self, entity: Entity) -> None:
        """Stop accepting on the listener; its connections go on until they end."""
        scope = self._serving.pop(entity.name, None)
        if scope is not None:
            scope.cancel()
            self._listeners.pop(entity.name, None)
            if self._usage is not None:
                self._usage.remove(entity.name)

    @staticmethod
    def _bind(config: ListenerConfig) -> list[trio.abc.Listener[Accepted]]:
        """Raises: OSError or ssl.SSLError, with the listener named."""
        where = f"AMQP listener {config.name}"
        return listen(where, config.bind_address, config.port, certificate=config.tls_certificate, key=config.tls_key)

    def _start(self, entity: Entity, listeners: list[trio.abc.Listener[Accepted]]) -> None:
        """Show the bound ``listeners`` of ``entity`` in usage and serve them in the
        swiftlet's nursery until the listener is removed."""
        config = entity.config
        port = port_of(listeners)
        state = self._listeners[config.name] = {"port": port, "connections": 0, "accepted": 0, "refused": 0}
        assert self._usage is not None and self._nursery is not None
        self._usage.add(config.name, lambda: dict(state))
        log.info(
            "AMQP listener %s on %s:%d%s",
            config.name,
            config.bind_address,
            port,
            " (TLS)" if config.tls_certificate else "",
        )
        scope = self._serving[entity.name] = trio.CancelScope()
        self._nursery.start_soon(self._serve, entity, listeners, state, scope)

    async def _refuse(self, stream: trio.abc.Stream, condition: str, description: str) -> None:
        """Close a refused connection with an AMQP close carrying ``condition`` [2.4.1]: a
        SASL client's exchange is let through unchecked (nothing is granted by it; the
        connection is closed right after the AMQP header), so that the client learns the
        reason. A client that breaks the protocol or stays silent for 5 s is just closed."""
        sasl = SaslServer()
        try:
            with trio.move_on_after(5):
                while sasl.state is not SaslState.DONE:
                    data = await stream.receive_some(4096)
                    if not data:
                        return
                    if sasl.receive_data(data) is not None:
                        sasl.accept()
                    if out := sasl.data_to_send:
                        await stream.send_all(out)
                header = sasl.remaining
                while len(header) < 8 and (data := await stream.receive_some(8)):
                    header += data
                if header[:8] == AMQP_HEADER:
                    await stream.send_all(refusal(f"martinet:{self.router_name}", condition, description))
        except (SaslError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def _serve(
        self,
        entity: Entity,
        listeners: list[trio.abc.Listener[Accepted]],
        state: dict[str, Any],
        scope: trio.CancelScope,
    ) -> None:
        config = entity.config

        async def handle(stream: Accepted) -> None:
            live = entity.config
            try:
                socket_stream = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
                host = socket_stream.socket.getpeername()[0]
            except OSError:
                return
            refused = None
            if live.host_access_list and not any(like_pattern(p).matches(host) for p in live.host_access_list):
                refused = ("amqp:unauthorized-access", "not in the host access list")
            elif 0 <= live.max_connections <= state["connections"]:
                refused = ("amqp:resource-limit-exceeded", f"max-connections {live.max_connections} reached")
            if refused is not None:
                state["refused"] += 1
                log.warning("connection from %s to listener %s closed: %s", host, config.name, refused[1])
                await self._refuse(stream, *refused)
                return
            state["connections"] += 1
            state["accepted"] += 1
            connection = AmqpConnection(self, live, stream, host)
            name = f"{next(self._connection_ids)}"
            self._live.add(connection)
            assert self._connections is not None
            scope = trio.CancelScope()

            def delete() -> str:
                scope.cancel()
                log.info("connection %s from %s deleted by management", name, host)
                return f"connection {name} from {host} closed"

            self._connections.add(name, lambda: connection.meter.usage(config.name)).add_operation(
                "delete", delete, "Close this connection (its temporary queues go, its unsettled messages go back)."
            )
            try:
                with scope:
                    await connection.run()
            except Exception:  # a bug in one connection must not take the listener down
                log.exception("connection from %s failed", host)
            finally:
                if connection.opened:
                    self.comings.warn(
                        host,
                        "client connection",
                        f"closed: {connection.who}, {connection.received} message(s) received, {connection.sent} sent",
                    )
                state["connections"] -= 1
                self._live.discard(connection)
                self._connections.remove(name)

        with scope:  # (serve_listeners closes the listeners when it ends; the connections go on)
            await trio.serve_listeners(handle, listeners, handler_nursery=self._nursery)
