"""Messages between routers: a dispatcher per destination, and each link's worker and answerer.

Theory of operation
-------------------
A message for ``q@R`` (R another router) is accepted into the routing queue ``rt$R``,
annotated on the way in (:mod:`.rewrite`).

**Sending** (:mod:`.sending`). One dispatcher task per routing queue consumes it. While the destination has a
route, it picks the link of the next hop (round robin: the next neighbour of the rotation,
per batch) whose window has room, takes up to the peer's ``inbound-transaction-size``
messages (and no more bytes than the peer's frame size allows) and:

- **XA**: acknowledges them in a local transaction, *prepares* it durably under a new xid
  (``routing:<local>:<peer>:<boot>-<n>``, sys$xa's convention) and sends TRANSACTION. When the peer answers that it
  prepared, the transaction commits (the messages leave ``rt$R``) and COMMIT tells the peer
  to commit. A link that ends leaves the prepared transactions for the recovery stage of
  the next link to that peer: what the peer holds prepared is committed, the rest rolled
  back, so the messages go again (over any route): never lost, never twice.
- **Non-XA**: acknowledges them in a local transaction, sends NONXA_TRANSACTION and commits
  when the peer says it committed; a link that ends rolls them back, and they are sent
  again marked ``x-opt-martinet-doubt`` so that the target queue's duplicate detection
  drops a copy the peer already has. So are the messages a restart recovered in ``rt$R``
  (after a crash, the peer may have committed them).

Without a usable link the dispatcher waits for a change (:meth:`Transfer.changed`); the
messages wait in ``rt$R``.

**Receiving** is :class:`~.receiving.Receiving`'s. With inbound flow control the answer
waits for the largest flow-control delay of the target queues (:meth:`Transfer._throttle`).

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

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from martinet.messaging.message import MessageError
from martinet.swiftlets.queuemanager.api import MalformedMessage, QueueError, QueueManager
from martinet.swiftlets.store.api import StoreError
from martinet.swiftlets.xa.api import XAError, XAResourceManager, routing_prefixes

from .api import Destination, routing_queue
from .links import Link
from .linkwork import Job, LinkTransfer, StoreWrite, next_ready, parties
from .receiving import Receiving
from .sending import Sending
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
from .window import WindowController

__all__ = ["Transfer"]

log = logging.getLogger(__name__)


RATE_INTERVAL = 1.0  # seconds between samples of the links' message rates (the queues' interval)


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
        self.destination = destination
        self.links = links
        self.nursery = nursery
        self._xa = xa
        self.wakeups_of: dict[str, trio.Event] = {}  # router → its dispatcher's wake-up
        self._state: dict[Link, LinkTransfer] = {}
        self.receiving = Receiving(local, manager, destination)
        self.sending = Sending(self, local, manager)
        nursery.start_soon(self._sample_rates_forever)

    # -- the swiftlet's calls ---------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Routed messages for temporary queues that were gone."""
        return self.receiving.dropped

    @property
    def unroutable(self) -> int:
        """Messages this router sent to ``unroutable``."""
        return self.receiving.unroutable + self.sending.unroutable_here

    @property
    def expired(self) -> int:
        """Routed messages found expired on arrival (dead-lettered here)."""
        return self.receiving.expired

    def destination_added(self, router: str) -> None:
        """Make sure ``rt$R`` has a dispatcher (it stays when R goes: it then waits)."""
        if router not in self.wakeups_of:
            self.wakeups_of[router] = trio.Event()
            self.nursery.start_soon(self._dispatch, router)

    def changed(self) -> None:
        """Routes, links or windows changed: every dispatcher looks again."""
        for wakeup in self.wakeups_of.values():
            wakeup.set()

    def drained(self) -> bool:
        """No non-persistent message waits for an active destination, and none of our
        transactions is on its way (being prepared, sent, or not yet committed at the peer):
        what an orderly stop lets the links finish (a persistent message waits in the store
        for the next start; a non-persistent one would be lost)."""
        for router in self.wakeups_of:
            row = self.destination(router)
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
            state.live = False
            self.sending.send_ready(link, state)  # (rolls them back)
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
        state = self.link_state(link)
        job: Job | None = None
        if isinstance(event, (PrepareReceived, TransactionRefused)):
            self._answered(link, state, event.xid)
        elif isinstance(event, NonXaCommitted):
            self._answered(link, state, event.seq)
        if isinstance(event, (PrepareReceived, TransactionRefused, NonXaCommitted, CommitDone)):
            self.sending.send_ready(link, state)  # a window slot is free again
            self.changed()
        if isinstance(event, PrepareReceived):
            job = self.sending.commit_outbound, (link, event.xid)
        elif isinstance(event, TransactionReceived):
            if link.error is not None:  # closing: nothing more is held (not answered, so sent again)
                return
            if parties(event.xid) != (link.peer, self.local):
                # a peer names its transactions routing:<peer>:<us>:…; any other xid would be
                # held in doubt where no recovery of this link resolves it (a peer could fill
                # the router with them), or take one a neighbour or an XA client is using
                link.close(f"transaction {event.xid!r} is not of this link (routing:{link.peer}:{self.local}:…)")
                return
            job = self.receiving.prepare, (link, state, event.xid, event.messages)
        elif isinstance(event, CommitReceived):
            job = self.receiving.commit, (link, state, event.xid, event.recovery)
        elif isinstance(event, TransactionRefused):
            job = self.sending.refused, (link, event.xid, event.reason)
        elif isinstance(event, NonXaTransactionReceived):
            job = self.receiving.receive_nonxa, (link, state, event.seq, event.messages)
        elif isinstance(event, NonXaCommitted):
            job = self.sending.nonxa_committed, (state, event.seq)
        elif isinstance(event, RecoveryRequested):
            inbound = [xid for xid in self.manager.prepared_transactions() if parties(xid) == (event.peer, self.local)]
            link.machine.recovery_list(inbound)
        elif isinstance(event, RecoveryReceived):
            job = self.sending.recover, (link, event.peer, event.xids)
        if job is not None:
            state.jobs.send_nowait(job)

    def _answered(self, link: Link, state: LinkTransfer, key: str | int) -> None:
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

    def state_of(self, link: Link) -> LinkTransfer | None:
        """The transfer's state of ``link`` while it lives (None once it is gone)."""
        return self._state.get(link)

    def link_state(self, link: Link) -> LinkTransfer:
        """The transfer's state of ``link``, made (with the link's worker) on first use."""
        state = self._state.get(link)
        if state is None:
            state = self._state[link] = LinkTransfer(rate_mark=(trio.current_time(), 0, 0))
            if self._xa is not None and link.peer is not None:
                try:
                    state.claim = self._xa.claim("routing", *routing_prefixes(self.local, link.peer))
                except XAError as exc:  # a second link to the peer, about to be closed
                    log.debug("routing link %s: xids not claimed: %s", link.name, exc)
            state.jobs, jobs = trio.open_memory_channel[Job](math.inf)
            state.writes, writes = trio.open_memory_channel[StoreWrite](math.inf)
            link.start_soon(self._work, link, state, jobs)
            link.start_soon(self._answer, link, state, writes)
        return state

    async def _work(self, link: Link, state: LinkTransfer, jobs: trio.MemoryReceiveChannel[Job]) -> None:
        """The link's worker: its transfer jobs one after the other (a job returns the
        :class:`StoreWrite` it queued, if any, for the answerer; one that is durable already,
        with nothing before it still unanswered, is answered here, a task switch sooner); a
        failure closes the link (recovery sorts out what was in flight), never the router."""
        while True:
            function, args = await next_ready(jobs, link)
            try:
                write = await function(*args)
                if write is None:
                    continue
                if state.unanswered or not write.done.is_set() or (write.delay_ms and self.inbound_flow_control):
                    state.unanswered += 1
                    state.writes.send_nowait(write)
                else:  # durable already (in memory), nothing before it unanswered: no need to pass it on
                    write.answer()
            except Exception as exc:
                self.failed(link, exc)
                return

    async def _answer(self, link: Link, state: LinkTransfer, writes: trio.MemoryReceiveChannel[StoreWrite]) -> None:
        """The link's answerer: each queued write, in order, once durable, is answered.
        When the link ends it still waits (shielded) for the writes queued, so that what
        a new link's recovery finds is prepared or committed, not on its way."""
        write: StoreWrite | None = None
        try:
            while True:
                write = await next_ready(writes, link)
                if not write.done.is_set():
                    await write.done.wait()
                if write.delay_ms and self.inbound_flow_control and write.error is None:
                    await self._throttle(link, write.delay_ms)
                try:
                    write.answer()
                except Exception as exc:
                    self.failed(link, exc)
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

    def failed(self, link: Link, exc: Exception) -> None:
        """A transfer step of ``link`` failed (called in its ``except``): the link is closed
        with the reason; recovery sorts out what was in flight. Never the router."""
        if isinstance(exc, (MalformedMessage, MessageError)):  # a message's bytes, not this router's failure
            log.warning(
                "routing link %s to %s: a malformed message (%s); the link is closed", link.name, link.peer, exc
            )
            link.close(f"malformed message at {self.local}: {exc}")
        elif isinstance(exc, (QueueError, StoreError)):
            log.error("routing link %s to %s: %s; the link is closed", link.name, link.peer, exc)
            link.close(f"transfer failed at {self.local}: {exc}")
        else:  # a bug: this link ends, the router goes on
            log.exception("routing link %s to %s: transfer failed", link.name, link.peer)
            link.close(f"transfer failed at {self.local}: {type(exc).__name__}")

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

    async def _dispatch(self, router: str) -> None:
        """Move what arrives in ``rt$R`` towards R, for as long as the swiftlet runs (a
        failure is logged and ends this dispatcher only)."""
        try:
            await self.sending.dispatch_forever(router)
        except Exception:
            log.exception(
                "the dispatcher of %s stopped; messages for router %s wait there", routing_queue(router), router
            )
