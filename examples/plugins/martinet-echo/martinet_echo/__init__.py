"""``xt$echo``: an example third-party swiftlet that counts the router's bus events.

Every event is received through a bus subscription and handed to the swiftlet's own pool
``echo.worker`` (max 1, so events are counted strictly in order), whose job adds it to
every counter whose ``event-types`` match (subclasses included) and, with
``log-events="true"``, logs it. Counters are an entity list bound with
:meth:`kernel.EntityList.bind`, so the configured ones and those added at runtime go
through the same code, and a counter that names an unknown event type is vetoed.

It also offers a job to the scheduler, as any plugin may: the group ``Echo`` with the job
``Greet`` (hook ``martinet_scheduler_jobs``), which logs its ``Text`` parameter with the
swiftlet's ``greeting`` and counts the greetings in usage; a schedule in ``sys$scheduler``
runs it (``job-group="Echo" job-name="Greet"``).

Config is read the way a plugin should read it: ``self.context.config`` (and
``entity.config`` for a counter) is the current frozen config, so ``log-events`` and
``greeting`` are read per event and follow runtime changes without a listener; the
listener of a counter compares ``change.field``, the Python field name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from martinet.kernel import (
    Change,
    Entity,
    Event,
    Overflow,
    PoolSpec,
    SwiftletContext,
    SwiftletSpec,
    Veto,
    config_class,
    entity_list,
    event_types,
    hookimpl,
    prop,
)
from martinet.swiftlets.scheduler.api import Job, JobGroup, JobParameter, JobRun


@config_class
@attrs.frozen(kw_only=True)
class CounterConfig:
    name: str = prop(description="Name of the counter.")
    event_types: str = prop(
        "Event",
        description="Event class names counted, separated by spaces (subclasses included); 'Event' counts every event.",
    )


@config_class
@attrs.frozen(kw_only=True)
class EchoConfig:
    log_events: bool = prop(False, description="Log every event received, at INFO.")
    greeting: str = prop("echo", description="Prefix of the log line written for each event.")
    max_buffer: int = prop(
        1000,
        min=1,
        max=1_000_000,
        reboot_required=True,
        description="Events buffered between the bus and the pool; older ones are dropped.",
    )
    counters: Mapping[str, CounterConfig] = entity_list(
        CounterConfig,
        item="counter",
        description="What to count.",
        default=[CounterConfig(name="all", event_types="Event")],
    )


def _resolve(names: str) -> tuple[type[Event], ...]:
    known = event_types()
    unknown = [n for n in names.split() if n not in known]
    if unknown or not names.split():
        raise Veto(f"unknown event type(s) {unknown or names!r}; known: {', '.join(sorted(known))}")
    return tuple(known[n] for n in names.split())


class _Counter:
    def __init__(self, kinds: tuple[type[Event], ...]):
        self.kinds = kinds
        self.count = 0
        self.last = ""

    def usage(self) -> dict[str, Any]:
        return {"count": self.count, "last-event": self.last}


class EchoSwiftlet:
    def __init__(self, context: SwiftletContext):
        self.context = context
        self.counters: dict[str, _Counter] = {}
        self.received = 0
        self.greetings = 0
        self._usage = context.usage.add_list("counters")

    # -- management listeners: the same path for configured and added counters ----------

    def _counter_added(self, entity: Entity) -> None:
        counter = _Counter(_resolve(entity.config.event_types))
        entity.on_change(lambda change: self._counter_changed(counter, change))
        self.counters[entity.name] = counter
        self._usage.add(entity.name, counter.usage)

    def _counter_changed(self, counter: _Counter, change: Change) -> None:
        if change.field == "event_types":
            counter.kinds = _resolve(change.new)

    def _counter_removed(self, entity: Entity) -> None:
        del self.counters[entity.name]
        self._usage.remove(entity.name)

    # -- work -------------------------------------------------------------------------

    async def _count(self, event: Event) -> None:
        for counter in self.counters.values():
            if isinstance(event, counter.kinds):
                counter.count += 1
                counter.last = type(event).__name__
        config = self.context.config  # current: follows runtime changes, cheap to read
        if config.log_events:
            self.context.log.info("%s: %r", config.greeting, event)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        counters = self.context.entity.entity_list("counters")
        counters.bind(self._counter_added, self._counter_removed)
        pool = self.context.pools["echo.worker"]
        subscription = self.context.bus.subscribe(
            Event, max_buffer=self.context.config.max_buffer, overflow=Overflow.DROP_OLDEST
        )
        self.context.usage.provide(
            lambda: {"received": self.received, "dropped": subscription.dropped, "greetings": self.greetings}
        )
        with subscription:
            task_status.started()
            async for event in subscription:
                self.received += 1
                await pool.submit(self._count, event)


# -- a job for sys$scheduler ----------------------------------------------------------------


async def greet(run: JobRun) -> str:
    """The job ``Echo/Greet``: ``run.swiftlet`` is the running EchoSwiftlet (the group names it)."""
    echo: EchoSwiftlet = run.swiftlet
    echo.greetings += 1
    line = f"{echo.context.config.greeting}: {run.parameters['Text']}"
    echo.context.log.info("%s", line)
    return line


@hookimpl
def martinet_scheduler_jobs() -> list[JobGroup]:
    return [
        JobGroup(
            name="Echo",
            swiftlet="xt$echo",
            jobs=[
                Job(
                    name="Greet",
                    description="Logs a greeting and counts it in usage.",
                    run=greet,
                    parameters=[JobParameter(name="Text", description="What to say.", default="hello")],
                )
            ],
        )
    ]


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="xt$echo",
            description="Example: counts the router's bus events.",
            config=EchoConfig,
            factory=EchoSwiftlet,
            pools=[PoolSpec(name="echo.worker", description="Counts events, one at a time.")],
        )
    ]
