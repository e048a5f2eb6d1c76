"""Martinet's JMS-shaped Python client: AMQP 1.0 on trio, with a blocking facade.

    from martinet.messaging.client import connect, Queue, TextMessage

    async with connect("amqp://localhost:5672", client_id="app") as connection:
        async with connection.session() as session:
            producer = await session.producer(Queue("orders"))
            await producer.send(TextMessage("hello"))
            consumer = await session.consumer(Queue("orders"))
            print((await consumer.receive(timeout=5)).text)

Works with any AMQP 1.0 broker for the basics; the connection-factory defaults (consumer
cache size, delivery mode, priority, ttl) come from a Martinet listener. See
:mod:`._connection` for how JMS maps onto AMQP and :mod:`.blocking` for plain scripts.
"""

from ._connection import Connection, connect
from ._errors import (
    AckMode,
    ConnectionLost,
    InvalidClientId,
    InvalidDestination,
    InvalidSelector,
    JMSError,
    SecurityError,
    TransactionRolledBack,
)
from ._messages import (
    BytesMessage,
    DeliveryMode,
    Destination,
    MapMessage,
    Message,
    MessageFormatError,
    Queue,
    StreamMessage,
    TemporaryQueue,
    TemporaryTopic,
    TextMessage,
    Topic,
)
from ._session import Browser, Consumer, Producer, Requestor, Session

__all__ = [
    "connect",
    "Connection",
    "Session",
    "Producer",
    "Consumer",
    "Browser",
    "Requestor",
    "AckMode",
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
    "JMSError",
    "SecurityError",
    "InvalidDestination",
    "InvalidClientId",
    "InvalidSelector",
    "TransactionRolledBack",
    "ConnectionLost",
    "MessageFormatError",
]
