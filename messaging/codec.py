"""The AMQP 1.0 type system (OASIS AMQP 1.0 part 1, §1.6): encode and decode values.

Theory of operation
-------------------
Sans-IO: bytes in, values out, and back. Decoding is a dispatch on the constructor byte
(``_DECODERS``), each decoder returning ``(value, next_offset)``; :func:`skip` finds the end
of a value without building it (fixed widths are known, variable and compound values
carry their size), which is what lets :mod:`messaging.message` find section boundaries
without decoding sections nobody asked for.

Python types carry AMQP types where it matters (JMS selectors must tell an exact number
from an approximate one, and a string from a symbol):

==========================  ===========================================================
AMQP                        Python
==========================  ===========================================================
null, boolean               ``None``, ``bool``
ubyte … ulong, byte … long  ``int`` (encode a specific width with :class:`UByte` … :class:`Long`)
float, double               ``float`` (:class:`Float` encodes 32-bit)
timestamp                   :class:`Timestamp` (``int`` milliseconds since the epoch)
uuid                        :class:`uuid.UUID`
binary                      ``bytes``
string, symbol, char        ``str``, :class:`Symbol`, :class:`Char`
list, map, array            ``list``, ``dict``, :class:`Array`
described                   :class:`Described`
==========================  ===========================================================

Decimal types are decoded to their raw bytes in a :class:`Decimal` wrapper (the broker
never computes with them). Malformed input raises :class:`DecodeError` with the offset.

Hostile input
-------------
Every byte decoded comes from a peer, before or after login, so the decoder's work and
memory are bounded by the bytes actually present:

- Every count and size read from the wire is checked against the bytes present *before*
  any loop or allocation. A list or map of ``count`` elements needs at least ``count``
  bytes (each element has a constructor). An array of a fixed-width constructor needs
  exactly ``count × width`` bytes. An array of a zero-width constructor (null, true, false,
  uint0, ulong0, list0) holds its elements in no bytes at all, so [1.6.24] alone would let
  10 bytes claim four billion of them: here each element is charged one byte of the
  array's declared ``size`` instead (``count <= size``), and such an array is built
  without a Python loop per element. That is stricter than the spec only for an array of
  more such elements than it has bytes, which no client we know sends (proton, Qpid JMS
  and rhea encode booleans as 0x56 and numbers at their full width in arrays), and it
  keeps the memory a decode can make linear in its input, however the arrays nest.
- Nesting (described values, lists, maps, arrays) is bounded by :data:`MAX_DEPTH`;
  deeper input is a :class:`DecodeError`, never a ``RecursionError``. :func:`skip` does
  not recurse at all.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

import attrs

__all__ = [
    "MAX_DEPTH",
    "DecodeError",
    "Described",
    "Symbol",
    "Char",
    "Timestamp",
    "Array",
    "Decimal",
    "UByte",
    "UShort",
    "UInt",
    "ULong",
    "Byte",
    "Short",
    "Int",
    "Long",
    "Float",
    "decode",
    "decode_all",
    "skip",
    "encode",
]


class DecodeError(ValueError):
    """The bytes are not a valid AMQP encoding; the message says what and at which offset."""


# How deep described values, lists, maps and arrays may nest. The deepest structure AMQP
# itself defines is about 8 levels (an attach: described list → described source → filter
# map → described filter → its value); application data in message sections the broker
# reads (properties, annotations) is flat. 64 leaves room for deeply nested amqp-value
# bodies, which the broker never decodes except on coordinator links, while keeping the
# recursion (two Python frames a level) far from Python's limit of 1000.
MAX_DEPTH = 64


class Symbol(str):
    """An AMQP symbol (ASCII)."""

    __slots__ = ()


class Char(str):
    """An AMQP char (one Unicode code point)."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch."""

    __slots__ = ()


class _Width(int):
    __slots__ = ()
    code = 0


class UByte(_Width):
    __slots__ = ()


class UShort(_Width):
    __slots__ = ()


class UInt(_Width):
    __slots__ = ()


class ULong(_Width):
    __slots__ = ()


class Byte(_Width):
    __slots__ = ()


class Short(_Width):
    __slots__ = ()


class Int(_Width):
    __slots__ = ()


class Long(_Width):
    __slots__ = ()


class Float(float):
    """A value to be encoded as a 32-bit float."""

    __slots__ = ()


@attrs.frozen
class Described:
    """A described value: ``descriptor`` (usually a ulong code or a symbol) and ``value``."""

    descriptor: Any
    value: Any


@attrs.frozen
class Array:
    """An AMQP array: elements share one constructor (``code``; ``descriptor`` if described)."""

    code: int
    items: tuple[Any, ...]
    descriptor: Any = None


@attrs.frozen
class Decimal:
    """A decimal32/64/128, kept as its encoded bytes."""

    code: int
    raw: bytes


# -- decoding -----------------------------------------------------------------------------

_U8 = struct.Struct(">B").unpack_from
_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I8 = struct.Struct(">b").unpack_from
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_F32 = struct.Struct(">f").unpack_from
_F64 = struct.Struct(">d").unpack_from

Decoder = Callable[[bytes, int], tuple[Any, int]]
# The decoders of values that contain values also take the nesting depth.
ContainerDecoder = Callable[[bytes, int, int], tuple[Any, int]]


def _need(buf: bytes, end: int, what: str) -> None:
    if end > len(buf):
        raise DecodeError(f"truncated {what}: needs {end} bytes, have {len(buf)}")


def _fixed(unpack: Callable[..., Any], width: int, what: str, wrap: Callable[[Any], Any] | None = None) -> Decoder:
    def decode_fixed(buf: bytes, offset: int) -> tuple[Any, int]:
        end = offset + width
        _need(buf, end, what)
        value = unpack(buf, offset)[0]
        return (wrap(value) if wrap else value), end

    return decode_fixed


def _const(value: Any) -> Decoder:
    return lambda buf, offset: (value, offset)


def _variable(size_width: int, kind: str) -> Decoder:
    size_of = _U8 if size_width == 1 else _U32

    def decode_variable(buf: bytes, offset: int) -> tuple[Any, int]:
        _need(buf, offset + size_width, kind)
        size = size_of(buf, offset)[0]
        start = offset + size_width
        end = start + size
        _need(buf, end, kind)
        raw = bytes(buf[start:end])
        if kind == "binary":
            return raw, end
        try:
            text = raw.decode("utf-8" if kind == "string" else "ascii")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"invalid {kind} at offset {start}: {exc.reason}") from None
        return (Symbol(text) if kind == "symbol" else text), end

    return decode_variable


def _compound(size_width: int, kind: str) -> ContainerDecoder:
    size_of = _U8 if size_width == 1 else _U32

    def decode_compound(buf: bytes, offset: int, depth: int, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
        _need(buf, offset + 2 * size_width, kind)
        size = size_of(buf, offset)[0]
        count = size_of(buf, offset + size_width)[0]
        end = offset + size_width + size
        _need(buf, end, kind)
        position = offset + 2 * size_width
        if count > end - position or depth >= max_depth:  # (one test on the way through)
            if depth >= max_depth:
                raise DecodeError(f"{kind} at offset {offset} nested deeper than {max_depth}")
            # each element has at least its constructor byte
            raise DecodeError(f"{kind} at offset {offset} declares {count} elements in {end - position} bytes")
        depth += 1
        items = []
        for _ in range(count):
            value, position = decode(buf, position, depth)
            items.append(value)
        if position != end:
            held = position - offset - size_width
            raise DecodeError(f"{kind} at offset {offset} declares {size} bytes but holds {held}")
        if kind == "list":
            return items, end
        if count % 2:
            raise DecodeError(f"map at offset {offset} has an odd number of elements ({count})")
        try:
            return dict(zip(items[::2], items[1::2], strict=True)), end
        except TypeError:
            raise DecodeError(f"map at offset {offset} has an unhashable key") from None

    return decode_compound


def _array(size_width: int) -> ContainerDecoder:
    size_of = _U8 if size_width == 1 else _U32

    def decode_array(buf: bytes, offset: int, depth: int) -> tuple[Any, int]:
        _need(buf, offset + 2 * size_width + 1, "array")
        size = size_of(buf, offset)[0]
        count = size_of(buf, offset + size_width)[0]
        end = offset + size_width + size
        _need(buf, end, "array")
        if size < size_width + 1:
            raise DecodeError(f"array at offset {offset} declares {size} bytes, too few for its count and constructor")
        if depth >= MAX_DEPTH:
            raise DecodeError(f"array at offset {offset} nested deeper than {MAX_DEPTH}")
        depth += 1
        position = offset + 2 * size_width
        descriptor = None
        code = buf[position]
        if code == 0x00:
            descriptor, position = decode(buf, position + 1, depth)
            if position >= end:
                raise DecodeError(f"array at offset {offset}: no element constructor within its size")
            code = buf[position]
        position += 1
        width = _FIXED_WIDTH.get(code)
        # Counts against the bytes present, before any loop (see "Hostile input" above).
        if width == 0:
            if count > size:
                raise DecodeError(f"array at offset {offset} declares {count} zero-width elements in {size} bytes")
            if position != end:
                raise DecodeError(f"array at offset {offset} declares {size} bytes but does not hold them")
            if code == 0x45:
                return Array(code, tuple([[] for _ in range(count)]), descriptor), end
            return Array(code, (_ZERO_WIDTH[code],) * count, descriptor), end
        if width is not None and position + count * width != end or count > end - position:
            raise DecodeError(f"array at offset {offset} declares {count} elements in {end - position} bytes")
        element = _DECODERS.get(code)
        if element is None:
            container = _CONTAINERS.get(code)
            if container is None:
                raise DecodeError(f"unknown array element constructor 0x{code:02x} at offset {position - 1}")
            items = []
            for _ in range(count):
                value, position = container(buf, position, depth)
                items.append(value)
            if position != end:
                raise DecodeError(f"array at offset {offset} declares {size} bytes but does not hold them")
            return Array(code, tuple(items), descriptor), end
        items = []
        for _ in range(count):
            value, position = element(buf, position)
            items.append(value)
        if position != end:
            raise DecodeError(f"array at offset {offset} declares {size} bytes but does not hold them")
        return Array(code, tuple(items), descriptor), end

    return decode_array


def _described(buf: bytes, offset: int, depth: int) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise DecodeError(f"described value at offset {offset - 1} nested deeper than {MAX_DEPTH}")
    descriptor, offset = decode(buf, offset, depth + 1)
    value, offset = decode(buf, offset, depth + 1)
    return Described(descriptor, value), offset


def _uuid(buf: bytes, offset: int) -> tuple[Any, int]:
    _need(buf, offset + 16, "uuid")
    return uuid.UUID(bytes=bytes(buf[offset : offset + 16])), offset + 16


def _decimal(code: int, width: int) -> Decoder:
    def decode_decimal(buf: bytes, offset: int) -> tuple[Any, int]:
        _need(buf, offset + width, "decimal")
        return Decimal(code, bytes(buf[offset : offset + width])), offset + width

    return decode_decimal


def _char(buf: bytes, offset: int) -> tuple[Any, int]:
    _need(buf, offset + 4, "char")
    point = _U32(buf, offset)[0]
    if point > 0x10FFFF:
        raise DecodeError(f"invalid char U+{point:X} at offset {offset}")
    return Char(chr(point)), offset + 4


def _boolean(buf: bytes, offset: int) -> tuple[Any, int]:
    _need(buf, offset + 1, "boolean")
    value = buf[offset]
    if value > 1:
        raise DecodeError(f"invalid boolean 0x{value:02x} at offset {offset}")
    return value == 1, offset + 1


_DECODERS: dict[int, Decoder] = {
    0x40: _const(None),
    0x41: _const(True),
    0x42: _const(False),
    0x56: _boolean,
    0x50: _fixed(_U8, 1, "ubyte"),
    0x60: _fixed(_U16, 2, "ushort"),
    0x70: _fixed(_U32, 4, "uint"),
    0x52: _fixed(_U8, 1, "smalluint"),
    0x43: _const(0),
    0x80: _fixed(_U64, 8, "ulong"),
    0x53: _fixed(_U8, 1, "smallulong"),
    0x44: _const(0),
    0x51: _fixed(_I8, 1, "byte"),
    0x61: _fixed(_I16, 2, "short"),
    0x71: _fixed(_I32, 4, "int"),
    0x54: _fixed(_I8, 1, "smallint"),
    0x81: _fixed(_I64, 8, "long"),
    0x55: _fixed(_I8, 1, "smalllong"),
    0x72: _fixed(_F32, 4, "float"),
    0x82: _fixed(_F64, 8, "double"),
    0x74: _decimal(0x74, 4),
    0x84: _decimal(0x84, 8),
    0x94: _decimal(0x94, 16),
    0x73: _char,
    0x83: _fixed(_I64, 8, "timestamp", Timestamp),
    0x98: _uuid,
    0xA0: _variable(1, "binary"),
    0xB0: _variable(4, "binary"),
    0xA1: _variable(1, "string"),
    0xB1: _variable(4, "string"),
    0xA3: _variable(1, "symbol"),
    0xB3: _variable(4, "symbol"),
    0x45: _const(None),  # list0: replaced below so each call gets a fresh list
}
_DECODERS[0x45] = lambda buf, offset: ([], offset)

# Values that contain values: their decoders take the nesting depth as well.
_CONTAINERS: dict[int, ContainerDecoder] = {
    0x00: _described,
    0xC0: _compound(1, "list"),
    0xD0: _compound(4, "list"),
    0xC1: _compound(1, "map"),
    0xD1: _compound(4, "map"),
    0xE0: _array(1),
    0xF0: _array(4),
}
# The value of each zero-width constructor (list0 is made fresh for each element).
_ZERO_WIDTH = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: 0}


def decode(buf: bytes, offset: int = 0, depth: int = 0) -> tuple[Any, int]:
    """Decode the value starting at ``offset``; return it and the offset after it.
    ``depth``: how deep the value is nested already (the decoder's own business; callers
    leave it 0).

    The constructors that make up nearly all message metadata are handled inline (this
    is the broker's per-message path); the rest go through ``_DECODERS``.

    Raises:
        DecodeError: unknown constructor, truncated or inconsistent encoding, a count
            the bytes cannot hold, nesting deeper than :data:`MAX_DEPTH`.
    """
    try:
        code = buf[offset]
    except IndexError:
        raise DecodeError(f"truncated: no value at offset {offset}") from None
    offset += 1
    if code == 0x40:
        return None, offset
    if code == 0xA1 or code == 0xA3:  # str8, sym8
        end = offset + 1 + buf[offset] if offset < len(buf) else len(buf) + 1
        if end > len(buf):
            raise DecodeError(f"truncated {'string' if code == 0xA1 else 'symbol'} at offset {offset - 1}")
        try:
            text = buf[offset + 1 : end].decode("utf-8" if code == 0xA1 else "ascii")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"invalid text at offset {offset + 1}: {exc.reason}") from None
        return (text if code == 0xA1 else Symbol(text)), end
    if code == 0x53 or code == 0x52 or code == 0x50:  # smallulong, smalluint, ubyte
        if offset >= len(buf):
            raise DecodeError(f"truncated integer at offset {offset - 1}")
        return buf[offset], offset + 1
    if code == 0x41:
        return True, offset
    if code == 0x42:
        return False, offset
    if code == 0x83:
        if offset + 8 > len(buf):
            raise DecodeError(f"truncated timestamp at offset {offset - 1}")
        return Timestamp(_I64(buf, offset)[0]), offset + 8
    if code == 0xC0 or code == 0xC1:  # list8, map8
        return _SMALL_COMPOUND[code](buf, offset, depth)
    if code == 0x00:  # described: every performative, section and delivery state
        if depth >= MAX_DEPTH:
            raise DecodeError(f"described value at offset {offset - 1} nested deeper than {MAX_DEPTH}")
        descriptor, offset = decode(buf, offset, depth + 1)
        value, offset = decode(buf, offset, depth + 1)
        return Described(descriptor, value), offset
    decoder = _DECODERS.get(code)
    if decoder is None:
        container = _CONTAINERS.get(code)
        if container is None:
            raise DecodeError(f"unknown constructor 0x{code:02x} at offset {offset - 1}")
        return container(buf, offset, depth)
    return decoder(buf, offset)


_SMALL_COMPOUND = {0xC0: _CONTAINERS[0xC0], 0xC1: _CONTAINERS[0xC1]}


def decode_all(buf: bytes) -> list[Any]:
    """Decode a sequence of values filling ``buf`` exactly."""
    values, offset = [], 0
    while offset < len(buf):
        value, offset = decode(buf, offset)
        values.append(value)
    return values


# Widths of fixed-size values, by constructor, for skip().
_FIXED_WIDTH = {
    0x40: 0,
    0x41: 0,
    0x42: 0,
    0x43: 0,
    0x44: 0,
    0x45: 0,
    0x50: 1,
    0x51: 1,
    0x52: 1,
    0x53: 1,
    0x54: 1,
    0x55: 1,
    0x56: 1,
    0x60: 2,
    0x61: 2,
    0x70: 4,
    0x71: 4,
    0x72: 4,
    0x73: 4,
    0x74: 4,
    0x80: 8,
    0x81: 8,
    0x82: 8,
    0x83: 8,
    0x84: 8,
    0x94: 16,
    0x98: 16,
}


def skip(buf: bytes, offset: int) -> int:
    """The offset just after the value starting at ``offset``, without decoding it.

    Raises:
        DecodeError: unknown constructor or truncated encoding.
    """
    try:
        code = buf[offset]
        offset += 1
        if code == 0x40:
            end = offset
        elif code & 0xF0 in (0xA0, 0xC0, 0xE0):  # one-byte size
            end = offset + 1 + buf[offset]
        else:
            width = _FIXED_WIDTH.get(code)
            if width is not None:
                end = offset + width
            elif code & 0xF0 in (0xB0, 0xD0, 0xF0):  # four-byte size
                end = offset + 4 + _U32(buf, offset)[0]
            elif code == 0x00:
                return _skip_described(buf, offset)
            else:
                raise DecodeError(f"unknown constructor 0x{code:02x} at offset {offset - 1}")
    except (IndexError, struct.error):
        raise DecodeError(f"truncated value at offset {offset - 1}") from None
    if end > len(buf):
        raise DecodeError(f"truncated value at offset {offset - 1}: needs {end} bytes, have {len(buf)}")
    return end


def _skip_described(buf: bytes, offset: int) -> int:
    """The end of a described value whose 0x00 is just before ``offset``: a loop, not a
    recursion (a descriptor may itself be described, as deep as the bytes go)."""
    pending = 2  # its descriptor and its value
    while pending:
        if offset < len(buf) and buf[offset] == 0x00:
            offset += 1
            pending += 1  # this one is two values more, and itself no longer pending
        else:
            offset = skip(buf, offset)
            pending -= 1
    return offset


# -- encoding -----------------------------------------------------------------------------

_P8 = struct.Struct(">B").pack
_P32 = struct.Struct(">I").pack


def _encode_int(value: int, out: bytearray) -> None:
    if isinstance(value, _Width):
        _encode_width(value, out)
    elif -128 <= value <= 127:
        out += b"\x55" + struct.pack(">b", value)
    elif 2**63 <= value < 2**64:  # only a ulong holds it (a decoded ulong echoed back, say)
        out += b"\x80" + struct.pack(">Q", value)
    else:
        try:
            out += b"\x81" + struct.pack(">q", value)
        except struct.error:
            raise TypeError(f"cannot encode {value} as AMQP: beyond long and ulong") from None


def _encode_width(value: _Width, out: bytearray) -> None:
    kind = type(value)
    if kind is UByte:
        out += b"\x50" + struct.pack(">B", value)
    elif kind is UShort:
        out += b"\x60" + struct.pack(">H", value)
    elif kind is UInt:
        if value == 0:
            out += b"\x43"
        elif value < 256:
            out += b"\x52" + struct.pack(">B", value)
        else:
            out += b"\x70" + struct.pack(">I", value)
    elif kind is ULong:
        if value == 0:
            out += b"\x44"
        elif value < 256:
            out += b"\x53" + struct.pack(">B", value)
        else:
            out += b"\x80" + struct.pack(">Q", value)
    elif kind is Byte:
        out += b"\x51" + struct.pack(">b", value)
    elif kind is Short:
        out += b"\x61" + struct.pack(">h", value)
    elif kind is Int:
        if -128 <= value <= 127:
            out += b"\x54" + struct.pack(">b", value)
        else:
            out += b"\x71" + struct.pack(">i", value)
    else:  # Long
        if -128 <= value <= 127:
            out += b"\x55" + struct.pack(">b", value)
        else:
            out += b"\x81" + struct.pack(">q", value)


def _encode_variable(raw: bytes, small: bytes, large: bytes, out: bytearray) -> None:
    if len(raw) < 256:
        out += small + _P8(len(raw)) + raw
    else:
        out += large + _P32(len(raw)) + raw


def _encode_compound(items: list[Any], small: bytes, large: bytes, out: bytearray) -> None:
    body = bytearray()
    for item in items:
        _encode(item, body)
    count = len(items)
    if len(body) + 1 < 256 and count < 256:
        out += small + _P8(len(body) + 1) + _P8(count) + body
    else:
        out += large + _P32(len(body) + 4) + _P32(count) + body


def _encode(value: Any, out: bytearray) -> None:
    if value is None:
        out += b"\x40"
    elif value is True:
        out += b"\x41"
    elif value is False:
        out += b"\x42"
    elif isinstance(value, Timestamp):
        out += b"\x83" + struct.pack(">q", value)
    elif isinstance(value, int):
        _encode_int(value, out)
    elif isinstance(value, Float):
        out += b"\x72" + struct.pack(">f", value)
    elif isinstance(value, float):
        out += b"\x82" + struct.pack(">d", value)
    elif isinstance(value, Symbol):
        _encode_variable(value.encode("ascii"), b"\xa3", b"\xb3", out)
    elif isinstance(value, Char):
        out += b"\x73" + struct.pack(">I", ord(value))
    elif isinstance(value, str):
        _encode_variable(value.encode("utf-8"), b"\xa1", b"\xb1", out)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        _encode_variable(bytes(value), b"\xa0", b"\xb0", out)
    elif isinstance(value, uuid.UUID):
        out += b"\x98" + value.bytes
    elif isinstance(value, Described):
        out += b"\x00"
        _encode_descriptor(value.descriptor, out)
        _encode(value.value, out)
    elif isinstance(value, list | tuple):
        if not value:
            out += b"\x45"
        else:
            _encode_compound(list(value), b"\xc0", b"\xd0", out)
    elif isinstance(value, dict):
        flat = [part for pair in value.items() for part in pair]
        _encode_compound(flat, b"\xc1", b"\xd1", out)
    elif isinstance(value, Decimal):
        out += bytes([value.code]) + value.raw
    elif isinstance(value, Array):
        _encode_array(value, out)
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as AMQP: {value!r}")


def _encode_descriptor(descriptor: Any, out: bytearray) -> None:
    """A descriptor is a symbol or a ulong [1.5]: a plain ``int`` (as decoded) is a ulong."""
    _encode(ULong(descriptor) if type(descriptor) is int else descriptor, out)


def _fixed_element(fmt: str) -> Callable[[Any, bytearray], None]:
    pack = struct.Struct(fmt).pack

    def element(value: Any, out: bytearray) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"array element {value!r} is not a number")
        out += pack(value)

    return element


def _constant_element(allowed: tuple[Any, ...]) -> Callable[[Any, bytearray], None]:
    def element(value: Any, out: bytearray) -> None:
        if value not in allowed or type(value) is float:
            raise TypeError(f"array element {value!r} does not fit its zero-width constructor")

    return element


def _variable_element(wide: bool, kind: type) -> Callable[[Any, bytearray], None]:
    def element(value: Any, out: bytearray) -> None:
        if kind is bytes:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"array element {value!r} is not binary")
            raw = bytes(value)
        elif not isinstance(value, str):
            raise TypeError(f"array element {value!r} is not text")
        else:
            raw = value.encode("ascii" if kind is Symbol else "utf-8")
        if not wide and len(raw) > 255:
            raise TypeError(f"array element of {len(raw)} bytes does not fit a one-byte size")
        out += (_P32 if wide else _P8)(len(raw)) + raw

    return element


def _compound_element(wide: bool, kind: type) -> Callable[[Any, bytearray], None]:
    def element(value: Any, out: bytearray) -> None:
        if kind is Array:
            if not isinstance(value, Array):
                raise TypeError(f"array element {value!r} is not an array")
            body, count = _array_body(value)
        else:
            if not isinstance(value, dict if kind is dict else (list, tuple)):
                raise TypeError(f"array element {value!r} is not a {kind.__name__}")
            # (the check above let through a dict exactly when kind is dict)
            items = [part for pair in value.items() for part in pair] if isinstance(value, dict) else list(value)
            body = bytearray()
            for item in items:
                _encode(item, body)
            count = len(items)
        if wide:
            out += _P32(len(body) + 4) + _P32(count) + body
        elif len(body) + 1 < 256 and count < 256:
            out += _P8(len(body) + 1) + _P8(count) + body
        else:
            raise TypeError(f"array element of {len(body)} bytes does not fit a one-byte size")

    return element


def _char_element(value: Any, out: bytearray) -> None:
    if not isinstance(value, str) or len(value) != 1:
        raise TypeError(f"array element {value!r} is not one character")
    out += struct.pack(">I", ord(value))


def _uuid_element(value: Any, out: bytearray) -> None:
    if not isinstance(value, uuid.UUID):
        raise TypeError(f"array element {value!r} is not a uuid")
    out += value.bytes


def _decimal_element(code: int) -> Callable[[Any, bytearray], None]:
    def element(value: Any, out: bytearray) -> None:
        if not isinstance(value, Decimal) or value.code != code:
            raise TypeError(f"array element {value!r} is not a decimal of constructor 0x{code:02x}")
        out += value.raw

    return element


def _boolean_element(value: Any, out: bytearray) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"array element {value!r} is not a boolean")
    out.append(1 if value else 0)


# How each element of an array is written after the array's one constructor (part 1,
# §1.6.24): what the constructor says, whatever Python type the element has — so a decoded
# array encodes again exactly (its elements decode to plain ints and floats).
_ELEMENT_ENCODERS: dict[int, Callable[[Any, bytearray], None]] = {
    0x40: _constant_element((None,)),
    0x41: _constant_element((True,)),
    0x42: _constant_element((False,)),
    0x43: _constant_element((0,)),
    0x44: _constant_element((0,)),
    0x45: _constant_element(([], ())),
    0x56: _boolean_element,
    **{
        code: _fixed_element(fmt)
        for code, fmt in {
            0x50: ">B",
            0x52: ">B",
            0x53: ">B",
            0x60: ">H",
            0x70: ">I",
            0x80: ">Q",
            0x51: ">b",
            0x54: ">b",
            0x55: ">b",
            0x61: ">h",
            0x71: ">i",
            0x81: ">q",
            0x72: ">f",
            0x82: ">d",
            0x83: ">q",
        }.items()
    },
    0x73: _char_element,
    0x98: _uuid_element,
    0x74: _decimal_element(0x74),
    0x84: _decimal_element(0x84),
    0x94: _decimal_element(0x94),
    0xA0: _variable_element(False, bytes),
    0xB0: _variable_element(True, bytes),
    0xA1: _variable_element(False, str),
    0xB1: _variable_element(True, str),
    0xA3: _variable_element(False, Symbol),
    0xB3: _variable_element(True, Symbol),
    0xC0: _compound_element(False, list),
    0xD0: _compound_element(True, list),
    0xC1: _compound_element(False, dict),
    0xD1: _compound_element(True, dict),
    0xE0: _compound_element(False, Array),
    0xF0: _compound_element(True, Array),
}


def _array_body(array: Array) -> tuple[bytearray, int]:
    """The bytes of an array after its size and count (descriptor, constructor, elements)."""
    body = bytearray()
    if array.descriptor is not None:
        body += b"\x00"
        _encode_descriptor(array.descriptor, body)
    element = _ELEMENT_ENCODERS.get(array.code)
    if element is None:
        raise TypeError(f"0x{array.code:02x} is not a constructor arrays can have")
    body.append(array.code)
    for item in array.items:
        element(item, body)
    return body, len(array.items)


def _encode_array(array: Array, out: bytearray) -> None:
    body, count = _array_body(array)
    if len(body) + 1 < 256 and count < 256:
        out += b"\xe0" + _P8(len(body) + 1) + _P8(count) + body
    else:
        out += b"\xf0" + _P32(len(body) + 4) + _P32(count) + body


def encode(value: Any) -> bytes:
    """The AMQP encoding of ``value`` (see the module docstring for the type mapping).

    Raises:
        TypeError: a value has no AMQP encoding.
    """
    out = bytearray()
    _encode(value, out)
    return bytes(out)
