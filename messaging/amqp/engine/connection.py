"""The connection: one :class:`Connection` per socket, after SASL, and what it owns — our
side's frames out (the open/close handshake [2.4], the output, the numbering of our
channels), with its other jobs in classes of their own: :class:`.FrameReader` (the peer's
bytes, and the transfer fast path), :class:`.PeerFrames` (the peer's other
performatives), :class:`.IncomingTransfers` (multi-frame messages) and
:class:`.Heartbeat` (idle timeouts). Those keep no reference to the connection: it passes
itself on each call, so they add no reference cycle.

A connection that is over is taken apart by :meth:`Connection.release`, so it is freed
without the cyclic collector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...codec import UInt, UShort, encode
from ..wire import (
    AMQP_HEADER,
    CLOSE,
    MASK,
    MIN_MAX_FRAME_SIZE,
    OPEN,
    Error,
    LocalProtocolError,
    ProtocolError,
    symbol_array,
)
from ..wire import FRAME_HEADER as _FRAME
from .events import ConnectionClosed
from .frames import FrameReader
from .heartbeat import Heartbeat
from .numbering import _Numbered
from .peer import PeerFrames
from .session import Session
from .states import _OPEN_SENT, CONNECTION_TRANSITIONS, ConnectionInput, ConnectionState, SessionState, _missed
from .transfers import IncomingTransfers

__all__ = ["Connection"]


class _SealedOutput(list[bytes]):
    """The output once our close is in it. "[The close] frame MUST be the last thing ever
    written onto a connection" [2.4.3]: what is made after it (answers to events still
    being handled, a consumer's pump) is dropped here, at no cost to the paths that append."""

    __slots__ = ()

    def append(self, item: bytes) -> None:
        pass


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
    # so that a server's connections have one instance attribute fewer (see the end of __init__).
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
        self._heartbeat = Heartbeat()  # when the peer last sent and when we last wrote
        self._transfers = IncomingTransfers()  # the multi-frame ones, and the bytes they hold
        self._reader = FrameReader(PeerFrames(self._transfers))  # and what it has not handled yet
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
        if self._reader.pending and self.server:  # what the peer sent after its open waited for ours
            self._reader.consume(self, b"")

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
        self._reader.pending = b""
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
        self._heartbeat.output = None  # we spoke: the next tick counts from then
        return data

    def tick(self, now: float) -> float:
        """Act on time (``now`` in seconds, any monotonic clock): drop a peer silent for
        longer than our idle timeout (a close with ``amqp:resource-limit-exceeded`` and
        :class:`ConnectionClosed`), send an empty frame when we would otherwise be silent
        for half of the peer's. The next deadline, 0 for none."""
        return self._heartbeat.tick(self, now)

    @property
    def incoming_buffered(self) -> int:
        """Bytes of incomplete incoming multi-frame messages held now, all links together
        (bounded by :attr:`max_incoming_buffer`); the owner may count them towards a
        budget of its own."""
        return self._transfers.buffered

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed what the peer sent (``b""``: it closed its side, which ends the connection:
        :class:`ConnectionClosed` unless its close came first). Complete frames are handled
        at once: link handlers are called, events queued. A server waits for the owner's
        :meth:`open` before it reads past the peer's open. The peer's protocol errors are
        answered at their scope (see :mod:`.peer`); they are not raised. Does
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
        self._heartbeat.input = None  # the peer spoke: the next tick counts from then
        self._reader.consume(self, data)

    def _fail(self, exc: ProtocolError) -> None:
        """The connection ends on a breach: our close with its error, and the event."""
        error = Error(exc.condition, str(exc))
        self.events.append(ConnectionClosed(error, by_peer=False))
        self._reader.pending = b""
        self.close(error)
        self._finished = True
