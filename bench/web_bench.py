"""What ``sys$web`` costs the router it runs on: both run in the router's trio thread.

1. The network map's rebuild (:func:`build_map`, pure): µs per build for ``N`` routers on a
   ring, seen from one of them (two routes to most destinations, path vectors up to N/2
   hops), the previous map given as the swiftlet gives it.
2. A ``/metrics`` scrape over HTTP of a router (in this process) with ``Q`` queues: the
   median and the worst of 20 scrapes, the size of the text, and the longest stall of the
   router's event loop meanwhile (a task that sleeps 1 ms at a time measures how late it
   wakes): the collector walks the usage tree in the router's thread, the text is written
   in a worker thread.
3. A crawl of the network through ``sys$mgmt`` (what the map asks every
   ``map-refresh-interval``): ``C`` routers on a ring in this process, crawled from one with
   ``map-concurrency`` 8: the median and worst of 10 crawls (2 requests per router).

4. The sparklines' history (:class:`.history.History`): a router with ``H`` queues (three
   values each) sampled for a full hour of points: the memory its series hold (tracemalloc)
   and the time one sample takes in the router's thread (once every 10 s).

    .venv/bin/python bench/web_bench.py [--routers 10 100 300] [--queues 10 1000 5000] [--crawl 5 10]
        [--history 100 1000 5000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness

from martinet.kernel import Usage, UsageList  # noqa: E402
from martinet.swiftlets.mgmt.api import crawl  # noqa: E402
from martinet.swiftlets.web.api import LinkView, build_map  # noqa: E402
from martinet.swiftlets.web.config import WebConfig  # noqa: E402
from martinet.swiftlets.web.history import POINTS, History  # noqa: E402

from tests.harness.network import ROUTING_STACK, Network, routing_config  # noqa: E402


def ring_routes(count: int) -> dict[str, list[tuple[str, ...]]]:
    """Router r0's routes on a ring r0…r{count-1}: both ways round to every other router."""
    names = [f"r{i}" for i in range(count)]
    return {names[i]: [tuple(names[1 : i + 1]), tuple(reversed(names[i:]))] for i in range(1, count)}


def bench_map(count: int) -> None:
    routes = ring_routes(count)
    links = {peer: LinkView(peer=peer, state="operational", since=0.0) for peer in ("r1", f"r{count - 1}")}
    previous = build_map("r0", links, routes, None, now=1.0)
    builds, began = 0, time.perf_counter()
    while time.perf_counter() - began < 1.0:
        previous = build_map("r0", links, routes, previous, now=2.0)
        builds += 1
    per = 1e6 * (time.perf_counter() - began) / builds
    print(f"map of a ring of {count:4d} routers ({len(previous.edges)} links): {per:10.1f} µs per rebuild")


async def bench_metrics(queues: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with trio.open_nursery() as nursery:
            network = Network(nursery, Path(folder))
            router = await network.start(
                network.config(
                    "a",
                    startorder=(*ROUTING_STACK, "sys$web"),
                    swiftlets={"sys$routing": routing_config(), "sys$web": WebConfig(enabled=True, port=0)},
                )
            )
            for n in range(queues):
                router.management.add("/sys$queuemanager/queues", f"q{n}")
            url = router.swiftlet("sys$web").url + "/metrics"
            stalls = [0.0]

            async def watch() -> None:
                while True:
                    before = trio.current_time()
                    await trio.sleep(0.001)
                    stalls[0] = max(stalls[0], trio.current_time() - before - 0.001)

            nursery.start_soon(watch)
            await trio.sleep(0.2)
            stalls[0] = 0.0

            def scrape() -> tuple[float, int]:
                began = time.perf_counter()
                with urllib.request.urlopen(url, timeout=60) as response:
                    size = len(response.read())
                return time.perf_counter() - began, size

            times, size = [], 0
            for _ in range(20):
                seconds, size = await trio.to_thread.run_sync(scrape)
                times.append(seconds)
            print(
                f"/metrics with {queues:5d} queues: median {1e3 * statistics.median(times):7.1f} ms, "
                f"worst {1e3 * max(times):7.1f} ms, {size / 1024:6.0f} KiB; longest event-loop stall "
                f"{1e3 * stalls[0]:6.1f} ms"
            )
            await network.stop_all()
            nursery.cancel_scope.cancel()


async def bench_crawl(count: int) -> None:
    names = [f"r{i}" for i in range(count)]
    with tempfile.TemporaryDirectory() as folder:
        async with trio.open_nursery() as nursery:
            network = Network(nursery, Path(folder))
            for name in names:
                web = WebConfig(enabled=name == "r0", port=0, map_refresh_interval=3600.0)
                await network.start(
                    network.config(
                        name,
                        startorder=(*ROUTING_STACK, "sys$mgmt", "sys$web"),
                        swiftlets={"sys$web": web, "sys$routing": routing_config(route_announce_hop_limit=count)},
                    )
                )
            for i, name in enumerate(names):
                network.connect(name, names[(i + 1) % count])
            await network.settle({"r0": {name: min(i, count - i) for i, name in enumerate(names) if i}}, timeout=120)
            web = network.routers["r0"].swiftlet("sys$web")
            times = []
            for _ in range(10):
                began = time.perf_counter()
                found = await crawl(web.ask, "r0", concurrency=8)
                times.append(time.perf_counter() - began)
            assert len(found.links) == count and not found.unreachable
            print(
                f"crawl of a ring of {count:3d} routers: median {1e3 * statistics.median(times):7.1f} ms, "
                f"worst {1e3 * max(times):7.1f} ms"
            )
            await network.stop_all()
            nursery.cancel_scope.cancel()


async def bench_history(queues: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with trio.open_nursery() as nursery:
            network = Network(nursery, Path(folder))
            router = await network.start(network.config("a", startorder=ROUTING_STACK))
            for n in range(queues):
                router.management.add("/sys$queuemanager/queues", f"q{n}")
            history = History(router.management)
            published = Usage("/sys$web/usage")
            history.publish(published)  # as sys$web does: the series in usage, for other routers
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            times = []
            for _ in range(POINTS + 1):  # no await: nothing else runs meanwhile
                began = time.perf_counter()
                history.sample()
                times.append(time.perf_counter() - began)
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            series = sum(
                len(history.series("/sys$queuemanager/usage/queues", f"q{n}", "messages")) > 0 for n in range(queues)
            )
            # what another router's page asks for: every queue's hour, a point a minute, as JSON
            began = time.perf_counter()
            listed = published.children["history-queues"]
            assert isinstance(listed, UsageList)
            reply = json.dumps({name: dict(entry.properties()) for name, entry in listed.children.items()})
            read = time.perf_counter() - began
            print(
                f"history of {queues:5d} queues ({series} followed, {POINTS} points): {held / 2**20:6.2f} MiB "
                f"({held / max(series, 1) / 1024:4.1f} KiB a queue); one sample median "
                f"{1e3 * statistics.median(times):6.1f} ms, worst {1e3 * max(times):6.1f} ms; "
                f"read by another router {1e3 * read:6.1f} ms, {len(reply) / 1024:7.1f} KiB"
            )
            await network.stop_all()
            nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", type=int, nargs="*", default=[10, 100, 300])
    parser.add_argument("--queues", type=int, nargs="*", default=[10, 1000, 5000])
    parser.add_argument("--crawl", type=int, nargs="*", default=[5, 10])
    parser.add_argument("--history", type=int, nargs="*", default=[100, 1000, 5000])
    args = parser.parse_args()
    for count in args.routers:
        bench_map(count)
    for queues in args.queues:
        trio.run(bench_metrics, queues)
    for count in args.crawl:
        trio.run(bench_crawl, count)
    for queues in args.history:
        trio.run(bench_history, queues)


if __name__ == "__main__":
    main()
