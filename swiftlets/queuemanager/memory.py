"""The router's memory budget and its alarm, as RabbitMQ's memory alarm works.

Theory of operation
-------------------
What the router holds for its clients is counted here, as it changes, never by a walk:

- every queue entry not gone (available, delivered, held in a transaction): its encoded
  bytes while they are in memory, the length of its leading sections once its body is
  swapped out (only the store has it), plus :data:`ENTRY_COST` for the objects that hold
  it (:meth:`.queue.Queue.count` and ``uncount``, ``swap_out`` and ``fill``), or
  :data:`PACKED_COST` for a swapped-out one kept in a pack (:mod:`.level`);
- the bytes of incomplete incoming multi-frame messages each AMQP connection holds (the
  listener reports the change after each read).

Not counted: messages staged in open transactions (bounded per queue by its limits; they
are counted once committed), what is being read back from the store, routing's frames in
flight, per-connection protocol state and write buffers, the duplicate-id backlogs, and
the interpreter itself. So the figure is what clients can make the router hold, not its
resident set; ``bench/memory_bench.py`` prints both, per message.

Past the high-water mark (``memory-limit-kb``, by default ``memory-limit-percent`` of the
machine's memory) the alarm goes on: AMQP publishers get no new link credit (their links
stay attached; what they were granted before still comes in and is taken; a link attached
meanwhile gets none; users of sys$mgmt's groups are not held), routing links
hold the batches they receive (:meth:`QueueManager.when_room`, as for a full queue), and
consumers go on draining. With ``memory-alarm-non-persistent="refuse"`` a client's
non-persistent message that arrives on credit granted before the alarm is refused instead
of taken (a persistent one costs only its leading sections once past its queue's cache, so
it is always taken). Under the low-water mark (``memory-low-watermark-percent`` of
the limit) it goes off and everything waiting for it is called back. Each change is one
log line.

A change is one addition and one comparison (:meth:`MemoryAlarm.add`), cheap enough for
every message.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

__all__ = ["MemoryAlarm", "ENTRY_COST", "PACKED_COST", "machine_memory", "wait_in"]

log = logging.getLogger(__name__)


def wait_in(waiting: list[Callable[[], None]], callback: Callable[[], None]) -> Callable[[], None]:
    """Put ``callback`` in the list ``waiting`` (whose owner calls and clears it); the
    function that takes it out again, if it is still there."""
    waiting.append(callback)

    def cancel() -> None:
        if callback in waiting:
            waiting.remove(callback)

    return cancel


#: What a queue entry costs in memory besides the message bytes it keeps: its Entry object,
#: its id and size, the header of the bytes object (and a Message over them, in memory), its
#: deque slot, and the allocator's rounding. Measured with ``bench/memory_bench.py``, 200,000
#: 1 KiB messages: 240–257 bytes of RSS per swapped-out message beyond the 80 bytes of
#: leading sections it keeps, 322 per message in memory beyond its 1,103. One figure for
#: every entry, as cheap to count as the bytes.
ENTRY_COST = 280
#: What a swapped-out entry costs instead once it is packed (:mod:`.level`): its id, size,
#: delivery count and where its leading sections end, in arrays, and the arrays' slack.
PACKED_COST = 32


def machine_memory() -> int:
    """The bytes of memory this router may use: the machine's physical memory, or the
    limit of the control group it runs in (a container) when that is lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as file:
                text = file.read().strip()
        except OSError:
            continue
        if text.isdigit():  # ("max": no limit)
            total = min(total, int(text))
    return total


class MemoryAlarm:
    """The accounted bytes, the two water marks and who waits for the alarm to clear.

    ``limit``: the high-water mark in bytes (-1: no alarm); ``low_percent``: the low-water
    mark as a percentage of it. Everything runs in the router's trio thread.
    """

    def __init__(self, limit: int, low_percent: int, router: str = "", *, refuse_non_persistent: bool = False):
        self.router = router
        self.refuse_non_persistent = refuse_non_persistent  # memory-alarm-non-persistent="refuse"
        self.refused = 0  # non-persistent messages refused under the alarm
        self.messages = 0  # bytes accounted for queue entries
        self.buffers = 0  # bytes of incomplete incoming messages held by connections
        self.used = 0  # the two together
        self.on = False
        self.alarms = 0  # times it went on
        self._waiting: list[Callable[[], None]] = []
        self.limit = self.low = -1
        self.set_limits(limit, low_percent)

    def set_limits(self, limit: int, low_percent: int) -> None:
        """New water marks (a changed setting); the alarm goes on or off at once if they say so."""
        self.limit = limit
        self.low = -1 if limit < 0 else limit * low_percent // 100
        self._check()

    def add(self, size: int) -> None:
        """Queue entries now hold ``size`` more bytes (less, when negative)."""
        self.messages += size
        self.used += size
        if size > 0:
            if not self.on and self.used > self.limit >= 0:
                self._turn_on()
        elif self.on and self.used < self.low:
            self._turn_off()

    def add_buffered(self, size: int) -> None:
        """A connection holds ``size`` more bytes of incomplete messages (less, when negative)."""
        self.buffers += size
        self.used += size
        self._check()

    def when_clear(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While the alarm is on, call ``callback`` once it goes off and return a function
        that cancels the call; None when it is off."""
        if not self.on:
            return None
        return wait_in(self._waiting, callback)

    def _check(self) -> None:
        if not self.on and self.used > self.limit >= 0:
            self._turn_on()
        elif self.on and (self.limit < 0 or self.used < self.low):
            self._turn_off()

    def _turn_on(self) -> None:
        self.on = True
        self.alarms += 1
        log.warning(
            "router %s memory alarm on: %s accounted, above the high-water mark of %s (memory-limit-kb); "
            "publishers get no new credit and routing links hold their transfers until it is under %s",
            self.router,
            _size(self.used),
            _size(self.limit),
            _size(self.low),
        )

    def _turn_off(self) -> None:
        self.on = False
        log.info(
            "router %s memory alarm off: %s accounted, under the low-water mark of %s; publishers resume",
            self.router,
            _size(self.used),
            _size(self.low),
        )
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback()

    def usage(self) -> dict[str, Any]:
        return {
            "memory-used": self.used,
            "memory-messages": self.messages,
            "memory-buffers": self.buffers,
            "memory-limit": self.limit,
            "memory-low-watermark": self.low,
            "memory-alarm": self.on,
            "memory-alarms": self.alarms,
            "memory-waiting": len(self._waiting),
            "memory-refused": self.refused,
        }


def _size(count: int) -> str:
    if count < 0:
        return "no limit"
    return f"{count / 2**20:,.1f} MiB" if count >= 2**20 else f"{count / 1024:,.1f} KiB"
