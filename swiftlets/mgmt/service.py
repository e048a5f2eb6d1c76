"""The running ``sys$mgmt``: serves management requests from the queue ``sys$mgmt``.

Theory of operation
-------------------
The swiftlet consumes its queue with a credit of :data:`CONCURRENCY`: each request is
accepted when taken (a request is not redone after a crash: its sender times out) and served
in a task of the swiftlet's nursery, which gives the credit back when it is done, so at most
that many requests run at once and a slow operation does not hold up the others.

Serving (:meth:`MgmtSwiftlet.serve`, the same for a request from the queue and for one from
a front end inside the router through :class:`~.api.Management`): check the format's
version, authorize (:func:`.requests.authorize`), run the verb against the router's
management tree (:mod:`.tree` on :mod:`kernel.mgmt`, whose vetoes and validation errors come
back as status 400 with their reason), and log every change with the user and the old and new value. The reply is a
non-persistent message to the request's reply-to, which may be a temporary queue on another
router: the queue manager's redirection sends it there like any message. Only to a reply-to
that the router where the request entered found the requester may send to, and that exists
(:attr:`.api.Identity.reply_to`): a reply never creates a queue, and never lets a client
put messages where it could not itself; a request with any other reply-to is served without
a reply and counted (``replies-refused``).

Watches (:mod:`.watches`): a ``watch`` request sends the changes under a path to its
reply-to until it is unwatched, its lease runs out, its reply-to is gone or it falls too far
behind; so nothing outlives a watcher that went away.

Requests of front ends inside the router to other routers (:mod:`.remote`) go out as
messages to their ``sys$mgmt`` and wait for the reply on a temporary queue of this router.

Available routers are this one and the routing table's destinations, followed through
``DestinationAdded``/``DestinationRemoved`` (:mod:`swiftlets.routing.api`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from martinet.kernel import (
    Event,
    ManagementError,
    Overflow,
)
from martinet.kernel.router import SwiftletContext
from martinet.messaging.message import Message, MessageError, build
from martinet.swiftlets.authentication.api import Authentication
from martinet.swiftlets.queuemanager.api import MessageTooLarge, QueueError, QueueManager
from martinet.swiftlets.routing.api import DestinationAdded, DestinationRemoved, Routing

from .api import (
    AUDIT_LOGGER,
    LOCAL_ADDRESSES,
    MANAGEMENT_QUEUE,
    READ_VERBS,
    STATUS_PROPERTY,
    VERSION,
    WRITE_VERBS,
    Identity,
    Role,
    Status,
)
from .config import MgmtConfig
from .remote import RemoteRequests
from .requests import (
    Refused,
    authorize,
    confirm,
    decode_request,
    plain,
)
from .tree import TreeVerbs
from .watches import Watches

log = logging.getLogger(__name__)
audit = logging.getLogger(AUDIT_LOGGER)


CONCURRENCY = 16  # requests served at once
STOP_DELAY = 1.0  # seconds between the reply to halt/reboot and the stop (the reply leaves first)


class MgmtSwiftlet:
    """``sys$mgmt`` (implements :class:`.api.Management`)."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.router = context.router_name
        self._queue_manager: QueueManager | None = None
        self._routing: Routing | None = None
        self._routers: set[str] = set()
        self._remote = RemoteRequests(self.router, self._answer)
        self.served = self.refused = self.failed = self.replies_refused = 0
        self.watches = Watches(context, self._send, self._answer)
        self._tree = TreeVerbs(context.management)
        self._verbs: dict[str, Callable[..., Awaitable[Any]]] = {
            "get": self._tree.get,
            "describe": self._tree.describe,
            "routers": self._available,
            "set": self._tree.set,
            "add": self._tree.add,
            "remove": self._tree.remove,
            "invoke": self._tree.invoke,
            "save": self._save,
            "reboot": self._reboot,
            "halt": self._halt,
            "watch": self.watches.watch,
            "unwatch": self.watches.unwatch,
        }
        context.usage.provide(
            lambda: {
                "requests-served": self.served,
                "requests-refused": self.refused,
                "requests-failed": self.failed,
                "replies-refused": self.replies_refused,
                "watches": len(self.watches),
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
                self.watches.nursery = nursery
                await nursery.start(self._remote.run, manager)
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
                audit.info("management request from %s refused: %s", identity, refused)
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
            audit.info("management %s from %s refused: %s", verb, identity, refused)
            return self._answer(refused.status, error=str(refused))
        except ManagementError as exc:
            self.refused += 1
            audit.info("management %s from %s refused: %s", verb, identity, exc)
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

    async def _save(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        try:
            saved = self.context.save()
        except (ValueError, OSError) as exc:
            raise Refused(Status.BAD_REQUEST, f"save failed: {exc}") from None
        audit.info("management: %s saved the config to %s", identity, saved)
        return {"file": str(saved)}

    async def _reboot(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        try:
            self.context.request_reboot(f"reboot requested by {identity} over management", delay=STOP_DELAY)
        except ValueError as exc:
            raise Refused(Status.BAD_REQUEST, f"cannot reboot: {exc}") from None
        audit.info("management: %s rebooted router %s", identity, self.router)
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
        audit.info("management: %s halted router %s", identity, self.router)
        return {"halting": self.router, "in-seconds": STOP_DELAY}

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
        return await self._remote.request(router, request, identity, timeout)
