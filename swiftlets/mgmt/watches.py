"""Watches of ``sys$mgmt``: a ``watch`` request starts a task with its own bus subscription
that sends each :class:`~kernel.bus.PropertyChanged`, ``EntityAdded`` or ``EntityRemoved``
under the watched path to the watch's reply-to, with the watch request's correlation-id. A
watch ends when unwatched, when its lease (``watch-lease``) runs out without a renewal (a
``watch`` request naming it), when its reply-to no longer exists here, or when it falls
``max-watch-backlog`` changes behind; the last two end with a final notice. At most
``max-watches`` run at once, and ``max-watches-per-user`` for one user from one place. So
nothing outlives a watcher that went away."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio

from martinet.kernel import EntityAdded, EntityRemoved, Event, Overflow, PropertyChanged, SubscriberOverflow
from martinet.kernel.router import SwiftletContext
from martinet.swiftlets.queuemanager.api import QueueError, QueueNotFound

from .api import AUDIT_LOGGER, Identity, Status
from .config import MgmtConfig
from .requests import Refused, plain, request_path

__all__ = ["Watch", "Watches"]

audit = logging.getLogger(AUDIT_LOGGER)


class Watch:
    """One watch: what it watches, where its notices go, whose it is, until when."""

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


class Watches:
    """The running watches of one router's ``sys$mgmt``: ``watch`` and ``unwatch`` serve the
    verbs; ``send(address, reply, correlation)`` sends a notice, ``answer(status, result=…)``
    makes one (the swiftlet's own replies). ``nursery``: where the watches run, set while the
    swiftlet runs."""

    def __init__(
        self,
        context: SwiftletContext,
        send: Callable[[str, dict[str, Any], Any], None],
        answer: Callable[..., dict[str, Any]],
    ):
        self.context = context
        self.nursery: trio.Nursery | None = None
        self._send = send
        self._answer = answer
        self._watches: dict[int, Watch] = {}
        self._numbers = itertools.count(1)
        self._usage = context.usage.add_list("watches")

    def __len__(self) -> int:
        return len(self._watches)

    async def watch(
        self, request: Mapping[str, Any], identity: Identity, reply_to: str | None, correlation: Any
    ) -> Any:
        config: MgmtConfig = self.context.config
        number = request.get("watch")
        if number is not None:  # a renewal
            watch = self._own(number, identity)
            watch.expires = trio.current_time() + config.watch_lease
            return {"watch": watch.id, "path": watch.path, "lease": config.watch_lease}
        path = request_path(request)
        self.context.management.resolve(path)  # it must exist now
        if not reply_to:
            raise Refused(Status.BAD_REQUEST, "a watch needs a reply-to for its notifications")
        if len(self._watches) >= config.max_watches:
            raise Refused(
                Status.UNAVAILABLE,
                f"router {self.context.router_name} serves max-watches {config.max_watches} watches already",
            )
        who = _watcher(identity)
        if sum(_watcher(watch.identity) == who for watch in self._watches.values()) >= config.max_watches_per_user:
            raise Refused(
                Status.UNAVAILABLE,
                f"{identity} has max-watches-per-user {config.max_watches_per_user} watches on router "
                f"{self.context.router_name} already",
            )
        watch = Watch(next(self._numbers), path, reply_to, correlation, identity, config.watch_lease)
        self._watches[watch.id] = watch
        self._usage.add(
            str(watch.id), lambda: {"path": watch.path, "reply-to": watch.reply_to, "user": str(watch.identity)}
        )
        assert self.nursery is not None  # watches are served while the swiftlet runs
        subscription = self.context.bus.subscribe(Event, max_buffer=config.max_watch_backlog, overflow=Overflow.FAIL)
        self.nursery.start_soon(self._run, watch, subscription)
        audit.info("management: %s watches %s (watch %d)", identity, watch.path, watch.id)
        return {"watch": watch.id, "path": watch.path, "lease": config.watch_lease}

    def _own(self, number: Any, identity: Identity) -> Watch:
        """Watch ``number``, if ``identity`` started it (nobody renews or ends another's):
        the same user from the same place, and the same reply-to, which its connection alone
        reads (all of a host's anonymous clients are one user without authentication).

        Raises:
            Refused: no such watch (it ended), or another's.
        """
        watch = self._watches.get(number) if isinstance(number, int) and not isinstance(number, bool) else None
        if watch is None:
            raise Refused(Status.BAD_REQUEST, f"no watch {number!r} on router {self.context.router_name} (it ended)")
        if watch.identity != identity:
            raise Refused(Status.FORBIDDEN, f"watch {number} is {watch.identity}'s")
        return watch

    async def unwatch(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        watch = self._own(request.get("watch"), identity)
        watch.scope.cancel()
        return {"watch": watch.id, "ended": True}

    async def _run(self, watch: Watch, subscription: Any) -> None:
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
            self._usage.remove(str(watch.id))
            audit.info(
                "management: watch %d of %s on %s ended: %s",
                watch.id,
                watch.identity,
                watch.path,
                ending or "unwatched",
            )

    def _notice(self, watch: Watch, **fields: Any) -> dict[str, Any]:
        return self._answer(Status.OK, result={"watch": watch.id, **fields})
