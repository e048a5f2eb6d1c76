"""AMQP 1.0 end to end: Martinet against RabbitMQ 3.10, same load, same run. Prints figures.

    .venv/bin/python bench/amqp_bench.py [--messages N] [--rounds R] [--no-rabbitmq]

Load: our C load generator (``bench/amqp_loadgen.c``, built here against Debian's
``libqpid-proton11-dev`` with gcc), one sender process and one receiver process running
concurrently, one queue, 100-byte messages, at-least-once (the sender keeps the link's
credit full of unsettled messages and counts accepts; the receiver accepts each). The
figure is messages per second from the first send to the last receive; the best of
``--rounds`` rounds is printed, next to all of them. For Martinet it also prints the
router's CPU time per message (user + system, from ``/proc``, best round): a figure that
other load on the machine disturbs far less than the rate.

Brokers, each in its own process, on loopback ports chosen here, data in a temporary folder:

- Martinet (``python -m martinet.kernel run``; ``sync="full"``, i.e. fsync per group commit);
- RabbitMQ 3.10 from Debian (``apt-get install rabbitmq-server``), private node, the
  ``rabbitmq_amqp1_0`` plugin, address ``/queue/<name>`` (a durable queue), PLAIN as guest.

Needs: gcc, libqpid-proton11-dev, rabbitmq-server (skipped with a note when missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from _loadgen import (
    build_loadgen,
    cpu_seconds,
    free_port,
    martinet_router,
    rabbitmq_installed,
    rabbitmq_node,
    run_round,
    stop_epmd,
)

ROUTER = """<router name="bench" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="store" sync="full"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""


def measure(
    name: str,
    loadgen: Path,
    port: int,
    prefix: str,
    args: argparse.Namespace,
    credentials: tuple[str, ...],
    pid: int | None = None,
) -> dict[str, float]:
    results = {}
    for durable in (False, True):
        kind = "persistent" if durable else "non-persistent"
        count = args.messages if not durable else args.messages // 2
        rates, cpu = [], []
        for i in range(args.rounds):
            before = cpu_seconds(pid) if pid else 0.0
            address = f"{prefix}bench-{kind}-{i}"
            rates.append(
                run_round(loadgen, (port, address), (port, address), count, durable=durable, credentials=credentials)
            )
            cpu.append((cpu_seconds(pid) - before) / count * 1e6 if pid else 0.0)
        results[kind] = max(rates)
        usage = f"; router CPU {min(cpu):.2f} µs/msg" if pid else ""
        print(
            f"{name:10} {kind:15} {max(rates):>9,.0f} msgs/s   (rounds: {', '.join(f'{r:,.0f}' for r in rates)}; "
            f"{count:,} messages each{usage})",
            flush=True,
        )
    return results


def martinet(loadgen: Path, folder: Path, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    with martinet_router(folder / "martinet", ROUTER.format(port=port), port=port) as router:
        return measure("Martinet", loadgen, port, "", args, (), router.pid)


def rabbitmq(loadgen: Path, folder: Path, args: argparse.Namespace) -> dict[str, float] | None:
    if not rabbitmq_installed():
        print("RabbitMQ: not installed (apt-get install rabbitmq-server) — comparison skipped")
        return None
    epmd_port = free_port()
    try:
        with rabbitmq_node(folder, "bench", ("rabbitmq_amqp1_0",), epmd_port) as node:
            print(f"RabbitMQ {node.ctl('version')} (amqp1_0 plugin) on 127.0.0.1:{node.port}", flush=True)
            return measure("RabbitMQ", loadgen, node.port, "/queue/", args, ("guest", "guest"))
    finally:
        stop_epmd(epmd_port)


def main(args: argparse.Namespace) -> None:
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build the load generator")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        loadgen = build_loadgen(folder)
        print(
            f"one C sender + one C receiver process, concurrent, 100-byte messages, at-least-once; "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        ours = martinet(loadgen, folder, args)
        theirs = None if args.no_rabbitmq else rabbitmq(loadgen, folder, args)
        if theirs:
            for kind in ("non-persistent", "persistent"):
                print(f"ratio Martinet / RabbitMQ, {kind}: {ours[kind] / theirs[kind]:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="per non-persistent round (half persistent)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-rabbitmq", action="store_true")
    main(parser.parse_args())
