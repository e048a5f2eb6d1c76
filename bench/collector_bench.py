"""How many routers x queues one ``sys$spark`` collector holds. Prints its figures.

    .venv/bin/python bench/collector_bench.py [--routers 10,50,100] [--queues 10,100] [--interval 1000]
        [--seconds 30] [--warmup 8] [--busy 1.0] [--format parquet] [--publishers 2]

The collector is a real ``martinet run`` router process (``sys$spark`` with
``collector-enabled="true"``, ``output="files"``, the default store and ``roll-interval``
``--roll``). The M routers are simulated: ``--publishers`` processes (this script again),
each with one AMQP connection per router it plays, publish to the topic
``martinet.metrics`` what M routers with K queues would publish every ``--interval`` ms, in
the export's wire format (:func:`martinet.swiftlets.spark.api.encode_batch`, persistent, at
most ``CHUNK`` rows per message): the router's own ~100 values (texts in every sample,
numbers in full samples), and per queue the 20 values a queue's usage has, all of them
every ``full-sample-interval`` (30) samples and otherwise the 10 that move on a busy queue
(messages, bytes, available, enqueued, dequeued, cached, cached-bytes, memory, send-rate,
receive-rate) for the ``--busy`` share of the queues (1.0: every queue busy, the heaviest
steady load; 0: idle queues, full samples only). The routers' samples are spread evenly
over the interval, as routers started at different times are. Why simulated and not real
routers: a hundred ``martinet run`` processes (or a hundred in-process routers sampling
their own trees) would take the two cores of this machine from the collector; what the
collector does with a batch does not depend on who made it. What differs: real routers'
batches reach the collector through routing connections (the topic manager's forwarding,
transactions of 20), these through its AMQP listener; both end in the same durable
subscription and the same write path.

Per point (M, K), a fresh collector; after ``--warmup`` seconds, ``--seconds`` measured:

- offered rows/s (what the routers produce) and written rows/s (rows in the Parquet/JSON
  files of the simulated routers, counted from the files, at the window's ends);
- the collector's CPU (share of one core: the router process, its store engine, and both
  per row written) and the router's RSS, from /proc,
  and how long its threads waited for a core (schedstat: runnable, but the cores were
  taken; on a shared machine the figure that says the collector was starved, not slow);
- its backlog: the durable subscription's ``messages`` (``martinet admin``'s client, every
  second), first/last/max and its slope over the window (least squares, messages/s);
  up to 200 unaccepted messages (its credit) are normal: rows wait there for the next file;
- ``rows-dropped`` and ``write-errors`` of ``/sys$spark/usage``, and the publishers' lag
  (how far behind its schedule the slowest simulated router ended: persistent sends wait
  for the router to store them, so a collector that cannot take more slows them down).

A point *holds* when the backlog does not grow (its lowest value per roll-interval, the
messages left right after a file, grows over the window by less than one interval's
messages or 50, whichever is more: a collector short of 4 % of what 100 routers send grows
faster than that over 30 s), the publishers kept their schedule
(lag below 2 intervals), nothing was dropped, and the written rows are at least 95 % of the
offered. The knee is the largest M x K that holds. Wall-clock figures on a shared machine:
the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from _loadgen import cpu_seconds, free_port, martinet_router

from martinet.messaging.client import BytesMessage, DeliveryMode, Topic, connect
from martinet.swiftlets.mgmt.client import AdminClient, AdminError
from martinet.swiftlets.spark.api import encode_batch
from martinet.swiftlets.spark.swiftlet import CHUNK, COLLECTOR_CLIENT

TOPIC = "martinet.metrics"
FULL_EVERY = 30  # full-sample-interval's default
GROWTH = 50  # messages the backlog's lows may grow by in a window that holds (or an interval's)
SUBSCRIPTION = f"/sys$topicmanager/usage/durable-subscribers/{COLLECTOR_CLIENT}$collector"

COLLECTOR = """<router name="collector"
        startorder="sys$store sys$queuemanager sys$topicmanager sys$jms sys$mgmt sys$spark">
  <swiftlet name="sys$store" path="store"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
  <swiftlet name="sys$spark" collect-interval="{interval}" output="files" collector-enabled="true" folder="metrics"
             format="{format}" roll-interval="{roll}"/>
</router>"""

# A queue's usage values (the sampler's rows of /sys$queuemanager/usage/queues/<q>) and those
# that move on a busy queue.
QUEUE_METRICS = (
    "messages bytes available enqueued dequeued expired dead-lettered duplicates-dropped consumers cached "
    "cached-bytes swapped swapped-bytes memory swapped-out read-back reads send-rate receive-rate temporary"
).split()
BUSY_METRICS = "messages bytes available enqueued dequeued cached cached-bytes memory send-rate receive-rate".split()
SWIFTLETS = (
    "sys$store sys$authentication sys$queuemanager sys$xa sys$topicmanager sys$jms sys$routing sys$spark".split()
)


def router_parts(name: str) -> tuple[list[tuple], list[tuple]]:
    """A router's own (numbers, texts) as ``(swiftlet, entity, metric[, text])``: what a sample of a
    router with the usual swiftlets holds besides its queues (store, queue manager, topic
    manager, the two system queues; the router's and its swiftlets' states)."""
    numbers = [("sys$store", "", m) for m in "transactions fsyncs operations cancelled-pairs largest-batch".split()]
    numbers += [("sys$store", "", "pending-operations"), ("sys$store", "", "commit-seconds")]
    numbers += [
        ("sys$queuemanager", "", m)
        for m in (
            "queues messages clients-queues routing-queues prepared-transactions deferred-operations memory-used "
            "memory-messages memory-buffers memory-limit memory-low-watermark memory-alarm memory-alarms memory-waiting"
        ).split()
    ]
    numbers += [("sys$topicmanager", "", m) for m in "roots durable-subscribers durable-backlogs-growing".split()]
    numbers += [
        ("sys$topicmanager", "", m) for m in "unrestorable interest-records-sent interest-records-received".split()
    ]
    numbers += [("sys$queuemanager", f"queues/{q}", m) for q in ("unroutable", "routerdlq") for m in QUEUE_METRICS]
    texts = [("sys$store", "", "path", f"/var/martinet/{name}/store.sqlite"), ("sys$store", "", "sync", "full")]
    texts += [("sys$topicmanager", "", "interest", "martinet")]
    texts += [("router", "", m, v) for m, v in (("name", name), ("hostname", name), ("release", "0.1.0"))]
    texts += [("router", "", "config-file", "/etc/martinet/router.xml"), ("router", "", "state", "running")]
    texts += [("router", "", "started-at", "2026-11-27T22:12:17")]
    for swiftlet in SWIFTLETS:
        entity = f"swiftlets/{swiftlet}"
        texts += [("router", entity, "state", "running"), ("router", entity, "started-at", "2026-11-27T22:12:18")]
        texts += [("router", entity, "error", "")]
    return numbers, texts


class SimulatedRouter:
    """The rows one router with ``queues`` queues exports, sample after sample."""

    def __init__(self, name: str, queues: int, busy: float, rng: random.Random):
        self.name = name
        self.epoch = int(time.time() * 1000)
        self.seq = 0
        self.taken = rng.randrange(FULL_EVERY)  # routers' full samples fall at different times
        self.numbers, self.texts = router_parts(name)
        names = [f"queues/q{n}" for n in range(queues)]
        busy_names = rng.sample(names, round(busy * queues))
        self.full = [("sys$queuemanager", e, m) for e in names for m in QUEUE_METRICS]
        self.moving = [("sys$queuemanager", e, m) for e in busy_names for m in BUSY_METRICS]

    def sample(self, now_ms: int) -> list[list]:
        full = self.taken % FULL_EVERY == 0
        self.taken += 1
        value = float(self.taken)
        rows = [[now_ms, s, e, m, None, text] for s, e, m, text in self.texts]
        rows += [[now_ms, s, e, m, value, None] for s, e, m in (self.numbers + self.full if full else self.moving)]
        for row in rows:
            self.seq += 1
            row.append(self.seq)
        return rows

    def messages(self, now_ms: int) -> tuple[list[bytes], int]:
        rows = self.sample(now_ms)
        bodies = [encode_batch(self.name, self.epoch, rows[i : i + CHUNK], []) for i in range(0, len(rows), CHUNK)]
        return bodies, len(rows)


# -- the publishers (a subprocess each) --------------------------------------------------------


async def play(url: str, router: SimulatedRouter, start: float, interval: float, until: float, totals: dict) -> None:
    """Publish ``router``'s samples at ``start + n * interval`` until ``until`` (time.time()); a
    sample sent late is not skipped (a real router's export never skips one either)."""
    async with connect(url) as connection:
        session = await connection.session()
        producer = await session.producer(Topic(TOPIC), delivery_mode=DeliveryMode.PERSISTENT)
        due = start
        while due < until:
            await trio.sleep(max(0.0, due - time.time()))
            bodies, rows = router.messages(int(due * 1000))
            for body in bodies:
                await producer.send(BytesMessage(body))
            totals["rows"] += rows
            totals["messages"] += len(bodies)
            totals["lag"] = max(totals["lag"], time.time() - due) if due > until - 3 * interval else totals["lag"]
            due += interval


async def publish(args: argparse.Namespace) -> None:
    rng = random.Random(args.first)
    totals = {"rows": 0, "messages": 0, "lag": 0.0}
    interval = args.interval / 1000
    async with trio.open_nursery() as nursery:
        for index in range(args.first, args.first + args.count):
            router = SimulatedRouter(f"sim{index:04d}", args.queue_count, args.busy, rng)
            phase = interval * index / args.routers_total
            nursery.start_soon(play, args.url, router, args.start + phase, interval, args.until, totals)
    print(json.dumps(totals), flush=True)


# -- the collector and the measurement ----------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def store_engine(pid: int) -> int | None:
    """The pid of the router's store engine (``sys$store`` runs SQLite in a child process)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                return int(stat.parent.name)
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            pass
    return None


def cpu_wait_seconds(pid: int) -> float:
    """Seconds the process's threads have been runnable but waiting for a CPU (the run queue:
    other processes had the cores), from /proc/PID/task/*/schedstat."""
    waited = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            waited += int(stat.read_text().split()[1])
        except (OSError, IndexError):  # a thread that ended meanwhile
            pass
    return waited / 1e9


def rows_in_files(folder: Path, counted: dict[Path, int]) -> int:
    """Rows of the simulated routers in the files below ``folder`` (``counted``: files read
    before, kept: a file is complete when it appears)."""
    for path in folder.glob("rows/date=*/router=sim*/part-*"):
        if path not in counted:
            if path.suffix == ".parquet":
                import pyarrow.parquet as pq

                counted[path] = pq.read_metadata(path).num_rows
            else:
                with path.open("rb") as file:
                    counted[path] = sum(1 for _ in file)
    return sum(counted.values())


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var if var else 0.0


def minima(points: list[tuple[float, float]], bucket: float) -> list[tuple[float, float]]:
    """The lowest value of each ``bucket`` seconds of (t, y): the backlog between two files (a
    backlog that holds comes back down after each; one that grows does not)."""
    lowest: dict[int, tuple[float, float]] = {}
    for t, y in points:
        key = int(t // bucket)
        if key not in lowest or y < lowest[key][1]:
            lowest[key] = (t, y)
    return [lowest[key] for key in sorted(lowest)]


async def observe(args: argparse.Namespace, url: str, pid: int, folder: Path, start: float) -> dict:
    """Sample the collector every second from ``start + warmup`` for ``seconds``."""
    counted: dict[Path, int] = {}
    backlog: list[tuple[float, float]] = []
    written: list[tuple[float, float]] = []
    rss: list[float] = []
    async with AdminClient.open(url, timeout=20) as admin:
        await trio.sleep(max(0.0, start + args.warmup - time.time()))
        store = store_engine(pid)
        t0, cpu0, wait0 = time.time(), cpu_seconds(pid), cpu_wait_seconds(pid)
        store0 = cpu_seconds(store) if store else 0.0
        spark0 = (await admin.call(None, "get", path="/sys$spark/usage"))["properties"]
        while time.time() < t0 + args.seconds:
            try:
                entry = await admin.call(None, "get", path=SUBSCRIPTION)
                backlog.append((time.time() - t0, float(entry["properties"]["messages"])))
            except AdminError:  # no answer within the timeout: the collector is saturated
                pass
            written.append((time.time() - t0, rows_in_files(folder, counted)))
            rss.append(rss_mb(pid))
            await trio.sleep(1)
        t1, cpu1, wait1 = time.time(), cpu_seconds(pid), cpu_wait_seconds(pid)
        store1 = cpu_seconds(store) if store else 0.0
        spark1 = (await admin.call(None, "get", path="/sys$spark/usage"))["properties"]
    lows = minima(backlog, args.roll / 1000)
    return {
        "written": slope(written),
        "cpu": (cpu1 - cpu0) / (t1 - t0) * 100,
        "store-cpu": (store1 - store0) / (t1 - t0) * 100,
        "cpu-wait": (wait1 - wait0) / (t1 - t0) * 100,
        "rss": max(rss),
        "backlog": backlog,
        "slope": slope(lows),
        "lows": lows,
        "dropped": spark1["rows-dropped"] - spark0["rows-dropped"],
        "write-errors": spark1["write-errors"] - spark0["write-errors"],
        "files": (spark1["files"] - spark0["files"]) / (t1 - t0),
        "counted": counted,
    }


async def drain(folder: Path, counted: dict[Path, int], offered: int, timeout: float) -> tuple[int, float]:
    """Wait until the files hold every offered row, at most ``timeout`` s: (rows missing, seconds)."""
    started = time.time()
    while (found := rows_in_files(folder, counted)) < offered and time.time() < started + timeout:
        await trio.sleep(0.5)
    return offered - found, time.time() - started


def run_point(args: argparse.Namespace, routers: int, queues: int, python: str) -> dict:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name) / "collector"
        port = free_port()
        config = COLLECTOR.format(port=port, interval=args.interval, format=args.format, roll=args.roll)
        with martinet_router(folder, config, port=port, python=python) as collector:
            url = f"amqp://127.0.0.1:{port}"
            start = time.time() + 3  # the publishers' connections are open by then
            until = start + args.warmup + args.seconds
            processes = min(args.publishers, routers)
            share = [routers // processes + (1 if i < routers % processes else 0) for i in range(processes)]
            publishers = []
            first = 0
            for count in share:
                command = [sys.executable, __file__, "--publish", "--url", url, "--first", str(first)]
                command += ["--count", str(count), "--routers-total", str(routers), "--queue-count", str(queues)]
                command += ["--busy", str(args.busy), "--interval", str(args.interval)]
                command += ["--start", repr(start), "--until", repr(until)]
                publishers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
                first += count
            try:
                load = os.getloadavg()[0]
                seen = trio.run(observe, args, url, collector.pid, folder / "metrics", start)
                load = (load + os.getloadavg()[0]) / 2
                publisher_cpu = sum(cpu_seconds(p.pid) for p in publishers)
                totals = []
                for process in publishers:
                    out, _ = process.communicate(timeout=120 + args.seconds)
                    if process.returncode:
                        raise RuntimeError(f"a publisher failed with status {process.returncode}")
                    totals.append(json.loads(out))
                offered = sum(t["rows"] for t in totals)
                missing, drained = trio.run(
                    drain, folder / "metrics", seen["counted"], offered, args.roll / 1000 + args.drain
                )
            finally:
                for process in publishers:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
        log = (folder / "stderr.log").read_text()
    offered_rows = offered / (until - start)
    offered_messages = sum(t["messages"] for t in totals) / (until - start)
    lag = max(t["lag"] for t in totals)
    holds = (
        len(seen["lows"]) >= 3
        and seen["slope"] * args.seconds < max(GROWTH, offered_messages * args.interval / 1000)
        and lag < 2 * args.interval / 1000
        and not seen["dropped"]
        and not seen["write-errors"]
        and seen["written"] >= 0.95 * offered_rows
    )
    return {
        **seen,
        "routers": routers,
        "queues": queues,
        "offered": offered_rows,
        "offered-messages": offered_messages,
        "lag": lag,
        "holds": holds,
        "missing": missing,
        "drained": drained,
        "load": load,
        "publisher-cpu": publisher_cpu / (until - start + 3) * 100,
        "released": log.count("go back to the subscription"),
    }


def report(label: str, point: dict) -> None:
    backlog = [y for _, y in point["backlog"]]
    lows = "/".join(f"{y:.0f}" for _, y in point["lows"])
    total = point["cpu"] + point["store-cpu"]
    cost = total / 100 / point["written"] * 1e6 if point["written"] > 0 else float("nan")
    print(
        f"{label}: {point['routers']:5d} x {point['queues']:5d} = {point['routers'] * point['queues']:7,d}  "
        f"offered {point['offered']:9,.0f} rows/s ({point['offered-messages']:5.0f} msg/s)  "
        f"written {point['written']:9,.0f} rows/s  {point['files']:5.1f} files/s  "
        f"CPU {point['cpu']:4.0f} % + store {point['store-cpu']:3.0f} % ({cost:.1f} µs/row; "
        f"waited for a core {point['cpu-wait']:3.0f} %)  "
        f"RSS {point['rss']:5.0f} MB  "
        f"backlog max {max(backlog, default=float('nan')):5.0f}, lows {lows}, trend {point['slope']:+6.2f} msg/s  "
        f"lag {point['lag']:5.1f} s  dropped {point['dropped']}  released {point['released']}  "
        f"after the end: {point['missing']:,} rows missing, {point['drained']:.0f} s  "
        f"publishers {point['publisher-cpu']:3.0f} % CPU  load {point['load']:.1f}  "
        f"{'holds' if point['holds'] else 'FALLS BEHIND'}",
        flush=True,
    )


def knee(points: list[dict], interval: int) -> None:
    held = [p for p in points if p["holds"]]
    if not held:
        print("  no point held")
        return
    best = max(held, key=lambda p: (p["routers"] * p["queues"], p["offered"]))
    print(
        f"  knee: {best['routers']} routers x {best['queues']} queues = {best['routers'] * best['queues']:,} "
        f"queues at {interval} ms, {best['written']:,.0f} rows/s written"
    )
    above = [p for p in points if not p["holds"] and p["offered"] > best["offered"]]
    if above:
        first = min(above, key=lambda p: p["offered"])
        print(
            f"  first point past it: {first['routers']} x {first['queues']}, {first['offered']:,.0f} rows/s "
            f"offered, {first['written']:,.0f} written"
        )


def main(args: argparse.Namespace) -> None:
    routers = [int(n) for n in args.routers.split(",")]
    queues = [int(n) for n in args.queues.split(",")]
    print(
        f"one collector ({args.format}, roll-interval {args.roll} ms), simulated routers every {args.interval} ms, "
        f"{args.busy:.0%} of the queues busy, {args.warmup:g} s warm-up + {args.seconds:g} s measured; "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    builds = {"this build": sys.executable}
    if args.baseline:
        builds["baseline"] = args.baseline
    points: dict[str, list[dict]] = {label: [] for label in builds}
    turn = 0
    for k in queues:
        for m in routers:
            order = list(builds.items())
            for label, python in order[turn % 2 :] + order[: turn % 2]:  # alternate which build goes first
                point = run_point(args, m, k, python)
                report(label, point)
                points[label].append(point)
            turn += 1
    for label, found in points.items():
        print(f"{label}:")
        knee(found, args.interval)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", default="10,50,100", help="M values, comma-separated")
    parser.add_argument("--queues", default="10,100", help="K values, comma-separated")
    parser.add_argument("--interval", type=int, default=1000, help="collect-interval of the routers, ms")
    parser.add_argument("--seconds", type=float, default=30, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=8, help="seconds before the measurement")
    parser.add_argument("--busy", type=float, default=1.0, help="share of the queues whose numbers move")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--roll", type=int, default=5000, help="the collector's roll-interval, ms")
    parser.add_argument("--drain", type=float, default=20, help="seconds after a roll to wait for the last rows")
    parser.add_argument(
        "--baseline", help="the python of another build (its venv's): each point runs with both, alternating"
    )
    parser.add_argument("--publishers", type=int, default=2, help="publisher processes")
    # a publisher subprocess
    parser.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--routers-total", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--queue-count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, default=0, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.publish:
        trio.run(publish, arguments)
    else:
        main(arguments)
