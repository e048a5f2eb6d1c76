"""The engine's three state machines, each a table of ``(state, input) -> next state`` kept
here as data: :data:`CONNECTION_TRANSITIONS` [2.4.6], :data:`SESSION_TRANSITIONS` [2.5.5]
and :data:`LINK_TRANSITIONS` [2.6.3, 2.6.6].

Inputs are frames received (``*_IN``) and frames sent (``*_OUT``) — the owner's calls, or
the engine's own answers. A pair the table lacks is an error: :data:`_MISSED` says which
(the peer's input: a :class:`~..wire.RemoteProtocolError`; the owner's: a
:class:`~..wire.LocalProtocolError`). A pair that maps a state to itself is an owner's call
the protocol makes meaningless but callers rely on being harmless (attaching twice,
detaching after the peer's detach answered ours, ending twice): it does nothing. The
tables are consulted on open, close, begin, end, attach and detach only; the per-message
paths (the transfer fast path, :meth:`.Link.send`, :meth:`.Link.settle`) look at no state,
so a link or session that must stop carrying messages is made to by data the fast path
reads anyway: its credit is zeroed and its handle maps are emptied.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..wire import LocalProtocolError, ProtocolError, RemoteProtocolError, Scope

if TYPE_CHECKING:
    from .link import Link
    from .session import Session

__all__ = [
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
    from .link import Link  # (here: link.py imports this module; an error path only)

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
