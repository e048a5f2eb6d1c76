"""The short path for routing annotations (swiftlets/routing/routing_annotations.py) against the
general one: for any message our rewrite annotated, it reads what a full decode reads and
writes, byte for byte, what AnnotationPatch writes; anything else it declines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from martinet.messaging.codec import Symbol, UInt
from martinet.messaging.message import AnnotationPatch, Message, MessageError, build
from martinet.swiftlets.routing.rewrite import routing_rewrite
from martinet.swiftlets.routing.routing_annotations import (
    DESTINATION,
    DOUBT,
    HOPS,
    QUEUE,
    SOURCE,
    HopCounter,
    read,
    span,
)

NOW = 1_800_000_000_000  # a message's arrival, ms since the epoch (what its ttl counts from)
names = st.text(st.characters(codec="utf-8", categories=("L", "N")), min_size=1, max_size=300)
others = st.dictionaries(
    st.sampled_from(["x-opt-jms-msg-type", "x-opt-a", "x-opt-martinet-cid", "x-opt-long"]),
    st.one_of(st.integers(0, 2**31), names, st.booleans()),
    max_size=4,
)


def general(raw: bytes) -> tuple:
    annotations = Message(raw).message_annotations
    return (
        annotations.get(SOURCE),
        annotations.get(DESTINATION),
        annotations.get(QUEUE),
        annotations.get(HOPS),
        annotations.get(DOUBT),
    )


@given(
    others=others,
    queue=names,
    router=names,
    durable=st.booleans(),
    hops=st.integers(0, 70),
    doubt=st.booleans(),
    body=st.binary(max_size=300),
)
def test_the_short_path_reads_and_counts_as_the_general_one(others, queue, router, durable, hops, doubt, body):
    message = build(body, durable=durable, message_id="id-1")
    if others:
        message = AnnotationPatch({Symbol(k): v for k, v in others.items()}).apply(message)
    message = routing_rewrite("source")(f"{queue}@{router}", message, NOW)
    extra = {HOPS: UInt(hops)} | ({DOUBT: True} if doubt else {})
    raw = AnnotationPatch(extra).apply(message).raw
    forward = routing_rewrite("middle")
    assert forward(f"{queue}@{router}", Message(raw), NOW).raw == raw  # travelling there already: forwarded as it is
    elsewhere = forward(f"x{queue}@{router}", Message(raw), NOW).raw  # (a queue bridge) a new journey
    assert general(elsewhere)[:4] == ("middle", router, f"x{queue}", 0)
    fields = read(raw)
    assert fields is not None
    assert (fields.source, fields.destination, fields.queue, fields.hops, fields.doubt) == general(raw)
    counted = fields.next_hop()
    if counted is not None:  # (None: a map8 that would outgrow itself; the general path then)
        assert counted == AnnotationPatch({HOPS: UInt(hops + 1)}).apply(Message(raw)).raw
        assert general(counted)[3] == hops + 1
    counter = HopCounter(kept=1)
    for _ in range(2):  # read, then remembered
        remembered, again = counter.count(raw)
        assert remembered is not None and _raw(again) == counted
        assert (
            remembered.source,
            remembered.destination,
            remembered.queue,
            remembered.hops,
            remembered.doubt,
        ) == general(raw)
        assert counter.fields(raw) == remembered
    other = AnnotationPatch({HOPS: UInt(hops + 1)}).apply(Message(raw)).raw  # another section: the one kept goes
    assert counter.count(other)[0].hops == hops + 1 and _raw(counter.count(raw)[1]) == counted


def _raw(message: Message | None) -> bytes | None:
    return None if message is None else message.raw


@given(
    properties=st.dictionaries(st.text(max_size=10), st.one_of(st.integers(0, 99), st.text(max_size=8)), max_size=4),
    durable=st.booleans(),
    ttl=st.one_of(st.none(), st.integers(1, 10**6)),
    at=st.integers(0, 400),
    junk=st.binary(min_size=1, max_size=3),
)
def test_a_counted_message_is_checked_by_its_queue_as_one_read_from_the_start(properties, durable, ttl, at, junk):
    """The counted message knows where its annotations are, so its queue checks only what
    follows them: that shortcut must accept and refuse exactly what a full read does, for
    a routed message with any bytes changed (a hostile or broken peer)."""
    message = build(b"body" * 5, durable=durable, ttl=ttl, message_id="m-1", properties=properties)
    raw = routing_rewrite("a")("q@b", message, NOW).raw
    at %= len(raw)
    mutated = raw[:at] + junk + raw[at + len(junk) :]
    for candidate in (raw, mutated):
        try:
            _, counted = HopCounter().count(candidate)
        except MessageError:
            continue
        if counted is None:
            continue
        try:
            expected = Message(counted.raw).queue_info(1000, check=True)
        except MessageError:
            with pytest.raises(MessageError):
                counted.queue_info(1000, check=True)
        else:
            assert counted.queue_info(1000, check=True) == expected


def _counted(counter: HopCounter, raw: bytes) -> object:
    """What ``counter`` makes of ``raw``, and what the queue it enters reads of that."""
    try:
        fields, counted = counter.count(raw)
    except MessageError as exc:
        return "refused", str(exc)
    if counted is None:
        return fields, None
    try:
        info: object = counted.queue_info(1000, check=True)
    except MessageError as exc:
        info = "refused", str(exc)
    return fields, counted.raw, counted.annotations_span(), info


@given(
    fronts=st.lists(
        st.tuples(st.booleans(), st.one_of(st.none(), st.integers(1, 10**6)), names), min_size=1, max_size=3
    ),
    messages=st.lists(
        st.tuples(st.integers(0, 2), st.binary(max_size=40), st.integers(0, 400), st.binary(max_size=3)),
        min_size=1,
        max_size=8,
    ),
)
def test_a_counter_that_kept_the_last_front_counts_as_a_fresh_one(fronts, messages):
    """A counter splices a message that starts with the front (the bytes up to the end of
    the annotations) of the one it counted before, without reading it: for messages of a
    few fronts in any order, some with bytes changed anywhere, it makes what a fresh
    counter makes of each, and the queue reads that alike."""
    counter = HopCounter()
    for index, body, at, junk in messages:
        durable, ttl, queue = fronts[index % len(fronts)]
        raw = routing_rewrite("a")(f"{queue}@b", build(body, durable=durable, ttl=ttl, message_id="m"), NOW).raw
        at %= len(raw)
        raw = raw[:at] + junk + raw[at + len(junk) :]
        assert _counted(counter, raw) == _counted(HopCounter(), raw)


def test_it_declines_what_it_does_not_know_and_refuses_what_is_broken():
    plain = build(b"body", durable=True)
    fields = read(plain.raw)  # no message-annotations at all
    assert fields is None
    no_hops = AnnotationPatch({DESTINATION: "b", QUEUE: "q"}).apply(plain)
    fields = read(no_hops.raw)
    assert fields is not None and fields.hops is None and fields.next_hop() is None
    assert read(bytearray(no_hops.raw)) is None  # bytes only
    cut = no_hops.raw[: len(no_hops.raw) - len(b"body") - 12]  # inside the map
    with pytest.raises(MessageError, match="malformed message-annotations"):
        read(cut)
    with pytest.raises(MessageError, match="malformed message-annotations: their map ends at"):
        HopCounter().count(cut)
    assert HopCounter().count(plain.raw) == (None, None)
    # a map of an odd count, or one whose entries end before the map does: the queue a
    # counted message enters checks only what follows the map, so it is refused here
    at = span(no_hops.raw)[0] + 3
    for change, reason in ((-1, "odd number of elements \\(3\\)"), (-2, "their entries end at")):
        broken = bytearray(no_hops.raw)
        broken[at + 2] += change
        with pytest.raises(MessageError, match=f"malformed message-annotations: .*{reason}"):
            read(bytes(broken))
        with pytest.raises(MessageError, match=f"malformed message-annotations: .*{reason}"):
            HopCounter().count(bytes(broken))


@given(
    others=others,
    queue=names,
    durable=st.booleans(),
    expiry=st.one_of(st.none(), st.integers(10**12, 2 * 10**12)),
    body=st.binary(max_size=50),
)
def test_a_rewrite_kept_for_a_section_writes_what_the_first_one_wrote(others, queue, durable, expiry, body):
    """The rewrite keeps what it made of each annotations section: the same producer's next
    message (another body, the same annotations) is only spliced; the bytes are those a
    rewrite from scratch writes, the expiry annotation and the front it hands on included."""
    patch = AnnotationPatch({Symbol(k): v for k, v in others.items()}) if others else AnnotationPatch({"x-cid": "c"})
    rewrite = routing_rewrite("source")

    def entering(text: bytes) -> Message:  # as a listener hands it on: its client id patched in
        return patch.apply(build(text, durable=durable, message_id="id", absolute_expiry_time=expiry))

    rewrite(f"{queue}@r", entering(b"first"), NOW)
    kept = rewrite(f"{queue}@r", entering(body), NOW)
    span = kept.annotations_span()  # (a full read, as queue_info's check below, forgets it)
    assert span is not None
    fresh = routing_rewrite("source")(f"{queue}@r", entering(body), NOW)
    assert kept.raw == fresh.raw
    assert kept.queue_info(1000, check=True) == Message(fresh.raw).queue_info(1000, check=True)
    forwarded = rewrite(f"{queue}@r", Message(kept.raw), NOW)  # travelling there already: as it is
    assert rewrite(f"{queue}@r", Message(kept.raw), NOW).raw == forwarded.raw == kept.raw
    # and as a forwarding router's hop counter hands it on (its annotations found): the very
    # message, the first time and when the rewrite kept what it made of the section
    for _ in range(2):
        travelling = Message.with_annotations_at(kept.raw, *span)
        assert rewrite(f"{queue}@r", travelling, NOW) is travelling


sender_annotations = st.dictionaries(
    st.sampled_from(["x-opt-jms-client-id", "x-opt-a", SOURCE, "x-opt-martinet-expires"]),
    st.one_of(names, st.integers(0, 2**31)),
    min_size=1,
    max_size=2,
)


@given(
    already=others,
    routed=st.booleans(),
    sender=sender_annotations,
    queue=names,
    durable=st.booleans(),
    ttl=st.one_of(st.none(), st.integers(1, 10**6)),
    body=st.one_of(st.binary(max_size=50), st.just(SOURCE.encode())),
    again=st.booleans(),
)
def test_the_senders_annotations_merged_with_the_routing_ones_make_the_bytes_of_one_after_the_other(
    already, routed, sender, queue, durable, ttl, body, again
):
    """A listener hands the rewrite its client id still to merge in: the message it makes is
    the one a rewrite of the message with the client id merged in first makes, byte for byte,
    whatever the message carried already (other annotations, routing ones of a journey to
    elsewhere, the annotations' text in its body) and whatever the sender's name."""
    patch = AnnotationPatch(sender)
    message = build(body, durable=durable, ttl=ttl, message_id="id")
    if already:
        message = AnnotationPatch({Symbol(k): v for k, v in already.items()}).apply(message)
    if routed:
        message = routing_rewrite("elsewhere")("q@other", message, NOW)
    raw = message.raw
    rewrite = routing_rewrite("source")
    if again:  # (what the rewrite kept of the first, for this address and these annotations)
        rewrite(f"{queue}@r", Message(raw), NOW, patch)
    both = rewrite(f"{queue}@r", Message(raw), NOW, patch)
    one_then_other = routing_rewrite("source")(f"{queue}@r", patch.apply(Message(raw)), NOW)
    assert both.raw == one_then_other.raw
    assert both.queue_info(NOW, check=True) == Message(one_then_other.raw).queue_info(NOW, check=True)
    annotations = Message(both.raw).message_annotations
    assert (annotations[SOURCE], annotations[DESTINATION], annotations[QUEUE]) == ("source", "r", queue)
    for key, value in sender.items():
        if key not in (SOURCE, "x-opt-martinet-expires"):
            assert annotations[key] == value
