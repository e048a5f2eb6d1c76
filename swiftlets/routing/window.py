"""The transfer window of a routing link: what is open in each direction, and how much more may go.

Theory of operation
-------------------
A link carries transactions both ways, each direction on its own. :class:`Ledger` keeps
one direction's open transactions: each one's phase (by the tables :data:`OUTBOUND_PHASES`
and :data:`INBOUND_PHASES`), how many are in each phase, and their **cost** in bytes (its
messages' bytes as they travel, plus :data:`TRANSACTION_COST` for what a transaction costs
besides them), summed over those *awaiting* their answer (outbound SENT, inbound RECEIVED)
and over all open ones. The link machine checks every frame and every owner's call against
it; a step the table lacks is a protocol error.

Bounds (the receiver's, announced in its ADJUST and enforced on both sides): a sender may
send a transaction while the cost awaiting is below the receiver's ``window_bytes`` and the
cost open in all phases below :data:`OPEN_FACTOR` × that; so a receiver never holds more
than that plus one transaction it has not answered, whatever the round trip. The cost
per transaction keeps the count bounded too, however small the messages.

How much of that room the sender uses is :class:`WindowController`'s decision, made for
the link's distance: a link carries at most one window per round trip, so at 100 ms a
fixed window of 10 transactions of 20 messages (SwiftMQ's) is 2,000 messages a second, whatever the two
routers could do. The controller sizes the window (in transactions awaiting their answer)
to the bandwidth-delay product the way TCP's congestion control does, with the round trip
itself as the signal (as TCP Vegas does), since a receiver that falls behind answers later
rather than losing anything:

- every answer (PREPARE_REPLY, REFUSE, NONXA_COMMIT) is a round-trip sample; the least of
  the recent ones (:data:`MIN_RTT_EPOCH`) is the link's own round trip, without queueing;
- the samples are taken in rounds of one round trip. A window leaves in bursts (the
  sender's prepares are made durable together), and the receiver works through a burst
  one transaction after the other, so the last ones of a burst come back later although
  nothing queues for long: a round's *least* sample is what shows a standing queue;
- while the window was full when an answer's transaction travelled (the sender had more
  to send than it allowed), an answer near the link's own round trip grows the window: by
  one transaction (doubling it each round trip) up to the threshold of the last decrease,
  then by one per round trip;
- a round whose least sample is above the link's own round trip by more than
  :data:`QUEUE_FACTOR` and :data:`QUEUE_SLACK` means the receiver or its store fall behind:
  the window shrinks to :data:`DECREASE` of itself, and that becomes the threshold;
- with transactions awaiting and no answer for :data:`STALL_FACTOR` round trips (at least
  :data:`STALL_MIN`), the receiver has stopped (inbound flow control holds its answers, or
  it is stuck): the window goes back to its start and grows again once answers come.

It never goes below the start the receiver announced (``inbound-window-size``: the fixed
window of earlier versions, so a link is never slower than it was) nor above
:data:`MAX_WINDOW`; the byte bound above is what limits it in practice. Pure: the owner
passes the times (``trio.current_time()``); tests drive it with any clock.
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Sequence

from .wire import FrameType

__all__ = [
    "AWAITING",
    "DECREASE",
    "MAX_WINDOW",
    "OPEN_FACTOR",
    "TRANSACTION_COST",
    "Decision",
    "Direction",
    "INBOUND_PHASES",
    "Ledger",
    "NoTransition",
    "OUTBOUND_PHASES",
    "Phase",
    "WindowController",
    "transaction_cost",
]

TRANSACTION_COST = 1024  # bytes a transaction counts for besides its messages (its keys, phases, frame)
OPEN_FACTOR = 3  # cost open in all phases, per direction: at most this × the receiver's window_bytes
MAX_WINDOW = 100_000  # transactions awaiting their answer, at most (the byte bound comes first)
MIN_RTT_EPOCH = 10.0  # seconds a least round trip is remembered (a path's delay may change)
QUEUE_FACTOR = 1.25  # a sample above QUEUE_FACTOR × the least round trip + QUEUE_SLACK: queueing
QUEUE_SLACK = 0.005  # seconds (scheduling noise of a busy router, a group commit's fsync)
DECREASE = 0.75  # the window after a round trip that queued, relative to before
STALL_FACTOR = 4  # round trips without an answer that mean the receiver stopped
STALL_MIN = 1.0  # seconds, at least


class Direction(enum.Enum):
    """One direction of a link's transfer: our transactions to the peer, or the peer's to us."""

    # Members of these enums are dict keys (in tuples) several times per routed message:
    # Enum's own __hash__ hashes the member's name in Python; a member is a singleton, so
    # the identity hash is as right and is a C call.
    __hash__ = object.__hash__

    OUTBOUND = "outbound"
    INBOUND = "inbound"


class Decision(enum.Enum):
    """The owner's decisions: the machine's inputs besides the frames received."""

    __hash__ = object.__hash__  # (as Direction's)

    ADMIT = "admit"
    REFUSE = "refuse"
    RECOVERY_LIST = "recovery_list"
    RECOVERY_DONE = "recovery_done"
    SEND = "send_transaction"
    PREPARED = "prepared"
    REFUSE_TRANSACTION = "refuse_transaction"
    COMMIT = "commit"
    COMMITTED = "committed"
    SEND_NONXA = "send_nonxa"
    NONXA_COMMITTED = "nonxa_committed"


class Phase(enum.Enum):
    """Where one transaction is, in one direction (see :data:`OUTBOUND_PHASES`)."""

    __hash__ = object.__hash__  # (as Direction's)

    SENT = "sent, not prepared"  # outbound: awaiting PREPARE_REPLY / REFUSE (non-XA: NONXA_COMMIT)
    RECEIVED = "received, not prepared"  # inbound: awaiting the owner's prepared / refuse (non-XA: commit)
    PREPARED = "prepared, not committed"  # outbound: awaiting the owner's commit; inbound: the peer's COMMIT
    COMMITTING = "committing"  # outbound: COMMIT sent, awaiting COMMIT_REPLY; inbound: awaiting the owner
    IN_DOUBT = "in doubt from an earlier connection"  # inbound, listed in our RECOVERY


Step = FrameType | Decision
P, D, F = Phase, Decision, FrameType
# One transaction in one direction: (phase, input) -> the next phase; None as a phase: not
# open (before the first input, or over after the last). An input without an entry for the
# transaction's phase is a protocol error (from the peer) or a LocalProtocolError (the
# owner): a duplicate xid, an unknown xid, an answer in the wrong phase. Keys: the xid (XA)
# or the sequence number (non-XA).
OUTBOUND_PHASES: dict[tuple[Phase | None, Step], Phase | None] = {
    # XA, sender
    (None, D.SEND): P.SENT,  # TRANSACTION sent
    (P.SENT, F.PREPARE_REPLY): P.PREPARED,  # answered: its window room is free again
    (P.SENT, F.REFUSE): None,  # the owner rolls back
    (P.PREPARED, D.COMMIT): P.COMMITTING,  # committed locally: COMMIT sent
    (None, D.RECOVERY_DONE): P.COMMITTING,  # recovery: a COMMIT the peer must make
    (P.COMMITTING, F.COMMIT_REPLY): None,  # over on both sides
    # non-XA, sender
    (None, D.SEND_NONXA): P.SENT,  # NONXA_TRANSACTION sent
    (P.SENT, F.NONXA_COMMIT): None,  # committed at the receiver: the owner commits
}
INBOUND_PHASES: dict[tuple[Phase | None, Step], Phase | None] = {
    # XA, receiver
    (None, F.TRANSACTION): P.RECEIVED,
    (P.RECEIVED, D.PREPARED): P.PREPARED,  # PREPARE_REPLY sent
    (P.RECEIVED, D.REFUSE_TRANSACTION): None,  # REFUSE sent: nothing of it is held
    (P.PREPARED, F.COMMIT): P.COMMITTING,
    (None, D.RECOVERY_LIST): P.IN_DOUBT,  # recovery: listed in our RECOVERY
    (P.IN_DOUBT, F.COMMIT): P.COMMITTING,
    (P.COMMITTING, D.COMMITTED): None,  # COMMIT_REPLY sent
    # non-XA, receiver
    (None, F.NONXA_TRANSACTION): P.RECEIVED,
    (P.RECEIVED, D.NONXA_COMMITTED): None,  # NONXA_COMMIT sent
}
del P, D, F
PHASES = {Direction.OUTBOUND: OUTBOUND_PHASES, Direction.INBOUND: INBOUND_PHASES}
AWAITING = {Direction.OUTBOUND: Phase.SENT, Direction.INBOUND: Phase.RECEIVED}  # the phase the window counts


def transaction_cost(messages: Sequence[bytes]) -> int:
    """What a transaction counts for in a window: its ``messages`` field as it travels
    (compressed: the one zlib stream) plus :data:`TRANSACTION_COST`."""
    return TRANSACTION_COST + sum(len(message) for message in messages)


class NoTransition(Exception):
    """The phase table has no entry for a step of a transaction; ``current`` is its phase
    (None: not open)."""

    def __init__(self, current: Phase | None):
        super().__init__(current)
        self.current = current


class Ledger:
    """The open transactions of one direction of a link, oldest first: each one's phase,
    the count per phase, and the cost awaiting an answer and open in all."""

    def __init__(self, direction: Direction):
        self.direction = direction
        self._table = PHASES[direction]
        self._awaiting_phase = AWAITING[direction]
        self.phases: dict[str | int, Phase] = {}
        self.counts: collections.Counter[Phase] = collections.Counter()
        self._costs: dict[str | int, int] = {}
        self.awaiting_bytes = 0
        self.open_bytes = 0

    def __len__(self) -> int:
        return len(self.phases)

    @property
    def awaiting(self) -> int:
        """Transactions awaiting their answer (outbound SENT, inbound RECEIVED)."""
        return self.counts[self._awaiting_phase]

    def check(self, key: str | int, step: Step) -> None:
        """Raises NoTransition unless the table has ``step`` for ``key``'s phase."""
        current = self.phases.get(key)
        if (current, step) not in self._table:
            raise NoTransition(current)

    def move(self, key: str | int, step: Step, cost: int = 0) -> Phase | None:
        """Take ``step`` (checked by :meth:`check`); ``cost``: a transaction being opened."""
        current = self.phases.get(key)
        following = self._table[(current, step)]
        if current is None:
            self._costs[key] = cost
            self.open_bytes += cost
        else:
            self.counts[current] -= 1
        cost = self._costs[key]
        if current is self._awaiting_phase:
            self.awaiting_bytes -= cost
        if following is None:
            del self.phases[key]
            self.open_bytes -= self._costs.pop(key)
        else:
            self.phases[key] = following
            self.counts[following] += 1
            if following is self._awaiting_phase:
                self.awaiting_bytes += cost
        return following

    def clear(self) -> None:
        self.phases.clear()
        self.counts.clear()
        self._costs.clear()
        self.awaiting_bytes = self.open_bytes = 0


class WindowController:
    """How many transactions may await their answer on one direction of a link, sized to
    its bandwidth-delay product (see the module header). ``start``: the receiver's
    announced ``window_size``, the least the window ever is."""

    def __init__(self, start: int, *, limit: int = MAX_WINDOW):
        if not 1 <= start <= limit:
            raise ValueError(f"a window starts at 1 to {limit} transactions, not {start}")
        self.start, self.limit = start, limit
        self._window = float(start)
        self.threshold = math.inf  # slow start below it, one per round trip above
        self.srtt: float | None = None  # smoothed round trip (seconds), as TCP's
        self._min_now = math.inf  # least round trip of this epoch
        self._min_before = math.inf  # of the one before
        self._epoch_end: float | None = None
        self._round_end: float | None = None
        self._round_min = math.inf
        self._last_answer: float | None = None

    @property
    def size(self) -> int:
        """The window: transactions that may await their answer now."""
        return min(self.limit, int(self._window))

    @property
    def min_rtt(self) -> float:
        """The least recent round trip (seconds; inf before the first answer)."""
        return min(self._min_now, self._min_before)

    def answered(self, rtt: float, now: float, *, limited: bool) -> None:
        """An answer came ``rtt`` seconds after its transaction was sent, at ``now``;
        ``limited``: the window was full (the sender would have sent more)."""
        rtt = max(rtt, 0.0)
        self._last_answer = now
        if self._epoch_end is None or now >= self._epoch_end:
            self._min_before, self._min_now, self._epoch_end = self._min_now, math.inf, now + MIN_RTT_EPOCH
        self._min_now = min(self._min_now, rtt)
        self.srtt = rtt if self.srtt is None else 0.875 * self.srtt + 0.125 * rtt
        self._round_min = min(self._round_min, rtt)
        if self._round_end is None:
            self._round_end = now + self.srtt
        elif now >= self._round_end:
            queued = self._round_min > QUEUE_FACTOR * self.min_rtt + QUEUE_SLACK
            self._round_end, self._round_min = now + self.srtt, math.inf
            if queued:
                self._window = max(float(self.start), self._window * DECREASE)
                self.threshold = self._window
                return
        if limited and rtt <= QUEUE_FACTOR * self.min_rtt + QUEUE_SLACK:  # (a late answer grows nothing)
            step = 1.0 if self._window < self.threshold else 1.0 / self._window
            self._window = min(float(self.limit), self._window + step)

    def check_stall(self, now: float, oldest_sent: float | None) -> bool:
        """Called from time to time with when the oldest transaction still awaiting its
        answer was sent (None: none awaits); a receiver silent for :data:`STALL_FACTOR`
        round trips has stopped: the window goes back to its start (True if it did)."""
        if oldest_sent is None or self.srtt is None:
            return False
        since = max(oldest_sent, self._last_answer or oldest_sent)
        if now - since < max(STALL_MIN, STALL_FACTOR * self.srtt) or self._window <= self.start:
            return False
        self.threshold = max(float(self.start), self._window / 2)
        self._window = float(self.start)
        self._round_end, self._round_min = None, math.inf  # the next answer starts a round
        return True
