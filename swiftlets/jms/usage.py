"""What management shows of a client connection (``sys$jms`` usage ``connections``).

Theory of operation
-------------------
The connection counts the messages it received and sent itself (its links add to its
``received`` and ``sent`` per message, as plain attributes); :class:`ConnectionUsage`
turns those counts into rates when the swiftlet samples it every ``collect-interval``, and
makes the usage entry: who, since when, its links and transactions, the flow-control and
memory waits of its producers, the counts and the rates.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["ConnectionUsage"]


class ConnectionUsage:
    """The usage of one connection: its message rates, sampled, and its usage entry."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection
        self.receive_rate = self.send_rate = 0.0
        self._rate_mark = (time.monotonic(), 0, 0)
        self.since = time.time()

    def sample_rates(self) -> None:
        connection = self.connection
        at, received, sent = self._rate_mark
        now = time.monotonic()
        if now > at:
            self.receive_rate = (connection.received - received) / (now - at)
            self.send_rate = (connection.sent - sent) / (now - at)
        self._rate_mark = (now, connection.received, connection.sent)

    def usage(self, listener: str) -> dict[str, object]:
        connection = self.connection
        return {
            "listener": listener,
            "host": connection.host,
            "client-id": connection.client_id or "",
            "user": getattr(connection.principal, "user", "") or "",
            "connected-since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since)),
            "links": len(connection.links),
            "transactions": len(connection.transactions.open),
            "flow-control-waits": connection.flow_control_waits,
            "memory-waits": connection.memory_waits,
            "messages-received": connection.received,
            "messages-sent": connection.sent,
            "receive-rate": round(self.receive_rate, 1),
            "send-rate": round(self.send_rate, 1),
        }
