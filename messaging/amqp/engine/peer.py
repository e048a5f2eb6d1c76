"""The peer's performatives, other than the transfers the fast path takes
(:class:`.FrameReader`): decoded and checked, then handed to the connection, session or
link they concern by :class:`PeerFrames`.

A peer that breaks the protocol is answered at the narrowest scope that contains the
breach [2.8.15–2.8.17]:

- a link (a transfer beyond credit, on a link where the peer receives, a multi-frame
  message above :attr:`.Connection.max_message_size`, a continuation naming another
  delivery): a ``detach`` with ``closed`` and the error, then :class:`.LinkDetached` with
  ``by_peer`` false. What the peer sends on that link until its own detach arrives is
  dropped (it may have been sent before it saw ours): the link is ``DISCARDING``;
- a session (a handle that is not attached, a handle in use): an ``end`` with the error,
  :class:`.LinkDetached` for each of its links and :class:`.SessionEnded`, all with
  ``by_peer`` false; frames on the channel are dropped until the peer's ``end``;
- the connection (framing, a frame that does not decode, anything before ``open``, a
  channel not begun, a channel above channel-max, a handle above handle-max, incomplete
  multi-frame messages of all links above :attr:`.Connection.max_incoming_buffer`): a
  ``close`` with the error, and :class:`.ConnectionClosed`; the connection is over.

A breach of link or session scope is raised where it is found and answered by
:meth:`PeerFrames.answer`; one of connection scope ends the connection
(:meth:`.Connection._fail`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...codec import Described, decode
from ..wire import (
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
    RemoteProtocolError,
    Terminus,
    descriptor_code,
    symbols,
)
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionBegun,
    SessionEnded,
)
from .frames import _FIELDS, INCOMING_WINDOW, _check_fields
from .states import _MAPPED, ConnectionInput, ConnectionState, LinkInput, LinkState, SessionInput, SessionState

if TYPE_CHECKING:
    from .connection import Connection
    from .link import Link
    from .session import Session
    from .transfers import IncomingTransfers


class PeerFrames:
    """Hands each of the peer's performatives (but the fast path's transfers) to what it
    concerns: the connection (open, close), a session (begin, end, flow, disposition), a
    link (attach, detach, flow, transfer: the transfers to :class:`.IncomingTransfers`).
    One per connection, which it is given on each call (it keeps no reference to it)."""

    __slots__ = ("_deliver",)

    def __init__(self, transfers: IncomingTransfers) -> None:
        # the bound method, so that a transfer frame off the fast path costs one attribute
        # load here, as the method call did when this was part of the connection
        self._deliver = transfers.deliver

    def performative(self, connection: Connection, channel: int, buffer: bytes, body: int, frame_end: int) -> None:
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
            self._on_open(connection, fields)
            return
        if code == CLOSE:
            connection._move(ConnectionInput.CLOSE_IN)
            error = Error.from_value(fields[0] if fields else None)
            connection.events.append(ConnectionClosed(error, by_peer=True))
            if connection._state is ConnectionState.CLOSE_RCVD:
                connection.close()
            connection._finished = True
            return
        if connection._state is ConnectionState.CLOSE_SENT:
            return  # after our close, the rest is ignored [2.4.6]
        if connection._state is not ConnectionState.OPENED:
            raise RemoteProtocolError("amqp:not-allowed", f"performative 0x{code:02x} before the connection is open")
        if code == BEGIN:
            self._on_begin(connection, channel, fields)
            return
        session = connection._sessions.get(channel)
        if session is None:
            raise RemoteProtocolError("amqp:not-allowed", f"performative 0x{code:02x} on channel {channel}, not begun")
        if session._state is SessionState.DISCARDING and code != END:
            return  # we ended it with an error: dropped until the peer's end [2.5.5]
        if code == TRANSFER:
            self._slow_transfer(connection, session, fields, buffer[after:frame_end])
            return
        _SESSION_HANDLERS[code](self, connection, session, fields + [None] * 12)

    def _on_open(self, connection: Connection, fields: list[Any]) -> None:
        connection._move(ConnectionInput.OPEN_IN)
        fields = fields + [None] * 10
        connection.remote_container_id = fields[0]
        connection.remote_hostname = fields[1]
        connection.remote_max_frame_size = max(fields[2] if fields[2] is not None else MASK, MIN_MAX_FRAME_SIZE)
        connection.remote_idle_timeout = (fields[4] or 0) / 1000
        connection.remote_offered_capabilities = symbols(fields[7])
        connection.remote_desired_capabilities = symbols(fields[8])
        connection.remote_properties = fields[9] if isinstance(fields[9], dict) else {}
        connection.events.append(ConnectionOpened())

    def _on_begin(self, connection: Connection, channel: int, fields: list[Any]) -> None:
        fields = fields + [None] * 8
        if channel in connection._sessions:
            raise RemoteProtocolError("amqp:not-allowed", f"channel {channel} is begun already")
        if channel > connection.channel_max:
            raise RemoteProtocolError("amqp:connection:framing-error", f"channel {channel} above channel-max")
        if fields[0] is not None:  # the answer to our begin
            session = connection._channels.get(fields[0])
            if session is None or session.remote_channel is not None:
                raise RemoteProtocolError(
                    "amqp:not-allowed", f"begin answers channel {fields[0]}, which awaits no answer"
                )
        else:
            session = connection._new_session()
        session._move(SessionInput.BEGIN_IN)
        session.remote_channel = channel
        session._next_incoming_id = fields[1] or 0
        session.remote_incoming_window = fields[2] or 0
        connection._sessions[channel] = session
        if session._state is SessionState.BEGIN_RCVD:
            session._begin()  # the answer
        if session._state is SessionState.MAPPED:  # (not if we ended it meanwhile)
            connection.events.append(SessionBegun(session))

    def _on_end(self, connection: Connection, session: Session, fields: list[Any]) -> None:
        session._move(SessionInput.END_IN)
        error = Error.from_value(fields[0])
        session._end_links(error, by_peer=True)
        connection.events.append(SessionEnded(session, error))
        session._end(None)  # the answer, unless ours went first
        connection._forget(session)

    def _on_attach(self, connection: Connection, session: Session, fields: list[Any]) -> None:
        name, handle, role = fields[0], fields[1], fields[2]
        if not isinstance(name, str) or not isinstance(handle, int) or not isinstance(role, bool):
            raise RemoteProtocolError("amqp:decode-error", "attach without a name, handle or role")
        if handle > connection.handle_max:
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
            connection.events.append(LinkAttached(link))

    def _on_detach(self, connection: Connection, session: Session, fields: list[Any]) -> None:
        link = _link(session, fields[0])
        link._move(LinkInput.DETACH_IN)
        assert link.remote_handle is not None  # a link in session._links has the peer's handle
        del session._links[link.remote_handle]
        connection.events.append(LinkDetached(link, bool(fields[1]), Error.from_value(fields[2])))
        session._forget(link)

    def _on_flow(self, connection: Connection, session: Session, fields: list[Any]) -> None:
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
        link = _link(session, fields[4])
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
        connection.events.append(LinkFlow(link))

    def _on_disposition(self, connection: Connection, session: Session, fields: list[Any]) -> None:
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

    def answer(self, connection: Connection, exc: RemoteProtocolError) -> None:
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
                connection.events.append(LinkDetached(link, True, error, by_peer=False))
        else:
            session: Session = endpoint
            if session._end(error):  # its links' events come from there
                connection.events.append(SessionEnded(session, error, by_peer=False))

    def _slow_transfer(self, connection: Connection, session: Session, fields: list[Any], payload: bytes) -> None:
        """A transfer the fast path did not take (unusual encoding, state, aborted, resume,
        more to come, or a link not taking messages)."""
        fields = fields + [None] * 11
        link = _link(session, fields[0])
        self._deliver(
            connection, session, link, fields[1], payload, bool(fields[4]), bool(fields[5]), fields[7], bool(fields[9])
        )


def _link(session: Session, handle: Any) -> Link:
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


_SESSION_HANDLERS = {
    END: PeerFrames._on_end,
    ATTACH: PeerFrames._on_attach,
    DETACH: PeerFrames._on_detach,
    FLOW: PeerFrames._on_flow,
    DISPOSITION: PeerFrames._on_disposition,
}
