"""The running ``sys$authentication``: logins, principals and their checks.

Theory of operation
-------------------
A listener logs a client in with :meth:`Authentication.login` (user, password, the host it
connects from) and gets a :class:`Principal`, which it asks before every attach (the
contracts are in :mod:`.api`). Every refusal is counted and logged here with its details;
the exception carries only what the client may be told. Each login and check reads the
live configuration (the swiftlet's entity), so runtime changes apply at once.

- ``authentication-enabled="false"`` (the default, as SwiftMQ ships): every login
  succeeds and everything is granted — host access lists and the system-name rule below
  still apply.
- A user has a password, a group and a host access list (SQL-LIKE host patterns; empty:
  any host). Each group has queue grants and topic grants; a grant names a queue or topic
  or is a SQL-LIKE predicate. For a destination the grant of that exact name decides,
  else the first predicate grant (in name order) that matches; no grant, no access.
- The group ``public`` exists always; ``anonymous`` logins (no user name) are allowed when
  ``allow-anonymous`` is on and get the ``public`` group's grants.
- Queue names containing ``$`` are system names, the router's. Temporary and
  durable-subscriber queues have owners, checked where they are used (the listener); any
  other ``$`` name is granted only by a grant that names it explicitly — one of exactly
  that name, or a predicate grant that contains ``$`` itself (``rt$%``; the catch-all ``%``
  does not count) — whether authentication is on or off. (SwiftMQ did not check ``$``
  names at all; a client could then read another client's durable subscription.)

Passwords are kept in the config file as SwiftMQ keeps them; protect the file.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from martinet.kernel import SwiftletContext
from martinet.messaging.like import LikePatternError, like_pattern

from .api import QUEUE_ACTIONS, TOPIC_ACTIONS, AccessDenied, AuthenticationFailed
from .config import GroupConfig, UserConfig

__all__ = ["Authentication", "Principal"]

log = logging.getLogger(__name__)


def _grant(grants: Mapping[str, Any], name: str, *, explicit: bool = False) -> Any:
    """The grant of exactly ``name``, else the first predicate grant (in name order) that
    matches it — with ``explicit``, only among predicates that contain ``$`` themselves."""
    exact = grants.get(name)
    if exact is not None:
        return exact
    for grant_name in sorted(grants):
        if explicit and "$" not in grant_name:
            continue
        try:
            if like_pattern(grant_name).fullmatch(name):
                return grants[grant_name]
        except LikePatternError:
            continue  # a grant name with a lone escape matches nothing but itself
    return None


@attrs.frozen
class Principal:
    """A logged-in client: who, from where, and what it may do (provides :class:`.api.Principal`)."""

    user: str
    host: str
    group: str
    _checked: bool
    _auth: Authentication = attrs.field(repr=False, eq=False)

    def check_queue(self, queue: str, action: str) -> None:
        """Raises: AccessDenied unless ``action`` (send, receive, browse) on ``queue`` is
        granted; a name with ``$`` needs a grant naming it explicitly, also when
        authentication is off (:meth:`.api.Principal.check_queue`)."""
        if action not in QUEUE_ACTIONS:
            raise ValueError(f"unknown queue action {action!r}")
        name = queue.split("@", 1)[0]
        system = "$" in name
        if not self._checked and not system:
            return
        grant = _grant(self._auth._group(self.group).queue_grants, name, explicit=system)
        if grant is None or not getattr(grant, f"{action}_grant"):
            self._auth._denied(self, f"{action} on queue {queue!r}" + (
                " (a system name: only a grant naming it, or a predicate grant with '$' in it, allows that)"
                if system and grant is None else ""))

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
    """``sys$authentication``; what ``context.lookup("sys$authentication", Authentication)``
    returns (it provides the protocol :class:`.api.Authentication`)."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.logins = self.refused_logins = self.denials = 0

    @property
    def enabled(self) -> bool:
        return self.context.entity.get("authentication-enabled")

    def _group(self, name: str) -> GroupConfig:
        group = self.context.entity.entity_list("groups").entities.get(name)
        return group.config if group is not None else GroupConfig(name=name)

    def login(self, user: str | None, password: str | None, host: str) -> Principal:
        """Check a login; ``user`` None means anonymous.

        Raises:
            AuthenticationFailed: unknown user, wrong password, host not allowed, or anonymous
                not allowed. The client-facing reason does not say which of user or password
                was wrong.
        """
        users = self.context.entity.entity_list("users").entities
        entity = users.get(user) if user is not None else None
        config: UserConfig | None = entity.config if entity is not None else None
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
