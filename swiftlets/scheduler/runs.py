"""One run of a scheduled job, as the pool executes it: :func:`perform`.

The job runs in the run's cancel scope (its deadline is the schedule's ``max-runtime``, an
operator's ``stop`` cancels it) and its outcome is classified for the history: ``success``,
``stopped`` (by the deadline, an operator, or the scheduler stopping), ``failed`` (the job
raised :class:`.api.JobError`, which may forbid further runs, or anything unexpected, logged
with its traceback) or ``invalid`` (bad parameters, or the job group's swiftlet is not
running).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs

from martinet.kernel import SwiftletContext

from .api import JobError, JobRun, JobStarted
from .config import ScheduleConfig
from .history import Run, iso

__all__ = ["Outcome", "perform"]


@attrs.define
class Outcome:
    """How a run ended; what it says until the job gets further: the scheduler stopped it."""

    outcome: str = "stopped"
    message: str = "the scheduler stopped"
    further_runs: bool = True


async def perform(
    context: SwiftletContext,
    schedule: str,
    config: ScheduleConfig,
    run: Run,
    remember: Callable[[], Awaitable[None]],
    outcome: Outcome,
) -> None:
    """Run ``run``'s job for ``schedule`` after ``remember`` (which keeps the start in the
    store), and set ``outcome``. Nothing is raised but the cancellation of the scheduler
    itself (``outcome`` then says ``stopped``)."""
    group, job = run.group, run.job
    context.bus.publish(
        JobStarted(schedule=schedule, job_group=group.name, job_name=job.name, planned=iso(run.planned))
    )
    if config.logging_enabled:
        context.log.info("schedule %s: job %s/%s started", schedule, group.name, job.name)
    try:
        with run.scope:
            await remember()
            parameters = job.resolve({p.name: p.value for p in config.parameters.values()})
            owner = context.lookup(group.swiftlet, object) if group.swiftlet else None
            job_run = JobRun(
                schedule=schedule,
                parameters=parameters,
                swiftlet=owner,
                management=context.management,
                router_name=context.router_name,
                lookup=context.lookup,
                log=context.log,
                cleanup_scope=context.shutdown_scope,
            )
            outcome.message = await job.run(job_run) or ""
            outcome.outcome = "success"
        if run.scope.cancelled_caught:
            outcome.outcome = "stopped"
            outcome.message = run.stopped_by or f"max-runtime {config.max_runtime} reached"
    except JobError as exc:
        outcome.outcome, outcome.message, outcome.further_runs = "failed", str(exc), exc.further_runs
    except (ValueError, LookupError) as exc:  # parameters, or the group's swiftlet is not running
        outcome.outcome, outcome.message = "invalid", str(exc)
    except Exception as exc:
        outcome.outcome, outcome.message = "failed", f"{type(exc).__name__}: {exc}"
        context.log.exception("schedule %s: job %s/%s failed", schedule, group.name, job.name)
