"""The core of the routing link machine: the state, frames in and out, events, the end; sans-IO.

Theory of operation
-------------------
:class:`LinkCore` is the one place that changes a link's state: it reads frames, looks
each input up in :data:`~.linkstate.TRANSITIONS`, calls the handler the parts of the link
machine registered for it (:mod:`.handshake`, :mod:`.xarecovery`, :mod:`.delivery`,
:mod:`.linktimers`), and enters the state the handler returns. It also holds what the
parts share: the output, the events, the open transactions of both directions (one
:class:`~.window.Ledger` each) and what the handshake agreed.

- **Refusals** (version, name, admission, authentication) are written, the
  :class:`~.linkevents.Closed` event is emitted at once, and the core keeps the socket
  ``reject_disconnect_delay`` seconds (reading and dropping input) before the output ends,
  so the peer reads the reason before the socket goes; the peer closing its side ends the
  wait early.
- **Breaches** (a malformed, oversized, unknown or unexpected frame): a CLOSE with the
  reason is written, :class:`~.linkevents.Closed` (``by_peer`` false) emitted, and the link
  ends once the CLOSE is taken. Nothing is raised out of :meth:`LinkCore.receive_data`.
- **Misuse by the owner** (a decision the table lacks for the state, a transaction step
  its phase table lacks) raises :class:`~.wire.LocalProtocolError` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .linkevents import Closed, Event
from .linkstate import ENDED, MAX_REASON, MAX_UNREAD, STAGE_OF, TRANSITIONS, LinkSettings, Role, Stage, State, printable
from .window import Decision, Direction, Ledger, NoTransition, Phase
from .wire import (
    HANDSHAKE_MAX_FRAME_SIZE,
    MAGIC,
    Adjust,
    Close,
    Frame,
    FrameReader,
    FrameType,
    LocalProtocolError,
    RemoteProtocolError,
    StartDelivery,
    encode,
)


def key_text(key: str | int, *, bare: bool = False) -> str:
    """A transaction's key for a message: ``xid 'a'`` or ``seq 7`` (``bare``: ``'a'`` or ``7``)."""
    if isinstance(key, str):
        return f"{'' if bare else 'xid '}{printable(key, 80)!r}"
    return f"{'' if bare else 'seq '}{key!r}"[:100]


Handler = Callable[[Any], "State | None"]  # a frame's handler: the next state, None when it ended the link


class LinkCore:
    """The state of one link and its only way to change: frames in, frames out, events,
    the transitions, the end. The parts (:mod:`.handshake`, :mod:`.xarecovery`,
    :mod:`.delivery`, :mod:`.linktimers`) act through it; :class:`~.stages.LinkMachine`
    is the owner's face of it all."""

    def __init__(self, role: Role, name: str, settings: LinkSettings, *, now: float):
        self.role = role
        self.name = name
        self.settings = settings
        self.state = State.PROTOCOL_WAIT
        self.stage = Stage.PROTOCOL
        self.reader = FrameReader(HANDSHAKE_MAX_FRAME_SIZE)
        self.out: list[bytes] = []
        self.events: list[Event] = []
        self.deadline: float | None = now + settings.stage_valid_timeout  # None: set at the next tick
        self.ended = False  # data_to_send returns None once the output is taken
        self.handlers: dict[FrameType, Handler] = {}  # the parts' handlers of the frames received
        self._close_sent = False
        self._magic_sent = False
        # what the handshake agreed
        self.peer: str | None = None
        self.version: str | None = None
        self.peer_use_xa = False
        self.keepalive_interval = settings.keepalive_interval if role is Role.LISTENER else 0.0
        # open transactions per direction, oldest first, and how many per phase
        self.sent = Ledger(Direction.OUTBOUND)
        self.received = Ledger(Direction.INBOUND)

    @property
    def use_xa(self) -> bool:
        return self.settings.use_xa or self.peer_use_xa

    # -- input -------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        """See :meth:`.stages.LinkMachine.receive_data`."""
        if self.state is State.CLOSED:
            return
        if not data:
            if self.state is State.REJECTING:
                self.state, self.ended = State.CLOSED, True
            else:
                self.end(f"the peer closed the connection ({self.state.value})", by_peer=True)
            return
        if self.state is State.REJECTING:
            return
        self.reader.feed(data)
        if self.state is State.ADMISSION and self.reader.buffered > MAX_UNREAD:
            # the owner has not decided yet and the peer keeps sending: a well-behaved peer
            # has sent at most a few small frames (ADJUST, START_DELIVERY) by now
            self.fail(
                f"{self.reader.buffered} bytes received while awaiting the owner's admission (at most {MAX_UNREAD})"
            )
            return
        self._process()

    def _process(self) -> None:
        """Handle the complete frames received, until admission or the end."""
        while self.state not in ENDED and self.state is not State.ADMISSION:
            try:
                frame = self.reader.next_frame()
                if frame is None:
                    return
                self._on_frame(frame)
            except RemoteProtocolError as exc:
                self.fail(str(exc))

    def _on_frame(self, frame: Frame) -> None:
        if frame.TYPE is FrameType.CLOSE:
            assert isinstance(frame, Close)
            self.end(printable(frame.reason) or "closed by the peer (no reason given)", by_peer=True)
            return
        allowed = TRANSITIONS.get((self.role, self.state, frame.TYPE))
        if allowed is None:
            raise RemoteProtocolError(f"unexpected {frame.TYPE.name} frame while {self.state.value}")
        self._move(self.handlers[frame.TYPE](frame), allowed)

    # -- the owner's decisions ---------------------------------------------------------------

    def decide(self, decision: Decision, handler: Callable[[], State | None]) -> None:
        """Carry out an owner's decision by ``handler`` (nothing once the link ended)."""
        if self.state in ENDED:
            return
        allowed = TRANSITIONS.get((self.role, self.state, decision))
        if allowed is None:
            raise LocalProtocolError(f"{decision.value} while {self.state.value}")
        self._move(handler(), allowed)
        self._process()  # what the peer sent after its identification

    def transfer(self, decision: Decision, handler: Callable[[], State | None]) -> bool:
        """An owner's transfer call: False once the link ended (nothing done)."""
        if self.state in ENDED:
            return False
        self.decide(decision, handler)
        return True

    def _move(self, following: State | None, allowed: tuple[State, ...]) -> None:
        """Enter the state a handler chose (None: it ended the link)."""
        if following is None or self.state in ENDED:
            return
        if following not in allowed:
            raise AssertionError(f"{following} is not a transition listed for {self.state}")  # a bug here
        if following is not self.state:
            self.state = following
            self.stage = STAGE_OF[following]
            self.deadline = None  # the new state's timer starts at the next tick

    def step(
        self,
        direction: Direction,
        key: str | int,
        step: FrameType | Decision,
        *,
        remote: bool,
        frame: Frame | None = None,
        frame_limit: int | None = None,
        cost: int = 0,
    ) -> Phase | None:
        """Move transaction ``key`` of one direction by its phase table (``cost``: of one
        being opened); ``frame`` is sent first, within ``frame_limit`` bytes (an encoding
        error then changes nothing). A step the table lacks raises."""
        ledger = self.sent if direction is Direction.OUTBOUND else self.received
        try:
            ledger.check(key, step)
        except NoTransition as missing:
            what = f"{step.name} frame" if remote else step.value
            held = f"is {missing.current.value}" if missing.current else "is not open"
            problem = f"{what} for {key_text(key)}, which {held} ({direction.value})"
            raise (RemoteProtocolError if remote else LocalProtocolError)(problem) from None
        if frame is not None:
            self.send(frame, frame_limit)
        return ledger.move(key, step, cost)

    def enter_delivery(self) -> State:
        """The delivery stage begins: our limits (ADJUST), then START_DELIVERY."""
        settings = self.settings
        self.send(
            Adjust(
                transaction_size=settings.inbound_transaction_size,
                window_size=settings.inbound_window_size,
                window_bytes=settings.inbound_window_bytes,
                max_frame_size=settings.max_frame_size,
                compression=settings.use_compression,
            )
        )
        self.send(StartDelivery())
        return State.ADJUST_WAIT

    # -- output and ending -------------------------------------------------------------------

    def send(self, frame: Frame, max_frame_size: int | None = None) -> None:
        data = encode(frame, max_frame_size or self.settings.max_frame_size)
        if not self._magic_sent:
            self.out.append(MAGIC)
            self._magic_sent = True
        self.out.append(data)

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def _closed(self, reason: str, *, by_peer: bool) -> None:
        self.events.append(
            Closed(
                reason=reason,
                by_peer=by_peer,
                peer=self.peer,
                stage=self.stage,
                outbound=tuple(self.sent.phases.items()),
                inbound=tuple(self.received.phases.items()),
            )
        )

    def end(self, reason: str, *, by_peer: bool) -> None:
        """The link is over now (after what is queued is taken)."""
        self.state, self.ended = State.CLOSED, True
        self._closed(reason, by_peer=by_peer)

    def fail(self, reason: str) -> None:
        """We end the link (a breach, a timeout, the owner): CLOSE with the reason, then over."""
        self._send_close(reason)
        self.end(reason, by_peer=False)

    def _send_close(self, reason: str) -> None:
        if not self._close_sent:
            self._close_sent = True
            self.send(Close(reason=reason[:MAX_REASON]))

    def refuse(self, reason: str, frame: Frame | None = None, local_reason: str | None = None) -> None:
        """We refuse the peer: ``frame`` (a refusing reply) or a CLOSE carries ``reason``;
        the socket stays for the reject-disconnect-delay. ``local_reason``: what our own
        event says when it may say more than the peer is told."""
        if frame is None:
            self._send_close(reason)
        else:
            self.send(frame)
        self.state, self.deadline = State.REJECTING, None
        self._closed(local_reason or reason, by_peer=False)

    def close(self, reason: str) -> None:
        """See :meth:`.stages.LinkMachine.close`."""
        if self.state is State.REJECTING:
            self.state, self.ended = State.CLOSED, True
        elif self.state is not State.CLOSED:
            self.fail(reason)
