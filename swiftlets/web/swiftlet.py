"""The running ``sys$web``: the HTTP listener, and the network map kept up to date from events.

Theory of operation
-------------------
Disabled (the default), the swiftlet starts and does nothing. Enabled, it checks the bind
address first: anything but loopback needs ``sys$authentication`` with authentication on,
else the start fails with the reason (nothing is served unprotected beyond this host), and
without TLS too unless ``plain-http-auth`` allows passwords in clear. With authentication
on, every request logs in with HTTP basic auth as a user of ``admin-group`` or of one of
``sys$mgmt``'s groups (:mod:`.auth`); whether it is on is read at each request, and a
listener beyond loopback refuses every request while it is off.

The HTTP side is Starlette (:mod:`.app`) served by Hypercorn's trio worker, a task in the
swiftlet's nursery: the router's cancellation stops it, and a bind error or a certificate
that does not load fails the start with the address or the file and the reason. With
``tls-certificate`` Hypercorn serves HTTPS itself. Handlers run in the router's trio thread (they are all
``async``), so they read the management tree and the routing table directly.

The map. One task per kind of ``sys$routing`` event keeps the map current: link state
changes update this router's links (one per neighbour: an operational link is not replaced
by the state of a second, refused or closing link to the same neighbour; a connector's
attempts, which name no peer until the handshake, count for the peer it reached last, so a
neighbour that is gone shows the connector's failed and connecting states), and every link or
route event marks the map stale; one task rebuilds it (once for a burst of events) with
:func:`.netmap.build_map` from those links, the routing table and the previous map. A
rebuild that changes the map bumps :attr:`WebSwiftlet.version` and wakes the pages' event
streams. A link subscription that overflows is opened again and
the links are read afresh from ``sys$routing``'s usage, so no state is lost for good.

History and traffic. Every 10 s a task samples this router's rates and backlogs into the
pages' hour of history (:mod:`.history`) and measures its links' rates and its backlog for
the map (:mod:`.traffic`); each crawl (below) brings the other routers'. A change of those
wakes the event streams too, so the map's labels follow within a sample or a crawl.

Other routers' links. When ``sys$mgmt`` runs here, a task crawls the network every
``map-refresh-interval`` seconds with :func:`martinet.swiftlets.mgmt.api.crawl` (up to
``map-concurrency`` routers at once, each request bounded by ``map-request-timeout``), under
this router's own identity (read-only, :meth:`~martinet.swiftlets.mgmt.api.Identity.of_router`):
every known router's connectors, with their state, peer, last error and since when. Those
are the map's reported links (:func:`.netmap.build_map`'s ``remote``); a router that does
not answer keeps its links from the previous crawl while it is still routed to (until it
answers again), and loses them once it is gone from the routing table. Without
``sys$mgmt``, links between other routers are inferred from the routes only.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import time
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from martinet.kernel import Event, ManagementError, Overflow, SubscriberOverflow, SwiftletContext, UsageList
from martinet.swiftlets.authentication.api import Authentication
from martinet.swiftlets.mgmt.api import Identity, Management, RequestFailed, Status, crawl
from martinet.swiftlets.routing.api import (
    DestinationAdded,
    DestinationRemoved,
    LinkState,
    LinkStateChanged,
    RouteAdded,
    RouteRemoved,
    Routing,
)

from .app import build_app
from .console import Console
from .history import INTERVAL, History
from .netmap import LinkView, NetworkMap, build_map
from .traffic import Traffic

__all__ = ["WebSwiftlet", "is_loopback"]

BACKLOG = 100
GRACEFUL = 1.0  # seconds Hypercorn gives open requests (event streams) at a shutdown it triggers itself


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) is a loopback address."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class _NoQuitHint(logging.Filter):
    """Drops hypercorn's "Running on … (CTRL + C to quit)": the router owns the process and its
    signals (a Ctrl-C stops the whole router, in order), and its own line says where it serves."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "(CTRL + C to quit)" not in record.getMessage()


def _hypercorn_log(log: logging.Logger) -> logging.Logger:
    """The logger hypercorn writes to: a child of the swiftlet's, without the quit hint."""
    child = log.getChild("hypercorn")
    if not any(isinstance(f, _NoQuitHint) for f in child.filters):
        child.addFilter(_NoQuitHint())
    return child


class WebSwiftlet:
    """``sys$web``: provides :class:`.api.Web`."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.version = 0
        self._url = ""
        self._links: dict[str, tuple[str, LinkView]] = {}  # peer -> (link name, its view)
        self._connector_peers: dict[str, str] = {}  # connector link -> the peer it reached last
        self._map = NetworkMap(local=context.router_name)
        self._changed = trio.Event()
        self._stale = trio.Event()  # set: events came that the map does not show yet
        self._routing: Routing | None = None
        self._remote: dict[str, tuple[LinkView, ...]] = {}  # router -> its links, as the last crawl found them
        self.management: Management | None = None  # sys$mgmt, if it runs
        self.authentication: Authentication | None = None  # sys$authentication, if it runs
        self.loopback = True  # whether the listener is bound to a loopback address
        self.history = History(context.management)  # the last hour of rates and backlogs
        self.traffic = Traffic(context, self._bump)  # the map's rates and backlogs
        self.console = Console(self, context)  # what the pages read and change

    @property
    def url(self) -> str:
        return self._url

    def network_map(self) -> NetworkMap:
        return self._map

    def map_json(self) -> dict[str, Any]:
        """The map as ``/map.json`` and the event stream carry it: with ``rates`` (messages/s
        by link, ``a|b``) and ``backlogs`` (messages by router), as last measured, and their
        last hour as sparklines (``rate-history``, ``backlog-history``)."""
        return {**self._map.to_json(), **self.traffic.data()}

    async def changed(self) -> None:
        """Wait until the map changes."""
        await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.context.config
        self.history.publish(self.context.usage)  # for other routers' web views
        self.context.usage.provide(
            lambda: {
                "url": self._url,
                "map-version": self.version,
                "routers": len(self._map.routers),
                "links": len(self._map.edges),
            }
        )
        if not config.enabled:
            task_status.started()
            await trio.sleep_forever()
        self.loopback = is_loopback(config.bind_address)
        try:
            self.authentication = self.context.lookup("sys$authentication", Authentication)
        except LookupError:
            self.authentication = None
        if not self.loopback and not self.protected:
            raise RuntimeError(
                f"bind-address {config.bind_address!r} is not a loopback address: serving the web "
                "view and /metrics beyond this host needs authentication-enabled in "
                "sys$authentication (or bind to 127.0.0.1)"
            )
        if not self.loopback and not config.tls_certificate and not config.plain_http_auth:
            raise RuntimeError(
                f"bind-address {config.bind_address!r} is not a loopback address and there is no "
                "tls-certificate: HTTP basic auth would send passwords across the network in clear "
                "(set tls-certificate and tls-key, or plain-http-auth to allow it)"
            )
        try:
            self._routing = self.context.lookup("sys$routing", Routing)
        except LookupError:
            self.context.log.info("sys$routing is not running: the map shows this router alone")
        try:
            self.management = self.context.lookup("sys$mgmt", Management)
        except LookupError:
            self.management = None
        async with trio.open_nursery() as nursery:
            await nursery.start(self._sampler)
            if self._routing is not None:
                await nursery.start(self._follow_links)
                for kind in (RouteAdded, RouteRemoved, DestinationAdded, DestinationRemoved):
                    await nursery.start(self._follow_routes, kind)
                nursery.start_soon(self._rebuilder)
                if self.management is not None:
                    nursery.start_soon(self._crawler)
            self._rebuild()
            await self._serve(nursery, config)
            task_status.started()

    @property
    def protected(self) -> bool:
        """Whether requests must log in: ``sys$authentication`` runs with authentication on
        (read at each request: the operator may switch it at runtime)."""
        return self.authentication is not None and self.authentication.enabled

    async def _serve(self, nursery: trio.Nursery, config: Any) -> None:
        # The socket is bound here, not by Hypercorn, so that a bind error is reported with
        # the address (and the socket closed: Hypercorn would leave it open).
        family = socket.AF_INET6 if ":" in config.bind_address else socket.AF_INET
        host = f"[{config.bind_address}]" if family == socket.AF_INET6 else config.bind_address
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((config.bind_address, config.port))
            listener.listen(BACKLOG)
        except OSError as exc:
            listener.close()
            raise RuntimeError(
                f"cannot listen on {host}:{config.port} (bind-address, port): {exc.strerror or exc}"
            ) from None
        hypercorn = HypercornConfig()
        if config.tls_certificate:
            hypercorn.certfile = config.tls_certificate
            hypercorn.keyfile = config.tls_key or config.tls_certificate
            # HTTP/1.1 only: hypercorn 0.18's HTTP/2 raised KeyError on a stream a browser had
            # reset (a navigation away), out of the server and through the swiftlet's nursery
            hypercorn.alpn_protocols = ["http/1.1"]
            try:  # loaded here so that a bad file fails the start with its name (hypercorn loads it again)
                hypercorn.create_ssl_context()
            except (OSError, ssl.SSLError) as exc:
                listener.close()
                raise RuntimeError(
                    f"cannot load tls-certificate {config.tls_certificate!r} / tls-key {config.tls_key!r}: {exc}"
                ) from None
        hypercorn.accesslog = None
        hypercorn.errorlog = _hypercorn_log(self.context.log)
        hypercorn.graceful_timeout = GRACEFUL
        asgi_app = build_app(self, self.console, self.context, admin_group=config.admin_group)
        # Starlette types an app's scope as a MutableMapping, hypercorn as its own TypedDicts:
        # the one ASGI app fits both at runtime, the two declarations do not match.
        app = wrap_app(asgi_app, hypercorn.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
        scheme, sockets = (
            ("https", Sockets([listener], [], [])) if config.tls_certificate else ("http", Sockets([], [listener], []))
        )
        self._url = f"{scheme}://{host}:{listener.getsockname()[1]}"
        await nursery.start(partial(worker_serve, app, hypercorn, sockets=sockets))
        self.context.log.info(
            "web view and /metrics on %s%s",
            self._url,
            " (HTTP basic auth, group " + config.admin_group + ")" if self.protected else "",
        )

    # -- the map -----------------------------------------------------------------------------

    async def _follow_links(self, *, task_status: trio.TaskStatus[None]) -> None:
        while True:
            with self.context.bus.subscribe(LinkStateChanged) as events:
                self._read_links()
                self._stale.set()
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                try:
                    async for event in events:
                        if event.peer and event.link.startswith("connector:"):
                            self._connector_peers[event.link] = event.peer
                        peer = event.peer or self._connector_peers.get(event.link)
                        if peer:
                            since = event.since or time.time()
                            self._link(event.link, peer, event.state.value, event.error or "", since)
                            self._stale.set()
                except SubscriberOverflow as exc:
                    self.context.log.warning("%s; reading the links afresh", exc)

    async def _follow_routes(self, kind: type[Event], *, task_status: trio.TaskStatus[None]) -> None:
        # Only the fact of a change matters: the table is read at each rebuild.
        with self.context.bus.subscribe(kind, max_buffer=16, overflow=Overflow.DROP_OLDEST) as events:
            task_status.started()
            async for _ in events:
                self._stale.set()

    async def _rebuilder(self) -> None:
        # One rebuild for a burst of events: the followers mark the map stale until they block.
        while True:
            await self._stale.wait()
            self._stale = trio.Event()
            self._rebuild()

    async def ask(self, router: str, verb: str, **args: Any) -> Any:
        """One read-only request to ``router``'s ``sys$mgmt`` under this router's identity: the
        result, or :class:`RequestFailed` (also with no ``sys$mgmt`` here, or no answer in
        ``map-request-timeout``)."""
        if self.management is None:
            raise RequestFailed(int(Status.UNAVAILABLE), "sys$mgmt does not run on this router", router)
        reply = await self.management.request(
            router,
            {"verb": verb, **args},
            Identity.of_router(self.context.router_name),
            timeout=self.context.config.map_request_timeout,
        )
        if reply.get("status") != Status.OK:
            raise RequestFailed(reply.get("status", int(Status.ERROR)), reply.get("error", "no reason given"), router)
        return reply.get("result")

    async def _sampler(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Every :data:`.history.INTERVAL` seconds: a point of history, and this router's own
        links' rates and backlog on the map."""
        self.sample()
        task_status.started()
        while True:
            await trio.sleep(INTERVAL)
            self.sample()

    def sample(self) -> None:
        """A point of history, and this router's links' rates and backlog on the map, now."""
        self.history.sample()
        self.traffic.sample()

    async def _crawler(self) -> None:
        while True:
            config = self.context.config
            try:
                network = await crawl(self.ask, self.context.router_name, concurrency=config.map_concurrency)
            except RequestFailed as exc:  # (only this router's own "routers" request: not expected)
                self.context.log.warning("web: the network map's crawl failed: %s", exc)
            else:
                for router in network.unreachable:
                    network.routers.pop(router, None)
                # a router that did not answer but is still routed to (slow, or sys$mgmt restarting)
                # keeps its last reports; one gone from the table loses them (its links go down)
                routed = {row.name for row in self._routing.destinations() if row.routes} if self._routing else set()
                remote = {
                    router: views
                    for router, views in self._remote.items()
                    if router in routed and router not in network.routers
                }
                before = {(router, view.peer): view for router, views in self._remote.items() for view in views}
                now = time.time()
                for link in network.links:
                    if link.source != self.context.router_name:
                        old = before.get((link.source, link.target))
                        since = _seconds(link.since) or (old.since if old and old.state == link.state else now)
                        view = LinkView(peer=link.target, state=link.state, since=since, error=link.error)
                        remote[link.source] = (*remote.get(link.source, ()), view)
                if remote != self._remote:
                    self._remote = remote
                    self._stale.set()
                await self.traffic.crawled(network, self.ask, config.map_concurrency)
            await trio.sleep(config.map_refresh_interval)

    def _read_links(self) -> None:
        """This router's links from ``sys$routing``'s usage (connectors, then live links)."""
        now = time.time()
        for kind in ("connectors", "connections"):
            try:
                node = self.context.management.resolve(f"/sys$routing/usage/{kind}")
            except ManagementError:
                continue
            assert isinstance(node, UsageList)  # sys$routing's usage lists
            entries = node.children
            for name, entry in entries.items():
                values = entry.properties()
                link = f"connector:{name}" if kind == "connectors" else name
                peer = values.get("routername") or self._connector_peers.get(link)
                if peer:
                    # when the state began, as sys$routing has it (a retry does not move it)
                    since = _seconds(values.get("since") or values.get("connecttime") or "") or now
                    self._link(link, peer, values["state"], values.get("last-error", ""), since)

    def _link(self, link: str, peer: str, state: str, error: str, since: float) -> None:
        current = self._links.get(peer)
        if current is not None:
            current_link, view = current
            if (
                current_link != link
                and view.state == LinkState.OPERATIONAL.value
                and state != LinkState.OPERATIONAL.value
            ):
                return  # a second link to the same neighbour (refused, closing): the live one counts
            if view.state == state and current_link == link:
                return
        self._links[peer] = (link, LinkView(peer=peer, state=state, since=since, error=error))

    def _rebuild(self) -> None:
        routes = {row.name: row.routes for row in self._routing.destinations()} if self._routing else {}
        links = {peer: view for peer, (_, view) in self._links.items()}
        new = build_map(self.context.router_name, links, routes, self._map, time.time(), self._remote)
        if new != self._map:
            self._map = new
            self._bump()

    def _bump(self) -> None:
        """A new version of what the map shows: wake the event streams."""
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()


def _seconds(stamp: str) -> float | None:
    """A routing usage time stamp (local time, ``%Y-%m-%d %H:%M:%S``) in seconds since the
    epoch; None when there is none."""
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
