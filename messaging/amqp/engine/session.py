"""The session: a channel with its transfer windows, the delivery ids and the handles of
its links [2.5]. Transfer frames beyond the peer's incoming window wait here for it to
open; settlements towards the peer are batched here into ranged dispositions."""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING, Any

from ...codec import Described, UInt, UShort, encode
from ..wire import BEGIN, DISPOSITION, END, FLOW, MASK, Error, LocalProtocolError
from .events import LinkDetached
from .frames import INCOMING_WINDOW
from .link import Link
from .numbering import _Numbered
from .states import (
    _MAPPED,
    _SENDING,
    _TOLD_ON_END,
    SESSION_TRANSITIONS,
    LinkInput,
    LinkState,
    SessionInput,
    SessionState,
    _move,
)

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Session"]

# The transfers of a message that takes several frames, or has a delivery state (defined here,
# not imported, for the reason given with Link's _TRANSFER)
_TRANSFER_FIRST = struct.Struct(">3sBBBBIBIBBIBBB")  # the first frame of several: with more=true
_TRANSFER_NEXT = struct.Struct(">3sBBBBIBBBBB")  # the following ones: handle and more
_TAG = struct.Struct(">I")  # a delivery tag: the delivery id's 4 bytes


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
                [UInt(link.handle), UInt(delivery_id), _TAG.pack(delivery_id), UInt(0), settled, more, None, state]
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
