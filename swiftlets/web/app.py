"""The web application of ``sys$web``: pages, the map's data and event stream, ``/metrics``.

Routes (all ``async``, run in the router's trio thread):

- ``/``: the network map page, an inline SVG drawn by ``static/map.js``, which loads
  ``/map.json`` and then follows ``/events`` (Server-Sent Events: one ``map`` event with the
  whole map at once and at each change, a comment every 15 s to keep proxies from closing).
- ``/routers/{name}``: this router's page (queues with backlog and rates, client
  connections, routing links, routing table), or for another router what this one knows of
  it (routes, its routing queue's backlog, its links on the map) and, when ``sys$mgmt``
  runs here, its queues and client connections asked of it (read-only, this router's own
  identity; a router that does not answer is shown with the reason).
- ``/metrics``: Prometheus text format from :class:`.metrics.UsageCollector`: the values
  read in the router's thread, written by ``prometheus_client``'s exposition in a worker
  thread.

:class:`BasicAuth` wraps it all: with authentication on, every request carries HTTP basic
credentials of a ``sys$authentication`` user of the admin group.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import trio
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from martinet.kernel import ManagementError, SwiftletContext, Usage, UsageList
from martinet.swiftlets.authentication.api import Authentication, AuthenticationFailed
from martinet.swiftlets.mgmt.api import RequestFailed

from .metrics import UsageCollector

if TYPE_CHECKING:
    from .swiftlet import WebSwiftlet

__all__ = ["build_app", "BasicAuth", "MapEvents"]

KEEPALIVE = 15.0  # seconds between comments on an idle event stream
MAP_SCRIPT = files(__package__).joinpath("static/map.js").read_text(encoding="utf-8")

STYLE = """
body { font-family: sans-serif; margin: 1em 2em; color: #222; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
td.num { text-align: right; }
svg .edge { stroke-width: 4; }
svg text { font-size: 14px; text-anchor: middle; paint-order: stroke; stroke: #fff; stroke-width: 4px; }
.state-operational { stroke: #2a9d3a; color: #2a9d3a; }
.state-connecting, .state-waiting { stroke: #e0a000; color: #b08000; }
.state-failed, .state-down { stroke: #d00000; color: #d00000; }
.state-closed, .state-disabled { stroke: #888888; color: #666666; }
circle.router { stroke: #333; stroke-width: 2; }
circle.state-local { fill: #4a78c8; }
circle.state-reachable { fill: #2a9d3a; }
circle.state-unreachable { fill: #d00000; }
"""


def _page(router: str, title: str, body: str, *, refresh: int = 0) -> HTMLResponse:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return HTMLResponse(
        f'<!doctype html><html><head><meta charset="utf-8">{meta}<title>{html.escape(title)}</title>'
        f'<style>{STYLE}</style></head><body><nav><a href="/">network map</a>'
        f'<a href="/routers/{html.escape(quote(router, safe=""))}">router {html.escape(router)}</a>'
        '<a href="/metrics">metrics</a>'
        f"</nav><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _cell(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def _table(table_id: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> str:
    rows = list(rows)
    if not rows:
        return f'<p id="{table_id}">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(value) for value in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _usage_rows(context: SwiftletContext, path: str, columns: Sequence[str]) -> list[list[Any]] | None:
    """One row per entry of the usage list at ``path`` (name, then ``columns``); None if absent."""
    try:
        node = context.management.resolve(path)
    except ManagementError:
        return None
    assert isinstance(node, UsageList)  # REMOTE_SECTIONS name usage lists
    entries = node.children
    rows = []
    for name, entry in sorted(entries.items()):
        values = entry.properties()
        rows.append([name, *(values.get(column, "") for column in columns)])
    return rows


def _section(context: SwiftletContext, title: str, table_id: str, path: str, columns: Sequence[str], empty: str) -> str:
    rows = _usage_rows(context, path, columns)
    if rows is None:
        return f"<h2>{html.escape(title)}</h2><p>not running here ({html.escape(path)})</p>"
    return f"<h2>{html.escape(title)}</h2>" + _table(table_id, ["name", *columns], rows, empty)


class MapEvents:
    """The body of ``/events``: a ``map`` event with the whole map now and at each change, a
    comment after :data:`KEEPALIVE` seconds without one. An iterator object rather than an
    async generator: the server may drop it at any await (a client gone, a stop), and an
    object has nothing left to finalize then."""

    def __init__(self, web: WebSwiftlet):
        self.web = web
        self.version: int | None = None

    def __aiter__(self) -> MapEvents:
        return self

    async def __anext__(self) -> str:
        while self.version == self.web.version:
            with trio.move_on_after(KEEPALIVE) as idle:
                await self.web.changed()
            if idle.cancelled_caught:
                return ": keepalive\n\n"
        self.version = self.web.version
        return f"event: map\ndata: {json.dumps(self.web.network_map().to_json())}\n\n"


class BasicAuth:
    """ASGI middleware: HTTP basic auth against ``sys$authentication``, admin group only,
    while authentication is on.

    A request without credentials, or with wrong ones, gets 401 (after the authentication
    swiftlet's refusal delay for its host); a user of another group gets 403. With
    authentication off, a loopback listener lets every request through and any other
    refuses every request (403).
    """

    def __init__(self, app: ASGIApp, web: WebSwiftlet, admin_group: str):
        self.app = app
        self.web = web
        self.admin_group = admin_group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.web.protected and self.web.loopback:
            await self.app(scope, receive, send)
            return
        if not self.web.protected:
            await PlainTextResponse(
                "authentication-enabled is off in sys$authentication: this listener is not on "
                "loopback, so it serves nothing until authentication is on again",
                status_code=403,
            )(scope, receive, send)
            return
        authentication = self.web.authentication
        assert authentication is not None
        connection = HTTPConnection(scope)
        host = connection.client.host if connection.client else ""
        refusal = await self._refusal(authentication, connection.headers.get("authorization", ""), host)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, text = refusal
        if status == 401:
            await trio.sleep(authentication.refusal_delay(host))
        headers = {"WWW-Authenticate": 'Basic realm="martinet", charset="UTF-8"'} if status == 401 else None
        await PlainTextResponse(text, status_code=status, headers=headers)(scope, receive, send)

    async def _refusal(self, authentication: Authentication, header: str, host: str) -> tuple[int, str] | None:
        """None if the request may go on, else the status and the text of the refusal."""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return 401, "log in: HTTP basic auth with a user of the admin group"
        try:
            user, colon, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return 401, "malformed basic auth credentials"
        if not colon:
            return 401, "malformed basic auth credentials"
        try:
            principal = await authentication.login(user, password, host)
        except AuthenticationFailed as exc:
            return 401, exc.reason
        if principal.group != self.admin_group:
            self.web.context.log.warning(
                "web: user %s from %s refused: group %s is not the admin group %s",
                user,
                host,
                principal.group,
                self.admin_group,
            )
            return 403, f"user {user} is not in the admin group"
        return None


def build_app(web: WebSwiftlet, context: SwiftletContext, *, admin_group: str) -> Starlette:
    """The Starlette application serving ``web``'s pages (see the module header)."""
    router = context.router_name
    collector = UsageCollector(router, context.management)

    async def map_page(request: Request) -> Response:
        body = (
            f'<svg id="map" data-router="{html.escape(router)}" width="760" height="560" '
            'viewBox="0 0 760 560"></svg><p id="status">loading…</p><h2>Links</h2>'
            '<table id="links"><thead><tr><th>link</th><th>state</th><th>since</th><th>error</th></tr>'
            f"</thead><tbody></tbody></table><script>{MAP_SCRIPT}</script>"
        )
        return _page(router, f"Network map seen from {router}", body)

    async def map_json(request: Request) -> Response:
        return JSONResponse(web.network_map().to_json())

    async def events(request: Request) -> Response:
        return StreamingResponse(MapEvents(web), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def metrics(request: Request) -> Response:
        # The tree is read here, in the router's thread; families and text are made in a
        # worker thread, so that a large exposition does not hold up the router's event loop.
        text = await trio.to_thread.run_sync(generate_latest, collector.snapshot())
        return Response(text, media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def router_page(request: Request) -> Response:
        name = request.path_params["name"]
        if name == router:
            return _page(router, f"Router {router}", _local_sections(context, web), refresh=5)
        known = web.network_map().router(name)
        if known is None:
            return _page(router, f"Router {name}", f"<p>{router} knows no router {html.escape(name)}.</p>")
        body = _remote_section(context, web, name)
        if web.management is not None:
            async with trio.open_nursery() as nursery:  # both asked at once: one timeout at most
                parts = [""] * len(REMOTE_SECTIONS)
                for index, section in enumerate(REMOTE_SECTIONS):
                    nursery.start_soon(_ask_section, web, name, section, parts, index)
            body += "".join(parts)
        return _page(router, f"Router {name}", body, refresh=5)

    routes = [
        Route("/", map_page),
        Route("/map.json", map_json),
        Route("/events", events),
        Route("/metrics", metrics),
        Route("/routers/{name}", router_page),
    ]
    return Starlette(routes=routes, middleware=[Middleware(BasicAuth, web=web, admin_group=admin_group)])


#: The sections a router page shows of any router: title, table id, usage path, columns, text when empty.
REMOTE_SECTIONS = (
    (
        "Queues",
        "queues",
        "/sys$queuemanager/usage/queues",
        ["messages", "consumers", "enqueued", "dequeued", "send-rate", "receive-rate"],
        "no queues",
    ),
    (
        "Client connections",
        "connections",
        "/sys$jms/usage/connections",
        ["listener", "host", "user", "client-id", "messages-received", "messages-sent", "receive-rate", "send-rate"],
        "no client connections",
    ),
)


async def _ask_section(web: WebSwiftlet, name: str, section: tuple[Any, ...], parts: list[str], index: int) -> None:
    """``parts[index]``: a :data:`REMOTE_SECTIONS` section of router ``name``, asked of it over ``sys$mgmt``."""
    title, table_id, path, columns, empty = section
    try:
        entries = (await web.ask(name, "get", path=path))["entries"]
    except RequestFailed as exc:
        parts[index] = f'<h2>{html.escape(title)}</h2><p id="{table_id}">not available: {html.escape(exc.reason)}</p>'
        return
    rows = [[entry, *(values.get(column, "") for column in columns)] for entry, values in sorted(entries.items())]
    parts[index] = f"<h2>{html.escape(title)}</h2>" + _table(table_id, ["name", *columns], rows, empty)


def _local_sections(context: SwiftletContext, web: WebSwiftlet) -> str:
    return "".join(
        (
            *(_section(context, *section) for section in REMOTE_SECTIONS),
            _section(
                context,
                "Routing connectors",
                "connectors",
                "/sys$routing/usage/connectors",
                ["state", "hostname", "port", "routername", "last-error", "next-attempt"],
                "no connectors",
            ),
            _section(
                context,
                "Routing links",
                "links",
                "/sys$routing/usage/connections",
                ["routername", "state", "address", "connecttime", "routes-sent", "routes-received"],
                "no routing links",
            ),
            _section(
                context,
                "Routing table",
                "routing-table",
                "/sys$routing/usage/routing-table",
                ["active", "next-hop", "routes", "static", "backlog"],
                "no known routers",
            ),
        )
    )


def _remote_section(context: SwiftletContext, web: WebSwiftlet, name: str) -> str:
    known = web.network_map().router(name)
    assert known is not None
    row: Mapping[str, Any] = {}
    try:
        entry = context.management.resolve(f"/sys$routing/usage/routing-table/{name}")
        assert isinstance(entry, Usage)  # an entry of sys$routing's routing table
        row = entry.properties()
    except ManagementError:
        pass
    facts: list[list[Any]] = [
        ["state", known.state],
        ["hops", known.hops if known.hops is not None else ""],
        *([key, value] for key, value in row.items()),
    ]
    edges = [[f"{e.a} – {e.b}", e.state, e.error] for e in web.network_map().edges if name in e.key]
    asked = (
        "Its queues and connections below are asked of it through sys$mgmt."
        if web.management is not None
        else "Its queues and connections are shown by its own web view (sys$mgmt does not run here)."
    )
    return (
        f"<p>What {html.escape(context.router_name)} knows of {html.escape(name)}. {asked}</p>"
        + _table("facts", ["property", "value"], facts, "")
        + "<h2>Links</h2>"
        + _table("links", ["link", "state", "error"], edges, "no links known")
    )
