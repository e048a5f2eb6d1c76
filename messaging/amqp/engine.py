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
  (:meth:`Connection.dispatch`) after each :meth:`Connection.receive_data`;
- the per-message things straight to the link's :attr:`Link.handler` (a
  :class:`LinkHandler`, set by the owner before the link can carry a message):
  ``on_transfer`` for each complete incoming message, ``on_outcome`` for each delivery a
  peer's disposition names. No object is made per message.

Three state machines, each a table of ``(state, input) -> next state`` kept here as data:
:data:`CONNECTION_TRANSITIONS` [2.4.6], :data:`SESSION_TRANSITIONS` [2.5.5] and
:data:`LINK_TRANSITIONS` [2.6.3, 2.6.6]. Inputs are frames received (``*_IN``) and frames
sent (``*_OUT``) — the owner's calls, or the engine's own answers. A pair the table lacks
is an error: :data:`_MISSED` says which (the peer's input: a
:class:`~.wire.RemoteProtocolError`; the owner's: a :class:`~.wire.LocalProtocolError`).
A pair that maps a state to itself is an owner's call the protocol makes meaningless but
callers rely on being harmless (attaching twice, detaching after the peer's detach
answered ours, ending twice): it does nothing. The tables are consulted on open, close,
begin, end, attach and detach only; the per-message paths (the transfer fast path,
:meth:`Link.send`, :meth:`Link.settle`) look at no state, so a link or session that must
stop carrying messages is made to by data the fast path reads anyway: its credit is
zeroed and its handle maps are emptied.

A peer that breaks the protocol is answered at the narrowest scope that contains the
breach [2.8.15–2.8.17]:

- a link (a transfer beyond credit, on a link where the peer receives, a multi-frame
  message above :attr:`Connection.max_message_size`, a continuation naming another
  delivery): a ``detach`` with ``closed`` and the error, then :class:`LinkDetached` with
  ``by_peer`` false. What the peer sends on that link until its own detach arrives is
  dropped (it may have been sent before it saw ours): the link is ``DISCARDING``;
- a session (a handle that is not attached, a handle in use): an ``end`` with the error,
  :class:`LinkDetached` for each of its links and :class:`SessionEnded`, all with
  ``by_peer`` false; frames on the channel are dropped until the peer's ``end``;
- the connection (framing, a frame that does not decode, anything before ``open``, a
  channel not begun, a channel above channel-max, a handle above handle-max, incomplete
  multi-frame messages of all links above :attr:`Connection.max_incoming_buffer`): a
  ``close`` with the error, and :class:`ConnectionClosed`; the connection is over.

After the peer's detach (end) answers ours, the handle (channel) is free for a new link
(session). Ours are the lowest free ones, taken in O(log n) (:class:`_Numbered`), and a
peer's attach finds the link of ours it answers by name in O(1): a peer with thousands of
sessions or links costs linear time, never quadratic. A connection that is over is taken
apart by :meth:`Connection.release`, so it is freed without the cyclic collector.

Why Python and not proton's C engine: driving proton through cffi costs some twenty
C crossings and two collector events per message, while a 64 KiB read here is one loop
over ~400 frames, an outgoing transfer is one ``struct.pack`` and a consumer's ranged
disposition settles a whole range in one go.
Transfers have a decoding fast path for the usual encodings; anything else goes through
the general codec. proton stays the test oracle: every real client in the tests is one.
``bench/engine_bench.py`` measures the per-message paths.
"""

from __future__ import annotations

import enum
import heapq
import struct
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from ..codec import DecodeError, Described, UByte, UInt, ULong, UShort, decode, encode
from .wire import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    MASK,
    MIN_MAX_FRAME_SIZE,
    OPEN,
    TRANSFER,
    Error,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Scope,
    Terminus,
    descriptor_code,
    symbol_array,
    symbols,
)
from .wire import FRAME_HEADER as _FRAME

__all__ = [
    "Connection",
    "Session",
    "Link",
    "LinkHandler",
    "ConnectionOpened",
    "ConnectionClosed",
    "SessionBegun",
    "SessionEnded",
    "LinkAttached",
    "LinkDetached",
    "LinkFlow",
    "ConnectionState",
    "ConnectionInput",
    "SessionState",
    "SessionInput",
    "LinkState",
    "LinkInput",
    "CONNECTION_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "LINK_TRANSITIONS",
]

INCOMING_WINDOW = 0x7FFFFFFF  # transfer frames we take before a session flow reopens the window


def _check_frame_header(size: int, doff: int, kind: int, limit: int) -> None:
    """Raises unless a frame header that is not the usual one is still valid."""
    if size > limit or size < 8 or doff < 2 or doff * 4 > size:
        raise RemoteProtocolError(
            "amqp:connection:framing-error",
            f"bad frame header (size {size}, data offset {doff}; max frame size {limit})",
        )
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
_OPEN_PREFIX = bytes([0x00, 0x53, OPEN])
_U32 = struct.Struct(">I")
# A transfer as we send it: frame header, descriptor, list8 of handle, delivery-id, delivery-tag
# (the 4-byte delivery-id), message-format 0 and settled; the payload follows.
_TRANSFER = struct.Struct(">I16sI2sI2s")  # size, the link's head (see Link.send), id, tag header, tag, the rest
_TRANSFER_FIRST = struct.Struct(">3sBBBBIBIBBIBBB")  # the first frame of several: with more=true
_TRANSFER_NEXT = struct.Struct(">3sBBBBIBBBBB")  # the following ones: handle and more


# What the fields of each performative must be when present (a peer's wrong type closes the
# connection with amqp:decode-error instead of reaching our state): index → (kind, largest).
_UINT, _USHORT, _UBYTE = (int, MASK), (int, 0xFFFF), (int, 0xFF)
_FIELDS: dict[int, tuple[str, dict[int, tuple[type[Any], int]]]] = {
    OPEN: ("open", {0: (str, 0), 1: (str, 0), 2: _UINT, 3: _USHORT, 4: _UINT}),
    BEGIN: ("begin", {0: _USHORT, 1: _UINT, 2: _UINT, 3: _UINT, 4: _UINT}),
    ATTACH: ("attach", {0: (str, 0), 1: _UINT, 2: (bool, 0), 3: _UBYTE, 4: _UBYTE, 9: _UINT, 10: (int, 2**64 - 1)}),
    FLOW: (
        "flow",
        {0: _UINT, 1: _UINT, 2: _UINT, 3: _UINT, 4: _UINT, 5: _UINT, 6: _UINT, 7: _UINT, 8: (bool, 0), 9: (bool, 0)},
    ),
    TRANSFER: (
        "transfer",
        {
            0: _UINT,
            1: _UINT,
            2: (bytes, 0),
            3: _UINT,
            4: (bool, 0),
            5: (bool, 0),
            6: _UBYTE,
            8: (bool, 0),
            9: (bool, 0),
            10: (bool, 0),
        },
    ),
    DISPOSITION: ("disposition", {0: (bool, 0), 1: _UINT, 2: _UINT, 3: (bool, 0), 5: (bool, 0)}),
    DETACH: ("detach", {0: _UINT, 1: (bool, 0)}),
    END: ("end", {}),
    CLOSE: ("close", {}),
}


def _check_fields(code: int, fields: list[Any]) -> None:
    """Raises RemoteProtocolError unless each present field of the performative has its type."""
    name, kinds = _FIELDS[code]
    for index, (kind, largest) in kinds.items():
        if index < len(fields) and (value := fields[index]) is not None:
            if (
                type(value) is not kind
                and not (kind is str and isinstance(value, str))
                or kind is int
                and not 0 <= value <= largest
            ):
                raise RemoteProtocolError("amqp:decode-error", f"{name} field {index} is {value!r}"[:200])


# -- the per-message callbacks ----------------------------------------------------------------


class LinkHandler(Protocol):
    """What the owner puts in :attr:`Link.handler`: the engine's per-message calls for one link.

    The engine calls :meth:`on_transfer` only on a link it receives on and :meth:`on_outcome`
    only on one it sends on, so a handler serving one role needs only that method. Both
    are called from inside :meth:`Connection.receive_data`, while it walks the frames of
    one read, and never from anywhere else. Set the handler before the link can carry a
    message: before granting credit (:meth:`Link.flow`) on a receiving link, before the
    first :meth:`Link.send` on a sending one.

    From inside a call a handler may use the engine like the owner does between reads:

    - :meth:`Link.settle` (any link: settlements join the ranged disposition being built),
      :meth:`Link.send` and :meth:`Link.drained` (any link; read :attr:`Link.credit` and
      :attr:`Session.blocked` first), :meth:`Link.flow`;
    - read :attr:`Link.credit`, :attr:`Link.delivery_count` and :attr:`Link.drain`: for the
      delivery being handed over they already count it;
    - :meth:`Link.attach`, :meth:`Link.detach`, :meth:`Session.link`, :meth:`Session.end`,
      :meth:`Connection.session`. After a detach or end *with an error* nothing more of
      that link or session reaches a handler; after a plain one, what the peer sent
      before it saw ours still does, until its detach (end) arrives;
    - :meth:`Connection.close`: nothing more of that read reaches a handler;
    - :meth:`Connection.data_to_send` (it only takes what is queued).

    It must not call :meth:`Connection.receive_data` (the frames still to be handled in
    the current read would come after the new ones, and the buffered remainder would be
    overwritten), and should not call :meth:`Connection.dispatch` or :meth:`Connection.tick`,
    which belong to the owner's loop after ``receive_data`` returns.

    It must not raise. An exception propagates out of ``receive_data`` with the rest of
    that read unhandled and the engine's input buffer stale: drop the connection. (A
    :class:`~.wire.RemoteProtocolError` or a codec ``DecodeError`` raised by a handler
    cannot be told from the peer's and closes the connection with that error.)
    """

    def on_transfer(self, delivery_id: int, payload: bytes, settled: bool, state: Any) -> None:
        """A complete incoming message (all frames of a multi-frame one joined): its
        delivery id, the message bytes as sent, whether the peer sent it settled (then
        do not settle it), and the transfer's delivery ``state`` (None, or e.g. a
        transactional state [4.5.5]). The link's credit is already one less."""

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        """The peer's disposition names one of our unsettled deliveries on this link: its
        ``state`` (an outcome such as accepted, or a non-terminal one) and whether the peer
        settled it. Not settled: settle it (:meth:`Link.settle`) once the state is final."""


# -- events (the rare ones; per-message work goes to the link handlers) ---------------------


@attrs.frozen
class ConnectionOpened:
    """The peer's ``open`` arrived (its fields are on the connection); answer with
    :meth:`Connection.open` (a server) — or :meth:`Connection.close` to refuse."""


@attrs.frozen
class ConnectionClosed:
    """The connection is over: the peer closed it (``by_peer``) or broke the protocol, or
    went silent (our ``close`` carried ``error``)."""

    error: Error | None
    by_peer: bool


@attrs.frozen
class SessionBegun:
    """The peer began a session (already answered), or answered our begin."""

    session: Session


@attrs.frozen
class SessionEnded:
    """The session is over: the peer's ``end`` arrived (``by_peer``; ``error`` is its), or
    the engine ended it because the peer broke the protocol on it (``error`` is ours). Its
    links got :class:`LinkDetached` first."""

    session: Session
    error: Error | None
    by_peer: bool = True


@attrs.frozen
class LinkAttached:
    """The peer attached: a new link to answer (:meth:`Link.attach`, or refuse by attaching
    with a null terminus and detaching), or the answer to our own attach. By the time the
    owner handles it the engine may have detached the link already (a :class:`LinkDetached`
    with ``by_peer`` false follows); answering it then does nothing."""

    link: Link


@attrs.frozen
class LinkDetached:
    """The link's peer end is gone: the peer's detach arrived (``by_peer``; ``closed``: for
    good; ``error``: the peer's), or its session ended (``closed`` false; ``error``: the
    end's), or the engine detached it because the peer broke the protocol on it
    (``by_peer`` false, ``closed`` true, ``error`` ours; the peer's answering detach then
    brings a second event). Answer a peer's detach with :meth:`Link.detach`; it does
    nothing where no answer is due."""

    link: Link
    closed: bool
    error: Error | None
    by_peer: bool = True


@attrs.frozen
class LinkFlow:
    """The peer's flow changed a link's credit or drain (or echoed a drain back)."""

    link: Link


# -- the state machines -------------------------------------------------------------------------
#
# Each is a table (state, input) -> next state. Inputs named *_IN are frames from the peer,
# *_OUT frames we send. A missing pair raises what _MISSED says for its input; a pair
# mapping a state to itself is an owner's call that does nothing (see the module docstring).


class ConnectionState(enum.Enum):
    """The connection's states [2.4.6]. We send our header at once, so there is no separate
    header-sent state; a client opens (and may close) before the peer's header arrives,
    through the pipelined states."""

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


CONNECTION_TRANSITIONS = {
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


class SessionState(enum.Enum):
    """A session's states [2.5.5], plus a pipelined one (we end before the peer's begin
    came) and a final one: the spec returns to UNMAPPED, but here a new begin makes a new
    :class:`Session`, so the spent one stays ENDED."""

    UNMAPPED = "neither begin sent nor received"
    BEGIN_SENT = "begin sent"
    BEGIN_RCVD = "begin received"
    MAPPED = "mapped"
    END_PIPE = "begin and end sent before the peer's begin"
    END_SENT = "end sent"  # the peer's frames are still handled until its end [2.5.5]
    DISCARDING = "end with an error sent"  # the peer's frames are dropped until its end [2.5.5]
    END_RCVD = "end received"
    ENDED = "ended"  # both ends sent: the channel is free


class SessionInput(enum.Enum):
    BEGIN_IN = "begin received"
    BEGIN_OUT = "begin sent"
    END_IN = "end received"
    END_OUT = "end sent"
    END_ERROR_OUT = "end with an error sent"


_S, _SI = SessionState, SessionInput
SESSION_TRANSITIONS = {
    (_S.UNMAPPED, _SI.BEGIN_OUT): _S.BEGIN_SENT,
    (_S.UNMAPPED, _SI.BEGIN_IN): _S.BEGIN_RCVD,
    (_S.BEGIN_SENT, _SI.BEGIN_IN): _S.MAPPED,
    (_S.BEGIN_RCVD, _SI.BEGIN_OUT): _S.MAPPED,
    # ending before the peer answered our begin: its begin, then its end, still come
    (_S.BEGIN_SENT, _SI.END_OUT): _S.END_PIPE,
    (_S.BEGIN_SENT, _SI.END_ERROR_OUT): _S.END_PIPE,
    (_S.END_PIPE, _SI.BEGIN_IN): _S.END_SENT,
    (_S.MAPPED, _SI.END_OUT): _S.END_SENT,
    (_S.MAPPED, _SI.END_ERROR_OUT): _S.DISCARDING,
    (_S.MAPPED, _SI.END_IN): _S.END_RCVD,
    (_S.END_SENT, _SI.END_IN): _S.ENDED,
    (_S.DISCARDING, _SI.END_IN): _S.ENDED,
    (_S.END_RCVD, _SI.END_OUT): _S.ENDED,
    (_S.END_RCVD, _SI.END_ERROR_OUT): _S.ENDED,
    # ending again does nothing (the session is ended already, or its end is on its way)
    **{
        (state, end): state
        for state in (_S.END_PIPE, _S.END_SENT, _S.DISCARDING, _S.ENDED)
        for end in (_SI.END_OUT, _SI.END_ERROR_OUT)
    },
}


class LinkState(enum.Enum):
    """A link end's states, after the attach and detach exchanges [2.6.3, 2.6.6], named
    like the session's. Either side may pipeline: our attach and detach before the peer's
    attach (``DETACH_PIPE``), or the peer's before ours (``ATTACH_DETACH_RCVD``, e.g. a
    client giving up on an attach the owner had not answered yet). Once detached at both
    ends (or its session ended) a link is spent: a new attach makes a new :class:`Link`."""

    UNATTACHED = "neither attach sent nor received"
    ATTACH_SENT = "attach sent"
    ATTACH_RCVD = "attach received"
    ATTACHED = "attached"
    DETACH_PIPE = "attach and detach sent before the peer's attach"
    ATTACH_DETACH_RCVD = "attach and detach received before our attach"
    DETACH_SENT = "detach sent"  # the peer's frames on it are still handled until its detach
    DISCARDING = "detach with an error sent"  # the peer's frames on it are dropped until its detach
    DETACH_RCVD = "detach received"
    DETACHED = "detached"  # at both ends: the handles are free


class LinkInput(enum.Enum):
    ATTACH_IN = "attach received"
    ATTACH_OUT = "attach sent"
    DETACH_IN = "detach received"
    DETACH_OUT = "detach sent"
    DETACH_ERROR_OUT = "detach with an error sent"
    SESSION_END = "its session ended"  # ends a link in any state, without a detach [2.5.5]


_L, _LI = LinkState, LinkInput
LINK_TRANSITIONS = {
    (_L.UNATTACHED, _LI.ATTACH_OUT): _L.ATTACH_SENT,
    (_L.UNATTACHED, _LI.ATTACH_IN): _L.ATTACH_RCVD,
    (_L.ATTACH_SENT, _LI.ATTACH_IN): _L.ATTACHED,
    (_L.ATTACH_RCVD, _LI.ATTACH_OUT): _L.ATTACHED,
    (_L.ATTACH_SENT, _LI.DETACH_OUT): _L.DETACH_PIPE,
    (_L.ATTACH_SENT, _LI.DETACH_ERROR_OUT): _L.DETACH_PIPE,
    (_L.DETACH_PIPE, _LI.ATTACH_IN): _L.DISCARDING,  # an answer to a link we gave up: nothing of it matters
    (_L.ATTACH_RCVD, _LI.DETACH_IN): _L.ATTACH_DETACH_RCVD,
    (_L.ATTACH_DETACH_RCVD, _LI.ATTACH_OUT): _L.DETACH_RCVD,
    (_L.ATTACHED, _LI.DETACH_OUT): _L.DETACH_SENT,
    (_L.ATTACHED, _LI.DETACH_ERROR_OUT): _L.DISCARDING,
    (_L.ATTACHED, _LI.DETACH_IN): _L.DETACH_RCVD,
    (_L.DETACH_SENT, _LI.DETACH_IN): _L.DETACHED,
    (_L.DISCARDING, _LI.DETACH_IN): _L.DETACHED,
    (_L.DETACH_RCVD, _LI.DETACH_OUT): _L.DETACHED,
    (_L.DETACH_RCVD, _LI.DETACH_ERROR_OUT): _L.DETACHED,
    # attaching once ours is sent does nothing, and so does detaching once ours is sent
    # (the owner answering a detach that answered its own, for one)
    **{
        (state, _LI.ATTACH_OUT): state
        for state in (
            _L.ATTACH_SENT,
            _L.ATTACHED,
            _L.DETACH_RCVD,
            _L.DETACH_PIPE,
            _L.DETACH_SENT,
            _L.DISCARDING,
            _L.DETACHED,
        )
    },
    **{
        (state, detach): state
        for state in (_L.DETACH_PIPE, _L.DETACH_SENT, _L.DISCARDING, _L.DETACHED)
        for detach in (_LI.DETACH_OUT, _LI.DETACH_ERROR_OUT)
    },
    **{(state, _LI.SESSION_END): _L.DETACHED for state in _L},
}
del _S, _SI, _L, _LI

# What a missing pair is, by input: the peer's inputs are its breaches (a link's attach or
# detach naming a handle that is taken or free is the session's concern [2.7.3, 2.7.7]; a
# begin or end on a channel it cannot be on, the connection's); the owner's are its bugs.
_MISSED: dict[enum.Enum, tuple[type[ProtocolError], str, Scope]] = {
    ConnectionInput.HEADER: (RemoteProtocolError, "amqp:connection:framing-error", "connection"),
    ConnectionInput.OPEN_IN: (RemoteProtocolError, "amqp:not-allowed", "connection"),
    ConnectionInput.CLOSE_IN: (RemoteProtocolError, "amqp:not-allowed", "connection"),
    ConnectionInput.OPEN_OUT: (LocalProtocolError, "amqp:not-allowed", "connection"),
    ConnectionInput.CLOSE_OUT: (LocalProtocolError, "amqp:not-allowed", "connection"),
    SessionInput.BEGIN_IN: (RemoteProtocolError, "amqp:not-allowed", "connection"),
    SessionInput.END_IN: (RemoteProtocolError, "amqp:not-allowed", "connection"),
    SessionInput.BEGIN_OUT: (LocalProtocolError, "amqp:not-allowed", "session"),
    SessionInput.END_OUT: (LocalProtocolError, "amqp:not-allowed", "session"),
    SessionInput.END_ERROR_OUT: (LocalProtocolError, "amqp:not-allowed", "session"),
    LinkInput.ATTACH_IN: (RemoteProtocolError, "amqp:session:handle-in-use", "session"),
    LinkInput.DETACH_IN: (RemoteProtocolError, "amqp:session:unattached-handle", "session"),
    LinkInput.ATTACH_OUT: (LocalProtocolError, "amqp:not-allowed", "link"),
    LinkInput.DETACH_OUT: (LocalProtocolError, "amqp:not-allowed", "link"),
    LinkInput.DETACH_ERROR_OUT: (LocalProtocolError, "amqp:not-allowed", "link"),
}


def _missed(event: enum.Enum, state: enum.Enum, endpoint: Session | Link | None) -> ProtocolError:
    """The error for a pair the tables lack: ``event`` in ``state`` of ``endpoint`` (the
    session or link it happened to; None for the connection)."""
    kind, condition, scope = _MISSED[event]
    if scope == "connection":
        endpoint = None
    elif scope == "session" and isinstance(endpoint, Link):
        endpoint = endpoint.session
    return kind(condition, f"{event.value} while {state.value}", scope, endpoint)


def _move(endpoint: Session | Link, table: Mapping[tuple[Any, Any], Any], event: enum.Enum) -> bool:
    """Move ``endpoint`` (a session or link) by ``table`` on ``event``; False if the table
    maps it to the same state (a repeated call: nothing to do).

    Raises:
        RemoteProtocolError: a peer's input the table lacks.
        LocalProtocolError: an owner's input the table lacks.
    """
    state = endpoint._state
    following = table.get((state, event))
    if following is None:
        raise _missed(event, state, endpoint)
    endpoint._state = following
    return following is not state


# A link's states by who is attached: ours sent and not detached; the peer's received and not detached
_OURS_ATTACHED = frozenset({LinkState.ATTACH_SENT, LinkState.ATTACHED, LinkState.DETACH_RCVD})
_PEERS_ATTACHED = frozenset({LinkState.ATTACH_RCVD, LinkState.ATTACHED, LinkState.DETACH_SENT, LinkState.DISCARDING})
_NEVER_ATTACHED_BY_US = frozenset({LinkState.UNATTACHED, LinkState.ATTACH_RCVD, LinkState.ATTACH_DETACH_RCVD})
# Links whose owner hears of their session's end: the peer had attached them (its end
# detaches them), or ours awaits an answer that will not come now.
_TOLD_ON_END = _PEERS_ATTACHED | {LinkState.ATTACH_SENT}
# Sessions that may send [2.5.5]; and the one whose settlements go out (the per-message check)
_SENDING = frozenset({SessionState.BEGIN_SENT, SessionState.MAPPED, SessionState.END_RCVD})
_MAPPED = SessionState.MAPPED
_AWAITING_HEADER = (ConnectionState.START, ConnectionState.OPEN_PIPE, ConnectionState.CLOSE_PIPE)
_OPEN_SENT = (ConnectionState.OPEN_PIPE, ConnectionState.OPEN_SENT, ConnectionState.OPENED)


class _Numbered(dict[int, Any]):
    """Our channels (a connection's sessions) or handles (a session's links), by number.
    :meth:`take` gives the lowest number not in use — a freed one (a heap) if any, else the
    next never used — in O(log n); :meth:`free` gives one back. (A scan from 0 made a peer
    attaching 30,000 links on one session, or beginning thousands of sessions, cost
    quadratic time and stalled the router.)"""

    __slots__ = ("_freed", "_next")

    def __init__(self) -> None:
        super().__init__()
        self._freed: list[int] = []  # a heap of numbers given back
        self._next = 0  # the lowest number never taken

    def take(self) -> int:
        """The number for a new entry (set it before the next :meth:`take`)."""
        if self._freed:
            return heapq.heappop(self._freed)
        self._next += 1
        return self._next - 1

    def free(self, number: int) -> None:
        """Forget the entry of ``number``; it is taken again before any higher one."""
        del self[number]
        heapq.heappush(self._freed, number)

    def clear(self) -> None:
        super().clear()
        self._freed.clear()
        self._next = 0


class Link:
    """One end of a link, made by :meth:`Session.link` (ours) or by the peer's attach
    (:class:`LinkAttached`). ``is_sender``: we send on it. ``handle``/``remote_handle``:
    ours and the peer's. The owner sets :attr:`source`, :attr:`target` (and may set
    :attr:`snd_settle_mode`, :attr:`rcv_settle_mode`) before :meth:`attach`, and
    :attr:`handler` before the link can carry a message. ``remote_*``: what the peer's
    attach said. Read-only for the owner: :attr:`credit`, :attr:`drain`,
    :attr:`delivery_count`, :attr:`state`."""

    def __init__(self, session: Session, name: str, is_sender: bool, handle: int):
        self.session = session
        self.name = name
        self.is_sender = is_sender
        self.handle = handle  # ours
        self.remote_handle: int | None = None
        self.handler: LinkHandler | None = None
        self.source: Terminus | None = None  # ours, sent in our attach
        self.target: Terminus | None = None
        self.remote_source: Terminus | None = None
        self.remote_target: Terminus | None = None
        self.snd_settle_mode = 2  # 0 unsettled, 1 settled, 2 mixed
        self.rcv_settle_mode = 0  # 0 first, 1 second
        self.remote_properties: dict[Any, Any] | None = None
        self.delivery_count = 0
        self.credit = 0  # as a sender: what the peer granted; as a receiver: what we granted
        self.drain = False
        # As a receiver: the largest message we take, announced in our attach (0: no limit).
        # A bigger one detaches the link with amqp:link:message-size-exceeded [2.7.3]; the
        # fast path takes single-frame messages up to _fast_limit only.
        self.max_message_size = 0
        self._fast_limit = MASK
        self._state = LinkState.UNATTACHED
        # what every single-frame transfer on this link starts with after the frame size:
        # doff 2, type 0, channel; transfer descriptor; list8 of 19 bytes, 5 fields; the
        # handle as uint; the delivery-id's constructor (see send)
        self._head = struct.pack(
            ">BBH3sBBBBIB", 2, 0, session.channel, b"\x00\x53\x14", 0xC0, 19, 5, 0x70, handle, 0x70
        )
        self._partial: list[bytes] | None = None  # an incoming multi-frame transfer
        self._partial_id = self._partial_size = 0
        self._partial_settled = False
        self._partial_state: Any = None

    def __repr__(self) -> str:
        return f"<Link {self.name!r} {'sender' if self.is_sender else 'receiver'} handle {self.handle}>"

    # -- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        """Where the attach and detach exchanges are (:data:`LINK_TRANSITIONS`)."""
        return self._state

    @property
    def attached(self) -> bool:
        """Our attach is sent and our detach is not."""
        return self._state in _OURS_ATTACHED

    @property
    def remote_attached(self) -> bool:
        """The peer's attach arrived and its detach has not."""
        return self._state in _PEERS_ATTACHED

    @property
    def presettled(self) -> bool:
        """The peer's attach asked for settled deliveries (snd-settle-mode settled)."""
        return self.snd_settle_mode == 1

    def _move(self, event: LinkInput) -> bool:
        """Take ``event`` (see :func:`_move`; a peer's breach has scope session, the owner's link)."""
        return _move(self, LINK_TRANSITIONS, event)

    def _stop(self) -> None:
        """Nothing more goes to the handler or out: no credit (so the fast path passes
        the peer's transfers to the slow one, which drops them), no partial message, our
        unsettled deliveries and waiting frames forgotten."""
        session = self.session
        if self._partial is not None:
            session.connection._buffered -= self._partial_size
        self.credit, self.drain, self._partial = 0, False, None
        session._drop_blocked(self.handle)
        if self.is_sender and session._unsettled_out:
            for delivery_id in [key for key, owner in session._unsettled_out.items() if owner is self]:
                del session._unsettled_out[delivery_id]

    # -- both ends ---------------------------------------------------------------------------

    def attach(self) -> None:
        """Send our attach, with :attr:`source` and :attr:`target`: a new link of ours, or
        the answer to the peer's (:class:`LinkAttached`). Does nothing once ours is sent,
        or once the link is detached (the engine may have detached it before the owner
        answered). Never raises: the table takes it in every state."""
        if not self._move(LinkInput.ATTACH_OUT):
            return
        if self._state is LinkState.ATTACH_SENT:  # ours first: the peer's attach answers it
            self.session._awaiting.setdefault((self.name, self.is_sender), self)
        fields = [
            self.name,
            UInt(self.handle),
            not self.is_sender,
            UByte(self.snd_settle_mode),
            UByte(self.rcv_settle_mode),
            self.source.described() if self.source else None,
            self.target.described() if self.target else None,
            None,
            None,
            UInt(self.delivery_count) if self.is_sender else None,
            ULong(self.max_message_size) if self.max_message_size else None,
        ]
        if self.max_message_size:
            self._fast_limit = self.max_message_size
        self.session._write(ATTACH, fields)

    def detach(self, *, closed: bool = True, error: Error | None = None) -> None:
        """Detach our end (``closed``: for good, else the terminus may be resumed) — ours
        first, or the answer to the peer's (:class:`LinkDetached`). With an ``error``, what
        the peer sends on the link until its detach arrives is dropped; without, it still
        reaches the handler. The link is forgotten once both ends are detached. Does
        nothing once ours is sent or the link is detached.

        Raises:
            LocalProtocolError: we never attached it (answer a peer's attach before
                detaching [2.6.3]: attach, then detach).
        """
        self._detach(closed, error)

    def _detach(self, closed: bool, error: Error | None) -> bool:
        """:meth:`detach`; whether our detach went out."""
        if not self._move(LinkInput.DETACH_OUT if error is None else LinkInput.DETACH_ERROR_OUT):
            return False
        session = self.session
        if self._state is LinkState.DETACH_SENT:  # the peer's transfers may still come; ours may not go
            session._drop_blocked(self.handle)
            if self.is_sender:
                self.credit = 0
        else:
            self._stop()
        session._write(DETACH, [UInt(self.handle), closed, error.described() if error else None])
        session._forget(self)
        return True

    # -- sending ------------------------------------------------------------------------------

    def send(self, payload: bytes, settled: bool = False, state: Described | None = None) -> int:
        """Send one message (uses one credit), with a delivery ``state`` if given (e.g. a
        transactional one), on a link whose attach we sent; its delivery id. The caller
        checks :attr:`credit` (zero once the link can no longer send) and, to keep frames
        from queueing here, :attr:`Session.blocked`; nothing else is checked: this is the
        per-message path. Frames beyond the peer's session window wait for it to open."""
        session = self.session
        delivery_id = session._next_delivery_id
        session._next_delivery_id = (delivery_id + 1) & MASK
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & MASK
        if not settled:
            session._unsettled_out[delivery_id] = self
        connection = session.connection
        if session._disposition is not None:
            session._flush_disposition()  # frames go out in the order they were made
        if (
            state is None
            and len(payload) + 64 <= connection.remote_max_frame_size
            and session.remote_incoming_window > 0
        ):
            session.remote_incoming_window -= 1
            session._next_outgoing_id = (session._next_outgoing_id + 1) & MASK
            out = connection._out
            out.append(
                _TRANSFER.pack(
                    len(payload) + 32,
                    self._head,
                    delivery_id,
                    b"\xa0\x04",
                    delivery_id,
                    b"\x43\x41" if settled else b"\x43\x42",
                )
            )
            out.append(payload)
        else:
            session._send_frames(self, delivery_id, payload, settled, state)
        return delivery_id

    def drained(self) -> None:
        """As a sender with nothing (more) to send: if the peer asked to drain, use the rest
        of the credit up and tell it [2.6.7]. Does nothing once the link is detached.

        Raises:
            LocalProtocolError: our attach is not sent yet.
        """
        if self.drain and self.credit > 0 and self._may_flow():
            self.delivery_count = (self.delivery_count + self.credit) & MASK
            self.credit = 0
            self.session._write_flow(self)

    def settle(self, delivery_id: int, state: Described | None = None) -> None:
        """Settle a delivery: an incoming one with its outcome (``ACCEPTED``,
        ``outcome(…)``), or one of ours the peer left unsettled (``state`` as it left it, or
        None). Settlements of consecutive ids with the same state join one ranged
        disposition, written by :meth:`Connection.data_to_send` or before the next frame.
        Nothing goes out once the session is ending. No state is checked: this is the
        per-message path."""
        session = self.session
        if self.is_sender:
            if session._unsettled_out.pop(delivery_id, None) is not None:
                session._dispose(False, delivery_id, state)
        else:
            session._dispose(True, delivery_id, state)

    # -- receiving ----------------------------------------------------------------------------

    def flow(self, credit: int, *, drain: bool = False) -> None:
        """As a receiver: grant ``credit`` in all (not in addition), asking the sender to
        use it up or say it has nothing (``drain``). Does nothing once the link is
        detached (the owner may learn of that after the fact).

        Raises:
            LocalProtocolError: our attach is not sent yet.
        """
        if self._may_flow():
            self.credit = credit
            self.drain = drain
            self.session._write_flow(self)

    def _may_flow(self) -> bool:
        """A flow naming this link may go out now; raises if it never could have."""
        if self._state in _OURS_ATTACHED:
            return True
        if self._state in _NEVER_ATTACHED_BY_US:
            raise LocalProtocolError("amqp:not-allowed", f"a flow on {self.name!r} before our attach", "link", self)
        return False


class Session:
    """One session, made by :meth:`Connection.session` (ours) or by the peer's begin
    (:class:`SessionBegun`): a channel (``channel`` ours, ``remote_channel`` the peer's),
    its transfer windows, the delivery ids and handles of its links. Read-only for the
    owner: :attr:`remote_incoming_window`, :attr:`blocked`, :attr:`unsettled`,
    :attr:`state`."""

    def __init__(self, connection: Connection, channel: int):
        self.connection = connection
        self.channel = channel
        self.remote_channel: int | None = None
        self.remote_incoming_window = 0  # transfer frames the peer takes before its next flow
        self._state = SessionState.UNMAPPED
        self._next_outgoing_id = 0
        self._next_delivery_id = 0
        self._next_incoming_id = 0
        self._incoming_window = INCOMING_WINDOW
        self._links: dict[int, Link] = {}  # by the peer's handle, while the peer's end is attached
        self._handles = _Numbered()  # links by our handle, until both ends are detached
        self._awaiting: dict[tuple[str, bool], Link] = {}  # ours attached first, by (name, is_sender)
        self._unsettled_out: dict[int, Link] = {}  # delivery id → link, for what we sent unsettled
        self._disposition: list[Any] | None = None  # [role, first, last, state]: the range being batched
        self._blocked: deque[tuple[int, bytes]] = deque()  # (handle, transfer frame body) waiting for the window

    def __repr__(self) -> str:
        return f"<Session channel {self.channel} {self._state.name}>"

    # -- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        """Where the begin and end exchanges are (:data:`SESSION_TRANSITIONS`)."""
        return self._state

    @property
    def blocked(self) -> bool:
        """Transfer frames are waiting for the peer's incoming window: send no more now."""
        return bool(self._blocked) or self.remote_incoming_window <= 0

    @property
    def unsettled(self) -> int:
        """How many deliveries we sent unsettled that the peer has not settled yet."""
        return len(self._unsettled_out)

    def _move(self, event: SessionInput) -> bool:
        """Take ``event`` (see :func:`_move`; a peer's breach has scope connection, the owner's session)."""
        return _move(self, SESSION_TRANSITIONS, event)

    # -- what the owner does ----------------------------------------------------------------------

    def link(self, name: str, *, sender: bool) -> Link:
        """A new link end on this session, with our next free handle: set its ``source``,
        ``target`` and ``handler``, then :meth:`Link.attach` it.

        Raises:
            LocalProtocolError: the session is ending or over.
        """
        if self._state not in _SENDING:
            raise LocalProtocolError("amqp:not-allowed", f"a link on a session {self._state.value}", "session", self)
        handle = self._handles.take()
        link = self._handles[handle] = Link(self, name, sender, handle)
        return link

    def end(self, error: Error | None = None) -> None:
        """Send our end (ours first, or the answer to the peer's — the engine answers that
        itself). Pending settlements go out first; transfers still waiting for the window
        do not. Its links end with it when the peer's end arrives (:class:`LinkDetached`
        for each the peer had attached); with an ``error``, at once, and what the peer
        sends on the session until its end is dropped [2.5.5]. Does nothing once ours is
        sent.

        Raises:
            LocalProtocolError: never begun (not possible for a session the engine made).
        """
        self._end(error)

    def _end(self, error: Error | None) -> bool:
        """:meth:`end`; whether our end went out."""
        if not self._move(SessionInput.END_OUT if error is None else SessionInput.END_ERROR_OUT):
            return False
        self._flush_disposition()
        self._blocked.clear()  # nothing goes out on the channel after our end [2.5.5]
        self.connection._write(self.channel, END, [error.described() if error else None])
        if self._state is SessionState.DISCARDING:
            self._end_links(error, by_peer=False)
        else:  # the peer's transfers may still come until its end; ours may not go
            for link in self._handles.values():
                if link.is_sender:
                    link.credit = 0
        self.connection._forget(self)
        return True

    def _begin(self) -> None:
        self._move(SessionInput.BEGIN_OUT)
        handle_max = self.connection.handle_max
        self.connection._write(
            self.channel,
            BEGIN,
            [
                UShort(self.remote_channel) if self.remote_channel is not None else None,
                UInt(self._next_outgoing_id),
                UInt(self._incoming_window),
                UInt(MASK),
                UInt(handle_max) if handle_max != MASK else None,
            ],
        )

    def _end_links(self, error: Error | None, *, by_peer: bool) -> None:
        """The session ended (the peer's end, or ours with an error): every link with it,
        without detach frames; the owner hears of those it would otherwise wait on."""
        events, links = self.connection.events, list(self._handles.values())
        self._handles.clear()
        self._awaiting.clear()
        self._links.clear()
        self._unsettled_out.clear()
        self._blocked.clear()
        for link in links:
            told = link._state in _TOLD_ON_END
            link._move(LinkInput.SESSION_END)
            link._stop()
            if told:
                events.append(LinkDetached(link, False, error, by_peer))

    def _forget(self, link: Link) -> None:
        """Drop a link once both ends have detached: its handles are free again."""
        if link._state is not LinkState.DETACHED:
            return
        link._stop()
        if self._handles.get(link.handle) is link:
            self._handles.free(link.handle)
        if link.remote_handle is not None and self._links.get(link.remote_handle) is link:
            del self._links[link.remote_handle]

    # -- output -------------------------------------------------------------------------------

    def _write(self, code: int, fields: list[Any], payload: bytes = b"") -> None:
        """A frame on this session; dropped once our end is sent [2.5.5] (a late settle or
        flow of the owner's, an answer to a frame the peer sent before it saw our end)."""
        if self._state in _SENDING:
            self._flush_disposition()
            self.connection._write(self.channel, code, fields, payload)

    def _write_flow(self, link: Link | None = None) -> None:
        fields: list[Any] = [
            UInt(self._next_incoming_id),
            UInt(self._incoming_window),
            UInt(self._next_outgoing_id),
            UInt(MASK),
        ]
        if link is not None:
            fields += [UInt(link.handle), UInt(link.delivery_count), UInt(link.credit), None, link.drain]
        self._write(FLOW, fields)

    def _dispose(self, receiver: bool, delivery_id: int, state: Described | None) -> None:
        """Settle one delivery towards the peer, extending the pending range when it can.
        Nothing goes out unless the session is mapped; a pending range implies it is (our
        end flushes it first), so only a new range looks at the state."""
        pending = self._disposition
        if pending is not None:
            if pending[0] == receiver and pending[3] is state and delivery_id == (pending[2] + 1) & MASK:
                pending[2] = delivery_id
                return
            self._flush_disposition()
        elif self._state is not _MAPPED:
            return
        self._disposition = [receiver, delivery_id, delivery_id, state]
        self.connection._dirty.add(self)

    def _flush_disposition(self) -> None:
        pending = self._disposition
        if pending is not None:
            self._disposition = None
            receiver, first, last, state = pending
            self.connection._write(self.channel, DISPOSITION, [receiver, UInt(first), UInt(last), True, state])

    def _send_frames(
        self, link: Link, delivery_id: int, payload: bytes, settled: bool, state: Described | None = None
    ) -> None:
        """A transfer in as many frames as the peer's max frame size needs; frames beyond
        the peer's incoming window wait for it to open."""

        def first(more: bool) -> bytes:
            if state is None:
                return _TRANSFER_FIRST.pack(
                    b"\x00\x53\x14",
                    0xC0,
                    20,
                    6,
                    0x70,
                    link.handle,
                    0x70,
                    delivery_id,
                    0xA0,
                    4,
                    delivery_id,
                    0x43,
                    0x41 if settled else 0x42,
                    0x41 if more else 0x42,
                )
            return b"\x00\x53\x14" + encode(
                [UInt(link.handle), UInt(delivery_id), _U32.pack(delivery_id), UInt(0), settled, more, None, state]
            )

        limit = self.connection.remote_max_frame_size - 8  # the frame header
        body = first(False)
        handle, blocked = link.handle, self._blocked
        if len(body) + len(payload) <= limit:
            blocked.append((handle, body + payload))
        else:
            head = limit - len(body)  # what the first frame carries
            blocked.append((handle, first(True) + payload[:head]))
            room = limit - _TRANSFER_NEXT.size
            for start in range(head, len(payload), room):
                more = start + room < len(payload)
                body = _TRANSFER_NEXT.pack(
                    b"\x00\x53\x14", 0xC0, 11, 6, 0x70, handle, 0x40, 0x40, 0x40, 0x40, 0x41 if more else 0x42
                )
                blocked.append((handle, body + payload[start : start + room]))
        self._release_blocked()

    def _release_blocked(self) -> None:
        connection, channel = self.connection, self.channel
        while self._blocked and self.remote_incoming_window > 0:
            _, body = self._blocked.popleft()
            self.remote_incoming_window -= 1
            self._next_outgoing_id = (self._next_outgoing_id + 1) & MASK
            connection._write_raw(channel, body)

    def _drop_blocked(self, handle: int) -> None:
        """Forget the waiting frames of one link (detached: they may not go out now)."""
        if self._blocked:
            self._blocked = deque(entry for entry in self._blocked if entry[0] != handle)


class _SealedOutput(list[bytes]):
    """The output once our close is in it. "[The close] frame MUST be the last thing ever
    written onto a connection" [2.4.3]: what is made after it (answers to events still
    being handled, a consumer's pump) is dropped here, at no cost to the paths that append."""

    __slots__ = ()

    def append(self, item: bytes) -> None:
        pass


class _Quiet:
    """A connection's silences, in the clock that :meth:`Connection.tick` is given: when the
    peer last sent and when we last wrote, as of the last tick (``tick``); None: since that
    tick."""

    __slots__ = ("input", "output", "tick")

    def __init__(self) -> None:
        self.input: float | None = None
        self.output: float | None = None
        self.tick: float | None = None


class Connection:
    """One AMQP connection, after SASL (done in front of it by the owner). A server
    (``server=True``, the listener) answers the peer's open, begins and attaches; a client
    opens at once (:meth:`open`), begins sessions (:meth:`session`) and attaches links
    (:meth:`Session.link`), and its :meth:`close` ends the output only when the peer's close
    has answered it.

    Settings (set before :meth:`open`): ``container_id``, ``hostname``, ``idle_timeout``
    (seconds; a peer silent for longer is dropped), ``max_frame_size``, ``channel_max``,
    ``handle_max`` (the largest handle the peer may attach on a session of ours),
    ``max_message_size`` (a larger incoming multi-frame message detaches its link),
    ``max_incoming_buffer`` (the bytes of incomplete multi-frame messages held for all links
    together; beyond it the connection closes with ``amqp:resource-limit-exceeded``),
    :attr:`offered_capabilities`, :attr:`properties`. What the peer's open said is in the
    ``remote_*`` attributes once :class:`ConnectionOpened` came. :attr:`events` holds the
    events not yet dispatched; the owner may read and clear it itself instead of
    :meth:`dispatch`.
    """

    # Asked of the peer in our open; assigned by a client that wants some. A class default,
    # so a server's connections keep 29 instance attributes (see the end of __init__).
    desired_capabilities: Sequence[str] = ()

    def __init__(
        self,
        *,
        container_id: str,
        server: bool = True,
        idle_timeout: float = 0.0,
        max_frame_size: int = 65536,
        channel_max: int = 65535,
        handle_max: int = MASK,
        hostname: str | None = None,
        max_message_size: int = 256 * 1024 * 1024,
        max_incoming_buffer: int = 256 * 1024 * 1024,
    ):
        self.container_id = container_id
        self.server = server
        self.idle_timeout = idle_timeout
        self.max_frame_size = max(max_frame_size, MIN_MAX_FRAME_SIZE)
        self.channel_max = channel_max
        self.handle_max = handle_max
        self.max_message_size = max_message_size
        self.max_incoming_buffer = max_incoming_buffer
        self.hostname = hostname
        self.offered_capabilities: list[str] = []
        self.properties: dict[Any, Any] | None = None
        self.remote_container_id: str | None = None
        self.remote_hostname: str | None = None
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE  # until the peer's open says more
        self.remote_idle_timeout = 0.0
        self.remote_properties: dict[Any, Any] = {}
        self.remote_offered_capabilities: list[str] = []
        self.remote_desired_capabilities: list[str] = []
        self.events: list[Any] = []
        self._state = ConnectionState.START
        self._sessions: dict[int, Session] = {}  # by the peer's channel, while the peer's end is begun
        self._channels = _Numbered()  # sessions by our channel, until both ends are ended
        self._out: list[bytes] = [AMQP_HEADER]
        self._dirty: set[Session] = set()  # sessions with a disposition range pending
        self._in = b""
        self._quiet = _Quiet()  # when the peer last sent and when we last wrote
        self._buffered = 0  # bytes of incoming multi-frame messages not complete yet, on all links
        self._finished = False  # the output is complete: close the socket once it is written
        # (No more instance attributes here: at 30, CPython 3.11 stops sharing the keys of
        # its instance dicts and every attribute load on the message paths gets slower.)

    # -- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        """Where the header, open and close exchanges are (:data:`CONNECTION_TRANSITIONS`)."""
        return self._state

    @property
    def opened(self) -> bool:
        """Both opens are exchanged and neither close."""
        return self._state is ConnectionState.OPENED

    def _move(self, event: ConnectionInput) -> None:
        """Take ``event``.

        Raises:
            RemoteProtocolError: a peer's input the table lacks.
            LocalProtocolError: an owner's input the table lacks.
        """
        following = CONNECTION_TRANSITIONS.get((self._state, event))
        if following is None:
            raise _missed(event, self._state, None)
        self._state = following

    # -- what the owner does ----------------------------------------------------------------

    def open(self) -> None:
        """Send our ``open`` (a server: in answer to :class:`ConnectionOpened`; a client: at
        once). Does nothing once the connection is closing. A server then reads what the
        peer sent after its open (events may follow).

        Raises:
            LocalProtocolError: our open is sent already.
        """
        if self._state in (ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE, ConnectionState.END):
            return
        self._open()
        if self._in and self.server:  # what the peer sent after its open waited for ours
            self._consume(self._in)

    def _open(self) -> None:
        self._move(ConnectionInput.OPEN_OUT)
        idle = UInt(int(self.idle_timeout * 1000)) if self.idle_timeout else None
        self._write(
            0,
            OPEN,
            [
                self.container_id,
                self.hostname,
                UInt(self.max_frame_size),
                UShort(self.channel_max),
                idle,
                None,
                None,
                symbol_array(self.offered_capabilities),
                symbol_array(self.desired_capabilities),
                self.properties,
            ],
        )

    def close(self, error: Error | None = None) -> None:
        """Send our ``close`` (an ``open`` first if we had not); nothing of the peer's
        reaches a handler or an event after it but its close. A server's output then ends;
        a client's once the peer's close answered. Does nothing once ours is sent."""
        if self._state in (ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE, ConnectionState.END):
            return
        if self._state in (ConnectionState.START, ConnectionState.HDR_EXCH, ConnectionState.OPEN_RCVD):
            if self._state is ConnectionState.START and self.server:
                self._state = ConnectionState.HDR_EXCH  # refusing before the peer's header came: answer it anyway
            self._open()  # (what the peer sent after its open is not read: we are refusing it)
        self._move(ConnectionInput.CLOSE_OUT)
        # The frame loop may be running (a handler closing): without sessions, the rest of
        # its transfers leave the fast path for _performative, which ignores them [2.4.6].
        self._sessions.clear()
        self._write(0, CLOSE, [error.described() if error else None])
        self._out = _SealedOutput(self._out)
        self._finished = self.server or self._state is ConnectionState.END

    def session(self) -> Session:
        """Begin a session of ours; :class:`SessionBegun` follows when the peer answers.

        Raises:
            LocalProtocolError: our open is not sent, or our close is.
        """
        if self._state not in _OPEN_SENT:
            raise LocalProtocolError("amqp:not-allowed", f"a session while {self._state.value}")
        session = self._new_session()
        session._begin()
        return session

    def _new_session(self) -> Session:
        channel = self._channels.take()
        session = self._channels[channel] = Session(self, channel)
        return session

    def _forget(self, session: Session) -> None:
        """Drop a session once both ends have ended: its channels are free again."""
        if session._state is not SessionState.ENDED:
            return
        if self._channels.get(session.channel) is session:
            self._channels.free(session.channel)
        if session.remote_channel is not None and self._sessions.get(session.remote_channel) is session:
            del self._sessions[session.remote_channel]

    def release(self) -> None:
        """Break the references between the connection, its sessions, its links and their
        handlers (each refers to the other), so that all of it is freed as soon as the
        owner lets go of it, without waiting for the cyclic garbage collector — which a
        long-running process may run rarely (a router kept every closed connection until
        a full collection). For when the connection is over and the owner
        is done with it: the sessions and links are forgotten, the links lose their
        handlers, pending events are dropped, and nothing more is read or written."""
        for session in list(self._channels.values()) + list(self._sessions.values()):
            for link in list(session._handles.values()) + list(session._links.values()):
                link._partial = None
                link.handler = None
            session._handles.clear()
            session._links.clear()
            session._awaiting.clear()
            session._unsettled_out.clear()
            session._blocked.clear()
            session._disposition = None
        self._channels.clear()
        self._sessions.clear()
        self._dirty.clear()
        self.events.clear()
        self._out = _SealedOutput()
        self._in = b""
        self._finished = True

    def dispatch(self, handlers: dict[type, Any]) -> None:
        """Hand each pending event to ``handlers[type(event)]`` (events without one are
        dropped), including the events the handlers cause, in order. Raises what a
        handler raises; the events after it in the same batch are then lost."""
        events = self.events
        while events:
            batch = events[:]
            events.clear()
            for event in batch:
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(event)

    # -- bytes ------------------------------------------------------------------------------------

    def _write(self, channel: int, code: int, fields: list[Any], payload: bytes = b"") -> None:
        while fields and fields[-1] is None:
            fields.pop()
        self._write_raw(channel, b"\x00\x53" + bytes([code]) + encode(fields), payload)

    def _write_raw(self, channel: int, body: bytes, payload: bytes = b"") -> None:
        self._out.append(_FRAME.pack(8 + len(body) + len(payload), 2, 0, channel))
        self._out.append(body)
        if payload:
            self._out.append(payload)

    @property
    def finished(self) -> bool:
        """Everything is written and the connection is over: close the socket."""
        return self._finished and not self._out and not self._dirty

    def data_to_send(self) -> bytes | None:
        """Bytes to write now (``b""``: nothing), pending settlements included; ``None``
        once everything was written and the connection is over (close the socket)."""
        for session in self._dirty:
            session._flush_disposition()
        self._dirty.clear()
        if not self._out:
            return None if self._finished else b""
        data = b"".join(self._out)
        self._out.clear()
        self._quiet.output = None  # we spoke: the next tick counts from then
        return data

    def tick(self, now: float) -> float:
        """Act on time (``now`` in seconds, any monotonic clock): drop a peer silent for
        longer than our idle timeout (a close with ``amqp:resource-limit-exceeded`` and
        :class:`ConnectionClosed`), send an empty frame when we would otherwise be silent
        for half of the peer's. The next deadline, 0 for none."""
        quiet = self._quiet
        if quiet.input is None:  # the peer spoke just before this tick (the driver ticks after each read)
            quiet.input = now
        if quiet.output is None:
            # we wrote at some time since the last tick, which this tick may follow by up to half
            # the peer's idle timeout (it was our deadline): counting from now would leave the
            # peer without a frame from us for up to its whole idle timeout, and it drops us
            quiet.output = now if quiet.tick is None else quiet.tick
        quiet.tick = now
        if self._state in (ConnectionState.END, ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE):
            return 0.0
        deadlines = []
        if self.idle_timeout:
            if now >= quiet.input + self.idle_timeout:
                self._fail(RemoteProtocolError("amqp:resource-limit-exceeded", "local-idle-timeout expired"))
                return 0.0
            deadlines.append(quiet.input + self.idle_timeout)
        if self.remote_idle_timeout and self._state is not ConnectionState.START:
            if now >= quiet.output + self.remote_idle_timeout / 2:
                self._out.append(b"\x00\x00\x00\x08\x02\x00\x00\x00")  # an empty frame keeps us alive
                quiet.output = now
            deadlines.append(quiet.output + self.remote_idle_timeout / 2)
        return min(deadlines) if deadlines else 0.0

    @property
    def incoming_buffered(self) -> int:
        """Bytes of incomplete incoming multi-frame messages held now, all links together
        (bounded by :attr:`max_incoming_buffer`); the owner may count them towards a
        budget of its own."""
        return self._buffered

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed what the peer sent (``b""``: it closed its side, which ends the connection:
        :class:`ConnectionClosed` unless its close came first). Complete frames are handled
        at once: link handlers are called, events queued. A server waits for the owner's
        :meth:`open` before it reads past the peer's open. The peer's protocol errors are
        answered at their scope (see the module docstring); they are not raised. Does
        nothing once the connection is over.

        Raises:
            What a link handler raises (see :class:`LinkHandler`); the connection is then
            unusable.
        """
        if self._state is ConnectionState.END or self._finished:
            return
        if not data:
            if self._state is not ConnectionState.CLOSE_RCVD:
                self.events.append(
                    ConnectionClosed(Error("amqp:connection:framing-error", "the peer closed the socket"), by_peer=True)
                )
            self._state, self._finished = ConnectionState.END, True
            return
        if type(data) is not bytes:
            data = bytes(data)
        self._quiet.input = None  # the peer spoke: the next tick counts from then
        self._consume(self._in + data if self._in else data)

    def _consume(self, buffer: bytes) -> None:
        try:
            offset = self._read_frames(buffer)
        except RemoteProtocolError as exc:
            self._fail(exc)
            return
        except DecodeError as exc:
            self._fail(RemoteProtocolError("amqp:decode-error", str(exc)))
            return
        self._in = buffer[offset:]

    def _fail(self, exc: ProtocolError) -> None:
        """The connection ends on a breach: our close with its error, and the event."""
        error = Error(exc.condition, str(exc))
        self.events.append(ConnectionClosed(error, by_peer=False))
        self._in = b""
        self.close(error)
        self._finished = True

    def _answer(self, exc: RemoteProtocolError) -> None:
        """The peer broke the protocol on one link or session: detach or end just that,
        with the error, and tell the owner."""
        error = Error(exc.condition, str(exc))
        endpoint = exc.endpoint
        if exc.scope == "link":
            link: Link = endpoint
            if link._state is LinkState.ATTACH_RCVD:  # refused before the owner answered: attach first [2.6.3]
                if link.is_sender:
                    link.source, link.target = None, link.remote_target
                else:
                    link.source, link.target = link.remote_source, None
                link.attach()
            if link._detach(True, error):
                self.events.append(LinkDetached(link, True, error, by_peer=False))
        else:
            session: Session = endpoint
            if session._end(error):  # its links' events come from there
                self.events.append(SessionEnded(session, error, by_peer=False))

    def _read_frames(self, buffer: bytes) -> int:
        """Handle every complete frame in ``buffer``; the offset of the first byte not
        handled (a partial frame, or what waits for our open).

        Raises:
            RemoteProtocolError: a breach of connection scope (the narrower ones are
                answered here, frame by frame).
            DecodeError: a performative that does not decode.
        """
        offset, end = 0, len(buffer)
        if self._state in _AWAITING_HEADER:
            if end < 8:
                if not AMQP_HEADER.startswith(buffer):
                    raise RemoteProtocolError("amqp:connection:framing-error", f"not an AMQP 1.0 header: {buffer!r}")
                return 0
            if buffer[:8] != AMQP_HEADER:
                raise RemoteProtocolError("amqp:connection:framing-error", f"not an AMQP 1.0 header: {buffer[:8]!r}")
            self._move(ConnectionInput.HEADER)
            offset = 8
        unpack_frame, unpack_u32, tails = _FRAME.unpack_from, _U32.unpack_from, _TRANSFER_TAILS
        sessions, limit = self._sessions, self.max_frame_size
        while end - offset >= 8:
            size, doff, kind, channel = unpack_frame(buffer, offset)
            if size > limit or size < 8 or doff != 2 or kind != 0:
                _check_frame_header(size, doff, kind, limit)
            frame_end: int = offset + size
            if frame_end > end:
                break
            body = offset + doff * 4
            offset = frame_end
            if body == frame_end:
                continue  # an empty frame: the peer is alive
            # The transfer fast path: a list8 whose handle, delivery-id, tag and the rest use the
            # usual constructors is read in place, and a whole message within credit goes
            # straight to the link's handler. Anything else takes the codec (_performative),
            # and so does every transfer on a link that is not taking messages (no credit:
            # see Link._stop) or of a session ended with an error (no links).
            # Hostile input: every index read is below the final ``at``, and a message is taken
            # only if ``at <= after <= frame_end``, so nothing outside the frame counts; a frame
            # cut short at the end of the read raises IndexError (zero-cost try: nothing on the
            # way through) and takes the codec, which says what is wrong.
            if buffer.startswith(b"\x00\x53\x14\xc0", body) and (session := sessions.get(channel)) is not None:
                flags = None
                try:
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
                        if 3 <= count <= 7 and at <= after <= frame_end:
                            flags = tails.get(buffer[at:after])
                except (IndexError, struct.error):
                    pass
                if flags is not None:
                    link = session._links.get(handle)
                    if (
                        link is not None
                        and not flags[1]
                        and link._partial is None
                        and link.credit > 0
                        and not link.is_sender
                        and frame_end - after <= link._fast_limit
                    ):
                        session._next_incoming_id = (session._next_incoming_id + 1) & MASK
                        session._incoming_window -= 1
                        if session._incoming_window < INCOMING_WINDOW // 2:
                            session._incoming_window = INCOMING_WINDOW
                            session._write_flow()
                        link.credit -= 1
                        link.delivery_count = (link.delivery_count + 1) & MASK
                        assert link.handler is not None  # set before the credit was granted (LinkHandler)
                        link.handler.on_transfer(delivery_id, buffer[after:frame_end], flags[0], None)
                        continue
            if buffer.startswith(_OPEN_PREFIX, body, frame_end) and self.server:
                self._performative(channel, buffer, body, frame_end)
                return offset  # the rest waits for our open (the owner decides on it first)
            try:
                self._performative(channel, buffer, body, frame_end)
            except RemoteProtocolError as exc:  # (no cost on the way through: zero-cost try)
                if exc.scope == "connection":
                    raise
                self._answer(exc)
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
            if self._state is ConnectionState.CLOSE_RCVD:
                self.close()
            self._finished = True
            return
        if self._state is ConnectionState.CLOSE_SENT:
            return  # after our close, the rest is ignored [2.4.6]
        if self._state is not ConnectionState.OPENED:
            raise RemoteProtocolError("amqp:not-allowed", f"performative 0x{code:02x} before the connection is open")
        if code == BEGIN:
            self._on_begin(channel, fields)
            return
        session = self._sessions.get(channel)
        if session is None:
            raise RemoteProtocolError("amqp:not-allowed", f"performative 0x{code:02x} on channel {channel}, not begun")
        if session._state is SessionState.DISCARDING and code != END:
            return  # we ended it with an error: dropped until the peer's end [2.5.5]
        if code == TRANSFER:
            self._slow_transfer(session, fields, buffer[after:frame_end])
            return
        _SESSION_HANDLERS[code](self, session, fields + [None] * 12)

    def _on_open(self, fields: list[Any]) -> None:
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

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        fields = fields + [None] * 8
        if channel in self._sessions:
            raise RemoteProtocolError("amqp:not-allowed", f"channel {channel} is begun already")
        if channel > self.channel_max:
            raise RemoteProtocolError("amqp:connection:framing-error", f"channel {channel} above channel-max")
        if fields[0] is not None:  # the answer to our begin
            session = self._channels.get(fields[0])
            if session is None or session.remote_channel is not None:
                raise RemoteProtocolError(
                    "amqp:not-allowed", f"begin answers channel {fields[0]}, which awaits no answer"
                )
        else:
            session = self._new_session()
        session._move(SessionInput.BEGIN_IN)
        session.remote_channel = channel
        session._next_incoming_id = fields[1] or 0
        session.remote_incoming_window = fields[2] or 0
        self._sessions[channel] = session
        if session._state is SessionState.BEGIN_RCVD:
            session._begin()  # the answer
        if session._state is SessionState.MAPPED:  # (not if we ended it meanwhile)
            self.events.append(SessionBegun(session))

    def _on_end(self, session: Session, fields: list[Any]) -> None:
        session._move(SessionInput.END_IN)
        error = Error.from_value(fields[0])
        session._end_links(error, by_peer=True)
        self.events.append(SessionEnded(session, error))
        session._end(None)  # the answer, unless ours went first
        self._forget(session)

    def _on_attach(self, session: Session, fields: list[Any]) -> None:
        name, handle, role = fields[0], fields[1], fields[2]
        if not isinstance(name, str) or not isinstance(handle, int) or not isinstance(role, bool):
            raise RemoteProtocolError("amqp:decode-error", "attach without a name, handle or role")
        if handle > self.handle_max:
            raise RemoteProtocolError("amqp:connection:framing-error", f"handle {handle} above handle-max [2.7.2]")
        if handle in session._links:
            raise RemoteProtocolError("amqp:session:handle-in-use", f"handle {handle} is in use", "session", session)
        source, target = Terminus.from_value(fields[5]), Terminus.from_value(fields[6])
        is_sender = role  # the peer is the receiver: we send
        link = session._awaiting.pop((name, is_sender), None)  # the answer to ours?
        if link is None:
            if session._state is not SessionState.MAPPED:
                return  # a new link on a session we ended: its end ends it [2.5.5]
            link = session.link(name, sender=is_sender)
            link.snd_settle_mode = fields[3] if fields[3] is not None else 2
        link._move(LinkInput.ATTACH_IN)
        link.remote_handle = handle
        link.remote_source, link.remote_target = source, target
        link.remote_properties = fields[13] if isinstance(fields[13], dict) else None
        if not is_sender and fields[9] is not None:
            link.delivery_count = fields[9]  # the sender's initial delivery count
        session._links[handle] = link
        if link._state is LinkState.DISCARDING:
            link._stop()  # the answer to an attach we gave up: its detach follows ours
        else:
            self.events.append(LinkAttached(link))

    def _link(self, session: Session, handle: Any) -> Link:
        """The link the peer's ``handle`` names.

        Raises:
            RemoteProtocolError: none does (session scope) [2.7.4, 2.7.5, 2.7.7].
        """
        link = session._links.get(handle)
        if link is None:
            raise RemoteProtocolError(
                "amqp:session:unattached-handle", f"handle {handle!r} is not attached", "session", session
            )
        return link

    def _on_detach(self, session: Session, fields: list[Any]) -> None:
        link = self._link(session, fields[0])
        link._move(LinkInput.DETACH_IN)
        assert link.remote_handle is not None  # a link in session._links has the peer's handle
        del session._links[link.remote_handle]
        self.events.append(LinkDetached(link, bool(fields[1]), Error.from_value(fields[2])))
        session._forget(link)

    def _on_flow(self, session: Session, fields: list[Any]) -> None:
        next_incoming_id, incoming_window = fields[0], fields[1] or 0
        if next_incoming_id is None:
            next_incoming_id = 0  # the peer has not seen our begin's next-outgoing-id yet
        session.remote_incoming_window = (next_incoming_id + incoming_window - session._next_outgoing_id) & MASK
        if session.remote_incoming_window > INCOMING_WINDOW:
            session.remote_incoming_window = 0  # ids ahead of ours: nothing fits
        session._release_blocked()
        if fields[4] is None:
            if fields[9]:
                session._write_flow()
            return
        link = self._link(session, fields[4])
        if link._state is LinkState.DISCARDING:
            return  # its session part counted; the rest is dropped until its detach
        if link.is_sender and (link._state is LinkState.DETACH_SENT or session._state is not _MAPPED):
            return  # we send no more on it (our detach or end is out): its credit stays zero
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
            session._write_flow(link)
        self.events.append(LinkFlow(link))

    def _on_disposition(self, session: Session, fields: list[Any]) -> None:
        receiver, first, last, settled, state = fields[0], fields[1], fields[2], bool(fields[3]), fields[4]
        if not isinstance(first, int):
            raise RemoteProtocolError("amqp:decode-error", "disposition without a first delivery id")
        if not receiver:
            return  # the peer settles what it sent us: we settle at once, nothing to do
        # Ids that name nothing of ours (settled already, sent settled, of a link detached
        # since) are ignored: the peer may name them in good faith [2.7.6].
        span = 0 if last is None else (last - first) & MASK
        unsettled = session._unsettled_out
        if span < len(unsettled):
            named: Any = ((first + index) & MASK for index in range(span + 1))
        else:  # a range wider than what is unsettled (up to 2**32 ids): walk what is unsettled
            named = sorted(
                (key for key in unsettled if (key - first) & MASK <= span), key=lambda key: (key - first) & MASK
            )
        for delivery_id in named:
            link = unsettled.pop(delivery_id, None) if settled else unsettled.get(delivery_id)
            if link is not None and link.handler is not None:
                link.handler.on_outcome(delivery_id, state, settled)

    def _slow_transfer(self, session: Session, fields: list[Any], payload: bytes) -> None:
        """A transfer the fast path did not take (unusual encoding, state, aborted, resume,
        more to come, or a link not taking messages)."""
        fields = fields + [None] * 11
        link = self._link(session, fields[0])
        self._delivery(session, link, fields[1], payload, bool(fields[4]), bool(fields[5]), fields[7], bool(fields[9]))

    def _delivery(
        self,
        session: Session,
        link: Link,
        delivery_id: int | None,
        payload: bytes,
        settled: bool,
        more: bool,
        state: Any,
        aborted: bool,
    ) -> None:
        """One transfer frame on ``link``: counted by the session in any case (its ids and
        window do not depend on the link), then checked against the link and handed over
        once the message is complete.

        Raises:
            RemoteProtocolError: a breach on the link (scope link).
        """
        session._next_incoming_id = (session._next_incoming_id + 1) & MASK
        session._incoming_window -= 1
        if session._incoming_window < INCOMING_WINDOW // 2:
            session._incoming_window = INCOMING_WINDOW
            session._write_flow()
        if link._state is LinkState.DISCARDING:
            return  # sent before the peer saw our detach [2.6.5]
        if link.is_sender:
            raise RemoteProtocolError(
                "amqp:not-allowed", f"transfer on {link.name!r}, on which the peer receives", "link", link
            )
        if link._partial is None:
            if delivery_id is None:
                raise RemoteProtocolError(
                    "amqp:decode-error", "the first transfer of a delivery needs a delivery-id", "link", link
                )
            if link.credit <= 0:
                raise RemoteProtocolError(
                    "amqp:link:transfer-limit-exceeded", f"transfer on {link.name!r} beyond credit", "link", link
                )
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & MASK
            if link.max_message_size and len(payload) > link.max_message_size:
                raise _message_too_large(link)
            if more:
                link._partial, link._partial_id, link._partial_settled, link._partial_state = (
                    [payload],
                    delivery_id,
                    settled,
                    state,
                )
                link._partial_size = len(payload)
                self._buffer(len(payload))
                return
        else:
            if delivery_id is not None and delivery_id != link._partial_id:  # [2.7.5 delivery-id]
                raise RemoteProtocolError(
                    "amqp:not-allowed",
                    f"transfer on {link.name!r} names delivery {delivery_id} amid delivery {link._partial_id}",
                    "link",
                    link,
                )
            link._partial.append(payload)
            link._partial_size += len(payload)
            self._buffered += len(payload)  # (counted before the checks: Link._stop takes it back)
            if link.max_message_size and link._partial_size > link.max_message_size:
                raise _message_too_large(link)  # at once: the rest of the message is not collected
            if link._partial_size > self.max_message_size:
                raise RemoteProtocolError(
                    "amqp:link:message-size-exceeded",
                    f"a message on {link.name!r} above {self.max_message_size} bytes",
                    "link",
                    link,
                )
            self._buffer(0)
            settled = settled or link._partial_settled
            state = state if state is not None else link._partial_state
            if more and not aborted:
                link._partial_settled, link._partial_state = settled, state
                return
            self._buffered -= link._partial_size
            delivery_id, payload, link._partial = link._partial_id, b"".join(link._partial), None
        if aborted:
            return
        assert link.handler is not None  # set before the credit was granted (LinkHandler)
        link.handler.on_transfer(delivery_id, payload, settled, state)

    def _buffer(self, size: int) -> None:
        """Count ``size`` more bytes of incomplete messages.

        Raises:
            RemoteProtocolError: the connection holds more than :attr:`max_incoming_buffer`
                of them (connection scope: amqp:resource-limit-exceeded).
        """
        self._buffered += size
        if self._buffered > self.max_incoming_buffer:
            raise RemoteProtocolError(
                "amqp:resource-limit-exceeded",
                f"incomplete incoming messages above {self.max_incoming_buffer} bytes "
                "on one connection (max-incoming-buffer)",
            )


def _message_too_large(link: Link) -> RemoteProtocolError:
    """ "Any attempt to deliver a message larger than this results in a message-size-exceeded
    link-error" [2.7.3]: the link ends, the rest of the connection goes on."""
    return RemoteProtocolError(
        "amqp:link:message-size-exceeded",
        f"a message on link {link.name!r} exceeds its max-message-size of {link.max_message_size} bytes",
        "link",
        link,
    )


_SESSION_HANDLERS = {
    END: Connection._on_end,
    ATTACH: Connection._on_attach,
    DETACH: Connection._on_detach,
    FLOW: Connection._on_flow,
    DISPOSITION: Connection._on_disposition,
}
