"""The running ``sys$scheduler``: plans every schedule, starts its job on time, records runs.

Theory of operation
-------------------
One planner task owns all state. It reads the current config, turns it into plans
(:mod:`.plans`), asks each enabled plan for its next start after now, starts what is due
and sleeps until the earliest next start — or until something changes: a config change
under ``/sys$scheduler`` (seen on the bus), a job group registered or withdrawn, a run
ended. Then it plans again from the config, so runtime changes apply at once and there
is one code path for boot and change. Times are naive local times of the configured zone
(:class:`.plans.Zone`); the clock is the system's unless a plugin provides another
(``martinet_scheduler_clock``), and the planner never trusts a long sleep on a clock that
can jump: it looks again at least every minute.

Runs. A due start submits the job to the pool ``scheduler.jobs``; the run gets a cancel
scope whose deadline is the schedule's ``max-runtime`` from the moment the start fell due
(time waiting for a free slot in the pool counts; trio time, so a wall-clock jump does not
cut a run short), and an operator's ``stop`` cancels the same scope. One run per
schedule at a time: a start that falls due while the previous run still goes is skipped
(SwiftMQ plans the next start when a job ends; the effect is the same). A start is never
repeated: the next one is looked for strictly after both now and the last start.

Every run ends in the history (bounded by ``history-size``, oldest first out) with its
planned time, start, end, outcome and message, and as bus events (:class:`.api.JobStarted`,
:class:`.api.JobFinished`).

Missed starts. With the store running, each schedule's last planned start (and, at an
orderly stop, the time of the stop) is kept as a store record ``scheduler/<name>``. At
boot, the starts of ``at`` schedules between that time and now were missed while the router
was down: they are recorded as ``missed`` and announced (:class:`.api.RunsMissed`), never
run in a burst. Window schedules simply go on with their next start.

Cross-checks the config cannot do alone (an unknown calendar, bad job parameters, a base
calendar that is missing or makes a cycle) refuse a runtime change (a veto); in a config
file they leave the schedule ``invalid``, with the reason in usage and one WARNING line
naming the schedule's path.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

import attrs
import trio

from martinet.kernel import (
    Entity,
    EntityAdded,
    EntityRemoved,
    Overflow,
    PoolFull,
    PropertyChanged,
    SwiftletContext,
    Veto,
)
from martinet.swiftlets.store.api import PutRecord, Store, StoreError

from .api import Job, JobError, JobFinished, JobGroup, JobRun, JobStarted, RunsMissed, WallClock
from .config import CalendarConfig, ParameterConfig, ScheduleConfig, SchedulerConfig
from .plans import Plan, Zone, build_calendars, build_plans, job_problem, plan_of
from .timing import missed_starts

__all__ = ["SchedulerSwiftlet", "SystemClock"]

log = logging.getLogger(__name__)

POOL = "scheduler.jobs"
RECORD_KIND = "scheduler"
LOOK_AGAIN = 60.0  # seconds: the longest sleep on a clock that may jump


class SystemClock:
    """The system's clock; :meth:`sleep_until` wakes at least every minute, so a clock set
    forward or back (or a machine resumed from sleep) is noticed within a minute."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        await trio.sleep(max(0.0, min(LOOK_AGAIN, (when - self.now()).total_seconds())))


@attrs.define(eq=False)
class _Run:
    """A run in progress (queued in the pool or running)."""

    job: Job
    group: JobGroup
    planned: datetime
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    stopped_by: str = ""
    started: datetime | None = None


@attrs.define(eq=False)
class _Schedule:
    """What the planner knows of one schedule beyond its config."""

    name: str
    state: str = "disabled"
    next: datetime | None = None  # naive local
    last_planned: datetime | None = None
    error: str = ""
    run: _Run | None = None
    runs: int = 0
    last_start: str = ""
    last_end: str = ""
    last_outcome: str = ""
    last_message: str = ""
    finished_config: ScheduleConfig | None = None  # a job forbade further runs of this config


def _job_usage(job: Job) -> dict[str, Any]:
    return {
        "description": job.description,
        "parameters": ", ".join(
            p.name + ("" if p.default is None else f"={p.default}") + (" (mandatory)" if p.mandatory else "")
            for p in job.parameters
        ),
    }


def _iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else ""


class SchedulerSwiftlet:
    """``sys$scheduler`` (see the module header); implements :class:`.api.Scheduler`."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.clock: WallClock = SystemClock()
        self.zone = Zone()
        self._groups: dict[str, JobGroup] = {}
        self._schedules: dict[str, _Schedule] = {}
        self._history: collections.deque[dict[str, Any]] = collections.deque()
        self._sequence = 0
        self._store: Store | None = None
        self._wake_scope: trio.CancelScope | None = None
        self._dirty = True
        self._checking = False  # vetoes apply to runtime changes, not to the config read at start
        usage = context.usage
        self._usage_schedules = usage.add_list("schedules")
        self._usage_history = usage.add_list("history")
        self._usage_groups = usage.add_list("job-groups")
        usage.provide(
            lambda: {
                "time-zone": self.zone.name,
                "now": _iso(self._local_now()),
                "job-groups": len(self._groups),
                "running": self.running(),
            }
        )

    # -- the published interface (api.Scheduler) -----------------------------------------

    def register(self, group: JobGroup) -> None:
        if group.name in self._groups:
            raise ValueError(f"job group {group.name!r} is registered already")
        self._groups[group.name] = group
        entry = self._usage_groups.add(group.name, lambda: {"swiftlet": group.swiftlet or "", "jobs": len(group.jobs)})
        jobs = entry.add_list("jobs")
        for job in group.jobs:
            jobs.add(job.name, partial(_job_usage, job))
        self._wake()

    def unregister(self, name: str) -> None:
        if self._groups.pop(name, None) is None:
            return
        self._usage_groups.remove(name)
        for schedule in self._schedules.values():
            if schedule.run is not None and schedule.run.group.name == name:
                self._stop_run(schedule, f"job group {name} withdrawn")
        self._wake()

    def job_groups(self) -> Mapping[str, JobGroup]:
        return dict(self._groups)

    def next_starts(self, schedule: str, count: int) -> list[datetime]:
        state = self._schedules[schedule]
        config = self.context.config.schedules[schedule]
        plan = self._plan(config)
        if not config.enabled or isinstance(plan, str) or state.state in ("invalid", "finished"):
            return []
        after = max(filter(None, (self._local_now(), state.last_planned)))
        return [self.zone.instant(t) for t in plan.next_after_many(after, count)]

    def running(self) -> int:
        """Runs in progress (queued or running)."""
        return sum(1 for s in self._schedules.values() if s.run is not None)

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        context = self.context
        clock = context.hook.martinet_scheduler_clock()
        if clock is not None:
            self.clock = clock
        self.zone = Zone.named(context.config.time_zone)
        for groups in context.hook.martinet_scheduler_jobs():
            for group in groups:
                self.register(group)
        try:
            self._store = context.lookup("sys$store", Store)
        except LookupError:
            context.log.info("no sys$store running: missed 'at' starts cannot be reported after a restart")
        entity = context.entity
        entity.entity_list("calendars").bind(self._calendar_added, self._calendar_removed)
        entity.entity_list("schedules").bind(self._schedule_added)
        self._checking = True
        subscriptions = [
            context.bus.subscribe(kind, max_buffer=16, overflow=Overflow.DROP_OLDEST)
            for kind in (PropertyChanged, EntityAdded, EntityRemoved)
        ]
        try:
            async with trio.open_nursery() as nursery:
                for subscription in subscriptions:
                    nursery.start_soon(self._watch, subscription)
                await self._report_missed()
                task_status.started()
                await self._plan_forever()
        finally:
            for subscription in subscriptions:
                subscription.close()
            for name in list(self._groups):  # jobs are offered to a running scheduler only
                self.unregister(name)
            with context.shutdown_scope():
                try:
                    await self._remember(
                        {name: self._local_now() for name, s in self._schedules.items() if s.state != "disabled"}
                    )
                except StoreError as exc:
                    context.log.warning("the time of this stop was not kept: %s", exc)

    async def _watch(self, subscription: Any) -> None:
        """Wake the planner for every change under ``/sys$scheduler``."""
        prefix = f"/{self.context.name}"
        async for event in subscription:
            if event.path == prefix or event.path.startswith(prefix + "/"):
                self._wake()

    def _wake(self) -> None:
        self._dirty = True
        if self._wake_scope is not None:
            self._wake_scope.cancel()

    # -- planning -------------------------------------------------------------------------

    def _local_now(self) -> datetime:
        return self.zone.local(self.clock.now())

    def _plan(self, config: ScheduleConfig) -> Plan | str:
        return plan_of(config, build_calendars(self.context.config.calendars))

    async def _plan_forever(self) -> None:
        while True:
            if self._dirty:
                self._dirty = False
                self._replan()
            now = self._local_now()
            for schedule in self._schedules.values():
                if schedule.next is not None and schedule.next <= now:
                    self._start_due(schedule, now)
            due = [s.next for s in self._schedules.values() if s.next is not None]
            if self._dirty:
                continue
            with trio.CancelScope() as scope:
                self._wake_scope = scope
                if due:
                    await self.clock.sleep_until(self.zone.instant(min(due)))
                else:
                    await trio.sleep_forever()
            self._wake_scope = None

    def _replan(self) -> None:
        """Bring every schedule's state and next start in line with the current config."""
        config: SchedulerConfig = self.context.config
        zone = Zone.named(config.time_zone)
        if zone != self.zone:  # each last start stays the same instant, in the new zone's time
            for schedule in self._schedules.values():
                if schedule.last_planned is not None:
                    schedule.last_planned = zone.local(self.zone.instant(schedule.last_planned))
            self.zone = zone
        plans = build_plans(config)
        now = self._local_now()
        for name in list(self._schedules):
            if name not in config.schedules:
                self._forget(name)
        for name, schedule_config in config.schedules.items():
            schedule = self._schedules.setdefault(name, _Schedule(name))
            if name not in self._usage_schedules.children:
                usage = self._usage_schedules.add(name, partial(self._schedule_usage, schedule))
                usage.add_operation(
                    "start", lambda s=schedule: self._start_now(s), "Start the job now, outside the plan."
                )
                usage.add_operation("stop", lambda s=schedule: self._stop_by_operator(s), "Stop the running job.")
            self._replan_one(schedule, schedule_config, plans[name], now)
        self._trim_history()

    def _replan_one(self, schedule: _Schedule, config: ScheduleConfig, plan: Plan | str, now: datetime) -> None:
        before = schedule.state, schedule.error
        schedule.next, schedule.error = None, ""
        if schedule.finished_config is not None and schedule.finished_config != config:
            schedule.finished_config = None  # changed by the operator: runs may go on
        if not config.enabled:
            schedule.state = "disabled"
            return
        problem = plan if isinstance(plan, str) else self._job_problem(config)
        if problem:
            if before != ("invalid", problem):  # said once, not at every replan
                log.warning(
                    "schedule /sys$scheduler/schedules/%s is invalid and will not run: %s", schedule.name, problem
                )
            schedule.state, schedule.error = "invalid", problem
            return
        if schedule.finished_config is not None:
            schedule.state = "finished"
            return
        assert isinstance(plan, Plan)
        after = max(now, schedule.last_planned) if schedule.last_planned is not None else now
        schedule.next = plan.next_after(after)
        if schedule.run is None:
            schedule.state = "scheduled" if schedule.next is not None else "expired"

    def _job_problem(self, config: ScheduleConfig) -> str:
        return job_problem(config, self._groups)

    def _forget(self, name: str) -> None:
        schedule = self._schedules.pop(name)
        self._usage_schedules.remove(name)
        if schedule.run is not None:
            self._stop_run(schedule, "schedule removed")

    # -- runs -------------------------------------------------------------------------------

    def _start_due(self, schedule: _Schedule, now: datetime) -> None:
        planned = schedule.next
        assert planned is not None
        schedule.last_planned = planned
        config = self.context.config.schedules[schedule.name]
        if schedule.run is not None:
            self.context.log.info("schedule %s: start at %s skipped, its job still runs", schedule.name, planned)
        else:
            self._submit(schedule, config, planned)
        plan = self._plan(config)
        schedule.next = plan.next_after(max(now, planned)) if isinstance(plan, Plan) else None
        if schedule.next is None and schedule.run is None:
            schedule.state = "expired"

    def _start_now(self, schedule: _Schedule) -> str:
        if schedule.run is not None:
            raise Veto(f"schedule {schedule.name}: its job is running already")
        config = self.context.config.schedules.get(schedule.name)
        if config is None:
            raise Veto(f"schedule {schedule.name} no longer exists")
        problem = job_problem(config, self._groups, complete=True)
        if problem:
            raise Veto(problem)
        self._submit(schedule, config, self._local_now())
        return f"job {config.job_group}/{config.job_name} started"

    def _stop_by_operator(self, schedule: _Schedule) -> str:
        if schedule.run is None:
            raise Veto(f"schedule {schedule.name}: no job is running")
        self._stop_run(schedule, "stopped by an operator")
        return f"schedule {schedule.name}: job stopped"

    def _stop_run(self, schedule: _Schedule, why: str) -> None:
        assert schedule.run is not None
        schedule.run.stopped_by = why
        schedule.run.scope.cancel()

    def _submit(self, schedule: _Schedule, config: ScheduleConfig, planned: datetime) -> None:
        group = self._groups.get(config.job_group)
        job = group.job(config.job_name) if group is not None else None
        if group is None or job is None:
            self._record(schedule, config, planned, None, "invalid", self._job_problem(config))
            return
        run = schedule.run = _Run(job, group, planned)
        plan = self._plan(config)
        if isinstance(plan, Plan) and plan.max_runtime is not None:
            run.scope.deadline = trio.current_time() + plan.max_runtime
        schedule.state = "running"
        try:
            self.context.pools[POOL].submit_nowait(self._execute, schedule, config, run)
        except (PoolFull, trio.BrokenResourceError) as exc:
            schedule.run = None
            schedule.state = "scheduled"
            self._record(schedule, config, planned, None, "rejected", str(exc))

    async def _execute(self, schedule: _Schedule, config: ScheduleConfig, run: _Run) -> None:
        """One run, in the pool: the outcome goes to the history; nothing is raised but the
        cancellation of the scheduler itself (recorded as ``stopped``)."""
        run.started = self._local_now()
        group, job = run.group, run.job
        outcome, message = "stopped", "the scheduler stopped"  # unless the job gets further
        further_runs = True
        self.context.bus.publish(
            JobStarted(schedule=schedule.name, job_group=group.name, job_name=job.name, planned=_iso(run.planned))
        )
        if config.logging_enabled:
            self.context.log.info("schedule %s: job %s/%s started", schedule.name, group.name, job.name)
        try:
            with run.scope:
                await self._remember({schedule.name: run.planned})
                parameters = job.resolve({p.name: p.value for p in config.parameters.values()})
                owner = self.context.lookup(group.swiftlet, object) if group.swiftlet else None
                job_run = JobRun(
                    schedule=schedule.name,
                    parameters=parameters,
                    swiftlet=owner,
                    management=self.context.management,
                    router_name=self.context.router_name,
                    lookup=self.context.lookup,
                    log=self.context.log,
                    cleanup_scope=self.context.shutdown_scope,
                )
                message = await job.run(job_run) or ""
                outcome = "success"
            if run.scope.cancelled_caught:
                outcome = "stopped"
                message = run.stopped_by or f"max-runtime {config.max_runtime} reached"
        except JobError as exc:
            outcome, message, further_runs = "failed", str(exc), exc.further_runs
        except (ValueError, LookupError) as exc:  # parameters, or the group's swiftlet is not running
            outcome, message = "invalid", str(exc)
        except Exception as exc:
            outcome, message = "failed", f"{type(exc).__name__}: {exc}"
            self.context.log.exception("schedule %s: job %s/%s failed", schedule.name, group.name, job.name)
        finally:
            if schedule.run is run:
                schedule.run = None
                schedule.state = "scheduled" if schedule.next is not None else "expired"
                if not further_runs:
                    schedule.finished_config = config
                    schedule.state, schedule.next = "finished", None
                    message += " (the job forbids further runs)"
            self._record(schedule, config, run.planned, run.started, outcome, message)
            self._wake()

    def _record(
        self,
        schedule: _Schedule,
        config: ScheduleConfig,
        planned: datetime,
        started: datetime | None,
        outcome: str,
        message: str,
    ) -> None:
        """Add a run to the history, the schedule's usage, the bus and (optionally) the log."""
        ended = self._local_now()
        if outcome != "missed":
            schedule.runs += 1
        schedule.last_start, schedule.last_end = _iso(started), _iso(ended)
        schedule.last_outcome, schedule.last_message = outcome, message
        entry = {
            "schedule": schedule.name,
            "job-group": config.job_group,
            "job-name": config.job_name,
            "planned": _iso(planned),
            "start": _iso(started),
            "end": _iso(ended) if started else "",
            "outcome": outcome,
            "message": message,
        }
        self._add_history(entry)
        if outcome != "missed":
            self.context.bus.publish(
                JobFinished(
                    schedule=schedule.name,
                    job_group=config.job_group,
                    job_name=config.job_name,
                    outcome=outcome,
                    message=message,
                )
            )
        if config.logging_enabled or outcome in ("failed", "invalid", "rejected"):
            level = logging.INFO if outcome in ("success", "stopped") else logging.WARNING
            self.context.log.log(
                level,
                "schedule %s: job %s/%s %s%s",
                schedule.name,
                config.job_group,
                config.job_name,
                outcome,
                f": {message}" if message else "",
            )

    def _add_history(self, entry: dict[str, Any]) -> None:
        self._sequence += 1
        key = f"{self._sequence:08d}"
        self._history.append({"key": key, **entry})
        self._usage_history.add(key, lambda: entry)
        self._trim_history()

    def _trim_history(self) -> None:
        while len(self._history) > self.context.config.history_size:
            self._usage_history.remove(self._history.popleft()["key"])

    def _schedule_usage(self, schedule: _Schedule) -> dict[str, Any]:
        return {
            "state": schedule.state,
            "next-start": _iso(schedule.next),
            "error": schedule.error,
            "runs": schedule.runs,
            "last-start": schedule.last_start,
            "last-end": schedule.last_end,
            "last-outcome": schedule.last_outcome,
            "last-message": schedule.last_message,
        }

    # -- missed starts and their record in the store ---------------------------------------

    async def _remember(self, moments: Mapping[str, datetime]) -> None:
        """Keep each schedule's last planned (or passed) time in the store, as an instant."""
        if self._store is None or not moments:
            return
        await self._store.commit(
            [
                PutRecord(RECORD_KIND, name, json.dumps({"until": self.zone.instant(moment).isoformat()}).encode())
                for name, moment in moments.items()
            ]
        )

    async def _report_missed(self) -> None:
        """Record the starts of ``at`` schedules that fell due while the router was down."""
        if self._store is None:
            return
        records = self._store.recovered.records.get(RECORD_KIND, {})
        config: SchedulerConfig = self.context.config
        plans = build_plans(config)
        now = self._local_now()
        for name, value in records.items():
            schedule_config = config.schedules.get(name)
            plan = plans.get(name)
            if schedule_config is None or not schedule_config.enabled or not isinstance(plan, Plan) or not plan.is_at:
                continue
            try:
                since = self.zone.local(datetime.fromisoformat(json.loads(value)["until"]))
            except (ValueError, KeyError, TypeError):
                self.context.log.warning("schedule %s: unreadable record of its last start ignored", name)
                continue
            missed, total = missed_starts(plan.expression, since, now, config.history_size, **plan.bounds())
            if not total:
                continue
            schedule = self._schedules.setdefault(name, _Schedule(name))
            for planned in missed:
                self._record(
                    schedule, schedule_config, planned, None, "missed", "the router was down at the planned start"
                )
            schedule.last_planned = missed[-1]
            self.context.bus.publish(
                RunsMissed(schedule=name, count=total, first=_iso(missed[0]), last=_iso(missed[-1]))
            )
            self.context.log.warning(
                "schedule %s: %d start(s) missed while the router was down, not run (last at %s)",
                name,
                total,
                _iso(missed[-1]),
            )
        await self._remember({name: now for name in records if name in config.schedules})

    # -- vetoes: runtime changes the config alone cannot check -------------------------------

    def _calendar_added(self, entity: Entity) -> None:
        entity.on_change(lambda change: self._check_calendar(attrs.evolve(entity.config, **{change.field: change.new})))
        self._check_calendar(entity.config)

    def _calendar_removed(self, entity: Entity) -> None:
        config: SchedulerConfig = self.context.config
        users = [f"schedule {n}" for n, s in config.schedules.items() if s.calendar == entity.name]
        users += [f"calendar {n}" for n, c in config.calendars.items() if c.base_calendar == entity.name]
        if users:
            raise Veto(f"calendar {entity.name} is used by {', '.join(users)}")

    def _check_calendar(self, candidate: CalendarConfig) -> None:
        """Refuse a calendar (new or changed) that would break one that works now."""
        if not self._checking:
            return
        calendars = self.context.config.calendars
        before = build_calendars(calendars)
        after = build_calendars({**calendars, candidate.name: candidate})
        broken = [
            problem
            for name, problem in after.items()
            if isinstance(problem, str) and not isinstance(before.get(name), str)
        ]
        if broken:
            raise Veto(broken[0])

    def _schedule_added(self, entity: Entity) -> None:
        entity.on_change(lambda change: self._check_schedule(attrs.evolve(entity.config, **{change.field: change.new})))

        def check_with(name: str, parameter: ParameterConfig | None) -> None:
            parameters = {key: value for key, value in entity.config.parameters.items() if key != name}
            if parameter is not None:
                parameters[name] = parameter
            self._check_schedule(attrs.evolve(entity.config, parameters=parameters))

        def parameter_added(parameter: Entity) -> None:
            parameter.on_change(
                lambda change: check_with(parameter.name, attrs.evolve(parameter.config, **{change.field: change.new}))
            )
            check_with(parameter.name, parameter.config)

        entity.entity_list("parameters").bind(parameter_added, lambda parameter: check_with(parameter.name, None))
        self._check_schedule(entity.config)

    def _check_schedule(self, config: ScheduleConfig) -> None:
        """Refuse a schedule (new or changed) with an unknown calendar or an empty date range,
        naming a job its group does not offer, or with parameters the job refuses (missing
        mandatory ones only once it is enabled). A group not registered yet is not refused:
        the schedule waits for it."""
        if not self._checking:
            return
        plan = self._plan(config)
        if isinstance(plan, str):
            raise Veto(plan)
        if config.job_group in self._groups:
            problem = self._job_problem(config)
            if problem:
                raise Veto(problem)
