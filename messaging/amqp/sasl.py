"""AMQP 1.0 SASL (OASIS AMQP 1.0 part 5.3), both sides, sans-IO, in front of the engine.

Theory of operation
-------------------
The AMQP engine (:mod:`.amqp`) starts after SASL; this module does the exchange before it.
The server side (:class:`SaslServer`, the listener):

1. The client sends the SASL protocol header ``AMQP 3 1 0 0`` [5.3.1]; we answer with the
   same header and a ``sasl-mechanisms`` frame listing ANONYMOUS and/or PLAIN [5.3.3.1].
2. The client sends ``sasl-init`` [5.3.3.2] with its mechanism and initial response
   (PLAIN: ``authzid NUL user NUL password``, RFC 4616). We emit :class:`Credentials`; the
   I/O shell asks the authentication swiftlet and calls :meth:`SaslServer.accept` or
   :meth:`SaslServer.refuse`, which queue a ``sasl-outcome`` [5.3.3.6] (code 0 ok, 1 auth).
3. After an ok outcome, everything else the client sends (starting with the AMQP header
   ``AMQP 0 1 0 0``) is :attr:`SaslServer.remaining`, for the AMQP engine.

A client that skips SASL and opens with ``AMQP 0 1 0 0`` directly is an anonymous client:
:class:`Credentials` with mechanism ``None`` (the shell accepts or refuses it the same way;
a refusal then closes the socket, as there is no SASL frame to carry it).

Input arrives in any pieces. A wrong header, a malformed or oversized frame (the codec
bounds counts and nesting: nothing a peer sends before login can make it loop or recurse
beyond the frame's 4096 bytes), an init whose response or hostname has the wrong type, an
unknown mechanism or a second init raise :class:`SaslError`; the shell answers what
:attr:`SaslServer.data_to_send` holds (our header, so the client sees what we speak) and
closes. The transitions live in :data:`TRANSITIONS`.

The client side (:class:`SaslClient`, our client) sends the SASL header at once, answers
the server's mechanisms with ``sasl-init`` — PLAIN when it has a user, else ANONYMOUS —
and is done on an ok outcome; any other outcome raises :class:`SaslRefused`. Its
transitions are :data:`CLIENT_TRANSITIONS`.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from ..codec import Array, DecodeError, Described, Symbol, UByte, ULong, decode, encode
from .wire import AMQP_HEADER, SASL_FRAME, SASL_HEADER, descriptor_code
from .wire import FRAME_HEADER as _FRAME
from .wire import SASL_INIT as INIT
from .wire import SASL_MECHANISMS as MECHANISMS
from .wire import SASL_OUTCOME as OUTCOME

__all__ = ["SaslServer", "SaslClient", "SaslError", "SaslRefused", "Credentials"]

MAX_SASL_FRAME = 4096  # sasl frames are small; a larger one is an attack or a mistake


class SaslError(Exception):
    """The peer broke the SASL exchange; close the connection after sending ``data_to_send``."""


class SaslRefused(SaslError):
    """The server's outcome refused the client's credentials (``code``: 1 auth, 2 sys, …)."""

    def __init__(self, code: int):
        super().__init__(f"the server refused the login (sasl-outcome code {code})")
        self.code = code


@attrs.frozen
class Credentials:
    """What a client presented: ``mechanism`` None means it skipped SASL altogether."""

    mechanism: str | None
    user: str | None
    password: str | None
    hostname: str | None = None


class State(enum.Enum):
    HEADER = "awaiting the protocol header"
    INIT = "awaiting sasl-init"
    DECIDING = "awaiting the decision"
    DONE = "done"
    FAILED = "failed"


class Input(enum.Enum):
    SASL_HEADER = "sasl header"
    AMQP_HEADER = "amqp header"
    INIT = "sasl-init"
    ACCEPT = "accept"
    REFUSE = "refuse"


# (state, input) -> next state; anything missing is a protocol error.
TRANSITIONS = {
    (State.HEADER, Input.SASL_HEADER): State.INIT,
    (State.HEADER, Input.AMQP_HEADER): State.DECIDING,
    (State.INIT, Input.INIT): State.DECIDING,
    (State.DECIDING, Input.ACCEPT): State.DONE,
    (State.DECIDING, Input.REFUSE): State.FAILED,
}


def _take_frame(buffer: bytearray) -> tuple[int, list[Any]] | None:
    """Remove one complete SASL frame from ``buffer``: (performative code, fields); None
    until a whole frame is there.

    Raises:
        SaslError: a bad frame header, a malformed body, or not a performative.
    """
    if len(buffer) < 8:
        return None
    size, doff, kind, _channel = _FRAME.unpack_from(buffer)
    if size > MAX_SASL_FRAME or size < 8 or doff < 2 or doff * 4 > size or kind != SASL_FRAME:
        raise SaslError(f"bad SASL frame header (size {size}, doff {doff}, type {kind})")
    if len(buffer) < size:
        return None
    body = bytes(buffer[doff * 4 : size])
    del buffer[:size]
    try:
        performative, _ = decode(body)
    except DecodeError as exc:
        raise SaslError(f"malformed SASL frame: {exc}") from None
    if not isinstance(performative, Described) or not isinstance(performative.value, list):
        raise SaslError(f"not a SASL performative: {performative!r}"[:200])
    return descriptor_code(performative.descriptor), performative.value + [None] * 3


def sasl_frame(performative: int, fields: list[Any]) -> bytes:
    """One SASL frame: 8-byte header (size, doff 2, type 1, channel 0) and the performative."""
    body = encode(Described(ULong(performative), fields))
    return _FRAME.pack(8 + len(body), 2, SASL_FRAME, 0) + body


class _Exchange:
    """What both sides share: the bytes queued for the peer."""

    _out: bytearray

    @property
    def data_to_send(self) -> bytes:
        """Bytes to write to the peer now (taking them empties the buffer)."""
        data, self._out = bytes(self._out), bytearray()
        return data


class SaslServer(_Exchange):
    """The server side of one connection's SASL exchange."""

    def __init__(self, mechanisms: tuple[str, ...] = ("PLAIN", "ANONYMOUS")):
        self.mechanisms = mechanisms
        self.state = State.HEADER
        self._buffer = bytearray()
        self._out = bytearray()
        self.credentials: Credentials | None = None
        self._skipped_sasl = False

    def _move(self, event: Input) -> None:
        next_state = TRANSITIONS.get((self.state, event))
        if next_state is None:
            problem = f"unexpected {event.value} while {self.state.value}"
            self.state = State.FAILED
            raise SaslError(problem)
        self.state = next_state

    @property
    def remaining(self) -> bytes:
        """After the exchange: what the client sent beyond SASL, for the AMQP engine."""
        if self.state is not State.DONE:
            raise SaslError("the SASL exchange is not complete")
        return bytes(self._buffer)

    def receive_data(self, data: bytes | bytearray) -> Credentials | None:
        """Feed bytes; returns the :class:`Credentials` once they are known, else None.

        Raises:
            SaslError: the peer broke the protocol (see the module docstring).
        """
        self._buffer += data
        if self.state is State.HEADER:
            if len(self._buffer) < 8:
                if not AMQP_HEADER.startswith(bytes(self._buffer[:8])) and not SASL_HEADER.startswith(
                    bytes(self._buffer[:8])
                ):
                    self._bad_header()
                return None
            header = bytes(self._buffer[:8])
            if header == SASL_HEADER:
                del self._buffer[:8]
                self._move(Input.SASL_HEADER)
                self._out += SASL_HEADER + sasl_frame(
                    MECHANISMS, [Array(0xA3, tuple(Symbol(m) for m in self.mechanisms))]
                )
            elif header == AMQP_HEADER:
                self._move(Input.AMQP_HEADER)  # no SASL: an anonymous client; keep the header
                self._skipped_sasl = True
                self.credentials = Credentials(None, None, None)
                return self.credentials
            else:
                self._bad_header()
        if self.state is State.INIT:
            return self._read_init()
        return None

    def _bad_header(self) -> None:
        self.state = State.FAILED
        self._out += SASL_HEADER
        raise SaslError(f"not an AMQP 1.0 SASL or AMQP header: {bytes(self._buffer[:8])!r}")

    def _read_init(self) -> Credentials | None:
        try:
            frame = _take_frame(self._buffer)
            if frame is not None and (frame[0] != INIT or frame[1][0] is None):
                raise SaslError(f"expected sasl-init, got performative {frame[0]!r} {frame[1][:3]!r}"[:200])
        except SaslError:
            self.state = State.FAILED
            raise
        if frame is None:
            return None
        mechanism, response, hostname = frame[1][:3]
        if (
            response is not None
            and type(response) is not bytes
            or hostname is not None
            and not isinstance(hostname, str)
        ):
            self.state = State.FAILED  # [5.3.3.2] initial-response is binary, hostname a string
            self._out += sasl_frame(OUTCOME, [UByte(1)])
            raise SaslError(
                f"sasl-init with an initial-response or hostname of the wrong type: "
                f"{type(response).__name__}, {type(hostname).__name__}"
            )
        if mechanism not in self.mechanisms:
            self.state = State.FAILED
            self._out += sasl_frame(OUTCOME, [UByte(1)])
            raise SaslError(f"mechanism {mechanism!r} is not offered (offered: {', '.join(self.mechanisms)})")
        self._move(Input.INIT)
        user = password = None
        if mechanism == "PLAIN":
            parts = (response or b"").split(b"\x00")
            if len(parts) != 3:
                self.state = State.FAILED
                self._out += sasl_frame(OUTCOME, [UByte(1)])
                raise SaslError("malformed PLAIN response: expected authzid NUL user NUL password")
            user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        self.credentials = Credentials(str(mechanism), user, password, hostname)
        return self.credentials

    def accept(self) -> None:
        """Let the client in (queues a successful sasl-outcome)."""
        self._move(Input.ACCEPT)
        if not self._skipped_sasl:
            self._out += sasl_frame(OUTCOME, [UByte(0)])

    def refuse(self) -> None:
        """Refuse the client (queues an auth-failed sasl-outcome); close the connection after."""
        self._move(Input.REFUSE)
        if not self._skipped_sasl:
            self._out += sasl_frame(OUTCOME, [UByte(1)])


class ClientState(enum.Enum):
    MECHANISMS = "awaiting the server's header and mechanisms"
    OUTCOME = "awaiting the outcome"
    DONE = "done"
    FAILED = "failed"


# (state, performative received) -> next state; anything missing is a protocol error.
CLIENT_TRANSITIONS = {
    (ClientState.MECHANISMS, MECHANISMS): ClientState.OUTCOME,
    (ClientState.OUTCOME, OUTCOME): ClientState.DONE,
}


class SaslClient(_Exchange):
    """The client side of one connection's SASL exchange: PLAIN with ``user``, else ANONYMOUS."""

    def __init__(self, user: str | None = None, password: str | None = None, hostname: str | None = None):
        self.mechanism = "PLAIN" if user is not None else "ANONYMOUS"
        self._response = f"\0{user}\0{password or ''}".encode() if user is not None else b""
        self._hostname = hostname
        self.state = ClientState.MECHANISMS
        self._header_seen = False
        self._buffer = bytearray()
        self._out = bytearray(SASL_HEADER)

    @property
    def remaining(self) -> bytes:
        """After the exchange: what the server sent beyond SASL, for the AMQP engine."""
        return bytes(self._buffer)

    def receive_data(self, data: bytes | bytearray) -> bool:
        """Feed bytes from the server; True once its outcome let us in.

        Raises:
            SaslRefused: the server refused the credentials.
            SaslError: the server broke the exchange or does not offer our mechanism.
        """
        self._buffer += data
        try:
            if not self._header_seen:
                if len(self._buffer) < 8:
                    return False
                if self._buffer[:8] != SASL_HEADER:
                    raise SaslError(f"the server does not speak SASL: header {bytes(self._buffer[:8])!r}")
                del self._buffer[:8]
                self._header_seen = True
            while self.state is not ClientState.DONE and (frame := _take_frame(self._buffer)) is not None:
                self._on_frame(*frame)
        except SaslError:
            self.state = ClientState.FAILED
            raise
        return self.state is ClientState.DONE

    def _on_frame(self, code: Any, fields: list[Any]) -> None:
        following = CLIENT_TRANSITIONS.get((self.state, code))
        if following is None:
            raise SaslError(f"unexpected SASL performative {code!r} while {self.state.value}")
        if code == MECHANISMS:
            offered = fields[0].items if isinstance(fields[0], Array) else [fields[0]]
            if self.mechanism not in [str(name) for name in offered]:
                raise SaslError(f"the server does not offer {self.mechanism} (offered: {offered!r})"[:200])
            self._out += sasl_frame(INIT, [Symbol(self.mechanism), self._response, self._hostname])
        elif fields[0] != 0:
            raise SaslRefused(fields[0] if isinstance(fields[0], int) else -1)
        self.state = following
