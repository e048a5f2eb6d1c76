"""What the transfer keeps per routing link, and the units of its work: the store writes a
link's worker queues for its answerer, and the inbound batches it stages."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

from martinet.messaging.codec import Symbol
from martinet.swiftlets.queuemanager.api import Transaction
from martinet.swiftlets.xa.api import Claim, parse_routing_xid

from .links import Link
from .window import WindowController

__all__ = ["UNROUTABLE_REASON", "InboundBatch", "Job", "LinkTransfer", "StoreWrite", "next_ready", "parties"]

UNROUTABLE_REASON = Symbol("x-opt-martinet-unroutable")


def parties(xid: str) -> tuple[str, str] | None:
    """(sender, receiver) of a routing xid; None for another xid."""
    parsed = parse_routing_xid(xid)
    return (parsed.source, parsed.destination) if parsed is not None else None


@attrs.define
class LinkTransfer:
    """What the transfer keeps per link."""

    inbound: dict[str, Transaction] = attrs.Factory(dict)  # xid → prepared, awaiting COMMIT
    nonxa_out: dict[int, Transaction] = attrs.Factory(dict)  # seq → sent, awaiting NONXA_COMMIT
    next_seq: int = 1
    reserved: int = 0  # batches being prepared or ready, not yet sent
    ready: collections.deque[tuple[str, Transaction, list[bytes]]] = attrs.Factory(collections.deque)
    jobs: Any = None  # the send side of the link's worker's queue
    writes: Any = None  # the send side of the answerer's queue (:class:`StoreWrite`, in the order queued)
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
    waiting: collections.deque[InboundBatch] = attrs.Factory(collections.deque)  # inbound batches waiting for room
    full_waits: int = 0  # times a batch found its target queue full and waited
    refused: int = 0  # our transactions the peer refused (rolled back here, sent again)
    live: bool = True  # false once the link is gone (what still waits for room never will)

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
class StoreWrite:
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

    def answer(self) -> None:
        """Call ``then`` with the outcome, once. Dropping it then breaks an inbound batch's
        cycle (the batch holds its write, whose ``then`` holds the batch): the batch's
        transaction, entries and messages go at once by reference counting. Left to the
        cyclic collector, they made it run every couple of hundred transactions, at about a
        microsecond per routed message."""
        then, self.then = self.then, _answered
        then(self.error)


def _answered(error: BaseException | None) -> None:
    """The ``then`` of a write that was answered."""


@attrs.define(eq=False)
class InboundBatch:
    """An inbound batch (an XA transaction or a non-XA batch) to stage: ``store`` hands the
    staged transaction to the store (prepare or commit), which finishes the write it is
    given (``write``; passed in, so that ``store`` needs no reference to the batch)."""

    messages: tuple[bytes, ...]
    write: StoreWrite
    store: Callable[[Transaction, StoreWrite], None]
    transaction: Transaction | None = None
    alone: bool = False  # larger than its empty queue's room: staged without its limits


Job = tuple[Callable[..., Any], tuple[Any, ...]]
T = TypeVar("T")


async def next_ready(channel: trio.MemoryReceiveChannel[T], link: Link) -> T:
    """The next item, waiting (a checkpoint) only when none is queued: what is ready is
    handled in one go, and the answers it causes leave in one write, at once, before the wait
    (:meth:`Link.flush`)."""
    try:
        return channel.receive_nowait()
    except trio.WouldBlock:
        link.flush()
        return await channel.receive()
