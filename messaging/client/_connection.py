"""The JMS-shaped AMQP 1.0 client on trio: connections, sessions, producers, consumers.

Theory of operation
-------------------
A :class:`Connection` owns one socket and one client-mode AMQP engine (:mod:`..amqp`, the
engine the listener runs on; SASL before it is :class:`..amqp.sasl.SaslClient`), run by the
connection driver (:mod:`..io`) in the nursery of :func:`connect`: its reader feeds the
socket's bytes to the engine and handles its events, its writer sends what the engine has
to send whenever an API call or an event woke it. Everything runs in the caller's trio thread, so the engine needs no
lock. Per-message calls come straight from the engine to the link objects here
(``on_transfer``, ``on_outcome``).

Each JMS object maps onto AMQP as Qpid JMS maps it, so that other AMQP JMS clients see
the same links:
a session is an AMQP session; a producer is a sender link (an anonymous one — null target,
routed by ``to`` — when it has no destination); a consumer is a receiver link whose credit
window is the consumer cache size; a durable subscriber's link is named after the
subscription and detaches (keeping it) when closed, and ``unsubscribe`` re-attaches with a
null source and closes; a browser is a receiver in distribution mode ``copy`` that drains;
a temporary queue or topic is a dynamic sender link kept open as the node's anchor; a
transacted session declares a transaction on a coordinator link when first needed and
sends and acknowledges in transactional state.

Waiting is explicit: an API call that needs the peer's answer (attach, persistent send,
commit) awaits an :class:`._links.Outcome` which the reader resolves; if the connection is
lost, every outstanding outcome fails with :class:`ConnectionLost`.

The package is split into private modules: :mod:`._connection` (this: connecting, the
connection and its events), :mod:`._session` (sessions, producers, consumers, browsers,
requestors), :mod:`._links` (each link's state), :mod:`._errors`, :mod:`._messages`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import ssl
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from .. import amqp
from ..amqp import (
    Terminus,
)
from ..amqp.sasl import SaslClient, SaslError, SaslRefused
from ..io import Driver, PeerClosed, lead_in
from ._errors import (
    AckMode,
    ConnectionLost,
    InvalidDestination,
    JMSError,
    SecurityError,
    condition_error,
)
from ._links import CLOSE_TIMEOUT, Attaching, LinkState, Outcome, SenderLink, sender_link
from ._messages import (
    Destination,
    TemporaryQueue,
    TemporaryTopic,
)
from ._session import Session

log = logging.getLogger("martinet.messaging.client")

ATTACH_TIMEOUT = 30.0


class Connection:
    """One AMQP connection to a router. Made by :func:`connect`; not used across threads."""

    def __init__(self, stream: trio.abc.Stream, engine: amqp.Connection, *, consumer_cache_size: int | None):
        self._stream = stream
        self.engine = engine
        self.links: dict[amqp.Link, LinkState] = {}
        self._opening: list[Any] = []  # outcomes of opens and attaches in the batch being handled
        self.lost: JMSError | None = None
        self._opened = Outcome()
        self._ended = trio.Event()
        self._driven = trio.Event()  # the driver returned: what was queued is written
        self._driver = Driver(stream, engine, on_input=self._handle_events)
        self._names = itertools.count(1)
        self._temporary: dict[str, SenderLink] = {}
        self._consumer_cache_size = consumer_cache_size
        self.defaults: dict[str, Any] = {}
        self._handlers = {
            amqp.ConnectionOpened: self._on_open,
            amqp.ConnectionClosed: self._on_close,
            amqp.LinkAttached: self._on_link_attached,
            amqp.LinkDetached: self._on_link_detached,
            amqp.LinkFlow: self._on_flow,
        }

    @property
    def client_id(self) -> str:
        return self.engine.container_id

    @property
    def router(self) -> str | None:
        """The name of the router at the other end (from its open frame)."""
        return self.defaults.get("martinet:router")

    @property
    def consumer_cache_size(self) -> int:
        """Credit window of new consumers: ours if given, else the listener's, else 500."""
        return self._consumer_cache_size or int(self.defaults.get("martinet:consumer-cache-size", 500))

    def wake(self) -> None:
        self._driver.wake()

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    def name(self, kind: str) -> str:
        return f"{kind}:{self.client_id}:{next(self._names)}"

    def session(self, *, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> Attaching:
        """A new session (``await`` it, or ``async with``)."""

        async def make() -> Session:
            self.check()
            session = Session(self, transacted, ack_mode)
            if transacted:
                await session._attach_coordinator()
            return session

        return Attaching(make)

    async def close(self) -> None:
        """Close the connection (temporary destinations go with it); bounded wait for the router."""
        if self.lost is None:
            self.engine.close()
            self.wake()
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._ended.wait()
        else:  # lost: our close with the reason may still be queued (a breach by the router)
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._driven.wait()
        self._fail(ConnectionLost("the connection is closed"))

    # -- tasks ------------------------------------------------------------------------------------

    async def run(
        self, remaining: bytes = b"", *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Read and write until the connection ends; started once the router's open arrived.
        ``remaining``: what the router sent after SASL.

        Raises (before started): the :class:`JMSError` that refused the connection.
        Never raises after it started: a lost connection fails the outstanding calls instead.
        """
        started = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drive, remaining)
                try:
                    await self._opened.wait()
                except JMSError:  # our close (with the reason, or answering the router's) is queued
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await self._driven.wait()  # the writer ends the drive once it is written
                    raise
                task_status.started()
                started = True
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            self._fail(ConnectionLost(f"connection lost: {group.exceptions[0]}"))
        except* JMSError as group:
            self._fail(group.exceptions[0])
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self._stream.aclose()
        if not started:
            raise self._opened.error or self.lost or ConnectionLost("the connection ended before it opened")

    async def _drive(self, remaining: bytes) -> None:
        try:
            await self._driver.run(remaining)
        finally:
            self._driven.set()
        self._fail(ConnectionLost("the router closed the connection"))

    def _fail(self, error: JMSError | ExceptionGroup[JMSError]) -> None:
        """The connection is over because of ``error`` (a group when except* caught the
        error inside a nested one: it is handed over as it was raised)."""
        if self.lost is None:
            self.lost = error if isinstance(error, ConnectionLost) else ConnectionLost(str(error))
            self.lost.__cause__ = None if error is self.lost else error
        self._opened.resolve(error=error)
        for link in list(self.links.values()):
            link.fail(self.lost)
        self._ended.set()

    def _handle_events(self) -> None:
        self.engine.dispatch(self._handlers)
        for outcome in self._opening:
            outcome.resolve()  # unless a close or detach in the same batch refused it
        self._opening.clear()

    # -- events -----------------------------------------------------------------------------------

    def _on_open(self, event: amqp.ConnectionOpened) -> None:
        self.defaults = {str(key): value for key, value in self.engine.remote_properties.items()}
        self._opening.append(self._opened)  # a refusal is an open with a close right behind it

    def _on_close(self, event: amqp.ConnectionClosed) -> None:
        """The router closed the connection (its error refuses the open, if it was pending),
        or it broke the protocol or went silent (our engine's error)."""
        error = condition_error(event.error, "the router closed the connection")
        if not event.by_peer or type(error) is JMSError:
            error = ConnectionLost(error.description, error.condition)
        self._opened.resolve(error=error)
        self._fail(error)

    def _on_link_attached(self, event: amqp.LinkAttached) -> None:
        link = event.link
        state = self.links.get(link)
        if state is None:  # the router attaching on its own: nothing of ours asked for it
            link.attach()
            link.detach(error=amqp.Error("amqp:not-implemented", "this client attaches its own links only"))
            return
        # A refused attach carries a null source (receiver) or target (sender), then a detach.
        # A refusal may also echo the terminus: the attach counts once no detach came with it.
        if (link.remote_target if link.is_sender else link.remote_source) is not None:
            self._opening.append(state.attached)

    def _on_link_detached(self, event: amqp.LinkDetached) -> None:
        state = self.links.pop(event.link, None)
        if state is None:
            return
        if not state.detaching:
            log.info("the router detached link %s: %s", event.link.name, event.error)
        state.remote_detached(event.error)
        event.link.detach(closed=event.closed)  # our answer, unless we detached first

    def _on_flow(self, event: amqp.LinkFlow) -> None:
        state = self.links.get(event.link)
        if state is not None:
            state.on_flow()

    # -- links ------------------------------------------------------------------------------------

    async def attach(self, state: LinkState) -> None:
        """Attach the link and wait for the router's answer (raises its refusal)."""
        self.check()
        self.links[state.link] = state
        state.link.attach()
        self.wake()
        with trio.move_on_after(ATTACH_TIMEOUT):
            await state.attached.wait()
            return
        raise JMSError(f"the router did not answer the attach of link {state.link.name} in {ATTACH_TIMEOUT} s")

    async def create_temporary(self, session: amqp.Session, topic: bool) -> Destination:
        link = sender_link(
            session,
            self.name("temporary"),
            Terminus(kind=amqp.TARGET, dynamic=True, capabilities=["temporary-topic" if topic else "temporary-queue"]),
        )
        state = SenderLink(self, link)
        await self.attach(state)
        address = link.remote_target.address if link.remote_target is not None else None
        if not address:
            await state.close()
            raise JMSError("the router created no temporary destination (its attach named no address)")
        self._temporary[address] = state
        return TemporaryTopic(address) if topic else TemporaryQueue(address)

    async def delete_temporary(self, destination: Destination) -> None:
        """Delete a temporary queue or topic of this connection (its anchor link closes)."""
        state = self._temporary.pop(destination.name, None)
        if state is None:
            raise InvalidDestination(f"{destination.name!r} is not a temporary destination of this connection")
        await state.close()


async def _authenticate(stream: trio.abc.Stream, user: str | None, password: str | None, host: str) -> bytes:
    """SASL in front of the engine (PLAIN with a user, else ANONYMOUS); what the router sent after it.

    Raises:
        SecurityError: the router refused the login.
        ConnectionLost: the router broke the exchange or closed the connection.
    """
    try:
        return await lead_in(stream, SaslClient(user, password, host))
    except SaslRefused:
        raise SecurityError(
            "login refused (wrong user or password, or host not allowed)", "amqp:unauthorized-access"
        ) from None
    except SaslError as exc:
        raise ConnectionLost(f"SASL with the router failed: {exc}") from None
    except PeerClosed:
        raise ConnectionLost("the router closed the connection during the SASL exchange") from None
    except (trio.BrokenResourceError, OSError) as exc:
        raise ConnectionLost(f"connection lost during the SASL exchange: {exc}") from None


@contextlib.asynccontextmanager
async def connect(
    url: str = "amqp://localhost:5672",
    *,
    client_id: str | None = None,
    user: str | None = None,
    password: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    consumer_cache_size: int | None = None,
    idle_timeout: float = 60.0,
    connect_timeout: float = 30.0,
) -> AsyncIterator[Connection]:
    """Connect to a router: ``amqp://[user:password@]host[:port]`` or ``amqps://`` for TLS.

    ``client_id`` is the JMS client id (the AMQP container id; durable subscriptions need
    one), which this connection asks to have alone (``sole-connection-for-container``);
    without it a random one is used. ``ssl_context`` verifies the router's
    certificate (default: the system's trust store). ``consumer_cache_size`` overrides the
    listener's consumer credit window. ``idle_timeout`` (seconds): a router silent for
    longer is taken as lost (the router keeps us alive by sending at half of it). The
    connection closes when the block ends.

    Raises:
        SecurityError: wrong user or password, or this host is not allowed.
        InvalidClientId: the client id is in use.
        ConnectionLost: the router could not be reached or closed the connection.
    """
    parts = urlsplit(url if "://" in url else f"amqp://{url}")
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r} (amqp or amqps)")
    host = parts.hostname or "localhost"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    user = user if user is not None else (unquote(parts.username) if parts.username else None)
    password = password if password is not None else (unquote(parts.password) if parts.password else None)
    try:
        with trio.fail_after(connect_timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as exc:
        raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from None
    try:
        with trio.fail_after(connect_timeout):
            if parts.scheme == "amqps":
                stream = trio.SSLStream(stream, ssl_context or ssl.create_default_context(), server_hostname=host)
                try:
                    await stream.do_handshake()
                except trio.BrokenResourceError as exc:
                    raise ConnectionLost(f"TLS handshake with {host}:{port} failed: {exc.__cause__ or exc}") from None
            remaining = await _authenticate(stream, user, password, host)
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        raise ConnectionLost(f"{host}:{port} did not finish TLS and SASL within {connect_timeout} s") from None
    except JMSError:
        await trio.aclose_forcefully(stream)
        raise
    engine = amqp.Connection(
        server=False,
        container_id=client_id or f"martinet-client:{uuid.uuid4()}",
        idle_timeout=idle_timeout,
        hostname=host,
    )
    if client_id:  # a JMS client id is the connection's alone, as Qpid JMS asks for it
        engine.desired_capabilities = [amqp.SOLE_CONNECTION_FOR_CONTAINER]
    engine.open()
    connection = Connection(stream, engine, consumer_cache_size=consumer_cache_size)
    try:
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_after(connect_timeout):
                    await nursery.start(connection.run, remaining)
            except trio.TooSlowError:
                raise ConnectionLost(f"{host}:{port} did not answer the AMQP open within {connect_timeout} s") from None
            try:
                yield connection
            finally:
                with trio.CancelScope(shield=True):
                    await connection.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # connection.run never raises once started: a lone error is the caller's own (or the
        # refusal of the connection) and is raised as itself, not wrapped by our nursery.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
