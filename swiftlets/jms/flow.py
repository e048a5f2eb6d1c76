"""Producer flow control over AMQP: credit withheld from a client's producers while they must wait.

Theory of operation
-------------------
An :class:`.links.IncomingLink` tops its credit up each time half its window is used;
it asks :class:`ProducerFlow` first whether to hold the top-up: when a send got a
flow-control delay from its queue or topic, or while the router's memory alarm is on.
Then a task in the connection's driver waits for the end of it and tops the credit up.
The connection counts these waits (``flow-control-waits``, ``memory-waits``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from .links import IncomingLink

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["ProducerFlow"]


class ProducerFlow:
    """The flow control of one connection's producers."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection

    def held_by_memory(self) -> bool:
        """The router's memory alarm is on and this connection's producers wait for it: all
        but those of a user in one of sys$mgmt's groups (management, as for the queues kept
        in reserve for it: an operator must be able to act on a router that is full)."""
        connection = self.connection
        return connection.memory.on and not connection.temporaries.creator().reserved

    def throttle(self, state: IncomingLink) -> None:
        driver = self.connection.driver
        assert driver is not None  # a transfer, which this answers, arrives while the driver runs
        driver.start_soon(self._resume_after_delay, state)

    async def _resume_after_delay(self, state: IncomingLink) -> None:
        """SwiftMQ's producer flow control over AMQP: a producer whose sends got a
        flow-control delay gets no new credit until the delay has passed — or, when it sent
        to a queue, until a consumer brought that queue back to its
        ``flowcontrol-start-queuesize``, so a backlog that drains fast does not leave its
        consumers idle for the rest of the delay. Then, as RabbitMQ does, none while the
        router's memory alarm is on (its link stays attached; consumers drain meanwhile)."""
        connection = self.connection
        if state.delay_ms:
            connection.flow_control_waits += 1
            cleared = trio.Event()
            cancel = None
            if state.delayed_queue is not None:
                cancel = connection.queue_manager.when_backlog_cleared(state.delayed_queue, cleared.set)
            if cancel is not None or state.delayed_queue is None:  # else the queue is not slowing sends now
                try:
                    with trio.move_on_after(state.delay_ms / 1000):
                        await cleared.wait()
                finally:  # (also when the connection ends meanwhile)
                    if cancel is not None:
                        cancel()
        if self.held_by_memory():
            connection.memory_waits += 1
        while not connection.closed and self.held_by_memory():
            clear = trio.Event()
            cancel = connection.memory.when_clear(clear.set)
            try:
                await clear.wait()
            finally:
                if cancel is not None:
                    cancel()
        if not connection.closed and connection.links.get(state.link) is state:
            state.resume()
            connection.wake()
