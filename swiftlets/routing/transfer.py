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

**Pipelining.** The store writes of a link are *queued* in order, not awaited one by one:
the worker queues a transaction's prepare or commit (``prepare_nowait``/``commit_nowait``)
and goes on with the next event; the store's group commit makes them durable together,
in the order queued (its contract), and a second task per link, the *answerer*, waits for
each write in that order and then answers the peer (PREPARE_REPLY, COMMIT_REPLY,
NONXA_COMMIT, or our COMMIT after the peer prepared). A write that is done when queued (a
non-persistent batch, prepared in memory) is answered by the worker itself when the answerer
has nothing left, and both write the answers out before they wait (:meth:`Link.flush`):
each task switch on the way of an answer costs a busy router's whole batch of runnable
tasks, and the answers' round trip is what bounds a link (the window). Messages become visible in queue
order because the store finishes writes in order (the queue manager applies a commit when
its write is durable); a non-persistent non-XA batch has nothing to write and is visible
at once, so it may pass a persistent one still being written (as JMS allows). The
dispatcher likewise queues the prepare of a batch and takes the next one while the link
has window; the TRANSACTION goes out when the prepare is durable, in order. A link that
ends waits (shielded) for the writes it queued, so that a new link's recovery never sees
a transaction half way. The delay of inbound flow control is awaited by the answerer,
before the answer.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import math
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

from martinet.messaging.codec import Symbol, Timestamp, UInt
from martinet.messaging.message import AnnotationPatch, Message, MessageError
from martinet.swiftlets.queuemanager.api import (
    TEMPORARY_PREFIX,
    QueueError,
    QueueFull,
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

from . import routing_annotations
from .api import UNROUTABLE, Destination, routing_queue
from .exchange import MAX_PATH
from .links import Link
from .routing_annotations import DESTINATION, DOUBT, EXPIRES, HOPS, QUEUE, SOURCE
from .stages import (
    CommitDone,
    CommitReceived,
    NonXaCommitted,
    NonXaTransactionReceived,
    PrepareReceived,
    RecoveryReceived,
    RecoveryRequested,
    State,
    TransactionReceived,
    TransactionRefused,
)
from .window import WindowController

__all__ = [
    "Transfer",
    "routing_rewrite",
    "SOURCE",
    "DESTINATION",
    "QUEUE",
    "HOPS",
    "DOUBT",
    "EXPIRES",
    "UNROUTABLE_REASON",
]

log = logging.getLogger(__name__)

UNROUTABLE_REASON = Symbol("x-opt-martinet-unroutable")
_REWRITTEN_KEYS = re.compile(b"|".join(re.escape(key.encode()) for key in (SOURCE, DESTINATION, QUEUE, HOPS)))

FRAME_OVERHEAD = 1024  # bytes of a TRANSACTION frame besides its messages (xid, field names, lengths)
REFUSED_BACKOFF = 1.0  # seconds a dispatcher waits after the peer refused a transaction
STORE_BACKOFF = 1.0  # seconds a dispatcher waits after its own store failed a prepare
RATE_INTERVAL = 1.0  # seconds between samples of the links' message rates (the queues' interval)
PATCHES_KEPT = 1024  # addresses whose annotation patch a rewrite keeps (a patch costs more than its use)
SECTION_KEPT_BYTES = 1024  # annotation sections larger than this are rewritten each time, not kept


def routing_rewrite(local: str) -> Rewrite:
    """The redirection rewrite of ``%@R`` → ``rt$R``: a message entering the network here
    gets its routing annotations; one already travelling to ``address`` (forwarded) keeps
    them. One that arrived here by routing and is sent on somewhere else (a queue bridge)
    starts a new journey. The encoded annotations are made once per address (the latest
    :data:`PATCHES_KEPT`); a message with an expiry also gets ``x-opt-martinet-expires``."""
    patches: dict[str, tuple[str, str, AnnotationPatch]] = {}  # address → (queue, router, patch)
    sections = routing_annotations.HopCounter()  # a forwarded batch mostly shares one section
    # (address, message-annotations section in) → the section out (None: the message stays
    # as it is): a producer's messages share their annotations (its client id), so the
    # section is rewritten once, and each message only has its bytes spliced
    rewritten: dict[tuple[str, bytes], bytes | None] = {}

    def rewrite(address: str, message: Message) -> Message:
        raw = message.raw
        where = message.annotations_span()  # (placed by a patch on the way in: no scan)
        if where is None or type(raw) is not bytes:
            annotated = annotate(address, message)
            return annotated if annotated is message else _expiring(annotated)
        start, end = where
        key = (address, raw[start:end])
        if key in rewritten:
            section = rewritten[key]
            if section is None:
                return message
            return _expiring(
                Message.with_annotations_at(raw[:start] + section + raw[end:], start, start + len(section))
            )
        annotated = annotate(address, message)
        span = annotated.annotations_span()
        if (annotated is message or span is not None) and end - start <= SECTION_KEPT_BYTES:
            if len(rewritten) >= PATCHES_KEPT:
                rewritten.clear()
            rewritten[key] = None if span is None else annotated.raw[span[0] : span[1]]
        return annotated if annotated is message else _expiring(annotated)

    def annotate(address: str, message: Message) -> Message:
        known = patches.get(address)
        if known is None:
            if len(patches) >= PATCHES_KEPT:
                patches.clear()
            queue, _, router = address.rpartition("@")
            patch = AnnotationPatch({SOURCE: local, DESTINATION: router, QUEUE: queue, HOPS: UInt(0)})
            known = patches[address] = queue, router, patch
        queue, router, patch = known
        # a message without their text in its annotations has none of these keys: nothing
        # decoded (one scan for the four, of the annotations alone when a patch placed them)
        raw = message.raw
        where = message.annotations_span()
        found = _REWRITTEN_KEYS.search(raw) if where is None else _REWRITTEN_KEYS.search(raw, *where)
        absent = type(raw) is bytes and found is None
        if not absent:
            fields = sections.fields(raw)
            if fields is None:  # (not by the short path)
                annotations = message.message_annotations
                source, destination, to = annotations.get(SOURCE), annotations.get(DESTINATION), annotations.get(QUEUE)
            else:
                source, destination, to = fields.source, fields.destination, fields.queue
            if source is not None and destination == router and to == queue:
                return message
        return patch.apply(message, absent=absent)

    def _expiring(message: Message) -> Message:
        expires = message.queue_info(_now_ms(), peek=True)[2]  # the time to live counts end to end (§12)
        return message if expires is None else message.with_annotations({EXPIRES: Timestamp(expires)})

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
    reserved: int = 0  # batches being prepared or ready, not yet sent
    ready: collections.deque[tuple[str, Transaction, list[bytes]]] = attrs.Factory(collections.deque)
    jobs: Any = None  # the send side of the link's worker's queue
    writes: Any = None  # the send side of the answerer's queue (:class:`_Write`, in the order queued)
    unanswered: int = 0  # writes in the answerer's queue, or being answered
    claim: Claim | None = None  # this link's xids, claimed from sys$xa while the link lives
    messages_out: int = 0
    messages_in: int = 0
    out_rate: float = 0.0  # messages/s over the last RATE_INTERVAL, as a queue's send-rate
    in_rate: float = 0.0
    rate_mark: tuple[float, int, int] = (0.0, 0, 0)  # (when, messages_out, messages_in) of the last sample
    throttled: int = 0  # inbound transactions whose answer inbound flow control held back
    throttled_ms: int = 0  # for how long, in all
    window: WindowController | None = None  # sizes the send window to the link, from the first answer on
    sent_at: dict[str | int, float] = attrs.Factory(dict)  # key → when sent, while it awaits its answer
    full_at: float = -math.inf  # when a send last found the window full (the sender had more than it allowed)
    waiting: collections.deque[_Inbound] = attrs.Factory(collections.deque)  # inbound batches waiting for room
    full_waits: int = 0  # times a batch found its target queue full and waited
    refused: int = 0  # our transactions the peer refused (rolled back here, sent again)

    def sent(self, key: str | int, window_available: int) -> None:
        """Our transaction ``key`` went out; ``window_available``: the room left after it."""
        self.sent_at[key] = now = trio.current_time()
        if not window_available:
            self.full_at = now

    def sample_rates(self, now: float) -> None:
        at, sent, received = self.rate_mark
        if now > at:
            self.out_rate = (self.messages_out - sent) / (now - at)
            self.in_rate = (self.messages_in - received) / (now - at)
        self.rate_mark = (now, self.messages_out, self.messages_in)


@attrs.define(eq=False)
class _Write:
    """A store write a link's worker queued: once it is durable (``error`` None) or failed,
    the link's answerer waits ``delay_ms`` (inbound flow control) and calls ``then(error)``,
    in the order the writes were queued."""

    then: Callable[[BaseException | None], None]
    delay_ms: int = 0
    done: trio.Event = attrs.Factory(trio.Event)
    error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self.done.set()


@attrs.define(eq=False)
class _Inbound:
    """An inbound batch (an XA transaction or a non-XA batch) to stage: ``store`` hands the
    staged transaction to the store (prepare or commit), which finishes ``write``."""

    messages: tuple[bytes, ...]
    write: _Write
    store: Callable[[Transaction], None]
    transaction: Transaction | None = None
    alone: bool = False  # larger than its empty queue's room: staged without its limits


Job = tuple[Callable[..., Any], tuple[Any, ...]]
T = TypeVar("T")


async def _next(channel: trio.MemoryReceiveChannel[T], link: Link) -> T:
    """The next item, waiting (a checkpoint) only when none is queued: what is ready is
    handled in one go, and the answers it causes leave in one write, at once, before the wait
    (:meth:`Link.flush`)."""
    try:
        return channel.receive_nowait()
    except trio.WouldBlock:
        link.flush()
        return await channel.receive()


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

    def __init__(
        self,
        local: str,
        manager: QueueManager,
        destination: Callable[[str], Destination | None],
        links: dict[str, Link],
        nursery: trio.Nursery,
        xa: XAResourceManager | None = None,
        *,
        inbound_flow_control: bool = False,
    ):
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
        self._hops = routing_annotations.HopCounter()
        self.dropped = 0  # messages for temporary queues that were gone
        self.unroutable = 0
        self.expired = 0  # messages found expired on arrival (dead-lettered here)
        self._paused_until = 0.0  # after the store failed a prepare: a stopped store fails at once,
        # and without a pause the dispatchers would never yield (and the router could not stop)
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

    def drained(self) -> bool:
        """No non-persistent message waits for an active destination, and none of our
        transactions is on its way (being prepared, sent, or not yet committed at the peer):
        what an orderly stop lets the links finish (a persistent message waits in the store
        for the next start; a non-persistent one would be lost)."""
        for router in self._dispatchers:
            row = self._destination(router)
            queue = self.manager.queues.get(routing_queue(router))
            if row is not None and row.active and queue is not None and queue.volatile:
                return False
        return all(
            not (link.machine.open_transactions or state.reserved or state.ready) for link, state in self._state.items()
        )

    def link_gone(self, link: Link) -> None:
        """Non-XA transactions sent over ``link`` go back to their queue (sent again, in
        doubt); XA ones stay prepared for the recovery with that peer."""
        state = self._state.pop(link, None)
        if state is not None:
            self._send_ready(link, state)  # (rolls them back)
            for transaction in state.nonxa_out.values():
                transaction.rollback_nowait()
            if state.claim is not None:  # what is still prepared is in doubt until the peer is back
                state.claim.release()
        self.changed()

    def usage(self, link: Link) -> dict[str, Any]:
        state = self._state.get(link)
        if state is None:
            return {}
        window = state.window
        return {
            "messages-out": state.messages_out,
            "messages-in": state.messages_in,
            "messages-out-rate": round(state.out_rate, 1),
            "messages-in-rate": round(state.in_rate, 1),
            "inbound-throttled": state.throttled,
            "inbound-throttled-ms": state.throttled_ms,
            "inbound-waiting-for-room": len(state.waiting),
            "inbound-full-waits": state.full_waits,
            "transactions-refused": state.refused,
            "open-transactions": link.machine.open_transactions,
            "window": link.machine.send_window,
            "transactions-in-flight": link.machine.awaiting,
            "bytes-in-flight": link.machine.bytes_in_flight,
            "round-trip-ms": round((window.srtt or 0.0) * 1000, 1) if window else 0.0,
            "least-round-trip-ms": round(window.min_rtt * 1000, 1) if window and window.srtt is not None else 0.0,
            "in-doubt": sum(1 for xid in self.manager.prepared_transactions() if link.peer in (parties(xid) or ())),
        }

    async def _sample_rates_forever(self) -> None:
        while True:
            await trio.sleep(RATE_INTERVAL)
            now = trio.current_time()
            for link, state in self._state.items():
                state.sample_rates(now)
                oldest = min(state.sent_at.values(), default=None)
                if state.window is not None and state.window.check_stall(now, oldest):
                    link.machine.set_send_window(state.window.size)

    def event(self, link: Link, event: Any) -> None:
        """Handle a transfer event of ``link``'s machine: the work is queued for the link's
        one worker, so that it happens in the order the events came (transactions become
        visible at the receiver in the order they were sent: the order of a path is kept)."""
        state = self._link(link)
        job: Job | None = None
        if isinstance(event, (PrepareReceived, TransactionRefused)):
            self._answered(link, state, event.xid)
        elif isinstance(event, NonXaCommitted):
            self._answered(link, state, event.seq)
        if isinstance(event, (PrepareReceived, TransactionRefused, NonXaCommitted, CommitDone)):
            self._send_ready(link, state)  # a window slot is free again
            self.changed()
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

    def _answered(self, link: Link, state: _LinkTransfer, key: str | int) -> None:
        """The peer answered our transaction ``key``: a round-trip sample for the link's
        window (:class:`~.window.WindowController`), which sizes the machine's send window."""
        sent = state.sent_at.pop(key, None)
        operational = link.operational
        if sent is None or operational is None:
            return
        machine = link.machine
        if state.window is None:
            state.window = WindowController(operational.peer_window_size)
        now = trio.current_time()
        # the window was full while this transaction travelled: it held the sender back (a
        # burst of answers is read at once, so the window's state now says nothing)
        state.window.answered(now - sent, now, limited=state.full_at >= sent)
        machine.set_send_window(state.window.size)

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
            state.jobs, jobs = trio.open_memory_channel[Job](math.inf)
            state.writes, writes = trio.open_memory_channel[_Write](math.inf)
            link.start_soon(self._work, link, state, jobs)
            link.start_soon(self._answer, link, state, writes)
        return state

    async def _work(self, link: Link, state: _LinkTransfer, jobs: trio.MemoryReceiveChannel[Job]) -> None:
        """The link's worker: its transfer jobs one after the other (a job returns the
        :class:`_Write` it queued, if any, for the answerer; one that is durable already,
        with nothing before it still unanswered, is answered here, a task switch sooner); a
        failure closes the link (recovery sorts out what was in flight), never the router."""
        while True:
            function, args = await _next(jobs, link)
            try:
                write = await function(*args)
                if write is None:
                    continue
                if state.unanswered or not write.done.is_set() or (write.delay_ms and self.inbound_flow_control):
                    state.unanswered += 1
                    state.writes.send_nowait(write)
                else:  # durable already (in memory), nothing before it unanswered: no need to pass it on
                    write.then(write.error)
            except Exception as exc:
                self._failed(link, exc)
                return

    async def _answer(self, link: Link, state: _LinkTransfer, writes: trio.MemoryReceiveChannel[_Write]) -> None:
        """The link's answerer: each queued write, in order, once durable, is answered.
        When the link ends it still waits (shielded) for the writes queued, so that what
        a new link's recovery finds is prepared or committed, not on its way."""
        write: _Write | None = None
        try:
            while True:
                write = await _next(writes, link)
                if not write.done.is_set():
                    await write.done.wait()
                if write.delay_ms and self.inbound_flow_control and write.error is None:
                    await self._throttle(link, write.delay_ms)
                try:
                    write.then(write.error)
                except Exception as exc:
                    self._failed(link, exc)
                    return
                state.unanswered -= 1
        finally:
            # batches waiting for room never will now (nothing of them is held): their writes
            # finish so that the wait below ends; the sender sends them again (XA: recovery
            # finds them not prepared; non-XA: in doubt)
            for batch in state.waiting:
                batch.write.finish(StoreError("the link ended while the batch waited for room"))
            state.waiting.clear()
            with trio.CancelScope(shield=True):
                while write is not None:
                    await write.done.wait()
                    try:
                        write = writes.receive_nowait()
                    except trio.WouldBlock:
                        write = None

    def _failed(self, link: Link, exc: Exception) -> None:
        """A transfer step of ``link`` failed (called in its ``except``): the link is closed
        with the reason; recovery sorts out what was in flight. Never the router."""
        if isinstance(exc, (QueueError, StoreError, MessageError)):
            log.error("routing link %s to %s: %s; the link is closed", link.name, link.peer, exc)
            link.close(f"transfer failed at {self.local}: {exc}")
        else:  # a bug: this link ends, the router goes on
            log.exception("routing link %s to %s: transfer failed", link.name, link.peer)
            link.close(f"transfer failed at {self.local}: {type(exc).__name__}")

    # -- sending ----------------------------------------------------------------------------

    def _choose(self, router: str, turn: int) -> Link | None:
        """The link a batch for ``router`` goes over now, or None (no route, or no room)."""
        row = self._destination(router)
        if row is None or not row.active:
            return None
        start = turn % len(row.rotation)  # (the rotation is just the next hop without round robin)
        for neighbour in row.rotation[start:] + row.rotation[:start]:
            link = self._links.get(neighbour)
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
        return machine.window_available + ahead - self._link(link).reserved

    def _send_ready(self, link: Link, state: _LinkTransfer) -> None:
        """Send the prepared batches of ``link``, oldest first, while its window has room;
        once the link has ended (or is gone), roll them back (the peer never had them)."""
        try:
            while state.ready:
                gone = self._state.get(link) is not state or link.machine.state is not State.OPERATIONAL
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
                    self._nursery.start_soon(self._roll_back_unsent, transaction, link.peer)
        except Exception as exc:  # (called by the store or the link's reader: not their problem)
            self._failed(link, exc)

    async def _dispatch(self, router: str) -> None:
        """Move what arrives in ``rt$R`` towards R, for as long as the swiftlet runs (a
        failure is logged and ends this dispatcher only)."""
        try:
            await self._dispatch_forever(router)
        except Exception:
            log.exception(
                "the dispatcher of %s stopped; messages for router %s wait there", routing_queue(router), router
            )

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
                if trio.current_time() < self._paused_until:
                    await trio.sleep_until(self._paused_until)
                wakeup = self._dispatchers[router]
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
            self.changed()
            if error is not None:
                not_prepared(error)
                return
            state.ready.append((xid, transaction, messages))
            self._send_ready(link, state)

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

    async def _commit_outbound(self, link: Link, xid: str) -> _Write:
        def committed(error: BaseException | None) -> None:
            if error is not None:
                raise StoreError(f"routing transaction {xid} not committed: {error}")
            link.machine.commit(xid)
            link.wake()

        write = _Write(committed)
        self._outbound.pop(xid).commit_nowait(write.finish)
        return write

    async def _refused(self, link: Link, xid: str, reason: str) -> None:
        log.warning(
            "router %s refused routing transaction %s, it is sent again in %.0f s: %s",
            link.peer,
            xid,
            REFUSED_BACKOFF,
            reason,
        )
        transaction = self._outbound.pop(xid)
        await transaction.rollback()
        state = self._link(link)
        state.refused += 1
        state.messages_out -= sum(transaction.acknowledgements.values())  # (counted when sent; not taken)
        link.start_soon(self._changed_after, REFUSED_BACKOFF)  # (not here: the link's other answers go on)

    async def _changed_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self.changed()

    async def _nonxa_committed(self, state: _LinkTransfer, seq: int) -> _Write:
        def committed(error: BaseException | None) -> None:
            if error is not None:
                raise StoreError(f"routed messages not acknowledged: {error}")

        write = _Write(committed)
        state.nonxa_out.pop(seq).commit_nowait(write.finish)
        return write

    async def _recover(self, link: Link, peer: str, listed: tuple[str, ...]) -> None:
        """The three-case table for this router's prepared transactions towards ``peer``."""
        listed_set = set(listed)
        for xid in [x for x in self.manager.prepared_transactions() if parties(x) == (self.local, peer)]:
            self._outbound.pop(xid, None)
            commit = xid in listed_set
            await self.manager.resolve_prepared(xid, commit=commit)
            log.info(
                "routing transaction %s to %s %s in recovery",
                xid,
                peer,
                "committed" if commit else "rolled back (its messages go again)",
            )
        link.machine.recovery_done(commit=list(listed))
        link.wake()
        self.changed()

    # -- receiving --------------------------------------------------------------------------

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
            remaining = expires - _now_ms()
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
                message = message.with_ttl(remaining)
        if destination == self.local:
            if queue.startswith(TEMPORARY_PREFIX) and queue not in self.manager.queues:
                self.dropped += 1  # its requester is gone
                return 0
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
            # mid-transfer, a → b → a → c): its backlog there would drop the only copy
            return transaction.send(f"{queue}@{destination}", message, limited=not alone).delay_ms

    def _unroutable(self, transaction: Transaction, message: Message, reason: str) -> int:
        transaction.send(UNROUTABLE, message.with_annotations({UNROUTABLE_REASON: reason}))
        self.unroutable += 1
        log.warning("a routed message went to unroutable on router %s: %s", self.local, reason)
        return 0

    async def _throttle(self, link: Link, delay_ms: int) -> None:
        """Inbound flow control: hold the answer to a transaction by the largest
        flow-control delay of its target queues. Awaited by the link's answerer, so answers
        keep their order (and so the messages theirs); the sender's window fills, its
        ``rt$R`` grows and its own flow control slows its producers."""
        state = self._state.get(link)
        if state is not None:
            state.throttled += 1
            state.throttled_ms += delay_ms
        await trio.sleep(delay_ms / 1000)

    def _refuse(self, link: Link, transaction: Transaction, xid: str, reason: str) -> None:
        """Refuse inbound ``xid``: nothing of it is held; the sender tries again later."""
        if transaction.state == "active":
            transaction.rollback_nowait()
        link.machine.refuse_transaction(xid, reason)
        link.wake()

    async def _prepare_inbound(self, link: Link, state: _LinkTransfer, xid: str, messages: tuple[bytes, ...]) -> _Write:
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

        batch = _Inbound(
            messages,
            _Write(prepared),
            lambda transaction: transaction.prepare_nowait(xid, batch.write.finish, transient_in_memory=True),
        )
        self._admit(link, state, batch)
        return batch.write

    async def _commit_inbound(self, link: Link, state: _LinkTransfer, xid: str, recovery: bool) -> _Write:
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
            write = _Write(stored)
            transaction.commit_nowait(write.finish)
            link.machine.committed(xid)
            link.wake()
            return write
        write = _Write(committed)  # prepared by an earlier link (or run) of this peer
        await self.manager.resolve_prepared(xid, commit=True)
        write.finish(None)
        return write

    async def _receive_nonxa(self, link: Link, state: _LinkTransfer, seq: int, messages: tuple[bytes, ...]) -> _Write:
        def committed(error: BaseException | None) -> None:
            if error is not None:  # (non-XA cannot refuse: the link ends, the sender sends again in doubt)
                raise StoreError(f"routed messages not stored: {error}")
            state.messages_in += len(messages)
            link.machine.nonxa_committed(seq)
            link.wake()

        batch = _Inbound(messages, _Write(committed), lambda transaction: transaction.commit_nowait(batch.write.finish))
        self._admit(link, state, batch)
        return batch.write

    def _admit(self, link: Link, state: _LinkTransfer, batch: _Inbound) -> None:
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
            batch.store(transaction)
        except (QueueError, StoreError) as exc:
            batch.write.finish(exc)

    @staticmethod
    def _admitted(state: _LinkTransfer, batch: _Inbound) -> None:
        if state.waiting and state.waiting[0] is batch:
            state.waiting.popleft()

    def _room_made(self, link: Link, state: _LinkTransfer) -> None:
        """A queue a batch of ``link`` waits for may have room: the link's worker tries again
        (in a job of its own: this is called from inside a queue's bookkeeping)."""
        if self._state.get(link) is state and state.waiting:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):  # (the link is ending)
                state.jobs.send_nowait((self._admit_waiting, (link, state)))

    async def _admit_waiting(self, link: Link, state: _LinkTransfer) -> None:
        """The waiting batches of ``link``, oldest first, until one still finds no room."""
        while state.waiting:
            batch = state.waiting[0]
            self._admit(link, state, batch)
            if state.waiting and state.waiting[0] is batch:
                return
