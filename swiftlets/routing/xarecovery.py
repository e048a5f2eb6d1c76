"""The routing link's XA recovery stage: what the last connection left prepared; sans-IO.

Theory of operation
-------------------
Only when the link uses XA (either side asked), between authentication and delivery. The
machine asks its owner for the xids it holds prepared as a receiver from this peer
(:class:`~.linkevents.RecoveryRequested` → :meth:`~.stages.LinkMachine.recovery_list`,
sent in RECOVERY), hands it the peer's list (:class:`~.linkevents.RecoveryReceived`), and
sends the COMMITs the owner decided (:meth:`~.stages.LinkMachine.recovery_done`); the
stage ends when both sides sent RECOVERY_DONE, which each sends once every COMMIT it sent
was answered. Guarded by ``recovery_timeout`` (:mod:`.linktimers`). The xids we listed
that the peer did not commit stay prepared here, in doubt: :attr:`XaRecovery.unresolved`,
told to the owner in :class:`~.linkevents.Operational`.

The recovery COMMITs and their answers move the transactions of the core's ledgers like
those of the delivery stage (:mod:`.delivery` handles the COMMIT frames of both).
"""

from __future__ import annotations

from collections.abc import Iterable

from .linkcore import Handler, LinkCore
from .linkevents import RecoveryReceived, RecoveryRequested
from .linkstate import State, xids_problem
from .window import Decision, Direction, Phase
from .wire import Commit, FrameType, LocalProtocolError, Recovery, RecoveryDone, RemoteProtocolError


class XaRecovery:
    """The XA recovery stage of one link (see the module docstring)."""

    def __init__(self, core: LinkCore):
        self._core = core
        self._list_sent = False
        self._peer_list: tuple[str, ...] | None = None
        self._done_called = False
        self._done_sent = False
        self._peer_done = False
        self.unresolved: tuple[str, ...] = ()  # listed by us, not committed by the peer: in doubt

    def handlers(self) -> dict[FrameType, Handler]:
        """The frames this part handles."""
        return {FrameType.RECOVERY: self._on_recovery, FrameType.RECOVERY_DONE: self._on_recovery_done}

    def begin(self) -> State:
        """The stage begins: the owner is asked for its list."""
        assert self._core.peer is not None
        self._core.emit(RecoveryRequested(peer=self._core.peer))
        return State.RECOVERY_WAIT

    # -- the owner's calls -------------------------------------------------------------------

    def recovery_list(self, xids: Iterable[str]) -> None:
        """Answer :class:`~.linkevents.RecoveryRequested`: the routing xids we hold prepared
        as a receiver from this peer (sent in RECOVERY; the peer commits those it committed
        as a sender). Does nothing once the link ended.

        Raises:
            LocalProtocolError: not in the recovery stage, given already, or an invalid xid.
        """
        core, xids = self._core, tuple(xids)

        def handler() -> State | None:
            if self._list_sent:
                raise LocalProtocolError("recovery_list given twice")
            if problem := xids_problem(xids):
                raise LocalProtocolError(problem)
            core.send(Recovery(xids=xids))  # raises (nothing changed) when it does not fit a frame
            self._list_sent = True
            for xid in xids:
                core.step(Direction.INBOUND, xid, Decision.RECOVERY_LIST, remote=False)
            return self.progress()

        core.decide(Decision.RECOVERY_LIST, handler)

    def recovery_done(self, commit: Iterable[str] = ()) -> None:
        """Answer :class:`~.linkevents.RecoveryReceived` once the owner's local commits and
        rollbacks are durable: ``commit``, the xids of the peer's list that the peer must
        commit (by the recovery table: every xid it listed). A COMMIT goes for each; the
        stage ends when each was answered (:class:`~.linkevents.CommitDone` with
        ``recovery``) and the peer is done too. Does nothing once the link ended.

        Raises:
            LocalProtocolError: not in the recovery stage, before the peer's RECOVERY,
                twice, or an xid the peer did not list (or listed twice here).
        """
        core, commit = self._core, tuple(commit)

        def handler() -> State | None:
            if self._peer_list is None:
                raise LocalProtocolError("recovery_done before the peer's RECOVERY")
            if self._done_called:
                raise LocalProtocolError("recovery_done given twice")
            listed = set(self._peer_list)
            if len(set(commit)) != len(commit) or not listed.issuperset(commit):
                raise LocalProtocolError(
                    "recovery_done may commit only xids the peer listed, each once; not "
                    f"{[x for x in commit if x not in listed][:3] or 'duplicates'}"[:300]
                )
            self._done_called = True
            for xid in commit:
                core.step(Direction.OUTBOUND, xid, Decision.RECOVERY_DONE, remote=False)
                core.send(Commit(xid=xid))
            return self.progress()

        core.decide(Decision.RECOVERY_DONE, handler)

    # -- handlers and progress ---------------------------------------------------------------

    def _on_recovery(self, frame: Recovery) -> State | None:
        if self._peer_list is not None:
            raise RemoteProtocolError("RECOVERY received twice")
        if problem := xids_problem(frame.xids):
            raise RemoteProtocolError(f"RECOVERY: {problem}")
        assert self._core.peer is not None
        self._peer_list = frame.xids
        self._core.emit(RecoveryReceived(peer=self._core.peer, xids=frame.xids))
        return State.RECOVERY_WAIT

    def _on_recovery_done(self, frame: RecoveryDone) -> State | None:
        if self._peer_done:
            raise RemoteProtocolError("RECOVERY_DONE received twice")
        if not self._list_sent:
            raise RemoteProtocolError("RECOVERY_DONE before our RECOVERY was sent")
        if self._core.received.counts[Phase.COMMITTING]:
            raise RemoteProtocolError("RECOVERY_DONE while its COMMITs await our COMMIT_REPLY")
        self._peer_done = True
        return self.progress()

    def progress(self) -> State:
        """Send our RECOVERY_DONE when it is due; the delivery stage once both are done."""
        core = self._core
        if self._done_called and not self._done_sent and not core.sent.counts[Phase.COMMITTING]:
            core.send(RecoveryDone())
            self._done_sent = True
        if not (self._done_sent and self._peer_done):
            return State.RECOVERY_WAIT
        self.unresolved = tuple(str(xid) for xid in core.received.phases)  # all IN_DOUBT: committing ones answered
        core.received.clear()
        return core.enter_delivery()
