"""``sys$web``: the web console (live network map, every router's pages and the changes an
operator makes there) and Prometheus ``/metrics``.

An optional HTTP(S) listener (off by default, loopback unless authentication is on) served
by Starlette on Hypercorn's trio worker. Layout: :mod:`.api` (the :class:`~.api.Web`
protocol and the map's types), :mod:`.config`, :mod:`.netmap` (the map from one router's
view: pure), :mod:`.traffic` (the map's rates and backlogs), :mod:`.history` (the last hour
of rates and backlogs, sparklines), :mod:`.metrics` (the usage tree as a Prometheus
collector), :mod:`.auth` (who uses it, cross-site checks), :mod:`.console` (reads of any
router, changes through ``sys$mgmt`` as the user), :mod:`.render` (HTML), :mod:`.pages`,
:mod:`.queues` and :mod:`.actions` (the pages and the changes), :mod:`.app` (the routes;
``static/map.js`` draws the map) and :mod:`.swiftlet` (the listener and the map kept
current from ``sys$routing``'s events, and other routers' links crawled through
``sys$mgmt`` when it runs). Start it last, after the swiftlets it shows.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import WebConfig
    from .swiftlet import WebSwiftlet

    return [
        SwiftletSpec(
            name="sys$web",
            description="Web console (network map, router pages, changes through sys$mgmt) and "
            "Prometheus /metrics over HTTP(S).",
            config=WebConfig,
            factory=WebSwiftlet,
        )
    ]
