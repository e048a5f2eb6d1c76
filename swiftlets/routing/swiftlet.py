"""The running ``sys$routing``: listeners, connectors, admission, the route exchanger, usage.

Theory of operation
-------------------
Everything here runs in the router's one trio thread, so the link registry and the route
exchanger (:mod:`.exchange`, a pure object) need no lock: a link's events are handled to the
end, exchanger output included, before anything else runs.

- **Listeners** (:mod:`.listeners`) accept sockets, check the host access list and hand
  each to a :class:`~.links.Link` of the listener role. **Connectors** (:mod:`.connectors`)
  each run a task that dials, runs a link of the connector role until it ends, waits
  (``retry-time``, or the backoff) and dials again — while enabled.
- **Admission** (both ends, :meth:`RoutingSwiftlet.admission`): a router name is connected
  once: a link to a router already connected is refused. Two links to one router can both
  pass admission only while both are in their handshake (two routers dialled each other at
  the same moment); when the second becomes operational, both ends keep the link dialled
  by the router whose name sorts first and close the other. A link counts as connected only
  once operational — after authentication — so a peer that merely claims a name displaces
  nothing.
- **Routes**: a link in the delivery stage is given to the exchanger (``link_up``), its
  announcements too; the exchanger's output is applied at once — announcements to the
  neighbours' links, table changes to usage and as bus events (:mod:`.api`). A link that
  ends is taken out (``link_down``), withdrawing what was learned over it. An announcement
  costs what it changed, never the table: only the dispatchers of the destinations it
  touched are woken (:mod:`.dispatch`), and the changes are logged one line per batch
  (:mod:`.routelog`); a route longer than ``max-route-hops`` is ignored and counted.
- **Addressing** (:mod:`.addressing`, with a queue manager running): the table changes
  reach the queue manager synchronously, in :meth:`_apply`, before their events are
  published: a destination ``R`` gets the queue ``rt$R`` and the redirection ``%@R`` →
  ``rt$R``, and a dispatcher (:class:`.dispatch.RoutedTransfer`), which moves what waits in
  ``rt$R`` over the links; the links' recovery and transfer events go to it. Without a queue
  manager (a routing-only router) none of this happens.
- **Runtime changes** through the management tree: listeners, connectors, static routes and
  filters can be added and removed, the hop limit and filters changed (the exchanger sends
  each neighbour the difference), a connector enabled or disabled (its link closes at once)
  or re-pointed (it reconnects); queue bridges (:mod:`.bridges`) added, changed (they start
  over with the new values) and removed (they stop at once; their messages stay).
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import trio

from martinet.kernel import Change, Entity, SwiftletContext, Veto
from martinet.swiftlets.queuemanager.api import QueueManager
from martinet.swiftlets.xa.api import XAResourceManager

from . import api
from .addressing import Addressing
from .api import Destination, LinkState, LinkStateChanged
from .bridges import QueueBridges
from .config import ConnectorConfig, ListenerConfig, RoutingConfig
from .connectors import Connectors
from .dispatch import RoutedTransfer
from .exchange import Announcement, BadAnnouncement, Output, RouteExchanger, RouteFilter
from .links import Link, stamp
from .listeners import Listeners
from .routelog import RouteChanges
from .stages import (
    LinkSettings,
    RecoveryReceived,
    RecoveryRequested,
    Role,
    valid_router_name,
)

__all__ = ["RoutingSwiftlet"]

log = logging.getLogger(__name__)


STOP_DRAIN = 5.0  # seconds an orderly stop gives the links to carry what is non-persistent (see _last_transfers)
# the table changes that name the destination they concern (each wakes its dispatcher)
_TABLE_EVENTS = (
    api.DestinationAdded,
    api.DestinationRemoved,
    api.DestinationActivated,
    api.DestinationDeactivated,
    api.RouteAdded,
    api.RouteRemoved,
)
ROUTE_LOG_INTERVAL = 1.0  # seconds a batch of route changes is collected for its one log line


def _filters(config: RoutingConfig) -> dict[str, RouteFilter]:
    return {name: RouteFilter(f.type, frozenset(f.routers)) for name, f in config.filters.items()}


class RoutingSwiftlet:
    """``sys$routing`` (implements :class:`.api.Routing`)."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.local = context.router_name
        config: RoutingConfig = context.config
        self.exchanger = RouteExchanger(
            self.local,
            hop_limit=config.route_announce_hop_limit,
            filters=_filters(config),
            round_robin=config.roundrobin_enabled,
            max_routes_per_link=config.max_routes_per_link,
            max_hops=config.max_route_hops,
            log_each=config.route_log == "each",
        )
        self._links: dict[str, Link] = {}  # operational links by peer name
        self._filters_changed = trio.Event()
        self._sent = self._received = self._refused = 0
        self._route_changes = RouteChanges()
        usage = context.usage
        usage.provide(
            lambda: {
                "links": len(self._links),
                "destinations": self.exchanger.known(),
                "routes-refused": self._refused,
                "routing-queues-retired": self._addressing.retired,
                "dispatchers": self._transfer.dispatchers if self._transfer else 0,
                "announcements-sent": self._sent,
                "announcements-received": self._received,
                "unroutable": self._transfer.unroutable if self._transfer else 0,
                "dropped": self._transfer.dropped if self._transfer else 0,
                "expired-in-transit": self._transfer.expired if self._transfer else 0,
            }
        )
        self.listeners = Listeners(context, self, self._settings)
        self.connectors = Connectors(context, self, self._settings)
        self._usage_connections = usage.add_list("connections")
        self._addressing = Addressing(context, self.exchanger)
        self.bridges = QueueBridges(self.local, usage.add_list("queue-bridges"))
        self._queue_manager: QueueManager | None = None  # the addressing's, once started (None: it is off)
        self._transfer: RoutedTransfer | None = None  # with a queue manager

    # --- api.Routing --------------------------------------------------------------------

    def destination(self, router: str) -> Destination | None:
        return self.exchanger.destination(router)

    def destinations(self) -> list[Destination]:
        return self.exchanger.destinations()

    # --- lifecycle ----------------------------------------------------------------------

    async def _last_transfers(self) -> None:
        """The router stops orderly: for up to :data:`STOP_DRAIN` seconds the links carry
        the non-persistent messages waiting for an active destination — among them the
        interest records that say which topics this router keeps (the topic manager sends
        them just before) — and the answers of what is in flight. Without it the links close
        at once and the neighbours never hear it."""
        transfer = self._transfer
        if transfer is None:
            return
        with trio.move_on_after(STOP_DRAIN):
            while not transfer.drained():
                await trio.sleep(0.01)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        entity = self.context.entity
        self._addressing.start()
        self._queue_manager = self._addressing.queue_manager
        try:
            async with trio.open_nursery() as nursery:
                self.listeners.nursery = self.connectors.nursery = self.bridges.nursery = nursery
                self.bridges.queue_manager = self._queue_manager
                if self._queue_manager is not None:
                    try:
                        xa: XAResourceManager | None = self.context.lookup("sys$xa", XAResourceManager)
                    except LookupError:
                        xa = None
                    self._transfer = RoutedTransfer(
                        self.local,
                        self._queue_manager,
                        self.exchanger.destination,
                        self._links,
                        nursery,
                        xa,
                        inbound_flow_control=self.context.config.inbound_flow_control_enabled,
                    )
                    self._addressing.transfer = self._transfer
                entity.on_change(self._swiftlet_changed)
                self.context.before_stop(self._last_transfers)
                entity.entity_list("static-routes").bind(self._static_added, self._static_removed)
                self._bind_filters()
                for listener in entity.entity_list("listeners").entities.values():
                    try:
                        sockets = self.listeners.bind(listener.config)
                    except (OSError, ssl.SSLError) as exc:
                        raise RuntimeError(str(exc)) from None
                    self.listeners.start(listener, sockets)
                entity.entity_list("listeners").bind(self.listeners.added, self.listeners.removed)
                entity.entity_list("connectors").bind(self.connectors.added, self.connectors.removed)
                entity.entity_list("queue-bridges").bind(self.bridges.added, self.bridges.removed)
                nursery.start_soon(self._follow_filters)
                nursery.start_soon(self._addressing.retire_forever)
                nursery.start_soon(
                    self._route_changes.run,
                    log,
                    ROUTE_LOG_INTERVAL,
                    self.exchanger.known,
                    lambda: self.exchanger.max_hops,
                )
                task_status.started()
        finally:
            entity.clear_listeners()
            self._addressing.stop()

    # --- config changes -----------------------------------------------------------------

    def _swiftlet_changed(self, change: Change) -> None:
        if change.field == "route_announce_hop_limit":
            self._apply(self.exchanger.set_hop_limit(change.new))
        elif change.field == "max_routes_per_link":
            self.exchanger.max_routes_per_link = change.new
        elif change.field == "route_log":
            self.exchanger.log_each = change.new == "each"
        elif change.field == "max_route_hops":
            self._apply(self.exchanger.set_max_hops(change.new))

    def _static_added(self, entity: Entity) -> None:
        """Raises Veto for a name no router can have (its ``rt$`` queue and ``%@`` redirection
        would name something else)."""
        if not valid_router_name(entity.name):
            raise Veto(f"invalid router name {entity.name!r}: use letters, digits, '_' and '-', starting with a letter")
        self._apply(self.exchanger.add_static(entity.name))

    def _static_removed(self, entity: Entity) -> None:
        self._apply(self.exchanger.remove_static(entity.name))

    def _bind_filters(self) -> None:
        """Any change below ``filters`` makes :meth:`_follow_filters` re-read them (after
        the change is committed; the listeners run before)."""

        def changed(*_: Any) -> None:
            self._filters_changed.set()

        def bind_filter(entity: Entity) -> None:
            entity.on_change(changed)
            entity.entity_list("routers").bind(changed, changed)
            changed()

        self.context.entity.entity_list("filters").bind(bind_filter, changed)

    async def _follow_filters(self) -> None:
        while True:
            await self._filters_changed.wait()
            self._filters_changed = trio.Event()
            self._apply(self.exchanger.set_filters(_filters(self.context.config)))

    # --- route exchange -----------------------------------------------------------------

    def _apply(self, output: Output, neighbour: str | None = None) -> None:
        """Send the exchanger's announcements and publish its table changes (``neighbour``:
        whose announcement they answer). Each costs what it changed, never the whole table:
        only the dispatchers of the destinations concerned are woken."""
        for peer, announcement in output.sends:
            self._sent += self._links[peer].send_route(announcement)
        self._refused += output.refused
        self._route_changes.note(output, neighbour)
        for event in output.events:
            self._addressing.track(event)
            self._addressing.address(event)
            self.context.bus.publish(event)
        if output.events:
            if self._transfer is not None:
                self._transfer.wake({event.router for event in output.events if isinstance(event, _TABLE_EVENTS)})
            self.bridges.wake()

    # --- links (LinkOwner) --------------------------------------------------------------

    def admission(self, link: Link, peer: str) -> str | None:
        if peer in self._links:
            return f"router {peer} is already connected to {self.local}"
        return None

    def link_up(self, link: Link) -> None:
        """Register an operational link. Two links to one router get here only when both
        were in their handshake at once (admission refuses a second link to a connected
        router): both ends keep the link dialled by the router whose name sorts first."""
        peer = link.peer
        assert peer is not None and link.operational is not None
        other = self._links.get(peer)
        if other is not None:
            preferred = min(self.local, peer)
            loser = link if other.connector_side == preferred or link.connector_side != preferred else other
            loser.close(f"router {peer} is connected twice: the link dialled by {preferred} is kept")
            if loser is link:
                return
            self._link_down(other)
        self._links[peer] = link
        log.info(
            "routing link %s to %s (%s) operational: protocol %s, xa %s",
            link.name,
            peer,
            link.address,
            link.operational.version,
            link.operational.use_xa,
        )
        self._usage_connections.add(link.name, lambda: self._link_usage(link))
        self.listeners.found(peer)
        self._apply(self.exchanger.link_up(peer))
        if self._transfer is not None:  # a new link: any dispatcher may have a way out now
            self._transfer.changed()

    def route_received(self, link: Link, announcement: Announcement) -> None:
        assert link.peer is not None
        self._received += 1
        try:
            output = self.exchanger.receive(link.peer, announcement)
        except BadAnnouncement as exc:
            log.warning("routing link %s to %s: bad route announcement: %s", link.name, link.peer, exc)
            link.close(f"bad route announcement: {exc}")
            return
        self._apply(output, link.peer)

    def link_state(self, link: Link) -> None:
        connector = self.connectors.get(link.name.removeprefix("connector:"))
        if link.role is Role.CONNECTOR and connector is not None:
            self.connectors.set_state(connector, link.state, link.error)
        else:
            self.context.bus.publish(
                LinkStateChanged(link=link.name, peer=link.peer, state=link.state, error=link.error)
            )
        if link.error is not None and link.role is Role.LISTENER and link.operational is None:
            # a handshake that failed: what any peer can repeat at will, so limited per address
            self.listeners.handshake_log.warn(link.address.rpartition(":")[0], f"routing link {link.name}", link.error)
        elif link.error is not None:
            level = logging.WARNING if link.state is LinkState.FAILED else logging.INFO
            log.log(
                level,
                "routing link %s (%s%s) %s: %s",
                link.name,
                link.address,
                f", router {link.peer}" if link.peer else "",
                link.state.value,
                link.error,
            )

    def transfer_event(self, link: Link, event: Any) -> None:
        if self._transfer is not None:
            self._transfer.event(link, event)
        elif isinstance(event, RecoveryRequested):  # no queues here, so nothing is ever prepared
            link.machine.recovery_list(())
        elif isinstance(event, RecoveryReceived):
            link.machine.recovery_done(commit=())

    def link_gone(self, link: Link) -> None:
        if self._links.get(link.peer or "") is link:
            self._link_down(link)
        if self._transfer is not None:
            self._transfer.link_gone(link)

    def _link_down(self, link: Link) -> None:
        assert link.peer is not None
        del self._links[link.peer]
        self._usage_connections.remove(link.name)
        if link.role is Role.LISTENER:
            self.listeners.lost(link)
        self._apply(self.exchanger.link_down(link.peer))

    def _link_usage(self, link: Link) -> dict[str, Any]:
        operational = link.operational
        return {
            "routername": link.peer or "",
            "connecttime": stamp(link.connect_time),
            "address": link.address,
            "protocol-version": operational.version if operational else "",
            "uses-xa": bool(operational and operational.use_xa),
            "state": link.state.value,
            "routes-sent": link.routes_sent,
            "routes-received": link.routes_received,
            **(self._transfer.usage(link) if self._transfer is not None else {}),
        }

    def _settings(self, config: ListenerConfig | ConnectorConfig) -> LinkSettings:
        swiftlet: RoutingConfig = self.context.config
        return LinkSettings(
            keepalive_interval=getattr(config, "keepalive_interval", 0) / 1000,
            inbound_transaction_size=config.inbound_transaction_size,
            inbound_window_size=config.inbound_window_size,
            inbound_window_bytes=config.inbound_window_bytes,
            use_xa=config.use_xa,
            use_compression=config.use_compression,
            stage_valid_timeout=swiftlet.stage_valid_timeout / 1000,
            reject_disconnect_delay=swiftlet.reject_disconnect_delay / 1000,
        )
