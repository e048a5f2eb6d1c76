"""``sys$topicmanager`` configuration: topics known from the start; per root topic, the
slow-subscriber condition; and the federation's static remote subscriptions and
announce filters."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from martinet.kernel import ConfigProblem, config_class, entity_list, prop

SLOW_ACTIONS = ("flow-control", "drop", "disconnect")


@config_class
@attrs.frozen(kw_only=True)
class TopicConfig:
    name: str = prop(description="A topic (root or below) known from the start.")


@config_class
@attrs.frozen(kw_only=True)
class SlowSubscriberCondition:
    name: str = prop(description="The root topic this condition applies to.")
    max_messages: int = prop(
        -1, min=-1, description="Messages a subscriber may have waiting before it counts as slow; -1: never slow."
    )
    action: str = prop(
        "flow-control",
        choices=SLOW_ACTIONS,
        description="flow-control: keep delivering, and tell publishers to wait max-flowcontrol-delay; "
        "drop: a slow non-durable subscriber misses new messages; disconnect: a slow non-durable "
        "subscriber is closed. Durable subscribers are never dropped nor disconnected: for them the "
        "action is always flow-control.",
    )


@config_class
@attrs.frozen(kw_only=True)
class StaticTopicSubscription:
    name: str = prop(description="The root topic (the first level of a topic hierarchy) forwarded to the router.")
    keep_on_unsubscribe: bool = prop(
        False,
        description="Keep forwarding when that router announces it has no "
        "subscriptions under the root (an orderly shutdown): messages then wait in "
        "its routing queue. False: valid only until the router's first announcement.",
    )


@config_class
@attrs.frozen(kw_only=True)
class StaticRemoteRouterSubscription:
    name: str = prop(description="The remote router; sys$routing must have a static route to it.")
    static_topic_subscriptions: Mapping[str, StaticTopicSubscription] = entity_list(
        StaticTopicSubscription,
        item="static-topic-subscription",
        description="Root topics forwarded to that router before it has announced anything.",
    )


@config_class
@attrs.frozen(kw_only=True)
class AnnounceFilter:
    name: str = prop(description="The remote router this filter applies to.")
    roots: str = prop("", description="Root topics, separated by spaces.")
    mode: str = prop(
        "exclude",
        choices=("include", "exclude"),
        description="include: only these roots are announced to that router; exclude: all but these.",
    )


@config_class
@attrs.frozen(kw_only=True)
class TopicManagerConfig:
    auto_create_topics: bool = prop(
        True,
        description="Publishing or subscribing under a root that is not defined creates it; false: that is an error.",
    )
    unconsumed_backlog_warning: int = prop(
        1000,
        min=-1,
        description="A durable subscription without a consumer whose backlog grew to at least this many "
        "messages is reported: backlog-growing in its usage, counted in durable-backlogs-growing, and a "
        "WARNING line (about once an hour per subscription); -1: never.",
    )
    backlog_check_interval: int = prop(
        60_000,
        min=100,
        max=86_400_000,
        description="Milliseconds between two checks of the durable subscriptions' backlogs "
        "(unconsumed-backlog-warning).",
    )
    topics: Mapping[str, TopicConfig] = entity_list(TopicConfig, item="topic", description="Defined topics.")
    slow_subscriber_conditions: Mapping[str, SlowSubscriberCondition] = entity_list(
        SlowSubscriberCondition,
        item="slow-subscriber-condition",
        description="Per root topic: when a subscriber is slow and what happens then (default: never slow).",
    )
    static_remote_router_subscriptions: Mapping[str, StaticRemoteRouterSubscription] = entity_list(
        StaticRemoteRouterSubscription,
        item="static-remote-router-subscription",
        description="Remote subscriptions in force before the remote router first announces its interest.",
    )
    announce_filters: Mapping[str, AnnounceFilter] = entity_list(
        AnnounceFilter,
        item="announce-filter",
        description="Per remote router: which root topics this router announces interest in to it "
        "(keeps a topic local to a region).",
    )


def check_config(config: Any, _hook: Any = None) -> Iterator[ConfigProblem]:
    """The topic manager's rule across swiftlets (``SwiftletSpec.check``, run by ``martinet
    check`` and at start): a static remote subscription needs a static route to its router in
    a started ``sys$routing`` (the federation checks the same at run time, for management)."""
    own = config.swiftlets["sys$topicmanager"].config
    routing = config.swiftlets["sys$routing"].config if "sys$routing" in config.startorder else None
    routes = routing.static_routes if routing is not None else {}
    for router in own.static_remote_router_subscriptions:
        if router not in routes:
            yield ConfigProblem(
                ("static-remote-router-subscriptions", router),
                f"a static remote subscription needs a static route to {router}: add "
                f'<static-route name="{router}"/> to sys$routing\'s <static-routes>'
                + ("" if routing is not None else " (sys$routing is not in the start order)"),
            )
