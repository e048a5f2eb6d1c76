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

A router's own requests. A front end inside a router that asks on the router's own behalf,
not for a user (``sys$web`` reading other routers' links), uses :meth:`Identity.of_router`:
an identity with ``internal`` set. No listener ever stamps one (a client's annotation is
replaced), so only a router makes it, and only routers (trusted, as above) carry it; every
router's ``sys$mgmt`` gives it the read-only role, whatever its groups and whether
authentication is on.

The crawl. :func:`crawl` asks every router one router knows for its links (what ``martinet
admin map`` shows and ``sys$web`` draws), through any way of sending requests.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

__all__ = [
    "MANAGEMENT_QUEUE",
    "VERSION",
    "IDENTITY_ANNOTATION",
    "STATUS_PROPERTY",
    "AUDIT_LOGGER",
    "READ_VERBS",
    "WRITE_VERBS",
    "Status",
    "Identity",
    "LOCAL_ADDRESSES",
    "LocalNetworks",
    "parse_local_addresses",
    "Role",
    "Management",
    "is_management_address",
    "RequestFailed",
    "Link",
    "NetworkMap",
    "crawl",
    "link_rate",
]

#: The queue each router serves management requests on.
MANAGEMENT_QUEUE = "sys$mgmt"
#: The request/reply format's version; a request with another is answered with status 400.
VERSION = 1
#: The message annotation holding the sender's identity, stamped by the entry router.
IDENTITY_ANNOTATION = "x-opt-martinet-identity"
#: The reply's application-property carrying its status.
STATUS_PROPERTY = "mgmt-status"
#: The logger of every change made and every request refused (INFO), and of nothing else,
#: so that an operator can send the audit trail to a file or a collector of its own.
AUDIT_LOGGER = "martinet.swiftlets.mgmt.audit"

#: Verbs a read-only role may use; every other verb changes something.
READ_VERBS = frozenset({"get", "describe", "routers", "watch", "unwatch"})
WRITE_VERBS = frozenset({"set", "add", "remove", "invoke", "save", "reboot", "halt"})


class Status(enum.IntEnum):
    """A reply's status, as HTTP has them."""

    OK = 200
    BAD_REQUEST = 400  # malformed, unknown verb or path, invalid value, vetoed (the reason says which)
    FORBIDDEN = 403  # not a manager of this router, or a read-only role asked for a change
    CONFLICT = 409  # destructive (drops messages, stops the router): done only with "force": true
    UNAVAILABLE = 503  # too many watches, or the router is stopping
    ERROR = 500  # the router failed to do it (logged with a traceback there)


class Role(enum.StrEnum):
    READ_ONLY = "read-only"
    READ_WRITE = "read-write"


#: ``local-addresses``' default: every loopback address, IPv4 and IPv6.
LOCAL_ADDRESSES = "127.0.0.0/8 ::1"

LocalNetworks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def parse_local_addresses(text: str) -> LocalNetworks:
    """``local-addresses``: loopback networks (``127.0.0.1``, ``127.0.0.0/8``, ``::1``)
    separated by spaces; "" for none.

    Only loopback networks are accepted: the setting can narrow who counts as local (say, to
    ``127.0.0.1`` when other 127.x addresses are used by something that must not manage the
    router), never widen it to clients of another machine, which must log in.

    Raises:
        ValueError: not a network, or one with an address that is not loopback.
    """
    networks = []
    for word in text.split():
        try:
            network = ipaddress.ip_network(word)
        except ValueError as exc:
            raise ValueError(f"expected a loopback address or network such as 127.0.0.1 or ::1: {exc}") from None
        if not (network.network_address.is_loopback and network.broadcast_address.is_loopback):
            raise ValueError(
                f"{word} is not a loopback network: only loopback clients may manage without logging in "
                "(turn sys$authentication's authentication-enabled on for the others)"
            )
        networks.append(network)
    return tuple(networks)


def is_management_address(address: str) -> bool:
    """Whether ``address`` (``q`` or ``q@router``) names a router's management queue (asked
    for every message a client sends: the prefix test answers almost all of them)."""
    return address.startswith(MANAGEMENT_QUEUE) and address.partition("@")[0] == MANAGEMENT_QUEUE


@attrs.frozen(kw_only=True)
class Identity:
    """Who sent a request, as the router where it entered saw them.

    Attributes:
        user: the user name ("" when that router had no authentication swiftlet).
        group: the user's group there.
        authenticated: that router checked the user's password (authentication enabled).
        host: the address the client connected from.
        router: the router where the request entered the network.
        internal: the request comes from router ``router`` itself (see the module header).
        reply_to: the request's reply-to as that router checked it: the requester may send
            there and it exists ("" when it may not, or there was none). A reply goes there
            and nowhere else.
    """

    user: str = ""
    group: str = ""
    authenticated: bool = False
    host: str = ""
    router: str = ""
    internal: bool = False
    reply_to: str = ""

    @classmethod
    def of_router(cls, router: str) -> Identity:
        """The identity of router ``router``'s own requests (read-only everywhere)."""
        return cls(user=f"router {router}", router=router, internal=True)

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
            return cls(
                **{
                    name: value[name]
                    for name in fields
                    if name in value
                    if isinstance(value[name], bool if fields[name] == "bool" else str)
                }
            )
        except TypeError:
            return None

    @property
    def loopback(self) -> bool:
        """The client connected from a loopback address (``::ffff:127.0.0.1`` included)."""
        return self.connected_from(parse_local_addresses(LOCAL_ADDRESSES))

    def connected_from(self, networks: LocalNetworks) -> bool:
        """The client connected from an address in one of ``networks`` (an IPv4-mapped IPv6
        address, ``::ffff:127.0.0.1``, as its IPv4 address)."""
        try:
            address = ipaddress.ip_address(self.host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in networks)

    def __str__(self) -> str:
        who = self.user or "(no user)"
        return f"{who}@{self.host or '?'}" + (f" via {self.router}" if self.router else "")


@runtime_checkable
class Management(Protocol):
    """What ``context.lookup("sys$mgmt", Management)`` returns: management requests to this
    router or any router it can route to, for front ends inside a router (a web view)."""

    async def request(
        self, router: str, request: Mapping[str, Any], identity: Identity, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Serve ``request`` (``{"verb": …, …}``, the ``version`` may be left out) on router
        ``router`` as ``identity`` and return the reply (``{"status", "router", "result" |
        "error"}``); on this router it is served at once, on another it travels as a message
        to ``sys$mgmt@router`` and back. A remote router that does not answer in ``timeout``
        seconds gives status 503. Authorization is as for any request."""

    def manages(self, group: str) -> bool:
        """Whether users of ``group`` (of sys$authentication) may manage this router: it is
        one of sys$mgmt's groups, whatever its role."""

    def role(self, identity: Identity) -> Role | None:
        """The role ``identity`` has on this router (None: it may not manage it), by the rules
        every request is authorized with: so a front end offers only what will be allowed."""


class RequestFailed(Exception):
    """A request failed: the router's status and reason, or no answer (status 503)."""

    def __init__(self, status: int, reason: str, router: str = ""):
        super().__init__(f"{router}: {reason}" if router else reason)
        self.status = status
        self.reason = reason
        self.router = router


#: Sends one management request: ``await call(router, verb, **args)`` is the reply's result.
Call = Callable[..., Awaitable[Any]]


@attrs.frozen
class Link:
    """A link as its dialing router (the connector's side) reports it."""

    source: str  # the router whose connector dials
    target: str  # the router it reaches (its name once known, else host:port)
    connector: str
    state: str
    since: str
    error: str = ""
    listener_state: str = ""  # the listening side's view; "" if it has no such link
    rate: float = 0.0  # messages/s over it, both ways, as the dialing router measured them


@attrs.frozen
class NetworkMap:
    """What :func:`crawl` found: each router's hop count from the start router (None:
    known, no active route), links, and the routers that did not answer."""

    start: str
    routers: dict[str, int | None]
    links: tuple[Link, ...]
    unreachable: dict[str, str]

    def data(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "routers": self.routers,
            "links": [attrs.asdict(link) for link in self.links],
            "unreachable": self.unreachable,
        }


async def _routing_view(call: Call, router: str) -> dict[str, Any]:
    """A router's routing usage: its connectors, its live links, and the links its neighbours
    dialed that went down (``lost-links``; none from a router of an older release)."""
    usage = await call(router, "get", path="/sys$routing/usage/connectors")
    live = await call(router, "get", path="/sys$routing/usage/connections")
    try:
        lost = (await call(router, "get", path="/sys$routing/usage/lost-links"))["entries"]
    except RequestFailed as exc:
        if exc.status != 400:  # (400: no such list there)
            raise
        lost = {}
    return {"connectors": usage["entries"], "connections": live["entries"], "lost": lost}


def link_rate(link: Mapping[str, Any]) -> float:
    """Messages/s both ways over a live link (its usage entry; 0 without the figures)."""
    rates = (link.get("messages-out-rate"), link.get("messages-in-rate"))
    return float(sum(rate for rate in rates if isinstance(rate, int | float)))


def _named(view: Mapping[str, Any]) -> set[str]:
    """The routers a view names: live links' peers, connectors' targets, lost links' dialers."""
    names = {entry["routername"] for entry in view["connections"].values()}
    names |= {c.get("routername") or c.get("last-routername") or "" for c in view["connectors"].values()}
    return (names | set(view["lost"])) - {""}


async def crawl(call: Call, start: str, *, concurrency: int = 1000) -> NetworkMap:
    """The network as seen from router ``start``: every router it knows and every link each of
    them reports, asked of up to ``concurrency`` routers at once; a router that does not
    answer is listed with the reason.

    Args:
        call: sends one request (``call(router, verb, **args)``) and returns its result;
            raises :class:`RequestFailed` for any other status or no answer (it bounds the wait).

    Raises:
        RequestFailed: ``start`` did not list its routers.
    """
    known = {row["name"]: row["hops"] for row in await call(start, "routers")}
    limit = trio.CapacityLimiter(concurrency)
    views: dict[str, dict[str, Any]] = {}
    unreachable: dict[str, str] = {}
    pending = set(known)

    async def ask(router: str) -> None:
        try:
            async with limit:
                views[router] = await _routing_view(call, router)
        except RequestFailed as exc:
            unreachable[router] = exc.reason

    # Routers that links name but the table does not have are asked too: one reached only the
    # long way, or one that is down (it does not answer, and is listed so, with its links).
    while pending:
        async with trio.open_nursery() as nursery:
            for router in sorted(pending):
                nursery.start_soon(ask, router)
        seen = set().union(*(_named(view) for view in views.values()))
        pending = {r for r in seen if r not in known}
        known.update({r: None for r in pending})
    links = []
    for router, view in sorted(views.items()):
        live = view["connections"]
        for name, connector in sorted(view["connectors"].items()):
            link = live.get(f"connector:{name}", {})
            target = (
                connector["routername"]
                or link.get("routername")
                or connector.get("last-routername")
                or f"{connector['hostname']}:{connector['port']}"
            )
            # when the state began (routers of an older release: the connect or the error time)
            since = connector.get("since") or link.get("connecttime") or connector.get("last-error-time") or ""
            other = views.get(target, {}).get("connections", {})
            listener_state = next(
                (
                    entry["state"]
                    for entry_name, entry in other.items()
                    if entry_name.startswith("listener:") and entry["routername"] == router
                ),
                "",
            )
            links.append(
                Link(
                    source=router,
                    target=target,
                    connector=name,
                    state=connector["state"],
                    since=since,
                    error=connector.get("last-error", ""),
                    listener_state=listener_state,
                    rate=link_rate(link),
                )
            )
        for dialer, entry in sorted(view["lost"].items()):
            if dialer not in views:  # it cannot report its connector: its listener side tells
                links.append(
                    Link(
                        source=dialer,
                        target=router,
                        connector="",
                        state=entry["state"],
                        since=entry["since"],
                        error=entry.get("last-error", ""),
                        listener_state=entry["state"],
                    )
                )
    return NetworkMap(start=start, routers=dict(sorted(known.items())), links=tuple(links), unreachable=unreachable)
