"""What a router's routing links receive: each inbound batch staged where its messages go.

Each message goes to its queue when this router is its destination, else into
``rt$<destination>`` (forwarded, hops + 1), or to ``unroutable`` with the reason in
``x-opt-martinet-unroutable`` (no such queue, no route on, too many hops); a message for a
temporary queue that is gone is dropped and counted. XA: all of a transaction is staged in
one local transaction, prepared under the sender's xid (durable), answered; committed on
COMMIT. Non-XA: committed at once, then answered. A batch whose target queue is full waits
for room, and the link's later batches behind it (:meth:`Receiving.admit`).

**Time to live.** A receiver past a message's ``x-opt-martinet-expires`` stages it for its
``routerdlq`` in the same transaction, else reduces a header ``ttl`` to what is left, so that
every queue on the way expires it when the source's would have.

The methods run in a link's worker (:class:`~.transfer.Transfer`), one event after the other;
each queues its store write and returns it for the link's answerer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import trio

from martinet.messaging.codec import UInt
from martinet.messaging.message import Message, MessageError, with_ttl
from martinet.swiftlets.queuemanager.api import (
    TEMPORARY_PREFIX,
    MalformedMessage,
    QueueError,
    QueueFull,
    QueueManager,
    QueueNotFound,
    Transaction,
    check_queue_name,
)
from martinet.swiftlets.store.api import StoreError

from . import routing_annotations
from .api import UNROUTABLE, Destination, routing_queue
from .exchange import MAX_PATH
from .links import Link
from .linkwork import UNROUTABLE_REASON, InboundBatch, LinkTransfer, StoreWrite
from .rewrite import now_ms
from .routing_annotations import DESTINATION, DOUBT, EXPIRES, HOPS, QUEUE

__all__ = ["Receiving"]

log = logging.getLogger(__name__)


class Receiving:
    """The receiving side of a router's transfer.

    Args:
        local: this router's name.
        manager: the queue manager.
        destination: ``router -> Destination | None`` (the routing table).
    """

    def __init__(self, local: str, manager: QueueManager, destination: Callable[[str], Destination | None]):
        self.local = local
        self.manager = manager
        self._destination = destination
        self._hops = routing_annotations.HopCounter()
        self.dropped = 0  # messages for temporary queues that were gone
        self.unroutable = 0
        self.expired = 0  # messages found expired on arrival (dead-lettered here)

    def _stage(self, transaction: Transaction, raw: bytes, alone: bool = False) -> int:
        """Stage one received message where it goes; the flow-control delay (ms) of the
        queue it goes to (0 when it is dropped, dead-lettered or goes to unroutable).
        ``alone``: its batch goes into an empty queue without the queue's limits."""
        try:
            fields, counted = self._hops.count(raw)  # the usual case, without decoding the message
            if fields is not None and counted is not None:
                destination, queue, hops = fields.destination, fields.queue, fields.hops
                doubt, expires = fields.doubt, fields.expires
            else:
                annotations = Message(raw).message_annotations
                destination, queue = annotations.get(DESTINATION), annotations.get(QUEUE)
                hops, doubt, expires = annotations.get(HOPS, 0), annotations.get(DOUBT), annotations.get(EXPIRES)
        except MessageError as exc:
            log.warning("a routed message could not be read, it is dropped: %s", exc)
            return 0
        if not isinstance(destination, str) or not isinstance(queue, str) or not isinstance(hops, int):
            return self._unroutable(transaction, Message(raw), "it has no routing annotations")
        message = counted if counted is not None else Message(raw).with_annotations({HOPS: UInt(hops + 1)})
        if isinstance(expires, int):
            remaining = expires - now_ms()
            if remaining <= 0:
                self.expired += 1
                log.info(
                    "a routed message for %s@%s expired in transit, %d ms before it reached router %s; to routerdlq",
                    queue,
                    destination,
                    -remaining,
                    self.local,
                )
                transaction.dead_letter(
                    message,
                    f"expired in transit: found at router {self.local} {-remaining} ms after its expiry",
                    f"{queue}@{destination}",
                )
                return 0
            if message.header_fields()[2]:  # a ttl counts from each arrival: what is left of it
                message = with_ttl(message, remaining)
        if destination == self.local:
            if queue.startswith(TEMPORARY_PREFIX) and queue not in self.manager.queues:
                self.dropped += 1  # its requester is gone
                return 0
            try:  # (a name no queue may have: the queue manager would refuse the whole batch)
                check_queue_name(queue)
            except QueueError as exc:
                return self._unroutable(transaction, message, str(exc))
            try:
                return transaction.send(queue, message, possible_duplicate=bool(doubt), limited=not alone).delay_ms
            except QueueNotFound as exc:
                return self._unroutable(transaction, message, str(exc))
        elif hops + 1 >= MAX_PATH:
            return self._unroutable(transaction, message, f"it passed {hops + 1} routers (a loop?)")
        elif self._destination(destination) is None:
            return self._unroutable(
                transaction, message, f"router {destination!r} is not known to router {self.local!r}"
            )
        else:
            # forwarded as it is, in doubt or not: only the target queue drops duplicates. A
            # routing queue may see a message twice without a duplicate (a path that changed
            # mid-transfer, a → b → a → c): its backlog there would drop the only copy. Straight
            # into rt$R: what q@R's redirection does (its rewrite leaves a travelling message as
            # it is), without the lookups; rt$R missing means it could not be made, and the
            # address is refused as before
            target = routing_queue(destination)
            if target not in self.manager.queues:
                target = f"{queue}@{destination}"
            return transaction.send(target, message, limited=not alone).delay_ms

    def _unroutable(self, transaction: Transaction, message: Message, reason: str) -> int:
        transaction.send(UNROUTABLE, message.with_annotations({UNROUTABLE_REASON: reason}))
        self.unroutable += 1
        log.warning("a routed message went to unroutable on router %s: %s", self.local, reason)
        return 0

    def _refuse(self, link: Link, transaction: Transaction, xid: str, reason: str) -> None:
        """Refuse inbound ``xid``: nothing of it is held; the sender tries again later."""
        if transaction.state == "active":
            transaction.rollback_nowait()
        link.machine.refuse_transaction(xid, reason)
        link.wake()

    async def prepare(self, link: Link, state: LinkTransfer, xid: str, messages: tuple[bytes, ...]) -> StoreWrite:
        def prepared(error: BaseException | None) -> None:
            transaction = batch.transaction
            assert transaction is not None
            if error is not None:  # a limit it can never meet, or the store failed
                self._refuse(link, transaction, xid, str(error))
                return
            state.inbound[xid] = transaction
            state.messages_in += len(messages)
            link.machine.prepared(xid)
            link.wake()

        batch = InboundBatch(
            messages,
            StoreWrite(prepared),
            lambda transaction, write: transaction.prepare_nowait(xid, write.finish, transient_in_memory=True),
        )
        self._admit(link, state, batch)
        return batch.write

    async def commit(self, link: Link, state: LinkTransfer, xid: str, recovery: bool) -> StoreWrite:
        def stored(error: BaseException | None) -> None:
            if error is not None:
                raise StoreError(f"routing transaction {xid} not committed: {error}")

        def committed(error: BaseException | None) -> None:
            stored(error)
            if recovery:
                log.info("routing transaction %s from %s committed in recovery", xid, link.peer)
            link.machine.committed(xid)
            link.wake()

        transaction = state.inbound.pop(xid, None)
        if transaction is not None:
            # Answered now, not once durable: the prepare is durable, so a crash before the
            # commit is leaves the xid prepared here and gone at the sender, a case the
            # recovery table commits (docs/routing-protocol.md §8.1); the sender's slot is
            # freed a durable write sooner. The answerer still waits for the write, in order
            # (the writes queued after it finish after it anyway): a link that ends waits
            # for it, and a failed commit closes the link.
            write = StoreWrite(stored)
            transaction.commit_nowait(write.finish)
            link.machine.committed(xid)
            link.wake()
            return write
        write = StoreWrite(committed)  # prepared by an earlier link (or run) of this peer
        await self.manager.resolve_prepared(xid, commit=True)
        write.finish(None)
        return write

    async def receive_nonxa(self, link: Link, state: LinkTransfer, seq: int, messages: tuple[bytes, ...]) -> StoreWrite:
        def committed(error: BaseException | None) -> None:
            if isinstance(error, MalformedMessage):  # the peer's (reported as such)
                raise error
            if error is not None:  # (non-XA cannot refuse: the link ends, the sender sends again in doubt)
                raise StoreError(f"routed messages not stored: {error}")
            state.messages_in += len(messages)
            link.machine.nonxa_committed(seq)
            link.wake()

        batch = InboundBatch(
            messages, StoreWrite(committed), lambda transaction, write: transaction.commit_nowait(write.finish)
        )
        self._admit(link, state, batch)
        return batch.write

    def _admit(self, link: Link, state: LinkTransfer, batch: InboundBatch) -> None:
        """Stage ``batch`` in a transaction of its own and hand it to the store. A target
        queue that is full is not a refusal (the sender would only send it again and again):
        the batch waits for room, and the batches after it on this link wait behind it (the
        order of a path is kept), while the link goes on committing what it prepared before
        (which makes the room). Its answer, and the sender's window slot, wait with it; the
        sender's rt$R fills and its flow control slows the producers. A batch larger than
        the queue's whole room goes in alone once the queue is empty (so its limits hold
        but for that one batch: waiting longer would never end). A limit the batch can never
        meet otherwise, or a failed store, finishes its write with the error."""
        if state.waiting and state.waiting[0] is not batch:
            state.waiting.append(batch)
            return
        while True:
            # memory-bound: above the router's memory budget it waits for room, as for a full queue
            transaction = batch.transaction = self.manager.transaction(memory_bound=True)
            counted = self.dropped, self.unroutable, self.expired  # (what staging counts, undone with it)
            try:
                for raw in batch.messages:
                    batch.write.delay_ms = max(batch.write.delay_ms, self._stage(transaction, raw, batch.alone))
                break
            except QueueFull as exc:
                transaction.rollback_nowait()
                self.dropped, self.unroutable, self.expired = counted
                full = self.manager.queues.get(exc.queue)
                if not batch.alone and full is not None and full.size == 0 and full.reserved == 0:
                    batch.alone = True
                    continue
                if not state.waiting:
                    state.waiting.append(batch)
                    state.full_waits += 1
                    log.info("routing link %s from %s: %s; its transactions wait for room", link.name, link.peer, exc)
                self.manager.when_room(exc.queue, lambda: self._room_made(link, state))
                return
            except (QueueError, StoreError) as exc:
                transaction.rollback_nowait()
                self._admitted(state, batch)
                batch.write.finish(exc)
                return
        self._admitted(state, batch)
        try:
            batch.store(transaction, batch.write)
        except (QueueError, StoreError) as exc:
            batch.write.finish(exc)

    @staticmethod
    def _admitted(state: LinkTransfer, batch: InboundBatch) -> None:
        if state.waiting and state.waiting[0] is batch:
            state.waiting.popleft()

    def _room_made(self, link: Link, state: LinkTransfer) -> None:
        """A queue a batch of ``link`` waits for may have room: the link's worker tries again
        (in a job of its own: this is called from inside a queue's bookkeeping)."""
        if state.live and state.waiting:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):  # (the link is ending)
                state.jobs.send_nowait((self._admit_waiting, (link, state)))

    async def _admit_waiting(self, link: Link, state: LinkTransfer) -> None:
        """The waiting batches of ``link``, oldest first, until one still finds no room."""
        while state.waiting:
            batch = state.waiting[0]
            self._admit(link, state, batch)
            if state.waiting and state.waiting[0] is batch:
                return
