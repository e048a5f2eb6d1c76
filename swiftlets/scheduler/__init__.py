"""``sys$scheduler``: calendars, schedules, and jobs that swiftlets offer.

Operators define calendars (which days) and schedules (which job, at which times of those
days, for how long at most); swiftlets and third-party plugins offer the jobs through the
hook ``martinet_scheduler_jobs`` (:mod:`.api`). Layout: :mod:`.api` (jobs, the hooks, the
:class:`~.api.Scheduler` protocol, bus events), :mod:`.config`, :mod:`.timing` (time
expressions, calendars, next start: pure), :mod:`.plans` (config to plans: pure),
:mod:`.swiftlet` (the planner and the runs), :mod:`.jobs` (its own job, Message Sender)
and :mod:`.command` (``martinet schedule next CONFIG``: the next planned starts, without a
router). Start it
after the swiftlets whose jobs it runs (and after ``sys$store``, to report missed starts).
"""

from __future__ import annotations

from martinet.kernel import Command, PoolSpec, SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .api import SchedulerHooks
    from .config import SchedulerConfig
    from .plans import check_config
    from .swiftlet import POOL, SchedulerSwiftlet

    return [
        SwiftletSpec(
            name="sys$scheduler",
            description="Calendars and schedules that start jobs offered by swiftlets.",
            config=SchedulerConfig,
            factory=SchedulerSwiftlet,
            pools=(
                PoolSpec(POOL, "Runs the jobs of the schedules, each until it ends or is stopped.", max_concurrency=10),
            ),
            hookspecs=SchedulerHooks,
            check=check_config,
        )
    ]


@hookimpl
def martinet_commands() -> list[Command]:
    from .command import SCHEDULE_COMMAND

    return [SCHEDULE_COMMAND]


@hookimpl
def martinet_scheduler_jobs() -> list:
    from .jobs import SCHEDULER_JOBS

    return [SCHEDULER_JOBS]  # the Message Sender, see .jobs
