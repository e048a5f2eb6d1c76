"""The routing wire codec (swiftlets/routing/wire.py): round trips, the lead-in magic, and every
way a peer's frame is refused (docs/routing-protocol.md, "Frames")."""

from __future__ import annotations

import struct

import attrs
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from martinet.swiftlets.routing.wire import (
    FRAMES,
    MAGIC,
    RESERVED,
    Close,
    Connect,
    FrameReader,
    FrameType,
    Kind,
    LocalProtocolError,
    RemoteProtocolError,
    Route,
    decode_body,
    encode,
)

KIND_VALUES = {
    Kind.STR: st.text(max_size=40),
    Kind.BIN: st.binary(max_size=40),
    Kind.BOOL: st.booleans(),
    Kind.UINT: st.integers(0, 2**32 - 1),
    Kind.STRS: st.lists(st.text(max_size=10), max_size=5).map(tuple),
    Kind.BINS: st.lists(st.binary(max_size=20), max_size=5).map(tuple),
}


def frame_strategy(cls):
    return st.fixed_dictionaries({f.name: KIND_VALUES[f.metadata["kind"]] for f in attrs.fields(cls)}).map(
        lambda fields: cls(**fields)
    )


ANY_FRAME = st.one_of(*(frame_strategy(cls) for cls in FRAMES.values()))


def body(code, fields) -> bytes:
    return msgpack.packb([code, fields], use_bin_type=True)


def framed(raw_body: bytes) -> bytes:
    return struct.pack(">I", len(raw_body)) + raw_body


@given(ANY_FRAME)
def test_every_frame_type_round_trips(frame):
    data = encode(frame)
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    reader = FrameReader()
    reader.feed(MAGIC + data)
    assert reader.next_frame() == frame
    assert reader.next_frame() is None and reader.buffered == 0


def test_every_implemented_type_has_a_frame_class_and_reserved_codes_have_none():
    assert set(FRAMES) | RESERVED == set(FrameType)
    assert not set(FRAMES) & RESERVED


def test_frames_arrive_in_pieces():
    frames = [Connect(name="r1", nonce=bytes(32), use_xa=True), Close(reason="bye")]
    stream = MAGIC + b"".join(encode(f) for f in frames)
    reader, got = FrameReader(), []
    for i in range(len(stream)):
        reader.feed(stream[i : i + 1])
        while (frame := reader.next_frame()) is not None:
            got.append(frame)
    assert got == frames


@pytest.mark.parametrize(
    "raw, reason",
    [
        (body(7, {}), "unknown frame type 7"),
        (body(int(FrameType.TRANSACTION), {}), "TRANSACTION frame lacks the field"),
        (body(50, {"xid": "x", "messages": [b"a", "b"], "compressed": False}), "'messages' must be array of bin"),
        (body(50, {"xid": "x", "messages": b"ab", "compressed": False}), "'messages' must be array of bin"),
        (body(61, {"seq": -1}), "NONXA_COMMIT field 'seq' must be uint32"),
        (body(99, {}), "CLOSE frame lacks the field 'reason'"),
        (body(99, {"reason": "x", "extra": 1}), "CLOSE frame has an unexpected field 'extra'"),
        (body(99, {"reason": 5}), "CLOSE field 'reason' must be str, got int"),
        (body(99, {"reason": b"bytes"}), "CLOSE field 'reason' must be str, got bytes"),
        (body(10, {"name": "r", "nonce": "text", "use_xa": True}), "CONNECT field 'nonce' must be bin, got str"),
        (body(10, {"name": "r", "nonce": b"", "use_xa": 1}), "CONNECT field 'use_xa' must be bool, got int"),
        (body(40, {"transaction_size": True, "window_size": 1}), "'transaction_size' must be uint32, got bool"),
        (body(40, {"transaction_size": -1, "window_size": 1}), "'transaction_size' must be uint32, got int"),
        (body(40, {"transaction_size": 2**32, "window_size": 1}), "'transaction_size' must be uint32"),
        (body(43, {"add": True, "destination": "r", "path": ["a", 1]}), "'path' must be array of str"),
        (body(43, {"add": True, "destination": "r", "path": "ab"}), "'path' must be array of str"),
        (msgpack.packb({"type": 99}), "must be [type code, {fields}]"),
        (msgpack.packb([99, {"reason": "x"}, 3]), "must be [type code, {fields}]"),
        (msgpack.packb([True, {"reason": "x"}]), "must be [type code, {fields}]"),
        (msgpack.packb([99, {1: "x"}]), "malformed frame body"),  # strict_map_key
        (b"\x92\x63\x81\xa6reason\xa2\xff\xfe", "malformed frame body"),  # not UTF-8
        (msgpack.packb([99, {"reason": msgpack.ExtType(1, b"x")}]), "malformed frame body"),
        (msgpack.packb([99, {"reason": msgpack.Timestamp(1)}]), "malformed frame body"),
        (body(99, {"reason": "x"}) + b"\x00", "malformed frame body (ExtraData"),
        (b"\xc1", "malformed frame body"),
        (b"\x91" * 3000, "malformed frame body"),  # nesting beyond msgpack's stack
    ],
)
def test_bad_bodies_are_refused_with_a_precise_reason(raw, reason):
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(raw)
    assert reason in str(info.value)
    reader = FrameReader()
    reader.feed(MAGIC + framed(raw))
    with pytest.raises(RemoteProtocolError, match=".") as again:
        reader.next_frame()
    assert str(again.value) == str(info.value)


@pytest.mark.parametrize(
    "stream, hint",
    [
        (b"AMQP\x00\x01\x00\x00", "(an AMQP client?)"),
        (b"AMQP\x03\x01\x00\x00", "(an AMQP client?)"),
        (b"GET / HTTP/1.1\r\n", "(an HTTP request?)"),
        (b"\x16\x03\x01\x02\x00", "(a TLS handshake?"),
        (b"MARTINEZ", "b'MARTINEZ'"),
        (b"X", "b'X'"),
    ],
)
def test_a_stranger_is_refused_at_its_first_differing_byte(stream, hint):
    reader = FrameReader()
    reader.feed(stream)
    with pytest.raises(RemoteProtocolError, match="not a Martinet router") as info:
        reader.next_frame()
    assert hint in str(info.value)


def test_a_partial_magic_waits():
    reader = FrameReader()
    reader.feed(MAGIC[:5])
    assert reader.next_frame() is None


@given(st.integers(4097, 2**32 - 1))
def test_an_oversized_length_is_refused_before_its_body_is_read(length):
    reader = FrameReader(4096)
    reader.feed(MAGIC + struct.pack(">I", length))  # the length alone: no body is waited for
    with pytest.raises(RemoteProtocolError, match=f"frame of {length} bytes exceeds the maximum frame size of 4096"):
        reader.next_frame()


def test_an_empty_frame_is_refused():
    reader = FrameReader()
    reader.feed(MAGIC + b"\x00\x00\x00\x00")
    with pytest.raises(RemoteProtocolError, match="empty frame"):
        reader.next_frame()


def test_limits_follow_the_frame_size():
    raw = body(99, {"reason": "x" * 5000})
    with pytest.raises(RemoteProtocolError, match="malformed frame body"):
        decode_body(raw, max_frame_size=4096)
    assert decode_body(raw, max_frame_size=8192) == Close(reason="x" * 5000)


def test_encoding_checks_kinds_and_size():
    with pytest.raises(LocalProtocolError, match="'reason' must be str"):
        encode(Close(reason=b"x"))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="exceeds the maximum frame size of 100 bytes"):
        encode(Route(add=True, destination="r", path=("r",) * 100), max_frame_size=100)


@given(st.binary(max_size=300))
def test_random_bodies_raise_only_remote_protocol_errors(raw):
    try:
        decode_body(raw)
    except RemoteProtocolError as exc:
        assert str(exc)


def test_the_documented_example_frame():
    """docs/routing-protocol.md §2: CONNECT from r1, nonce C×32, use-xa true."""
    expected = bytes.fromhex("0000003b 920a83 a46e616d65a27231 a56e6f6e6365c420" + "43" * 32 + "a67573655f7861c3")
    assert encode(Connect(name="r1", nonce=b"C" * 32, use_xa=True)) == expected
