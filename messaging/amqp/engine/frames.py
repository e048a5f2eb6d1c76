"""The peer's frames: the checks of their headers and of the performatives' fields, and
:class:`FrameReader`, which takes the peer's bytes apart. Transfers have a decoding fast
path for the usual encodings; anything else goes through the general codec
(:class:`.PeerFrames`). ``bench/engine_bench.py`` measures the per-message paths.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from ...codec import DecodeError
from ..wire import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    MASK,
    OPEN,
    TRANSFER,
    RemoteProtocolError,
)
from ..wire import FRAME_HEADER as _FRAME
from .states import _AWAITING_HEADER, ConnectionInput

if TYPE_CHECKING:
    from .connection import Connection
    from .peer import PeerFrames

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
# (The formats of the transfers we send are in link.py and session.py, where they are packed:
# CPython 3.11 compiles a method call on a name bound by an import as an attribute load,
# which makes a bound method on every call.)


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


class FrameReader:
    """The connection's reader: the protocol header, then each frame's header, then the
    frame — a transfer within credit straight to its link's handler (the fast path), any
    other frame to :class:`.PeerFrames`. Holds what was read but not handled yet
    (:attr:`pending`: a partial frame, or what waits for a server's open)."""

    __slots__ = ("_peer", "pending")

    def __init__(self, peer: PeerFrames) -> None:
        self._peer = peer
        self.pending = b""

    def consume(self, connection: Connection, data: bytes) -> None:
        """Handle the complete frames of :attr:`pending` followed by ``data``; keep the rest.
        A breach of connection scope ends the connection (:meth:`.Connection._fail`)."""
        buffer = self.pending + data if self.pending else data
        try:
            offset = self._read_frames(connection, buffer)
        except RemoteProtocolError as exc:
            connection._fail(exc)
            return
        except DecodeError as exc:
            connection._fail(RemoteProtocolError("amqp:decode-error", str(exc)))
            return
        self.pending = buffer[offset:]

    def _read_frames(self, connection: Connection, buffer: bytes) -> int:
        """Handle every complete frame in ``buffer``; the offset of the first byte not
        handled (a partial frame, or what waits for our open).

        Raises:
            RemoteProtocolError: a breach of connection scope (the narrower ones are
                answered here, frame by frame).
            DecodeError: a performative that does not decode.
        """
        offset, end = 0, len(buffer)
        if connection._state in _AWAITING_HEADER:
            if end < 8:
                if not AMQP_HEADER.startswith(buffer):
                    raise RemoteProtocolError("amqp:connection:framing-error", f"not an AMQP 1.0 header: {buffer!r}")
                return 0
            if buffer[:8] != AMQP_HEADER:
                raise RemoteProtocolError("amqp:connection:framing-error", f"not an AMQP 1.0 header: {buffer[:8]!r}")
            connection._move(ConnectionInput.HEADER)
            offset = 8
        unpack_frame, unpack_u32, tails = _FRAME.unpack_from, _U32.unpack_from, _TRANSFER_TAILS
        sessions, limit = connection._sessions, connection.max_frame_size
        performative = self._peer.performative
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
            # straight to the link's handler. Anything else takes the codec (PeerFrames),
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
            if buffer.startswith(_OPEN_PREFIX, body, frame_end) and connection.server:
                performative(connection, channel, buffer, body, frame_end)
                return offset  # the rest waits for our open (the owner decides on it first)
            try:
                performative(connection, channel, buffer, body, frame_end)
            except RemoteProtocolError as exc:  # (no cost on the way through: zero-cost try)
                if exc.scope == "connection":
                    raise
                self._peer.answer(connection, exc)
            if connection._finished:
                return offset
        return offset
