"""Messages between routers (routing part 2): a dispatcher per destination, the inbound side.

Theory of operation
-------------------
A message for ``q@R`` (R another router) is accepted into the routing queue ``rt$R``; the
redirection's rewrite (:func:`routing_rewrite`) adds the routing annotations of
``docs/routing-protocol.md`` §12 on the way in (source, destination router, queue, hops).

**Sending.** One dispatcher task per routing queue consumes it. While the destination has a
route, it picks the link of the next hop (round robin: the next neighbour of the rotation,
per batch) whose window has room, takes up to the peer's ``inbound-transaction-size``
messages (and no more bytes than the peer's frame size allows) and:

- **XA**: acknowledges them in a local transaction, *prepares* it durably under a new xid
  (``routing:<local>:<peer>:<boot>-<n>``, sys$xa's convention) and sends TRANSACTION. When the peer answers that it
  prepared, the transaction commits (the messages leave ``rt$R``) and COMMIT tells the peer
  to commit. A link that ends leaves the prepared transactions for the recovery stage of
  the next link to that peer (:meth:`Transfer.recovery_received`): what the peer holds
  prepared is committed, the rest rolled back, so the messages go again (over any route):
  never lost, never twice.
- **Non-XA**: acknowledges them in a local transaction, sends NONXA_TRANSACTION and commits
  when the peer says it committed; a link that ends rolls them back, and they are sent
  again marked ``x-opt-martinet-doubt`` so that the target queue's duplicate detection
  drops a copy the peer already has. So are the messages a restart recovered in ``rt$R``
  (after a crash, the peer may have committed them).

Without a usable link the dispatcher waits for a change (:meth:`Transfer.changed`); the
messages wait in ``rt$R``.

**Receiving.** Each message goes to its queue when this router is its destination, else
into ``rt$<destination>`` (forwarded, hops + 1), or to ``unroutable`` with the reason in
``x-opt-martinet-unroutable`` (no such queue, no route on, too many hops); a message for a
temporary queue that is gone is dropped and counted. XA: all of a transaction is staged in
one local transaction, prepared under the sender's xid (durable), answered; committed on
COMMIT. Non-XA: committed at once, then answered. With inbound flow control the answer
waits for the largest flow-control delay of the target queues (:meth:`Transfer._throttle`).

**Time to live.** The rewrite gives a message with an expiry ``x-opt-martinet-expires``
(absolute, so it survives any number of hops and waits); a receiver past it stages the
message for its ``routerdlq`` in the same transaction, else reduces a header ``ttl`` to what
is left, so that every queue on the way expires it when the source's would have.

What a link's events ask for (prepare, commit, recover) is done by one worker per link, in
the order the events came, in that link's nursery (:meth:`~.links.Link.start_soon`): it
ends with the link, and a failure there closes the link with the reason (never the
router). Doing it in order is what keeps the order of messages along a path: the sender's
dispatcher sends its transactions in queue order, and the receiver prepares and commits
them in that order.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from martinet.messaging.codec import Symbol, Timestamp, UInt
from martinet.messaging.message import Message, MessageError
from martinet.swiftlets.queuemanager.api import (
    TEMPORARY_PREFIX,
    QueueError,
    QueueManager,
    QueueNotFound,
    Rewrite,
    Transaction,
)
from martinet.swiftlets.store.api import StoreError
from martinet.swiftlets.xa.api import (
    Claim,
    XAError,
    XAResourceManager,
    parse_routing_xid,
    routing_prefixes,
    routing_xid,
)

from .api import UNROUTABLE, Destination, routing_queue
from .exchange import MAX_PATH
from .links import Link
from .stages import (
    CommitDone,
    CommitReceived,
    NonXaCommitted,
    NonXaTransactionReceived,
    PrepareReceived,
    RecoveryReceived,
    RecoveryRequested,
    TransactionReceived,
    TransactionRefused,
)

__all__ = ["Transfer", "routing_rewrite", "SOURCE", "DESTINATION", "QUEUE", "HOPS", "DOUBT", "EXPIRES",
           "UNROUTABLE_REASON"]

log = logging.getLogger(__name__)

SOURCE = Symbol("x-opt-martinet-src")
DESTINATION = Symbol("x-opt-martinet-dest")
QUEUE = Symbol("x-opt-martinet-queue")
HOPS = Symbol("x-opt-martinet-hops")
DOUBT = Symbol("x-opt-martinet-doubt")
EXPIRES = Symbol("x-opt-martinet-expires")
UNROUTABLE_REASON = Symbol("x-opt-martinet-unroutable")

FRAME_OVERHEAD = 1024  # bytes of a TRANSACTION frame besides its messages (xid, field names, lengths)
REFUSED_BACKOFF = 1.0  # seconds a dispatcher waits after the peer refused a transaction
RATE_INTERVAL = 1.0  # seconds between samples of the links' message rates (the queues' interval)
STORE_BACKOFF = 1.0  # seconds a dispatcher waits after its own store failed a prepare


def routing_rewrite(local: str) -> Rewrite:
    """The redirection rewrite of ``%@R`` → ``rt$R``: a message entering the network here
    gets its routing annotations; one already travelling to ``address`` (forwarded) keeps
    them. One that arrived here by routing and is sent on somewhere else (a queue bridge)
    starts a new journey."""

    def rewrite(address: str, message: Message) -> Message:
        queue, _, router = address.rpartition("@")
        annotations = message.message_annotations
        if SOURCE in annotations and annotations.get(DESTINATION) == router and annotations.get(QUEUE) == queue:
            return message
        changes = {SOURCE: local, DESTINATION: router, QUEUE: queue, HOPS: UInt(0)}
        expires = message.queue_info(_now_ms())[2]  # the time to live counts end to end (§12)
        if expires is not None:
            changes[EXPIRES] = Timestamp(expires)
        return message.with_annotations(changes)

    return rewrite


def _now_ms() -> int:
    """Wall-clock milliseconds, the queues' clock for expiry (and the peers' too: routers
    that pass messages with a time to live need synchronised clocks, e.g. NTP)."""
    return int(time.time() * 1000)


def parties(xid: str) -> tuple[str, str] | None:
    """(sender, receiver) of a routing xid; None for another xid."""
    parsed = parse_routing_xid(xid)
    return (parsed.source, parsed.destination) if parsed is not None else None


@attrs.define
class _LinkTransfer:
    """What the transfer keeps per link."""

    inbound: dict[str, Transaction] = attrs.Factory(dict)  # xid → prepared, awaiting COMMIT
    nonxa_out: dict[int, Transaction] = attrs.Factory(dict)  # seq → sent, awaiting NONXA_COMMIT
    next_seq: int = 1
    reserved: int = 0  # window slots promised to dispatchers preparing a transaction
    jobs: Any = None  # the send side of the link's worker's queue
    claim: Claim | None = None  # this link's xids, claimed from sys$xa while the link lives
    messages_out: int = 0
    messages_in: int = 0
    out_rate: float = 0.0  # messages/s over the last RATE_INTERVAL, as a queue's send-rate
    in_rate: float = 0.0
    rate_mark: tuple[float, int, int] = (0.0, 0, 0)  # (when, messages_out, messages_in) of the last sample
    throttled: int = 0  # inbound transactions whose answer inbound flow control held back
    throttled_ms: int = 0  # for how long, in all

    def sample_rates(self, now: float) -> None:
        at, sent, received = self.rate_mark
        if now > at:
            self.out_rate = (self.messages_out - sent) / (now - at)
            self.in_rate = (self.messages_in - received) / (now - at)
        self.rate_mark = (now, self.messages_out, self.messages_in)


class Transfer:
    """The transfer of one router: its dispatchers and what its links receive.

    Args:
        local: this router's name.
        manager: the queue manager.
        destination: ``router -> Destination | None`` (the routing table).
        links: the operational links by peer (read, never changed here).
        nursery: where the dispatchers run (the swiftlet's).
        xa: sys$xa, which lists the prepared transactions in doubt: a link's xids are
            claimed while it lives (resolved here, not by an operator); None without it.
        inbound_flow_control: answer inbound transactions only after their target
            queues' flow-control delay (``inbound-flow-control-enabled``).
    """

    def __init__(self, local: str, manager: QueueManager, destination: Callable[[str], Destination | None],
                 links: dict[str, Link], nursery: trio.Nursery, xa: XAResourceManager | None = None, *,
                 inbound_flow_control: bool = False):
        self.local = local
        self.inbound_flow_control = inbound_flow_control
        self.manager = manager
        self._destination = destination
        self._links = links
        self._nursery = nursery
        self._xa = xa
        self._boot = secrets.token_hex(4)  # xids of this run differ from every earlier run's
        self._numbers = itertools.count(1)
        self._dispatchers: dict[str, trio.Event] = {}  # router → its wake-up
        self._outbound: dict[str, Transaction] = {}  # xid → prepared and sent, not yet committed
        self._state: dict[Link, _LinkTransfer] = {}
        self.dropped = 0  # messages for temporary queues that were gone
        self.unroutable = 0
        self.expired = 0  # messages found expired on arrival (dead-lettered here)
        nursery.start_soon(self._sample_rates_forever)

    # -- the swiftlet's calls ---------------------------------------------------------------

    def destination_added(self, router: str) -> None:
        """Make sure ``rt$R`` has a dispatcher (it stays when R goes: it then waits)."""
        if router not in self._dispatchers:
            self._dispatchers[router] = trio.Event()
            self._nursery.start_soon(self._dispatch, router)

    def changed(self) -> None:
        """Routes, links or windows changed: every dispatcher looks again."""
        for wakeup in self._dispatchers.values():
            wakeup.set()

    def link_gone(self, link: Link) -> None:
        """Non-XA transactions sent over ``link`` go back to their queue (sent again, in
        doubt); XA ones stay prepared for the recovery with that peer."""
        state = self._state.pop(link, None)
        if state is not None:
            for transaction in state.nonxa_out.values():
                transaction.rollback_nowait()
            if state.claim is not None:  # what is still prepared is in doubt until the peer is back
                state.claim.release()
        self.changed()

    def usage(self, link: Link) -> dict[str, Any]:
        state = self._state.get(link)
        if state is None:
            return {}
        return {"messages-out": state.messages_out, "messages-in": state.messages_in,
                "messages-out-rate": round(state.out_rate, 1), "messages-in-rate": round(state.in_rate, 1),
                "inbound-throttled": state.throttled, "inbound-throttled-ms": state.throttled_ms,
                "open-transactions": link.machine.open_transactions,
                "in-doubt": sum(1 for xid in self.manager.prepared_transactions() if link.peer in (parties(xid) or ()))}

    async def _sample_rates_forever(self) -> None:
        while True:
            await trio.sleep(RATE_INTERVAL)
            now = trio.current_time()
            for state in self._state.values():
                state.sample_rates(now)

    def event(self, link: Link, event: Any) -> None:
        """Handle a transfer event of ``link``'s machine: the work is queued for the link's
        one worker, so that it happens in the order the events came (transactions become
        visible at the receiver in the order they were sent: the order of a path is kept)."""
        state = self._link(link)
        job: tuple[Callable[..., Any], tuple[Any, ...]] | None = None
        if isinstance(event, (PrepareReceived, TransactionRefused, NonXaCommitted, CommitDone)):
            self.changed()  # a window slot is free again
        if isinstance(event, PrepareReceived):
            job = self._commit_outbound, (link, event.xid)
        elif isinstance(event, TransactionReceived):
            job = self._prepare_inbound, (link, state, event.xid, event.messages)
        elif isinstance(event, CommitReceived):
            job = self._commit_inbound, (link, state, event.xid, event.recovery)
        elif isinstance(event, TransactionRefused):
            job = self._refused, (link, event.xid, event.reason)
        elif isinstance(event, NonXaTransactionReceived):
            job = self._receive_nonxa, (link, state, event.seq, event.messages)
        elif isinstance(event, NonXaCommitted):
            job = self._nonxa_committed, (state, event.seq)
        elif isinstance(event, RecoveryRequested):
            inbound = [xid for xid in self.manager.prepared_transactions() if parties(xid) == (event.peer, self.local)]
            link.machine.recovery_list(inbound)
        elif isinstance(event, RecoveryReceived):
            job = self._recover, (link, event.peer, event.xids)
        if job is not None:
            state.jobs.send_nowait(job)

    def _link(self, link: Link) -> _LinkTransfer:
        """The transfer's state of ``link``, made (with the link's worker) on first use."""
        state = self._state.get(link)
        if state is None:
            state = self._state[link] = _LinkTransfer(rate_mark=(trio.current_time(), 0, 0))
            if self._xa is not None and link.peer is not None:
                try:
                    state.claim = self._xa.claim("routing", *routing_prefixes(self.local, link.peer))
                except XAError as exc:  # a second link to the peer, about to be closed
                    log.debug("routing link %s: xids not claimed: %s", link.name, exc)
            send, receive = trio.open_memory_channel[tuple[Callable[..., Any], tuple[Any, ...]]](math.inf)
            state.jobs = send
            link.start_soon(self._work, link, receive)
        return state

    async def _work(self, link: Link, jobs: trio.MemoryReceiveChannel[tuple[Callable[..., Any], tuple[Any, ...]]]
                    ) -> None:
        """The link's worker: its transfer jobs one after the other; a failure closes the
        link (recovery sorts out what was in flight), never the router."""
        async for function, args in jobs:
            try:
                await function(*args)
            except (QueueError, StoreError, MessageError) as exc:
                log.error("routing link %s to %s: %s; the link is closed", link.name, link.peer, exc)
                link.close(f"transfer failed at {self.local}: {exc}")
                return
            except Exception as exc:  # a bug: this link ends, the router goes on
                log.exception("routing link %s to %s: transfer failed", link.name, link.peer)
                link.close(f"transfer failed at {self.local}: {type(exc).__name__}")
                return

    # -- sending ----------------------------------------------------------------------------

    def _choose(self, router: str, turn: int) -> Link | None:
        """The link a batch for ``router`` goes over now, or None (no route, or no room)."""
        row = self._destination(router)
        if row is None or not row.active:
            return None
        start = turn % len(row.rotation)  # (the rotation is just the next hop without round robin)
        for neighbour in row.rotation[start:] + row.rotation[:start]:
            link = self._links.get(neighbour)
            if link is not None and link.machine.window_available - self._link(link).reserved > 0:
                return link
        return None

    async def _dispatch(self, router: str) -> None:
        """Move what arrives in ``rt$R`` towards R, for as long as the swiftlet runs (a
        failure is logged and ends this dispatcher only)."""
        try:
            await self._dispatch_forever(router)
        except Exception:
            log.exception("the dispatcher of %s stopped; messages for router %s wait there",
                          routing_queue(router), router)

    async def _dispatch_forever(self, router: str) -> None:
        queue = self.manager.queue(routing_queue(router), create=True)
        # What is here already was recovered at a restart: the run before may have sent it
        # (non-XA: possibly committed by the peer), so it goes marked in doubt like a resend.
        recovered = max((entry.id for entry in queue.browse()), default=0)
        consumer = queue.consumer(owner=self)
        consumer.notify = lambda: self._dispatchers[router].set()
        turn = 0
        try:
            while True:
                wakeup = self._dispatchers[router]
                link = self._choose(router, turn)
                size = link.operational.peer_transaction_size if link and link.operational else 0
                consumer.set_credit(size)
                entries = consumer.take(size) if link else []
                if not entries:  # no link with room, or nothing to send: wait for a change
                    await wakeup.wait()
                    self._dispatchers[router] = trio.Event()
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
                self._to_unroutable_now(consumer, entry, f"message of {size} bytes is larger than the frames "
                                        f"router {link.peer} accepts ({link.machine.peer_max_frame_size})")
            elif size > room:
                consumer.release(entry)
            else:
                room -= size
                taken.append(entry)
        return taken

    def _to_unroutable_now(self, consumer: Any, entry: Any, reason: str) -> None:
        try:
            self.manager.send_nowait(UNROUTABLE, entry.message.with_annotations({UNROUTABLE_REASON: reason}))
        except (QueueError, MessageError) as exc:
            log.error("message %s: %s, and unroutable refused it: %s", entry.id, reason, exc)
            consumer.release(entry)
            return
        consumer.accept(entry)
        self.unroutable += 1
        log.warning("message %s to unroutable: %s", entry.id, reason)

    async def _send(self, link: Link, consumer: Any, entries: list[Any], router: str, recovered: int) -> None:
        assert link.peer is not None
        state = self._link(link)
        transaction = self.manager.transaction()
        for entry in entries:
            transaction.acknowledge(consumer, entry)
        if not link.machine.use_xa:
            doubt = [entry.message.with_annotations({DOUBT: True}).raw
                     if entry.redelivered or entry.id <= recovered else entry.message.raw for entry in entries]
            seq, state.next_seq = state.next_seq, state.next_seq + 1
            if link.machine.send_nonxa(seq, doubt):
                state.nonxa_out[seq] = transaction
                state.messages_out += len(entries)
                link.wake()
            else:
                transaction.rollback_nowait()
            return
        xid = routing_xid(self.local, link.peer, f"{self._boot}-{next(self._numbers)}")
        state.reserved += 1
        try:
            await transaction.prepare(xid)
        except StoreError as exc:
            log.error("routing transaction to %s not prepared, the messages stay in %s: %s", link.peer,
                      routing_queue(router), exc)
            transaction.rollback_nowait()
            failed = True
        else:
            failed = False
        finally:
            state.reserved -= 1
        if failed:  # a stopped store fails at once: without a pause the loop would never yield
            await trio.sleep(STORE_BACKOFF)  # (and the router could not stop)
            return
        if link.machine.send_transaction(xid, [entry.message.raw for entry in entries]):
            self._outbound[xid] = transaction
            state.messages_out += len(entries)
            link.wake()
        else:  # the link ended meanwhile: the peer never had it
            await transaction.rollback()

    async def _commit_outbound(self, link: Link, xid: str) -> None:
        transaction = self._outbound.pop(xid)
        await transaction.commit()
        link.machine.commit(xid)
        link.wake()

    async def _refused(self, link: Link, xid: str, reason: str) -> None:
        log.warning("router %s refused routing transaction %s, it is sent again: %s", link.peer, xid, reason)
        await self._outbound.pop(xid).rollback()
        await trio.sleep(REFUSED_BACKOFF)
        self.changed()

    async def _nonxa_committed(self, state: _LinkTransfer, seq: int) -> None:
        await state.nonxa_out.pop(seq).commit()

    async def _recover(self, link: Link, peer: str, listed: tuple[str, ...]) -> None:
        """The three-case table for this router's prepared transactions towards ``peer``."""
        listed_set = set(listed)
        for xid in [x for x in self.manager.prepared_transactions() if parties(x) == (self.local, peer)]:
            self._outbound.pop(xid, None)
            commit = xid in listed_set
            await self.manager.resolve_prepared(xid, commit=commit)
            log.info("routing transaction %s to %s %s in recovery", xid, peer, "committed" if commit else
                     "rolled back (its messages go again)")
        link.machine.recovery_done(commit=list(listed))
        link.wake()
        self.changed()

    # -- receiving --------------------------------------------------------------------------

    def _stage(self, transaction: Transaction, raw: bytes) -> int:
        """Stage one received message where it goes; the flow-control delay (ms) of the
        queue it goes to (0 when it is dropped or goes to unroutable)."""
        try:
            message = Message(raw)
            annotations = message.message_annotations
        except MessageError as exc:
            log.warning("a routed message could not be read, it is dropped: %s", exc)
            return 0
        destination, queue, hops = annotations.get(DESTINATION), annotations.get(QUEUE), annotations.get(HOPS, 0)
        if not isinstance(destination, str) or not isinstance(queue, str) or not isinstance(hops, int):
            return self._unroutable(transaction, message, "it has no routing annotations")
        message = message.with_annotations({HOPS: UInt(hops + 1)})
        expires = annotations.get(EXPIRES)
        if isinstance(expires, int):
            remaining = expires - _now_ms()
            if remaining <= 0:
                self.expired += 1
                log.info("a routed message for %s@%s expired in transit, %d ms before it reached router %s; "
                         "to routerdlq", queue, destination, -remaining, self.local)
                transaction.dead_letter(message, f"expired in transit: found at router {self.local} "
                                        f"{-remaining} ms after its expiry", f"{queue}@{destination}")
                return 0
            if message.header_fields()[2]:  # a ttl counts from each arrival: what is left of it
                message = message.with_ttl(remaining)
        possible_duplicate = bool(annotations.get(DOUBT, False))
        if destination == self.local:
            if queue.startswith(TEMPORARY_PREFIX) and queue not in self.manager.queues:
                self.dropped += 1  # its requester is gone
                return 0
            try:
                return transaction.send(queue, message, possible_duplicate=possible_duplicate).delay_ms
            except QueueNotFound as exc:
                return self._unroutable(transaction, message, str(exc))
        elif hops + 1 >= MAX_PATH:
            return self._unroutable(transaction, message, f"it passed {hops + 1} routers (a loop?)")
        elif self._destination(destination) is None:
            return self._unroutable(transaction, message,
                                    f"router {destination!r} is not known to router {self.local!r}")
        else:
            # forwarded as it is, in doubt or not: only the target queue drops duplicates. A
            # routing queue may see a message twice without a duplicate (a path that changed
            # mid-transfer, a → b → a → c): its backlog there would drop the only copy
            return transaction.send(f"{queue}@{destination}", message).delay_ms

    def _unroutable(self, transaction: Transaction, message: Message, reason: str) -> int:
        transaction.send(UNROUTABLE, message.with_annotations({UNROUTABLE_REASON: reason}))
        self.unroutable += 1
        log.warning("a routed message went to unroutable on router %s: %s", self.local, reason)
        return 0

    async def _throttle(self, state: _LinkTransfer, delay_ms: int) -> None:
        """Inbound flow control: hold the answer to a transaction by the largest
        flow-control delay of its target queues. Awaited in the link's worker, so answers
        keep their order (and so the messages theirs); the sender's window fills, its
        ``rt$R`` grows and its own flow control slows its producers."""
        if delay_ms and self.inbound_flow_control:
            state.throttled += 1
            state.throttled_ms += delay_ms
            await trio.sleep(delay_ms / 1000)

    async def _prepare_inbound(self, link: Link, state: _LinkTransfer, xid: str,
                               messages: tuple[bytes, ...]) -> None:
        transaction = self.manager.transaction()
        delay_ms = 0
        try:
            for raw in messages:
                delay_ms = max(delay_ms, self._stage(transaction, raw))
            await transaction.prepare(xid)
        except (QueueError, StoreError) as exc:  # e.g. a full queue: the sender tries again later
            if transaction.state == "active":
                transaction.rollback_nowait()
            link.machine.refuse_transaction(xid, str(exc))
            link.wake()
            return
        state.inbound[xid] = transaction
        state.messages_in += len(messages)
        await self._throttle(state, delay_ms)
        link.machine.prepared(xid)
        link.wake()

    async def _commit_inbound(self, link: Link, state: _LinkTransfer, xid: str, recovery: bool) -> None:
        transaction = state.inbound.pop(xid, None)
        if transaction is not None:
            await transaction.commit()
        else:  # prepared by an earlier link (or run) of this peer
            await self.manager.resolve_prepared(xid, commit=True)
        if recovery:
            log.info("routing transaction %s from %s committed in recovery", xid, link.peer)
        link.machine.committed(xid)
        link.wake()

    async def _receive_nonxa(self, link: Link, state: _LinkTransfer, seq: int, messages: tuple[bytes, ...]) -> None:
        transaction = self.manager.transaction()
        delay_ms = 0
        for raw in messages:
            delay_ms = max(delay_ms, self._stage(transaction, raw))
        await transaction.commit()
        state.messages_in += len(messages)
        await self._throttle(state, delay_ms)
        link.machine.nonxa_committed(seq)
        link.wake()
