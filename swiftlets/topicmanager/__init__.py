"""``sys$topicmanager``: topic hierarchies, predicate topics, subscriptions, durable subscribers.

Other swiftlets use ``context.lookup("sys$topicmanager", TopicManager)`` with the protocol
from :mod:`.api`, which also holds topic-name parsing and the interest event. Needs
``sys$store`` and ``sys$queuemanager`` started before it.

Layout: :mod:`.config` (topics, slow-subscriber conditions, static remote subscriptions,
announce filters), :mod:`.api` (the public interface), :mod:`.manager` (the running
swiftlet), :mod:`.hierarchy` (topic names and the hierarchy rules, pure functions),
:mod:`.federation` (topics across routers: interest records, forwarding; uses
``sys$routing``'s api when it runs), :mod:`.backlogs` (durable subscriptions nobody consumes
whose backlog grows), :mod:`.jobs` (Delete Durable, offered to ``sys$scheduler``).

Usage: ``/sys$topicmanager/usage`` (roots, durable subscribers, interest), ``…/topics/<root>``
(and its ``subscriptions/<n>``: every subscription under it, with its full topic),
``…/durable-subscribers/<queue>`` and ``…/remote-router-subscriptions/<router>/topics/<root>``.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import TopicManagerConfig, check_config
    from .manager import TopicManager

    return [
        SwiftletSpec(
            name="sys$topicmanager",
            description="Topic hierarchies, predicate topics, durable subscribers, interest events.",
            config=TopicManagerConfig,
            factory=TopicManager,
            check=check_config,
        )
    ]


@hookimpl
def martinet_scheduler_jobs() -> list:
    from .jobs import TOPIC_JOBS

    return [TOPIC_JOBS]  # see .jobs
