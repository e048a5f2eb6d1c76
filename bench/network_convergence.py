"""Route convergence of whole networks of real routers, on sockets, in one process. Prints its figures.

    .venv/bin/python bench/network_convergence.py [--ring 20] [--mesh 10] [--hop-limit 3]

The socket counterpart of bench/route_convergence.py (same topologies, same failed link:
``links[len(links) // 2]``). Every router is a real :class:`Router` in this trio process
with one swiftlet, ``sys$routing`` (startorder ``sys$routing`` alone: routing part 1 needs no
store or queue manager), its routing listener on 127.0.0.1 port 0; links are connectors
added through the management tree (as tests/harness/network.py does), ``retry-time`` 1000 ms. The
link that fails runs through a :class:`FaultProxy` (tests/harness/faultproxy.py).

For a ring of ``--ring`` routers (hop limit ``--hop-limit`` and unlimited) and a full mesh
of ``--mesh`` (``--hop-limit``), three phases: (1) all connectors are added to running
routers; (2) the proxied link fails (``refuse(True)`` then ``cut()``: both ends see the
socket close, the connector's retries are refused); (3) it recovers (``heal()``: the
connector's next retry, at most ``retry-time`` later, gets through). Per phase:

- ``table``: seconds from the action until every router's table (active destinations with
  their shortest hop counts, ``tests/harness/network.py``'s ``table``) equals the expected one and
  stays so (polled every 5 ms; the time of the last poll on which it turned right).
  Expected: a breadth-first search over the links up, a destination kept if it lies within
  the hop limit (a route of h hops is passed on only while h < limit, so a router holds the
  routes of at most ``limit`` hops).
- ``routes``: seconds until the last change of any router's routes (every route, not only
  the shortest: the last poll that found a ``RouteAdded``/``RouteRemoved`` on some router's
  bus; the buses are drained at each poll, not by follower tasks that fall behind a busy loop).
- ``quiet``: seconds until the network-wide ``announcements-sent``/``-received`` totals
  (``/sys$routing/usage``) last changed; the phase ends after 250 ms of quiet with the
  tables right. With a recovery, also ``link``: seconds from ``heal()`` to the connector's
  link becoming operational (the retry delay), which ``table``/``routes``/``quiet`` include.
- ``sent``/``recv``: announcements (ADD and REMOVE) sent and received network-wide in the
  phase (differences of the usage totals), and ``sim``: what the pure simulation
  (tests/harness/routesim.py, as in bench/route_convergence.py) sends for the same phase.
- ``check``: every router's full set of routes against ``reference_routes`` (routesim).

Times are wall-clock (``trio.current_time``) at the poll that saw the change, so late by up
to one poll interval plus however long the routers kept the one thread busy before the poll
ran (the routers' work, the proxy's and the polling's share one core). The RSS (``VmRSS``) is printed with
each network's routers still running and at the end; ``VmHWM`` is the peak. Nothing is
asserted; a phase that does not converge within 30 s says so and ends that network.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness

from martinet.kernel import Event  # noqa: E402
from martinet.swiftlets.routing.api import LinkState, LinkStateChanged, RouteAdded, RouteRemoved  # noqa: E402

from tests.harness.faultproxy import FaultProxy  # noqa: E402
from tests.harness.network import Network, routing_config  # noqa: E402
from tests.harness.routesim import Network as SimNetwork  # noqa: E402
from tests.harness.routesim import mesh, reference_routes, ring  # noqa: E402

STARTORDER = ("sys$routing",)
POLL = 0.005  # s between two looks at the tables and counters
QUIET = 0.25  # s without a route change or an announcement after the tables are right: the phase is over
TIMEOUT = 30.0  # s a phase may take


def memory() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    text = Path("/proc/self/status").read_text()
    return tuple(int(re.search(rf"{key}:\s+(\d+)", text).group(1)) / 1024 for key in ("VmRSS", "VmHWM"))


def expected_tables(names: list[str], links: set[frozenset[str]], limit: int) -> dict[str, dict[str, int]]:
    """Router -> {destination: shortest hop count} for the destinations within the hop limit."""
    neighbours: dict[str, set[str]] = {name: set() for name in names}
    for link in links:
        a, b = tuple(link)
        neighbours[a].add(b)
        neighbours[b].add(a)
    tables = {}
    for origin in names:
        distance = {origin: 0}
        queue = deque([origin])
        while queue:
            here = queue.popleft()
            if limit > 0 and distance[here] >= limit:
                continue
            for nxt in neighbours[here]:
                if nxt not in distance:
                    distance[nxt] = distance[here] + 1
                    queue.append(nxt)
        del distance[origin]
        tables[origin] = distance
    return tables


def simulated_sends(names: list[str], links: list[tuple[str, str]], failed: tuple[str, str], limit: int) -> list[int]:
    """Announcements the pure simulation sends in the three phases (routesim, seed 1)."""
    sim = SimNetwork(names, hop_limits=limit, rng=random.Random(1))
    counts = []
    for action in (
        lambda: [sim.link_up(a, b) for a, b in links],
        lambda: sim.link_down(*failed),
        lambda: sim.link_up(*failed),
    ):
        before = sim.sent
        action()
        sim.settle()
        counts.append(sim.sent - before)
    return counts


class Watch:
    """Every router's bus, drained at each poll (no follower task that could fall behind): whether
    a route changed since the last poll, and whether the proxied connector's link became
    operational."""

    def __init__(self, routers: dict, connector_router: str, connector: str):
        self._subscriptions = [
            (name, router.bus.subscribe(Event, max_buffer=1_000_000)) for name, router in routers.items()
        ]
        self._router, self._link = connector_router, f"connector:{connector}"

    def drain(self) -> tuple[int, bool]:
        """(route changes, whether the proxied link became operational) since the last call."""
        changes, link_up = 0, False
        for name, subscription in self._subscriptions:
            while True:
                try:
                    event = subscription.receive_nowait()
                except trio.WouldBlock:
                    break
                if isinstance(event, (RouteAdded, RouteRemoved)):
                    changes += 1
                elif (
                    isinstance(event, LinkStateChanged)
                    and name == self._router
                    and event.link == self._link
                    and event.state is LinkState.OPERATIONAL
                ):
                    link_up = True
        return changes, link_up


def totals(net: Network) -> tuple[int, int]:
    """Network-wide (announcements-sent, announcements-received) from every router's usage."""
    sent = received = 0
    for router in net.routers.values():
        usage = router.management.resolve("/sys$routing/usage").properties()
        sent += usage["announcements-sent"]
        received += usage["announcements-received"]
    return sent, received


async def phase(
    net: Network, watch: Watch, names: list[str], links: set[frozenset[str]], limit: int, action: Callable[[], None]
) -> dict | None:
    """Run ``action`` and wait until the network is right and quiet; the figures, or None
    (printed why) if it does not converge within TIMEOUT."""
    expected = expected_tables(names, links, limit)
    sent0, received0 = counts = totals(net)
    watch.drain()
    start = trio.current_time()
    action()
    right_since: float | None = None
    last_count_change = last_route_change = start
    link_up: float | None = None
    while True:
        await trio.sleep(POLL)
        now = trio.current_time()
        changes, up = watch.drain()
        if changes:
            last_route_change = now
        if up:
            link_up = now
        right = all(net.table(name) == expected[name] for name in names)
        if not right:
            right_since = None
        elif right_since is None:
            right_since = now
        current = totals(net)
        if current != counts:
            counts, last_count_change = current, now
        if right and now - max(last_count_change, last_route_change) >= QUIET:
            break
        if now - start > TIMEOUT:
            wrong = {name: net.table(name) for name in names if net.table(name) != expected[name]}
            print(
                f"    NOT CONVERGED in {TIMEOUT:.0f} s: {len(wrong)} routers differ, e.g. "
                f"{dict(list(wrong.items())[:2])}; expected {dict((n, expected[n]) for n in list(wrong)[:2])}"
            )
            return None
    reference = reference_routes(names, links, dict.fromkeys(names, limit), {})
    routing = {name: net.routers[name].swiftlet("sys$routing") for name in names}
    held = {name: frozenset(p for row in routing[name].destinations() for p in row.routes) for name in names}
    wrong = [name for name in names if held[name] != reference[name]]
    return {
        "table": right_since - start,
        "routes": last_route_change - start,
        "quiet": last_count_change - start,
        "link": None if link_up is None else link_up - start,
        "sent": counts[0] - sent0,
        "received": counts[1] - received0,
        "routes held": sum(len(routes) for routes in held.values()),
        "check": "ok" if not wrong else f"{len(wrong)} routers differ from the reference",
    }


async def run(folder: Path, label: str, names: list[str], links: list[tuple[str, str]], limit: int) -> None:
    failed = links[len(links) // 2]
    simulated = simulated_sends(names, links, failed, limit)
    up = {frozenset(link) for link in links}
    print(
        f"{label}, hop limit {limit}: {len(names)} routers, {len(links)} links, "
        f"link {failed[0]}-{failed[1]} fails (through a FaultProxy)",
        flush=True,
    )
    print(
        f"  {'phase':<14} {'table s':>8} {'routes s':>9} {'quiet s':>8} {'link s':>7} {'sent':>7} {'recv':>7} "
        f"{'sim':>7} {'routes':>7}  check"
    )
    async with trio.open_nursery() as nursery:
        net = Network(nursery, folder / label.replace(" ", "-"))
        for name in names:
            await net.start(
                net.config(
                    name,
                    startorder=STARTORDER,
                    swiftlets={"sys$routing": routing_config(route_announce_hop_limit=limit)},
                )
            )
        proxy = FaultProxy("127.0.0.1", net.routing_port(failed[1]))
        await nursery.start(proxy.run)
        watch = Watch(net.routers, failed[0], failed[1])

        def connect_all() -> None:
            for a, b in links:
                port = proxy.port if (a, b) == failed else net.routing_port(b)
                net.routers[a].management.add(
                    "/sys$routing/connectors", b, {"hostname": "127.0.0.1", "port": str(port), "retry-time": "1000"}
                )

        def fail() -> None:
            proxy.refuse(True)
            proxy.cut()

        phases = [
            ("all links up", up, connect_all),
            ("link fails", up - {frozenset(failed)}, fail),
            ("link recovers", up, proxy.heal),
        ]
        try:
            for (title, links_up, action), sim in zip(phases, simulated, strict=True):
                figures = await phase(net, watch, names, links_up, limit, action)
                if figures is None:
                    break
                link = "" if figures["link"] is None else f"{figures['link']:.3f}"
                print(
                    f"  {title:<14} {figures['table']:>8.3f} {figures['routes']:>9.3f} {figures['quiet']:>8.3f} "
                    f"{link:>7} {figures['sent']:>7,} {figures['received']:>7,} {sim:>7,} "
                    f"{figures['routes held']:>7,}  {figures['check']}",
                    flush=True,
                )
            rss, _ = memory()
            print(f"  RSS with these {len(names)} routers running: {rss:.1f} MiB", flush=True)
        finally:
            with trio.CancelScope(shield=True):
                await net.stop_all()
            nursery.cancel_scope.cancel()  # the proxy


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="network-convergence-") as folder:
        names, links = ring(args.ring)
        limits = [args.hop_limit] + ([-1] if args.hop_limit != -1 else [])
        for limit in limits:
            await run(Path(folder), f"ring of {args.ring}", names, links, limit)
        names, links = mesh(args.mesh)
        await run(Path(folder), f"mesh of {args.mesh}", names, links, args.hop_limit)
    rss, peak = memory()
    print(f"process RSS at the end (every router stopped): {rss:.1f} MiB; peak (VmHWM) {peak:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ring", type=int, default=20, help="routers in the ring (default 20)")
    parser.add_argument("--mesh", type=int, default=10, help="routers in the full mesh (default 10)")
    parser.add_argument(
        "--hop-limit",
        type=int,
        default=3,
        help="route-announce-hop-limit (default 3); the ring also runs with -1 (unlimited)",
    )
    logging.getLogger("martinet").setLevel(logging.ERROR)  # the refused retries of phase 2 log warnings
    trio.run(main, parser.parse_args())
