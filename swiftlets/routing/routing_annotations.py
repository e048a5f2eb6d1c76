"""The routing annotations of a received message, read and counted on without decoding the rest.

Theory of operation
-------------------
Every router a message passes reads its source and destination router, queue, hop count,
doubt mark and expiry (``docs/routing-protocol.md`` §12) and writes the hop count plus one. Decoding the
whole message-annotations map and splicing a new one (:class:`~martinet.messaging.message.AnnotationPatch`)
cost more than the rest of a router's work for the message, so :func:`read` takes the
usual case on a short path: the message-annotations section is found by skipping the
sections before it (their descriptors in the usual ``0x00 0x53 code`` form), and each of
our keys is looked for, as its sym8 encoding (how our routers write it), at an element
boundary of that map only — the map's keys and values are skipped, not decoded, and a key
is compared only where a key starts. Only our values are decoded. :meth:`Routing.next_hop`
then rewrites the hop count's bytes in place (the map's size adjusted when its encoding
grows). Anything unusual (another section or key encoding, a map8 that would outgrow
itself) returns None, and the caller takes the general path; a malformed message raises.

The messages of a batch mostly carry the same message-annotations section byte for byte
(one producer's client id, the same source, destination, queue and hop count), so
:class:`HopCounter` remembers, per section seen, what :func:`read` found in it and the
section counted on: a message whose section it knows costs a skip over its header, a
dictionary lookup and one concatenation.
"""

from __future__ import annotations

from typing import Any

import attrs

from martinet.messaging.codec import DecodeError, Symbol, UInt, decode, encode, skip
from martinet.messaging.message import Message, MessageError

__all__ = ["DESTINATION", "DOUBT", "EXPIRES", "HOPS", "QUEUE", "SOURCE", "HopCounter", "Routing", "read", "span"]

SOURCE = Symbol("x-opt-martinet-src")
DESTINATION = Symbol("x-opt-martinet-dest")
QUEUE = Symbol("x-opt-martinet-queue")
HOPS = Symbol("x-opt-martinet-hops")
DOUBT = Symbol("x-opt-martinet-doubt")
EXPIRES = Symbol("x-opt-martinet-expires")

_MESSAGE_ANNOTATIONS = 0x72
FRONT_KEPT = 2048  # the largest front (sections up to the annotations' end) a HopCounter keeps
_DELIVERY_ANNOTATIONS = 0x71
_WANTED = {encode(key): key for key in (SOURCE, DESTINATION, QUEUE, HOPS, DOUBT, EXPIRES)}  # sym8 encoding → key


@attrs.frozen
class Routing:
    """The routing annotations of one message (None where absent) and where the hop count is."""

    raw: bytes
    source: Any
    destination: Any
    queue: Any
    hops: Any
    doubt: Any
    expires: Any
    map_at: int  # the map's constructor
    hops_at: int  # the hop count's value, start and end
    hops_end: int

    def next_hop(self) -> bytes | None:
        """The message's bytes with the hop count one higher; None if this short path cannot
        write it (no or no unsigned hop count, a map8 that would outgrow 255 bytes)."""
        if type(self.hops) is not int or not 0 <= self.hops < 0xFFFFFFFF:
            return None
        raw, at = self.raw, self.map_at
        value = encode(UInt(self.hops + 1))
        grows = len(value) - (self.hops_end - self.hops_at)
        if raw[at] == 0xC1:
            if raw[at + 1] + grows > 0xFF:
                return None
            head = bytes((0xC1, raw[at + 1] + grows))
            size_end = at + 2
        else:
            head = b"\xd1" + (int.from_bytes(raw[at + 1 : at + 5], "big") + grows).to_bytes(4, "big")
            size_end = at + 5
        return raw[:at] + head + raw[size_end : self.hops_at] + value + raw[self.hops_end :]


def _section_start(raw: bytes) -> int | None:
    """Where the message-annotations section of ``raw`` starts (descriptor ``0x00 0x53 0x72``),
    the sections before it skipped; None when it has none or they are unusually encoded.
    The queue checks only what follows the section this finds, so a delivery-annotations map
    stepped over here must hold pairs: one of an odd count (or not a map8/map32) gives None,
    and the general path reads and refuses it.

    Raises: DecodeError, IndexError (malformed)."""
    if type(raw) is not bytes:
        return None
    position, size = 0, len(raw)
    while True:  # header and delivery-annotations come first; skip them
        if position + 3 > size or raw[position] != 0x00 or raw[position + 1] != 0x53:
            return None
        code = raw[position + 2]
        if code == _MESSAGE_ANNOTATIONS:
            return position
        if code > _MESSAGE_ANNOTATIONS:
            return None
        if code == _DELIVERY_ANNOTATIONS:
            head = _map_header(raw, position + 3)
            if head is None or head[0] % 2:
                return None
        position = skip(raw, position + 3)


def _map_header(raw: bytes, at: int) -> tuple[int, int, int] | None:
    """``(count, first element, end)`` of the map8 or map32 at ``at``; None for another encoding.

    Raises: IndexError (malformed)."""
    if raw[at] == 0xC1:
        return raw[at + 2], at + 3, at + 2 + raw[at + 1]
    if raw[at] == 0xD1:
        return int.from_bytes(raw[at + 5 : at + 9], "big"), at + 9, at + 5 + int.from_bytes(raw[at + 1 : at + 5], "big")
    return None


def span(raw: bytes) -> tuple[int, int] | None:
    """``(start, end)`` of the message-annotations section of ``raw`` by the short path (a
    map8 or map32 after the usual descriptor); None when it does not apply.

    Raises:
        MessageError: the sections before it are malformed, or its map runs past the end.
    """
    try:
        start = _section_start(raw)
        if start is None:
            return None
        header = _map_header(raw, start + 3)
        if header is None:
            return None
        end = header[2]
    except (DecodeError, IndexError) as exc:
        raise MessageError(f"malformed message: {exc}") from None
    if end > len(raw):
        raise MessageError(f"malformed message-annotations: their map ends at {end}, after the message ({len(raw)})")
    return start, end


class HopCounter:
    """:func:`read` and :meth:`Routing.next_hop` of received messages, remembered per
    message-annotations section (the latest ``kept`` sections)."""

    def __init__(self, kept: int = 1024):
        self._kept = kept
        self._known: dict[bytes, tuple[Routing | None, bytes | None]] = {}
        # the last counted message's front (its bytes up to the end of its annotations), its
        # fields, and its front counted (a message of that alone, header read): a batch's
        # messages mostly share one front, and one that starts with the very same bytes reads
        # the same up to there, so it is spliced without a walk
        self._last: tuple[bytes, Routing | None, Message, int, int] | None = None

    def fields(self, raw: bytes) -> Routing | None:
        """The routing annotations of ``raw`` (None: the short path does not apply); their
        offsets are those of the section alone.

        Raises:
            MessageError: as :func:`read`.
        """
        where = span(raw)
        return None if where is None else self._section(raw[where[0] : where[1]])[0]

    def _section(self, section: bytes) -> tuple[Routing | None, bytes | None]:
        known = self._known.get(section)
        if known is None:
            if len(self._known) >= self._kept:
                self._known.clear()
            fields = read(section)  # (a message of that section alone)
            known = self._known[section] = fields, fields.next_hop() if fields is not None else None
        return known

    def count(self, raw: bytes) -> tuple[Routing | None, Message | None]:
        """``(fields, counted)``: the routing annotations of ``raw`` (None: the short path
        does not apply) and the message with the hop count one higher (None: not by the
        short path). The fields' offsets are those of the section alone, not of ``raw``.
        The counted message knows where its annotations are, so the queue it enters checks
        only the sections after them (those before were walked here).

        Raises:
            MessageError: as :func:`read`.
        """
        last = self._last
        if last is not None and type(raw) is bytes and raw.startswith(last[0]):
            front, fields, before, start, end = last
            return fields, Message.with_annotations_at(before.raw + raw[len(front) :], start, end, header_of=before)
        where = span(raw)
        if where is None:
            return None, None
        start, end = where
        fields, counted = self._section(raw[start:end])
        if counted is None:
            return fields, None
        front = raw[:start] + counted
        if end <= FRONT_KEPT:
            before = Message.with_annotations_at(front, start, len(front))
            if before.annotations_span() is not None:  # (its header read: see with_annotations_at)
                self._last = raw[:end], fields, before, start, len(front)
        return fields, Message.with_annotations_at(front + raw[end:], start, len(front))


def read(raw: bytes) -> Routing | None:
    """The routing annotations of the message ``raw`` by the short path; None when it does
    not apply (the caller decodes the message instead).

    Raises:
        MessageError: the sections before the message-annotations, or its map, are malformed.
    """
    try:
        position = _section_start(raw)
        if position is None:
            return None
        at = position + 3
        header = _map_header(raw, at)
        if header is None:
            return None
        count, position, end = header
        if count % 2:
            raise MessageError(f"malformed message-annotations: their map has an odd number of elements ({count})")
        found: dict[Symbol, Any] = {}
        hops_at = hops_end = 0
        for _ in range(count // 2):
            key_end = skip(raw, position)
            value_end = skip(raw, key_end)
            key = _WANTED.get(raw[position:key_end]) if raw[position] == 0xA3 else None
            if key is not None:
                found[key] = decode(raw, key_end)[0]
                if key is HOPS:
                    hops_at, hops_end = key_end, value_end
            position = value_end
    except (DecodeError, IndexError) as exc:
        raise MessageError(f"malformed message-annotations: {exc}") from None
    if position != end:  # (the queue it enters checks only the sections after this map)
        raise MessageError(f"malformed message-annotations: their entries end at {position}, their map at {end}")
    return Routing(
        raw,
        found.get(SOURCE),
        found.get(DESTINATION),
        found.get(QUEUE),
        found.get(HOPS),
        found.get(DOUBT),
        found.get(EXPIRES),
        at,
        hops_at,
        hops_end,
    )
