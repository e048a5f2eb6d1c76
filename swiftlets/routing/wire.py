"""The router-to-router wire format: a lead-in magic, then length-prefixed msgpack frames.

Theory of operation
-------------------
Both sides of a routing link start their byte stream with :data:`MAGIC` (8 bytes,
``MARTINET``); everything after it is frames::

    +----------------------+--------------------------------------------+
    | length: uint32, BE   | body: msgpack, ``length`` bytes            |
    +----------------------+--------------------------------------------+
    body = [type code (int), {field name (str): value, ...}]

The magic lets a listener refuse a stranger at once — an AMQP client sends ``AMQP…``, a
browser ``GET …``, a TLS client ``\\x16\\x03…`` — with a reason that says what it looked
like, instead of reading a nonsense length and waiting for it.

Decoding is safe by construction: msgpack with ``raw=False`` (strings must be UTF-8),
``strict_map_key=True`` (map keys only str/bytes), every extension type refused (no
``ext_hook``, ``max_ext_len=0``: not even msgpack's own timestamp), and every length limit
(``max_str_len`` …) set from the frame size. Nothing the peer sends is unpickled, and no
class is chosen by a name from the wire: the type code picks one of the frame classes
below from a fixed table, and each frame's fields are checked against its schema (exact
field set, exact msgpack types) before the frozen frame value is built.

A frame longer than the reader's maximum is refused as soon as its 4-byte length is read,
before any of its body is buffered; the maximum can change while reading (the link machine
uses a small one during the handshake, the configured one after it).

Errors: :class:`RemoteProtocolError` — the peer broke the format (its message is the
precise reason, fit for a log line and for our CLOSE frame);
:class:`LocalProtocolError` — our own caller asked for something impossible.

Message transfer (routing part 2): TRANSACTION and NONXA_TRANSACTION carry a batch of
messages as a msgpack array of ``bin`` (the AMQP bytes, unchanged). With compression the
array holds one ``bin``: a zlib stream whose content is that array, msgpack-encoded
(:func:`pack_messages`); :func:`unpack_messages` inflates it with a bound on the inflated
size, so a zip bomb is a protocol error and never an allocation.
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import Any, ClassVar

import attrs
import msgpack

__all__ = [
    "MAGIC",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_TRANSACTION_SIZE",
    "DEFAULT_WINDOW_BYTES",
    "MIN_WINDOW_BYTES",
    "HANDSHAKE_MAX_FRAME_SIZE",
    "ProtocolError",
    "RemoteProtocolError",
    "LocalProtocolError",
    "FrameType",
    "Kind",
    "Frame",
    "Protocol",
    "ProtocolReply",
    "Connect",
    "ConnectReply",
    "Auth",
    "AuthReply",
    "Adjust",
    "StartDelivery",
    "Keepalive",
    "Route",
    "Close",
    "Recovery",
    "RecoveryDone",
    "Transaction",
    "PrepareReply",
    "Commit",
    "CommitReply",
    "Refuse",
    "NonXaTransaction",
    "NonXaCommit",
    "MAX_XID_LENGTH",
    "pack_messages",
    "unpack_messages",
    "FRAMES",
    "RESERVED",
    "encode",
    "decode_body",
    "FrameReader",
]

MAGIC = b"MARTINET"
DEFAULT_MAX_FRAME_SIZE = 1 << 20  # 1 MiB: part 2 carries AMQP messages in TRANSACTION frames
# What a receiver holds awaiting its prepare, per link: 8 MiB carries a link of 320 Mbit/s at
# a 200 ms round trip (the window is sized to the distance, up to this bound).
DEFAULT_WINDOW_BYTES = 8 << 20
MIN_WINDOW_BYTES = 1 << 16  # at least a few transactions of any size
# Messages per transaction a receiver accepts. SwiftMQ's 20 made each routed message pay a
# twentieth of a transaction's frames, prepare and commit; at 100 a sender's CPU per message
# falls by a tenth and a durable link carries 1.4x as much (docs/benchmarks.md), and a sender
# still sends what its queue holds, so a link without a backlog keeps its small batches.
DEFAULT_TRANSACTION_SIZE = 100
HANDSHAKE_MAX_FRAME_SIZE = 4096  # before the delivery stage every frame is small
_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
    """A breach of the routing protocol; the message is the reason. Abstract: raised as
    one of the two below."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol (a malformed, unknown, oversized or unexpected frame).
    The link machine answers it with a CLOSE carrying the message and ends; it never
    reaches the machine's owner as an exception."""


class LocalProtocolError(ProtocolError):
    """The owner asked for something the protocol does not allow now (a bug in the
    caller): raised by the machine's methods; nothing is sent and no state changes."""


class FrameType(enum.IntEnum):
    """The frame type codes (the first element of every frame body)."""

    # stage 1: protocol select
    PROTOCOL = 1
    PROTOCOL_REPLY = 2
    # stage 2: connect
    CONNECT = 10
    CONNECT_REPLY = 11
    # stage 3: authentication
    AUTH = 20
    AUTH_REPLY = 21
    # stage 4: XA recovery (only when the link uses XA); COMMIT / COMMIT_REPLY also here
    RECOVERY = 30
    RECOVERY_DONE = 31
    # stage 5: delivery
    ADJUST = 40
    START_DELIVERY = 41
    KEEPALIVE = 42
    ROUTE = 43
    # delivery, XA
    TRANSACTION = 50
    PREPARE_REPLY = 51
    COMMIT = 52
    COMMIT_REPLY = 53
    REFUSE = 54
    # delivery, non-XA
    NONXA_TRANSACTION = 60
    NONXA_COMMIT = 61
    # any stage
    CLOSE = 99


# Codes with a name but no frame class: refused when received ("reserved and not
# implemented"). None at present; the mechanism stays for later versions.
RESERVED: frozenset[FrameType] = frozenset()
MAX_XID_LENGTH = 200  # characters of a routing xid


class Kind(enum.Enum):
    """The msgpack type of a field, checked exactly on decode (a bool is not an int)."""

    STR = "str"  # msgpack str (UTF-8)
    BIN = "bin"  # msgpack bin
    BOOL = "bool"  # msgpack true/false
    UINT = "uint32"  # msgpack int, 0 <= n < 2**32
    STRS = "array of str"  # msgpack array whose items are str
    BINS = "array of bin"  # msgpack array whose items are bin


def _check(kind: Kind, value: Any) -> Any:
    """``value`` as the frame holds it, or None when it is not of ``kind``."""
    if kind is Kind.STR:
        return value if type(value) is str else None
    if kind is Kind.BIN:
        return value if type(value) is bytes else None
    if kind is Kind.BOOL:
        return value if type(value) is bool else None
    if kind is Kind.UINT:
        return value if type(value) is int and 0 <= value < 1 << 32 else None
    if kind is Kind.STRS:
        if type(value) in (tuple, list) and all(type(item) is str for item in value):
            return tuple(value)
        return None
    if kind is Kind.BINS:
        if type(value) in (tuple, list) and all(type(item) is bytes for item in value):
            return tuple(value)
        return None
    raise AssertionError(kind)  # pragma: no cover - every kind is handled above


def _field(kind: Kind, **kwargs: Any) -> Any:
    converter = tuple if kind in (Kind.STRS, Kind.BINS) else None  # (None: attrs' default, no converter)
    return attrs.field(metadata={"kind": kind}, converter=converter, **kwargs)


@attrs.frozen(kw_only=True)
class Frame:
    """A decoded frame. Subclasses declare ``TYPE`` and their fields with a :class:`Kind`."""

    TYPE: ClassVar[FrameType]


@attrs.frozen(kw_only=True)
class Protocol(Frame):
    """Connector → listener, right after the magic: the protocol versions it implements."""

    TYPE = FrameType.PROTOCOL
    versions: tuple[str, ...] = _field(Kind.STRS)


@attrs.frozen(kw_only=True)
class ProtocolReply(Frame):
    """Listener → connector: the version chosen, or a refusal with the listener's own list."""

    TYPE = FrameType.PROTOCOL_REPLY
    accepted: bool = _field(Kind.BOOL)
    version: str = _field(Kind.STR, default="")  # the chosen version; "" when refused
    versions: tuple[str, ...] = _field(Kind.STRS, default=())  # when refused: what the listener implements
    reason: str = _field(Kind.STR, default="")  # when refused


@attrs.frozen(kw_only=True)
class Connect(Frame):
    """Connector → listener: who it is, its authentication nonce, whether it asks for XA."""

    TYPE = FrameType.CONNECT
    name: str = _field(Kind.STR)
    nonce: bytes = _field(Kind.BIN)
    use_xa: bool = _field(Kind.BOOL)


@attrs.frozen(kw_only=True)
class ConnectReply(Frame):
    """Listener → connector: admitted (its name, nonce, keepalive interval in ms, whether
    authentication follows, whether it asks for XA) or refused with a reason."""

    TYPE = FrameType.CONNECT_REPLY
    accepted: bool = _field(Kind.BOOL)
    reason: str = _field(Kind.STR, default="")
    name: str = _field(Kind.STR, default="")
    nonce: bytes = _field(Kind.BIN, default=b"")
    keepalive_ms: int = _field(Kind.UINT, default=0)
    auth_required: bool = _field(Kind.BOOL, default=False)
    use_xa: bool = _field(Kind.BOOL, default=False)


@attrs.frozen(kw_only=True)
class Auth(Frame):
    """Connector → listener: the connector's proof (HMAC-SHA256, 32 bytes)."""

    TYPE = FrameType.AUTH
    proof: bytes = _field(Kind.BIN)


@attrs.frozen(kw_only=True)
class AuthReply(Frame):
    """Listener → connector: the connector's proof was right (and the listener's own
    proof), or it was not (``reason`` "authentication failed", no proof)."""

    TYPE = FrameType.AUTH_REPLY
    accepted: bool = _field(Kind.BOOL)
    proof: bytes = _field(Kind.BIN, default=b"")
    reason: str = _field(Kind.STR, default="")


@attrs.frozen(kw_only=True)
class Adjust(Frame):
    """Both ways: the sender's inbound limits, i.e. the receiver's send limits."""

    TYPE = FrameType.ADJUST
    transaction_size: int = _field(Kind.UINT)  # messages per transaction
    window_size: int = _field(Kind.UINT)  # transactions awaiting their prepare a sender starts with
    window_bytes: int = _field(Kind.UINT, default=DEFAULT_WINDOW_BYTES)  # the bound on what awaits the prepare
    max_frame_size: int = _field(Kind.UINT, default=DEFAULT_MAX_FRAME_SIZE)  # the largest frame it accepts
    compression: bool = _field(Kind.BOOL, default=False)  # it asks for compression (used when both ask)


@attrs.frozen(kw_only=True)
class StartDelivery(Frame):
    """Both ways, after ADJUST: the sender is in the delivery stage."""

    TYPE = FrameType.START_DELIVERY


@attrs.frozen(kw_only=True)
class Keepalive(Frame):
    """Both ways, every keepalive interval during delivery."""

    TYPE = FrameType.KEEPALIVE


@attrs.frozen(kw_only=True)
class Route(Frame):
    """Both ways during delivery: a route announcement (``add``) or its withdrawal.

    ``path`` is the route as the *receiver* will hold it (``api.py``'s vocabulary): the
    routers a message passes from the receiver on, so ``path[0]`` is the sender itself (the
    receiver's next hop) and ``path[-1]`` is ``destination``."""

    TYPE = FrameType.ROUTE
    add: bool = _field(Kind.BOOL)
    destination: str = _field(Kind.STR)
    path: tuple[str, ...] = _field(Kind.STRS)


@attrs.frozen(kw_only=True)
class Close(Frame):
    """Either way, in any stage: the sender ends the link; ``reason`` says why."""

    TYPE = FrameType.CLOSE
    reason: str = _field(Kind.STR)


@attrs.frozen(kw_only=True)
class Recovery(Frame):
    """Both ways, first frame of the XA recovery stage: the routing xids the sender holds
    prepared as a receiver of transactions from the peer."""

    TYPE = FrameType.RECOVERY
    xids: tuple[str, ...] = _field(Kind.STRS)


@attrs.frozen(kw_only=True)
class RecoveryDone(Frame):
    """Both ways, last frame of the XA recovery stage: the sender resolved its outbound
    xids (every COMMIT it sent in recovery was answered); no more COMMIT follows in recovery."""

    TYPE = FrameType.RECOVERY_DONE


@attrs.frozen(kw_only=True)
class Transaction(Frame):
    """Sender → receiver (either way, XA delivery): a batch of messages under one xid.
    ``messages``: the messages (``compressed`` false) or one zlib stream of their msgpack
    array (``compressed`` true); see :func:`pack_messages`."""

    TYPE = FrameType.TRANSACTION
    xid: str = _field(Kind.STR)
    messages: tuple[bytes, ...] = _field(Kind.BINS)
    compressed: bool = _field(Kind.BOOL, default=False)


@attrs.frozen(kw_only=True)
class PrepareReply(Frame):
    """Receiver → sender: the transaction ``xid`` is prepared, durably."""

    TYPE = FrameType.PREPARE_REPLY
    xid: str = _field(Kind.STR)


@attrs.frozen(kw_only=True)
class Commit(Frame):
    """Sender → receiver: the sender committed ``xid`` durably; the receiver must commit it."""

    TYPE = FrameType.COMMIT
    xid: str = _field(Kind.STR)


@attrs.frozen(kw_only=True)
class CommitReply(Frame):
    """Receiver → sender: ``xid`` is committed, durably; it is over on both sides."""

    TYPE = FrameType.COMMIT_REPLY
    xid: str = _field(Kind.STR)


@attrs.frozen(kw_only=True)
class Refuse(Frame):
    """Receiver → sender, instead of PREPARE_REPLY: ``xid`` was not prepared (nothing of
    it is held) and never will be; the sender rolls it back."""

    TYPE = FrameType.REFUSE
    xid: str = _field(Kind.STR)
    reason: str = _field(Kind.STR)


@attrs.frozen(kw_only=True)
class NonXaTransaction(Frame):
    """Sender → receiver (non-XA delivery): a batch under the sequence number ``seq``
    (strictly increasing per direction of a link); ``messages`` as in TRANSACTION."""

    TYPE = FrameType.NONXA_TRANSACTION
    seq: int = _field(Kind.UINT)
    messages: tuple[bytes, ...] = _field(Kind.BINS)
    compressed: bool = _field(Kind.BOOL, default=False)


@attrs.frozen(kw_only=True)
class NonXaCommit(Frame):
    """Receiver → sender: the batch ``seq`` is committed at the receiver."""

    TYPE = FrameType.NONXA_COMMIT
    seq: int = _field(Kind.UINT)


FRAMES: dict[FrameType, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Protocol,
        ProtocolReply,
        Connect,
        ConnectReply,
        Auth,
        AuthReply,
        Recovery,
        RecoveryDone,
        Adjust,
        StartDelivery,
        Keepalive,
        Route,
        Transaction,
        PrepareReply,
        Commit,
        CommitReply,
        Refuse,
        NonXaTransaction,
        NonXaCommit,
        Close,
    )
}
# field name -> kind, per frame class (the schema checked on decode)
_SCHEMAS: dict[type[Frame], dict[str, Kind]] = {
    cls: {field.name: field.metadata["kind"] for field in attrs.fields(cls)} for cls in FRAMES.values()
}


def encode(frame: Frame, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """One frame on the wire: the 4-byte length and the msgpack body.

    Raises:
        LocalProtocolError: a field does not fit its kind, or the frame exceeds ``max_frame_size``.
    """
    fields = {}
    for name, kind in _SCHEMAS[type(frame)].items():
        value = getattr(frame, name)
        if _check(kind, value) is None:
            raise LocalProtocolError(f"{frame.TYPE.name} field {name!r} must be {kind.value}, got {value!r}"[:300])
        fields[name] = value
    body = msgpack.packb([int(frame.TYPE), fields], use_bin_type=True)
    if len(body) > max_frame_size:
        raise LocalProtocolError(
            f"{frame.TYPE.name} frame of {len(body)} bytes exceeds the maximum frame size of {max_frame_size} bytes"
        )
    return _LENGTH.pack(len(body)) + body


def _refuse_ext(code: int, data: bytes) -> Any:
    raise RemoteProtocolError(f"msgpack extension type {code} is not allowed")


def decode_body(body: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> Frame:
    """The frame in one msgpack ``body`` (without the length prefix).

    Raises:
        RemoteProtocolError: malformed msgpack, an extension type, an unknown or reserved
            type code, a missing, extra or mistyped field.
    """
    try:
        decoded = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=False,
            ext_hook=_refuse_ext,
            max_ext_len=0,
            max_str_len=max_frame_size,
            max_bin_len=max_frame_size,
            max_array_len=max_frame_size,
            max_map_len=max_frame_size // 2,
        )
    except RemoteProtocolError:
        raise
    except Exception as exc:  # msgpack raises ValueError and its subclasses, and others on odd input
        raise RemoteProtocolError(f"malformed frame body ({type(exc).__name__}: {exc})"[:300]) from None
    if type(decoded) is not tuple or len(decoded) != 2 or type(decoded[0]) is not int or type(decoded[1]) is not dict:
        raise RemoteProtocolError(f"a frame body must be [type code, {{fields}}], got {decoded!r}"[:300])
    code, fields = decoded
    try:
        frame_type = FrameType(code)
    except ValueError:
        raise RemoteProtocolError(f"unknown frame type {code}") from None
    cls = FRAMES.get(frame_type)
    if cls is None:
        raise RemoteProtocolError(f"frame type {frame_type.name} ({code}) is reserved and not implemented")
    schema = _SCHEMAS[cls]
    for name in fields:
        if name not in schema:
            raise RemoteProtocolError(f"{frame_type.name} frame has an unexpected field {name!r}"[:300])
    values = {}
    for name, kind in schema.items():
        if name not in fields:
            raise RemoteProtocolError(f"{frame_type.name} frame lacks the field {name!r}")
        value = _check(kind, fields[name])
        if value is None:
            raise RemoteProtocolError(
                f"{frame_type.name} field {name!r} must be {kind.value}, got {type(fields[name]).__name__}"
            )
        values[name] = value
    return cls(**values)


def _looks_like(head: bytes) -> str:
    if head.startswith(b"AMQP"):
        return " (an AMQP client?)"
    if head[:1] == b"\x16":
        return " (a TLS handshake? this link expects plain TCP)"
    if head.split(b" ", 1)[0] in (b"GET", b"POST", b"PUT", b"HEAD", b"HTTP/1.1", b"HTTP/1.0", b"OPTIONS"):
        return " (an HTTP request?)"
    return ""


class FrameReader:
    """Reassembles the peer's stream: the magic first (when ``expect_magic``), then frames.

    ``max_frame_size`` bounds the body length (it may be changed between calls).
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, *, expect_magic: bool = True):
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._magic_seen = not expect_magic

    def feed(self, data: bytes | bytearray) -> None:
        """Append what the peer sent (no parsing yet)."""
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as frames."""
        return len(self._buffer)

    def next_frame(self) -> Frame | None:
        """The next complete frame, None until one is there.

        Raises:
            RemoteProtocolError: a wrong magic (as soon as the first differing byte is
                there), a length above the maximum (as soon as the length is there, nothing
                of the body is waited for), a zero length, or a bad body (:func:`decode_body`).
                After an error the reader is unusable.
        """
        buffer = self._buffer
        if not self._magic_seen:
            head = bytes(buffer[: len(MAGIC)])
            if not MAGIC.startswith(head):
                raise RemoteProtocolError(f"not a Martinet router: the stream starts with {head!r}{_looks_like(head)}")
            if len(head) < len(MAGIC):
                return None
            del buffer[: len(MAGIC)]
            self._magic_seen = True
        if len(buffer) < 4:
            return None
        (length,) = _LENGTH.unpack_from(buffer)
        if length > self.max_frame_size:
            raise RemoteProtocolError(
                f"frame of {length} bytes exceeds the maximum frame size of {self.max_frame_size} bytes"
            )
        if length == 0:
            raise RemoteProtocolError("empty frame (length 0)")
        if len(buffer) < 4 + length:
            return None
        body = bytes(buffer[4 : 4 + length])
        del buffer[: 4 + length]
        return decode_body(body, self.max_frame_size)


# -- message batches ---------------------------------------------------------------------------


def pack_messages(
    messages: tuple[bytes, ...], compress: bool, max_size: int = DEFAULT_MAX_FRAME_SIZE
) -> tuple[tuple[bytes, ...], bool]:
    """The ``messages`` and ``compressed`` fields of a batch. With ``compress``, the batch is
    sent as one zlib stream of its msgpack array when that is smaller and inflates to at
    most ``max_size`` bytes (the receiver's maximum frame size, its bound in
    :func:`unpack_messages`); else as it is (then too big for one frame anyway)."""
    if compress:
        raw = msgpack.packb(list(messages), use_bin_type=True)
        deflated = zlib.compress(raw, 1)
        if len(raw) <= max_size and len(deflated) < sum(len(m) for m in messages):
            return (deflated,), True
    return messages, False


def unpack_messages(messages: tuple[bytes, ...], compressed: bool, max_size: int) -> tuple[bytes, ...]:
    """The messages of a received batch; a compressed one is inflated to at most
    ``max_size`` bytes (the receiver's maximum frame size): beyond that it is refused
    before more is inflated.

    Raises:
        RemoteProtocolError: not exactly one zlib stream, a corrupt or truncated stream,
            inflating beyond ``max_size``, or content that is not a msgpack array of bin.
    """
    if not compressed:
        return messages
    if len(messages) != 1:
        raise RemoteProtocolError(f"a compressed batch must hold one zlib stream, got {len(messages)} items")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(messages[0], max_size + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(f"corrupt compressed batch ({exc})"[:300]) from None
    if len(raw) > max_size:
        raise RemoteProtocolError(f"a compressed batch inflates beyond {max_size} bytes (the maximum frame size)")
    if not inflater.eof or inflater.unused_data:
        raise RemoteProtocolError("a compressed batch is truncated or has data after its zlib stream")
    try:
        decoded = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=False,
            ext_hook=_refuse_ext,
            max_ext_len=0,
            max_str_len=0,
            max_bin_len=max_size,
            max_array_len=max_size,
            max_map_len=0,
        )
    except Exception as exc:
        raise RemoteProtocolError(f"malformed compressed batch ({type(exc).__name__}: {exc})"[:300]) from None
    if type(decoded) is not tuple or not all(type(item) is bytes for item in decoded):
        raise RemoteProtocolError("a compressed batch must inflate to an array of bin")
    return decoded
