"""``martinet-pipeline --source live --url URL --drop [--force]``: give the live pipeline up.

The live source (:mod:`.source`) reads the metrics topic through durable subscriptions, one
per ingested table, so that nothing is lost while the pipeline is stopped. A pipeline given
up for good leaves them behind, and they keep every message the router publishes, without
bound. ``--drop`` deletes the subscriptions this pipeline makes (:data:`TABLES` and
:func:`subscription`) on the router at ``--url``, and says how many messages each held.

It is ``martinet admin``'s delete of a durable subscription (the operation ``delete`` of
``/sys$topicmanager/usage/durable-subscribers/<queue>``, through :class:`~martinet.swiftlets.
mgmt.admin.Commands`), so it needs the same confirmation: a subscription that holds messages
is deleted only with ``--force``; without it, the router's refusal (what would be lost) is
printed and the exit status is 1. A subscription with a consumer (the pipeline still runs)
is refused with the router's reason. Importing this module does not import Spark.
"""

from __future__ import annotations

import sys

import trio

from martinet.messaging.client import JMSError
from martinet.swiftlets.mgmt.admin import Commands
from martinet.swiftlets.mgmt.client import AdminClient, AdminError
from martinet.swiftlets.topicmanager.api import durable_queue_name

__all__ = ["TABLES", "subscription", "drop"]

#: The tables the live source reads, one durable subscription each.
TABLES = ("rows", "events")
DURABLES = "/sys$topicmanager/usage/durable-subscribers"


def subscription(table: str) -> tuple[str, str]:
    """The live source's durable subscription for ``table``: (client id, name)."""
    return f"spark-{table}", f"spark-{table}"


def drop(url: str, *, force: bool) -> int:
    """Delete the pipeline's durable subscriptions on the router at ``url``, printing a line
    per subscription; the exit status: 0 done (or nothing to drop), 1 one was refused, 2 no
    connection."""
    try:
        return trio.run(_drop, url, force)
    except JMSError as exc:  # the connection failed (it says to where), before any task started
        print(f"martinet-pipeline: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"martinet-pipeline: cannot connect to {url}: {exc}", file=sys.stderr)
        return 2


async def _drop(url: str, force: bool) -> int:
    async with AdminClient.open(url) as admin:
        try:
            return await _drop_subscriptions(admin, force)
        except AdminError as exc:  # (inside the client's nursery: caught here, one line)
            print(f"martinet-pipeline: {exc}", file=sys.stderr)
            return 1


async def _drop_subscriptions(admin: AdminClient, force: bool) -> int:
    commands = Commands(admin)
    commands.force = force  # without: refused when messages would go, as a one-shot admin command
    present = (await admin.call(None, "get", path=DURABLES))["entries"]
    names = [name for name in (durable_queue_name(*subscription(table)) for table in TABLES) if name in present]
    if not names:
        print(f"router {admin.router}: no durable subscription of the pipeline, nothing to drop")
        return 0
    status = 0
    for name in names:
        try:
            output = await commands.run(["invoke", f"{DURABLES}/{name}", "delete"])
        except AdminError as exc:
            print(f"martinet-pipeline: {name} not dropped: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"router {admin.router}: durable subscription {name} dropped with {output.data['dropped']} message(s)")
    return status
