"""``sys$jms``: the AMQP 1.0 listener with JMS semantics.

Listeners (port, bind address, max connections, host access list, keepalive → AMQP idle
timeout, frame size, incoming credit, TLS, connection-factory defaults announced in the
open frame), SASL ANONYMOUS and PLAIN checked by ``sys$authentication`` (:mod:`.sasl`),
our AMQP 1.0 engine (:mod:`.amqp`), the links and their JMS semantics (:mod:`.listener`),
per-connection usage sampled every ``collect-interval``, and the Python client
(:mod:`.client`, on the same engine in client mode).
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections.abc import Mapping
from typing import Any

import trio

from martinet.kernel import Entity, SwiftletContext, SwiftletSpec, UsageList, Veto, config_class, entity_list, hookimpl, prop
from martinet.messaging.selector import like_pattern

from .listener import AmqpConnection
from martinet.messaging.amqp.sasl import Credentials

log = logging.getLogger(__name__)


@config_class
class HostAccessEntry:
    name: str = prop(description="SQL-LIKE pattern of client addresses allowed to connect.")


@config_class
class ListenerConfig:
    name: str = prop(description="Listener name.")
    port: int = prop(5672, min=0, max=65535, reboot_required=True,
                     description="TCP port; 0 takes any free port (shown under usage).")
    bind_address: str = prop("0.0.0.0", reboot_required=True, description="Interface to listen on.")
    max_connections: int = prop(-1, min=-1, description="Most connections at once; -1: unlimited. "
                                "Connections past it are closed at once.")
    keepalive_interval: int = prop(60_000, min=0, description="Milliseconds of silence after which a "
                                   "peer counts as dead (the AMQP idle timeout we announce); 0: never.")
    max_frame_size: int = prop(1_048_576, min=512, description="Largest AMQP frame, in bytes.")
    incoming_credit: int = prop(1000, min=1, max=1_000_000, description="Messages a producer may have "
                                "in flight on one link (the link credit we grant).")
    tls_certificate: str = prop("", reboot_required=True, description="PEM certificate chain for TLS; "
                                "empty: plain TCP. Clients then connect with amqps://.")
    tls_key: str = prop("", reboot_required=True, description="PEM private key of the TLS certificate.")
    allow_same_clientid: bool = prop(False, description="Let several connections use one client id "
                                     "(container id) at once; false refuses the second with amqp:invalid-field.")
    host_access_list: Mapping[str, HostAccessEntry] = entity_list(
        HostAccessEntry, item="host-access-entry", description="Client addresses allowed to connect (SQL-LIKE "
        "patterns); empty: any. Others are closed at once and logged.")
    consumer_cache_size: int = prop(500, min=1, description="Messages a consumer of our client prefetches "
                                    "(its link credit window; SwiftMQ's smqp-consumer-cache-size). "
                                    "Announced to clients in the open frame.")
    jms_default_delivery_mode: str = prop("persistent", choices=("persistent", "non_persistent"),
                                          description="Delivery mode of our client's producers unless set.")
    jms_default_message_priority: int = prop(4, min=0, max=9, description="Priority of our client's "
                                             "messages unless set.")
    jms_default_message_ttl: int = prop(0, min=0, description="Time to live (ms) of our client's messages "
                                        "unless set; 0: forever.")


@config_class
class JmsConfig:
    collect_interval: int = prop(10_000, min=100, description="Milliseconds between samples of the "
                                 "per-connection message rates shown under usage/connections.")
    listeners: Mapping[str, ListenerConfig] = entity_list(
        ListenerConfig, item="listener", default=[ListenerConfig(name="amqp")], description="AMQP listeners.")


class JmsSwiftlet:
    """``sys$jms``."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.router_name = context.router_name
        self.qm: Any = None
        self.tm: Any = None
        self._auth: Any = None
        self._nursery: trio.Nursery | None = None
        self._usage: UsageList | None = None
        self._listeners: dict[str, dict[str, Any]] = {}
        self.client_ids: dict[str, int] = {}  # client id → connections using it
        self._connections: UsageList | None = None
        self._connection_ids = itertools.count(1)
        self._live: set[AmqpConnection] = set()
        self._temporary_topics = 0

    def temporary_topic_name(self) -> str:
        self._temporary_topics += 1
        return f"tmp$topic${self._temporary_topics}"

    def login(self, credentials: Credentials, host: str) -> Any:
        """A principal for the credentials, or raise; everyone is let in without sys$authentication."""
        if self._auth is None:
            return None
        user = credentials.user if credentials.mechanism == "PLAIN" else None
        return self._auth.login(user, credentials.password, host)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.qm = self.context.lookup("sys$queuemanager")
        try:
            self.tm = self.context.lookup("sys$topicmanager")
        except LookupError:
            log.info("sys$topicmanager is not running: no topics over AMQP")
        try:
            self._auth = self.context.lookup("sys$authentication")
        except LookupError:
            log.warning("sys$authentication is not running: every client is let in")
        self._usage = self.context.usage.add_list("listeners")
        self._connections = self.context.usage.add_list("connections")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for entity in self.context.entity.entity_list("listeners").entities.values():
                await nursery.start(self._serve, entity)
            self.context.entity.entity_list("listeners").bind(None, self._listener_removed)
            nursery.start_soon(self._collect_forever)
            task_status.started()

    async def _collect_forever(self) -> None:
        """Sample each connection's message counts into rates every collect-interval."""
        while True:
            await trio.sleep(self.context.config.collect_interval / 1000)
            for connection in self._live:
                connection.sample_rates()

    def _listener_removed(self, entity: Entity) -> None:
        raise Veto("listeners change at the next start (reboot)")

    async def _serve(self, entity: Entity, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = entity.snapshot()
        tcp = await trio.open_tcp_listeners(config.port, host=config.bind_address)
        port = tcp[0].socket.getsockname()[1]
        listeners: list[trio.abc.Listener] = list(tcp)
        if config.tls_certificate:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                tls.load_cert_chain(config.tls_certificate, config.tls_key or None)
            except (OSError, ssl.SSLError) as exc:
                for listener in tcp:
                    await listener.aclose()
                raise RuntimeError(f"listener {config.name}: cannot load the TLS certificate "
                                   f"{config.tls_certificate!r} / key {config.tls_key!r}: {exc}") from None
            listeners = [trio.SSLListener(listener, tls) for listener in tcp]
        state = self._listeners[config.name] = {"port": port, "connections": 0, "accepted": 0, "refused": 0}
        assert self._usage is not None
        self._usage.add(config.name, lambda: dict(state))
        log.info("AMQP listener %s on %s:%d%s", config.name, config.bind_address, port,
                 " (TLS)" if config.tls_certificate else "")

        async def handle(stream: trio.abc.Stream) -> None:
            live = entity.snapshot()
            try:
                socket_stream = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
                host = socket_stream.socket.getpeername()[0]
            except OSError:
                return
            refusal = None
            if live.host_access_list and not any(like_pattern(p).fullmatch(host) for p in live.host_access_list):
                refusal = "not in the host access list"
            elif 0 <= live.max_connections <= state["connections"]:
                refusal = f"max-connections {live.max_connections} reached"
            if refusal is not None:
                state["refused"] += 1
                log.warning("connection from %s to listener %s closed: %s", host, config.name, refusal)
                await stream.aclose()
                return
            state["connections"] += 1
            state["accepted"] += 1
            connection = AmqpConnection(self, live, stream, host)
            name = f"{next(self._connection_ids)}"
            self._live.add(connection)
            assert self._connections is not None
            self._connections.add(name, lambda: connection.usage(config.name))
            try:
                await connection.run()
            except Exception:  # a bug in one connection must not take the listener down
                log.exception("connection from %s failed", host)
            finally:
                state["connections"] -= 1
                self._live.discard(connection)
                self._connections.remove(name)

        task_status.started()
        await trio.serve_listeners(handle, listeners)


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$jms",
            description="AMQP 1.0 listener with JMS semantics.",
            config=JmsConfig,
            factory=JmsSwiftlet,
        )
    ]
