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

Passwords: a configured password is plain text (as SwiftMQ keeps them) or a salted hash
``pbkdf2-sha256$…`` (:mod:`martinet.kernel.passwords`, ``martinet hash-password``); the
management tree never shows either. A user whose password is empty cannot log in (authentication enabled):
an empty password is a forgotten one, not an open door. An unknown user's password is
checked against a dummy of the kind the config uses (hashed if any user's password is, with
the largest iteration count configured), and where some users have hashes, a plain-text
password's compare is followed by a compare against that dummy hash too: every login costs
the same hash, so the time a refusal takes does not tell whether the user exists (the
iteration counts are the only difference left between users: give all the same). Hashes are checked in worker
threads, at most :data:`HASH_CHECK_THREADS` at once, never on the event loop.

Failed logins:

- *Throttled per address and user, across connections*: the checks of one user's logins
  from one address take turns, one at a time, and after a failure the next waits a delay
  that doubles with each failure from :data:`FIRST_DELAY` up to :data:`MAX_DELAY`, so
  parallel connections queue behind one another instead of guessing side by side. Only a success of
  that user from that address, or :data:`QUIET_PERIOD` without failures, resets it; another
  account's success does not.
- *Answered late, per address*: the refusal is sent after a delay
  (:meth:`Authentication.refusal_delay`) that grows the same way with the address's
  failures (any user), reset only by :data:`QUIET_PERIOD` without failures.
- *Logged aggregated*: the first refusal from an address is logged (WARNING) with its
  details; further ones within :data:`LOG_INTERVAL` are counted and logged as one WARNING
  per address at the end of the interval.

Access denials (a grant missing) are logged aggregated the same way, per address: a client
attaching in a loop to what it may not use would otherwise write a line per attempt.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, NoReturn

import attrs
import trio

from martinet.kernel import SwiftletContext
from martinet.kernel.passwords import SCHEME, is_hashed, verify_password
from martinet.messaging.like import LikePatternError, like_pattern

from .api import QUEUE_ACTIONS, TOPIC_ACTIONS, AccessDenied, AuthenticationFailed
from .config import GroupConfig, UserConfig

__all__ = ["Authentication", "Principal"]

log = logging.getLogger(__name__)

FIRST_DELAY = 0.1  # seconds before the refusal of a second failed login from an address
MAX_DELAY = 4.0
QUIET_PERIOD = 60.0  # seconds without a failure after which an address starts afresh
LOG_INTERVAL = 60.0  # refusals from one address within it are logged as one line
# Password hashes checked at once, each in a worker thread (hashlib releases the GIL while
# it hashes): the machine's cores, not one thread per waiting login.
HASH_CHECK_THREADS = max(1, min(4, os.cpu_count() or 1))
_DUMMY_PLAIN = "not a password"
LOGIN_REFUSED, ACCESS_DENIED = "login refused", "access denied"
_COUNTED = {LOGIN_REFUSED: "login(s) refused", ACCESS_DENIED: "access denial(s)"}  # in flush_log's summary
# The salt and digest of the dummy hash, urlsafe base64 of 16 fixed bytes and 32 zero bytes
# (only its cost matters: no password's PBKDF2 gives those).
_DUMMY_SALT_DIGEST = "bWFydGluZXQtZHVtbXkuLg$" + "A" * 43


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
            if like_pattern(grant_name).matches(name):
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
            self._auth._denied(
                self,
                f"{action} on queue {queue!r}"
                + (
                    " (a system name: only a grant naming it, or a predicate grant with '$' in it, allows that)"
                    if system and grant is None
                    else ""
                ),
            )

    def check_topic(self, topic: str, action: str) -> None:
        """Raises: AccessDenied unless ``action`` (publish, subscribe, durable) on ``topic`` is granted."""
        if action not in TOPIC_ACTIONS:
            raise ValueError(f"unknown topic action {action!r}")
        if not self._checked:
            return
        grant = _grant(self._auth._group(self.group).topic_grants, topic)
        if grant is None or not getattr(grant, f"{action}_grant"):
            self._auth._denied(self, f"{action} on topic {topic!r}")


def _delay(failures: int) -> float:
    """The delay after ``failures`` failures in a row: 0 for the first, then doubling from
    FIRST_DELAY up to MAX_DELAY."""
    return 0.0 if failures <= 1 else min(FIRST_DELAY * 2 ** (failures - 2), MAX_DELAY)


class Authentication:
    """``sys$authentication``; what ``context.lookup("sys$authentication", Authentication)``
    returns (it provides the protocol :class:`.api.Authentication`)."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.logins = self.refused_logins = self.denials = 0
        self._failures: dict[str, tuple[int, float]] = {}  # host → (failures in a row, time of the last)
        # (host, user) → (failures in a row, time of the last); its checks, one at a time
        self._attempts: dict[tuple[str, str], tuple[int, float]] = {}
        self._turns: dict[tuple[str, str], trio.Lock] = {}
        # (what, host) → [events not logged yet, last detail]; what: LOGIN_REFUSED or ACCESS_DENIED
        self._unlogged: dict[tuple[str, str], list[Any]] = {}
        self._hash_checks = trio.CapacityLimiter(HASH_CHECK_THREADS)

    def refusal_delay(self, host: str) -> float:
        """Seconds to wait before answering a refused login from ``host`` (0 for its first
        failure; doubling from FIRST_DELAY up to MAX_DELAY after that)."""
        count, _last = self._failures.get(host, (0, 0.0))
        return _delay(count)

    def _failed(self, host: str, user: str) -> None:
        now = trio.current_time()
        count, last = self._failures.get(host, (0, now))
        self._failures[host] = (0 if now - last >= QUIET_PERIOD else count) + 1, now
        count, last = self._attempts.get((host, user), (0, now))
        self._attempts[host, user] = (0 if now - last >= QUIET_PERIOD else count) + 1, now

    @contextlib.asynccontextmanager
    async def _turn(self, host: str, user: str) -> AsyncIterator[None]:
        """The check of a login of ``user`` from ``host``, one at a time across connections,
        each after the delay the failures before it earned."""
        key = (host, user)
        turn = self._turns.setdefault(key, trio.Lock())
        try:
            async with turn:
                count, last = self._attempts.get(key, (0, 0.0))
                if count and trio.current_time() - last < QUIET_PERIOD:
                    await trio.sleep_until(last + _delay(count))
                yield
        finally:
            if not turn.locked() and not turn.statistics().tasks_waiting and self._turns.get(key) is turn:
                del self._turns[key]

    def flush_log(self) -> None:
        """Log the refusals counted since the last flush (one line per address) and forget
        addresses quiet for QUIET_PERIOD; the swiftlet calls it every LOG_INTERVAL."""
        unlogged, self._unlogged = self._unlogged, {}
        for (what, host), (count, detail) in unlogged.items():
            if count:
                log.warning(
                    "%d more %s from %s in the last %.0f s (last: %s)",
                    count,
                    _COUNTED[what],
                    host,
                    LOG_INTERVAL,
                    detail,
                )
        now = trio.current_time()
        for host, (_count, last) in list(self._failures.items()):
            if now - last >= QUIET_PERIOD:
                del self._failures[host]
        for key, (_count, last) in list(self._attempts.items()):
            if now - last >= QUIET_PERIOD:
                del self._attempts[key]

    @property
    def enabled(self) -> bool:
        return self.context.entity.get("authentication-enabled")

    def _group(self, name: str) -> GroupConfig:
        group = self.context.entity.entity_list("groups").entities.get(name)
        return group.config if group is not None else GroupConfig(name=name)

    async def login(self, user: str | None, password: str | None, host: str) -> Principal:
        """Check a login; ``user`` None means anonymous. A hashed password is checked in a
        worker thread (:meth:`_verify`); cancelled, it still waits for that check to end.

        Raises:
            AuthenticationFailed: unknown user, wrong password, host not allowed, or anonymous
                not allowed. The client-facing reason does not say which of user or password
                was wrong.
        """
        users = self.context.entity.entity_list("users").entities
        entity = users.get(user) if user is not None else None
        config: UserConfig | None = entity.config if entity is not None else None
        if (
            config is not None
            and config.host_access_list
            and not any(like_pattern(pattern).matches(host) for pattern in config.host_access_list)
        ):
            self._refuse(f"host {host} is not allowed for user {user}", user, host, "host not allowed")
        if not self.enabled:
            self.logins += 1
            return Principal(user or "anonymous", host, config.group if config else "public", False, self)
        if user is None:
            if not self.context.entity.get("allow-anonymous"):
                self._refuse("anonymous logins are not allowed", user, host, "anonymous login not allowed")
            self.logins += 1
            return Principal("anonymous", host, "public", True, self)
        # The same compare whether the user exists or not (see the module docstring).
        dummy = self._dummy(users)
        stored = config.password if config is not None and config.password else dummy
        async with self._turn(host, user):  # (a failure is counted before the next check's turn)
            matches = await self._verify(stored, password or "", dummy)
            if config is None:
                self._refuse(f"unknown user {user!r}", user, host, "invalid user name or password")
            if not config.password:
                self._refuse(f"user {user!r} has no password configured", user, host, "invalid user name or password")
            if not matches:
                self._refuse(f"wrong password for user {user!r}", user, host, "invalid user name or password")
            self._attempts.pop((host, user), None)  # this user from this address only
        self.logins += 1
        log.info("user %s logged in from %s", user, host)
        return Principal(user, host, config.group, True, self)

    async def _verify(self, stored: str, given: str, dummy: str) -> bool:
        """:func:`verify_password`, a hash off the event loop: one takes tens of milliseconds
        of CPU, and a burst of logins checked on the loop stalled every connection's
        traffic meanwhile. At most HASH_CHECK_THREADS run at once (the rest wait their turn,
        without a thread each). A plain-text compare is cheap and stays on the loop; when
        ``dummy`` is a hash (other users have hashes) it is checked too, its result unused,
        so that this login costs what an unknown user's does."""
        if is_hashed(stored):
            return await trio.to_thread.run_sync(verify_password, stored, given, limiter=self._hash_checks)
        matches = verify_password(stored, given)
        if is_hashed(dummy):
            await trio.to_thread.run_sync(verify_password, dummy, given, limiter=self._hash_checks)
        return matches

    @staticmethod
    def _dummy(users: Mapping[str, Any]) -> str:
        """Plain text unless some user's password is a hash; then a hash of as many
        iterations as the largest count configured (it never matches)."""
        iterations = [
            int(parts[1])
            for entity in users.values()
            if len(parts := entity.config.password.split("$")) == 4 and parts[0] == SCHEME and parts[1].isdigit()
        ]
        return f"{SCHEME}${max(iterations)}${_DUMMY_SALT_DIGEST}" if iterations else _DUMMY_PLAIN

    def _refuse(self, detail: str, user: str | None, host: str, reason: str) -> NoReturn:
        self.refused_logins += 1
        self._failed(host, user or "")
        self._log(LOGIN_REFUSED, host, detail)
        raise AuthenticationFailed(reason, f"login of {user or 'anonymous'} from {host} refused: {detail}")

    def _denied(self, principal: Principal, what: str) -> NoReturn:
        self.denials += 1
        self._log(ACCESS_DENIED, principal.host, f"user {principal.user} (group {principal.group}) may not {what}")
        raise AccessDenied(f"user {principal.user} may not {what}")

    def _log(self, what: str, host: str, detail: str) -> None:
        """Log the first ``what`` from ``host`` in a LOG_INTERVAL at once; count the others for
        :meth:`flush_log`."""
        pending = self._unlogged.get((what, host))
        if pending is None:
            self._unlogged[what, host] = [0, detail]
            log.warning("%s from %s: %s", what, host, detail)
        else:
            pending[0] += 1
            pending[1] = detail

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.context.usage.provide(
            lambda: {"logins": self.logins, "refused-logins": self.refused_logins, "access-denials": self.denials}
        )
        task_status.started()
        try:
            while True:
                await trio.sleep(LOG_INTERVAL)
                self.flush_log()
        finally:
            self.flush_log()
