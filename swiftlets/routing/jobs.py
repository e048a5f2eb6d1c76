"""Routing's scheduler jobs: the Routing Connector (SwiftMQ's job of that name).

The job takes a connector's name, enables the connector when it starts and disables it when
it is stopped, through the management tree — the same change an operator makes, so the
routing swiftlet's own listener opens the link (retrying every ``retry-time`` while it
cannot connect) and closes it again. The job never ends by itself: a link that is up only
during a time window is a schedule with a ``max-runtime`` (without one the connector stays
enabled until an operator stops the job). Configure such a connector ``enabled="false"``.
"""

from __future__ import annotations

import trio

from martinet.kernel import ManagementError
from martinet.swiftlets.scheduler.api import Job, JobError, JobGroup, JobParameter, JobRun

__all__ = ["ROUTING_JOBS"]

CONNECTORS = "/sys$routing/connectors"


async def run_connector(run: JobRun) -> None:
    """Enable the connector, wait to be stopped, disable it (if it still exists).

    Raises:
        JobError: no such connector.
    """
    name = run.parameters["Connector Name"]
    path = f"{CONNECTORS}/{name}"
    try:
        run.management.set(path, "enabled", True)
    except ManagementError as exc:
        raise JobError(f"cannot enable connector {name!r}: {exc}") from None
    try:
        await trio.sleep_forever()
    finally:
        if name in run.management.entity_list(CONNECTORS).entities:
            run.management.set(path, "enabled", False)


ROUTING_JOBS = JobGroup(
    name="Routing",
    swiftlet="sys$routing",
    jobs=[
        Job(
            name="Routing Connector",
            run=run_connector,
            description="Enables a routing connector at the job's start and disables it at its stop (give the "
            "schedule a max-runtime: the job runs until stopped).",
            parameters=[JobParameter(name="Connector Name", description="Name of the routing connector.")],
        ),
    ],
)
