"""The authentication swiftlet's public interface: logins, the principal they give, and
the two refusals.

A listener gets it with ``context.lookup("sys$authentication", Authentication)``, logs a
client in with :meth:`Authentication.login` (user, password, the host it connects from)
and gets a :class:`Principal`, which it asks before every attach:
:meth:`Principal.check_queue` (send, receive, browse) and :meth:`Principal.check_topic`
(publish, subscribe, durable). Refusals raise :class:`AuthenticationFailed` at login or
:class:`AccessDenied` at a check; both carry a text for the client, and the swiftlet has
logged the details already. A listener maps them to ``amqp:unauthorized-access`` (or a
SASL ``auth`` outcome at login).

The checks are synchronous and cheap: they read the live configuration, so a grant
changed at runtime applies to the next check. Only the login awaits: a password hash is
checked in a worker thread, so that a burst of logins does not stall the event loop.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = [
    "Authentication",
    "Principal",
    "AuthenticationFailed",
    "AccessDenied",
    "QUEUE_ACTIONS",
    "TOPIC_ACTIONS",
]

QUEUE_ACTIONS = ("send", "receive", "browse")
TOPIC_ACTIONS = ("publish", "subscribe", "durable")


class AuthenticationFailed(Exception):
    """A login was refused. ``reason`` is for the client; ``str()`` has the details for the log."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class AccessDenied(Exception):
    """An operation on a destination is not granted; the message says which and why."""


class Principal(Protocol):
    """A logged-in client: who, from where, and what it may do."""

    @property
    def user(self) -> str:
        """The user name; ``anonymous`` for a login without one."""

    @property
    def host(self) -> str:
        """The host the client connected from."""

    @property
    def group(self) -> str:
        """The group whose grants apply."""

    def check_queue(self, queue: str, action: str) -> None:
        """Whether ``action`` (one of :data:`QUEUE_ACTIONS`) on ``queue`` (``q`` or
        ``q@router``) is granted.

        A queue name containing ``$`` is a system name (the router's: routing, system,
        durable-subscriber and temporary queues) and is granted only by a grant that names
        it explicitly: a grant of exactly that name, or else the first predicate grant (in
        name order) that contains ``$`` itself and matches (``rt$%``, ``sys$mgmt%``; ``%``
        does not count). This holds also when authentication is off: then every other check
        passes, this one still reads the principal's group's grants. Temporary and
        durable-subscriber queues have owners, which the caller checks first (anyone may
        send to a temporary queue, only its connection receive from it; a durable
        subscription's queue is used only through the subscription), so a listener asks
        here only for the other ``$`` names.

        Raises:
            AccessDenied: not granted.
            ValueError: an unknown action.
        """

    def check_topic(self, topic: str, action: str) -> None:
        """Whether ``action`` (one of :data:`TOPIC_ACTIONS`) on ``topic`` is granted.

        Raises:
            AccessDenied: not granted.
            ValueError: an unknown action.
        """


@runtime_checkable
class Authentication(Protocol):
    """What ``context.lookup("sys$authentication", Authentication)`` returns."""

    @property
    def enabled(self) -> bool:
        """Whether users, passwords and grants are checked (``authentication-enabled``);
        when not, every login succeeds and everything is granted (host access lists still
        apply) except queues with ``$`` in their names (see :meth:`Principal.check_queue`)."""

    def refusal_delay(self, host: str) -> float:
        """Seconds a listener waits before it answers a refused login from ``host`` (0 for a
        first failure, growing with the failures in a row from that address; a success or a
        quiet period resets it). Waiting is the listener's part; cancelling it is harmless."""

    async def login(self, user: str | None, password: str | None, host: str) -> Principal:
        """Check a login; ``user`` None means anonymous. Password hashes are checked off the
        event loop; cancelled, it still waits for a check in progress (tens of milliseconds).

        Raises:
            AuthenticationFailed: unknown user, wrong or empty password, host not allowed, or
                anonymous not allowed. The client-facing reason does not say which of user or password
                was wrong.
        """
