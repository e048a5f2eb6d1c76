"""``sys$web``: the web view (live network map, router pages) and Prometheus ``/metrics``.

An optional HTTP listener (off by default, loopback unless authentication is on) served by
Starlette on Hypercorn's trio worker. Layout: :mod:`.api` (the :class:`~.api.Web` protocol
and the map's types), :mod:`.config`, :mod:`.netmap` (the map from one router's view: pure),
:mod:`.metrics` (the usage tree as a Prometheus collector), :mod:`.app` (routes and pages,
``static/map.js`` draws the map) and :mod:`.swiftlet` (the listener and the map kept current
from ``sys$routing``'s events, and other routers' links crawled through ``sys$mgmt`` when it
runs). Start it last, after the swiftlets it shows.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl

from .config import WebConfig
from .swiftlet import WebSwiftlet


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$web",
            description="Web view (network map, router pages) and Prometheus /metrics over HTTP.",
            config=WebConfig,
            factory=WebSwiftlet,
        )
    ]
