"""Publications other routers forwarded here, delivered to the local subscribers: the queue
``tpc$<root>`` of each root with local interest is consumed in batches; the persistent
messages of a batch are delivered in one local transaction together with their
acknowledgements (a crash delivers a batch entirely or not at all), the others at once (as a
local publish; JMS lets a non-persistent message pass a persistent one). Under the store's
disk alarm the persistent copies would be refused, and a refused copy is dropped as for a
full queue: what is staged is committed and the delivery waits for space, in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from martinet.messaging.message import Message
from martinet.swiftlets.queuemanager.api import Consumer, QueueManager
from martinet.swiftlets.store.api import Store, until_clear

__all__ = ["ForwardedDelivery"]

CREDIT = 100  # forwarded messages taken from tpc$<root> ahead
BATCH = 20  # forwarded messages delivered per local transaction (its staging is quadratic in the sends)


class ForwardedDelivery:
    """The consumers of the ``tpc$`` queues, by root; ``deliver(message, transaction)``
    delivers to the local subscribers (staged in ``transaction``, or at once when None).
    ``nursery`` and ``store``: set while the federation runs."""

    def __init__(self, queue_manager: QueueManager, deliver: Callable[[Message, Any], None]):
        self._queue_manager = queue_manager
        self._deliver = deliver
        self.nursery: trio.Nursery | None = None
        self.store: Store | None = None
        self._listening: dict[str, trio.CancelScope] = {}  # roots whose tpc$ queue is consumed

    def listening(self, root: str) -> bool:
        return root in self._listening

    def listen(self, root: str, queue: Any) -> None:
        """Consume ``queue`` (``tpc$<root>``) from now on."""
        assert self.nursery is not None  # (the federation listens only while it runs)
        self._listening[root] = scope = trio.CancelScope()
        self.nursery.start_soon(self._receive, queue, scope)

    def stop(self, root: str) -> bool:
        """Stop consuming ``tpc$<root>``; whether it was consumed."""
        scope = self._listening.pop(root, None)
        if scope is None:
            return False
        scope.cancel()
        return True

    async def _receive(self, queue: Any, scope: trio.CancelScope) -> None:
        """Deliver what other routers forwarded until cancelled (the root's temporary topic is gone)."""
        with scope:
            await self._deliver_batches(queue)

    async def _deliver_batches(self, queue: Any) -> None:
        consumer: Consumer = queue.consumer(owner=self)
        consumer.flow(CREDIT)
        while True:
            entries = [await consumer.receive(), *consumer.take(BATCH - 1)]
            transaction = None
            for entry in entries:
                if entry.message.durable:
                    # Nothing yields between this check and the sends, so the disk alarm cannot
                    # go on in between.
                    assert self.store is not None  # (set before the federation listens)
                    if self.store.space.on:
                        if transaction is not None:
                            await transaction.commit()
                            transaction = None
                        await until_clear(self.store.space)
                    transaction = transaction or self._queue_manager.transaction()
                    self._deliver(entry.message, transaction)
                    transaction.acknowledge(consumer, entry)
                else:  # nothing to keep across a crash: delivered at once
                    self._deliver(entry.message, None)
                    consumer.accept(entry)
            if transaction is not None:
                await transaction.commit()
            consumer.flow(len(entries))
