"""AMQP 1.0 type codec and the message model: round trips, spec encodings, malformed input."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging.codec import (
    Array,
    Byte,
    Char,
    DecodeError,
    Described,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode,
    decode_all,
    encode,
    skip,
)
from martinet.messaging.message import AnnotationPatch, Message, MessageError, build, with_delivery_count

# (value, its encoding) per AMQP 1.0 part 1 §1.6
SPEC = [
    (None, b"\x40"),
    (True, b"\x41"),
    (False, b"\x42"),
    (UByte(7), b"\x50\x07"),
    (UShort(513), b"\x60\x02\x01"),
    (UInt(0), b"\x43"),
    (UInt(200), b"\x52\xc8"),
    (UInt(70000), b"\x70\x00\x01\x11\x70"),
    (ULong(0), b"\x44"),
    (ULong(0x70), b"\x53\x70"),
    (ULong(2**40), b"\x80\x00\x00\x01\x00\x00\x00\x00\x00"),
    (Byte(-2), b"\x51\xfe"),
    (Short(-300), b"\x61\xfe\xd4"),
    (Int(-5), b"\x54\xfb"),
    (Int(100000), b"\x71\x00\x01\x86\xa0"),
    (Long(-1), b"\x55\xff"),
    (5, b"\x55\x05"),
    (2**40, b"\x81\x00\x00\x01\x00\x00\x00\x00\x00"),
    (Float(1.5), b"\x72\x3f\xc0\x00\x00"),
    (1.5, b"\x82\x3f\xf8\x00\x00\x00\x00\x00\x00"),
    (Char("é"), b"\x73\x00\x00\x00\xe9"),
    (Timestamp(1000), b"\x83\x00\x00\x00\x00\x00\x00\x03\xe8"),
    (uuid.UUID(int=1), b"\x98" + b"\x00" * 15 + b"\x01"),
    (b"ab", b"\xa0\x02ab"),
    ("hé", b"\xa1\x03h\xc3\xa9"),
    (Symbol("x"), b"\xa3\x01x"),
    ([], b"\x45"),
    ([True, None], b"\xc0\x03\x02\x41\x40"),
    ({Symbol("k"): 1}, b"\xc1\x06\x02\xa3\x01k\x55\x01"),
    (Described(ULong(0x70), []), b"\x00\x53\x70\x45"),
    (Array(0xA3, (Symbol("a"), Symbol("b"))), b"\xe0\x06\x02\xa3\x01a\x01b"),
]


@pytest.mark.parametrize(("value", "encoded"), SPEC, ids=[repr(v)[:30] for v, _ in SPEC])
def test_spec_encodings(value, encoded):
    assert encode(value) == encoded
    decoded, end = decode(encoded)
    assert end == len(encoded) and skip(encoded, 0) == len(encoded)
    assert decoded == value and type(decoded) in (type(value), int, float, str, bytes)


def test_large_values_use_32_bit_sizes():
    text = "x" * 300
    assert encode(text)[:1] == b"\xb1" and decode(encode(text))[0] == text
    items = list(range(300))
    assert encode(items)[:1] == b"\xd0" and decode(encode(items))[0] == items
    mapping = {f"k{i}": i for i in range(100)}
    assert encode(mapping)[:1] == b"\xd1" and decode(encode(mapping))[0] == mapping


@pytest.mark.parametrize(
    ("encoded", "message"),
    [
        (b"", "truncated: no value at offset 0"),
        (b"\x02", "unknown constructor 0x02 at offset 0"),
        (b"\xa1\x05ab", "truncated string"),
        (b"\x70\x00\x01", "truncated uint"),
        (b"\xc0\x05\x02\x41", "truncated list"),
        (b"\xc1\x02\x01\x41", "odd number of elements"),
        (b"\xa1\x02\xff\xfe", "invalid text"),
        (b"\x56\x07", "invalid boolean"),
        (b"\xc0\x03\x01\x41\x41", "declares 3 bytes"),
        (b"\x73\x00\x11\x00\x00", "invalid char"),
    ],
)
def test_malformed_input_is_a_decode_error(encoded, message):
    with pytest.raises(DecodeError, match=message):
        decode(encoded)


amqp_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(Symbol, st.text(st.characters(max_codepoint=127), max_size=10))
    | st.builds(Timestamp, st.integers(-(2**63), 2**63 - 1))
    | st.uuids(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(amqp_values)
def test_any_value_round_trips(value):
    encoded = encode(value)
    assert decode(encoded) == (value, len(encoded))
    assert skip(encoded, 0) == len(encoded)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_random_bytes_decode_or_fail_cleanly(data):
    try:
        decode_all(data)
    except DecodeError:
        pass


# -- messages ----------------------------------------------------------------------------


def test_built_message_exposes_its_metadata():
    message = build(
        b"payload",
        durable=True,
        priority=7,
        ttl=5000,
        message_id="m-1",
        to="q@r",
        subject="type",
        reply_to="tmp$1",
        correlation_id="c",
        content_type="text/plain",
        creation_time=1000,
        group_id="g",
        user_id=b"alice",
        properties={"colour": "red", "n": 5},
        annotations={"x-opt-jms-msg-type": Byte(3)},
    )
    assert (message.durable, message.priority, message.header.ttl) == (True, 7, 5000)
    assert message.message_id == "m-1" and message.properties.to == "q@r"
    assert message.properties.creation_time == 1000 and message.properties.user_id == b"alice"
    assert message.application_properties == {"colour": "red", "n": 5}
    assert message.message_annotations == {"x-opt-jms-msg-type": 3}
    assert message.body() == b"payload"
    assert message.expiry(arrival_ms=2000) == 7000
    assert message.queue_info(2000) == (True, 7, 7000, "m-1")
    message.validate()


def test_defaults_when_sections_are_absent():
    message = build("just a value")
    assert (message.durable, message.priority, message.message_id) == (False, 4, None)
    assert message.queue_info(0) == (False, 4, None, None)
    assert message.application_properties == {} and message.body() == "just a value"


def test_absolute_expiry_wins_over_ttl():
    message = build(b"", ttl=5000, absolute_expiry_time=99, creation_time=1)
    assert message.queue_info(1000) == (False, 4, 99, None)
    assert message.expiry(1000) == 99


@settings(max_examples=300, deadline=None)
@given(
    ttl=st.none() | st.integers(0, 2**32 - 1),
    absolute=st.none() | st.integers(0, 2**62),
    message_id=st.none() | st.text(max_size=5),
    group_id=st.none() | st.just("g"),
    annotations=st.dictionaries(st.sampled_from(["x-a", "x-b"]), st.integers(0, 9), max_size=2),
)
def test_expiry_by_the_short_path_is_what_queue_info_says(ttl, absolute, message_id, group_id, annotations):
    """After a patch, expiry() reads neither the header nor (short properties) the
    properties again; it must agree with queue_info, leave what the patch read for it, and
    so must a message made from it with a header taken over (``header_of``)."""
    plain = build(
        b"x", ttl=ttl, absolute_expiry_time=absolute, message_id=message_id, group_id=group_id, annotations=annotations
    )
    patched = AnnotationPatch({"x-opt-c": "c"}).apply(plain)
    expected = plain.queue_info(1000)
    assert patched.expiry(1000) == plain.expiry(1000) == expected[2]
    start, end = patched.annotations_span()  # (queue_info without peek uses up what the patch read)
    made = Message.with_annotations_at(bytes(patched.raw), start, end, header_of=patched)
    assert patched.queue_info(1000, check=True) == expected
    assert made.expiry(1000) == expected[2] and made.queue_info(1000, check=True) == expected


def test_priority_above_nine_counts_as_nine():
    assert build(b"", priority=200).queue_info(0)[1] == 9


def test_changed_copies_splice_sections_and_keep_the_rest():
    original = build(b"body", durable=True, message_id="m", properties={"a": 1})
    annotated = original.with_annotations({Symbol("x-opt-martinet-cid"): "client-1"})
    assert annotated.message_annotations == {"x-opt-martinet-cid": "client-1"}
    unchanged = original.raw[original.sections()[0x73][0] :]  # properties onwards
    assert annotated.raw.endswith(unchanged) and annotated.body() == b"body"
    assert annotated.durable and annotated.message_id == "m"
    redelivered = with_delivery_count(annotated, 3)
    assert redelivered.header.delivery_count == 3 and redelivered.durable
    assert redelivered.message_annotations == annotated.message_annotations
    assert with_delivery_count(build(b"x"), 1).header.delivery_count == 1  # header inserted


@pytest.mark.parametrize(
    "original",
    [
        build(b"body"),
        build("value", durable=True, priority=7, ttl=5000, message_id="m-1"),
        build(b"", ttl=10, absolute_expiry_time=99, creation_time=1, message_id=7, properties={"a": 1}),
        build(b"x", annotations={"x-opt-jms-msg-type": Byte(3)}),  # has message-annotations: merged
        Message(
            encode(Described(ULong(0x70), []))
            + encode(Described(ULong(0x71), {Symbol("d"): 1}))
            + encode(Described(ULong(0x73), ["id"]))
            + encode(Described(ULong(0x75), b"x"))
        ),
        Message(encode(Described(Symbol("amqp:header:list"), [True])) + encode(Described(ULong(0x75), b"x"))),
    ],
)
def test_an_annotation_patch_adds_annotations_and_what_it_read_on_the_way_matches_a_fresh_read(original):
    patch = AnnotationPatch({Symbol("x-opt-martinet-cid"): "client-1"})
    stamped = patch.apply(original)
    fresh = Message(stamped.raw)
    assert stamped.queue_info(1000) == fresh.queue_info(1000) == original.queue_info(1000)
    assert fresh.message_annotations == {**original.message_annotations, "x-opt-martinet-cid": "client-1"}
    assert fresh.body() == original.body()
    fresh.validate()
    original.check_sections()
    patch.apply(original).check_sections()  # starts after what the patch read
    fresh.check_sections()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x41", "expected a described section at offset 0"),
        (b"\x00\x53\x99\x45", "unknown section descriptor"),
        (encode(Described(ULong(0x73), [])) + encode(Described(ULong(0x70), [])), "section header out of order"),
        (b"\x00\x53\x70\xc0\x09", "malformed section"),
        (encode(Described(ULong(0x74), [1, 2])), "application-properties section must be a dict"),
    ],
)
def test_malformed_messages_are_refused(raw, message):
    with pytest.raises(MessageError, match=message):
        Message(raw).validate()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x41", "expected a described section at offset 0"),
        (b"\x00\x53\x99\x45", "unknown section descriptor 0x99 at offset 0"),
        (encode(Described(ULong(0x73), [])) + encode(Described(ULong(0x70), [])), "section header out of order"),
        (encode(Described(ULong(0x75), b"a")) + encode(Described(ULong(0x74), {})), "application-properties out of"),
        (b"\x00\x53\x70\xc0\x09", "malformed header section: it ends at offset 14, after the message's 5 bytes"),
        (b"\x00\x53\x75\xb0\x00\x00\x01\x00xx", "malformed data section at offset 0"),
        (encode(Described(ULong(0x74), [1, 2])), "must be a map .*found a list"),
        (encode(Described(ULong(0x74), {Symbol("k"): 1})), "key at offset 6 must be a string .*symbol"),
        (encode(Described(ULong(0x74), {"k": {"a": 1}})), "value of 'k' at offset 9 is a map"),
        (encode(Described(ULong(0x74), {"k": b"\x00"})) + b"\x00", "malformed section at offset 12"),
        (b"\x00\x53\x74\xc1\x05\x02\xa1\x01k\x56\x02", "entry at offset 6 \\(key 'k'\\): malformed: invalid boolean"),
        (b"\x00\x53\x74\xc1\x07\x02\xa1\x01k\xa1\x01\xff", "invalid UTF-8"),
        (b"\x00\x53\x74\xd1\x00\x00\x00\x04\x00\x00\x00\x04", "2 entries cannot fit in 0 bytes"),
        (encode(Described(Symbol("amqp:application-properties:map"), [1])), "must be a map"),
        # annotations maps of an odd count: stepped over, they passed, and the patch that
        # annotates a dead-lettered or routed message failed on them later (a router dropped
        # such a message with an ERROR instead of dead-lettering it)
        (b"\x00\x53\x72\xc1\x04\x01\xa3\x01k", "malformed message-annotations section at offset 0: .* odd count"),
        (b"\x00\x53\x71\xd1\x00\x00\x00\x07\x00\x00\x00\x01\xa3\x01k", "delivery-annotations .* odd count"),
        (b"\x00\xa3\x1camqp:message-annotations:map\xc1\x04\x01\xa3\x01k", "message-annotations .* odd count"),
    ],
)
def test_check_sections_refuses_what_consumers_could_not_read(raw, message):
    with pytest.raises(MessageError, match=message):
        Message(raw).check_sections()


SIMPLE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.uuids(),
)


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=10), SIMPLE_VALUES, max_size=6), st.integers(0, 200), st.binary(max_size=3))
def test_check_sections_passes_valid_messages_and_fails_only_cleanly_on_mutated_ones(properties, at, junk):
    message = build(b"body", durable=True, message_id="m", properties=properties)
    message.check_sections()
    patch = AnnotationPatch({Symbol("x-opt-martinet-cid"): "c"})
    patch.apply(message).check_sections()
    assert patch.apply(message).queue_info(0, check=True) == message.queue_info(0)
    raw = message.raw
    mutated = raw[: at % (len(raw) + 1)] + junk + raw[at % (len(raw) + 1) + len(junk) :]
    for check in (
        lambda: Message(mutated).check_sections(),
        lambda: Message(mutated).queue_info(0, check=True),
        lambda: patch.apply(Message(mutated)).queue_info(0, check=True),
    ):
        try:
            check()
        except MessageError:
            pass  # anything else escaping would crash a connection


def test_a_patch_refuses_an_annotations_map_of_an_odd_count():
    """Entries added to a map of an odd count would be keys and values shifted by one."""
    raw = b"\x00\x53\x72\xc1\x04\x01\xa3\x01k" + encode(Described(ULong(0x77), "body"))
    for key in (Symbol("k"), Symbol("x-opt-other")):  # one it holds, one it does not
        with pytest.raises(MessageError, match="the message-annotations map has an odd number of elements \\(1\\)"):
            AnnotationPatch({key: "v"}).apply(Message(raw))


@pytest.mark.parametrize("annotated", [False, True], ids=["no-annotations", "annotations"])
def test_a_patch_refuses_a_delivery_annotations_map_of_an_odd_count(annotated):
    """The patched message is checked only from its message-annotations on (queue_info), so
    the delivery-annotations the patch steps over are checked as it does."""
    odd = b"\x00\x53\x71\xc1\x04\x01\xa3\x01k"
    annotations = b"\x00\x53\x72\xc1\x01\x00" if annotated else b""
    raw = odd + annotations + encode(Described(ULong(0x77), "body"))
    with pytest.raises(MessageError, match="malformed delivery-annotations section: its map has an odd count"):
        AnnotationPatch({Symbol("x-opt-other"): "v"}).apply(Message(raw))
    with pytest.raises(MessageError, match="odd count"):  # as a full read refuses it
        Message(raw).queue_info(0, check=True)


def test_header_fields_of_the_wrong_type_are_refused():
    with pytest.raises(MessageError, match="header field 1 \\(priority\\) must be a number, found str"):
        Message(encode(Described(ULong(0x70), [True, "high"]))).queue_info(0)
    with pytest.raises(MessageError, match="absolute-expiry-time\\) must be a timestamp, found str"):
        Message(encode(Described(ULong(0x73), ["id"] + [None] * 7 + ["soon"]))).queue_info(0)


def test_symbolic_descriptors_are_understood():
    raw = encode(Described(Symbol("amqp:header:list"), [True, UByte(9)])) + encode(
        Described(Symbol("amqp:data:binary"), b"x")
    )
    message = Message(raw)
    assert message.queue_info(0) == (True, 9, None, None) and message.body() == b"x"
