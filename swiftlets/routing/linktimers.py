"""The routing link's timers: the stage deadlines, the reject-disconnect-delay, the keepalive; sans-IO.

Theory of operation
-------------------
The owner calls :meth:`~.stages.LinkMachine.tick` with the time at the deadline it
returned; :class:`LinkTimers` acts on it:

- each waiting state before delivery (both roles, owner admission included) is guarded by
  ``stage_valid_timeout``, the XA recovery stage by ``recovery_timeout``, counted from the
  first tick after the state began (the core forgets the deadline at each transition);
- a refused link is kept ``reject_disconnect_delay`` seconds, then ends;
- in delivery, SwiftMQ's keepalive: a KEEPALIVE every interval whatever else is sent, a
  counter reset to :data:`KEEPALIVE_COUNT` by each KEEPALIVE received and decremented at
  each interval; at 0 the link is closed. Interval 0 (the listener's setting, told to the
  connector in CONNECT_REPLY): no keepalive. (Reset on every KEEPALIVE received, however
  framed: SwiftMQ increments the counter instead for a KEEPALIVE that arrives inside a bulk
  frame, so a peer that had been sending bulk frames took longer to be found dead.)
"""

from __future__ import annotations

from .linkcore import Handler, LinkCore
from .linkstate import WAITING, State
from .wire import FrameType, Keepalive

KEEPALIVE_COUNT = 5  # SwiftMQ's: the counter starts at 5


class LinkTimers:
    """The timers of one link (see the module docstring)."""

    def __init__(self, core: LinkCore):
        self._core = core
        self._keepalive_next: float | None = None
        self.keepalive_counter = KEEPALIVE_COUNT

    def handlers(self) -> dict[FrameType, Handler]:
        """The frames this part handles."""
        return {FrameType.KEEPALIVE: self._on_keepalive}

    def _on_keepalive(self, frame: Keepalive) -> State | None:
        self.keepalive_counter = KEEPALIVE_COUNT
        return State.OPERATIONAL

    def tick(self, now: float) -> float:
        """Act on the time ``now``; the next deadline, 0 for none."""
        core = self._core
        state, settings = core.state, core.settings
        if state is State.CLOSED:
            return 0.0
        if state is State.REJECTING:
            if core.deadline is None:
                core.deadline = now + settings.reject_disconnect_delay
            if now >= core.deadline:
                core.state, core.ended = State.CLOSED, True
                return 0.0
            return core.deadline
        if state in WAITING:
            recovery = state is State.RECOVERY_WAIT
            timeout = settings.recovery_timeout if recovery else settings.stage_valid_timeout
            if core.deadline is None:
                core.deadline = now + timeout
            if now >= core.deadline:
                core.fail(
                    f"{'recovery-timeout' if recovery else 'stage-valid-timeout'} ({timeout:g} s) expired "
                    f"in the {core.stage.value} stage ({state.value})"
                )
                return 0.0
            return core.deadline
        return self._keepalive(now)  # OPERATIONAL

    def _keepalive(self, now: float) -> float:
        interval = self._core.keepalive_interval
        if not interval:
            return 0.0
        if self._keepalive_next is None:
            self._keepalive_next = now + interval
        elif now >= self._keepalive_next:
            self.keepalive_counter -= 1
            if self.keepalive_counter <= 0:
                self._core.fail(
                    f"no keepalive from {self._core.peer} for {KEEPALIVE_COUNT} intervals "
                    f"({KEEPALIVE_COUNT} × {interval:g} s)"
                )
                return 0.0
            self._core.send(Keepalive())
            self._keepalive_next += interval
            if self._keepalive_next <= now:  # ticked late: count from now, one decrement per tick
                self._keepalive_next = now + interval
        return self._keepalive_next
