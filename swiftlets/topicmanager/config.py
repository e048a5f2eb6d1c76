"""``sys$topicmanager`` configuration: topics known from the start and, per root topic, the
slow-subscriber condition."""

from __future__ import annotations

from collections.abc import Mapping

from martinet.kernel import config_class, entity_list, prop

SLOW_ACTIONS = ("flow-control", "drop", "disconnect")


@config_class
class TopicConfig:
    name: str = prop(description="A topic (root or below) known from the start.")


@config_class
class SlowSubscriberCondition:
    name: str = prop(description="The root topic this condition applies to.")
    max_messages: int = prop(-1, min=-1, description="Messages a subscriber may have waiting before it "
                             "counts as slow; -1: never slow.")
    action: str = prop(
        "flow-control", choices=SLOW_ACTIONS,
        description="flow-control: keep delivering, and tell publishers to wait max-flowcontrol-delay; "
        "drop: a slow non-durable subscriber misses new messages; disconnect: a slow non-durable "
        "subscriber is closed. Durable subscribers are never dropped nor disconnected: for them the "
        "action is always flow-control.",
    )


@config_class
class TopicManagerConfig:
    auto_create_topics: bool = prop(True, description="Publishing or subscribing under a root that is not "
                                    "defined creates it; false: that is an error.")
    topics: Mapping[str, TopicConfig] = entity_list(TopicConfig, item="topic", description="Defined topics.")
    slow_subscriber_conditions: Mapping[str, SlowSubscriberCondition] = entity_list(
        SlowSubscriberCondition, item="slow-subscriber-condition",
        description="Per root topic: when a subscriber is slow and what happens then (default: never slow).",
    )
