"""``sys$routing``: router-to-router links, route exchange and the routing table.

Routers connect through routing listeners and connectors; each link passes the stages of
our protocol (``docs/routing-protocol.md``: protocol select, connect with admission, mutual
HMAC authentication, delivery with keepalives) and then carries route announcements, from
which every router learns which routers it can reach over which neighbour (a path vector
with a hop limit and per-neighbour filters). Each known router ``R`` is addressable: the
queue manager redirects ``q@R`` to the routing queue ``rt$R`` (:mod:`.api`, Addressing);
part 2 moves messages from there over these links.

Layout: :mod:`.api` (the routing table as other swiftlets see it, and its bus events),
:mod:`.config`, :mod:`.wire` (the frame codec, sans-IO), :mod:`.stages` (the link's stage
machine, sans-IO, both roles), :mod:`.exchange` (the route exchanger and table, a pure
object), :mod:`.links` (a link on a socket), :mod:`.transfer` (messages between routers),
:mod:`.bridges` (queue bridges), :mod:`.swiftlet` (listeners, connectors, admission, usage)
and :mod:`.jobs` (the Routing Connector job offered to ``sys$scheduler``).
"""

from __future__ import annotations

from martinet.kernel import PoolSpec, SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import RoutingConfig
    from .swiftlet import RoutingSwiftlet

    return [
        SwiftletSpec(
            name="sys$routing",
            description="Router-to-router links, route exchange and the routing table.",
            config=RoutingConfig,
            factory=RoutingSwiftlet,
            pools=(  # SwiftMQ's routing pools; see docs/routing.md for which run what
                PoolSpec(
                    "routing.connection.mgr",
                    "SwiftMQ's connection manager pool (max 1). Admission and "
                    "connect/disconnect work run serially in the router's event loop, so it holds no jobs.",
                    max_concurrency=1,
                ),
                PoolSpec(
                    "routing.exchanger",
                    "SwiftMQ's route exchanger pool (max 1). Route exchange runs "
                    "serially in the router's event loop, so it holds no jobs.",
                    max_concurrency=1,
                ),
                PoolSpec(
                    "routing.scheduler",
                    "Routing schedulers: one per destination router, packing messages "
                    "from rt$<router> into transactions (routing part 2).",
                    max_concurrency=3,
                ),
                PoolSpec(
                    "routing.service",
                    "Connection service stages, the delivery stage above all (routing part 2).",
                    max_concurrency=3,
                ),
                PoolSpec(
                    "routing.throttle",
                    "SwiftMQ's commit throttle pool. Inbound flow control "
                    "waits in each link's worker instead (answers must keep their order), so it holds "
                    "no jobs.",
                    max_concurrency=3,
                ),
            ),
        )
    ]


@hookimpl
def martinet_scheduler_jobs() -> list:
    from .jobs import ROUTING_JOBS

    return [ROUTING_JOBS]  # the Routing Connector, see .jobs
