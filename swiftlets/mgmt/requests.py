"""What a management request is and who may make it: the request object of a message body
(JSON), its arguments checked one by one (a wrong one is refused with status 400 and what is
wrong), a destructive request's confirmation (``force``), and :func:`authorize`, the role an
identity has on this router for a verb. Every refusal is a :class:`Refused` with its status
and a reason the requester reads."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from .api import LOCAL_ADDRESSES, WRITE_VERBS, Identity, LocalNetworks, Role, Status, parse_local_addresses

__all__ = [
    "Refused",
    "authorize",
    "confirm",
    "decode_request",
    "plain",
    "request_path",
    "request_text",
    "request_mapping",
    "request_scalar",
]


@functools.lru_cache(maxsize=16)
def _local_networks(text: str) -> LocalNetworks:
    """``local-addresses`` parsed once per value (it was checked when set)."""
    return parse_local_addresses(text)


class Refused(Exception):
    """A request that gets a status other than 200; the message is the reason."""

    def __init__(self, status: Status, reason: str):
        super().__init__(reason)
        self.status = status


def authorize(
    identity: Identity | None,
    verb: str,
    *,
    router: str,
    authentication: bool,
    groups: Mapping[str, Role],
    local_addresses: str = LOCAL_ADDRESSES,
) -> Role:
    """The role ``identity`` has on this router for ``verb``.

    A router's own request (:meth:`.api.Identity.of_router`) is read-only. Otherwise, with
    ``authentication`` (this router's ``authentication-enabled``), the user must have
    been authenticated where the request entered and belong to one of ``groups``; without
    it, the client must have connected from ``local_addresses`` (``sys$mgmt``'s setting, by
    default every loopback address; read-write then).

    Raises:
        Refused: FORBIDDEN, with why.
    """
    if identity is None:
        raise Refused(Status.FORBIDDEN, "the request carries no identity (it did not come through an AMQP listener)")
    if identity.internal:  # a router's own request: routers are trusted (see .api), for reading only
        role = Role.READ_ONLY
    elif authentication:
        if not identity.authenticated:
            raise Refused(
                Status.FORBIDDEN,
                f"router {router} requires an authenticated user, and {identity} was "
                "not authenticated where the request entered",
            )
        granted = groups.get(identity.group)
        if granted is None:
            raise Refused(
                Status.FORBIDDEN,
                f"user {identity.user} (group {identity.group}) may not manage router "
                f"{router}: its group is not one of sys$mgmt's groups",
            )
        role = granted
    elif identity.connected_from(_local_networks(local_addresses)):
        role = Role.READ_WRITE
    else:
        narrowed = "" if local_addresses == LOCAL_ADDRESSES else f" (local-addresses {local_addresses!r})"
        raise Refused(
            Status.FORBIDDEN,
            f"router {router} has authentication disabled and answers management "
            f"requests only from loopback clients{narrowed}; {identity} is not one",
        )
    if verb in WRITE_VERBS and role is not Role.READ_WRITE:
        raise Refused(
            Status.FORBIDDEN,
            f"{verb!r} changes router {router}, and the role of group {identity.group} is {role.value}",
        )
    return role


def plain(value: Any) -> Any:
    """``value`` as JSON data: enums by value, tuples and sets as lists, anything else unknown
    as its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return str(value)


def request_path(request: Mapping[str, Any]) -> str:
    path = request.get("path", "/")
    if not isinstance(path, str):
        raise Refused(Status.BAD_REQUEST, "argument 'path' must be text")
    return path or "/"


def request_text(request: Mapping[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str) or not value:
        raise Refused(Status.BAD_REQUEST, f"argument {name!r} missing or not text")
    return value


def request_mapping(request: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = request.get(name, {})
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise Refused(Status.BAD_REQUEST, f"argument {name!r} must be an object")
    return dict(value)


def request_scalar(value: Any, what: str) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value if isinstance(value, (str, bool)) else str(value)  # the tree parses text
    raise Refused(Status.BAD_REQUEST, f"{what} must be text, a number or a boolean")


def confirm(request: Mapping[str, Any], what: str, messages: int, *, always: bool = False) -> None:
    """Let a destructive request through only with ``"force": true`` when it would drop
    ``messages`` (or ``always``, for a halt): an operator sees what goes before it goes.

    Raises:
        Refused: CONFLICT, saying what would be destroyed; BAD_REQUEST for a ``force`` that
            is not a boolean.
    """
    force = request.get("force", False)
    if not isinstance(force, bool):
        raise Refused(Status.BAD_REQUEST, "argument 'force' must be true or false")
    if not force and (messages > 0 or always):
        raise Refused(Status.CONFLICT, f"{what}: not done without force (a confirmation)")


def decode_request(body: Any) -> dict[str, Any]:
    """The request object of a message body (JSON text, as a string or UTF-8 bytes).

    Raises:
        Refused: BAD_REQUEST, with what is wrong.
    """
    if isinstance(body, (bytes, bytearray)):
        try:
            body = body.decode()
        except UnicodeDecodeError:
            raise Refused(Status.BAD_REQUEST, "the body is not UTF-8 text") from None
    if not isinstance(body, str):
        raise Refused(Status.BAD_REQUEST, "the body must be JSON text (an amqp-value string or a data section)")
    try:
        request = json.loads(body)
    except ValueError as exc:
        raise Refused(Status.BAD_REQUEST, f"the body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise Refused(Status.BAD_REQUEST, "the body must be a JSON object")
    return request
