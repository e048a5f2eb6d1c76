"""The scheduler's own job (group ``Scheduler``): **Message Sender** sends a configured
message — ``Body`` as text, ``Persistent`` or not — to ``Destination``: a queue (``q`` or
``q@router``, which travels the routing network) or, with the prefix ``topic://``, a topic.
It uses the queue manager and topic manager through their published interfaces.
"""

from __future__ import annotations

from martinet.messaging.message import build
from martinet.swiftlets.queuemanager.api import QueueError, QueueManager
from martinet.swiftlets.topicmanager.api import TopicError, TopicManager

from .api import Job, JobError, JobGroup, JobParameter, JobRun

__all__ = ["SCHEDULER_JOBS"]

TOPIC_PREFIX = "topic://"


def _boolean(text: str) -> None:
    if text not in ("true", "false"):
        raise ValueError(f"expected 'true' or 'false', found {text!r}")


async def send_message(run: JobRun) -> str:
    destination = run.parameters["Destination"]
    message = build(run.parameters["Body"], durable=run.parameters["Persistent"] == "true", subject=run.schedule)
    try:
        if destination.startswith(TOPIC_PREFIX):
            topics: TopicManager = run.lookup("sys$topicmanager", TopicManager)
            topics.publish(destination.removeprefix(TOPIC_PREFIX), message)
        else:
            queues: QueueManager = run.lookup("sys$queuemanager", QueueManager)
            await queues.send(destination, message)
    except (QueueError, TopicError) as exc:
        raise JobError(f"cannot send to {destination}: {exc}") from None
    return f"sent to {destination}"


SCHEDULER_JOBS = JobGroup(
    name="Scheduler",
    jobs=[
        Job(
            name="Message Sender",
            run=send_message,
            description="Sends a text message to a queue or a topic.",
            parameters=[
                JobParameter(name="Destination", description="A queue (q or q@router) or topic://name."),
                JobParameter(name="Body", description="The message's body (text).", default=""),
                JobParameter(
                    name="Persistent", description="'true': a persistent message.", default="true", check=_boolean
                ),
            ],
        ),
    ],
)
