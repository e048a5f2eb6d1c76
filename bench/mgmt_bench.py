"""Management requests over messaging: latency and throughput of ``get`` on the router connected
to and on one two hops away, and how long ``map`` takes. Prints its figures.

    .venv/bin/python bench/mgmt_bench.py [--requests 500] [--parallel 8]

Three routers in this process (tests/harness/network.py: a - b - c, real sockets on loopback), one
``AdminClient`` connected to a. Per target: ``--requests`` sequential ``get /usage`` (median
and 99th percentile round trip), then the same number with ``--parallel`` in flight
(requests per second). Then ``map`` (crawl) from a, ten times (median). Wall-clock figures on
a shared machine: compare runs of the same build, not across machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness

from martinet.swiftlets.mgmt.admin import crawl  # noqa: E402
from martinet.swiftlets.mgmt.client import AdminClient  # noqa: E402

from tests.harness.network import ROUTING_STACK, Network, routing_config  # noqa: E402


async def main(requests: int, parallel: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with trio.open_nursery() as nursery:
            network = Network(nursery, Path(folder))
            for name in ("a", "b", "c"):
                await network.start(
                    network.config(
                        name, startorder=(*ROUTING_STACK, "sys$mgmt"), swiftlets={"sys$routing": routing_config()}
                    )
                )
            network.connect("a", "b")
            network.connect("b", "c")
            await network.settle({"a": {"b": 1, "c": 2}})
            async with AdminClient.open(network.url("a")) as admin:
                for target, label in (("a", "local (a)"), ("c", "two hops (a -> c)")):
                    times = []
                    for _ in range(requests):
                        start = time.perf_counter()
                        await admin.call(target, "get", path="/usage")
                        times.append(time.perf_counter() - start)
                    times.sort()
                    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
                    start = time.perf_counter()
                    async with trio.open_nursery() as workers:
                        for _ in range(parallel):
                            workers.start_soon(_requests, admin, target, requests // parallel)
                    rate = (requests // parallel * parallel) / (time.perf_counter() - start)
                    print(
                        f"{label:20s} get /usage: median {statistics.median(times) * 1000:6.2f} ms, "
                        f"p99 {p99 * 1000:6.2f} ms; {parallel} in flight: {rate:7.0f} requests/s"
                    )
                maps = []
                for _ in range(10):
                    start = time.perf_counter()
                    await crawl(admin)
                    maps.append(time.perf_counter() - start)
                print(f"{'map from a':20s} 3 routers, 2 links: median {statistics.median(maps) * 1000:6.2f} ms")
            await network.stop_all()


async def _requests(admin: AdminClient, target: str, count: int) -> None:
    for _ in range(count):
        await admin.call(target, "get", path="/usage")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--parallel", type=int, default=8)
    options = parser.parse_args()
    trio.run(main, options.requests, options.parallel)
