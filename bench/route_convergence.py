"""Route exchange convergence, in-process and without sockets. Prints its figures.

    .venv/bin/python bench/route_convergence.py [--seed N] [--size-ring 20] [--size-mesh 10]

Each network is the simulator of tests/harness/routesim.py: one pure ``RouteExchanger`` per router,
one FIFO per directed link, messages delivered in random order across links. For a ring of
20 (hop limit 3 and unlimited) and a full mesh of 10 (hop limit 3), three phases, each run
until nothing is in flight: all links come up; one link fails; it recovers. Per phase:
announcements sent (ADD/REMOVE), the routes held in the whole network afterwards, and the
CPU time of the simulation (``time.process_time``: the exchangers' work plus the
simulator's, no I/O). Every phase ends checked against the reference computation.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness

from tests.harness.routesim import Network, mesh, reference_routes, ring  # noqa: E402


def run(label: str, names: list[str], links: list[tuple[str, str]], limit: int, seed: int) -> None:
    net = Network(names, hop_limits=limit, rng=random.Random(seed))
    failed = links[len(links) // 2]

    def all_up() -> None:
        for a, b in links:
            net.link_up(a, b)

    phases = [
        ("all links up", all_up),
        (f"link {failed[0]}-{failed[1]} fails", lambda: net.link_down(*failed)),
        (f"link {failed[0]}-{failed[1]} recovers", lambda: net.link_up(*failed)),
    ]
    for phase, action in phases:
        adds, removes = net.adds, net.removes
        begin = time.process_time()
        action()
        net.settle()
        elapsed = time.process_time() - begin
        routes = sum(len(net.routes(name)) for name in names)
        expected = reference_routes(names, net.links, dict.fromkeys(names, limit), {})
        assert all(net.routes(name) == expected[name] for name in names), f"{label}: {phase}: not the reference"
        print(
            f"{label}, hop limit {limit:>2}, {phase:<22}: {net.adds - adds:>6,} ADD {net.removes - removes:>6,} "
            f"REMOVE; {routes:>6,} routes in the network; {elapsed * 1000:>8.1f} ms CPU"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--size-ring", type=int, default=20)
    parser.add_argument("--size-mesh", type=int, default=10)
    args = parser.parse_args()
    names, links = ring(args.size_ring)
    run(f"ring of {args.size_ring}", names, links, 3, args.seed)
    run(f"ring of {args.size_ring}", names, links, -1, args.seed)
    names, links = mesh(args.size_mesh)
    run(f"mesh of {args.size_mesh}", names, links, 3, args.seed)


if __name__ == "__main__":
    main()
