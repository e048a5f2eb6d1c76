"""The running ``sys$mgmt``: serves management requests from the queue ``sys$mgmt``.

Theory of operation
-------------------
The swiftlet consumes its queue with a credit of :data:`CONCURRENCY`: each request is
accepted when taken (a request is not redone after a crash: its sender times out) and served
in a task of the swiftlet's nursery, which gives the credit back when it is done, so at most
that many requests run at once and a slow operation does not hold up the others.

Serving (:meth:`MgmtSwiftlet.serve`, the same for a request from the queue and for one from
a front end inside the router through :class:`~.api.Management`): check the format's
version, authorize (:func:`authorize`), run the verb against the router's management tree
(:mod:`kernel.mgmt`, whose vetoes and validation errors come back as status 400 with their
reason), and log every change with the user and the old and new value. The reply is a
non-persistent message to the request's reply-to, which may be a temporary queue on another
router: the queue manager's redirection sends it there like any message. Only to a reply-to
that the router where the request entered found the requester may send to, and that exists
(:attr:`.api.Identity.reply_to`): a reply never creates a queue, and never lets a client
put messages where it could not itself; a request with any other reply-to is served without
a reply and counted (``replies-refused``).

Watches. A ``watch`` request starts a task with its own bus subscription that sends each
:class:`~kernel.bus.PropertyChanged`, ``EntityAdded`` or ``EntityRemoved`` under the watched
path to the watch's reply-to, with the watch request's correlation-id. A watch ends when
unwatched, when its lease (``watch-lease``) runs out without a renewal (a ``watch`` request
naming it), when its reply-to no longer exists here, or when it falls
``max-watch-backlog`` changes behind; the last two end with a final notice. At most
``max-watches`` run at once. So nothing outlives a watcher that went away.

Available routers are this one and the routing table's destinations, followed through
``DestinationAdded``/``DestinationRemoved`` (:mod:`swiftlets.routing.api`).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import Any

import attrs
import trio

from martinet.kernel import (
    EntityAdded,
    EntityRemoved,
    Event,
    ManagementError,
    Overflow,
    PropertyChanged,
    SubscriberOverflow,
)
from martinet.kernel.mgmt import Entity, EntityList, Node, Usage, UsageList
from martinet.kernel.router import SwiftletContext
from martinet.kernel.schema import Prop, fields_of, xml_name
from martinet.messaging.message import Message, MessageError, build
from martinet.swiftlets.authentication.api import Authentication
from martinet.swiftlets.queuemanager.api import ROUTER, MessageTooLarge, QueueError, QueueManager, QueueNotFound
from martinet.swiftlets.routing.api import DestinationAdded, DestinationRemoved, Routing

from .api import (
    IDENTITY_ANNOTATION,
    LOCAL_ADDRESSES,
    MANAGEMENT_QUEUE,
    READ_VERBS,
    STATUS_PROPERTY,
    VERSION,
    WRITE_VERBS,
    Identity,
    LocalNetworks,
    Role,
    Status,
    parse_local_addresses,
)
from .config import MgmtConfig

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=16)
def _local_networks(text: str) -> LocalNetworks:
    """``local-addresses`` parsed once per value (it was checked when set)."""
    return parse_local_addresses(text)


CONCURRENCY = 16  # requests served at once
STOP_DELAY = 1.0  # seconds between the reply to halt/reboot and the stop (the reply leaves first)


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


def _kind(node: Node) -> str:
    return {Entity: "entity", EntityList: "entity-list", Usage: "usage", UsageList: "usage-list"}[type(node)]


def describe_node(node: Node) -> dict[str, Any]:
    """``get``'s result: the node's kind and path, and its properties, children and
    operations (an entity or usage entity) or its entries with their properties (a list)."""
    result: dict[str, Any] = {"kind": _kind(node), "path": node.path}
    if isinstance(node, (Entity, Usage)):
        result["properties"] = plain(node.properties())
        result["children"] = {name: _kind(child) for name, child in node.children.items()}
        if isinstance(node, Usage):
            result["operations"] = sorted(node.operations)
    else:
        entries = node.entities if isinstance(node, EntityList) else node.children
        result["entries"] = {name: plain(entry.properties()) for name, entry in entries.items()}
    return result


def declarations(config_type: type) -> dict[str, Any]:
    """The properties a config class declares, as data: description, type, default, bounds,
    choices and flags, by XML name."""
    found = {}
    for field, meta in fields_of(config_type):
        if not isinstance(meta, Prop):  # a child entity or list
            continue
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
        entry: dict[str, Any] = {
            "description": meta.description,
            "type": kind,
            "read-only": meta.read_only,
            "reboot-required": meta.reboot_required,
        }
        # attrs' stubs declare Factory a function (it is a class), hence the ignore
        if field.default is not attrs.NOTHING and not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            entry["default"] = plain(field.default) if not meta.secret else "***"
        for bound in ("min", "max", "choices"):
            if getattr(meta, bound) is not None:
                entry[bound] = plain(getattr(meta, bound))
        found[xml_name(field.name)] = entry
    return found


def explain(node: Node) -> dict[str, Any]:
    """``describe``'s result: the property declarations of an entity (of an entity list's
    items, for ``add``) or the operations of a usage entity."""
    result: dict[str, Any] = {"kind": _kind(node), "path": node.path}
    if isinstance(node, Entity):
        result["properties"] = declarations(node.config_type)
    elif isinstance(node, EntityList):
        result["item"] = declarations(node.meta.item_type)
        result["description"] = node.meta.description
    elif isinstance(node, Usage):
        result["operations"] = [op.describe() for op in node.operations.values()]
    return result


def _path(request: Mapping[str, Any]) -> str:
    path = request.get("path", "/")
    if not isinstance(path, str):
        raise Refused(Status.BAD_REQUEST, "argument 'path' must be text")
    return path or "/"


def _text(request: Mapping[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str) or not value:
        raise Refused(Status.BAD_REQUEST, f"argument {name!r} missing or not text")
    return value


def _mapping(request: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = request.get(name, {})
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise Refused(Status.BAD_REQUEST, f"argument {name!r} must be an object")
    return dict(value)


def _scalar(value: Any, what: str) -> Any:
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


class _Watch:
    def __init__(self, number: int, path: str, reply_to: str, correlation: Any, identity: Identity, lease: float):
        self.id = number
        self.path = path.rstrip("/") or "/"
        self.reply_to = reply_to
        self.correlation = correlation
        self.identity = identity
        self.expires = trio.current_time() + lease
        self.scope = trio.CancelScope()

    def covers(self, path: str) -> bool:
        return self.path == "/" or path == self.path or path.startswith(self.path + "/")


def _watcher(identity: Identity) -> tuple[str, str, str]:
    """Whom a watch counts against for ``max-watches-per-user``: user, address and router
    (whatever reply-to they use)."""
    return identity.user, identity.host, identity.router


def _event(event: Event) -> dict[str, Any]:
    if isinstance(event, PropertyChanged):
        return {
            "type": "property-changed",
            "path": event.path,
            "name": event.name,
            "old": plain(event.old),
            "new": plain(event.new),
        }
    kind = "entity-added" if isinstance(event, EntityAdded) else "entity-removed"
    return {"type": kind, "path": event.path, "name": event.name}  # type: ignore[attr-defined]


class MgmtSwiftlet:
    """``sys$mgmt`` (implements :class:`.api.Management`)."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.router = context.router_name
        self._nursery: trio.Nursery | None = None
        self._queue_manager: QueueManager | None = None
        self._routing: Routing | None = None
        self._routers: set[str] = set()
        self._watches: dict[int, _Watch] = {}
        self._numbers = itertools.count(1)
        self._pending: dict[Any, trio.MemorySendChannel] = {}  # remote requests of request() awaiting replies
        self._reply_queue: Any = None
        self.served = self.refused = self.failed = self.replies_refused = 0
        self._verbs: dict[str, Callable[..., Awaitable[Any]]] = {
            "get": self._get,
            "describe": self._describe,
            "routers": self._available,
            "set": self._set,
            "add": self._add,
            "remove": self._remove,
            "invoke": self._invoke,
            "save": self._save,
            "reboot": self._reboot,
            "halt": self._halt,
            "watch": self._watch,
            "unwatch": self._unwatch,
        }
        watches = context.usage.add_list("watches")
        self._watch_usage = watches
        context.usage.provide(
            lambda: {
                "requests-served": self.served,
                "requests-refused": self.refused,
                "requests-failed": self.failed,
                "replies-refused": self.replies_refused,
                "watches": len(self._watches),
            }
        )

    @property
    def config(self) -> MgmtConfig:
        return self.context.config

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        manager = self._queue_manager = self.context.lookup("sys$queuemanager", QueueManager)
        try:
            self._routing = self.context.lookup("sys$routing", Routing)
        except LookupError:
            self._routing = None  # a lone router: only itself to manage
        consumer = manager.queue(MANAGEMENT_QUEUE, create=True).consumer(owner=self)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # from the router's reserve: replies must come back when clients used their room
                self._reply_queue = manager.create_temporary_queue(self, ROUTER)
                nursery.start_soon(self._take_replies, self._reply_queue)
                if self._routing is not None:
                    await nursery.start(self._follow_destinations)
                consumer.set_credit(CONCURRENCY)
                if self._authentication():
                    log.info("management requests served on %s", MANAGEMENT_QUEUE)
                else:  # the packaged default: convenient on one machine, and worth saying
                    local = self.config.local_addresses
                    log.warning(
                        "management requests served on %s without authentication: any client connected from %s "
                        "may manage this router, halt included (turn sys$authentication's "
                        "authentication-enabled on, or take sys$mgmt out of startorder)",
                        MANAGEMENT_QUEUE,
                        "a loopback address" if local == LOCAL_ADDRESSES else f"local-addresses {local!r}",
                    )
                task_status.started()
                while True:
                    entry = await consumer.receive()
                    consumer.accept(entry)
                    nursery.start_soon(self._serve_message, entry.message, consumer)
        finally:
            consumer.close()
            manager.delete_temporary_queues(self)

    # -- the queue ---------------------------------------------------------------------------------

    async def _serve_message(self, message: Message, consumer: Any) -> None:
        try:
            try:
                properties = message.properties
                reply_to, correlation = properties.reply_to, properties.correlation_id
                if correlation is None:
                    correlation = properties.message_id
                identity = Identity.from_annotations(message.message_annotations)
                body = message.body()
            except MessageError as exc:
                log.warning("management request dropped: malformed message: %s", exc)
                return
            try:
                request = decode_request(body)
            except Refused as refused:
                self.refused += 1
                reply = self._answer(refused.status, error=str(refused))
                log.info("management request from %s refused: %s", identity, refused)
            else:
                approved = reply_to if identity is not None and reply_to == identity.reply_to else None
                reply = await self.serve(request, identity, reply_to=approved or None, correlation=correlation)
            if reply_to and (identity is None or reply_to != identity.reply_to):
                # A reply-to the requester may not send to, or one that does not exist: no
                # reply, so that a reply can neither inject messages nor create a queue.
                self.replies_refused += 1
                if self.replies_refused == 1 or self.replies_refused % 1000 == 0:
                    log.info(
                        "management reply to %r (%s) not sent: the requester may not send there, or it does not "
                        "exist (%d such replies so far)",
                        reply_to,
                        identity,
                        self.replies_refused,
                    )
            elif isinstance(reply_to, str) and reply_to:
                try:
                    try:
                        self._send(reply_to, reply, correlation)
                    except MessageTooLarge as exc:  # say so, in a reply that fits
                        self._send(
                            reply_to, self._answer(Status.ERROR, error=f"the reply is too large: {exc}"), correlation
                        )
                except QueueError as exc:  # e.g. no route (now) to the router of the reply-to
                    log.info("management reply to %s (%s) not sent: %s", reply_to, identity, exc)
            else:
                log.info("management request from %s had no reply-to; served without a reply", identity)
        finally:
            consumer.flow(1)

    def _send(self, address: str, reply: dict[str, Any], correlation: Any) -> None:
        """Send ``reply`` to ``address`` (non-persistent), only if its queue (or the routing
        queue towards its router) exists: a reply never creates a queue.

        Raises:
            QueueError: it cannot go there (a reply-to gone, no route to its router).
        """
        assert self._queue_manager is not None
        self._queue_manager.queue(address, create=False)
        message = build(
            json.dumps(reply),
            correlation_id=correlation,
            content_type="application/json",
            properties={STATUS_PROPERTY: reply["status"]},
        )
        self._queue_manager.send_nowait(address, message)

    def _answer(self, status: Status, *, result: Any = None, error: str | None = None) -> dict[str, Any]:
        reply: dict[str, Any] = {"version": VERSION, "router": self.router, "status": int(status)}
        if error is None:
            reply["result"] = result
        else:
            reply["error"] = error
        return reply

    # -- serving -----------------------------------------------------------------------------------

    async def serve(
        self,
        request: Mapping[str, Any],
        identity: Identity | None,
        *,
        reply_to: str | None = None,
        correlation: Any = None,
    ) -> dict[str, Any]:
        """Authorize and run one request on this router; the reply (never raises)."""
        verb = request.get("verb")
        try:
            version = request.get("version", VERSION)
            if version != VERSION:
                raise Refused(
                    Status.BAD_REQUEST,
                    f"format version {version!r} is not served here; this router speaks version {VERSION}",
                )
            if not isinstance(verb, str) or (handler := self._verbs.get(verb)) is None:
                known = ", ".join(sorted(READ_VERBS | WRITE_VERBS))
                raise Refused(Status.BAD_REQUEST, f"unknown verb {verb!r}; verbs: {known}")
            self._authorize(identity, verb)
            assert identity is not None
            result = await handler(request, identity, reply_to, correlation)
        except Refused as refused:
            self.refused += 1
            log.info("management %s from %s refused: %s", verb, identity, refused)
            return self._answer(refused.status, error=str(refused))
        except ManagementError as exc:
            self.refused += 1
            log.info("management %s from %s refused: %s", verb, identity, exc)
            return self._answer(Status.BAD_REQUEST, error=str(exc))
        except Exception as exc:
            self.failed += 1
            log.exception("management %s from %s failed", verb, identity)
            return self._answer(Status.ERROR, error=f"{type(exc).__name__}: {exc}")
        self.served += 1
        return self._answer(Status.OK, result=plain(result))

    def _authorize(self, identity: Identity | None, verb: str) -> Role:
        return authorize(
            identity,
            verb,
            router=self.router,
            authentication=self._authentication(),
            groups={name: group.role for name, group in self.config.groups.items()},
            local_addresses=self.config.local_addresses,
        )

    def _authentication(self) -> bool:
        try:
            return self.context.lookup("sys$authentication", Authentication).enabled
        except LookupError:
            return False

    async def _get(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        return describe_node(self.context.management.resolve(_path(request)))

    async def _describe(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        return explain(self.context.management.resolve(_path(request)))

    async def _available(self, *_: Any) -> Any:
        rows = [{"name": self.router, "local": True, "active": True, "hops": 0, "next-hop": ""}]
        for name in sorted(self._routers):
            row = self._routing.destination(name) if self._routing is not None else None
            rows.append(
                {
                    "name": name,
                    "local": False,
                    "active": bool(row and row.active),
                    "hops": len(row.routes[0]) if row and row.routes else None,
                    "next-hop": (row.next_hop or "") if row else "",
                }
            )
        return rows

    async def _set(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, name = _text(request, "path"), _text(request, "name")
        value = _scalar(request.get("value"), "argument 'value'")
        entity = self.context.management.entity(path)
        old = entity.get(name)
        change = entity.set(name, value)
        new = entity.get(name)
        log.info(
            "management: %s set %s %s: %r -> %r%s",
            identity,
            path,
            name,
            old,
            new,
            " (takes effect at the next start)" if change.reboot_required else "",
        )
        return {"path": path, "name": name, "old": old, "new": new, "reboot-required": change.reboot_required}

    async def _add(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, name = _text(request, "path"), _text(request, "name")
        values = {key: _scalar(value, f"value of {key!r}") for key, value in _mapping(request, "values").items()}
        entity = self.context.management.add(path, name, values)
        log.info("management: %s added %s/%s: %s", identity, path.rstrip("/"), name, plain(entity.properties()))
        return describe_node(entity)

    async def _remove(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, name = _text(request, "path"), _text(request, "name")
        tree = self.context.management
        entries = tree.entity_list(path)
        old = entries.entities.get(name)
        lost = entries.destroys(name)
        confirm(request, f"removing {path.rstrip('/')}/{name} drops the {lost} message(s) it holds", lost)
        tree.remove(path, name)
        log.info(
            "management: %s removed %s/%s (was %s)",
            identity,
            path.rstrip("/"),
            name,
            plain(old.properties()) if old is not None else {},
        )
        return {"path": path, "name": name}

    async def _invoke(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, operation = _text(request, "path"), _text(request, "operation")
        args = {key: _scalar(value, f"argument {key!r}") for key, value in _mapping(request, "args").items()}
        offered = self.context.management.operations(path).get(operation)
        if offered is not None and offered.destroys is not None:
            lost = offered.destroys()
            confirm(request, f"{operation} of {path} drops {lost} message(s)", lost)
        result = await self.context.management.invoke(path, operation, **args)
        log.info("management: %s invoked %s %s %s: %s", identity, path, operation, args, str(result)[:200])
        return result

    async def _save(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        try:
            saved = self.context.save()
        except (ValueError, OSError) as exc:
            raise Refused(Status.BAD_REQUEST, f"save failed: {exc}") from None
        log.info("management: %s saved the config to %s", identity, saved)
        return {"file": str(saved)}

    async def _reboot(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        try:
            self.context.request_reboot(f"reboot requested by {identity} over management", delay=STOP_DELAY)
        except ValueError as exc:
            raise Refused(Status.BAD_REQUEST, f"cannot reboot: {exc}") from None
        log.info("management: %s rebooted router %s", identity, self.router)
        return {"rebooting": self.router, "in-seconds": STOP_DELAY}

    async def _halt(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        assert self._queue_manager is not None  # looked up at start
        lost = sum(queue.volatile for queue in self._queue_manager.queues.values())
        confirm(
            request,
            f"halt stops router {self.router} (its clients and links are cut; {lost} non-persistent "
            "message(s) in its queues are lost, persistent ones wait in its store)",
            lost,
            always=True,
        )
        self.context.request_stop(f"halt requested by {identity} over management", delay=STOP_DELAY)
        log.info("management: %s halted router %s", identity, self.router)
        return {"halting": self.router, "in-seconds": STOP_DELAY}

    # -- watches -----------------------------------------------------------------------------------

    async def _watch(
        self, request: Mapping[str, Any], identity: Identity, reply_to: str | None, correlation: Any
    ) -> Any:
        config = self.config
        number = request.get("watch")
        if number is not None:  # a renewal
            watch = self._own_watch(number, identity)
            watch.expires = trio.current_time() + config.watch_lease
            return {"watch": watch.id, "path": watch.path, "lease": config.watch_lease}
        path = _path(request)
        self.context.management.resolve(path)  # it must exist now
        if not reply_to:
            raise Refused(Status.BAD_REQUEST, "a watch needs a reply-to for its notifications")
        if len(self._watches) >= config.max_watches:
            raise Refused(
                Status.UNAVAILABLE, f"router {self.router} serves max-watches {config.max_watches} watches already"
            )
        who = _watcher(identity)
        if sum(_watcher(watch.identity) == who for watch in self._watches.values()) >= config.max_watches_per_user:
            raise Refused(
                Status.UNAVAILABLE,
                f"{identity} has max-watches-per-user {config.max_watches_per_user} watches on router "
                f"{self.router} already",
            )
        watch = _Watch(next(self._numbers), path, reply_to, correlation, identity, config.watch_lease)
        self._watches[watch.id] = watch
        self._watch_usage.add(
            str(watch.id), lambda: {"path": watch.path, "reply-to": watch.reply_to, "user": str(watch.identity)}
        )
        assert self._nursery is not None
        subscription = self.context.bus.subscribe(Event, max_buffer=config.max_watch_backlog, overflow=Overflow.FAIL)
        self._nursery.start_soon(self._run_watch, watch, subscription)
        log.info("management: %s watches %s (watch %d)", identity, watch.path, watch.id)
        return {"watch": watch.id, "path": watch.path, "lease": config.watch_lease}

    def _own_watch(self, number: Any, identity: Identity) -> _Watch:
        """Watch ``number``, if ``identity`` started it (nobody renews or ends another's):
        the same user from the same place, and the same reply-to, which its connection alone
        reads (all of a host's anonymous clients are one user without authentication).

        Raises:
            Refused: no such watch (it ended), or another's.
        """
        watch = self._watches.get(number) if isinstance(number, int) and not isinstance(number, bool) else None
        if watch is None:
            raise Refused(Status.BAD_REQUEST, f"no watch {number!r} on router {self.router} (it ended)")
        if watch.identity != identity:
            raise Refused(Status.FORBIDDEN, f"watch {number} is {watch.identity}'s")
        return watch

    async def _unwatch(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        watch = self._own_watch(request.get("watch"), identity)
        watch.scope.cancel()
        return {"watch": watch.id, "ended": True}

    async def _run_watch(self, watch: _Watch, subscription: Any) -> None:
        ending = None
        try:
            with watch.scope, subscription:
                while True:
                    with trio.move_on_at(watch.expires):
                        event = await subscription.receive()
                        if isinstance(event, (PropertyChanged, EntityAdded, EntityRemoved)) and watch.covers(
                            event.path
                        ):
                            self._send(watch.reply_to, self._notice(watch, event=_event(event)), watch.correlation)
                        continue
                    if trio.current_time() >= watch.expires:
                        ending = "lease expired"
                        break
        except QueueNotFound:
            ending = "its reply-to is gone"
        except QueueError as exc:
            ending = f"its reply-to refused a notification: {exc}"
        except SubscriberOverflow as exc:
            ending = str(exc)
            try:
                self._send(watch.reply_to, self._notice(watch, ended=ending), watch.correlation)
            except QueueError:
                pass
        finally:
            self._watches.pop(watch.id, None)
            self._watch_usage.remove(str(watch.id))
            log.info(
                "management: watch %d of %s on %s ended: %s",
                watch.id,
                watch.identity,
                watch.path,
                ending or "unwatched",
            )

    def _notice(self, watch: _Watch, **fields: Any) -> dict[str, Any]:
        return self._answer(Status.OK, result={"watch": watch.id, **fields})

    # -- routers -----------------------------------------------------------------------------------

    async def _follow_destinations(self, *, task_status: trio.TaskStatus[None]) -> None:
        assert self._routing is not None
        with self.context.bus.subscribe(Event, max_buffer=10_000, overflow=Overflow.DROP_OLDEST) as events:
            self._routers = {row.name for row in self._routing.destinations()}
            task_status.started()
            async for event in events:
                if isinstance(event, DestinationAdded):
                    self._routers.add(event.router)
                elif isinstance(event, DestinationRemoved):
                    self._routers.discard(event.router)

    # -- Management (front ends inside the router) -------------------------------------------------

    def manages(self, group: str) -> bool:
        return group in self.config.groups

    def role(self, identity: Identity) -> Role | None:
        try:
            return self._authorize(identity, "get")
        except Refused:
            return None

    async def request(
        self, router: str, request: Mapping[str, Any], identity: Identity, timeout: float = 10.0
    ) -> dict[str, Any]:
        """See :meth:`.api.Management.request`."""
        if router == self.router:
            return await self.serve(request, identity)
        assert self._queue_manager is not None
        correlation = f"{self.router}:mgmt:{next(self._numbers)}"
        send, receive = trio.open_memory_channel[dict](1)
        self._pending[correlation] = send
        try:
            reply_to = f"{self._reply_queue.name}@{self.router}"  # this swiftlet's own: it may send there
            message = build(
                json.dumps({"version": VERSION, **request}),
                correlation_id=correlation,
                reply_to=reply_to,
                annotations={IDENTITY_ANNOTATION: attrs.evolve(identity, reply_to=reply_to).annotation()},
            )
            try:
                self._queue_manager.send_nowait(f"{MANAGEMENT_QUEUE}@{router}", message)
            except QueueError as exc:
                return self._answer(Status.UNAVAILABLE, error=f"cannot reach router {router}: {exc}")
            with trio.move_on_after(timeout if math.isfinite(timeout) else math.inf):
                return await receive.receive()
            return self._answer(Status.UNAVAILABLE, error=f"router {router} did not answer in {timeout} s")
        finally:
            del self._pending[correlation]

    async def _take_replies(self, queue: Any) -> None:
        """Hand the replies to :meth:`request`'s remote requests to their waiters."""
        consumer = queue.consumer(owner=self)
        consumer.set_credit(CONCURRENCY)
        try:
            while True:
                entry = await consumer.receive()
                consumer.accept(entry)
                consumer.flow(1)
                try:
                    waiter = self._pending.get(entry.message.properties.correlation_id)
                    reply = decode_request(entry.message.body())
                except (MessageError, Refused) as exc:
                    log.info("management reply dropped: %s", exc)
                    continue
                if waiter is not None:
                    try:
                        waiter.send_nowait(reply)
                    except trio.WouldBlock:  # a second reply to one request
                        pass
        finally:
            consumer.close()
