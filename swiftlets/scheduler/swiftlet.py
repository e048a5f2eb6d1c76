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
repeated: the next one is looked for strictly after both now and the last start. What one
run does and how its outcome is told: :mod:`.runs`.

Every run ends in the history (bounded by ``history-size``, oldest first out) with its
planned time, start, end, outcome and message, and as bus events (:class:`.api.JobStarted`,
:class:`.api.JobFinished`): :mod:`.history`.

Missed starts. With the store running, each schedule's last planned start (and, at an
orderly stop, the time of the stop) is kept as a store record ``scheduler/<name>``. At
boot, the starts of ``at`` schedules between that time and now were missed while the router
was down: they are recorded as ``missed`` and announced (:class:`.api.RunsMissed`), never
run in a burst (:mod:`.records`). Window schedules simply go on with their next start.

Cross-checks the config cannot do alone (an unknown calendar, bad job parameters, a base
calendar that is missing or makes a cycle) refuse a runtime change (a veto); in a config
file they leave the schedule ``invalid``, with the reason in usage and one WARNING line
naming the schedule's path (:mod:`.vetoes`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

import trio

from martinet.kernel import (
    EntityAdded,
    EntityRemoved,
    Overflow,
    PoolFull,
    PropertyChanged,
    SwiftletContext,
    Veto,
)
from martinet.swiftlets.store.api import Store, StoreError

from .api import Job, JobGroup, WallClock
from .config import ScheduleConfig, SchedulerConfig
from .history import History, Run, Schedule, iso
from .plans import Plan, Zone, build_calendars, build_plans, job_problem, plan_of
from .records import StartRecords
from .runs import Outcome, perform
from .vetoes import ConfigVetoes

__all__ = ["SchedulerSwiftlet", "SystemClock"]

log = logging.getLogger(__name__)

POOL = "scheduler.jobs"
LOOK_AGAIN = 60.0  # seconds: the longest sleep on a clock that may jump


class SystemClock:
    """The system's clock; :meth:`sleep_until` wakes at least every minute, so a clock set
    forward or back (or a machine resumed from sleep) is noticed within a minute."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        await trio.sleep(max(0.0, min(LOOK_AGAIN, (when - self.now()).total_seconds())))


def _job_usage(job: Job) -> dict[str, Any]:
    return {
        "description": job.description,
        "parameters": ", ".join(
            p.name + ("" if p.default is None else f"={p.default}") + (" (mandatory)" if p.mandatory else "")
            for p in job.parameters
        ),
    }


class SchedulerSwiftlet:
    """``sys$scheduler`` (see the module header); implements :class:`.api.Scheduler`."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.clock: WallClock = SystemClock()
        self.zone = Zone()
        self._groups: dict[str, JobGroup] = {}
        self._schedules: dict[str, Schedule] = {}
        self._records = StartRecords(context, None)  # with the store once it runs
        self._wake_scope: trio.CancelScope | None = None
        self._dirty = True
        self._vetoes = ConfigVetoes(context, self._groups, self._plan)
        usage = context.usage
        self._usage_schedules = usage.add_list("schedules")
        self._history = History(context, self._local_now)
        self._usage_groups = usage.add_list("job-groups")
        usage.provide(
            lambda: {
                "time-zone": self.zone.name,
                "now": iso(self._local_now()),
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
            self._records = StartRecords(context, context.lookup("sys$store", Store))
        except LookupError:
            context.log.info("no sys$store running: missed 'at' starts cannot be reported after a restart")
        self._vetoes.bind()
        self._vetoes.checking = True  # vetoes apply to runtime changes, not to the config read at start
        subscriptions = [
            context.bus.subscribe(kind, max_buffer=16, overflow=Overflow.DROP_OLDEST)
            for kind in (PropertyChanged, EntityAdded, EntityRemoved)
        ]
        try:
            async with trio.open_nursery() as nursery:
                for subscription in subscriptions:
                    nursery.start_soon(self._watch, subscription)
                await self._records.report_missed(self._schedules, self._history, self.zone, self._local_now())
                task_status.started()
                await self._plan_forever()
        finally:
            for subscription in subscriptions:
                subscription.close()
            for name in list(self._groups):  # jobs are offered to a running scheduler only
                self.unregister(name)
            with context.shutdown_scope():
                try:
                    await self._records.remember(
                        {name: self._local_now() for name, s in self._schedules.items() if s.state != "disabled"},
                        self.zone,
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
            schedule = self._schedules.setdefault(name, Schedule(name))
            if name not in self._usage_schedules.children:
                usage = self._usage_schedules.add(name, schedule.usage)
                usage.add_operation(
                    "start", lambda s=schedule: self._start_now(s), "Start the job now, outside the plan."
                )
                usage.add_operation("stop", lambda s=schedule: self._stop_by_operator(s), "Stop the running job.")
            self._replan_one(schedule, schedule_config, plans[name], now)
        self._history.trim()

    def _replan_one(self, schedule: Schedule, config: ScheduleConfig, plan: Plan | str, now: datetime) -> None:
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

    def _start_due(self, schedule: Schedule, now: datetime) -> None:
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

    def _start_now(self, schedule: Schedule) -> str:
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

    def _stop_by_operator(self, schedule: Schedule) -> str:
        if schedule.run is None:
            raise Veto(f"schedule {schedule.name}: no job is running")
        self._stop_run(schedule, "stopped by an operator")
        return f"schedule {schedule.name}: job stopped"

    def _stop_run(self, schedule: Schedule, why: str) -> None:
        assert schedule.run is not None
        schedule.run.stopped_by = why
        schedule.run.scope.cancel()

    def _submit(self, schedule: Schedule, config: ScheduleConfig, planned: datetime) -> None:
        group = self._groups.get(config.job_group)
        job = group.job(config.job_name) if group is not None else None
        if group is None or job is None:
            self._history.record(schedule, config, planned, None, "invalid", self._job_problem(config))
            return
        run = schedule.run = Run(job, group, planned)
        plan = self._plan(config)
        if isinstance(plan, Plan) and plan.max_runtime is not None:
            run.scope.deadline = trio.current_time() + plan.max_runtime
        schedule.state = "running"
        try:
            self.context.pools[POOL].submit_nowait(self._execute, schedule, config, run)
        except (PoolFull, trio.BrokenResourceError) as exc:
            schedule.run = None
            schedule.state = "scheduled"
            self._history.record(schedule, config, planned, None, "rejected", str(exc))

    async def _execute(self, schedule: Schedule, config: ScheduleConfig, run: Run) -> None:
        """One run, in the pool (:func:`.runs.perform`): the outcome goes to the history."""
        run.started = self._local_now()
        ended = Outcome()
        try:
            remember = partial(self._records.remember, {schedule.name: run.planned}, self.zone)
            await perform(self.context, schedule.name, config, run, remember, ended)
        finally:
            if schedule.run is run:
                schedule.run = None
                schedule.state = "scheduled" if schedule.next is not None else "expired"
                if not ended.further_runs:
                    schedule.finished_config = config
                    schedule.state, schedule.next = "finished", None
                    ended.message += " (the job forbids further runs)"
            self._history.record(schedule, config, run.planned, run.started, ended.outcome, ended.message)
            self._wake()
