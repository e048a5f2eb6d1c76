"""The cost of ``sys$spark`` on a router's AMQP throughput: the same load with the export off and on.

    .venv/bin/python bench/spark_export_bench.py [--messages N] [--rounds R] [--queues Q] [--idle S] [--format F]

Two ``martinet run`` routers of the same config (``sync="full"``, ``Q`` queues defined, 1,000 by
default, about 20,000 values: a full sample holds them all, the others what changed), one
without ``sys$spark`` and one with it (``collect-interval`` 1 s, ``full-sample-interval`` 30,
files in ``--format``, a roll every 10 s). First both idle for ``--idle`` seconds: the
export's own CPU (per second, and per message at the best rate measured; the steady figure, as
samples, full samples and writes all fall in it). Then the load of
``bench/amqp_bench.py`` (our C load generator: one sender and one receiver process, one queue,
100-byte non-persistent messages, at-least-once). Rounds alternate off / on so that the
machine's load moves both alike; it prints the best rate of each, the router's CPU per message
(best round; a round holds only a few samples and maybe no write, so this figure is noisy)
and the cost of the export in both.
Needs gcc and libqpid-proton11-dev (for the load generator) and pyarrow for Parquet.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _loadgen import build_loadgen, cpu_seconds, free_port, martinet_router, run_round

ROUTER = """<router name="bench" startorder="sys$store sys$queuemanager sys$jms{spark_order}">
  <swiftlet name="sys$store" path="store" sync="full"/>
  <swiftlet name="sys$queuemanager"><queues>{queues}</queues></swiftlet>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>{spark}
</router>"""
SPARK = """
  <swiftlet name="sys$spark" collect-interval="1000" full-sample-interval="30" roll-interval="10000" folder="metrics"
             format="{format}"/>"""


def config(port: int, queues: int, export: str | None) -> str:
    return ROUTER.format(
        port=port,
        queues="".join(f'<queue name="idle{n}"/>' for n in range(queues)),
        spark_order=" sys$spark" if export else "",
        spark=SPARK.format(format=export) if export else "",
    )


def main(args: argparse.Namespace) -> None:
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build the load generator")
    with tempfile.TemporaryDirectory() as name, ExitStack() as stack:
        folder = Path(name)
        loadgen = build_loadgen(folder)
        routers = {}
        for label, export in (("export off", None), ("export on", args.format)):
            port = free_port()
            router = stack.enter_context(
                martinet_router(folder / label.replace(" ", "-"), config(port, args.queues, export), port=port)
            )
            routers[label] = (port, router)
        time.sleep(3)  # a few samples taken before the first round
        idle = {}
        for label, (_, router) in routers.items():  # both idle alike: measured together
            idle[label] = cpu_seconds(router.pid)
        time.sleep(args.idle)
        for label, (_, router) in routers.items():
            idle[label] = (cpu_seconds(router.pid) - idle[label]) / args.idle * 1000  # ms of CPU per second
        print(
            f"{args.queues} queues, export every 1 s as {args.format}; one C sender + one C receiver, "
            f"100-byte non-persistent messages, {args.messages:,} per round",
            flush=True,
        )
        rates: dict[str, list[float]] = {label: [] for label in routers}
        cpu: dict[str, list[float]] = {label: [] for label in routers}
        for i in range(args.rounds):
            for label, (port, router) in routers.items():
                before = cpu_seconds(router.pid)
                rates[label].append(run_round(loadgen, (port, f"q{i}"), (port, f"q{i}"), args.messages, durable=False))
                cpu[label].append((cpu_seconds(router.pid) - before) / args.messages * 1e6)
        for label in routers:
            print(
                f"{label:10} {max(rates[label]):>9,.0f} msgs/s   router CPU {min(cpu[label]):.2f} µs/msg   "
                f"(rounds: {', '.join(f'{r:,.0f}' for r in rates[label])})"
            )
        off, on = "export off", "export on"
        print(
            f"cost of the export: {100 * (1 - max(rates[on]) / max(rates[off])):+.1f} % throughput (best rounds), "
            f"{100 * (min(cpu[on]) / min(cpu[off]) - 1):+.1f} % router CPU per message"
        )
        export = idle[on] - idle[off]
        print(
            f"idle router CPU: export off {idle[off]:.1f} ms/s, on {idle[on]:.1f} ms/s: the export takes "
            f"{export:.1f} ms of CPU per second, {export * 1000 / max(rates[off]):.2f} µs per message at "
            f"{max(rates[off]):,.0f} msgs/s = {100 * export * 1000 / max(rates[off]) / min(cpu[off]):+.1f} % "
            f"router CPU per message"
        )
        files = list((folder / "export-on" / "metrics").rglob("part-*"))
        print(f"export wrote {len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=30, help="seconds both routers idle, measured")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    main(parser.parse_args())
