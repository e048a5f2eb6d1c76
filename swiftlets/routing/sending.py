"""The sending half of a router's transfer: a dispatcher per routing queue ``rt$R`` moves
what arrives there towards R, over the link of the next hop whose window has room (round
robin per batch), in batches of up to the peer's ``inbound-transaction-size`` (and no more
bytes than the peer's frame size allows; a message that can never fit goes to
``unroutable``). XA: a batch is acknowledged in a local transaction prepared durably under a
new xid and sent once the prepare is durable, in queue order; when the peer prepared, it
commits and COMMIT tells the peer. Non-XA: NONXA_TRANSACTION, committed when the peer says
it committed; what is sent again (a cut link's rollback, or recovered at a restart) is marked
in doubt so that the target's duplicate detection drops a copy the peer already has. The
recovery of a link resolves this router's prepared transactions towards its peer by the
three-case table: what the peer lists is committed, the rest rolled back (sent again).
:mod:`.transfer` drives it: the links' events and per-link state are there."""

from __future__ import annotations

import itertools
import logging
import secrets
from typing import TYPE_CHECKING, Any

import trio

from martinet.messaging.message import MessageError
from martinet.swiftlets.queuemanager.api import QueueError, QueueManager, Transaction
from martinet.swiftlets.store.api import StoreError
from martinet.swiftlets.xa.api import routing_xid

from .api import UNROUTABLE, routing_queue
from .links import Link
from .linkwork import UNROUTABLE_REASON, LinkTransfer, StoreWrite, parties
from .routing_annotations import DOUBT
from .stages import State

if TYPE_CHECKING:
    from .transfer import Transfer

__all__ = ["Sending"]

log = logging.getLogger(__name__)

FRAME_OVERHEAD = 1024  # bytes of a TRANSACTION frame besides its messages (xid, field names, lengths)
REFUSED_BACKOFF = 1.0  # seconds a dispatcher waits after the peer refused a transaction
STORE_BACKOFF = 1.0  # seconds a dispatcher waits after its own store failed a prepare


class Sending:
    """The dispatchers' side of ``transfer``: what they prepared and sent, by xid, until
    committed (``outbound``), and how many messages could never fit the peer's frames."""

    def __init__(self, transfer: Transfer, local: str, manager: QueueManager):
        self._transfer = transfer
        self.local = local
        self._manager = manager
        self._boot = secrets.token_hex(4)  # xids of this run differ from every earlier run's
        self._numbers = itertools.count(1)
        self._outbound: dict[str, Transaction] = {}  # xid → prepared and sent, not yet committed
        self.unroutable_here = 0  # messages that could never fit the peer's frames
        self._paused_until = 0.0  # after the store failed a prepare: a stopped store fails at once,
        # and without a pause the dispatchers would never yield (and the router could not stop)

    def _choose(self, router: str, turn: int) -> Link | None:
        """The link a batch for ``router`` goes over now, or None (no route, or no room)."""
        row = self._transfer.destination(router)
        if row is None or not row.active:
            return None
        start = turn % len(row.rotation)  # (the rotation is just the next hop without round robin)
        for neighbour in row.rotation[start:] + row.rotation[:start]:
            link = self._transfer.links.get(neighbour)
            if link is not None and self._room(link) > 0:
                return link
        return None

    def _room(self, link: Link) -> int:
        """How many more batches a dispatcher may start on ``link``: its free window and (XA)
        one window more, prepared ahead so that the sender's durable prepare overlaps the
        peer's; less those being prepared or ready."""
        machine = link.machine
        if machine.state is not State.OPERATIONAL or link.operational is None:
            return 0
        # one start window ahead, not one of the grown window: what is prepared ahead is held
        # in rt$R's transactions, and a window grown to thousands of messages would hold
        # that many more (past rt$R's cache, swapped out and read back)
        ahead = link.operational.peer_window_size if machine.use_xa else 0
        return machine.window_available + ahead - self._transfer.link_state(link).reserved

    def send_ready(self, link: Link, state: LinkTransfer) -> None:
        """Send the prepared batches of ``link``, oldest first, while its window has room;
        once the link has ended (or is gone), roll them back (the peer never had them)."""
        try:
            while state.ready:
                gone = self._transfer.state_of(link) is not state or link.machine.state is not State.OPERATIONAL
                if not gone and not link.machine.window_available:
                    return
                xid, transaction, messages = state.ready.popleft()
                state.reserved -= 1
                if not gone and link.machine.send_transaction(xid, messages):
                    state.sent(xid, link.machine.window_available)
                    self._outbound[xid] = transaction
                    state.messages_out += len(messages)
                    link.wake()
                else:
                    self._transfer.nursery.start_soon(self._roll_back_unsent, transaction, link.peer)
        except Exception as exc:  # (called by the store or the link's reader: not their problem)
            self._transfer.failed(link, exc)

    async def dispatch_forever(self, router: str) -> None:
        queue = self._manager.queue(routing_queue(router), create=True)
        # What is here already was recovered at a restart: the run before may have sent it
        # (non-XA: possibly committed by the peer), so it goes marked in doubt like a resend.
        recovered = max((entry.id for entry in queue.browse()), default=0)
        consumer = queue.consumer(owner=self._transfer)
        consumer.notify = lambda: self._transfer.wakeups_of[router].set()
        turn = 0
        try:
            while True:
                if trio.current_time() < self._paused_until:
                    await trio.sleep_until(self._paused_until)
                wakeup = self._transfer.wakeups_of[router]
                link = self._choose(router, turn)
                if link is None:
                    # hold nothing while no link takes it: what a rollback gives back to the
                    # queue (a cut link's transactions) then goes out before what came after it
                    consumer.set_credit(0)
                    for entry in consumer.take(consumer.buffered):
                        consumer.release(entry)
                    entries = []
                else:
                    assert link.operational is not None
                    size = link.operational.peer_transaction_size
                    consumer.set_credit(size)
                    entries = consumer.take(size)
                if not entries:  # no link with room, or nothing to send: wait for a change
                    await wakeup.wait()
                    self._transfer.wakeups_of[router] = trio.Event()
                    continue
                assert link is not None
                entries = self._fitting(consumer, entries, link)
                if entries:
                    turn += 1  # round robin rotates per batch sent
                    await self._send(link, consumer, entries, router, recovered)
        finally:
            consumer.close()

    def _fitting(self, consumer: Any, entries: list[Any], link: Link) -> list[Any]:
        """As many of ``entries`` as fit one frame of the peer; the rest go back. A message
        that can never fit goes to unroutable."""
        limit = link.machine.peer_max_frame_size - FRAME_OVERHEAD
        room = limit
        taken: list[Any] = []
        for entry in entries:
            size = len(entry.message.raw) + 8
            if size > limit:
                self._to_unroutable_now(
                    consumer,
                    entry,
                    f"message of {size} bytes is larger than the frames "
                    f"router {link.peer} accepts ({link.machine.peer_max_frame_size})",
                )
            elif size > room:
                consumer.release(entry)
            else:
                room -= size
                taken.append(entry)
        return taken

    def _to_unroutable_now(self, consumer: Any, entry: Any, reason: str) -> None:
        try:
            self._manager.send_nowait(UNROUTABLE, entry.message.with_annotations({UNROUTABLE_REASON: reason}))
        except (QueueError, MessageError) as exc:
            log.error("message %s: %s, and unroutable refused it: %s", entry.id, reason, exc)
            consumer.release(entry)
            return
        consumer.accept(entry)
        self.unroutable_here += 1
        log.warning("message %s to unroutable: %s", entry.id, reason)

    async def _send(self, link: Link, consumer: Any, entries: list[Any], router: str, recovered: int) -> None:
        assert link.peer is not None
        state = self._transfer.link_state(link)
        transaction = self._manager.transaction()
        for entry in entries:
            transaction.acknowledge(consumer, entry)
        if not link.machine.use_xa:
            doubt = [
                entry.message.with_annotations({DOUBT: True}).raw
                if entry.redelivered or entry.id <= recovered
                else entry.message.raw
                for entry in entries
            ]
            seq, state.next_seq = state.next_seq, state.next_seq + 1
            if link.machine.send_nonxa(seq, doubt):
                state.sent(seq, link.machine.window_available)
                state.nonxa_out[seq] = transaction
                state.messages_out += len(entries)
                link.wake()
            else:
                transaction.rollback_nowait()
            return
        xid = routing_xid(self.local, link.peer, f"{self._boot}-{next(self._numbers)}")
        messages = [entry.message.raw for entry in entries]

        def prepared(error: BaseException | None) -> None:
            # called by the store, in the order the prepares were queued: the TRANSACTIONs
            # of a link go out in queue order
            self._transfer.changed()
            if error is not None:
                not_prepared(error)
                return
            state.ready.append((xid, transaction, messages))
            self.send_ready(link, state)

        def not_prepared(error: BaseException) -> None:
            state.reserved -= 1
            log.error(
                "routing transaction to %s not prepared, the messages stay in %s: %s",
                link.peer,
                routing_queue(router),
                error,
            )
            transaction.rollback_nowait()
            self._paused_until = trio.current_time() + STORE_BACKOFF

        state.reserved += 1
        try:
            transaction.prepare_nowait(xid, prepared, transient_in_memory=True)
        except StoreError as exc:
            not_prepared(exc)

    async def _roll_back_unsent(self, transaction: Transaction, peer: str | None) -> None:
        try:
            await transaction.rollback()
        except StoreError as exc:  # the store stops the router; the recovery would roll it back
            log.error("a routing transaction to %s not rolled back: %s", peer, exc)

    async def commit_outbound(self, link: Link, xid: str) -> StoreWrite:
        def committed(error: BaseException | None) -> None:
            if error is not None:
                raise StoreError(f"routing transaction {xid} not committed: {error}")
            link.machine.commit(xid)
            link.wake()

        write = StoreWrite(committed)
        self._outbound.pop(xid).commit_nowait(write.finish)
        return write

    async def refused(self, link: Link, xid: str, reason: str) -> None:
        log.warning(
            "router %s refused routing transaction %s, it is sent again in %.0f s: %s",
            link.peer,
            xid,
            REFUSED_BACKOFF,
            reason,
        )
        transaction = self._outbound.pop(xid)
        await transaction.rollback()
        state = self._transfer.link_state(link)
        state.refused += 1
        state.messages_out -= sum(transaction.acknowledgements.values())  # (counted when sent; not taken)
        link.start_soon(self._changed_after, REFUSED_BACKOFF)  # (not here: the link's other answers go on)

    async def _changed_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self._transfer.changed()

    async def nonxa_committed(self, state: LinkTransfer, seq: int) -> StoreWrite:
        def committed(error: BaseException | None) -> None:
            if error is not None:
                raise StoreError(f"routed messages not acknowledged: {error}")

        write = StoreWrite(committed)
        state.nonxa_out.pop(seq).commit_nowait(write.finish)
        return write

    async def recover(self, link: Link, peer: str, listed: tuple[str, ...]) -> None:
        """The three-case table for this router's prepared transactions towards ``peer``."""
        listed_set = set(listed)
        for xid in [x for x in self._manager.prepared_transactions() if parties(x) == (self.local, peer)]:
            self._outbound.pop(xid, None)
            commit = xid in listed_set
            await self._manager.resolve_prepared(xid, commit=commit)
            log.info(
                "routing transaction %s to %s %s in recovery",
                xid,
                peer,
                "committed" if commit else "rolled back (its messages go again)",
            )
        link.machine.recovery_done(commit=list(listed))
        link.wake()
        self._transfer.changed()
