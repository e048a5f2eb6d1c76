"""Changed copies of a message keep what the client sent byte for byte: merging
annotations splices them into the encoded map [3.2.10], a redelivery rewrites only the
header's first-acquirer and delivery-count [3.2.1]. Checked on raw bytes, with AMQP values
generated in every encoding part 1 §1.6 allows (so not through our own encoder)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging.codec import Array, Described, Symbol, UByte, UInt, ULong, decode, encode, skip
from martinet.messaging.message import AnnotationPatch, Message, MessageError, build, redelivered
from martinet.messaging.selector import compile_selector, message_identifiers

CID = Symbol("x-opt-martinet-cid")


# -- AMQP values as bytes, in every encoding -------------------------------------------------


def packed(fmt: str, values: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    return values.map(struct.Struct(fmt).pack)


def sized(one_byte: bool, payload: bytes) -> bytes:
    return (bytes((len(payload),)) if one_byte else struct.pack(">I", len(payload))) + payload


def text(alphabet: st.SearchStrategy, encoding: str, one_byte: bool) -> st.SearchStrategy[bytes]:
    return st.text(alphabet, max_size=12).map(lambda s: sized(one_byte, s.encode(encoding)))


ASCII = st.characters(max_codepoint=127)
UNICODE = st.characters(blacklist_categories=("Cs",))

# (constructor, what follows it): the payload strategies arrays reuse for their elements.
SCALARS: list[tuple[int, st.SearchStrategy[bytes]]] = [
    (0x40, st.just(b"")),  # null
    (0x41, st.just(b"")),  # true
    (0x42, st.just(b"")),  # false
    (0x56, st.sampled_from([b"\x00", b"\x01"])),  # boolean
    (0x50, packed(">B", st.integers(0, 2**8 - 1))),  # ubyte
    (0x60, packed(">H", st.integers(0, 2**16 - 1))),  # ushort
    (0x70, packed(">I", st.integers(0, 2**32 - 1))),  # uint
    (0x52, packed(">B", st.integers(0, 2**8 - 1))),  # smalluint
    (0x43, st.just(b"")),  # uint0
    (0x80, packed(">Q", st.integers(0, 2**64 - 1))),  # ulong
    (0x53, packed(">B", st.integers(0, 2**8 - 1))),  # smallulong
    (0x44, st.just(b"")),  # ulong0
    (0x51, packed(">b", st.integers(-(2**7), 2**7 - 1))),  # byte
    (0x61, packed(">h", st.integers(-(2**15), 2**15 - 1))),  # short
    (0x71, packed(">i", st.integers(-(2**31), 2**31 - 1))),  # int
    (0x54, packed(">b", st.integers(-(2**7), 2**7 - 1))),  # smallint
    (0x81, packed(">q", st.integers(-(2**63), 2**63 - 1))),  # long
    (0x55, packed(">b", st.integers(-(2**7), 2**7 - 1))),  # smalllong
    (0x72, packed(">f", st.floats(width=32, allow_nan=False))),  # float
    (0x82, packed(">d", st.floats(allow_nan=False))),  # double
    (0x74, st.binary(min_size=4, max_size=4)),  # decimal32
    (0x84, st.binary(min_size=8, max_size=8)),  # decimal64
    (0x94, st.binary(min_size=16, max_size=16)),  # decimal128
    (0x73, packed(">I", st.integers(0, 0x10FFFF))),  # char
    (0x83, packed(">q", st.integers(-(2**63), 2**63 - 1))),  # timestamp
    (0x98, st.binary(min_size=16, max_size=16)),  # uuid
    (0xA0, st.binary(max_size=12).map(lambda b: sized(True, b))),  # vbin8
    (0xB0, st.binary(max_size=12).map(lambda b: sized(False, b))),  # vbin32
    (0xA1, text(UNICODE, "utf-8", True)),  # str8
    (0xB1, text(UNICODE, "utf-8", False)),  # str32
    (0xA3, text(ASCII, "ascii", True)),  # sym8
    (0xB3, text(ASCII, "ascii", False)),  # sym32
]

scalars = st.one_of([payload.map(lambda p, c=code: bytes((c,)) + p) for code, payload in SCALARS])
symbols = st.one_of(
    text(ASCII, "ascii", True).map(lambda p: b"\xa3" + p), text(ASCII, "ascii", False).map(lambda p: b"\xb3" + p)
)
ulongs = st.one_of(
    st.just(b"\x44"),
    packed(">B", st.integers(0, 255)).map(lambda p: b"\x53" + p),
    packed(">Q", st.integers(0, 2**64 - 1)).map(lambda p: b"\x80" + p),
)


def compound(code8: int, code32: int, items: list[bytes], wide: bool) -> bytes:
    body = b"".join(items)
    if not wide and len(body) + 1 < 256:
        return bytes((code8, len(body) + 1, len(items))) + body
    return bytes((code32,)) + struct.pack(">II", len(body) + 4, len(items)) + body


@st.composite
def arrays(draw, descriptor=None) -> bytes:
    code, payload = draw(st.sampled_from(SCALARS))
    elements = draw(st.lists(payload, max_size=5))
    described = draw(st.booleans())
    head = (b"\x00" + draw(st.one_of(symbols, ulongs)) if described else b"") + bytes((code,))
    body = head + b"".join(elements)
    if not draw(st.booleans()) and len(body) + 1 < 256:
        return bytes((0xE0, len(body) + 1, len(elements))) + body
    return b"\xf0" + struct.pack(">II", len(body) + 4, len(elements)) + body


def extend(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(b"\x45"),  # list0
        st.builds(lambda items, wide: compound(0xC0, 0xD0, items, wide), st.lists(children, max_size=4), st.booleans()),
        st.builds(
            lambda pairs, wide: compound(0xC1, 0xD1, [part for pair in pairs for part in pair], wide),
            st.lists(st.tuples(children, children), max_size=3),
            st.booleans(),
        ),
        st.builds(lambda descriptor, value: b"\x00" + descriptor + value, st.one_of(symbols, ulongs), children),
    )


values = st.recursive(st.one_of(scalars, arrays()), extend, max_leaves=8)

# Annotation keys [3.2.10]: symbols or ulongs, in any of their encodings; unique by value.
key_specs = st.lists(
    st.one_of(
        st.tuples(st.just("symbol"), st.text(ASCII, min_size=1, max_size=10).filter(lambda k: k != CID), st.booleans()),
        st.tuples(st.just("ulong"), st.integers(0, 2**64 - 1).filter(lambda k: k != 77), st.booleans()),
    ),
    max_size=6,
    unique_by=lambda spec: spec[:2],
)


def encode_key(kind: str, value, wide: bool) -> bytes:
    if kind == "symbol":
        return (b"\xb3" + struct.pack(">I", len(value)) if wide else b"\xa3" + bytes((len(value),))) + value.encode()
    if wide or value > 255:
        return b"\x80" + struct.pack(">Q", value)
    return b"\x44" if value == 0 else b"\x53" + bytes((value,))


def map_entries(raw: bytes, at: int) -> tuple[int, list[tuple[bytes, bytes]], int]:
    """(constructor, [(key bytes, value bytes)], end) of the map encoded at ``at``."""
    code = raw[at]
    if code == 0xC1:
        count, position = raw[at + 2], at + 3
    else:
        assert code == 0xD1
        count, position = struct.unpack_from(">I", raw, at + 5)[0], at + 9
    entries = []
    for _ in range(count // 2):
        key_end = skip(raw, position)
        value_end = skip(raw, key_end)
        entries.append((raw[position:key_end], raw[key_end:value_end]))
        position = value_end
    return code, entries, position


HEADERS = [b"", encode(Described(ULong(0x70), [True, UByte(7), None, True, UInt(2)])), b"\x00\x53\x70\x45"]
TAIL = encode(Described(ULong(0x73), ["id-1", None, "q"])) + encode(Described(ULong(0x75), b"body"))


@settings(max_examples=400, deadline=None)
@given(
    keys=key_specs,
    data=st.data(),
    wide=st.booleans(),
    header=st.sampled_from(HEADERS),
    delivery_annotations=st.booleans(),
    present=st.sampled_from([None, "sym8", "sym32"]),
    second=st.booleans(),
)
def test_merging_annotations_keeps_every_other_entry_byte_for_byte(
    keys, data, wide, header, delivery_annotations, present, second
):
    entries = [(encode_key(*spec), data.draw(values)) for spec in keys]
    if present is not None:  # the patched key is there already, in either symbol encoding
        entries.insert(
            data.draw(st.integers(0, len(entries))), (encode_key("symbol", CID, present == "sym32"), data.draw(values))
        )
    front = header + (encode(Described(ULong(0x71), {Symbol("x-opt-d"): 1})) if delivery_annotations else b"")
    annotations = compound(0xC1, 0xD1, [part for entry in entries for part in entry], wide)
    raw = front + b"\x00\x53\x72" + annotations + TAIL
    changes = {CID: "client-1", ULong(77): UByte(9)} if second else {CID: "client-1"}

    patched = AnnotationPatch(changes).apply(Message(raw))
    out = patched.raw
    assert patched.queue_info(1000) == Message(out).queue_info(1000)  # what it read on the way is right

    assert out.startswith(front + b"\x00\x53\x72") and out.endswith(TAIL)  # the other sections untouched
    code, got, end = map_entries(out, len(front) + 3)
    assert end == len(out) - len(TAIL)
    body = b"".join(key + value for key, value in got)
    assert code == (0xD1 if annotations[0] == 0xD1 or len(body) + 1 >= 256 else 0xC1)  # a map32 stays one
    patched = {encode(CID): encode(CID) + encode("client-1"), encode(ULong(77)): encode(ULong(77)) + encode(UByte(9))}
    patched_keys = {key for key in (encode_key("symbol", CID, False), encode_key("symbol", CID, True))}
    others_before = [entry for entry in entries if entry[0] not in patched_keys]
    others_after = [entry for entry in got if entry[0] not in patched]
    assert others_after == others_before  # same bytes, same order
    new = [key + value for key, value in got if key in patched]
    assert sorted(new) == sorted(patched[encode(key)] for key in changes)  # each change once
    if present is not None:  # replaced where it was
        assert got.index((encode(CID), encode("client-1"))) == [e[0] for e in entries].index(
            encode_key("symbol", CID, present == "sym32")
        )
    try:
        before = Message(raw).message_annotations
    except MessageError:  # a nested map with a list as key: legal AMQP, but no Python dict
        return
    decoded = Message(out)
    decoded.validate()
    assert decoded.message_annotations == {**before, **changes}


@settings(max_examples=200, deadline=None)
@given(
    header=st.sampled_from(HEADERS),
    delivery_annotations=st.booleans(),
    annotated=st.booleans(),
    absent=st.booleans(),
    peek=st.booleans(),
    second=st.dictionaries(st.sampled_from([CID, Symbol("x-opt-b"), ULong(5)]), st.text(max_size=300), min_size=1),
)
def test_a_patch_on_a_patched_message_uses_the_spans_it_knows(
    header, delivery_annotations, annotated, absent, peek, second
):
    """A message patched on the way in (the listener's client id) and patched again (the
    routing rewrite) comes out byte for byte as if the second patch read it afresh; and
    ``queue_info(peek=True)`` leaves what the patch read for the queue manager's call."""
    front = header + (encode(Described(ULong(0x71), {Symbol("x-opt-d"): 1})) if delivery_annotations else b"")
    annotations = encode(Described(ULong(0x72), {Symbol("x-opt-a"): "a"})) if annotated else b""
    raw = front + annotations + TAIL
    first = AnnotationPatch({CID: "client-1"}).apply(Message(raw))
    if absent:  # what the caller promises then: none of the second patch's keys is there
        second = {key: value for key, value in second.items() if key is not CID}
        if not second:
            return
    if peek:
        assert first.queue_info(1000, peek=True) == Message(first.raw).queue_info(1000)
    twice = AnnotationPatch(second).apply(first, absent=absent)
    fresh = AnnotationPatch(second).apply(Message(first.raw), absent=absent)
    assert twice.raw == fresh.raw
    assert twice.queue_info(1000, check=True) == Message(twice.raw).queue_info(1000, check=True)
    assert Message(twice.raw).message_annotations == {**Message(raw).message_annotations, CID: "client-1", **second}


def test_a_map8_that_outgrows_one_byte_becomes_a_map32():
    raw = encode(Described(ULong(0x72), {Symbol("x-opt-a"): "x" * 200})) + encode(Described(ULong(0x77), None))
    assert raw[3] == 0xC1
    out = AnnotationPatch({CID: "y" * 60}).apply(Message(raw)).raw
    code, entries, _ = map_entries(out, 3)
    assert code == 0xD1 and entries[0] == (encode(Symbol("x-opt-a")), encode("x" * 200))


def test_a_decoded_array_encodes_again_exactly():
    """Elements decode to plain ints and floats; the array's constructor says how to write them."""
    for raw in (
        b"\xf0\x00\x00\x00\x11\x00\x00\x00\x03\x71\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03",
        b"\xe0\x0a\x02\x72\x3f\xc0\x00\x00\x40\x20\x00\x00",
        b"\xe0\x07\x02\x00\x53\x07\x50\x01\x02",
    ):
        value = decode(raw)[0]
        assert isinstance(value, Array) and decode(encode(value))[0] == value
        after_count = raw[3:] if raw[0] == 0xE0 else raw[9:]  # (a small array32 comes back as an array8)
        assert encode(value)[3:] == after_count


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\x00\x53\x72\xc1\x06\x03\xa3\x01a\x41\x40", "odd number of elements"),
        (b"\x00\x53\x72\xc1\x04\x02\xa3\x05a", "message-annotations"),  # a key runs past the map
        (b"\x00\x53\x72\xc0\x01\x00", "must be a map"),
    ],
)
def test_unreadable_annotations_are_a_message_error(raw, error):
    with pytest.raises(MessageError, match=error):
        AnnotationPatch({CID: "x"}).apply(Message(raw + encode(Described(ULong(0x77), None))))


def test_a_change_without_an_amqp_encoding_is_a_message_error():
    with pytest.raises(MessageError, match="has no AMQP encoding"):
        AnnotationPatch({CID: object()})
    with pytest.raises(MessageError, match="has no AMQP encoding"):
        build(b"x").with_annotations({CID: Array(0x71, ("not a number",))})


# -- the header on redelivery ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "failures", "expected"),
    [
        # [durable, priority, ttl, first-acquirer, delivery-count]: only the last two change
        (
            b"\xc0\x0c\x05\x41\x50\x07\x70\x00\x00\x03\xe8\x41\x52\x03",
            1,
            b"\xc0\x0c\x05\x41\x50\x07\x70\x00\x00\x03\xe8\x42\x52\x04",
        ),
        (
            b"\xc0\x0c\x05\x41\x50\x07\x70\x00\x00\x03\xe8\x41\x52\x03",
            0,
            b"\xc0\x0c\x05\x41\x50\x07\x70\x00\x00\x03\xe8\x42\x52\x03",
        ),
        (b"\xc0\x02\x01\x41", 2, b"\xc0\x07\x05\x41\x40\x40\x42\x52\x02"),  # short list: padded with nulls
        (b"\x45", 1, b"\xc0\x07\x05\x40\x40\x40\x42\x52\x01"),
        (
            b"\xd0\x00\x00\x00\x06\x00\x00\x00\x02\x41\x40",
            1,  # a list32 stays a list32
            b"\xd0\x00\x00\x00\x0a\x00\x00\x00\x05\x41\x40\x40\x42\x52\x01",
        ),
        (b"\xc0\x0a\x05\x40\x40\x40\x40\x70\xff\xff\xff\xff", 3, b"\xc0\x0a\x05\x40\x40\x40\x42\x70\xff\xff\xff\xff"),
    ],
)
def test_a_redelivery_rewrites_only_first_acquirer_and_delivery_count(header, failures, expected):
    rest = encode(Described(ULong(0x72), {Symbol("x-opt-a"): UByte(1)})) + encode(Described(ULong(0x77), "v"))
    message = Message(b"\x00\x53\x70" + header + rest)
    assert redelivered(message, failures).raw == b"\x00\x53\x70" + expected + rest


def test_a_redelivery_without_a_change_is_the_message_itself():
    for message in (
        build(b"x"),
        Message(b"\x00\x53\x70\xc0\x03\x02\x41\x40" + encode(Described(ULong(0x77), 1))),
        Message(b"\x00\x53\x70\xc0\x05\x04\x40\x40\x40\x42" + encode(Described(ULong(0x77), 1))),
    ):
        assert redelivered(message, 0) is message
    headerless = build(b"x")
    assert redelivered(headerless, 2).raw == b"\x00\x53\x70\xc0\x07\x05\x40\x40\x40\x42\x52\x02" + headerless.raw


def test_an_unusual_header_is_decoded_on_the_way_in_and_refused_when_broken():
    good = Message(
        b"\x00\x53\x70\xc0\x0e\x05\x40\x40\x40\x41\x80" + b"\x00" * 7 + b"\x05" + encode(Described(ULong(0x77), 1))
    )  # delivery-count as a ulong: read, counted on
    assert good.queue_info(0) == (False, 4, None, None) and redelivered(good, 1).header.delivery_count == 6
    broken = Message(b"\x00\x53\x70\xc0\x06\x05\x40\x40\x40\x41\x02" + encode(Described(ULong(0x77), 1)))
    with pytest.raises(MessageError):
        broken.queue_info(0)
    with pytest.raises(MessageError):
        redelivered(broken, 1)


def test_jms_x_delivery_count_counts_from_the_producers_delivery_count():
    """Qpid JMS: JMSXDeliveryCount = header delivery-count + 1; a selector sees the same."""
    message = Message(b"\x00\x53\x70\xc0\x07\x05\x40\x40\x40\x42\x52\x03" + encode(Described(ULong(0x77), 1)))
    assert compile_selector("JMSXDeliveryCount = 4").evaluate(message_identifiers(message, 0)) is True
    assert compile_selector("JMSXDeliveryCount = 6").evaluate(message_identifiers(message, 2)) is True
