"""The scheduler's public interface: jobs, how swiftlets offer them, and its bus events.

Offering jobs. Any plugin — a built-in swiftlet or a third-party package — offers job
groups by implementing the hook :meth:`SchedulerHooks.martinet_scheduler_jobs`::

    from martinet.kernel import hookimpl
    from martinet.swiftlets.scheduler.api import Job, JobGroup, JobParameter

    async def purge(run: JobRun) -> str:
        queue = run.parameters["Queue Name"]
        ...
        return f"{n} messages removed"

    @hookimpl
    def martinet_scheduler_jobs() -> list[JobGroup]:
        return [JobGroup(name="Queue Manager", swiftlet="sys$queuemanager", jobs=[
            Job(name="Queue Purger", description="…", run=purge,
                parameters=[JobParameter(name="Queue Name", description="…")])])]

``sys$scheduler`` calls the hook when it starts: the groups are registered then and are gone
when it stops (SwiftMQ's ``addJobFactory`` at the scheduler's start, ``removeAll`` at its
stop). A swiftlet may also register groups while it runs with :meth:`Scheduler.register`.

A job runs as one async call, ``await job.run(run)``, in the scheduler's pool:

- it **succeeds** by returning (a message, or ``None``);
- it **fails** by raising: :class:`JobError` with a message for the operator, optionally
  forbidding further runs of its schedule; any other exception is a failure too (a bug:
  logged with its traceback);
- it is **stopped** by cancellation — when the schedule's ``max-runtime`` is reached or an
  operator stops it. A job releases what it holds in ``finally``; cleanup that must await
  runs under ``run.cleanup_scope()`` (shielded, bounded). A job that runs until stopped
  (the Routing Connector: a link up for a window) simply awaits ``trio.sleep_forever()``.

Everything here is plain data or a protocol; the running swiftlet is in :mod:`.swiftlet`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from martinet.kernel import Event, hookspec

__all__ = [
    "Job",
    "JobError",
    "JobGroup",
    "JobParameter",
    "JobRun",
    "Scheduler",
    "SchedulerHooks",
    "WallClock",
    "JobStarted",
    "JobFinished",
    "RunsMissed",
]


class JobError(Exception):
    """A job failed; the message says why, for the operator.

    Attributes:
        further_runs: False forbids further runs of the schedule (it stays ``finished``
            until its config changes), e.g. a job whose target is gone for good.
    """

    def __init__(self, message: str, *, further_runs: bool = True):
        super().__init__(message)
        self.further_runs = further_runs


def _no_check(_value: str) -> None:
    return None


# The converters of the sequences below (typed: the attrs plugin cannot bind the type
# variable of the generic tuple).
def _parameters(parameters: Iterable[JobParameter]) -> tuple[JobParameter, ...]:
    return tuple(parameters)


def _jobs(jobs: Iterable[Job]) -> tuple[Job, ...]:
    return tuple(jobs)


@attrs.frozen(kw_only=True)
class JobParameter:
    """A parameter a job takes (SwiftMQ's ``JobParameter``).

    Attributes:
        name: as schedules name it in ``<parameter name="…" value="…"/>``.
        description: for the operator.
        default: the value when a schedule gives none; ``None``: none.
        mandatory: a schedule must give a value (or the default is used, if any) by the time
            it is enabled.
        check: raises ``ValueError`` for a value the job cannot use (SwiftMQ's verifier);
            a schedule with such a value is refused when added or changed.
    """

    name: str
    description: str
    default: str | None = None
    mandatory: bool = True
    check: Callable[[str], object] = attrs.field(default=_no_check, eq=False, repr=False)  # (its result unused)


@attrs.frozen(kw_only=True)
class Job:
    """A job a group offers.

    Attributes:
        name: unique within its group.
        description: for the operator.
        parameters: what it takes, in order.
        run: ``await run(job_run)`` does the work (see the module header for the contract).
    """

    name: str
    description: str
    run: Callable[[JobRun], Awaitable[str | None]] = attrs.field(eq=False, repr=False)
    parameters: Sequence[JobParameter] = attrs.field(default=(), converter=_parameters)

    def resolve(self, given: Mapping[str, str], *, complete: bool = True) -> dict[str, str]:
        """The values a run gets: ``given`` checked, defaults filled in.

        ``complete=False`` lets mandatory parameters be missing (a disabled schedule is
        built up one parameter at a time; it must be complete when enabled).

        Raises:
            ValueError: an unknown parameter, a mandatory one missing, or a value its check
                refuses — every problem, separated by "; ".
        """
        declared = {p.name: p for p in self.parameters}
        problems = [
            f"unknown parameter {name!r} (parameters: {', '.join(declared) or 'none'})"
            for name in given
            if name not in declared
        ]
        values: dict[str, str] = {}
        for parameter in self.parameters:
            value = given.get(parameter.name, parameter.default)
            if value is None:
                if parameter.mandatory and complete:
                    problems.append(f"parameter {parameter.name!r} missing ({parameter.description})")
                continue
            try:
                parameter.check(value)
            except ValueError as exc:
                problems.append(f"parameter {parameter.name!r}: {exc}")
            values[parameter.name] = value
        if problems:
            raise ValueError("; ".join(problems))
        return values


@attrs.frozen(kw_only=True)
class JobGroup:
    """Jobs offered together, normally by one swiftlet.

    Attributes:
        name: e.g. ``Routing``; unique in a scheduler.
        jobs: the jobs, by name unique.
        swiftlet: the swiftlet the jobs work on, e.g. ``sys$routing``: a run gets that
            running swiftlet's object as ``run.swiftlet`` and fails if it is not running.
            ``None``: the jobs need no swiftlet's object.
    """

    name: str
    jobs: Sequence[Job] = attrs.field(converter=_jobs)
    swiftlet: str | None = None

    def __attrs_post_init__(self) -> None:
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job group {self.name!r}: job names repeat: {names}")

    def job(self, name: str) -> Job | None:
        return next((job for job in self.jobs if job.name == name), None)


@attrs.frozen(kw_only=True)
class JobRun:
    """What a running job is given.

    Attributes:
        schedule: the schedule's name.
        parameters: the values, checked, defaults filled in.
        swiftlet: the object of the group's swiftlet (``None`` if the group names none).
        management: the router's management tree (to change config, as an operator would).
        router_name: the router's name.
        lookup: ``lookup(name, kind)``, the scheduler's :meth:`SwiftletContext.lookup`.
        log: the scheduler's logger.
        cleanup_scope: ``cleanup_scope()`` is a shielded scope for cleanup that must await
            after the job was stopped, expiring after the router's ``shutdown-timeout``.
    """

    schedule: str
    parameters: Mapping[str, str]
    swiftlet: Any
    management: Any
    router_name: str
    lookup: Callable[[str, type], Any] = attrs.field(repr=False)
    log: logging.Logger = attrs.field(repr=False)
    cleanup_scope: Callable[[], trio.CancelScope] = attrs.field(repr=False)


class WallClock(Protocol):
    """Where the scheduler reads the date and time, and how it waits for one.

    The default is the system clock; a plugin may provide another through
    :meth:`SchedulerHooks.martinet_scheduler_clock` (tests: one that follows trio's clock
    from a chosen date, so a day passes in no time under ``autojump_clock``).
    """

    def now(self) -> datetime:
        """The current time, as an aware datetime."""

    async def sleep_until(self, when: datetime) -> None:
        """Return at ``when`` (aware) or soon after; at once if it has passed. A clock that
        can jump (the system's) returns early instead, at most a minute later, so the
        caller looks again."""


class SchedulerHooks:
    """The hooks ``sys$scheduler`` calls on every plugin."""

    @hookspec
    def martinet_scheduler_jobs(self) -> Sequence[JobGroup]:  # type: ignore[empty-body]
        """Return the job groups this plugin offers (called when the scheduler starts)."""

    @hookspec(firstresult=True)
    def martinet_scheduler_clock(self) -> WallClock | None:
        """Return the clock the scheduler should use instead of the system's, or None."""


@runtime_checkable
class Scheduler(Protocol):
    """What ``context.lookup("sys$scheduler", Scheduler)`` returns."""

    def register(self, group: JobGroup) -> None:
        """Offer ``group`` until :meth:`unregister` or the scheduler stops. Schedules
        waiting for its jobs are planned at once.

        Raises:
            ValueError: a group of that name is registered already.
        """

    def unregister(self, name: str) -> None:
        """Withdraw group ``name``: runs of its jobs are stopped; schedules naming them
        wait (state ``invalid``) until it is offered again. Unknown names are ignored."""

    def job_groups(self) -> Mapping[str, JobGroup]:
        """The groups registered now, by name."""

    def next_starts(self, schedule: str, count: int) -> list[datetime]:
        """The next ``count`` planned starts of ``schedule`` (aware, in the scheduler's
        zone); fewer when it ends sooner, none when it is disabled or invalid.

        Raises:
            KeyError: no such schedule.
        """


@attrs.frozen(kw_only=True)
class JobStarted(Event):
    """A schedule's job started (``planned``: the start it was planned for, ISO 8601)."""

    schedule: str
    job_group: str
    job_name: str
    planned: str


@attrs.frozen(kw_only=True)
class JobFinished(Event):
    """A run ended. ``outcome``: success, failed, stopped (max-runtime or an operator),
    rejected (the pool's queue was full) or invalid (no such job, bad parameters)."""

    schedule: str
    job_group: str
    job_name: str
    outcome: str
    message: str


@attrs.frozen(kw_only=True)
class RunsMissed(Event):
    """Starts of an ``at`` schedule fell due while the router was down; they are reported,
    not run. ``first`` and ``last`` are ISO 8601 local times."""

    schedule: str
    count: int
    first: str
    last: str
