"""Missed starts: each schedule's last planned start (and, at an orderly stop, the time of
the stop) kept as a store record ``scheduler/<name>``, as an instant. At boot the starts of
``at`` schedules between that time and now fell due while the router was down: they are
recorded as ``missed`` and announced (:class:`.api.RunsMissed`), never run in a burst."""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from datetime import datetime

from martinet.kernel import SwiftletContext
from martinet.swiftlets.store.api import PutRecord, Store

from .api import RunsMissed
from .config import SchedulerConfig
from .history import History, Schedule, iso
from .plans import Plan, Zone, build_plans
from .timing import missed_starts

__all__ = ["StartRecords", "RECORD_KIND"]

RECORD_KIND = "scheduler"


class StartRecords:
    """The store records of the schedules' last starts (none without a store)."""

    def __init__(self, context: SwiftletContext, store: Store | None):
        self.context = context
        self._store = store

    async def remember(self, moments: Mapping[str, datetime], zone: Zone) -> None:
        """Keep each schedule's last planned (or passed) time (local in ``zone``) in the store."""
        if self._store is None or not moments:
            return
        await self._store.commit(
            [
                PutRecord(RECORD_KIND, name, json.dumps({"until": zone.instant(moment).isoformat()}).encode())
                for name, moment in moments.items()
            ]
        )

    async def report_missed(
        self, schedules: MutableMapping[str, Schedule], history: History, zone: Zone, now: datetime
    ) -> None:
        """Record the starts of ``at`` schedules that fell due while the router was down."""
        if self._store is None:
            return
        records = self._store.recovered.records.get(RECORD_KIND, {})
        config: SchedulerConfig = self.context.config
        plans = build_plans(config)
        for name, value in records.items():
            schedule_config = config.schedules.get(name)
            plan = plans.get(name)
            if schedule_config is None or not schedule_config.enabled or not isinstance(plan, Plan) or not plan.is_at:
                continue
            try:
                since = zone.local(datetime.fromisoformat(json.loads(value)["until"]))
            except (ValueError, KeyError, TypeError):
                self.context.log.warning("schedule %s: unreadable record of its last start ignored", name)
                continue
            missed, total = missed_starts(plan.expression, since, now, config.history_size, **plan.bounds())
            if not total:
                continue
            schedule = schedules.setdefault(name, Schedule(name))
            for planned in missed:
                history.record(
                    schedule, schedule_config, planned, None, "missed", "the router was down at the planned start"
                )
            schedule.last_planned = missed[-1]
            self.context.bus.publish(RunsMissed(schedule=name, count=total, first=iso(missed[0]), last=iso(missed[-1])))
            self.context.log.warning(
                "schedule %s: %d start(s) missed while the router was down, not run (last at %s)",
                name,
                total,
                iso(missed[-1]),
            )
        await self.remember({name: now for name in records if name in config.schedules}, zone)
