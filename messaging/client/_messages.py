"""JMS messages and destinations, and their AMQP 1.0 encoding (the Qpid JMS mapping).

A JMS message type travels in the ``x-opt-jms-msg-type`` annotation and its body in the
matching AMQP section: text → amqp-value string, bytes → data section, map → amqp-value
map, stream → amqp-value list, plain message → no body. Destination kinds travel in
``x-opt-jms-dest`` / ``x-opt-jms-reply-to``. JMS headers map to AMQP fields as Qpid JMS
maps them (JMSType → subject, JMSTimestamp → creation-time, JMSExpiration →
absolute-expiry-time, JMSRedelivered → delivery-count > 0), so messages of this client,
of Qpid JMS and of proton clients read the same.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..amqp.wire import JMS_DEST, JMS_MSG_TYPE, JMS_REPLY_TO, TOPIC_PREFIX
from ..codec import Byte, Described, Symbol, Timestamp, UByte, UInt, ULong, encode
from ..message import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
)
from ..message import Message as AmqpMessage

__all__ = [
    "DeliveryMode",
    "Destination",
    "Queue",
    "Topic",
    "TemporaryQueue",
    "TemporaryTopic",
    "Message",
    "TextMessage",
    "BytesMessage",
    "MapMessage",
    "StreamMessage",
    "MessageFormatError",
]

MSG_TYPE, DEST, REPLY_TO = JMS_MSG_TYPE, JMS_DEST, JMS_REPLY_TO
PROPERTY_TYPES = (bool, int, float, str, bytes, type(None))


class MessageFormatError(ValueError):
    """A property or body value that a JMS message cannot carry."""


class DeliveryMode(enum.Enum):
    NON_PERSISTENT = "non_persistent"
    PERSISTENT = "persistent"


@attrs.frozen
class Destination:
    """Where messages go: a queue or topic name (``name@router`` for a queue elsewhere)."""

    name: str
    kind: int = attrs.field(default=0, init=False, repr=False, eq=False)  # x-opt-jms-dest value

    @property
    def is_topic(self) -> bool:
        return self.kind in (1, 3)

    def __str__(self) -> str:
        return self.name


@attrs.frozen
class Queue(Destination):
    kind: int = attrs.field(default=0, init=False, repr=False, eq=False)


@attrs.frozen
class Topic(Destination):
    kind: int = attrs.field(default=1, init=False, repr=False, eq=False)


@attrs.frozen
class TemporaryQueue(Queue):
    """A queue that lives as long as the connection that created it (or until deleted)."""

    kind: int = attrs.field(default=2, init=False, repr=False, eq=False)


@attrs.frozen
class TemporaryTopic(Topic):
    kind: int = attrs.field(default=3, init=False, repr=False, eq=False)


_KINDS: dict[int, type[Destination]] = {0: Queue, 1: Topic, 2: TemporaryQueue, 3: TemporaryTopic}


def destination_from(address: Any, kind: Any) -> Destination | None:
    """The destination of an address and its JMS kind annotation (a queue when unknown);
    None for none, and for an address that is not a string (the router passes a message's
    properties through unchecked but for what it reads itself)."""
    if not address or not isinstance(address, str):
        return None
    if address.startswith(TOPIC_PREFIX):
        return Topic(address[len(TOPIC_PREFIX) :])
    return _KINDS.get(kind if isinstance(kind, int) else 0, Queue)(address)


class Message:
    """A JMS message without a body; the base of the typed messages.

    JMS headers are attributes (``message_id``, ``correlation_id``, ``reply_to``,
    ``destination``, ``delivery_mode``, ``priority``, ``expiration`` (ms since the epoch, 0:
    never), ``timestamp``, ``redelivered``, ``delivery_count``, ``type``); application
    properties are the dict :attr:`properties` (values: bool, int, float, str, bytes or None;
    wrap an int in :class:`messaging.codec.Int`/``Short``/``Byte`` to send a narrower type).
    """

    type_code = 0

    def __init__(
        self,
        body: Any = None,
        *,
        properties: Mapping[str, Any] | None = None,
        correlation_id: str | None = None,
        reply_to: Destination | None = None,
        type: str | None = None,
    ):
        self.body = body
        self.properties: dict[str, Any] = dict(properties or {})
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.type = type
        self.message_id: str | None = None
        self.destination: Destination | None = None
        self.delivery_mode = DeliveryMode.PERSISTENT
        self.priority = 4
        self.expiration = 0
        self.timestamp = 0
        self.delivery_count = 0
        self.annotations: dict[Any, Any] = {}
        self._acknowledge: Callable[[], Any] | None = None

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0

    @property
    def producer_client_id(self) -> str | None:
        """The client id of the connection that sent the message (stamped by the router)."""
        return self.annotations.get("x-opt-martinet-cid")

    async def acknowledge(self) -> None:
        """In a CLIENT_ACKNOWLEDGE session: acknowledge every message the session has
        delivered so far (JMS 1.1). Does nothing in other modes."""
        if self._acknowledge is not None:
            await self._acknowledge()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.message_id} body={self.body!r:.60}>"

    # -- encoding ---------------------------------------------------------------------------

    def _body_section(self) -> bytes:
        return b""

    def encode(
        self,
        *,
        message_id: str,
        destination: Destination | None,
        delivery_mode: DeliveryMode,
        priority: int,
        ttl: int,
        now_ms: int,
    ) -> bytes:
        """The AMQP bytes of this message as sent (sets the JMS headers on ``self``)."""
        for key, value in self.properties.items():
            if not isinstance(key, str) or not isinstance(value, PROPERTY_TYPES):
                raise MessageFormatError(f"property {key!r}: {type(value).__name__} is not a JMS property type")
        self.message_id, self.destination, self.delivery_mode = message_id, destination, delivery_mode
        self.priority, self.timestamp = priority, now_ms
        self.expiration = now_ms + ttl if ttl else 0
        durable = delivery_mode is DeliveryMode.PERSISTENT
        parts = [encode(Described(ULong(HEADER), [durable, UByte(priority), UInt(ttl) if ttl else None]))]
        annotations = {MSG_TYPE: Byte(self.type_code)}
        if destination is not None:
            annotations[DEST] = Byte(destination.kind)
        if self.reply_to is not None:
            annotations[REPLY_TO] = Byte(self.reply_to.kind)
        parts.append(encode(Described(ULong(MESSAGE_ANNOTATIONS), annotations)))
        fields = [
            message_id,
            None,
            destination.name if destination else None,
            self.type,
            self.reply_to.name if self.reply_to else None,
            self.correlation_id,
            None,
            None,
            Timestamp(self.expiration) if ttl else None,
            Timestamp(now_ms),
        ]
        parts.append(encode(Described(ULong(PROPERTIES), fields)))
        if self.properties:
            parts.append(encode(Described(ULong(APPLICATION_PROPERTIES), self.properties)))
        parts.append(self._body_section())
        return b"".join(parts)


class TextMessage(Message):
    type_code = 5

    def __init__(self, text: str = "", **headers: Any):
        if not isinstance(text, str):
            raise MessageFormatError(f"a TextMessage body is a str, not {type(text).__name__}")
        super().__init__(text, **headers)

    @property
    def text(self) -> str:
        text: str = self.body
        return text

    def _body_section(self) -> bytes:
        return encode(Described(ULong(AMQP_VALUE), self.body))


class BytesMessage(Message):
    type_code = 3

    def __init__(self, data: bytes = b"", **headers: Any):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MessageFormatError(f"a BytesMessage body is bytes, not {type(data).__name__}")
        super().__init__(bytes(data), **headers)

    @property
    def data(self) -> bytes:
        data: bytes = self.body
        return data

    def _body_section(self) -> bytes:
        return encode(Described(ULong(DATA), self.body))


class MapMessage(Message):
    type_code = 2

    def __init__(self, values: Mapping[str, Any] | None = None, **headers: Any):
        values = dict(values or {})
        for key, value in values.items():
            if not isinstance(key, str) or not isinstance(value, PROPERTY_TYPES):
                raise MessageFormatError(f"map entry {key!r}: {type(value).__name__} is not a JMS map value")
        super().__init__(values, **headers)

    def _body_section(self) -> bytes:
        return encode(Described(ULong(AMQP_VALUE), self.body))


class StreamMessage(Message):
    type_code = 4

    def __init__(self, values: list[Any] | tuple[Any, ...] = (), **headers: Any):
        values = list(values)
        for value in values:
            if not isinstance(value, PROPERTY_TYPES):
                raise MessageFormatError(f"stream item {value!r}: {type(value).__name__} is not a JMS stream value")
        super().__init__(values, **headers)

    def _body_section(self) -> bytes:
        return encode(Described(ULong(AMQP_VALUE), self.body))


_TYPES: dict[int, type[Message]] = {0: Message, 2: MapMessage, 3: BytesMessage, 4: StreamMessage, 5: TextMessage}


def decode_message(raw: bytes) -> Message:
    """The JMS message for received AMQP bytes (type by annotation, else inferred as Qpid JMS does).

    Raises:
        messaging.message.MessageError: the bytes are not an AMQP message.
    """
    amqp = AmqpMessage(raw)
    annotations = {str(k) if isinstance(k, Symbol) else k: v for k, v in amqp.message_annotations.items()}
    body = amqp.body() if any(code in amqp.sections() for code in (DATA, AMQP_VALUE, AMQP_SEQUENCE)) else None
    kind = annotations.get(str(MSG_TYPE))
    if kind not in _TYPES:
        kind = (
            5
            if isinstance(body, str)
            else 3
            if isinstance(body, bytes)
            else 2
            if isinstance(body, dict)
            else 4
            if isinstance(body, list)
            else 0
        )
    message = Message.__new__(_TYPES[kind])
    Message.__init__(message, body if kind else None)
    header, properties = amqp.header, amqp.properties
    message.properties = dict(amqp.application_properties)
    message.annotations = annotations
    message.message_id = properties.message_id
    message.correlation_id = properties.correlation_id
    message.type = properties.subject
    message.destination = destination_from(properties.to, annotations.get(str(DEST)))
    message.reply_to = destination_from(properties.reply_to, annotations.get(str(REPLY_TO)))
    message.delivery_mode = DeliveryMode.PERSISTENT if header.durable else DeliveryMode.NON_PERSISTENT
    message.priority = min(header.priority, 9)
    message.delivery_count = header.delivery_count
    creation = properties.creation_time  # (a timestamp, unless the sender wrote something else)
    message.timestamp = int(creation) if isinstance(creation, int) and not isinstance(creation, bool) else 0
    message.expiration = int(properties.absolute_expiry_time or 0)
    if kind == 3 and isinstance(message.body, list):  # several data sections
        message.body = b"".join(message.body)
    return message


def new_message_id() -> str:
    return f"ID:{uuid.uuid4()}"


def now_ms() -> int:
    return int(time.time() * 1000)
