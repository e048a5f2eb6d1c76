"""The routing link's delivery stage: the peer's limits, routes and transactions; sans-IO.

Theory of operation
-------------------
Both sides send their limits (ADJUST: transaction size, window, ``window_bytes``, largest
frame, compression) and START_DELIVERY; once the peer's have arrived the link is
operational (:class:`~.linkevents.Operational`) and routes and transactions flow.

Per transaction phases are data too (:data:`~.window.OUTBOUND_PHASES`,
:data:`~.window.INBOUND_PHASES`, one table and one :class:`~.window.Ledger` per direction,
held by the :class:`~.linkcore.LinkCore`). :class:`Delivery` checks every xid and sequence
number the peer names, the window bounds and transaction size, the peer's and the owner's;
it never delays anything (inbound flow control is the owner answering later). The window
counts transactions awaiting their prepare (room is freed at the prepare, so the link
stays busy while commits are in flight); its size is the owner's
(:meth:`Delivery.set_send_window`), within the receiver's ``window_bytes`` awaiting and
:data:`~.window.OPEN_FACTOR` times that open.
"""

from __future__ import annotations

from collections.abc import Sequence

from .exchange import MAX_PATH
from .linkcore import Handler, LinkCore, key_text
from .linkevents import (
    CommitDone,
    CommitReceived,
    NonXaCommitted,
    NonXaTransactionReceived,
    Operational,
    PrepareReceived,
    RouteReceived,
    TransactionReceived,
    TransactionRefused,
)
from .linkstate import ENDED, MAX_REASON, State, printable, valid_router_name, xid_problem
from .window import OPEN_FACTOR, Decision, Direction, transaction_cost
from .wire import (
    HANDSHAKE_MAX_FRAME_SIZE,
    MIN_WINDOW_BYTES,
    Adjust,
    Commit,
    CommitReply,
    Frame,
    FrameType,
    LocalProtocolError,
    NonXaCommit,
    NonXaTransaction,
    PrepareReply,
    Refuse,
    RemoteProtocolError,
    Route,
    StartDelivery,
    Transaction,
    encode,
    pack_messages,
    unpack_messages,
)
from .xarecovery import XaRecovery

MAX_PATH_LENGTH = MAX_PATH  # what the exchanger stores: a route announced carries the sender first


def route_problem(route: Route, *, first: str) -> str | None:
    """What is wrong with a route whose path must start with ``first`` (None: nothing)."""
    path = route.path
    if not path or len(path) > MAX_PATH_LENGTH:
        return f"a route's path must have 1 to {MAX_PATH_LENGTH} routers, got {len(path)}"
    bad = [name for name in (route.destination, *path) if not valid_router_name(name)]
    if bad:
        return f"invalid router name {printable(bad[0], 80)!r} in a route"
    if path[0] != first or path[-1] != route.destination:
        problem = (
            f"a route's path must run from {first} to its destination {route.destination!r}, got {'/'.join(path)!r}"
        )
        return problem[:300]
    if len(set(path)) != len(path):
        return f"a route's path has a loop: {'/'.join(path)!r}"[:300]
    return None


class Delivery:
    """The delivery stage of one link (see the module docstring). ``recovery``: the XA
    recovery part, whose COMMITs this part handles too."""

    def __init__(self, core: LinkCore, recovery: XaRecovery):
        self._core = core
        self._recovery = recovery
        self._peer_adjust: Adjust | None = None
        self._send_window = 0  # transactions that may await their answer: the owner sizes it (set_send_window)
        self._last_seq_out = -1
        self._last_seq_in = -1

    def handlers(self) -> dict[FrameType, Handler]:
        """The frames this part handles."""
        return {
            FrameType.ADJUST: self._on_adjust,
            FrameType.START_DELIVERY: self._on_start_delivery,
            FrameType.ROUTE: self._on_route,
            FrameType.TRANSACTION: self._on_transaction,
            FrameType.PREPARE_REPLY: self._on_prepare_reply,
            FrameType.REFUSE: self._on_refuse,
            FrameType.COMMIT: self._on_commit,
            FrameType.COMMIT_REPLY: self._on_commit_reply,
            FrameType.NONXA_TRANSACTION: self._on_nonxa_transaction,
            FrameType.NONXA_COMMIT: self._on_nonxa_commit,
        }

    # -- what the owner reads ----------------------------------------------------------------

    @property
    def compression(self) -> bool:
        return bool(self._core.settings.use_compression and self._peer_adjust and self._peer_adjust.compression)

    @property
    def window_available(self) -> int:
        peer = self._peer_adjust
        if self._core.state is not State.OPERATIONAL or peer is None:
            return 0
        sent = self._core.sent
        if sent.awaiting_bytes >= peer.window_bytes or sent.open_bytes >= OPEN_FACTOR * peer.window_bytes:
            return 0
        return max(0, self._send_window - sent.awaiting)

    @property
    def send_window(self) -> int:
        return self._send_window

    def set_send_window(self, transactions: int) -> None:
        self._send_window = max(1, transactions)

    @property
    def peer_max_frame_size(self) -> int:
        return self._peer_adjust.max_frame_size if self._peer_adjust else 0

    # -- the owner's calls (documented on :class:`~.stages.LinkMachine`) ----------------------

    def send_route(self, *, add: bool, destination: str, path: Sequence[str]) -> bool:
        core = self._core
        if core.state in ENDED:
            return False
        if core.state is not State.OPERATIONAL:
            raise LocalProtocolError(f"send_route while {core.state.value}")
        route = Route(add=add, destination=destination, path=tuple(path))
        problem = route_problem(route, first=core.name)
        if problem:
            raise LocalProtocolError(problem)
        core.out.append(encode(route, core.settings.max_frame_size))
        return True

    def send_transaction(self, xid: str, messages: Sequence[bytes]) -> bool:
        messages = tuple(messages)

        def handler() -> State | None:
            self._check_xa(True, local=True)
            if problem := xid_problem(xid):
                raise LocalProtocolError(problem)
            packed, compressed = self._batch(messages)
            frame = Transaction(xid=xid, messages=packed, compressed=compressed)
            self._send_batch(xid, Decision.SEND, frame)
            return State.OPERATIONAL

        return self._core.transfer(Decision.SEND, handler)

    def send_nonxa(self, seq: int, messages: Sequence[bytes]) -> bool:
        messages = tuple(messages)

        def handler() -> State | None:
            self._check_xa(False, local=True)
            if type(seq) is not int or not self._last_seq_out < seq < 1 << 32:
                raise LocalProtocolError(
                    f"send_nonxa: the sequence number must grow (last {self._last_seq_out}, got {seq!r})"[:300]
                )
            packed, compressed = self._batch(messages)
            self._send_batch(
                seq, Decision.SEND_NONXA, NonXaTransaction(seq=seq, messages=packed, compressed=compressed)
            )
            self._last_seq_out = seq
            return State.OPERATIONAL

        return self._core.transfer(Decision.SEND_NONXA, handler)

    def prepared(self, xid: str) -> None:
        self._answer(Direction.INBOUND, xid, Decision.PREPARED, PrepareReply(xid=xid))

    def refuse_transaction(self, xid: str, reason: str) -> None:
        frame = Refuse(xid=xid, reason=reason[:MAX_REASON])
        self._answer(Direction.INBOUND, xid, Decision.REFUSE_TRANSACTION, frame)

    def commit(self, xid: str) -> None:
        self._answer(Direction.OUTBOUND, xid, Decision.COMMIT, Commit(xid=xid))

    def committed(self, xid: str) -> None:
        def handler() -> State | None:
            following = self._reply(Direction.INBOUND, xid, Decision.COMMITTED, CommitReply(xid=xid))
            return self._recovery.progress() if self._core.state is State.RECOVERY_WAIT else following

        self._core.transfer(Decision.COMMITTED, handler)

    def nonxa_committed(self, seq: int) -> None:
        self._answer(Direction.INBOUND, seq, Decision.NONXA_COMMITTED, NonXaCommit(seq=seq))

    def _answer(self, direction: Direction, key: str | int, decision: Decision, frame: Frame) -> None:
        self._core.transfer(decision, lambda: self._reply(direction, key, decision, frame))

    def _reply(self, direction: Direction, key: str | int, decision: Decision, frame: Frame) -> State:
        self._check_xa(decision is not Decision.NONXA_COMMITTED, local=True)
        self._core.step(direction, key, decision, remote=False, frame=frame)
        return State.OPERATIONAL

    def _send_batch(self, key: str | int, decision: Decision, frame: Transaction | NonXaTransaction) -> None:
        """Open an outbound transaction by sending its batch (within the peer's largest frame)."""
        cost = transaction_cost(frame.messages)
        limit = self.peer_max_frame_size
        self._core.step(Direction.OUTBOUND, key, decision, remote=False, frame=frame, frame_limit=limit, cost=cost)

    def _check_xa(self, xa: bool, *, local: bool, frame: FrameType | None = None) -> None:
        use_xa = self._core.use_xa
        if xa != use_xa:
            what = f"{frame.name} frame" if frame else "this call"
            problem = f"{what} on a{' non-' if use_xa is False else 'n '}XA link"
            raise (LocalProtocolError if local else RemoteProtocolError)(problem)

    def _batch(self, messages: tuple[bytes, ...]) -> tuple[tuple[bytes, ...], bool]:
        """The ``messages`` and ``compressed`` fields of a TRANSACTION or NONXA_TRANSACTION
        of the owner's ``messages``, checked against the peer's limits (the window, the
        transaction size)."""
        assert self._peer_adjust is not None
        size = self._peer_adjust.transaction_size
        if not 1 <= len(messages) <= size or not all(type(m) is bytes for m in messages):
            raise LocalProtocolError(
                f"a transaction carries 1 to {size} messages (bytes; the peer's "
                f"inbound-transaction-size), got {len(messages)}"
            )
        if not self.window_available:
            sent = self._core.sent
            raise LocalProtocolError(
                f"no window available: {sent.awaiting} transactions ({sent.awaiting_bytes} bytes) "
                f"await their {'prepare' if self._core.use_xa else 'commit'} and {len(sent)} "
                f"({sent.open_bytes} bytes) are open (the send window is {self._send_window}, the peer's "
                f"inbound-window-bytes {self._peer_adjust.window_bytes})"
            )
        return pack_messages(messages, self.compression, self.peer_max_frame_size)

    # -- handlers (each returns the next state) ----------------------------------------------

    def _on_adjust(self, frame: Adjust) -> State | None:
        if frame.transaction_size < 1 or frame.window_size < 1:
            raise RemoteProtocolError(
                f"ADJUST with a zero size (transaction size {frame.transaction_size}, window size {frame.window_size})"
            )
        if frame.window_bytes < MIN_WINDOW_BYTES:
            raise RemoteProtocolError(
                f"ADJUST with a window of {frame.window_bytes} bytes (at least {MIN_WINDOW_BYTES})"
            )
        if frame.max_frame_size < HANDSHAKE_MAX_FRAME_SIZE:
            raise RemoteProtocolError(
                f"ADJUST with a maximum frame size of {frame.max_frame_size} bytes "
                f"(at least {HANDSHAKE_MAX_FRAME_SIZE})"
            )
        self._peer_adjust = frame
        self._send_window = frame.window_size
        return State.START_WAIT

    def _on_start_delivery(self, frame: StartDelivery) -> State | None:
        core, peer = self._core, self._peer_adjust
        assert peer is not None and core.peer is not None
        core.emit(
            Operational(
                peer=core.peer,
                version=core.version or "",
                peer_transaction_size=peer.transaction_size,
                peer_window_size=peer.window_size,
                peer_window_bytes=peer.window_bytes,
                keepalive_interval=core.keepalive_interval,
                use_xa=core.use_xa,
                compression=self.compression,
                unresolved=self._recovery.unresolved,
            )
        )
        return State.OPERATIONAL

    def _on_route(self, frame: Route) -> State | None:
        assert self._core.peer is not None
        if problem := route_problem(frame, first=self._core.peer):
            raise RemoteProtocolError(problem)
        self._core.emit(RouteReceived(add=frame.add, destination=frame.destination, path=frame.path))
        return State.OPERATIONAL

    def _received_batch(self, frame: Transaction | NonXaTransaction, key: str | int) -> tuple[bytes, ...]:
        """Check a received batch against our limits and open it; the transaction enters RECEIVED."""
        settings, received = self._core.settings, self._core.received
        label = f"{frame.TYPE.name} {key_text(key, bare=True)}"
        if key in received.phases:
            raise RemoteProtocolError(f"{label}: duplicate, it is open already ({received.phases[key].value})")
        if received.awaiting_bytes >= settings.inbound_window_bytes:
            raise RemoteProtocolError(
                f"{label} overruns our inbound-window-bytes of {settings.inbound_window_bytes} "
                f"({received.awaiting} transactions of {received.awaiting_bytes} bytes await our "
                f"{'prepare' if self._core.use_xa else 'commit'})"
            )
        if received.open_bytes >= OPEN_FACTOR * settings.inbound_window_bytes:
            raise RemoteProtocolError(
                f"{label}: more than {OPEN_FACTOR} × our inbound-window-bytes of "
                f"{settings.inbound_window_bytes} open ({len(received)} transactions of {received.open_bytes} bytes)"
            )
        if frame.compressed and not self.compression:
            raise RemoteProtocolError(f"{label} is compressed; compression was not agreed")
        messages = unpack_messages(frame.messages, frame.compressed, settings.max_frame_size)
        if not 1 <= len(messages) <= settings.inbound_transaction_size:
            raise RemoteProtocolError(
                f"{label} carries {len(messages)} messages (1 to our inbound-transaction-size "
                f"of {settings.inbound_transaction_size})"
            )
        cost = transaction_cost(frame.messages)
        self._core.step(Direction.INBOUND, key, frame.TYPE, remote=True, cost=cost)
        return messages

    def _on_transaction(self, frame: Transaction) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        if problem := xid_problem(frame.xid):
            raise RemoteProtocolError(f"TRANSACTION: {problem}")
        messages = self._received_batch(frame, frame.xid)
        self._core.emit(TransactionReceived(xid=frame.xid, messages=messages))
        return State.OPERATIONAL

    def _on_prepare_reply(self, frame: PrepareReply) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._core.step(Direction.OUTBOUND, frame.xid, frame.TYPE, remote=True)
        self._core.emit(PrepareReceived(xid=frame.xid))
        return State.OPERATIONAL

    def _on_refuse(self, frame: Refuse) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._core.step(Direction.OUTBOUND, frame.xid, frame.TYPE, remote=True)
        self._core.emit(TransactionRefused(xid=frame.xid, reason=printable(frame.reason) or "no reason given"))
        return State.OPERATIONAL

    def _on_commit(self, frame: Commit) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._core.step(Direction.INBOUND, frame.xid, frame.TYPE, remote=True)
        self._core.emit(CommitReceived(xid=frame.xid, recovery=self._core.state is State.RECOVERY_WAIT))
        return self._core.state

    def _on_commit_reply(self, frame: CommitReply) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._core.step(Direction.OUTBOUND, frame.xid, frame.TYPE, remote=True)
        recovery = self._core.state is State.RECOVERY_WAIT
        self._core.emit(CommitDone(xid=frame.xid, recovery=recovery))
        return self._recovery.progress() if recovery else State.OPERATIONAL

    def _on_nonxa_transaction(self, frame: NonXaTransaction) -> State | None:
        self._check_xa(False, local=False, frame=frame.TYPE)
        if frame.seq <= self._last_seq_in:
            raise RemoteProtocolError(
                f"NONXA_TRANSACTION {frame.seq} after {self._last_seq_in}: the sequence number must grow"
            )
        messages = self._received_batch(frame, frame.seq)
        self._last_seq_in = frame.seq
        self._core.emit(NonXaTransactionReceived(seq=frame.seq, messages=messages))
        return State.OPERATIONAL

    def _on_nonxa_commit(self, frame: NonXaCommit) -> State | None:
        self._check_xa(False, local=False, frame=frame.TYPE)
        self._core.step(Direction.OUTBOUND, frame.seq, frame.TYPE, remote=True)
        self._core.emit(NonXaCommitted(seq=frame.seq))
        return State.OPERATIONAL
