"""Messages as their AMQP 1.0 encoded bytes, with the metadata the broker needs, decoded lazily.

Theory of operation
-------------------
A :class:`Message` holds the bytes a client sent (AMQP 1.0 part 3, §3.2: header,
delivery-annotations, message-annotations, properties, application-properties, body,
footer — each section a described value). The broker stores and forwards those bytes and
never re-encodes a message it only moves.

What the broker needs to know — durable, priority, ttl, message-id, expiry, the
properties and application-properties a selector reads, the annotations routing reads —
is decoded on first use and cached on the object, one section at a time: finding the
sections only *skips* over values (:func:`messaging.codec.skip`), so a section nobody
asks for (usually the body) is never decoded.

:func:`build` encodes a new message from Python values (tests, benchmarks, the client
library). Changed copies never decode and re-encode what a client sent, since decoding
loses AMQP types (a byte, a ubyte and a long all become ``int``, a float becomes a double)
and Qpid JMS, for one, relies on them (``x-opt-jms-msg-type`` must stay a byte):

- :meth:`Message.with_annotations` (or a reusable :class:`AnnotationPatch`) *splices*: a
  message without message-annotations gets a new section in front of its unchanged
  remainder; one with them gets the new entries appended to the encoded map (an entry
  whose key is already there replaced in place), only the map's size and count rewritten —
  every other entry keeps its bytes. Patching a message that has no message-annotations
  yet also reads its header on the way, which the queue manager's
  :meth:`Message.queue_info` then uses once.
- :meth:`Message.redelivered` and :meth:`Message.with_delivery_count` rewrite only the
  header's ``first-acquirer`` and ``delivery-count`` elements; the other header fields
  keep their bytes.

Errors: anything unreadable raises :class:`MessageError` (a ``ValueError``), as do
annotation values that have no AMQP encoding; nothing else escapes these methods.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping
from typing import Any

from .codec import (
    _FIXED_WIDTH,
    Array,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    decode,
    encode,
    skip,
)

__all__ = [
    "Message",
    "MessageError",
    "MessageFieldError",
    "Header",
    "Properties",
    "AnnotationPatch",
    "build",
    "redelivered",
    "with_delivery_count",
    "with_ttl",
    "SECTIONS",
    "head_length",
]

# Section descriptor codes (part 3, §3.2).
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
SECTIONS = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
_BODY = (DATA, AMQP_SEQUENCE, AMQP_VALUE)


class MessageError(ValueError):
    """The bytes are not a valid AMQP 1.0 message; ``condition`` is the AMQP error that
    refuses it."""

    condition = "amqp:decode-error"


class MessageFieldError(MessageError):
    """The message decodes, but a header or properties field the broker computes with has
    the wrong type or range."""

    condition = "amqp:invalid-field"


class Header:
    """The header section (part 3, §3.2.1), with the spec's defaults for absent fields."""

    __slots__ = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")

    def __init__(self, fields: list[Any] = ()):  # type: ignore[assignment]
        """Raises: MessageError: priority, ttl or delivery-count is not an unsigned number
        of its width (ubyte, uint, uint) — the broker computes with them."""
        fields = list(fields) + [None] * (5 - len(fields))
        for index, (name, kind) in enumerate(_HEADER_TYPES):
            value = fields[index]
            if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise MessageFieldError(
                    f"header field {index} ({name}) must be a "
                    f"{'boolean' if kind is bool else 'number'}"
                    f", found {type(value).__name__} {value!r:.40}"
                )
        self.durable = bool(fields[0])
        self.priority = 4 if fields[1] is None else _unsigned(fields[1], 0xFF, "priority")
        self.ttl = None if fields[2] is None else _unsigned(fields[2], 0xFFFFFFFF, "ttl")
        self.first_acquirer = bool(fields[3])
        self.delivery_count = _unsigned(fields[4], 0xFFFFFFFF, "delivery-count") if fields[4] else 0


_HEADER_TYPES = (("durable", bool), ("priority", int), ("ttl", int), ("first-acquirer", bool), ("delivery-count", int))


class Properties:
    """The properties section (part 3, §3.2.4); absent fields are ``None``."""

    __slots__ = (
        "message_id",
        "user_id",
        "to",
        "subject",
        "reply_to",
        "correlation_id",
        "content_type",
        "content_encoding",
        "absolute_expiry_time",
        "creation_time",
        "group_id",
        "group_sequence",
        "reply_to_group_id",
    )
    # Set from the decoded list in __init__; only the fields the broker computes with are
    # checked there, the others hold whatever the peer sent.
    message_id: Any
    user_id: Any
    to: Any
    subject: Any
    reply_to: Any
    correlation_id: Any
    content_type: Any
    content_encoding: Any
    absolute_expiry_time: int | None
    creation_time: int | None
    group_id: Any
    group_sequence: int | None
    reply_to_group_id: Any

    def __init__(self, fields: list[Any] = ()):  # type: ignore[assignment]
        """Raises: MessageError: absolute-expiry-time or creation-time is not a timestamp
        (an integer), or group-sequence not an integer — the broker computes with them."""
        fields = list(fields) + [None] * (13 - len(fields))
        for name, value in zip(self.__slots__, fields, strict=False):
            setattr(self, name, value)
        for index in (8, 9, 11):  # absolute-expiry-time, creation-time, group-sequence
            if fields[index] is not None and (not isinstance(fields[index], int) or isinstance(fields[index], bool)):
                raise MessageFieldError(
                    f"properties field {self.__slots__[index]} is not a number: {fields[index]!r}"[:200]
                )


def _unsigned(value: Any, largest: int, name: str) -> int:
    """``value`` if it is an integer in 0..largest (any AMQP integer encoding), else MessageError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= largest:
        raise MessageFieldError(f"header field {name} is not an unsigned number up to {largest}: {value!r}"[:200])
    return value


# What a message-id may be [3.2.11]; integers of any encoding pass (clients write ulongs
# as they like), so does a symbol (a string).
_MESSAGE_ID_TYPES = (int, str, bytes, uuid.UUID)

_NO_HEADER = Header()
_NO_PROPERTIES = Properties()


class Message:
    """An AMQP 1.0 message: its encoded bytes plus lazily decoded metadata.

    Construction only checks nothing; the first metadata access finds the sections and may
    raise :class:`MessageError` for malformed bytes (the JMS layer validates each incoming
    message once with :meth:`validate`).
    """

    __slots__ = ("raw", "_header", "_properties", "_application", "_annotations", "_front")

    def __init__(self, raw: bytes):
        self.raw = raw
        self._header: Header | None = None
        self._properties: Properties | None = None
        self._application: dict[str, Any] | None = None
        self._annotations: dict[Any, Any] | None = None
        # What an AnnotationPatch read on its way in, for queue_info() to use once:
        # ((durable, priority, ttl), where the properties section may start, where the
        # message-annotations section starts: -1 unless its descriptor is 0x00 0x53 0x72),
        # and for the next patch (which then finds the annotations without a scan).
        self._front: tuple[tuple[bool, int, int | None], int, int] | None = None

    def __len__(self) -> int:
        return len(self.raw)

    def __repr__(self) -> str:
        return f"<Message {len(self.raw)} bytes>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]

    # -- sections -----------------------------------------------------------------------

    def sections(self) -> dict[int, tuple[int, int, int]]:
        """``{descriptor code: (start, value start, end)}`` of every section, found by
        skipping values.

        Not cached: a queued message should cost its bytes and little more.

        Raises:
            MessageError: not a sequence of AMQP message sections.
        """
        return _find_sections(self.raw)

    def check_sections(self) -> None:
        """Check, cheaply, what the broker relies on in a message it takes in, before it is
        queued: every section is framed right (its size within the bytes, the last one
        ending where the bytes end), known and in order, and the application-properties
        are a map with string keys and simple values (part 3, §3.2.5: "The keys of this map
        are restricted to be of type string ... and the values are restricted to be of
        simple types only, that is, excluding map, list, and array types"), keys and string
        values valid UTF-8, and the header decodes in full with fields of their types. A
        selector reads that map and the header, and a redelivery decodes the header and
        splices a new one into the framing, so a message that fails here would fail later,
        at a consumer.

        Values are stepped over, not decoded, except the application-properties' strings
        and the header's unusual encodings. The properties are left to :meth:`queue_info`
        (which reads what the queue needs) and to selectors (which skip a message they
        cannot read). The queue manager runs this check inside ``queue_info(check=True)``,
        in the same pass; alone, call it before ``queue_info``, since it starts after the
        sections an :class:`AnnotationPatch` read on the way in.

        Raises:
            MessageError: what is wrong, naming the section and the byte offset.
        """
        raw, front = self.raw, self._front
        if front is not None:  # header and annotations were read by the patch: start after them
            _check_sections(raw, front[1], MESSAGE_ANNOTATIONS)
        else:
            _check_sections(raw, 0, HEADER - 1)
        if self._header is None and not (raw[:3] == _HEADER_PREFIX and _header_fields(raw) is not None):
            self.header  # noqa: B018 - decoded and type-checked: raises for what is wrong

    def validate(self) -> None:
        """Check the bytes once: sections in order, no unknown section, metadata decodable.

        Raises:
            MessageError: with what is wrong.
        """
        self.sections()
        self.header, self.properties, self.application_properties, self.message_annotations  # noqa: B018

    def _section_value(self, code: int) -> Any:
        span = _find_section(self.raw, code)
        if span is None:
            return None
        try:
            return decode(self.raw, span[1])[0]
        except DecodeError as exc:
            raise MessageError(f"bad {_name(code)} section: {exc}") from None

    @property
    def header(self) -> Header:
        if self._header is None:
            fields = self._section_value(HEADER)
            self._header = _NO_HEADER if fields is None else Header(_expect(fields, list, HEADER))
        return self._header

    @property
    def properties(self) -> Properties:
        if self._properties is None:
            fields = self._section_value(PROPERTIES)
            self._properties = _NO_PROPERTIES if fields is None else Properties(_expect(fields, list, PROPERTIES))
        return self._properties

    @property
    def application_properties(self) -> dict[str, Any]:
        if self._application is None:
            self._application = _expect(self._section_value(APPLICATION_PROPERTIES) or {}, dict, APPLICATION_PROPERTIES)
        return self._application

    @property
    def message_annotations(self) -> dict[Any, Any]:
        if self._annotations is None:
            self._annotations = _expect(self._section_value(MESSAGE_ANNOTATIONS) or {}, dict, MESSAGE_ANNOTATIONS)
        return self._annotations

    def body(self) -> Any:
        """The decoded body: bytes for one data section, a list of sections otherwise.

        Raises:
            MessageError: malformed sections.
        """
        values = []
        for code in _BODY:
            span = self.sections().get(code)
            if span is not None:
                position = span[0]
                while position < span[2]:
                    try:
                        value, position = decode(self.raw, position)
                    except DecodeError as exc:
                        raise MessageError(f"bad body section: {exc}") from None
                    values.append(value.value)
        return values[0] if len(values) == 1 else values

    # -- what the broker reads ----------------------------------------------------------

    @property
    def durable(self) -> bool:
        return self.header.durable

    @property
    def priority(self) -> int:
        """0–9 (values above 9 count as 9, as JMS has ten levels)."""
        return min(self.header.priority, 9)

    @property
    def message_id(self) -> Any:
        return self.properties.message_id

    def queue_info(
        self, arrival_ms: int, *, check: bool = False, peek: bool = False
    ) -> tuple[bool, int, int | None, Any]:
        """``(durable, priority 0-9, absolute expiry or None, message-id)`` without caching.

        The queue manager's per-message path, one pass: the header is read where it always
        is (first); the properties are walked once, decoding the message-id (field 1) and,
        when their count shows it may be there, ``absolute-expiry-time`` (field 9), and only
        skipping over the fields between. With ``check`` the same pass does
        :meth:`check_sections` too, going on from where the properties end (what the queue
        manager does with a message it takes in). What a patch read on the way in is used
        once; with ``peek`` it is left for the next call (a rewrite that reads the expiry
        before the queue manager takes the message in).

        Raises:
            MessageError: malformed header or properties (with ``check``: anything
                :meth:`check_sections` refuses).
        """
        raw = self.raw
        header, front = self._header, self._front
        if check and front is None:  # (the header is checked where it is read: _header_fields, else decoded)
            _check_sections(raw, 0, HEADER - 1)
        if front is not None:  # patched on the way in: the header is read already
            if not peek:
                self._front = None
            durable, priority, ttl = front[0]
        elif header is not None:
            durable, priority, ttl = header.durable, header.priority, header.ttl
        elif raw[:3] == _HEADER_PREFIX:
            durable, priority, ttl = _header_fields(raw) or self.header_fields()
        elif raw[:2] == b"\x00\x53":  # another section comes first: no header
            durable, priority, ttl = False, 4, None
        else:  # a descriptor in an unusual encoding
            durable, priority, ttl = self.header_fields()
        if self._properties is not None:
            message_id, absolute = self._properties.message_id, self._properties.absolute_expiry_time
            if check and front is not None:
                _check_sections(raw, front[1], MESSAGE_ANNOTATIONS)
        else:
            message_id = absolute = None
            if front is None:
                span = _find_section(raw, PROPERTIES)
                value_at = None if span is None else span[1]
                count = 0 if value_at is None else _list_count(raw, value_at)
            else:  # the patch knows where a properties section would start
                at = front[1]
                value_at = at + 3 if raw[at : at + 3] == _PROPERTIES_PREFIX else None
                if check:  # the rest of the message, from the properties on (and their count)
                    count = _check_rest(raw, at, value_at)
                else:
                    count = 0 if value_at is None else _list_count(raw, value_at)
            if value_at is not None and count:
                message_id, absolute = _id_and_expiry(raw, value_at, count)
        if message_id is not None and (type(message_id) is bool or not isinstance(message_id, _MESSAGE_ID_TYPES)):
            raise MessageFieldError(
                f"properties field 0 (message-id) must be a ulong, uuid, binary or string, "
                f"found {type(message_id).__name__} {message_id!r:.40}"
            )
        if absolute:  # (a timestamp: checked where it was read, here or by Properties)
            expiry: int | None = int(absolute)
        elif ttl:
            expiry = arrival_ms + ttl
        else:
            expiry = None
        return durable, min(priority, 9), expiry, message_id

    def annotations_span(self) -> tuple[int, int] | None:
        """``(start, end)`` of the message-annotations section when a patch or the caller of
        :meth:`with_annotations_at` placed it (no scan); None when that is not known."""
        front = self._front
        return None if front is None or front[2] < 0 else (front[2], front[1])

    def with_annotations_section(self, section: bytes) -> Message:
        """A copy whose message-annotations section is ``section`` (encoded, with the usual
        descriptor ``0x00 0x53 0x72``), every other byte unchanged. Only for a message
        whose section a patch placed (:meth:`annotations_span` is not None): its header and
        spans carry over, so nothing is read.

        Raises:
            ValueError: the section's place in this message is not known."""
        front, raw = self._front, self.raw
        if front is None or front[2] < 0 or type(raw) is not bytes:
            raise ValueError("the message-annotations section of this message was not placed by a patch")
        header_fields, end, start = front
        copy = Message(raw[:start] + section + raw[end:])
        copy._front = header_fields, start + len(section), start
        return copy

    def expiry(self, arrival_ms: int) -> int | None:
        """Absolute expiry in ms since the epoch (None: none): ``absolute-expiry-time``, else
        ``arrival_ms`` + ttl, as :meth:`queue_info` gives it; what a patch read is left for
        queue_info (a rewrite asks for this before the queue manager takes the message in).
        When a patch placed the annotations it takes no decoding: the header's ttl is known,
        and properties of fewer than 9 fields have no absolute-expiry-time.

        Raises:
            MessageError: as :meth:`queue_info` (only when it has to read the properties).
        """
        front = self._front
        if front is not None and self._properties is None:
            raw, at = self.raw, front[1]
            if raw[at : at + 3] != _PROPERTIES_PREFIX or _list_count(raw, at + 3) < 9:
                ttl = front[0][2]
                return arrival_ms + ttl if ttl else None
        return self.queue_info(arrival_ms, peek=True)[2]

    @classmethod
    def with_annotations_at(
        cls,
        raw: bytes,
        start: int,
        end: int,
        *,
        usual: bool = True,
        header_of: Message | None = None,
    ) -> Message:
        """The message ``raw`` whose message-annotations section is ``raw[start:end]``, as
        its caller knows from having just walked (``skip``) or written the sections up to
        there; ``usual``: the section's descriptor is ``0x00 0x53 0x72``. Its header is read
        now, so that :meth:`queue_info` checks only what follows the annotations, as it does
        after an :class:`AnnotationPatch` (a routed message arrives with its annotations
        found and its hop count written). A header in an unusual encoding leaves the message
        as plain ``Message(raw)``: queue_info() then reads it all. ``header_of``: the message
        ``raw`` was made from, with the same header bytes: the header a patch read on its way
        in is not read again."""
        message = cls(raw)
        known = None if header_of is None else header_of._front
        header_fields = None if known is None else known[0]
        if header_fields is None:
            if raw[:3] == _HEADER_PREFIX:
                header_fields = _header_fields(raw)
            elif start == 0 or raw[:3] == _DELIVERY_ANNOTATIONS_PREFIX:  # no header
                header_fields = _DEFAULT_HEADER_FIELDS
        if header_fields is not None:  # what queue_info() would look for, as on the fast path
            message._front = header_fields, end, start if usual else -1
        return message

    def header_fields(self) -> tuple[bool, int, int | None]:
        header = self.header
        return header.durable, header.priority, header.ttl

    # -- changed copies -----------------------------------------------------------------

    def with_annotations(self, changes: Mapping[Any, Any]) -> Message:
        """A copy whose message-annotations have ``changes`` merged in, spliced as
        :class:`AnnotationPatch` does (every other byte unchanged).

        Raises:
            MessageError: malformed message-annotations, or a change without an AMQP encoding.
        """
        return AnnotationPatch(changes).apply(self)


def _id_and_expiry(raw: bytes, value_at: int, count: int) -> tuple[Any, int | None]:
    """``(message-id, absolute-expiry-time)`` of the properties list whose value starts at
    ``value_at`` and holds ``count`` (> 0) fields: field 0 decoded, fields 1-7 (mostly null)
    stepped over, field 8 decoded when there is one; nothing else is read.

    Raises:
        MessageError: malformed fields, or an absolute-expiry-time that is not a timestamp.
    """
    absolute = None
    try:
        position = value_at + (3 if raw[value_at] == 0xC0 else 9)
        message_id, position = decode(raw, position)
        if count > 8:
            for _ in range(7):
                if raw[position] == 0x40:
                    position += 1
                else:
                    position = skip(raw, position)
            absolute = decode(raw, position)[0]
    except DecodeError as exc:
        raise MessageError(f"malformed properties: {exc}") from None
    except IndexError:
        raise MessageError(
            f"malformed properties at offset {value_at}: its fields run past the end of the message"
        ) from None
    if absolute is not None and (not isinstance(absolute, int) or isinstance(absolute, bool)):
        raise MessageFieldError(
            f"properties field 8 (absolute-expiry-time) must be a timestamp, "
            f"found {type(absolute).__name__} {absolute!r:.40}"
        )
    return message_id, absolute


def _with_section(message: Message, code: int, section: bytes) -> Message:
    """A copy of ``message`` whose section ``code`` is ``section``: in place of the one it
    has, else before the first section that must follow it."""
    raw = message.raw
    offsets = _find_sections(raw)
    span = offsets.get(code)
    if span is not None:
        return Message(raw[: span[0]] + section + raw[span[2] :])
    later = [start for other, (start, _, _) in offsets.items() if other > code]
    at = min(later) if later else len(raw)
    return Message(raw[:at] + section + raw[at:])


# -- changed copies of the header: a redelivery, a forwarded ttl -----------------------------------


def redelivered(message: Message, failures: int) -> Message:
    """``message`` as it goes out again after an earlier acquisition: [3.2.1] its
    header's ``delivery-count`` is the count the producer sent plus ``failures`` (the
    failed delivery attempts since; capped at 2**32-1), and ``first-acquirer`` is false
    ("this message MAY have previously been acquired by another link"). Only those two
    header elements are rewritten; a message without a header gets one only when
    ``failures`` is non-zero (an absent header already means count 0, not first
    acquirer). Returns ``message`` itself when nothing changes.

    Raises:
        MessageError: the header is malformed.
    """
    raw = message.raw
    span = _find_section(raw, HEADER)
    if span is None:
        if not failures:
            return message
        return Message(_list_section(_HEADER_PREFIX, [_NULL, _NULL, _NULL, _FALSE, _uint(failures)], False) + raw)
    elements = _list_elements(raw, span[1], span[2], HEADER)
    first_acquirer = raw[elements[3][0] : elements[3][1]] if len(elements) > 3 else _NULL
    if not failures and first_acquirer in _NOT_FIRST_ACQUIRER:
        return message
    sent = _count_value(raw, elements[4]) if len(elements) > 4 else 0
    return _with_header(
        message, span, elements, first_acquirer=_FALSE, delivery_count=_uint(min(sent + failures, _UINT_MAX))
    )


def with_delivery_count(message: Message, count: int) -> Message:
    """A copy whose header says ``delivery-count = count``; the other header elements
    keep their bytes (a header is added when there is none).

    Raises:
        MessageError: the header is malformed.
    """
    raw = message.raw
    span = _find_section(raw, HEADER)
    if span is None:
        return Message(_list_section(_HEADER_PREFIX, [_NULL, _NULL, _NULL, _NULL, _uint(count)], False) + raw)
    return _with_header(message, span, _list_elements(raw, span[1], span[2], HEADER), delivery_count=_uint(count))


def with_ttl(message: Message, ttl: int) -> Message:
    """A copy whose header says ``ttl`` (ms, at least 1, at most 2**32-1): what an
    intermediary forwards [3.2.1: "the reduced ttl"]; the other header elements keep
    their bytes (a header is added when there is none).

    Raises:
        MessageError: the header is malformed.
    """
    value = _uint(min(max(ttl, 1), _UINT_MAX))
    raw = message.raw
    span = _find_section(raw, HEADER)
    if span is None:
        return Message(_list_section(_HEADER_PREFIX, [_NULL, _NULL, value], False) + raw)
    return _with_header(message, span, _list_elements(raw, span[1], span[2], HEADER), ttl=value)


def _with_header(
    message: Message,
    span: tuple[int, int, int],
    elements: list[tuple[int, int]],
    *,
    first_acquirer: bytes | None = None,
    delivery_count: bytes | None = None,
    ttl: bytes | None = None,
) -> Message:
    raw = message.raw
    start, value_at, end = span
    parts = [raw[s:e] for s, e in elements]
    parts += [_NULL] * (5 - len(parts))
    if ttl is not None:
        parts[2] = ttl
    if first_acquirer is not None:
        parts[3] = first_acquirer
    if delivery_count is not None:
        parts[4] = delivery_count
    section = _list_section(raw[start:value_at], parts, raw[value_at] == 0xD0)
    return Message(raw[:start] + section + raw[end:])


class AnnotationPatch:
    """Message annotations to merge into many messages, encoded once (the listener adds the
    producer's client id to every message it sends).

    Merging splices [3.2.10]: the message's other annotations keep their bytes (and so their
    AMQP types). A plain ``int`` key is a ulong (annotation keys are symbols or ulongs); a
    key matches an existing one of the same AMQP type and value, whatever its encoding.

    Raises (constructor):
        MessageError: a key or value has no AMQP encoding.
    """

    __slots__ = ("changes", "_section", "_entries", "_by_bytes", "_by_value")

    def __init__(self, changes: Mapping[Any, Any]):
        self.changes = dict(changes)
        entries: list[bytes] = []  # each change's encoded key and value
        self._by_bytes: dict[bytes, int] = {}  # encoded key → index in entries
        self._by_value: dict[Any, int] = {}  # (AMQP type, value) of the key → index
        for key, value in self.changes.items():
            if type(key) is int:
                key = ULong(key)
            try:
                encoded_key, encoded_value = encode(key), encode(value)
            except (TypeError, ValueError, struct.error) as exc:
                raise MessageError(f"annotation {key!r} has no AMQP encoding: {exc}") from None
            identity = _key_identity(encoded_key, 0, len(encoded_key))
            index = self._by_value.setdefault(identity, len(entries))
            if index == len(entries):
                entries.append(b"")
            entries[index] = encoded_key + encoded_value
            self._by_bytes[encoded_key] = index
        self._entries = entries
        self._section = _map_section(b"\x00\x53\x72", b"".join(entries), 2 * len(entries), False)

    def apply(self, message: Message, *, absent: bool = False) -> Message:
        """``message`` with these annotations merged in, other bytes unchanged. ``absent``:
        the caller knows that none of these keys is in the message (e.g. their text is not
        in its bytes), so the entries are appended without reading those it has.

        Raises:
            MessageError: malformed message-annotations (only read when it has some), or a
                malformed section in front of them.
        """
        raw = message.raw
        known = message._front
        header_fields: tuple[bool, int, int | None] | None
        if known is not None and known[2] >= 0 and type(raw) is bytes:  # patched on the way in: spans known
            _, end, start = known
            section = self._append(raw, start, start + 3, end) if absent else self._splice(raw, start, start + 3, end)
            return message.with_annotations_section(section)
        front = _front(raw)
        if front is None:  # it has message-annotations already, or an unusual encoding
            span = _find_section(raw, MESSAGE_ANNOTATIONS)
            if span is None:
                return _with_section(message, MESSAGE_ANNOTATIONS, self._section)
            if type(raw) is not bytes:  # (slices of it are looked up as keys)
                raw = bytes(raw)
            start, value_at, end = span
            section = self._append(raw, start, value_at, end) if absent else self._splice(raw, start, value_at, end)
            return Message.with_annotations_at(
                raw[:start] + section + raw[end:], start, start + len(section), usual=value_at == start + 3
            )
        at, header_fields = front
        section = self._section
        patched = Message(raw[:at] + section + raw[at:])
        patched._front = header_fields, at + len(section), at
        return patched

    def _splice(self, raw: bytes, start: int, at: int, end: int) -> bytes:
        """The message-annotations section ``raw[start:end]`` (its map at ``at``) with these
        entries merged in: a key already there has its entry's bytes replaced in place
        (later duplicates of it dropped), new keys go at the end, the map's size and count
        are rewritten (a map8 that outgrows one byte becomes a map32)."""
        code, count, position = _map_head(raw, at, end)
        pieces: list[bytes] = []
        kept_from, placed, dropped, entries = position, set(), 0, self._entries
        try:
            for _ in range(count // 2):
                key_at = position
                key_end = skip(raw, key_at)
                position = skip(raw, key_end)
                index = self._match(raw, key_at, key_end)
                if index is not None:
                    pieces.append(raw[kept_from:key_at])
                    if index in placed:
                        dropped += 1
                    else:
                        pieces.append(entries[index])
                        placed.add(index)
                    kept_from = position
        except DecodeError as exc:
            raise MessageError(f"malformed message-annotations: {exc}") from None
        if position != end:
            raise MessageError(
                f"the message-annotations map's {count} elements end at offset {position}, its size says {end}"
            )
        pieces.append(raw[kept_from:end])
        pieces += [entry for index, entry in enumerate(entries) if index not in placed]
        count += 2 * (len(entries) - len(placed) - dropped)
        return _map_section(raw[start:at], b"".join(pieces), count, code == 0xD1)

    def _append(self, raw: bytes, start: int, at: int, end: int) -> bytes:
        """The message-annotations section ``raw[start:end]`` (its map at ``at``) with these
        entries added at its end, the map's size and count rewritten."""
        code, count, position = _map_head(raw, at, end)
        entries = self._entries
        return _map_section(
            raw[start:at], raw[position:end] + b"".join(entries), count + 2 * len(entries), code == 0xD1
        )

    def _match(self, raw: bytes, at: int, end: int) -> int | None:
        """The index of the change whose key the map key ``raw[at:end]`` is, or None."""
        index = self._by_bytes.get(raw[at:end])
        if index is not None or raw[at] in _SHORT_TEXT:
            return index  # (a str8/sym8 key is encoded as ours would be: other bytes, other key)
        if raw[at] not in _KEY_TYPES:
            return None  # a compound or described key: only the same bytes are the same key
        try:
            return self._by_value.get(_key_identity(raw, at, end))
        except MessageError:
            return None


# Key constructors by AMQP type, so that a key matches whatever encoding of its type it uses.
_KEY_TYPES = {
    0xA3: "symbol",
    0xB3: "symbol",
    0xA1: "string",
    0xB1: "string",
    0xA0: "binary",
    0xB0: "binary",
    0x80: "ulong",
    0x53: "ulong",
    0x44: "ulong",
    0x70: "uint",
    0x52: "uint",
    0x43: "uint",
    0x50: "ubyte",
    0x60: "ushort",
    0x51: "byte",
    0x61: "short",
    0x71: "int",
    0x54: "int",
    0x81: "long",
    0x55: "long",
    0x56: "boolean",
    0x41: "boolean",
    0x42: "boolean",
    0x83: "timestamp",
    0x98: "uuid",
    0x73: "char",
    0x40: "null",
}
_SHORT_TEXT = frozenset((0xA1, 0xA3))


def _key_identity(raw: bytes, at: int, end: int) -> Any:
    """What makes a map key that key: its AMQP type and value (its bytes for compound keys)."""
    kind = _KEY_TYPES.get(raw[at])
    if kind is None:
        return "encoded", bytes(raw[at:end])
    try:
        return kind, decode(raw, at)[0]
    except DecodeError as exc:
        raise MessageError(f"malformed annotation key: {exc}") from None


def _map_head(raw: bytes, at: int, end: int) -> tuple[int, int, int]:
    """(constructor, element count, offset of the first element) of the map at ``raw[at]``,
    whose section ends at ``end``.

    Raises: MessageError if it is not a map8 or map32, its size and count do not fit
    before ``end`` (a map8 whose size byte says 0: a peer's message read as it came), or
    its count is odd (entries added to it would be keys and values shifted by one).
    """
    code = raw[at] if at < len(raw) else None
    if code not in (0xC1, 0xD1):
        found = "nothing" if code is None else f"constructor 0x{code:02x}"
        raise MessageError(f"the message-annotations section must be a map, found {found}")
    first = at + 3 if code == 0xC1 else at + 9
    if first > min(end, len(raw)):
        raise MessageError(f"the message-annotations map at offset {at} is cut short: its section ends at {end}")
    count = raw[at + 2] if code == 0xC1 else int.from_bytes(raw[at + 5 : at + 9], "big")
    if count % 2:
        raise MessageError(f"the message-annotations map has an odd number of elements ({count})")
    return code, count, first


def _map_section(descriptor: bytes, body: bytes, count: int, wide: bool) -> bytes:
    """A described map: ``descriptor`` (its bytes), then a map8 or (``wide`` or too big) map32."""
    if not wide and len(body) + 1 < 256 and count < 256:
        return descriptor + bytes((0xC1, len(body) + 1, count)) + body
    return descriptor + b"\xd1" + (len(body) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") + body


def _list_section(descriptor: bytes, parts: list[bytes], wide: bool) -> bytes:
    """A described list of the encoded ``parts``: list8 unless ``wide`` or too big."""
    body = b"".join(parts)
    if not wide and len(body) + 1 < 256 and len(parts) < 256:
        return descriptor + bytes((0xC0, len(body) + 1, len(parts))) + body
    return descriptor + b"\xd0" + (len(body) + 4).to_bytes(4, "big") + len(parts).to_bytes(4, "big") + body


def _list_elements(raw: bytes, at: int, end: int, code: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each element of the list that section ``code`` holds at ``at``.

    Raises:
        MessageError: not a list, or a malformed one.
    """
    constructor = raw[at]
    if constructor == 0x45:
        return []
    if constructor == 0xC0:
        count, position = raw[at + 2], at + 3
    elif constructor == 0xD0:
        count, position = int.from_bytes(raw[at + 5 : at + 9], "big"), at + 9
    else:
        raise MessageError(f"the {_name(code)} section must be a list, found constructor 0x{constructor:02x}")
    elements = []
    try:
        for _ in range(count):
            element_at, position = position, skip(raw, position)
            elements.append((element_at, position))
    except DecodeError as exc:
        raise MessageError(f"malformed {_name(code)} section: {exc}") from None
    if position != end:
        raise MessageError(f"the {_name(code)} list's {count} elements end at offset {position}, its size says {end}")
    return elements


def _count_value(raw: bytes, span: tuple[int, int]) -> int:
    """The delivery-count a producer put in its header: a uint; anything else counts as 0."""
    try:
        value = decode(raw, span[0])[0]
    except DecodeError as exc:
        raise MessageError(f"malformed header delivery-count: {exc}") from None
    return value if type(value) is int and 0 <= value <= _UINT_MAX else 0


def _uint(value: int) -> bytes:
    return encode(UInt(value))


_NULL, _FALSE, _UINT_MAX = b"\x40", b"\x42", 2**32 - 1
_NOT_FIRST_ACQUIRER = (_NULL, _FALSE, b"\x56\x00")  # first-acquirer absent, or false as encoded


def _expect(value: Any, kind: type, code: int) -> Any:
    if not isinstance(value, kind):
        raise MessageError(f"the {_name(code)} section must be a {kind.__name__}, found {type(value).__name__}")
    return value


def _name(code: int) -> str:
    for name, value in SECTIONS.items():
        if value == code:
            return name.split(":")[1]
    return f"0x{code:x}"


_U32 = struct.Struct(">I").unpack_from
_HEADER_PREFIX, _DELIVERY_ANNOTATIONS_PREFIX, _PROPERTIES_PREFIX = b"\x00\x53\x70", b"\x00\x53\x71", b"\x00\x53\x73"
_DEFAULT_HEADER_FIELDS = (False, 4, None)
_UINT_CODES = frozenset((0x40, 0x43, 0x52, 0x70))


def _list_count(raw: bytes, offset: int) -> int:
    """The element count of the list encoded at ``offset`` (0 for list0)."""
    code = raw[offset]
    if code == 0xC0:
        return raw[offset + 2]
    if code == 0xD0:
        return int.from_bytes(raw[offset + 5 : offset + 9], "big")
    return 0


def _header_fields(raw: bytes) -> tuple[bool, int, int | None] | None:
    """(durable, priority, ttl) read straight from the usual encodings of a header list
    starting at offset 3; ``None`` for anything unusual (the caller decodes properly, which
    type-checks and raises for what is wrong). A header read here is valid as a whole:
    every field is in a usual encoding and the list's size matches them, so a redelivery,
    which decodes it, cannot fail on it."""
    try:
        code = raw[3]
        if code == 0x45:
            return False, 4, None
        if code != 0xC0:
            return None
        count, position = raw[5], 6
        if count > 5:
            return None
        durable, priority, ttl = False, 4, None
        if count > 0:
            code = raw[position]
            if code == 0x41:
                durable = True
            elif code == 0x56:
                if raw[position + 1] > 1:
                    return None
                durable = raw[position + 1] == 1
                position += 1
            elif code != 0x42 and code != 0x40:
                return None
            position += 1
        if count > 1:
            code = raw[position]
            if code == 0x50:
                priority = raw[position + 1]
                position += 2
            elif code == 0x40:
                position += 1
            else:
                return None
        if count > 2:
            code = raw[position]
            if code == 0x70:
                ttl = int.from_bytes(raw[position + 1 : position + 5], "big")
                position += 5
            elif code == 0x52:
                ttl = raw[position + 1]
                position += 2
            elif code == 0x43 or code == 0x40:
                ttl = 0 if code == 0x43 else None
                position += 1
            else:
                return None
            if count > 3:  # first-acquirer, delivery-count: only stepped over (their encodings checked)
                if count > 5:
                    return None
                for widths in _HEADER_TAIL[: count - 3]:
                    width = widths.get(raw[position])
                    if width is None:
                        return None
                    position += 1 + width
        if position != 5 + raw[4]:  # the list's size says otherwise
            return None
        return durable, priority, ttl
    except IndexError:
        return None


# The usual encodings of the header's first-acquirer (boolean) and delivery-count (uint),
# with their widths (part 3, §3.2.1).
_HEADER_TAIL = ({0x40: 0, 0x41: 0, 0x42: 0}, {0x40: 0, 0x43: 0, 0x52: 1, 0x70: 4})


def _find_section(raw: bytes, wanted: int) -> tuple[int, int, int] | None:
    """``(start, value start, end)`` of section ``wanted``, scanning only up to it."""
    position, size = 0, len(raw)
    while position < size:
        start = position
        try:
            if raw[position] == 0x00 and position + 2 < size and raw[position + 1] == 0x53:
                code, value_start = raw[position + 2], position + 3
            else:
                return _find_sections(raw).get(wanted)  # unusual encoding: the full check
            position = skip(raw, value_start)
            # a patch's message is checked only from its annotations on: a section stepped
            # over here is checked here, as the full walk would
            if code == DELIVERY_ANNOTATIONS and wanted > code and _odd_map(raw, value_start):
                raise MessageError("malformed delivery-annotations section: its map has an odd count")
        except DecodeError as exc:
            raise MessageError(f"malformed section at offset {start}: {exc}") from None
        if code == wanted:
            return start, value_start, position
        if code > wanted and code not in _BODY:
            return None
    return None


def _front(raw: bytes) -> tuple[int, tuple[bool, int, int | None]] | None:
    """Where a message-annotations section goes in a message that has none (after the
    header and delivery-annotations), and the header's ``(durable, priority, ttl)``; None
    if the message has message-annotations or anything is unusually encoded."""
    try:
        if raw[:3] == _HEADER_PREFIX:
            header_fields = _header_fields(raw)
            if header_fields is None:
                return None
            position = 4 if raw[3] == 0x45 else 5 + raw[4]  # list0 or list8: all _header_fields reads
        else:
            header_fields, position = _DEFAULT_HEADER_FIELDS, 0
        if raw[position : position + 3] == _DELIVERY_ANNOTATIONS_PREFIX:
            if _odd_map(raw, position + 3):
                return None  # (the caller's full walk refuses it)
            position = skip(raw, position + 3)
    except (DecodeError, IndexError):
        return None
    following = raw[position : position + 3]  # the next section's descriptor
    if len(following) < 3 or following[:2] != b"\x00\x53" or following[2] <= MESSAGE_ANNOTATIONS:
        return None
    return position, header_fields


def _check_sections(raw: bytes, position: int, last: int) -> None:
    """:meth:`Message.check_sections` from ``position`` on, the section before it having
    code ``last`` (``HEADER - 1``: none). The usual descriptor encoding (``0x00 0x53
    code``) and the usual sizes are read inline (this runs for every message taken in); a
    section described otherwise sends the whole message through :func:`_find_sections`."""
    size = len(raw)
    code = last
    try:
        while position < size:
            if raw[position : position + 2] != b"\x00\x53" or position + 3 >= size:
                offsets = _find_sections(raw)  # an unusual descriptor encoding, or cut short: the full walk
                span = offsets.get(APPLICATION_PROPERTIES)
                if span is not None:
                    _check_application_properties(raw, span[1])
                for code in _ANNOTATIONS:
                    span = offsets.get(code)
                    if span is not None and _odd_map(raw, span[1]):
                        raise MessageError(f"malformed {_name(code)} section: its map has an odd count")
                return
            code = raw[position + 2]
            if (code <= last and (code != last or code not in _BODY)) or code > FOOTER:
                _section_order_error(code, last, position)
            at = position + 3
            kind = raw[at]
            if code == APPLICATION_PROPERTIES:
                position = _check_application_properties(raw, at)
            elif code in _ANNOTATIONS and _odd_map(raw, at):
                # stepped over, not decoded: a map of an odd count passes a skip, and the
                # patch that annotates a dead-lettered or routed message refuses it later
                raise MessageError(f"malformed {_name(code)} section at offset {position}: its map has an odd count")
            elif kind == 0x45:  # list0 (an empty header or properties)
                position = at + 1
            elif kind == 0xA0 or kind == 0xC0:  # vbin8 (a small data section), list8
                position = at + 2 + raw[at + 1]
            else:
                position = skip(raw, at)
            last = code
    except (DecodeError, IndexError) as exc:
        raise MessageError(f"malformed {_name(code)} section at offset {position}: {exc}") from None
    if position > size:
        raise MessageError(
            f"malformed {_name(code)} section: it ends at offset {position}, after the message's {size} bytes"
        )


_ANNOTATIONS = (DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS)


def _odd_map(raw: bytes, at: int) -> bool:
    """Whether the value at ``at`` is a map8 or map32 that counts an odd number of elements
    (any other value: False; a map cut short: IndexError)."""
    code = raw[at]
    if code == 0xC1:
        return bool(raw[at + 2] & 1)
    return code == 0xD1 and bool(raw[at + 8] & 1)


def _check_rest(raw: bytes, at: int, value_at: int | None) -> int:
    """:func:`_check_sections` for a patched message (:class:`AnnotationPatch`) from ``at``,
    where the sections after the message-annotations start; ``value_at`` is where the
    properties' value starts (None: no properties). Returns the properties' field count
    (0 without), which :meth:`Message.queue_info` needs next.

    The usual shape — properties as list0 or list8, then one data or amqp-value section to
    the end — is read inline with as few operations as can be (this runs for every message
    taken in); anything else is walked by :func:`_check_sections`.

    Raises:
        MessageError: see :meth:`Message.check_sections`.
    """
    size = len(raw)
    position, last, count = at, MESSAGE_ANNOTATIONS, 0  # where the full walk starts if the usual shape is not met
    try:  # (an IndexError — a message cut short — leaves it to the full walk, which says what is wrong)
        if value_at is not None:
            kind = raw[value_at]
            if kind == 0x45:  # list0
                position, last = value_at + 1, PROPERTIES
            elif kind == 0xC0:  # list8
                position, last, count = value_at + 2 + raw[value_at + 1], PROPERTIES, raw[value_at + 2]
            else:
                position, last, count = _skip_section(raw, value_at, PROPERTIES), PROPERTIES, _list_count(raw, value_at)
        head = raw[position : position + 4]
        if head in _SHORT_BODIES:
            if position + 5 + raw[position + 4] == size:
                return count
        elif head in _LONG_BODIES:
            if position + 8 + _U32(raw, position + 4)[0] == size:
                return count
        elif head[:3] == b"\x00\x53\x74":  # application-properties (checked entry by entry), then the body
            position, last = _check_application_properties(raw, position + 3), APPLICATION_PROPERTIES
            head = raw[position : position + 4]  # (the same two tests as above, for the body after them)
            if head in _SHORT_BODIES:
                if position + 5 + raw[position + 4] == size:
                    return count
            elif head in _LONG_BODIES:
                if position + 8 + _U32(raw, position + 4)[0] == size:
                    return count
    except (IndexError, struct.error):
        pass
    _check_sections(raw, position, last)
    return count


# The usual last section's first four bytes: a data or amqp-value section with a binary or
# string of up to 255 bytes, or longer.
_SHORT_BODIES = frozenset({b"\x00\x53\x75\xa0", b"\x00\x53\x77\xa0", b"\x00\x53\x77\xa1"})
_LONG_BODIES = frozenset({b"\x00\x53\x75\xb0", b"\x00\x53\x77\xb0", b"\x00\x53\x77\xb1"})


def _skip_section(raw: bytes, at: int, code: int) -> int:
    """The offset after the section value at ``at`` (of section ``code``).

    Raises:
        MessageError: it is malformed.
    """
    try:
        return skip(raw, at)
    except DecodeError as exc:
        raise MessageError(f"malformed {_name(code)} section at offset {at - 3}: {exc}") from None


def _section_order_error(code: int, last: int, at: int) -> None:
    if not HEADER <= code <= FOOTER:
        raise MessageError(f"unknown section descriptor 0x{code:02x} at offset {at}")
    raise MessageError(f"section {_name(code)} out of order at offset {at} (after {_name(last)})")


# Application-property values by constructor: fixed-width ones any bytes of which are valid
# (stepped over), those whose bytes can be invalid (boolean 0x56, char, text) or that hold
# another value (described), which are decoded, and the compound ones, which are refused.
_SIMPLE_WIDTH = {code: width for code, width in _FIXED_WIDTH.items() if code not in (0x45, 0x56, 0x73)}
_DECODED_VALUES = frozenset({0x00, 0x56, 0x73, 0xA3, 0xB1, 0xB3})
_COMPOUND = {0x45: "list", 0xC0: "list", 0xD0: "list", 0xC1: "map", 0xD1: "map", 0xE0: "array", 0xF0: "array"}


def _check_application_properties(raw: bytes, at: int) -> int:
    """Check the application-properties map encoded at ``at`` (part 3, §3.2.5) and return
    the offset after it.

    Raises:
        MessageError: not a map, a key that is not a string, a map, list or array value,
            invalid UTF-8, or a size that does not add up; with the key and the offset.
    """
    size = len(raw)
    try:
        code = raw[at]
        if code == 0xC1:
            count, position, end = raw[at + 2], at + 3, at + 2 + raw[at + 1]
        elif code == 0xD1:
            count, position, end = _U32(raw, at + 5)[0], at + 9, at + 5 + _U32(raw, at + 1)[0]
        elif code == 0x40:  # null: read as no properties
            return at + 1
        else:
            kind = _COMPOUND.get(code) or f"value with constructor 0x{code:02x}"
            raise MessageFieldError(
                f"application-properties at offset {at} must be a map (part 3, §3.2.5), found a {kind}"
            )
    except (IndexError, struct.error):
        raise MessageError(f"application-properties at offset {at}: truncated") from None
    if end > size:
        raise MessageError(
            f"application-properties at offset {at}: its size says {end - at} bytes, {size - at} are left"
        )
    if count & 1:
        raise MessageError(f"application-properties at offset {at}: a map needs an even count, found {count}")
    if 3 * (count >> 1) > end - position:  # an entry takes 3 bytes at least (key 2, value 1)
        raise MessageError(
            f"application-properties at offset {at}: {count >> 1} entries cannot fit in {end - position} bytes"
        )
    key_at = position
    try:  # (each operation counts: this runs for every message with properties; errors are rare)
        for _ in range(count >> 1):
            key_at = position
            code = raw[position]
            if code == 0xA1:  # str8: checked by decoding; a size past the map's end is caught below
                position += 2 + raw[position + 1]
                raw[key_at + 2 : position].decode()
            elif code == 0xB1:
                position += 5 + _U32(raw, position + 1)[0]
                raw[key_at + 5 : position].decode()
            else:
                found = {0xA3: "symbol", 0xB3: "symbol", 0x40: "null"}.get(code) or f"constructor 0x{code:02x}"
                raise MessageFieldError(
                    f"application-properties key at offset {key_at} must be a string (part 3, §3.2.5), found a {found}"
                )
            value_at = position
            code = raw[position]
            if code == 0xA1:  # the usual value: a short string
                position += 2 + raw[position + 1]
                raw[value_at + 2 : position].decode()
                continue
            width = _SIMPLE_WIDTH.get(code)
            if width is not None:  # numbers, null, true, false, timestamps, uuids: any bytes are valid
                position += 1 + width
            elif code in _COMPOUND:
                raise MessageFieldError(
                    f"application-properties value of {_key(raw, key_at)!r} at offset {value_at} "
                    f"is a {_COMPOUND[code]}: only simple types are allowed (part 3, §3.2.5)"
                )
            elif code in _DECODED_VALUES:  # rarer values whose bytes can be wrong: the decoder checks
                value, position = decode(raw, value_at)
                while isinstance(value, Described):  # what counts is the described value's type
                    value = value.value
                if isinstance(value, (list, dict, Array)):
                    raise MessageFieldError(
                        f"application-properties value of {_key(raw, key_at)!r} at offset "
                        f"{value_at} is a described {type(value).__name__}: only simple types are "
                        "allowed (part 3, §3.2.5)"
                    )
            elif code == 0xA0 or code == 0xB0:  # binary
                position = skip(raw, position)
            else:  # (skip() would step over an unknown constructor of a known size class)
                raise MessageError(
                    f"application-properties value of {_key(raw, key_at)!r} at offset {value_at}: "
                    f"unknown constructor 0x{code:02x}"
                )
    except UnicodeDecodeError as exc:
        raise MessageError(
            f"application-properties entry at offset {key_at}{_key_note(raw, key_at)}: invalid UTF-8: {exc.reason}"
        ) from None
    except (DecodeError, IndexError, struct.error) as exc:
        raise MessageError(
            f"application-properties entry at offset {key_at}{_key_note(raw, key_at)}: malformed: {exc or 'truncated'}"
        ) from None
    if position != end:
        raise MessageError(
            f"application-properties at offset {at}: its entries end at offset {position}, its size says {end}"
        )
    return end


def _key(raw: bytes, at: int) -> str | None:
    """The application-property key encoded at ``at``, for an error message; None if it is
    not a readable string."""
    try:
        value = decode(raw, at)[0]
    except DecodeError:
        return None
    return value if isinstance(value, str) else None


def _key_note(raw: bytes, at: int) -> str:
    key = _key(raw, at)
    return "" if key is None else f" (key {key!r})"


def head_length(raw: bytes) -> int:
    """How many leading bytes of ``raw`` hold the sections before the body (header,
    delivery- and message-annotations, properties, application-properties): the offset of
    the first body (or footer) section, ``len(raw)`` if there is none.

    ``Message(raw[:head_length(raw)])`` is a message without a body that answers what a
    queue and a selector read (priority, expiry, properties, application-properties): what
    a queue keeps in memory of a message whose bytes are only in the store. Only the
    leading sections are stepped over, so the cost does not depend on the body's size.

    Raises:
        MessageError: the leading sections are not well framed.
    """
    position, size = 0, len(raw)
    code: object  # a descriptor decoded in an unusual encoding may be of any type
    try:
        while position < size:
            if raw[position] == 0x00 and position + 2 < size and raw[position + 1] == 0x53:
                code, value_start = raw[position + 2], position + 3
            elif raw[position] == 0x00:
                descriptor, value_start = decode(raw, position + 1)
                code = SECTIONS.get(descriptor) if isinstance(descriptor, str) else descriptor
            else:
                raise MessageError(f"expected a described section at offset {position}, found 0x{raw[position]:02x}")
            if not isinstance(code, int) or code >= DATA:
                return position
            position = skip(raw, value_start)
    except DecodeError as exc:
        raise MessageError(f"malformed section at offset {position}: {exc}") from None
    return size


def _find_sections(raw: bytes) -> dict[int, tuple[int, int, int]]:
    """``{code: (section start, value start, end)}``; the common descriptor encoding
    (``0x00 0x53 code``, a smallulong) is read directly, anything else is decoded."""
    offsets: dict[int, tuple[int, int, int]] = {}
    position, last, size = 0, -1, len(raw)
    code: object  # a descriptor decoded in an unusual encoding may be of any type
    while position < size:
        start = position
        if raw[position] != 0x00:
            raise MessageError(f"expected a described section at offset {position}, found 0x{raw[position]:02x}")
        try:
            if position + 2 < size and raw[position + 1] == 0x53:
                code, value_start = raw[position + 2], position + 3
            else:
                descriptor, value_start = decode(raw, position + 1)
                code = SECTIONS.get(descriptor) if isinstance(descriptor, str) else descriptor
            position = skip(raw, value_start)
        except DecodeError as exc:
            raise MessageError(f"malformed section at offset {start}: {exc}") from None
        if not isinstance(code, int) or not HEADER <= code <= FOOTER:
            raise MessageError(f"unknown section descriptor {code!r} at offset {start}")
        if code < last or (code == last and code not in _BODY):
            raise MessageError(f"section {_name(code)} out of order at offset {start}")
        if code in offsets:  # repeated data / amqp-sequence sections form one body
            offsets[code] = (offsets[code][0], offsets[code][1], position)
        else:
            offsets[code] = (start, value_start, position)
        last = code
    return offsets


def build(
    body: Any = None,
    *,
    durable: bool = False,
    priority: int | None = None,
    ttl: int | None = None,
    message_id: Any = None,
    to: str | None = None,
    subject: str | None = None,
    reply_to: str | None = None,
    correlation_id: Any = None,
    content_type: str | None = None,
    absolute_expiry_time: int | None = None,
    creation_time: int | None = None,
    group_id: str | None = None,
    user_id: bytes | None = None,
    properties: Mapping[str, Any] | None = None,
    annotations: Mapping[Any, Any] | None = None,
) -> Message:
    """Encode a message. ``body``: bytes → a data section; anything else → amqp-value."""
    parts = []
    if durable or priority is not None or ttl is not None:
        parts.append(
            Described(
                ULong(HEADER),
                [durable, None if priority is None else UByte(priority), None if ttl is None else UInt(ttl)],
            )
        )
    if annotations:
        parts.append(
            Described(
                ULong(MESSAGE_ANNOTATIONS), {Symbol(k) if type(k) is str else k: v for k, v in annotations.items()}
            )
        )
    fields = [
        message_id,
        user_id,
        to,
        subject,
        reply_to,
        correlation_id,
        None if content_type is None else Symbol(content_type),
        None,
        None if absolute_expiry_time is None else Timestamp(absolute_expiry_time),
        None if creation_time is None else Timestamp(creation_time),
        group_id,
    ]
    while fields and fields[-1] is None:
        fields.pop()
    if fields:
        parts.append(Described(ULong(PROPERTIES), fields))
    if properties:
        parts.append(Described(ULong(APPLICATION_PROPERTIES), dict(properties)))
    if isinstance(body, (bytes, bytearray)):
        parts.append(Described(ULong(DATA), bytes(body)))
    else:
        parts.append(Described(ULong(AMQP_VALUE), body))
    return Message(b"".join(encode(part) for part in parts))
