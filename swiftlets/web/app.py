"""The web application of ``sys$web``: routes, the map's data and event stream, ``/metrics``.

Routes (all ``async``, run in the router's trio thread):

- ``/``: the network map page, an inline SVG drawn by ``static/map.js``, which loads
  ``/map.json`` and then follows ``/events`` (Server-Sent Events: one ``map`` event with the
  whole map at once and at each change, a comment every 15 s to keep proxies from closing).
- ``/routers/{name}``: a router's overview (:mod:`.pages`), and below it its pages of
  queues and a queue's messages (:mod:`.queues`), client connections, routing, topics and
  in-doubt transactions: the same pages for this router and for any other it can reach
  (read through ``sys$mgmt``, :mod:`.console`).
- ``POST /routers/{name}/act``: a change, confirmed first, made through ``sys$mgmt`` as the
  logged-in user (:mod:`.actions`).
- ``/metrics``: Prometheus text format from :class:`.metrics.UsageCollector`: the values
  read in the router's thread, written by ``prometheus_client``'s exposition in a worker
  thread.

:class:`.auth.BasicAuth` wraps it all: with authentication on, every request carries HTTP
basic credentials of a ``sys$authentication`` user who may use the web view.
"""

from __future__ import annotations

import html
import json
from functools import partial
from importlib.resources import files
from typing import TYPE_CHECKING

import trio
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from martinet.kernel import SwiftletContext

from .actions import act
from .auth import BasicAuth
from .metrics import UsageCollector
from .pages import AREA_PAGES, router_page
from .queues import queue_page, queues_page
from .render import page

if TYPE_CHECKING:
    from .console import Console
    from .swiftlet import WebSwiftlet

__all__ = ["build_app", "MapEvents"]

KEEPALIVE = 15.0  # seconds between comments on an idle event stream
MAP_SCRIPT = files(__package__).joinpath("static/map.js").read_text(encoding="utf-8")


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
        return f"event: map\ndata: {json.dumps(self.web.map_json())}\n\n"


def build_app(web: WebSwiftlet, console: Console, context: SwiftletContext, *, admin_group: str) -> Starlette:
    """The Starlette application serving ``web``'s pages (see the module header)."""
    router = context.router_name
    collector = UsageCollector(router, context.management)

    async def map_page(request: Request) -> Response:
        body = (
            f'<svg id="map" data-router="{html.escape(router)}" width="760" height="560" '
            'viewBox="0 0 760 560"></svg><p id="status">loading…</p><h2>Links</h2>'
            '<table id="links"><thead><tr><th>link</th><th>state</th><th>since</th><th>error</th>'
            "<th>msg/s, last hour</th></tr></thead><tbody></tbody></table><h2>Routers</h2>"
            '<table id="routers"><thead><tr><th>router</th><th>state</th><th>messages</th>'
            "<th>messages, last hour</th></tr></thead><tbody></tbody></table>"
            f"<script>{MAP_SCRIPT}</script>"
        )
        return page(router, f"Network map seen from {router}", body)

    async def map_json(request: Request) -> Response:
        return JSONResponse(web.map_json())

    async def events(request: Request) -> Response:
        return StreamingResponse(MapEvents(web), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def metrics(request: Request) -> Response:
        # The tree is read here, in the router's thread; families and text are made in a
        # worker thread, so that a large exposition does not hold up the router's event loop.
        text = await trio.to_thread.run_sync(generate_latest, collector.snapshot())
        return Response(text, media_type=CONTENT_TYPE_PLAIN_0_0_4)

    routes = [
        Route("/", map_page),
        Route("/map.json", map_json),
        Route("/events", events),
        Route("/metrics", metrics),
        Route("/routers/{name}", partial(router_page, console)),
        Route("/routers/{name}/queues", partial(queues_page, console)),
        Route("/routers/{name}/queues/{queue}", partial(queue_page, console)),
        *(Route("/routers/{name}" + path, partial(handler, console)) for path, handler in AREA_PAGES.items()),
        Route("/routers/{name}/act", partial(act, console), methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(BasicAuth, web=web, admin_group=admin_group)])
