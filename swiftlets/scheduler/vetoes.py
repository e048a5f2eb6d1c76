"""Runtime changes under ``/sys$scheduler`` that the config cannot check alone, refused
with a :class:`~martinet.kernel.Veto` before they apply: a calendar that would break one that
works now (a missing base calendar, a cycle), a calendar still in use being removed, a
schedule with an unknown calendar or an empty date range, or naming a job its group does not
offer, or with parameters the job refuses. The config read at start is not vetoed: there
such a schedule is left ``invalid`` by the planner, with its reason in usage."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from martinet.kernel import Entity, SwiftletContext, Veto

from .api import JobGroup
from .config import CalendarConfig, ParameterConfig, ScheduleConfig, SchedulerConfig
from .plans import Plan, build_calendars, job_problem

__all__ = ["ConfigVetoes"]


class ConfigVetoes:
    """Binds to the ``calendars`` and ``schedules`` lists of the scheduler's entity; checks only
    once :attr:`checking` is set (after the config read at start)."""

    def __init__(
        self,
        context: SwiftletContext,
        groups: Mapping[str, JobGroup],
        plan: Callable[[ScheduleConfig], Plan | str],
    ):
        self.context = context
        self._groups = groups
        self._plan = plan
        self.checking = False

    def bind(self) -> None:
        entity = self.context.entity
        entity.entity_list("calendars").bind(self._calendar_added, self._calendar_removed)
        entity.entity_list("schedules").bind(self._schedule_added)

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
        if not self.checking:
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
        if not self.checking:
            return
        plan = self._plan(config)
        if isinstance(plan, str):
            raise Veto(plan)
        if config.job_group in self._groups:
            problem = job_problem(config, self._groups)
            if problem:
                raise Veto(problem)
