"""The AMQP 1.0 connection engine (OASIS AMQP 1.0 part 2), in Python, sans-IO.

Theory of operation
-------------------
One :class:`Connection` per socket, after SASL: bytes in with :meth:`Connection.receive_data`,
bytes out with :meth:`Connection.data_to_send` (``None`` once the connection is over), time
with :meth:`Connection.tick`. It keeps the connection, session and link state of part 2:
the open/close handshake and idle timeout [2.4], sessions with their transfer windows
[2.5.6], links with credit, drain and delivery counts [2.6.7], deliveries and their
settlement [2.6.12], multi-frame transfers and the peer's max frame size.

What happens arrives two ways:

- the rare things (open, begin, attach, detach, end, close, a link's credit changing) as
  event objects in :attr:`Connection.events`, which the owner empties
  (:meth:`Connection.dispatch`);
- the per-message things straight to the link's ``handler`` (set by the owner at attach):
  ``handler.on_transfer(delivery_id, payload, settled, state)`` for each complete incoming
  message, ``handler.on_outcome(delivery_id, state, settled)`` for each delivery a peer's
  disposition names. No object is made per message.

Why Python and not proton's C engine: driving proton through cffi costs some twenty
C crossings and two collector events per message, while a 64 KiB read here is one loop
over ~400 frames, an outgoing transfer is one ``struct.pack`` and a consumer's ranged
disposition settles a whole range in one go (``shared/reference/amqp-engine.md`` §2).
Transfers have a decoding fast path for the usual encodings; anything else goes through
the general codec. proton stays the test oracle: every real client in the tests is one.

A peer that breaks the protocol gets a ``close`` with the AMQP error (``amqp:decode-error``,
``amqp:connection:framing-error``, ``amqp:not-allowed``, …) and the connection ends; the
:class:`ConnectionClosed` event says why. The transitions of the connection state [2.4.6]
are :data:`TRANSITIONS`.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from typing import Any

import attrs

from ..codec import DecodeError, Described, UByte, UInt, ULong, UShort, decode, encode
from .wire import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    CLOSE,
    COORDINATOR,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    MASK,
    MIN_MAX_FRAME_SIZE,
    OPEN,
    SOURCE,
    TRANSFER,
    Error,
    ProtocolError,
    RemoteProtocolError,
    Terminus,
    descriptor_code,
    symbol_array,
    symbols,
)
from .wire import FRAME_HEADER as _FRAME

__all__ = [
    "Connection", "Session", "Link", "ConnectionOpened", "ConnectionClosed", "SessionBegun", "SessionEnded",
    "LinkAttached", "LinkDetached", "LinkFlow", "ConnectionState",
]

INCOMING_WINDOW = 0x7FFFFFFF  # transfer frames we take before a session flow reopens the window

def _check_frame_header(size: int, doff: int, kind: int, limit: int) -> None:
    """Raises unless a frame header that is not the usual one is still valid."""
    if size > limit or size < 8 or doff < 2 or doff * 4 > size:
        raise RemoteProtocolError("amqp:connection:framing-error",
                            f"bad frame header (size {size}, data offset {doff}; max frame size {limit})")
    if kind != 0:
        raise RemoteProtocolError("amqp:connection:framing-error", f"frame type {kind} is not AMQP")


def _transfer_tails() -> dict[bytes, tuple[bool, bool]]:
    """The usual encodings of a transfer's fields after the delivery tag — message-format 0,
    settled, more, rcv-settle-mode — mapped to (settled, more)."""
    flags = {b"\x40": False, b"\x41": True, b"\x42": False}
    tails = {b"": (False, False)}
    for fmt in (b"\x43", b"\x40", b"\x52\x00", b"\x70\x00\x00\x00\x00"):
        tails[fmt] = (False, False)
        for settled_code, settled in flags.items():
            tails[fmt + settled_code] = (settled, False)
            for more_code, more in flags.items():
                tails[fmt + settled_code + more_code] = (settled, more)
                for mode in (b"\x40", b"\x50\x00", b"\x50\x01"):
                    tails[fmt + settled_code + more_code + mode] = (settled, more)
    return tails


_TRANSFER_TAILS = _transfer_tails()
_U32 = struct.Struct(">I")
# A transfer as we send it: frame header, descriptor, list8 of handle, delivery-id, delivery-tag
# (the 4-byte delivery-id), message-format 0 and settled; the payload follows.
_TRANSFER = struct.Struct(">I16sI2sI2s")  # size, the link's head (see Link.send), id, tag header, tag, the rest
_TRANSFER_FIRST = struct.Struct(">3sBBBBIBIBBIBBB")  # the first frame of several: with more=true
_TRANSFER_NEXT = struct.Struct(">3sBBBBIBBBBB")  # the following ones: handle and more


# What the fields of each performative must be when present (a peer's wrong type closes the
# connection with amqp:decode-error instead of reaching our state): index → (kind, largest).
_UINT, _USHORT, _UBYTE = (int, MASK), (int, 0xFFFF), (int, 0xFF)
_FIELDS = {
    OPEN: ("open", {0: (str, 0), 1: (str, 0), 2: _UINT, 3: _USHORT, 4: _UINT}),
    BEGIN: ("begin", {0: _USHORT, 1: _UINT, 2: _UINT, 3: _UINT, 4: _UINT}),
    ATTACH: ("attach", {0: (str, 0), 1: _UINT, 2: (bool, 0), 3: _UBYTE, 4: _UBYTE, 9: _UINT,
                        10: (int, 2**64 - 1)}),
    FLOW: ("flow", {0: _UINT, 1: _UINT, 2: _UINT, 3: _UINT, 4: _UINT, 5: _UINT, 6: _UINT, 7: _UINT,
                    8: (bool, 0), 9: (bool, 0)}),
    TRANSFER: ("transfer", {0: _UINT, 1: _UINT, 2: (bytes, 0), 3: _UINT, 4: (bool, 0), 5: (bool, 0), 6: _UBYTE,
                            8: (bool, 0), 9: (bool, 0), 10: (bool, 0)}),
    DISPOSITION: ("disposition", {0: (bool, 0), 1: _UINT, 2: _UINT, 3: (bool, 0), 5: (bool, 0)}),
    DETACH: ("detach", {0: _UINT, 1: (bool, 0)}),
    END: ("end", {}),
    CLOSE: ("close", {}),
}


def _check_fields(code: int, fields: list) -> None:
    """Raises ProtocolError unless each present field of the performative has its type."""
    name, kinds = _FIELDS[code]
    for index, (kind, largest) in kinds.items():
        if index < len(fields) and (value := fields[index]) is not None:
            if type(value) is not kind and not (kind is str and isinstance(value, str)) or \
                    kind is int and not 0 <= value <= largest:
                raise RemoteProtocolError("amqp:decode-error", f"{name} field {index} is {value!r}"[:200])


# -- events (the rare ones; per-message work goes to the link handlers) ---------------------

@attrs.frozen
class ConnectionOpened:
    """The peer's ``open`` arrived (its fields are on the connection); answer with
    :meth:`Connection.open` (a server) — or :meth:`Connection.close` to refuse."""


@attrs.frozen
class ConnectionClosed:
    """The connection is over: the peer closed it (``by_peer``) or broke the protocol."""

    error: Error | None
    by_peer: bool


@attrs.frozen
class SessionBegun:
    session: Session


@attrs.frozen
class SessionEnded:
    session: Session
    error: Error | None


@attrs.frozen
class LinkAttached:
    """The peer attached: a new link to answer (:meth:`Link.attach`, or refuse by attaching
    with a null terminus and detaching), or the answer to our own attach."""

    link: Link


@attrs.frozen
class LinkDetached:
    """The peer detached (``closed``: for good), or its session ended under the link, or we
    detached it for the peer's error on it (a message above its max-message-size; ``error``
    says which, and the link is closed on our side already)."""

    link: Link
    closed: bool
    error: Error | None


@attrs.frozen
class LinkFlow:
    """The peer's flow changed a link's credit or drain (or echoed a drain back)."""

    link: Link


# -- the connection state machine [2.4.6] ---------------------------------------------------

class ConnectionState(enum.Enum):
    START = "awaiting the protocol header"
    HDR_EXCH = "header exchanged"
    OPEN_PIPE = "open sent before the peer's header"
    CLOSE_PIPE = "open and close sent before the peer's header"
    OPEN_RCVD = "open received"
    OPEN_SENT = "open sent"
    OPENED = "opened"
    CLOSE_RCVD = "close received"
    CLOSE_SENT = "close sent"
    END = "ended"


class ConnectionInput(enum.Enum):
    HEADER = "the protocol header"
    OPEN_IN = "open received"
    OPEN_OUT = "open sent"
    CLOSE_IN = "close received"
    CLOSE_OUT = "close sent"


# (state, input) -> next state; a missing pair from the peer is a protocol error. We send
# our header at once, so there is no separate header-sent state; a client opens (and may
# close) before the peer's header arrives, through the pipelined states.
TRANSITIONS = {
    (ConnectionState.START, ConnectionInput.HEADER): ConnectionState.HDR_EXCH,
    (ConnectionState.START, ConnectionInput.OPEN_OUT): ConnectionState.OPEN_PIPE,
    (ConnectionState.OPEN_PIPE, ConnectionInput.HEADER): ConnectionState.OPEN_SENT,
    (ConnectionState.OPEN_PIPE, ConnectionInput.CLOSE_OUT): ConnectionState.CLOSE_PIPE,
    (ConnectionState.CLOSE_PIPE, ConnectionInput.HEADER): ConnectionState.CLOSE_SENT,
    (ConnectionState.HDR_EXCH, ConnectionInput.OPEN_IN): ConnectionState.OPEN_RCVD,
    (ConnectionState.HDR_EXCH, ConnectionInput.OPEN_OUT): ConnectionState.OPEN_SENT,
    (ConnectionState.OPEN_RCVD, ConnectionInput.OPEN_OUT): ConnectionState.OPENED,
    (ConnectionState.OPEN_SENT, ConnectionInput.OPEN_IN): ConnectionState.OPENED,
    (ConnectionState.OPENED, ConnectionInput.CLOSE_IN): ConnectionState.CLOSE_RCVD,
    (ConnectionState.OPENED, ConnectionInput.CLOSE_OUT): ConnectionState.CLOSE_SENT,
    (ConnectionState.OPEN_SENT, ConnectionInput.CLOSE_OUT): ConnectionState.CLOSE_SENT,
    (ConnectionState.CLOSE_RCVD, ConnectionInput.CLOSE_OUT): ConnectionState.END,
    (ConnectionState.CLOSE_SENT, ConnectionInput.CLOSE_IN): ConnectionState.END,
}


_AWAITING_HEADER = (ConnectionState.START, ConnectionState.OPEN_PIPE, ConnectionState.CLOSE_PIPE)


def _lowest_free(numbers: dict[int, Any]) -> int:
    """The lowest number not in use (a channel or a handle)."""
    return next(number for number in range(len(numbers) + 1) if number not in numbers)


class Link:
    """One end of a link. ``is_sender``: we send on it. ``handler``: the owner's object
    receiving per-message calls (see the module docstring)."""

    def __init__(self, session: Session, name: str, is_sender: bool, handle: int):
        self.session = session
        self.name = name
        self.is_sender = is_sender
        self.handle = handle  # ours
        self.remote_handle: int | None = None
        self.handler: Any = None
        self.source: Terminus | None = None  # ours, sent in our attach
        self.target: Terminus | None = None
        self.remote_source: Terminus | None = None
        self.remote_target: Terminus | None = None
        self.snd_settle_mode = 2  # 0 unsettled, 1 settled, 2 mixed
        self.rcv_settle_mode = 0  # 0 first, 1 second
        self.remote_properties: dict | None = None
        self.attached = self.detached = False  # by us
        self.remote_attached = False
        self.delivery_count = 0
        self.credit = 0  # as a sender: what the peer granted; as a receiver: what we granted
        self.drain = False
        # As a receiver: the largest message we take, announced in our attach (0: no limit).
        # A bigger one detaches the link with amqp:link:message-size-exceeded [2.7.3]; the
        # fast path takes single-frame messages up to _fast_limit only.
        self.max_message_size = 0
        self._fast_limit = MASK
        self._partial: list[bytes] | None = None  # an incoming multi-frame transfer
        self._partial_id = self._partial_size = 0
        self._partial_settled = False
        self._partial_state: Any = None

    def __repr__(self) -> str:
        return f"<Link {self.name!r} {'sender' if self.is_sender else 'receiver'} handle {self.handle}>"

    @property
    def presettled(self) -> bool:
        return self.snd_settle_mode == 1

    # -- both ends ---------------------------------------------------------------------------

    def attach(self) -> None:
        """Send our attach (with :attr:`source` and :attr:`target`)."""
        if self.attached or self.detached:
            return
        self.attached = True
        # what every single-frame transfer on this link starts with after the frame size:
        # doff 2, type 0, channel; transfer descriptor; list8 of 19 bytes, 5 fields; the
        # handle as uint; the delivery-id's constructor (see send)
        self._head = struct.pack(">BBH3sBBBBIB", 2, 0, self.session.channel, b"\x00\x53\x14", 0xC0, 19, 5, 0x70,
                                 self.handle, 0x70)
        fields = [self.name, UInt(self.handle), not self.is_sender, UByte(self.snd_settle_mode),
                  UByte(self.rcv_settle_mode), self.source.described() if self.source else None,
                  self.target.described() if self.target else None, None, None,
                  UInt(self.delivery_count) if self.is_sender else None,
                  ULong(self.max_message_size) if self.max_message_size else None]
        if self.max_message_size:
            self._fast_limit = self.max_message_size
        self.session.write(ATTACH, fields)

    def detach(self, *, closed: bool = True, error: Error | None = None) -> None:
        """Detach our end (``closed``: for good); the link is forgotten once both ends are."""
        if not self.attached:
            return
        self.attached, self.detached = False, True
        self.session.write(DETACH, [UInt(self.handle), closed, error.described() if error else None])
        self.session.forget(self)

    # -- sending ------------------------------------------------------------------------------

    def send(self, payload: bytes, settled: bool = False, state: Described | None = None) -> int:
        """Send one message (uses one credit), with a delivery ``state`` if given (e.g. a
        transactional one); its delivery id. The caller checks :attr:`credit`."""
        session = self.session
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & MASK
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & MASK
        if not settled:
            session.unsettled_out[delivery_id] = self
        connection = session.connection
        if session._disposition is not None:
            session.flush_disposition()  # frames go out in the order they were made
        if state is None and len(payload) + 64 <= connection.remote_max_frame_size \
                and session.remote_incoming_window > 0:
            session.remote_incoming_window -= 1
            session.next_outgoing_id = (session.next_outgoing_id + 1) & MASK
            out = connection.out
            out.append(_TRANSFER.pack(len(payload) + 32, self._head, delivery_id, b"\xa0\x04", delivery_id,
                                      b"\x43\x41" if settled else b"\x43\x42"))
            out.append(payload)
        else:
            session.send_frames(self, delivery_id, payload, settled, state)
        return delivery_id

    def drained(self) -> None:
        """As a sender with nothing (more) to send: if the peer asked to drain, use the rest
        of the credit up and tell it [2.6.7]."""
        if self.drain and self.credit > 0:
            self.delivery_count = (self.delivery_count + self.credit) & MASK
            self.credit = 0
            self.session.write_flow(self)

    def settle(self, delivery_id: int, state: Described | None = None) -> None:
        """Settle a delivery, with a state for an incoming one (``ACCEPTED``, ``outcome(…)``).

        Incoming settlements are batched into ranged dispositions."""
        session = self.session
        if self.is_sender:
            if session.unsettled_out.pop(delivery_id, None) is not None:
                session.dispose(False, delivery_id, state)
        else:
            session.dispose(True, delivery_id, state)

    # -- receiving ----------------------------------------------------------------------------

    def flow(self, credit: int, *, drain: bool = False) -> None:
        """As a receiver: grant ``credit`` in all (not in addition)."""
        self.credit = credit
        self.drain = drain
        self.session.write_flow(self)


class Session:
    """One session: a channel, its transfer windows and the delivery ids of its links."""

    def __init__(self, connection: Connection, channel: int):
        self.connection = connection
        self.channel = channel
        self.remote_channel: int | None = None
        self.begun = False  # by us
        self.remote_begun = False
        self.next_outgoing_id = 0
        self.next_delivery_id = 0
        self.remote_incoming_window = 0
        self.next_incoming_id = 0
        self.incoming_window = INCOMING_WINDOW
        self.links: dict[int, Link] = {}  # by the peer's handle
        self.handles: dict[int, Link] = {}  # by ours
        self.unsettled_out: dict[int, Link] = {}  # delivery id → link, for what we sent unsettled
        self._disposition: list | None = None  # [role, first, last, state]: the range being batched
        self._blocked: deque[tuple[int, bytes]] = deque()  # transfer frames waiting for the window

    # -- output -------------------------------------------------------------------------------

    def write(self, code: int, fields: list, payload: bytes = b"") -> None:
        self.flush_disposition()
        self.connection.write(self.channel, code, fields, payload)

    def begin(self) -> None:
        if not self.begun:
            self.begun = True
            self.write(BEGIN, [UShort(self.remote_channel) if self.remote_channel is not None else None,
                               UInt(self.next_outgoing_id), UInt(self.incoming_window), UInt(MASK)])

    def end(self, error: Error | None = None) -> None:
        if self.begun:
            self.begun = False
            self.write(END, [error.described() if error else None])
            self.connection.forget(self)

    def link(self, name: str, *, sender: bool) -> Link:
        """A new link end on this session, with our next free handle: set its ``source``,
        ``target`` and ``handler``, then :meth:`Link.attach` it."""
        handle = _lowest_free(self.handles)
        link = self.handles[handle] = Link(self, name, sender, handle)
        return link

    def forget(self, link: Link) -> None:
        """Drop a link once both ends have detached."""
        if link.attached or link.remote_attached:
            return
        self.handles.pop(link.handle, None)
        if self.links.get(link.remote_handle) is link:
            del self.links[link.remote_handle]
        if link.is_sender:
            for delivery_id in [key for key, owner in self.unsettled_out.items() if owner is link]:
                del self.unsettled_out[delivery_id]

    def write_flow(self, link: Link | None = None) -> None:
        fields = [UInt(self.next_incoming_id), UInt(self.incoming_window), UInt(self.next_outgoing_id), UInt(MASK)]
        if link is not None:
            fields += [UInt(link.handle), UInt(link.delivery_count), UInt(link.credit), None, link.drain]
        self.write(FLOW, fields)

    def dispose(self, receiver: bool, delivery_id: int, state: Described | None) -> None:
        """Settle one delivery towards the peer, extending the pending range when it can."""
        if not self.begun:
            return
        pending = self._disposition
        if pending is not None:
            if pending[0] == receiver and pending[3] is state and delivery_id == (pending[2] + 1) & MASK:
                pending[2] = delivery_id
                return
            self.flush_disposition()
        self._disposition = [receiver, delivery_id, delivery_id, state]
        self.connection.dirty.add(self)

    def flush_disposition(self) -> None:
        pending = self._disposition
        if pending is not None:
            self._disposition = None
            receiver, first, last, state = pending
            self.connection.write(self.channel, DISPOSITION, [receiver, UInt(first), UInt(last), True, state])

    def send_frames(self, link: Link, delivery_id: int, payload: bytes, settled: bool,
                    state: Described | None = None) -> None:
        """A transfer in as many frames as the peer's max frame size needs; frames beyond
        the peer's incoming window wait for it to open."""

        def first(more: bool) -> bytes:
            if state is None:
                return _TRANSFER_FIRST.pack(b"\x00\x53\x14", 0xC0, 20, 6, 0x70, link.handle, 0x70, delivery_id,
                                            0xA0, 4, delivery_id, 0x43, 0x41 if settled else 0x42,
                                            0x41 if more else 0x42)
            return b"\x00\x53\x14" + encode([UInt(link.handle), UInt(delivery_id), _U32.pack(delivery_id), UInt(0),
                                              settled, more, None, state])

        limit = self.connection.remote_max_frame_size - 8  # the frame header
        body = first(False)
        if len(body) + len(payload) <= limit:
            self._blocked.append((self.channel, body + payload))
        else:
            head = limit - len(body)  # what the first frame carries
            self._blocked.append((self.channel, first(True) + payload[:head]))
            room = limit - _TRANSFER_NEXT.size
            for start in range(head, len(payload), room):
                more = start + room < len(payload)
                body = _TRANSFER_NEXT.pack(b"\x00\x53\x14", 0xC0, 11, 6, 0x70, link.handle, 0x40, 0x40, 0x40, 0x40,
                                           0x41 if more else 0x42)
                self._blocked.append((self.channel, body + payload[start:start + room]))
        self.release_blocked()

    def release_blocked(self) -> None:
        connection = self.connection
        while self._blocked and self.remote_incoming_window > 0:
            channel, body = self._blocked.popleft()
            self.remote_incoming_window -= 1
            self.next_outgoing_id = (self.next_outgoing_id + 1) & MASK
            connection.write_raw(channel, body)

    @property
    def blocked(self) -> bool:
        """Transfer frames are waiting for the peer's incoming window: send no more now."""
        return bool(self._blocked) or self.remote_incoming_window <= 0


class Connection:
    """One AMQP connection, after SASL (done in front of it by the owner). A server
    (``server=True``, the listener) answers the peer's open, begins and attaches; a client
    opens at once (:meth:`open`), begins sessions (:meth:`session`) and attaches links
    (:meth:`Session.link`), and its :meth:`close` ends the output only when the peer's close
    has answered it."""

    def __init__(self, *, container_id: str, server: bool = True, idle_timeout: float = 0.0,
                 max_frame_size: int = 65536, channel_max: int = 65535, hostname: str | None = None,
                 max_message_size: int = 256 * 1024 * 1024):
        self.container_id = container_id
        self.server = server
        self.idle_timeout = idle_timeout  # seconds; ours: a peer silent for longer is dropped
        self.max_frame_size = max(max_frame_size, MIN_MAX_FRAME_SIZE)
        self.channel_max = channel_max
        self.max_message_size = max_message_size  # a multi-frame transfer beyond it ends the connection
        self.hostname = hostname
        self.offered_capabilities: list[str] = []
        self.desired_capabilities: list[str] = []  # asked of the peer in our open (a client's)
        self.properties: dict | None = None
        self.state = ConnectionState.START
        self.remote_container_id: str | None = None
        self.remote_hostname: str | None = None
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE  # until the peer's open says more
        self.remote_idle_timeout = 0.0
        self.remote_properties: dict = {}
        self.remote_offered_capabilities: list[str] = []
        self.remote_desired_capabilities: list[str] = []
        self.sessions: dict[int, Session] = {}  # by the peer's channel
        self.channels: dict[int, Session] = {}  # by ours
        self.events: list[Any] = []
        self.out: list[bytes] = [AMQP_HEADER]
        self.dirty: set[Session] = set()  # sessions with a disposition range pending
        self._in = b""
        self._input_seen = self._output_sent = False
        self._last_input = self._last_output = None
        self._finished = False  # the output is complete: close the socket once it is written
        self._closing = False

    # -- state ----------------------------------------------------------------------------------

    def _move(self, event: ConnectionInput) -> None:
        following = TRANSITIONS.get((self.state, event))
        if following is None:
            raise RemoteProtocolError("amqp:not-allowed" if event in (ConnectionInput.OPEN_IN, ConnectionInput.CLOSE_IN)
                                else "amqp:internal-error", f"{event.value} while {self.state.value}")
        self.state = following

    @property
    def opened(self) -> bool:
        return self.state is ConnectionState.OPENED

    # -- what the owner does ----------------------------------------------------------------

    def open(self) -> None:
        """Send our ``open`` (a server: in answer to :class:`ConnectionOpened`; a client: at
        once); nothing once the connection is closing."""
        if self.state in (ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE, ConnectionState.END):
            return
        self._move(ConnectionInput.OPEN_OUT)
        idle = UInt(int(self.idle_timeout * 1000)) if self.idle_timeout else None
        self.write(0, OPEN, [self.container_id, self.hostname, UInt(self.max_frame_size), UShort(self.channel_max),
                             idle, None, None, symbol_array(self.offered_capabilities),
                             symbol_array(self.desired_capabilities), self.properties])
        if self._in and self.server and not self._closing:  # what the peer sent after its open waited for ours
            self._consume(self._in)

    def close(self, error: Error | None = None) -> None:
        """Send our ``close`` (an ``open`` first if we had not); the output then ends."""
        if self.state in (ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE, ConnectionState.END):
            return
        self._closing = True  # what the peer sent after its open is not read any more
        if self.state in (ConnectionState.START, ConnectionState.HDR_EXCH, ConnectionState.OPEN_RCVD):
            if self.state is ConnectionState.START and self.server:
                self.state = ConnectionState.HDR_EXCH  # refusing before the peer's header came: answer it anyway
            self.open()
        self._move(ConnectionInput.CLOSE_OUT)
        self.write(0, CLOSE, [error.described() if error else None])
        self._finished = self.server or self.state is ConnectionState.END

    def session(self) -> Session:
        """Begin a session of ours; :class:`SessionBegun` follows when the peer answers."""
        session = self._new_session()
        session.begin()
        return session

    def _new_session(self) -> Session:
        channel = _lowest_free(self.channels)
        session = self.channels[channel] = Session(self, channel)
        return session

    def forget(self, session: Session) -> None:
        if session.begun or session.remote_begun:
            return
        self.channels.pop(session.channel, None)
        if self.sessions.get(session.remote_channel) is session:
            del self.sessions[session.remote_channel]

    # -- bytes ------------------------------------------------------------------------------------

    def write(self, channel: int, code: int, fields: list, payload: bytes = b"") -> None:
        while fields and fields[-1] is None:
            fields.pop()
        self.write_raw(channel, b"\x00\x53" + bytes([code]) + encode(fields), payload)

    def write_raw(self, channel: int, body: bytes, payload: bytes = b"") -> None:
        self.out.append(_FRAME.pack(8 + len(body) + len(payload), 2, 0, channel))
        self.out.append(body)
        if payload:
            self.out.append(payload)

    def dispatch(self, handlers: dict[type, Any]) -> None:
        """Hand each pending event to ``handlers[type(event)]`` (events without one are
        dropped), including the events the handlers cause."""
        events = self.events
        while events:
            batch = events[:]
            events.clear()
            for event in batch:
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(event)

    @property
    def finished(self) -> bool:
        """Everything is written and the connection is over: close the socket."""
        return self._finished and not self.out and not self.dirty

    def data_to_send(self) -> bytes | None:
        """Bytes to write now (``b""``: nothing); ``None`` once everything was written and
        the connection is over (close the socket)."""
        for session in self.dirty:
            session.flush_disposition()
        self.dirty.clear()
        if not self.out:
            return None if self._finished else b""
        data = b"".join(self.out)
        self.out.clear()
        self._output_sent = True
        return data

    def tick(self, now: float) -> float:
        """Act on time: drop a peer silent for longer than our idle timeout, send an empty
        frame when we would otherwise be silent for half of the peer's. The next deadline,
        0 for none."""
        if self._last_input is None or self._input_seen:
            self._last_input, self._input_seen = now, False
        if self._last_output is None or self._output_sent:
            self._last_output, self._output_sent = now, False
        if self.state in (ConnectionState.END, ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE):
            return 0.0
        deadlines = []
        if self.idle_timeout:
            if now >= self._last_input + self.idle_timeout:
                self._fail(RemoteProtocolError("amqp:resource-limit-exceeded", "local-idle-timeout expired"))
                return 0.0
            deadlines.append(self._last_input + self.idle_timeout)
        if self.remote_idle_timeout and self.state is not ConnectionState.START:
            if now >= self._last_output + self.remote_idle_timeout / 2:
                self.out.append(b"\x00\x00\x00\x08\x02\x00\x00\x00")  # an empty frame keeps us alive
                self._last_output = now
            deadlines.append(self._last_output + self.remote_idle_timeout / 2)
        return min(deadlines) if deadlines else 0.0

    def receive_data(self, data: bytes) -> None:
        """Feed what the peer sent (``b""``: it closed its side). A protocol error closes
        the connection (see the module docstring); nothing is raised."""
        if self.state is ConnectionState.END or self._finished:
            return
        if not data:
            if self.state is not ConnectionState.CLOSE_RCVD:
                self.events.append(ConnectionClosed(Error("amqp:connection:framing-error",
                                                          "the peer closed the socket"), by_peer=True))
            self.state, self._finished = ConnectionState.END, True
            return
        if type(data) is not bytes:
            data = bytes(data)
        self._input_seen = True
        self._consume(self._in + data if self._in else data)

    def _consume(self, buffer: bytes) -> None:
        try:
            offset = self._frames(buffer)
        except ProtocolError as exc:
            self._fail(exc)
            return
        except DecodeError as exc:
            self._fail(RemoteProtocolError("amqp:decode-error", str(exc)))
            return
        self._in = buffer[offset:]

    def _fail(self, exc: ProtocolError) -> None:
        error = Error(exc.condition, str(exc))
        self.events.append(ConnectionClosed(error, by_peer=False))
        self._in = b""
        self.close(error)
        self._finished = True

    def _frames(self, buffer: bytes) -> int:
        """Handle every complete frame in ``buffer``; the offset of what is left."""
        offset, end = 0, len(buffer)
        if self.state in _AWAITING_HEADER:
            if end < 8:
                if not AMQP_HEADER.startswith(buffer):
                    raise RemoteProtocolError("amqp:connection:framing-error", f"not an AMQP 1.0 header: {buffer!r}")
                return 0
            if buffer[:8] != AMQP_HEADER:
                raise RemoteProtocolError("amqp:connection:framing-error", f"not an AMQP 1.0 header: {buffer[:8]!r}")
            self._move(ConnectionInput.HEADER)
            offset = 8
        unpack_frame, unpack_u32, tails = _FRAME.unpack_from, _U32.unpack_from, _TRANSFER_TAILS
        sessions, limit = self.sessions, self.max_frame_size
        while end - offset >= 8:
            size, doff, kind, channel = unpack_frame(buffer, offset)
            if size > limit or size < 8 or doff != 2 or kind != 0:
                _check_frame_header(size, doff, kind, limit)
            frame_end = offset + size
            if frame_end > end:
                break
            body = offset + doff * 4
            offset = frame_end
            if body == frame_end:
                continue  # an empty frame: the peer is alive
            # The transfer fast path: a list8 whose handle, delivery-id, tag and the rest use the
            # usual constructors is read in place, and a whole message within credit goes
            # straight to the link's handler. Anything else takes the codec (_performative).
            if buffer.startswith(b"\x00\x53\x14\xc0", body) and (session := sessions.get(channel)) is not None:
                at = body + 6
                count, after = buffer[at - 1], at - 1 + buffer[at - 2]
                code = buffer[at]
                if code == 0x52:
                    handle = buffer[at + 1]
                    at += 2
                else:
                    handle = 0
                    at += 1 if code == 0x43 else frame_end  # anything else: not this path
                code = buffer[at] if at < frame_end else 0
                if code == 0x70:
                    delivery_id = unpack_u32(buffer, at + 1)[0]
                    at += 5
                elif code == 0x52:
                    delivery_id = buffer[at + 1]
                    at += 2
                else:
                    delivery_id = 0
                    at += 1 if code == 0x43 else frame_end
                if at < frame_end and buffer[at] == 0xA0:
                    at += 2 + buffer[at + 1]
                    flags = tails.get(buffer[at:after]) if 3 <= count <= 7 and after <= frame_end else None
                    link = session.links.get(handle)
                    if flags is not None and link is not None and not flags[1] and link._partial is None \
                            and link.credit > 0 and not link.is_sender and frame_end - after <= link._fast_limit:
                        session.next_incoming_id = (session.next_incoming_id + 1) & MASK
                        session.incoming_window -= 1
                        if session.incoming_window < INCOMING_WINDOW // 2:
                            session.incoming_window = INCOMING_WINDOW
                            session.write_flow()
                        link.credit -= 1
                        link.delivery_count = (link.delivery_count + 1) & MASK
                        link.handler.on_transfer(delivery_id, buffer[after:frame_end], flags[0], None)
                        continue
            if buffer[body] == 0 and buffer[body + 1] == 0x53 and buffer[body + 2] == OPEN and self.server:
                self._performative(channel, buffer, body, frame_end)
                return offset  # the rest waits for our open (the owner decides on it first)
            self._performative(channel, buffer, body, frame_end)
            if self._finished:
                return offset
        return offset

    # -- frames in -------------------------------------------------------------------------------

    def _performative(self, channel: int, buffer: bytes, body: int, frame_end: int) -> None:
        value, after = decode(buffer, body)
        if after > frame_end:
            raise RemoteProtocolError("amqp:decode-error", "a performative runs past its frame")
        if not isinstance(value, Described) or not isinstance(value.value, list):
            raise RemoteProtocolError("amqp:decode-error", f"not a performative: {value!r}"[:200])
        code = descriptor_code(value.descriptor)
        fields = value.value
        if code not in _FIELDS:
            raise RemoteProtocolError("amqp:not-implemented", f"unknown performative {value.descriptor!r}"[:200])
        _check_fields(code, fields)
        if code == OPEN:
            self._on_open(fields)
            return
        if code == CLOSE:
            self._move(ConnectionInput.CLOSE_IN)
            error = Error.from_value(fields[0] if fields else None)
            self.events.append(ConnectionClosed(error, by_peer=True))
            if self.state is ConnectionState.CLOSE_RCVD:
                self.close()
            self._finished = True
            return
        if self.state is ConnectionState.CLOSE_SENT:
            return  # after our close, the rest is ignored [2.4.6]
        if self.state is not ConnectionState.OPENED:
            raise RemoteProtocolError("amqp:not-allowed", f"performative 0x{code:02x} before the connection is open")
        if code == BEGIN:
            self._on_begin(channel, fields)
            return
        session = self.sessions.get(channel)
        if session is None:
            raise RemoteProtocolError("amqp:not-allowed", f"performative 0x{code:02x} on channel {channel}, not begun")
        if code == TRANSFER:
            self._slow_transfer(session, fields, buffer[after:frame_end])
            return
        _SESSION_HANDLERS[code](self, session, fields + [None] * 12)

    def _on_open(self, fields: list) -> None:
        self._move(ConnectionInput.OPEN_IN)
        fields = fields + [None] * 10
        self.remote_container_id = fields[0]
        self.remote_hostname = fields[1]
        self.remote_max_frame_size = max(fields[2] if fields[2] is not None else MASK, MIN_MAX_FRAME_SIZE)
        self.remote_idle_timeout = (fields[4] or 0) / 1000
        self.remote_offered_capabilities = symbols(fields[7])
        self.remote_desired_capabilities = symbols(fields[8])
        self.remote_properties = fields[9] if isinstance(fields[9], dict) else {}
        self.events.append(ConnectionOpened())

    def _on_begin(self, channel: int, fields: list) -> None:
        fields = fields + [None] * 8
        if channel in self.sessions:
            raise RemoteProtocolError("amqp:not-allowed", f"channel {channel} is begun already")
        if channel > self.channel_max:
            raise RemoteProtocolError("amqp:connection:framing-error", f"channel {channel} above channel-max")
        if fields[0] is not None:  # the answer to our begin
            session = self.channels.get(fields[0])
            if session is None:
                raise RemoteProtocolError("amqp:not-allowed", f"begin answers channel {fields[0]}, which we did not begin")
        else:
            session = self._new_session()
        session.remote_channel = channel
        session.remote_begun = True
        session.next_incoming_id = fields[1] or 0
        session.remote_incoming_window = fields[2] or 0
        self.sessions[channel] = session
        session.begin()  # the answer, unless it was ours
        self.events.append(SessionBegun(session))

    def _on_end(self, session: Session, fields: list) -> None:
        session.remote_begun = False
        for link in list(session.links.values()):
            if link.remote_attached:
                link.remote_attached = False
                self.events.append(LinkDetached(link, False, None))
                link.attached, link.detached = False, True
                session.forget(link)
        self.events.append(SessionEnded(session, Error.from_value(fields[0])))
        session.end()
        self.forget(session)

    def _on_attach(self, session: Session, fields: list) -> None:
        name, handle, role = fields[0], fields[1], fields[2]
        if not isinstance(name, str) or not isinstance(handle, int) or not isinstance(role, bool):
            raise RemoteProtocolError("amqp:decode-error", "attach without a name, handle or role")
        if handle in session.links:
            raise RemoteProtocolError("amqp:session:handle-in-use", f"handle {handle} is in use")
        is_sender = role  # the peer is the receiver: we send
        link = next((mine for mine in session.handles.values()
                     if mine.name == name and mine.is_sender == is_sender and mine.remote_handle is None), None)
        if link is None:
            link = session.link(name, sender=is_sender)
            link.snd_settle_mode = fields[3] if fields[3] is not None else 2
        link.remote_handle = handle
        link.remote_attached = True
        link.remote_source = Terminus.from_value(fields[5])
        link.remote_target = Terminus.from_value(fields[6])
        link.remote_properties = fields[13] if isinstance(fields[13], dict) else None
        if not is_sender and fields[9] is not None:
            link.delivery_count = fields[9]  # the sender's initial delivery count
        session.links[handle] = link
        self.events.append(LinkAttached(link))

    def _link(self, session: Session, handle: Any) -> Link:
        link = session.links.get(handle)
        if link is None:
            raise RemoteProtocolError("amqp:session:unattached-handle", f"handle {handle!r} is not attached")
        return link

    def _on_detach(self, session: Session, fields: list) -> None:
        link = self._link(session, fields[0])
        link.remote_attached = False
        session.links.pop(link.remote_handle, None)
        self.events.append(LinkDetached(link, bool(fields[1]), Error.from_value(fields[2])))
        session.forget(link)

    def _on_flow(self, session: Session, fields: list) -> None:
        next_incoming_id, incoming_window = fields[0], fields[1] or 0
        if next_incoming_id is None:
            next_incoming_id = 0  # the peer has not seen our begin's next-outgoing-id yet
        session.remote_incoming_window = (next_incoming_id + incoming_window - session.next_outgoing_id) & MASK
        if session.remote_incoming_window > INCOMING_WINDOW:
            session.remote_incoming_window = 0  # ids ahead of ours: nothing fits
        session.release_blocked()
        if fields[4] is None:
            if fields[9]:
                session.write_flow()
            return
        link = self._link(session, fields[4])
        delivery_count, credit = fields[5], fields[6] or 0
        if link.is_sender:
            if delivery_count is None:
                delivery_count = 0
            link.credit = max((delivery_count + credit - link.delivery_count) & MASK, 0)
            if link.credit > INCOMING_WINDOW:
                link.credit = 0
            link.drain = bool(fields[8])
        elif delivery_count is not None:  # the sender used up credit (a drain)
            limit = link.delivery_count + link.credit
            link.delivery_count = delivery_count
            link.credit = max(limit - delivery_count, 0)
            link.drain = False
        if fields[9]:
            session.write_flow(link)
        self.events.append(LinkFlow(link))

    def _on_disposition(self, session: Session, fields: list) -> None:
        receiver, first, last, settled, state = fields[0], fields[1], fields[2], bool(fields[3]), fields[4]
        if not isinstance(first, int):
            raise RemoteProtocolError("amqp:decode-error", "disposition without a first delivery id")
        if not receiver:
            return  # the peer settles what it sent us: we settle at once, nothing to do
        span = 0 if last is None else (last - first) & MASK
        unsettled = session.unsettled_out
        if span < len(unsettled):
            named: Any = ((first + index) & MASK for index in range(span + 1))
        else:  # a range wider than what is unsettled (up to 2**32 ids): walk what is unsettled
            named = sorted((key for key in unsettled if (key - first) & MASK <= span),
                           key=lambda key: (key - first) & MASK)
        for delivery_id in named:
            link = unsettled.pop(delivery_id, None) if settled else unsettled.get(delivery_id)
            if link is not None and link.handler is not None:
                link.handler.on_outcome(delivery_id, state, settled)

    def _slow_transfer(self, session: Session, fields: list, payload: bytes) -> None:
        """A transfer the fast path did not take (unusual encoding, state, aborted, resume)."""
        fields = fields + [None] * 11
        link = self._link(session, fields[0])
        self._delivery(session, link, fields[1], payload, bool(fields[4]), bool(fields[5]), fields[7],
                       bool(fields[9]))

    def _delivery(self, session: Session, link: Link, delivery_id: int | None, payload: bytes, settled: bool,
                  more: bool, state: Any, aborted: bool) -> None:
        if link.is_sender:
            raise RemoteProtocolError("amqp:not-allowed", f"transfer on {link.name!r}, on which the peer receives")
        session.next_incoming_id = (session.next_incoming_id + 1) & MASK
        session.incoming_window -= 1
        if session.incoming_window < INCOMING_WINDOW // 2:
            session.incoming_window = INCOMING_WINDOW
            session.write_flow()
        if link.detached:
            return  # we detached the link (a link error): what the peer sent before it saw that is dropped
        limit = link.max_message_size
        if link._partial is None:
            if delivery_id is None:
                raise RemoteProtocolError("amqp:decode-error", "the first transfer of a delivery needs a delivery-id")
            if link.credit <= 0:
                raise RemoteProtocolError("amqp:link:transfer-limit-exceeded", f"transfer on {link.name!r} beyond credit")
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & MASK
            if limit and len(payload) > limit:
                self._message_too_large(link)
                return
            if more:
                link._partial, link._partial_id, link._partial_settled, link._partial_state = (
                    [payload], delivery_id, settled, state)
                link._partial_size = len(payload)
                return
        else:
            link._partial.append(payload)
            link._partial_size += len(payload)
            if limit and link._partial_size > limit:
                self._message_too_large(link)  # at once: the rest of the message is not collected
                return
            if link._partial_size > self.max_message_size:
                raise RemoteProtocolError("amqp:link:message-size-exceeded",
                                    f"a message on {link.name!r} above {self.max_message_size} bytes")
            settled = settled or link._partial_settled
            state = state if state is not None else link._partial_state
            if more and not aborted:
                link._partial_settled, link._partial_state = settled, state
                return
            delivery_id, payload, link._partial = link._partial_id, b"".join(link._partial), None
        if aborted:
            return
        link.handler.on_transfer(delivery_id, payload, settled, state)

    def _message_too_large(self, link: Link) -> None:
        """Detach ``link`` with amqp:link:message-size-exceeded ("Any attempt to deliver a
        message larger than this results in a message-size-exceeded link-error" [2.7.3]):
        only the link ends; the owner hears of it through :class:`LinkDetached`."""
        error = Error("amqp:link:message-size-exceeded",
                      f"a message on link {link.name!r} exceeds its max-message-size of {link.max_message_size} bytes")
        link._partial, link.credit = None, 0
        link.detach(closed=True, error=error)
        self.events.append(LinkDetached(link, True, error))


_SESSION_HANDLERS = {
    END: Connection._on_end, ATTACH: Connection._on_attach, DETACH: Connection._on_detach,
    FLOW: Connection._on_flow, DISPOSITION: Connection._on_disposition,
}
