"""``sys$mgmt``'s public interface: the management queue, the request/reply format, the
identity a listener stamps, and the :class:`Management` protocol.

The format (version :data:`VERSION`, documented for operators and other clients in
``docs/management.md``): a request is an AMQP message sent to :data:`MANAGEMENT_QUEUE` on
the router to manage (``sys$mgmt@paris`` from anywhere in the network) with a reply-to; its
body is JSON text (an amqp-value string) holding an object with ``version``, ``verb`` and the
verb's arguments. The reply goes to the reply-to with the request's correlation-id (or,
without one, its message-id) as its correlation-id; its body is JSON text too:
``{"version", "router", "status", "result" | "error"}``, and its application-property
``mgmt-status`` repeats the status.

Identity. The AMQP listener of the router where a request *enters* stamps it with the
message annotation :data:`IDENTITY_ANNOTATION`, a map of who sent it (user, group, whether
that router authenticated the user, the peer's address, the router's name), replacing any
value a client put there; routing carries it unchanged to the router that serves the request.
So a router trusts what the entry router authenticated: routers authenticate each other
(the routing listener's password), clients never vouch for themselves.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = [
    "MANAGEMENT_QUEUE",
    "VERSION",
    "IDENTITY_ANNOTATION",
    "STATUS_PROPERTY",
    "READ_VERBS",
    "WRITE_VERBS",
    "Status",
    "Identity",
    "Role",
    "Management",
    "is_management_address",
]

#: The queue each router serves management requests on.
MANAGEMENT_QUEUE = "sys$mgmt"
#: The request/reply format's version; a request with another is answered with status 400.
VERSION = 1
#: The message annotation holding the sender's identity, stamped by the entry router.
IDENTITY_ANNOTATION = "x-opt-martinet-identity"
#: The reply's application-property carrying its status.
STATUS_PROPERTY = "mgmt-status"

#: Verbs a read-only role may use; every other verb changes something.
READ_VERBS = frozenset({"get", "describe", "routers", "watch", "unwatch"})
WRITE_VERBS = frozenset({"set", "add", "remove", "invoke", "save", "reboot", "halt"})


class Status(enum.IntEnum):
    """A reply's status, as HTTP has them."""

    OK = 200
    BAD_REQUEST = 400  # malformed, unknown verb or path, invalid value, vetoed (the reason says which)
    FORBIDDEN = 403  # not a manager of this router, or a read-only role asked for a change
    UNAVAILABLE = 503  # too many watches, or the router is stopping
    ERROR = 500  # the router failed to do it (logged with a traceback there)


class Role(enum.StrEnum):
    READ_ONLY = "read-only"
    READ_WRITE = "read-write"


def is_management_address(address: str) -> bool:
    """Whether ``address`` (``q`` or ``q@router``) names a router's management queue."""
    return address.partition("@")[0] == MANAGEMENT_QUEUE


@attrs.frozen(kw_only=True)
class Identity:
    """Who sent a request, as the router where it entered saw them.

    Attributes:
        user: the user name ("" when that router had no authentication swiftlet).
        group: the user's group there.
        authenticated: that router checked the user's password (authentication enabled).
        host: the address the client connected from.
        router: the router where the request entered the network.
    """

    user: str = ""
    group: str = ""
    authenticated: bool = False
    host: str = ""
    router: str = ""

    def annotation(self) -> dict[str, Any]:
        """The value of :data:`IDENTITY_ANNOTATION` for this identity."""
        return attrs.asdict(self)

    @classmethod
    def from_annotations(cls, annotations: Mapping[Any, Any]) -> Identity | None:
        """The identity a message carries; None when it has none (it did not enter through an
        AMQP listener) or it is malformed."""
        value = annotations.get(IDENTITY_ANNOTATION)
        if not isinstance(value, Mapping):
            return None
        fields = {field.name: field.type for field in attrs.fields(cls)}
        try:
            return cls(**{name: value[name] for name in fields if name in value
                          if isinstance(value[name], bool if fields[name] == "bool" else str)})
        except TypeError:
            return None

    @property
    def loopback(self) -> bool:
        """The client connected from a loopback address (``::ffff:127.0.0.1`` included)."""
        try:
            address = ipaddress.ip_address(self.host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    def __str__(self) -> str:
        who = self.user or "(no user)"
        return f"{who}@{self.host or '?'}" + (f" via {self.router}" if self.router else "")


@runtime_checkable
class Management(Protocol):
    """What ``context.lookup("sys$mgmt", Management)`` returns: management requests to this
    router or any router it can route to, for front ends inside a router (a web view)."""

    async def request(self, router: str, request: Mapping[str, Any], identity: Identity,
                      timeout: float = 10.0) -> dict[str, Any]:
        """Serve ``request`` (``{"verb": …, …}``, the ``version`` may be left out) on router
        ``router`` as ``identity`` and return the reply (``{"status", "router", "result" |
        "error"}``); on this router it is served at once, on another it travels as a message
        to ``sys$mgmt@router`` and back. A remote router that does not answer in ``timeout``
        seconds gives status 503. Authorization is as for any request."""
