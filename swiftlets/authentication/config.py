"""``sys$authentication`` configuration: the switch, groups with their grants, users."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from martinet.kernel import config_class, entity_list, prop


@config_class
@attrs.frozen(kw_only=True)
class QueueGrant:
    name: str = prop(description="Queue name or SQL-LIKE predicate.")
    send_grant: bool = prop(True, description="May send to the queue.")
    receive_grant: bool = prop(True, description="May receive from the queue.")
    browse_grant: bool = prop(True, description="May browse the queue.")


@config_class
@attrs.frozen(kw_only=True)
class TopicGrant:
    name: str = prop(description="Topic name or SQL-LIKE predicate (root included).")
    publish_grant: bool = prop(True, description="May publish to the topic.")
    subscribe_grant: bool = prop(True, description="May subscribe to the topic.")
    durable_grant: bool = prop(True, description="May create durable subscriptions on the topic.")


@config_class
@attrs.frozen(kw_only=True)
class GroupConfig:
    name: str = prop(description="Group name.")
    queue_grants: Mapping[str, QueueGrant] = entity_list(QueueGrant, item="queue-grant", description="Queue grants.")
    topic_grants: Mapping[str, TopicGrant] = entity_list(TopicGrant, item="topic-grant", description="Topic grants.")


@config_class
@attrs.frozen(kw_only=True)
class HostAccessEntry:
    name: str = prop(description="SQL-LIKE pattern of host names or addresses allowed.")


@config_class
@attrs.frozen(kw_only=True)
class UserConfig:
    name: str = prop(description="User name.")
    password: str = prop(
        "",
        secret=True,
        description="The user's password: plain text, or a salted hash "
        "pbkdf2-sha256$ITERATIONS$SALT$HASH as `martinet hash-password` prints it. Empty: the "
        "user cannot log in (with authentication enabled). Management shows it masked.",
    )
    group: str = prop("public", description="The user's group.")
    host_access_list: Mapping[str, HostAccessEntry] = entity_list(
        HostAccessEntry, item="host-access-entry", description="Hosts this user may connect from; empty: any."
    )


@config_class
@attrs.frozen(kw_only=True)
class AuthenticationConfig:
    authentication_enabled: bool = prop(False, description="Check users, passwords and grants; false: grant all.")
    allow_anonymous: bool = prop(
        False,
        description="With authentication enabled, accept logins without a user "
        "name (SASL ANONYMOUS), with the public group's grants.",
    )
    groups: Mapping[str, GroupConfig] = entity_list(
        GroupConfig, item="group", default=[GroupConfig(name="public")], description="Groups and their grants."
    )
    users: Mapping[str, UserConfig] = entity_list(UserConfig, item="user", description="Users.")
