"""The queue manager's scheduler jobs (group ``Queue Manager``), offered through the hook
``martinet_scheduler_jobs``.

- **Queue Purger** — removes every available message of the queues a name or SQL-LIKE
  predicate matches (``Queue Name``: ``orders`` or ``tmp%``).
- **Queue Cleanup** — takes the expired messages out of the matching queues now, instead of
  at their next ``cleanup-interval``: dropped, or moved to ``routerdlq`` where the queue's
  ``expired-to-dlq`` says so.
- **Queue Cleanup DLQ** — the same, always to ``routerdlq``.
- **Queue Mover** — moves the messages of ``Source Queue`` (those a JMS ``Selector`` matches,
  if one is given) to ``Target Queue``, which may be remote (``q@router``: then they travel
  the routing network), in local transactions of up to 500 messages: each batch is sent and
  acknowledged atomically, so a crash moves a batch entirely or not at all.

Purging and moving are :mod:`.operations` (as an operator's purge and move): messages
delivered to other consumers and not yet settled stay where they are, and in ``exclusive``
mode a queue with a consumer refuses the job. Between batches the job yields, so stopping it
(``max-runtime`` or an operator) ends it at a batch boundary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from martinet.messaging.like import like_pattern
from martinet.messaging.selector import compile_selector
from martinet.swiftlets.scheduler.api import Job, JobError, JobGroup, JobParameter, JobRun

from . import operations
from .api import QueueError, QueueManager, check_queue_name

__all__ = ["QUEUE_JOBS"]


def _matching(manager: QueueManager, predicate: str) -> list:
    pattern = like_pattern(predicate)
    return [queue for name, queue in sorted(manager.queues.items()) if pattern.matches(name)]


async def purge(run: JobRun) -> str:
    counts = []
    for queue in _matching(run.swiftlet, run.parameters["Queue Name"]):
        try:
            counts.append(f"{queue.name}: {await operations.purge(queue)}")
        except QueueError as exc:
            raise JobError(f"queue {queue.name}: {exc}") from None
    return f"messages purged: {', '.join(counts)}" if counts else "no queue matches"


def _cleanup(to_dlq: bool | None) -> Callable[[JobRun], Awaitable[str]]:
    async def cleanup(run: JobRun) -> str:
        queues = _matching(run.swiftlet, run.parameters["Queue Name"])
        counts = [f"{queue.name}: {queue.remove_expired(to_dlq)}" for queue in queues]
        return f"expired messages removed: {', '.join(counts)}" if counts else "no queue matches"

    return cleanup


async def move(run: JobRun) -> str:
    manager: QueueManager = run.swiftlet
    source, target = run.parameters["Source Queue"], run.parameters["Target Queue"]
    queue = manager.queues.get(source)
    if queue is None:
        raise JobError(f"no queue {source!r}")
    try:
        moved = await operations.move(manager, queue, target, run.parameters.get("Selector", ""))
    except QueueError as exc:
        raise JobError(f"moving {source} to {target}: {exc}") from None
    return f"{moved} messages moved from {source} to {target}"


def _queue_name(name: str) -> None:
    try:
        check_queue_name(name)
    except QueueError as exc:
        raise ValueError(str(exc)) from None


def _target(address: str) -> None:
    _queue_name(address.partition("@")[0])


QUEUE_NAME = JobParameter(
    name="Queue Name",
    description="A queue name or a SQL-LIKE predicate on queue names (% any run, _ one character).",
    check=like_pattern,
)

QUEUE_JOBS = JobGroup(
    name="Queue Manager",
    swiftlet="sys$queuemanager",
    jobs=[
        Job(
            name="Queue Purger",
            run=purge,
            parameters=[QUEUE_NAME],
            description="Removes every available message of the matching queues.",
        ),
        Job(
            name="Queue Cleanup",
            run=_cleanup(None),
            parameters=[QUEUE_NAME],
            description="Removes the expired messages of the matching queues now (to routerdlq where the queue's "
            "expired-to-dlq says so).",
        ),
        Job(
            name="Queue Cleanup DLQ",
            run=_cleanup(True),
            parameters=[QUEUE_NAME],
            description="Moves the expired messages of the matching queues to routerdlq now.",
        ),
        Job(
            name="Queue Mover",
            run=move,
            description="Moves the messages of a queue (optionally those a selector "
            "matches) to another queue, local or q@router, in local transactions.",
            parameters=[
                JobParameter(name="Source Queue", description="The local queue to empty.", check=_queue_name),
                JobParameter(name="Target Queue", description="Where the messages go: q or q@router.", check=_target),
                JobParameter(
                    name="Selector",
                    description="A JMS selector; only matching messages move.",
                    mandatory=False,
                    check=compile_selector,
                ),
            ],
        ),
    ],
)
