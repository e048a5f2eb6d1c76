"""Durable subscriptions nobody consumes whose backlog keeps growing.

A durable subscription keeps every message published to its topic until its subscriber
comes back — also when the subscriber never comes back (an application, or a metrics
pipeline, given up without unsubscribing): then its queue grows without bound, quietly.
:class:`BacklogWatch` makes that visible.

Every ``backlog-check-interval`` it looks at each durable subscription. Per subscription it
keeps a *baseline*: the smallest backlog seen since the subscription last had a consumer
(or since the watch first saw it: after a restart a stable backlog is not news). The
subscription's backlog is **growing** when it has no consumer, holds at least
``unconsumed-backlog-warning`` messages, and holds more than its baseline. A consumer
resets the baseline. So a subscriber that is away for a while is flagged only once its
backlog passed the threshold, and the flag holds, without flapping, while nobody consumes
and the backlog stays above the threshold — whether or not something was published since
the last check.

What it shows: :attr:`BacklogWatch.growing` (``backlog-growing`` of each
``/sys$topicmanager/usage/durable-subscribers/<queue>``, and their count
``durable-backlogs-growing`` in ``/sys$topicmanager/usage``: both reach ``/metrics``), and
one WARNING line when a subscription grows that no warning named in the last
:data:`REMIND_INTERVAL` seconds — listing every growing one (the largest few by name), so the
log gets at most one line per check, and a subscription starts a warning at most once an
hour however often it stops and starts growing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

__all__ = ["BacklogWatch", "REMIND_INTERVAL"]

log = logging.getLogger(__name__)

#: Seconds before a warning names a subscription that a warning named already.
REMIND_INTERVAL = 3600.0
#: Subscriptions named in one warning line (the count says how many there are in all).
NAMED = 5

#: Per durable subscription: (queue name, backlog, has a consumer).
Snapshot = Callable[[], Iterable[tuple[str, int, bool]]]


class BacklogWatch:
    """Checks the durable subscriptions given by ``snapshot`` every ``interval()`` ms against
    the threshold ``threshold()`` (messages; -1: never), both read at every check so that
    management changes take effect at the next one."""

    def __init__(self, snapshot: Snapshot, *, threshold: Callable[[], int], interval: Callable[[], int]):
        self._snapshot = snapshot
        self._threshold = threshold
        self._interval = interval
        self._baselines: dict[str, int] = {}
        self._warned: dict[str, float] = {}  # queue → when a warning last named it
        self.growing: dict[str, int] = {}  # queue → backlog at the last check

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self._interval() / 1000)
            self.check(trio.current_time())

    def check(self, now: float) -> None:
        """One look at every durable subscription; logs the warning when it is due."""
        threshold = self._threshold()
        baselines: dict[str, int] = {}
        growing: dict[str, int] = {}
        for name, backlog, consumed in self._snapshot():
            baseline = backlog if consumed else min(backlog, self._baselines.get(name, backlog))
            baselines[name] = baseline
            if not consumed and 0 <= threshold <= backlog and backlog > baseline:
                growing[name] = backlog
        self._baselines, self.growing = baselines, growing  # deleted subscriptions are forgotten
        self._warned = {name: when for name, when in self._warned.items() if name in baselines}
        if any(now - self._warned.get(name, -REMIND_INTERVAL) >= REMIND_INTERVAL for name in growing):
            self._warn(threshold)
            self._warned.update(dict.fromkeys(growing, now))

    def _warn(self, threshold: int) -> None:
        largest = sorted(self.growing.items(), key=lambda item: (-item[1], item[0]))
        named = ", ".join(f"{name} ({backlog} messages)" for name, backlog in largest[:NAMED])
        more = f" and {len(largest) - NAMED} more" if len(largest) > NAMED else ""
        log.warning(
            "%d durable subscription(s) without a consumer keep growing past unconsumed-backlog-warning %d: "
            "%s%s; delete an abandoned one with martinet admin delete "
            "'/sys$topicmanager/usage/durable-subscribers' NAME --force",
            len(largest),
            threshold,
            named,
            more,
        )
