"""The JMS-shaped AMQP 1.0 client on trio: connections, sessions, producers, consumers.

Theory of operation
-------------------
A :class:`Connection` owns one socket and one client-mode AMQP engine (:mod:`..amqp`, the
engine the listener runs on; SASL before it is :class:`..sasl.SaslClient`) and runs two
tasks in the nursery of :func:`connect`: the reader feeds the socket's bytes to the engine
and handles its events, the writer sends what the engine has to send whenever an API call
or an event woke it. Everything runs in the caller's trio thread, so the engine needs no
lock. Per-message calls come straight from the engine to the link objects here
(``on_transfer``, ``on_outcome``).

Each JMS object maps onto AMQP as Qpid JMS maps it (``shared/reference/amqp-jms.md``):
a session is an AMQP session; a producer is a sender link (an anonymous one — null target,
routed by ``to`` — when it has no destination); a consumer is a receiver link whose credit
window is the consumer cache size; a durable subscriber's link is named after the
subscription and detaches (keeping it) when closed, and ``unsubscribe`` re-attaches with a
null source and closes; a browser is a receiver in distribution mode ``copy`` that drains;
a temporary queue or topic is a dynamic sender link kept open as the node's anchor; a
transacted session declares a transaction on a coordinator link when first needed and
sends and acknowledges in transactional state.

Waiting is explicit: an API call that needs the peer's answer (attach, persistent send,
commit) awaits an :class:`_Outcome` which the reader resolves; if the connection is lost,
every outstanding outcome fails with :class:`ConnectionLost`.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
import math
import ssl
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from ..codec import Described, Symbol, ULong, encode
from ..message import AMQP_VALUE, MessageError

from .. import amqp
from ..amqp import (
    ACCEPTED_CODE,
    DECLARE,
    DECLARED,
    DISCHARGE,
    MODIFIED,
    NO_LOCAL_FILTER,
    REJECTED,
    SELECTOR_FILTER,
    TRANSACTIONAL_STATE,
    Terminus,
)
from ..amqp.sasl import SaslClient, SaslError, SaslRefused
from ..io import Driver, PeerClosed, lead_in
from .messages import (
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

log = logging.getLogger(__name__)

__all__ = [
    "connect", "Connection", "Session", "Producer", "Consumer", "Browser", "Requestor", "AckMode",
    "JMSError", "SecurityError", "InvalidDestination", "InvalidClientId", "InvalidSelector",
    "TransactionRolledBack", "ConnectionLost",
]

CLOSE_TIMEOUT = 5.0
ATTACH_TIMEOUT = 30.0


class AckMode(enum.Enum):
    AUTO_ACKNOWLEDGE = "auto"
    CLIENT_ACKNOWLEDGE = "client"
    DUPS_OK_ACKNOWLEDGE = "dups-ok"


class JMSError(Exception):
    """The router refused something; ``condition`` is the AMQP error condition."""

    def __init__(self, description: str, condition: str = ""):
        super().__init__(f"{condition}: {description}" if condition else description)
        self.condition = condition
        self.description = description


class SecurityError(JMSError):
    """Login or access refused (``amqp:unauthorized-access``)."""


class InvalidDestination(JMSError):
    """No such queue, topic or durable subscription (``amqp:not-found``)."""


class InvalidClientId(JMSError):
    """The client id is in use by another connection."""


class InvalidSelector(JMSError):
    """The router could not parse the selector."""


class TransactionRolledBack(JMSError):
    """A commit failed; the transaction was rolled back."""


class ConnectionLost(JMSError):
    """The connection is closed or was lost; nothing more can be done on it."""


def _error(name: str | None, description: str | None, info: Any = None) -> JMSError:
    name, description = name or "", description or "refused"
    if name == "amqp:unauthorized-access":
        return SecurityError(description, name)
    if name == "amqp:not-found":
        return InvalidDestination(description, name)
    if name == "amqp:invalid-field" and info and "container-id" in str(info):
        return InvalidClientId(description, name)
    if name == "amqp:invalid-field" and "selector" in description:
        return InvalidSelector(description, name)
    if name == "amqp:transaction:rollback":
        return TransactionRolledBack(description, name)
    return JMSError(description, name)


def _condition_error(error: amqp.Error | None, fallback: str) -> JMSError:
    if error is None:
        return JMSError(fallback)
    return _error(error.condition, error.description, error.info)


def _delivery_error(state: Any) -> JMSError:
    """Why the router did not accept a message: a rejected outcome's error, else a plain refusal."""
    error = None
    if amqp.state_code(state) == REJECTED and isinstance(state.value, list) and state.value:
        error = amqp.Error.from_value(state.value[0])
    return _condition_error(error, "the router did not accept the message")


def _control(descriptor: int, fields: list) -> bytes:
    """A transaction controller's message [4.3]: ``declare`` or ``discharge`` as its amqp-value."""
    return encode(Described(ULong(AMQP_VALUE), Described(ULong(descriptor), fields)))


class _Outcome:
    """A result the peer will send: awaited by an API call, resolved by the reader."""

    __slots__ = ("_event", "value", "error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        if not self._event.is_set():
            self.value, self.error = value, error
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class _Attaching:
    """What ``session.consumer(...)`` and friends return: await it for the object, or use
    it as ``async with`` to close the object at the end of the block."""

    def __init__(self, make: Callable[[], Awaitable[Any]]):
        self._make = make
        self._made: Any = None

    def __await__(self) -> Any:
        return self._make().__await__()

    async def __aenter__(self) -> Any:
        self._made = await self._make()
        return self._made

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._made.close()


# -- links ---------------------------------------------------------------------------------------


class _Link:
    """Shared link bookkeeping: the attach outcome and the peer's detach."""

    def __init__(self, connection: Connection, link: amqp.Link):
        self.connection = connection
        self.link = link
        link.handler = self
        self.attached = _Outcome()
        self.error: JMSError | None = None  # why the peer detached, or the connection ended
        self.remote_error: amqp.Error | None = None  # the condition of the peer's detach
        self.changed = trio.Event()  # credit, arrival or detach
        self.detaching = False  # we asked for the detach

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def remote_detached(self, error: amqp.Error | None) -> None:
        self.remote_error = error
        self.error = _condition_error(error, "the router closed the link")
        self.attached.resolve(error=self.error)
        self.notify()

    def fail(self, error: JMSError) -> None:
        if self.error is None:
            self.error = error
        self.attached.resolve(error=error)
        self.notify()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def on_flow(self) -> None:
        self.notify()

    async def close(self, *, detach_only: bool = False) -> None:
        """Close (or only detach) the link; waits a bounded time for the peer's answer."""
        if self.error is not None or self.connection.lost is not None:
            return
        self.detaching = True
        self.link.detach(closed=not detach_only)
        self.connection.wake()
        with trio.move_on_after(CLOSE_TIMEOUT):
            while self.error is None:
                await self.changed.wait()
        self.connection.links.pop(self.link, None)


class _SenderLink(_Link):
    def __init__(self, connection: Connection, link: amqp.Link):
        super().__init__(connection, link)
        self.unsettled: dict[int, tuple[_Outcome, Callable[[_Outcome], None] | None]] = {}

    async def send(self, payload: bytes, *, state: Described | None = None,
                   on_outcome: Callable[[_Outcome], None] | None = None) -> _Outcome:
        """Send one message when there is credit (with a delivery ``state``: a transactional
        one); its outcome (accepted, or a :class:`JMSError`)."""
        while self.link.credit <= 0:
            self.check()
            await self.changed.wait()
        self.check()
        outcome = _Outcome()
        self.unsettled[self.link.send(payload, False, state)] = (outcome, on_outcome)
        self.connection.wake()
        return outcome

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        """The router's disposition: accepted (or declared: the value is its fields), else an error."""
        outcome, callback = self.unsettled.pop(delivery_id, (None, None))
        if outcome is not None:
            code = amqp.state_code(state)
            if code == TRANSACTIONAL_STATE:  # transactional-state(txn-id, outcome) [4.5.5]
                inner = state.value[1] if isinstance(state.value, list) and len(state.value) > 1 else None
                code, state = (amqp.state_code(inner), inner) if inner is not None else (ACCEPTED_CODE, None)
            if code == ACCEPTED_CODE:
                outcome.resolve()
            elif code == DECLARED and isinstance(state.value, list) and state.value:
                outcome.resolve(state.value)
            else:
                outcome.resolve(error=_delivery_error(state))
            if callback is not None:
                callback(outcome)
        if not settled:
            self.link.settle(delivery_id)

    def fail(self, error: JMSError) -> None:
        super().fail(error)
        for outcome, callback in self.unsettled.values():
            outcome.resolve(error=error)
            if callback is not None:
                callback(outcome)
        self.unsettled.clear()


class _ReceiverLink(_Link):
    def __init__(self, connection: Connection, link: amqp.Link, window: int):
        super().__init__(connection, link)
        self.window = window
        self.buffer: deque[tuple[int | None, bytes]] = deque()  # (delivery id, None if settled; the message)

    def on_transfer(self, delivery_id: int, payload: bytes, settled: bool, state: Any) -> None:
        self.buffer.append((None if settled else delivery_id, payload))
        self.notify()

    def top_up(self) -> None:
        """Keep credit + buffered near the window (refill once below half of it)."""
        wanted = self.window - self.link.credit - len(self.buffer)
        if wanted >= max(1, self.window // 2) and self.error is None:
            self.link.flow(self.link.credit + wanted)
            self.connection.wake()

    async def next(self, deadline: float) -> tuple[int | None, bytes] | None:
        """The next delivery, or None at the deadline."""
        with trio.move_on_at(deadline):
            while not self.buffer:
                self.check()
                self.connection.check()
                await self.changed.wait()
        if not self.buffer:
            return None
        item = self.buffer.popleft()
        self.top_up()
        return item

    def settle(self, delivery_id: int | None, state: Described) -> None:
        """Settle an incoming message with ``state`` (nothing for one the router sent settled)."""
        if delivery_id is not None and self.error is None and self.connection.lost is None:
            self.link.settle(delivery_id, state)
            self.connection.wake()

    def release_buffered(self) -> None:
        """Give prefetched messages back (recover and rollback redeliver in order)."""
        while self.buffer:
            delivery_id, _ = self.buffer.popleft()
            self.settle(delivery_id, amqp.RELEASED)


# -- connection ----------------------------------------------------------------------------------


class Connection:
    """One AMQP connection to a router. Made by :func:`connect`; not used across threads."""

    def __init__(self, stream: trio.abc.Stream, engine: amqp.Connection, *, consumer_cache_size: int | None):
        self._stream = stream
        self.engine = engine
        self.links: dict[amqp.Link, _Link] = {}
        self._opening: list[Any] = []  # outcomes of opens and attaches in the batch being handled
        self.lost: JMSError | None = None
        self._opened = _Outcome()
        self._ended = trio.Event()
        self._driver = Driver(stream, engine, on_input=self._handle_events)
        self._names = itertools.count(1)
        self._temporary: dict[str, _SenderLink] = {}
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

    def session(self, *, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO_ACKNOWLEDGE) -> _Attaching:
        """A new session (``await`` it, or ``async with``)."""

        async def make() -> Session:
            self.check()
            session = Session(self, transacted, ack_mode)
            if transacted:
                await session._attach_coordinator()
            return session

        return _Attaching(make)

    async def close(self) -> None:
        """Close the connection (temporary destinations go with it); bounded wait for the router."""
        if self.lost is None:
            self.engine.close()
            self.wake()
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._ended.wait()
        self._fail(ConnectionLost("the connection is closed"))

    # -- tasks ------------------------------------------------------------------------------------

    async def run(self, remaining: bytes = b"", *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read and write until the connection ends; started once the router's open arrived.
        ``remaining``: what the router sent after SASL.

        Raises (before started): the :class:`JMSError` that refused the connection.
        Never raises after it started: a lost connection fails the outstanding calls instead.
        """
        started = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drive, remaining)
                await self._opened.wait()
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
        await self._driver.run(remaining)
        self._fail(ConnectionLost("the router closed the connection"))

    def _fail(self, error: JMSError) -> None:
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
        error = _condition_error(event.error, "the router closed the connection")
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

    async def attach(self, state: _Link) -> None:
        """Attach the link and wait for the router's answer (raises its refusal)."""
        self.check()
        self.links[state.link] = state
        state.link.attach()
        self.wake()
        with trio.move_on_after(ATTACH_TIMEOUT):
            return await state.attached.wait()
        raise JMSError(f"the router did not answer the attach of link {state.link.name} in {ATTACH_TIMEOUT} s")

    async def create_temporary(self, session: amqp.Session, topic: bool) -> Destination:
        link = _sender(session, self.name("temporary"), Terminus(
            kind=amqp.TARGET, dynamic=True, capabilities=["temporary-topic" if topic else "temporary-queue"]))
        state = _SenderLink(self, link)
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


def _sender(session: amqp.Session, name: str, target: Terminus) -> amqp.Link:
    link = session.link(name, sender=True)
    link.source, link.target = Terminus(kind=amqp.SOURCE), target
    return link


def _receiver(session: amqp.Session, name: str, source: Terminus | None) -> amqp.Link:
    link = session.link(name, sender=False)
    link.source, link.target = source, Terminus(kind=amqp.TARGET)
    return link


async def _authenticate(stream: trio.abc.Stream, user: str | None, password: str | None, host: str) -> bytes:
    """SASL in front of the engine (PLAIN with a user, else ANONYMOUS); what the router sent after it.

    Raises:
        SecurityError: the router refused the login.
        ConnectionLost: the router broke the exchange or closed the connection.
    """
    try:
        return await lead_in(stream, SaslClient(user, password, host))
    except SaslRefused:
        raise SecurityError("login refused (wrong user or password, or host not allowed)",
                            "amqp:unauthorized-access") from None
    except SaslError as exc:
        raise ConnectionLost(f"SASL with the router failed: {exc}") from None
    except PeerClosed:
        raise ConnectionLost("the router closed the connection during the SASL exchange") from None
    except (trio.BrokenResourceError, OSError) as exc:
        raise ConnectionLost(f"connection lost during the SASL exchange: {exc}") from None


@contextlib.asynccontextmanager
async def connect(url: str = "amqp://localhost:5672", *, client_id: str | None = None, user: str | None = None,
                  password: str | None = None, ssl_context: ssl.SSLContext | None = None,
                  consumer_cache_size: int | None = None, idle_timeout: float = 60.0,
                  connect_timeout: float = 30.0) -> AsyncIterator[Connection]:
    """Connect to a router: ``amqp://[user:password@]host[:port]`` or ``amqps://`` for TLS.

    ``client_id`` is the JMS client id (the AMQP container id; durable subscriptions need
    one); without it a random one is used. ``ssl_context`` verifies the router's
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
                    raise ConnectionLost(f"TLS handshake with {host}:{port} failed: {exc.__cause__ or exc}") \
                        from None
            remaining = await _authenticate(stream, user, password, host)
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        raise ConnectionLost(f"{host}:{port} did not finish TLS and SASL within {connect_timeout} s") from None
    except JMSError:
        await trio.aclose_forcefully(stream)
        raise
    engine = amqp.Connection(server=False, container_id=client_id or f"martinet-client:{uuid.uuid4()}",
                             idle_timeout=idle_timeout, hostname=host)
    engine.open()
    connection = Connection(stream, engine, consumer_cache_size=consumer_cache_size)
    try:
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_after(connect_timeout):
                    await nursery.start(connection.run, remaining)
            except trio.TooSlowError:
                raise ConnectionLost(f"{host}:{port} did not answer the AMQP open within {connect_timeout} s") \
                    from None
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


# -- sessions ------------------------------------------------------------------------------------


class Session:
    """A JMS session: transacted, or acknowledging in one of the :class:`AckMode` modes."""

    def __init__(self, connection: Connection, transacted: bool, ack_mode: AckMode):
        self.connection = connection
        self.transacted = transacted
        self.ack_mode = ack_mode
        self._session = connection.engine.session()
        self._consumers: list[Consumer] = []
        self._unacknowledged: list[tuple[_ReceiverLink, int | None]] = []
        self._coordinator: _SenderLink | None = None
        self._txn_id: bytes | None = None
        self._txn_failure: JMSError | None = None
        self._declaring: _Outcome | None = None
        self._closed = False
        connection.wake()

    async def _attach_coordinator(self) -> None:
        link = _sender(self._session, self.connection.name("txn"),
                       Terminus(kind=amqp.COORDINATOR, capabilities=["amqp:local-transactions"]))
        self._coordinator = _SenderLink(self.connection, link)
        await self.connection.attach(self._coordinator)

    async def _transaction(self) -> bytes:
        """The current transaction's id, declared when first needed."""
        while self._txn_id is None:
            if self._declaring is None:
                assert self._coordinator is not None
                self._declaring = _Outcome()
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

    def producer(self, destination: Destination | None = None, *, delivery_mode: DeliveryMode | None = None,
                 priority: int | None = None, ttl: int | None = None) -> _Attaching:
        """A producer for ``destination``, or an anonymous one (destination per send).

        Defaults not given come from the listener's connection-factory settings.
        """

        async def make() -> Producer:
            self._check()
            link = _sender(self._session, self.connection.name("sender"), _terminus(amqp.TARGET, destination))
            producer = Producer(self, _SenderLink(self.connection, link), destination, delivery_mode, priority, ttl)
            await self.connection.attach(producer._link)
            return producer

        return _Attaching(make)

    def consumer(self, destination: Destination, *, selector: str | None = None,
                 no_local: bool = False) -> _Attaching:
        """A consumer of a queue or a (non-durable) topic subscriber.

        Raises (when awaited): InvalidDestination, InvalidSelector, SecurityError, JMSError.
        """
        return _Attaching(lambda: self._consumer(self.connection.name("receiver"), destination, selector,
                                                 no_local, durable=False))

    def durable_subscriber(self, topic: Topic, name: str, *, selector: str | None = None,
                           no_local: bool = False) -> _Attaching:
        """A durable subscriber: the subscription ``name`` of this client id keeps messages
        while no subscriber is connected. Closing it keeps the subscription; see
        :meth:`unsubscribe`. Same parameters resume it; others replace it."""
        return _Attaching(lambda: self._consumer(name, topic, selector, no_local, durable=True))

    async def _consumer(self, name: str, destination: Destination, selector: str | None, no_local: bool,
                        *, durable: bool) -> Consumer:
        self._check()
        source = _terminus(amqp.SOURCE, destination, selector, no_local)
        if durable:
            source.durable, source.expiry_policy = 2, "never"  # unsettled-state, kept while detached
        link = _receiver(self._session, name, source)
        state = _ReceiverLink(self.connection, link, self.connection.consumer_cache_size)
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
        link = _receiver(self._session, name, None)  # a null source: look the subscription up
        state = _ReceiverLink(self.connection, link, 0)
        await self.connection.attach(state)
        await state.close()
        if state.error is not None and state.remote_error is not None:
            raise state.error

    def browser(self, queue: Queue, *, selector: str | None = None) -> _Attaching:
        """A browser: iterate copies of what the queue holds, without consuming."""

        async def make() -> Browser:
            self._check()
            source = _terminus(amqp.SOURCE, queue, selector)
            source.distribution_mode = "copy"
            link = _receiver(self._session, self.connection.name("browser"), source)
            state = _ReceiverLink(self.connection, link, self.connection.consumer_cache_size)
            await self.connection.attach(state)
            return Browser(state)

        return _Attaching(make)

    async def create_temporary_queue(self) -> TemporaryQueue:
        """A queue that lives until the connection closes (or :meth:`delete_temporary`)."""
        self._check()
        return await self.connection.create_temporary(self._session, topic=False)  # type: ignore[return-value]

    async def create_temporary_topic(self) -> TemporaryTopic:
        self._check()
        return await self.connection.create_temporary(self._session, topic=True)  # type: ignore[return-value]

    async def delete_temporary(self, destination: Destination) -> None:
        await self.connection.delete_temporary(destination)

    def requestor(self, destination: Destination) -> _Attaching:
        """A :class:`Requestor`: send requests to ``destination`` and await their replies."""

        async def make() -> Requestor:
            reply_to = await self.create_temporary_queue()
            producer = await self.producer(destination)
            consumer = await self.consumer(reply_to)
            return Requestor(self, producer, consumer, reply_to)

        return _Attaching(make)

    # -- acknowledgement and transactions -----------------------------------------------------

    async def _delivered(self, link: _ReceiverLink, delivery_id: int | None, message: Message) -> None:
        """Acknowledge per the session's mode what a consumer just handed to the application."""
        if self.transacted:
            txn_id = await self._transaction()
            link.settle(delivery_id, amqp.outcome(TRANSACTIONAL_STATE, txn_id, amqp.ACCEPTED))
        elif self.ack_mode is AckMode.CLIENT_ACKNOWLEDGE:
            self._unacknowledged.append((link, delivery_id))
            message._acknowledge = self.acknowledge
        else:
            link.settle(delivery_id, amqp.ACCEPTED)

    async def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message delivered so far in this session."""
        self._check()
        for link, delivery_id in self._unacknowledged:
            link.settle(delivery_id, amqp.ACCEPTED)
        self._unacknowledged.clear()

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


def _terminus(kind: int, destination: Destination | None, selector: str | None = None,
              no_local: bool = False) -> Terminus:
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

    def __init__(self, session: Session, link: _SenderLink, destination: Destination | None,
                 delivery_mode: DeliveryMode | None, priority: int | None, ttl: int | None):
        self.session = session
        self._link = link
        self.destination = destination
        defaults = session.connection.defaults
        self.delivery_mode = delivery_mode or DeliveryMode(defaults.get("martinet:default-delivery-mode",
                                                                        "persistent"))
        self.priority = int(defaults.get("martinet:default-priority", 4)) if priority is None else priority
        self.ttl = int(defaults.get("martinet:default-ttl", 0)) if ttl is None else ttl
        self._failure: JMSError | None = None

    async def send(self, message: Message, destination: Destination | None = None, *,
                   delivery_mode: DeliveryMode | None = None, priority: int | None = None,
                   ttl: int | None = None) -> None:
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
        payload = message.encode(message_id=new_message_id(), destination=destination, delivery_mode=mode,
                                 priority=priority, ttl=self.ttl if ttl is None else ttl, now_ms=now_ms())
        txn_id = await session._transaction() if session.transacted else None
        wait = mode is DeliveryMode.PERSISTENT and txn_id is None
        state = amqp.outcome(TRANSACTIONAL_STATE, txn_id) if txn_id is not None else None
        outcome = await self._link.send(payload, state=state, on_outcome=None if wait else self._remember)
        if wait:
            await outcome.wait()

    def _remember(self, outcome: _Outcome) -> None:
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

    def __init__(self, session: Session, link: _ReceiverLink, destination: Destination, *, durable: bool):
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
                self._link.settle(delivery, amqp.outcome(REJECTED))
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

    def __init__(self, link: _ReceiverLink):
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
            reply = await self._consumer.receive(max(0.0, deadline - trio.current_time())
                                                 if timeout is not None else None)
            if reply is None or reply.correlation_id == message.message_id:
                return reply
            log.info("reply %s to an earlier request dropped", reply.message_id)

    async def close(self) -> None:
        await self._consumer.close()
        await self._producer.close()
        await self.session.delete_temporary(self.reply_to)
