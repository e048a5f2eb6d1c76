"""The topic manager's scheduler job (group ``Topic Manager``), offered through the hook
``martinet_scheduler_jobs``: **Delete Durable** deletes the durable subscriptions whose
client id and name match two SQL-LIKE predicates, with their messages (a durable subscriber
removed on Sunday). A subscription with an active consumer is left alone and named in the
job's message; the job fails if nothing could be deleted for that reason.
"""

from __future__ import annotations

from martinet.messaging.like import like_pattern
from martinet.swiftlets.scheduler.api import Job, JobError, JobGroup, JobParameter, JobRun

from .api import TopicError, TopicManager

__all__ = ["TOPIC_JOBS"]


async def delete_durable(run: JobRun) -> str:
    manager: TopicManager = run.swiftlet
    client_ids = like_pattern(run.parameters["Client Id"])
    names = like_pattern(run.parameters["Durable Name"])
    matching = sorted(
        (s.client_id or "", s.durable_name or "")
        for s in manager.durable_subscriptions().values()
        if client_ids.matches(s.client_id or "") and names.matches(s.durable_name or "")
    )
    deleted, busy = [], []
    for client_id, name in matching:
        try:
            await manager.unsubscribe(client_id, name)
            deleted.append(f"{client_id}/{name}")
        except TopicError as exc:
            busy.append(f"{client_id}/{name} ({exc})")
    if busy and not deleted:
        raise JobError(f"none deleted: {', '.join(busy)}")
    message = f"deleted: {', '.join(deleted) or 'none'}"
    return message + (f"; left: {', '.join(busy)}" if busy else "")


TOPIC_JOBS = JobGroup(
    name="Topic Manager",
    swiftlet="sys$topicmanager",
    jobs=[
        Job(
            name="Delete Durable",
            run=delete_durable,
            description="Deletes the durable subscriptions (and their messages) whose client id and name match.",
            parameters=[
                JobParameter(name="Client Id", description="SQL-LIKE predicate on client ids.", check=like_pattern),
                JobParameter(
                    name="Durable Name",
                    description="SQL-LIKE predicate on subscription names.",
                    default="%",
                    check=like_pattern,
                ),
            ],
        ),
    ],
)
