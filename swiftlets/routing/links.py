"""One routing link on a socket: the stage machine (:mod:`.stages`) under the trio driver.

Theory of operation
-------------------
A :class:`Link` is made for every accepted socket (listener side) and every connection a
connector opened. It puts a :class:`~.stages.LinkMachine` of its role on the stream with
:class:`messaging.io.Driver` — one task reads (and ticks the machine's timers: stage
validity, keepalive, the delay before a refused link is closed), one writes — and turns the
machine's events into calls on its owner, the :class:`LinkOwner` (the swiftlet):

- ``PeerIdentified``: the owner decides admission (a router is connected once; of two
  links dialled at the same moment one survives); the machine is told ``admit()`` or
  ``refuse(reason)``;
- ``Operational``: the link enters the delivery stage; the owner gives it to the route
  exchanger, whose announcements come back through :meth:`Link.send_route`;
- ``RouteReceived``: handed to the owner;
- ``Closed``: the reason is kept as the link's error (when it is a failure);
- the recovery and transfer events: handed to the owner (``transfer_event``), whose work
  for them runs in the link's nursery (:meth:`Link.start_soon`).

The link is over when the machine ends its output, the peer closes, or the socket breaks;
:meth:`Link.run` then returns (it raises only on cancellation) and the owner is told in
``link_gone`` whatever happened, exactly once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from martinet.kernel import SwiftletContext
from martinet.messaging.io import Driver

from .api import LinkState
from .config import ConnectorConfig, ListenerConfig
from .exchange import Announcement
from .stages import (
    Closed,
    LinkMachine,
    LinkSettings,
    Operational,
    PeerIdentified,
    Role,
    RouteReceived,
)

__all__ = ["HandshakeThrottle", "Link", "LinkOwner", "LinkStarter", "configure_socket", "describe", "stamp"]

CLOSE_TIMEOUT = 2.0  # seconds a closing link may take to write its CLOSE before the socket goes


class LinkOwner(Protocol):
    def admission(self, link: Link, peer: str) -> str | None:
        """None to admit ``link`` to ``peer``, else the reason to refuse it."""

    def link_up(self, link: Link) -> None: ...

    def route_received(self, link: Link, announcement: Announcement) -> None: ...

    def link_state(self, link: Link) -> None:
        """``link.state`` (or its error) changed."""

    def transfer_event(self, link: Link, event: Any) -> None:
        """A recovery or transfer event of the link's machine."""

    def link_gone(self, link: Link) -> None:
        """The link ended; called once, also when it never got far."""


#: Makes the settings of a link from its listener's or connector's config.
SettingsOf = Callable[[ListenerConfig | ConnectorConfig], LinkSettings]


class LinkStarter:
    """What starts links, a listener's or a connector's side: the swiftlet's ``context``, the
    links' ``owner``, the :class:`LinkSettings` that ``settings(config)`` makes of a listener's
    or connector's config, and the ``nursery`` they run in (set while the swiftlet runs)."""

    def __init__(self, context: SwiftletContext, owner: LinkOwner, settings: SettingsOf):
        self.context = context
        self.nursery: trio.Nursery | None = None
        self._owner = owner
        self._settings = settings

    def new_link(
        self, stream: trio.abc.Stream, config: ListenerConfig | ConnectorConfig, *, role: Role, name: str, address: str
    ) -> Link:
        """A link on ``stream`` (its socket options set from ``config``) with ``config``'s
        password and settings."""
        configure_socket(
            stream,
            no_delay=config.use_tcp_no_delay,
            receive_buffer=config.router_input_buffer_size,
            send_buffer=config.router_output_buffer_size,
        )
        return Link(
            self._owner,
            stream,
            role=role,
            name=name,
            address=address,
            local=self.context.router_name,
            password=config.password,
            settings=self._settings(config),
        )


def stamp(seconds: float | None) -> str:
    """A time in usage: local, to the second ("" for none)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else ""


def describe(exc: BaseException) -> str:
    """An I/O error in words: trio's BrokenResourceError says nothing, its cause (an SSL or
    socket error) does."""
    return str(exc) or str(exc.__cause__ or "") or type(exc).__name__


def configure_socket(stream: trio.abc.Stream, *, no_delay: bool, receive_buffer: int, send_buffer: int) -> None:
    """Apply a listener's or connector's socket options (best effort: a closed socket is left)."""
    transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    assert isinstance(transport, trio.SocketStream)
    try:
        transport.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, no_delay)
        # 0 leaves a buffer to the kernel: Linux grows it with the connection's bandwidth-delay
        # product, and a size set here would stop that (a link across sites needs megabytes)
        if receive_buffer:
            transport.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        if send_buffer:
            transport.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    except OSError:
        pass


class Link:
    """A routing link of either role, from socket to close.

    Attributes (read by the owner and shown in usage):
        name: the usage name, ``connector:<name>`` or ``listener:<name>:<n>``.
        address: the peer's ``host:port``.
        peer: the remote router once identified.
        state: CONNECTING, then OPERATIONAL; FAILED or CLOSED at the end.
        error: why it failed or closed, when it did not end cleanly.
        operational: the machine's Operational event once in the delivery stage.
    """

    def __init__(
        self,
        owner: LinkOwner,
        stream: trio.abc.Stream,
        *,
        role: Role,
        name: str,
        address: str,
        local: str,
        password: str,
        settings: LinkSettings,
    ):
        self.owner = owner
        self.stream = stream
        self.name = name
        self.address = address
        self.role = role
        self.peer: str | None = None
        self.state = LinkState.CONNECTING
        self.error: str | None = None
        self.error_time: float | None = None
        self.connect_time = time.time()
        self.operational: Operational | None = None
        self.routes_sent = self.routes_received = 0
        self.machine = LinkMachine(role, local, password or None, settings, now=trio.current_time())
        self._driver = Driver(stream, self.machine, on_input=self._on_input)
        self._gone = False

    @property
    def connector_side(self) -> str | None:
        """The router that dialled this link (known once the peer is identified)."""
        return self.machine.name if self.role is Role.CONNECTOR else self.peer

    def send_route(self, announcement: Announcement) -> bool:
        """Queue an announcement to the peer; False when the link is ending (it is dropped)."""
        if not self.machine.send_route(
            add=announcement.add, destination=announcement.destination, path=(self.machine.name, *announcement.path)
        ):
            return False
        self.routes_sent += 1
        self._driver.wake()
        return True

    def wake(self) -> None:
        """Output may be waiting in the machine: have the writer look."""
        self._driver.wake()

    def flush(self) -> None:
        """Write what the machine has now, without waiting (:meth:`messaging.io.Driver.flush`):
        for a task about to wait after it queued answers."""
        self._driver.flush()

    def start_soon(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` in the link's nursery: it ends with the link."""
        self._driver.start_soon(function, *args)

    def close(self, reason: str) -> None:
        """Close the link with ``reason`` sent to the peer (idempotent). The link is failed
        even when the machine has finished already (the peer's CLOSE read with what made us
        close): the events read with it, a ROUTE or a TRANSACTION, are then not taken."""
        if not self.machine.finished:
            self.machine.close(reason)
            self._driver.wake()
        self._fail(reason)

    async def run(self) -> None:
        """Run the link until it is over; the socket is closed on return.

        Raises: only cancellation (a broken socket or a protocol error ends the link with
        its error recorded).
        """
        try:
            await self._driver.run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            exc = group.exceptions[0]
            self._fail(f"connection lost: {describe(exc)}")
        finally:
            if self.state is not LinkState.FAILED:
                self.state = LinkState.CLOSED
                if self.error is None and self.operational is not None:
                    self._fail("connection closed")
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await self.stream.aclose()
            if not self._gone:
                self._gone = True
                self.owner.link_gone(self)

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error, self.error_time = reason, time.time()
            self.state = LinkState.FAILED if self.operational is None else LinkState.CLOSED
            self.owner.link_state(self)

    def _on_input(self) -> None:
        # an answer may cause more events at once (admit() reads what the peer sent meanwhile)
        while events := self.machine.events():
            for event in events:
                if isinstance(event, RouteReceived):
                    if self.error is not None:  # closed (e.g. for a bad announcement) while handling this read
                        continue
                    # on the wire a path starts with its sender; the exchanger takes the sender's own path
                    self.routes_received += 1
                    self.owner.route_received(self, Announcement(event.add, event.destination, event.path[1:]))
                elif isinstance(event, PeerIdentified):
                    self.peer = event.peer
                    reason = self.owner.admission(self, event.peer)
                    if reason is None:
                        self.machine.admit()
                    else:
                        self.machine.refuse(reason)
                        self._fail(f"refused: {reason}")
                elif isinstance(event, Operational):
                    if event.unresolved:
                        # A router commits in recovery every xid its receiver lists (the
                        # recovery table). One that does not would leave them in doubt here,
                        # then prepare more, connection after connection, with nothing ever
                        # resolving them: its link stays closed while they are in doubt
                        # (an operator commits or rolls them back on /sys$xa/usage/in-doubt).
                        self.close(
                            f"{self.peer} did not commit {len(event.unresolved)} of its transactions listed in "
                            f"recovery (a router commits every one): they stay in doubt here, and its link stays "
                            f"closed until an operator resolves them"
                        )
                        continue
                    self.operational = event
                    self.state = LinkState.OPERATIONAL
                    self.owner.link_state(self)
                    self.owner.link_up(self)
                elif isinstance(event, Closed):
                    by_peer = event.by_peer and not event.reason.startswith("the peer")
                    self._fail(f"closed by {self.peer or 'the peer'}: {event.reason}" if by_peer else event.reason)
                else:  # the transfer's: recovery, transactions
                    self.owner.transfer_event(self, event)


class HandshakeThrottle:
    """Handshakes on the routing listeners, throttled per address as the AMQP listener
    throttles logins: a listener link whose handshake failed on its password is a failure of
    its address (garbage and other refusals cost a guesser nothing to learn, and are refused
    at once); the next handshake from there
    starts after a delay that doubles with each failure in a row from :data:`FIRST_DELAY`
    up to :data:`MAX_DELAY` (forgotten after :data:`QUIET_PERIOD` without one), and a
    connection beyond :data:`MAX_PENDING` handshakes under way from one address is closed at
    once, so that parallel connections cannot guess side by side. Times are the caller's
    (``trio.current_time()``)."""

    FIRST_DELAY = 0.1
    MAX_DELAY = 4.0
    QUIET_PERIOD = 60.0
    MAX_PENDING = 4
    HOSTS = 4096  # addresses remembered; the quietest are forgotten beyond that

    def __init__(self) -> None:
        self._failures: dict[str, tuple[int, float]] = {}  # host → (failures in a row, time of the last)

    def delay(self, host: str, now: float) -> float:
        """Seconds the next handshake from ``host`` waits before it starts."""
        count, last = self._failures.get(host, (0, 0.0))
        if not count or now - last >= self.QUIET_PERIOD:
            return 0.0
        return min(self.FIRST_DELAY * 2 ** (count - 1), self.MAX_DELAY)

    def ended(self, host: str, now: float, *, operational: bool, wrong_password: bool) -> None:
        """A link from ``host`` ended: ``operational``, it got through its handshake (which
        clears the address); ``wrong_password``, its handshake failed on the password (one
        more failure). Anything else changes nothing."""
        if operational:
            self._failures.pop(host, None)
        if not wrong_password:
            return
        count, last = self._failures.get(host, (0, now))
        if host not in self._failures and len(self._failures) >= self.HOSTS:
            for old in sorted(self._failures, key=lambda key: self._failures[key][1])[: self.HOSTS // 4]:
                del self._failures[old]
        self._failures[host] = (0 if now - last >= self.QUIET_PERIOD else count) + 1, now
