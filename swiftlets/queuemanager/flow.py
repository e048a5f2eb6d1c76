"""Flow control: how long a producer should wait before its next send."""

from __future__ import annotations

from .config import QueueSettings
from .entry import now_ms

__all__ = ["FlowController"]


class FlowController:
    """SwiftMQ's flow-control delay: how long a producer should wait before its next send.

    Zero while the queue's backlog (:attr:`Queue.backlog`: its entries but those held in
    transactions) is at most ``flowcontrol-start-queuesize``. Otherwise, over the
    current window: with send period ``stp = Δt / sent`` and receive period ``rtp = Δt /
    received``, ``d = rtp - stp`` and ``delay = d · sent / send-calls + (d + 2) · (size -
    start)`` — here every send is one call, so the first term is ``d`` — clamped to ``[0,
    max-flowcontrol-delay]``; without receives in the window the delay grows by 10 ms per
    call. The window restarts every second.

    Unlike SwiftMQ (no delay without receivers), a queue *without* receivers above its start
    size slows its producers too, as a window without receives does: a flood into a queue
    nobody reads is held back by the producers' credit long before it reaches the queue's
    ``max-messages``/``max-bytes`` (where sends are refused).
    """

    WINDOW_MS = 1000

    def __init__(self) -> None:
        self._reset(now_ms())

    def _reset(self, now: int) -> None:
        self._start, self.sent, self.received, self._growing = now, 0, 0, 0

    def delay(self, settings: QueueSettings, size: int, receivers: int, now: int) -> int:
        """The delay in ms for a producer sending at ``now`` (ms since the epoch)."""
        start = settings.flowcontrol_start_queuesize
        if start < 0 or size <= start:
            return 0
        if now - self._start >= self.WINDOW_MS:
            self._reset(now)
        if self.received == 0 or receivers == 0:
            self._growing += 10
            return min(self._growing, settings.max_flowcontrol_delay)
        self._growing = 0
        span = now - self._start
        if span < 1:
            span = 1
        d = span / self.received - span / (self.sent or 1)
        value = d + (d + 2) * (size - start)
        if value <= 0:
            return 0
        limit = settings.max_flowcontrol_delay
        return limit if value >= limit else int(value)
