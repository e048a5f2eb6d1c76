"""A soak: routed persistent load through three routers for a long time, and whether anything grows.

Starts a chain a → b → c of ``martinet run`` processes (tests/harness/netharness.py: a fault proxy on
each link, XA links, stores ``sync="normal"``). Producers on a send numbered persistent
messages to ``soak@c`` at ``--rate`` in all, each stamped with its send time; a consumer on c
takes them (client acknowledgement) and measures each one's send-to-receive latency. Every
``--flap`` seconds one link is cut (a, b in turn; the connector dials again). Every
``--sample`` seconds it prints one line: each router's RSS and open file descriptors, each
store folder's size, the backlog (accepted by the producers and not yet received), and the
latency's p50 and p99 over the interval. At the end: every accepted message must have arrived
exactly once, and a verdict per series: flat, or grew (its mean over the last third of the
run above its mean over the second third by more than 20 % and a floor: the first third is
left out, as the warm-up of caches and pools).

    .venv/bin/python bench/soak.py --minutes 60 --rate 1000 --plot docs/images/soak.png

``--rate`` is a fixed rate rather than a share of capacity: a chain's persistent capacity
(``bench/routing_bench.py``) is beyond what the Python producers sustain here, and on a
2-core machine half of it would leave no CPU to the clients. What a soak looks for is
growth, which a steady rate shows as well.
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

from martinet.messaging.client import (  # noqa: E402
    AckMode,
    ConnectionLost,
    DeliveryMode,
    JMSError,
    Queue,
    TextMessage,
    connect,
)

from tests.harness.netharness import TOPOLOGIES, open_network  # noqa: E402

RETRY = 0.5
SERIES = ("rss-mib", "fds", "store-mib", "backlog", "p50-ms", "p99-ms")
FLOORS = {"rss-mib": 8.0, "fds": 5.0, "store-mib": 8.0, "backlog": 200.0, "p50-ms": 20.0, "p99-ms": 50.0}


class Traffic:
    """The producers' accepted seqs and the consumer's received ones, with latencies."""

    def __init__(self) -> None:
        self.accepted: set[tuple[int, int]] = set()
        self.in_doubt: set[tuple[int, int]] = set()
        self.received: list[tuple[int, int]] = []
        self.latencies: list[float] = []  # since the last sample, seconds

    async def produce(self, url: str, ident: int, rate: float, stop: trio.Event) -> None:
        seq, interval = 0, 1 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                async with connect(url) as connection, connection.session() as session:
                    producer = await session.producer(Queue("soak@c"), delivery_mode=DeliveryMode.PERSISTENT)
                    while not stop.is_set():
                        seq += 1
                        message = TextMessage(f"{ident}:{seq}", properties={"sent": time.time()})
                        try:
                            await producer.send(message)
                        except ConnectionLost:
                            self.in_doubt.add((ident, seq))
                            raise
                        self.accepted.add((ident, seq))
                        next_at += interval
                        await trio.sleep(max(0.0, next_at - time.monotonic()))
            except JMSError:  # (ConnectionLost too) the router is away for a moment
                await trio.sleep(RETRY)
                next_at = time.monotonic()

    async def consume(self, url: str, stop: trio.Event) -> None:
        while not stop.is_set():
            try:
                async with connect(url) as connection:
                    session = await connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
                    consumer = await session.consumer(Queue("soak"))
                    while not stop.is_set():
                        message = await consumer.receive(0.5)
                        if message is None:
                            continue
                        ident, seq = message.text.split(":")
                        self.received.append((int(ident), int(seq)))
                        self.latencies.append(time.time() - message.properties["sent"])
                        await message.acknowledge()
            except JMSError:
                await trio.sleep(RETRY)


def _rss_and_fds(pid: int) -> tuple[float, int]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return rss / 1024, len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except (OSError, StopIteration):
        return 0.0, 0


def _size_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000


def verdict(rows: list[dict[str, float]]) -> dict[str, str]:
    """Per series: "flat", or "grew A → B" (the means of the second and last thirds)."""
    third = max(1, len(rows) // 3)
    middle, last = rows[third : 2 * third] or rows[:1], rows[-third:]
    result = {}
    for name in SERIES:
        before, after = statistics.mean(r[name] for r in middle), statistics.mean(r[name] for r in last)
        grew = after > before * 1.2 and after - before > FLOORS[name]
        result[name] = f"grew {before:.1f} → {after:.1f}" if grew else f"flat ({before:.1f} → {after:.1f})"
    return result


async def soak(args: argparse.Namespace, folder: Path) -> int:
    traffic, rows = Traffic(), []
    topology = TOPOLOGIES["chain"]
    async with open_network(folder, topology) as network:
        stop_producing, stop_consuming = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(traffic.consume, network.url("c"), stop_consuming)
            for ident in range(args.producers):
                nursery.start_soon(traffic.produce, network.url("a"), ident, args.rate / args.producers, stop_producing)
            started = time.monotonic()
            next_flap, flaps = args.flap, 0
            print("minute  " + "  ".join(f"{name:>10}" for name in SERIES), flush=True)
            while time.monotonic() - started < args.minutes * 60:
                await trio.sleep(args.sample)
                if time.monotonic() - started >= next_flap:
                    link = topology.links[flaps % len(topology.links)]
                    network.proxies[link].cut()
                    flaps, next_flap = flaps + 1, next_flap + args.flap
                routers = [_rss_and_fds(network.routers[name].proc.pid) for name in topology.routers]
                latencies, traffic.latencies = traffic.latencies, []
                row = {
                    "minute": (time.monotonic() - started) / 60,
                    "rss-mib": sum(rss for rss, _ in routers),
                    "fds": sum(fds for _, fds in routers),
                    "store-mib": sum(_size_mib(network.store(name)) for name in topology.routers),
                    "backlog": len(traffic.accepted) - len(set(traffic.received)),
                    "p50-ms": _percentile(latencies, 0.5),
                    "p99-ms": _percentile(latencies, 0.99),
                }
                rows.append(row)
                print(f"{row['minute']:6.1f}  " + "  ".join(f"{row[name]:10.1f}" for name in SERIES), flush=True)
            stop_producing.set()
            with trio.move_on_after(120):
                while not traffic.accepted <= set(traffic.received):
                    await trio.sleep(0.5)
            await trio.sleep(2)  # late duplicates
            stop_consuming.set()
    received = set(traffic.received)
    lost = traffic.accepted - received
    duplicated = len(traffic.received) - len(received)
    stray = received - traffic.accepted - traffic.in_doubt
    print(
        f"\n{args.minutes:g} min at {args.rate:g} msgs/s, link flap every {args.flap:g} s ({flaps} flaps): "
        f"{len(traffic.accepted)} accepted, {len(traffic.received)} received, {len(lost)} lost, "
        f"{duplicated} duplicated, {len(traffic.in_doubt)} in doubt ({len(traffic.in_doubt & received)} arrived), "
        f"{len(stray)} unexplained"
    )
    for name, text in verdict(rows).items():
        print(f"{name:>10}: {text}")
    if args.plot:
        _plot(rows, Path(args.plot))
    return 1 if lost or duplicated or stray else 0


def _plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(SERIES), 1, figsize=(8, 2 * len(SERIES)), sharex=True)
    minutes = [row["minute"] for row in rows]
    for axis, name in zip(axes, SERIES, strict=True):
        axis.plot(minutes, [row[name] for row in rows])
        axis.set_ylabel(name)
        axis.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    print(f"plot: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages a second, all producers together")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--flap", type=float, default=300.0, help="seconds between two link cuts")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between two samples")
    parser.add_argument("--plot", help="write the series as a PNG here (needs matplotlib: the spark extra)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="martinet-soak-") as folder:
        return trio.run(soak, args, Path(folder))


if __name__ == "__main__":
    sys.exit(main())
