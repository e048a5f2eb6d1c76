"""Queue bridges (Qpid's queue routes): configured forwarders from a local queue to ``q@R``.

Theory of operation
-------------------
A bridge is a consumer of its source queue that, per batch of up to ``transaction-size``
messages, stages a send of each to its destination ``q@R`` and the acknowledgement of each
from the source in **one local queue-manager transaction**, and commits it: the messages
leave the source and enter ``rt$R`` (through the redirection and its rewrite, which gives
them the routing annotations of a journey to ``q@R``) together and durably, or not at all.
From ``rt$R`` the transfer carries them exactly once like any other message, so a bridge
adds no guarantee of its own and needs none: a crash before the commit leaves the batch
in the source, one after it leaves it in ``rt$R``.

While ``R`` is not known (no route, no static route: the destination does not resolve) the
bridge takes no credit and the messages wait in the source queue; every routing table
change wakes it (:meth:`QueueBridge.wake`). A send refused by the destination (``rt$R``
full) puts the batch back untouched (no delivery counted) and the bridge tries again after
:data:`REFUSED_BACKOFF`. The flow-control delay of ``rt$R`` is observed like a producer's.

A bridge runs as one task (:meth:`QueueBridge.run`) in the routing swiftlet's nursery,
from when it is added (at start, or at runtime through management) until it is removed
(its scope is cancelled: an uncommitted batch goes back to the source). A change of its
config restarts its work with the new values; ``enabled="false"`` stops the moving.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from martinet.kernel import Change, Entity, UsageList, Veto
from martinet.messaging.message import MessageError
from martinet.swiftlets.queuemanager.api import Consumer, Entry, QueueError, QueueManager, QueueNotFound

from .config import QueueBridgeConfig

__all__ = ["QueueBridge", "QueueBridges"]

log = logging.getLogger(__name__)

REFUSED_BACKOFF = 1.0  # seconds before a bridge tries again after its destination refused a batch


class QueueBridge:
    """One configured bridge: its task, its state and what usage shows of it.

    Args:
        entity: the bridge's management entity (its live config).
        manager: the queue manager (sources, destinations and transactions).
    """

    def __init__(self, entity: Entity, manager: QueueManager):
        self.entity = entity
        self.manager = manager
        self.scope = trio.CancelScope()  # cancelled when the bridge is removed
        self._work = trio.CancelScope()  # cancelled when its config changes: start over
        self._wakeup = trio.Event()
        self.moved = 0
        self.state = "starting"
        self.waiting_reason = ""
        entity.on_change(self._changed)

    def wake(self) -> None:
        """Something changed (a message arrived, the routing table changed): look again."""
        self._wakeup.set()

    def usage(self) -> dict[str, Any]:
        config: QueueBridgeConfig = self.entity.config
        return {
            "source-queue": config.source_queue,
            "destination": config.destination,
            "state": self.state,
            "messages-moved": self.moved,
            "waiting-for": self.waiting_reason,
        }

    def _changed(self, change: Change) -> None:
        self._work.cancel()

    async def run(self) -> None:
        """Move messages until the bridge is removed (:attr:`scope` cancelled). A failure
        other than the refusals above (a store failure) is logged and ends this bridge only:
        its messages stay in the source."""
        with self.scope:
            try:
                while True:
                    self._work = trio.CancelScope()
                    with self._work:
                        await self._move_forever(self.entity.config)
            except Exception as exc:
                self.state, self.waiting_reason = "failed", str(exc)
                log.exception(
                    "queue bridge %s stopped; its messages stay in %s",
                    self.entity.name,
                    self.entity.config.source_queue,
                )

    async def _move_forever(self, config: QueueBridgeConfig) -> None:
        if not config.enabled:
            self.state, self.waiting_reason = "disabled", ""
            await trio.sleep_forever()
        consumer = self.manager.queue(config.source_queue, create=True).consumer(owner=self)
        consumer.notify = self.wake
        try:
            while True:
                wakeup = self._wakeup
                try:
                    self.manager.resolve(config.destination)
                except QueueNotFound as exc:  # R is not known (yet): the messages wait in the source
                    consumer.set_credit(0)
                    self.state, self.waiting_reason = "waiting", str(exc)
                    await wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                self.state, self.waiting_reason = "moving", ""
                consumer.set_credit(config.transaction_size)
                entries = consumer.take(config.transaction_size)
                if not entries:
                    await wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                delay_ms = await self._move(consumer, entries, config.destination)
                if delay_ms:  # the destination's flow control, as for any producer
                    await trio.sleep(delay_ms / 1000)
        finally:
            consumer.close()

    async def _move(self, consumer: Consumer, entries: list[Entry], destination: str) -> int:
        """Move ``entries`` in one transaction; the destination's flow-control delay (ms).
        A refused batch goes back to the source untouched."""
        transaction = self.manager.transaction()
        delay_ms = 0
        try:
            for entry in entries:  # the sends first: a refusal leaves nothing acknowledged
                delay_ms = max(delay_ms, transaction.send(destination, entry.message).delay_ms)
        except (QueueError, MessageError) as exc:
            transaction.rollback_nowait()
            consumer.set_credit(0)  # (else what goes back comes straight back)
            for entry in entries:
                consumer.release(entry)
            self.state, self.waiting_reason = "waiting", f"{destination} refused the messages: {exc}"
            log.warning(
                "queue bridge %s: %s refused %d message(s), they stay in %s: %s",
                self.entity.name,
                destination,
                len(entries),
                consumer.queue.name,
                exc,
            )
            await trio.sleep(REFUSED_BACKOFF)
            return 0
        for entry in entries:
            transaction.acknowledge(consumer, entry)
        try:
            await transaction.commit()
        except BaseException:
            if transaction.state == "active":  # not stored: the batch goes back to the source
                transaction.rollback_nowait()
            raise
        self.moved += len(entries)
        return delay_ms


class QueueBridges:
    """A router's queue bridges, by name: each runs in ``nursery`` from its addition to its
    removal, on ``queue_manager`` (both set when the swiftlet runs; without a queue manager
    a bridge is refused), and shows in ``usage``."""

    def __init__(self, router: str, usage: UsageList):
        self.router = router
        self.queue_manager: QueueManager | None = None
        self.nursery: trio.Nursery | None = None
        self._usage = usage
        self._bridges: dict[str, QueueBridge] = {}

    def added(self, entity: Entity) -> None:
        """Raises Veto without a queue manager (a bridge moves queued messages)."""
        if self.queue_manager is None:
            raise Veto(f"queue bridge {entity.name}: router {self.router} has no sys$queuemanager")
        bridge = self._bridges[entity.name] = QueueBridge(entity, self.queue_manager)
        self._usage.add(entity.name, bridge.usage)
        assert self.nursery is not None
        self.nursery.start_soon(bridge.run)

    def removed(self, entity: Entity) -> None:
        bridge = self._bridges.pop(entity.name, None)
        if bridge is not None:
            self._usage.remove(entity.name)
            bridge.scope.cancel()

    def wake(self) -> None:
        """The routing table changed: a bridge's destination may have become known."""
        for bridge in self._bridges.values():
            bridge.wake()
