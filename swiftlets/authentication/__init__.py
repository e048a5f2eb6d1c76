"""``sys$authentication``: users, groups, grants and host access lists.

Theory of operation
-------------------
A listener logs a client in with :meth:`Authentication.login` (user, password, the host it
connects from) and gets a :class:`Principal`, which it asks before every attach:
:meth:`Principal.check_queue` (send, receive, browse) and :meth:`Principal.check_topic`
(publish, subscribe, durable). Refusals raise :class:`AccessDenied` (or
:class:`AuthenticationFailed` at login) carrying a reason for the client and are logged
with the details; the listener maps them to ``amqp:unauthorized-access``.

- ``authentication-enabled="false"`` (the default, as SwiftMQ ships): every login
  succeeds and everything is granted; host access lists still apply.
- A user has a password, a group and a host access list (SQL-LIKE host patterns; empty:
  any host). Each group has queue grants and topic grants; a grant names a queue or topic
  or is a SQL-LIKE predicate. For a destination the grant of that exact name decides,
  else the first predicate grant (in name order) that matches; no grant, no access.
- The group ``public`` exists always; ``anonymous`` logins (no user name) are allowed when
  ``allow-anonymous`` is on and get the ``public`` group's grants.
- Queue names containing ``$`` (temporary, durable-subscriber and system queues) are not
  checked here, as in SwiftMQ: their owners are checked where they are used.

Passwords are kept in the config file as SwiftMQ keeps them; protect the file.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from martinet.kernel import SwiftletContext, SwiftletSpec, config_class, entity_list, hookimpl, prop
from martinet.messaging.selector import SelectorError, like_pattern

__all__ = ["Authentication", "Principal", "AuthenticationFailed", "AccessDenied"]

log = logging.getLogger(__name__)

QUEUE_ACTIONS = ("send", "receive", "browse")
TOPIC_ACTIONS = ("publish", "subscribe", "durable")


@config_class
class QueueGrant:
    name: str = prop(description="Queue name or SQL-LIKE predicate.")
    send_grant: bool = prop(True, description="May send to the queue.")
    receive_grant: bool = prop(True, description="May receive from the queue.")
    browse_grant: bool = prop(True, description="May browse the queue.")


@config_class
class TopicGrant:
    name: str = prop(description="Topic name or SQL-LIKE predicate (root included).")
    publish_grant: bool = prop(True, description="May publish to the topic.")
    subscribe_grant: bool = prop(True, description="May subscribe to the topic.")
    durable_grant: bool = prop(True, description="May create durable subscriptions on the topic.")


@config_class
class GroupConfig:
    name: str = prop(description="Group name.")
    queue_grants: Mapping[str, QueueGrant] = entity_list(QueueGrant, item="queue-grant", description="Queue grants.")
    topic_grants: Mapping[str, TopicGrant] = entity_list(TopicGrant, item="topic-grant", description="Topic grants.")


@config_class
class HostAccessEntry:
    name: str = prop(description="SQL-LIKE pattern of host names or addresses allowed.")


@config_class
class UserConfig:
    name: str = prop(description="User name.")
    password: str = prop("", description="The user's password.")
    group: str = prop("public", description="The user's group.")
    host_access_list: Mapping[str, HostAccessEntry] = entity_list(
        HostAccessEntry, item="host-access-entry", description="Hosts this user may connect from; empty: any.")


@config_class
class AuthenticationConfig:
    authentication_enabled: bool = prop(False, description="Check users, passwords and grants; false: grant all.")
    allow_anonymous: bool = prop(False, description="With authentication enabled, accept logins without a user "
                                 "name (SASL ANONYMOUS), with the public group's grants.")
    groups: Mapping[str, GroupConfig] = entity_list(
        GroupConfig, item="group", default=[GroupConfig(name="public")], description="Groups and their grants.")
    users: Mapping[str, UserConfig] = entity_list(UserConfig, item="user", description="Users.")


class AuthenticationFailed(Exception):
    """A login was refused. ``reason`` is for the client; ``str()`` has the details for the log."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class AccessDenied(Exception):
    """An operation on a destination is not granted; the message says which and why."""


def _grant(grants: Mapping[str, Any], name: str) -> Any:
    exact = grants.get(name)
    if exact is not None:
        return exact
    for grant_name in sorted(grants):
        try:
            if like_pattern(grant_name).fullmatch(name):
                return grants[grant_name]
        except SelectorError:
            continue  # a grant name with a lone escape matches nothing but itself
    return None


@attrs.frozen
class Principal:
    """A logged-in client: who, from where, and what it may do."""

    user: str
    host: str
    group: str
    _checked: bool
    _auth: Authentication = attrs.field(repr=False, eq=False)

    def check_queue(self, queue: str, action: str) -> None:
        """Raises: AccessDenied unless ``action`` (send, receive, browse) on ``queue`` is granted."""
        if action not in QUEUE_ACTIONS:
            raise ValueError(f"unknown queue action {action!r}")
        if not self._checked or "$" in queue:
            return
        grant = _grant(self._auth._group(self.group).queue_grants, queue.split("@", 1)[0])
        if grant is None or not getattr(grant, f"{action}_grant"):
            self._auth._denied(self, f"{action} on queue {queue!r}")

    def check_topic(self, topic: str, action: str) -> None:
        """Raises: AccessDenied unless ``action`` (publish, subscribe, durable) on ``topic`` is granted."""
        if action not in TOPIC_ACTIONS:
            raise ValueError(f"unknown topic action {action!r}")
        if not self._checked:
            return
        grant = _grant(self._auth._group(self.group).topic_grants, topic)
        if grant is None or not getattr(grant, f"{action}_grant"):
            self._auth._denied(self, f"{action} on topic {topic!r}")


class Authentication:
    """``sys$authentication``; what ``context.lookup("sys$authentication")`` returns."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.logins = self.refused_logins = self.denials = 0

    @property
    def enabled(self) -> bool:
        return self.context.entity.get("authentication-enabled")

    def _group(self, name: str) -> GroupConfig:
        group = self.context.entity.entity_list("groups").entities.get(name)
        return group.snapshot() if group is not None else GroupConfig(name=name)

    def login(self, user: str | None, password: str | None, host: str) -> Principal:
        """Check a login; ``user`` None means anonymous.

        Raises:
            AuthenticationFailed: unknown user, wrong password, host not allowed, or anonymous
                not allowed. The client-facing reason does not say which of user or password
                was wrong.
        """
        users = self.context.entity.entity_list("users").entities
        entity = users.get(user) if user is not None else None
        config: UserConfig | None = entity.snapshot() if entity is not None else None
        if config is not None and config.host_access_list and not any(
                like_pattern(pattern).fullmatch(host) for pattern in config.host_access_list):
            self._refuse(f"host {host} is not allowed for user {user}", user, host, "host not allowed")
        if not self.enabled:
            self.logins += 1
            return Principal(user or "anonymous", host, config.group if config else "public", False, self)
        if user is None:
            if not self.context.entity.get("allow-anonymous"):
                self._refuse("anonymous logins are not allowed", user, host, "anonymous login not allowed")
            self.logins += 1
            return Principal("anonymous", host, "public", True, self)
        if config is None:
            self._refuse(f"unknown user {user!r}", user, host, "invalid user name or password")
        if not hmac.compare_digest((password or "").encode(), config.password.encode()):
            self._refuse(f"wrong password for user {user!r}", user, host, "invalid user name or password")
        self.logins += 1
        log.info("user %s logged in from %s", user, host)
        return Principal(user, host, config.group, True, self)

    def _refuse(self, detail: str, user: str | None, host: str, reason: str) -> None:
        self.refused_logins += 1
        log.warning("login refused from %s: %s", host, detail)
        raise AuthenticationFailed(reason, f"login of {user or 'anonymous'} from {host} refused: {detail}")

    def _denied(self, principal: Principal, what: str) -> None:
        self.denials += 1
        log.warning("access denied: user %s (group %s) from %s may not %s", principal.user, principal.group,
                    principal.host, what)
        raise AccessDenied(f"user {principal.user} may not {what}")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.context.usage.provide(lambda: {"logins": self.logins, "refused-logins": self.refused_logins,
                                            "access-denials": self.denials})
        task_status.started()
        await trio.sleep_forever()


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$authentication",
            description="Users, groups, queue and topic grants, host access lists.",
            config=AuthenticationConfig,
            factory=Authentication,
        )
    ]
