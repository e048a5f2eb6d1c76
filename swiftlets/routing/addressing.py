"""Addressing with a queue manager: the table changes reach the queue manager synchronously,
before their events are published. A destination ``R`` added gets the queue ``rt$R`` (created
if missing) and the redirection ``%@R`` → ``rt$R``, which adds the routing annotations
(:func:`.rewrite.routing_rewrite`), and a dispatcher (:mod:`.dispatch`). A destination removed
loses the redirection but keeps ``rt$R`` with its messages; an empty ``rt$R`` goes with its
dispatcher once R has been unknown for ``unknown-router-grace``, so that destinations a peer
announced and withdrew leave no queue or task behind. The queue ``unroutable`` is made at
start; ``rt$`` queues recovered from the store are left alone (their router may come back).
The table is mirrored in ``usage/routing-table``. Without a queue manager (a routing-only
router) only the mirror is kept."""

from __future__ import annotations

import logging
from typing import Any

import trio

from martinet.kernel import SwiftletContext, UsageList
from martinet.swiftlets.queuemanager.api import QueueError, QueueManager

from . import api
from .api import UNROUTABLE, redirection_predicate, routing_queue
from .dispatch import RoutedTransfer
from .exchange import RouteExchanger
from .rewrite import routing_rewrite

__all__ = ["Addressing"]

log = logging.getLogger(__name__)

RETIRE_PERIOD = (0.05, 10.0)  # seconds between looks for idle rt$ queues: a quarter of the grace, within these


class Addressing:
    """The routing queues and redirections of one router, and its routing-table usage.
    ``queue_manager``: found by :meth:`start` (None: addressing is off); ``transfer``: the
    dispatchers, set once they exist."""

    def __init__(self, context: SwiftletContext, exchanger: RouteExchanger):
        self.context = context
        self._exchanger = exchanger
        self.queue_manager: QueueManager | None = None
        self.transfer: RoutedTransfer | None = None
        self._redirected: set[str] = set()  # destinations whose redirection is installed
        self._unknown_since: dict[str, float] = {}  # routers no longer known → since when (trio clock)
        self.retired = 0  # idle rt$ queues deleted with their dispatchers
        self._usage_table = context.usage.add_list("routing-table")
        self._usage_routes: dict[str, UsageList] = {}

    def start(self) -> None:
        """Find the queue manager (none: addressing stays off) and make sure ``unroutable``
        exists (SwiftMQ's routing start, step 1). Recovered ``rt$`` queues are kept as they
        are; a redirection comes only with a known destination."""
        try:
            self.queue_manager = self.context.lookup("sys$queuemanager", QueueManager)
        except LookupError:
            log.info(
                "no sys$queuemanager on router %s: routing queues and redirections are off", self.context.router_name
            )
            return
        self.queue_manager.queue(UNROUTABLE, create=True)

    def stop(self) -> None:
        """Take out the redirections installed (their queues stay): without routing, ``q@R`` is
        unknown again."""
        if self.queue_manager is not None:
            for router in sorted(self._redirected):
                self.queue_manager.remove_redirection(redirection_predicate(router))
        self._redirected.clear()

    def address(self, event: Any) -> None:
        """A destination added gets ``rt$R`` and the redirection; one removed loses the
        redirection only (the messages in ``rt$R`` wait for it to come back)."""
        manager = self.queue_manager
        if manager is None:
            return
        if isinstance(event, api.DestinationAdded):
            router = event.router
            try:
                manager.queue(routing_queue(router), create=True)  # (a system queue: not counted in max-queues)
            except QueueError as exc:
                log.error(
                    "router %s: no routing queue %s for destination %s, so it is not addressable: %s",
                    self.context.router_name,
                    routing_queue(router),
                    router,
                    exc,
                )
                return
            manager.add_redirection(
                redirection_predicate(router), routing_queue(router), routing_rewrite(self.context.router_name)
            )
            self._redirected.add(router)
            self._unknown_since.pop(router, None)
            if self.transfer is not None:
                self.transfer.destination_added(router)
        elif isinstance(event, api.DestinationRemoved) and event.router in self._redirected:
            manager.remove_redirection(redirection_predicate(event.router))
            self._redirected.discard(event.router)
            self._unknown_since[event.router] = trio.current_time()

    async def retire_forever(self) -> None:
        """Delete ``rt$R`` with its dispatcher once R has been unknown for
        ``unknown-router-grace`` and the queue is empty (looked at a few times per grace)."""
        while True:
            grace = self.context.config.unknown_router_grace / 1000
            low, high = RETIRE_PERIOD
            await trio.sleep(high if grace < 0 else min(max(grace / 4, low), high))  # (-1: kept for ever)
            if grace >= 0 and self._unknown_since:
                self._retire_idle(trio.current_time() - grace)

    def _retire_idle(self, before: float) -> None:
        """Retire what became unknown before ``before``; one log line for all of them."""
        manager, transfer = self.queue_manager, self.transfer
        assert manager is not None  # (unknown routers are noted only with one)
        retired = 0
        for router, since in list(self._unknown_since.items()):
            if since > before:
                continue
            if self._exchanger.destination(router) is not None:  # known again (a static route)
                del self._unknown_since[router]
                continue
            queue = manager.queues.get(routing_queue(router))
            if queue is not None and (queue.size or len(queue.consumers) > 1):
                continue  # messages wait for R (or are in doubt): it stays, looked at again later
            if transfer is not None and transfer.has_dispatcher(router) and not transfer.retire(router):
                continue  # its dispatcher is busy this moment: next time
            del self._unknown_since[router]
            if queue is not None:
                manager.delete_queue(queue.name, quiet=True)
            retired += 1
        if retired:
            self.retired += retired
            log.info(
                "%d empty routing queue(s) of routers unknown for unknown-router-grace %d ms deleted "
                "with their dispatchers",
                retired,
                self.context.config.unknown_router_grace,
            )

    def track(self, event: Any) -> None:
        """Mirror a table change into usage/routing-table."""
        if isinstance(event, api.DestinationAdded):
            router = event.router
            entry = self._usage_table.add(router, lambda: self._destination_usage(router))
            self._usage_routes[router] = entry.add_list("dynamic-routes")
        elif isinstance(event, api.DestinationRemoved):
            self._usage_table.remove(event.router)
            self._usage_routes.pop(event.router, None)
        elif isinstance(event, api.RouteAdded):
            hops = len(event.path)
            self._usage_routes[event.router].add(";".join(event.path), lambda: {"hop-count": hops})
        elif isinstance(event, api.RouteRemoved):
            self._usage_routes[event.router].remove(";".join(event.path))

    def _destination_usage(self, router: str) -> dict[str, Any]:
        row = self._exchanger.destination(router)
        if row is None:
            return {}
        usage = {
            "static": row.static,
            "active": row.active,
            "next-hop": row.next_hop or "",
            "rotation": " ".join(row.rotation),
            "routes": len(row.routes),
        }
        if self.queue_manager is not None:  # the messages waiting for it
            queue = self.queue_manager.queues.get(routing_queue(router))
            usage.update({"queue": routing_queue(router), "backlog": queue.size if queue is not None else 0})
        return usage
