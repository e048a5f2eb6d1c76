"""Messages between routers: throughput over one and two hops, against RabbitMQ's shovel. Prints figures.

    .venv/bin/python bench/routing_bench.py [--messages N] [--size BYTES] [--rounds R] [--no-rabbitmq]
                                            [--only one-hop,two-hops,single,sweep,rabbitmq] [--pace N]

Routers are real ``martinet run`` processes (``sync="full"``: fsync per group commit) on
loopback, linked by sys$routing listeners and connectors: one hop A → B, two hops
A → M → B. The C load generator (``amqp_loadgen.c``, see ``_loadgen.py``) sends to
``q@B`` on A and receives from ``q`` on B, concurrently, at-least-once; the figure is
messages per second from the first send to the last receive (the best of ``--rounds``).
Each path is measured persistent and non-persistent, with XA and without (``use-xa`` on
both ends of every link), at the routers' default ``inbound-transaction-size`` (100) and
``inbound-window-size`` (10). Also printed:

- the single-router figure (sender and receiver on B, a local queue) of the same run, and
  each routed figure as a ratio of it;
- an ``inbound-transaction-size`` sweep (1, 20, 100, 500), one hop, persistent, XA;
- RabbitMQ 3.10 (Debian's ``rabbitmq-server``): two private nodes, a dynamic shovel
  (``rabbitmq_shovel``, AMQP 0-9-1, ``ack-mode`` on-confirm, durable queues it declares) from a queue
  on node A to one on node B, the same load generator through the ``rabbitmq_amqp1_0``
  plugin, persistent; printed as Martinet / RabbitMQ. ``--no-rabbitmq`` skips it;
- the routers' CPU seconds per message (user + system from ``/proc``, all routers of the
  path together and each): on a machine shared with other work, the figure that survives;
  and each router's against the single router's.

``--pace N`` keeps every Martinet sender to N messages a second: a router has costs per
second as well as per message (a store batch's confirmation, timers), which weigh more per
message at a lower rate, so the CPU of a routed message and a local one compare best at one
rate that every case reaches (e.g. ``--pace 20000`` for persistent rounds on 2 cores).

Persistent rounds send half of ``--messages``, as ``amqp_bench.py`` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from _loadgen import (
    build_loadgen,
    cpu_seconds,
    free_port,
    martinet_router,
    rabbitmq_installed,
    rabbitmq_node,
    run_round,
    start_shovel,
    stop_epmd,
)

# route-log="each": a line per route added, which tells when the first router reaches the last
ROUTER = """<router name="{name}" startorder="sys$log sys$store sys$queuemanager sys$xa sys$jms sys$routing">
  <swiftlet name="sys$log" level="INFO"/>
  <swiftlet name="sys$store" path="store" sync="full"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{amqp}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
  <swiftlet name="sys$routing" route-log="each">
    <listeners>{listener}</listeners>
    <connectors>{connector}</connectors>
  </swiftlet>
</router>"""
LINK = 'password="bench" use-xa="{xa}"{size}'
LISTENER = '<listener name="routing" port="{port}" bindaddress="127.0.0.1" ' + LINK + "/>"
CONNECTOR = '<connector name="{target}" hostname="127.0.0.1" port="{port}" retry-time="1000" ' + LINK + "/>"
SECTIONS = ("one-hop", "two-hops", "single", "sweep", "rabbitmq")


class Network:
    """Running routers by name: their AMQP ports and processes."""

    def __init__(self) -> None:
        self.amqp: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.logs: dict[str, Path] = {}

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}


@contextmanager
def network(folder: Path, path: tuple[str, ...], *, xa: bool, size: int | None = None) -> Iterator[Network]:
    """Routers ``path`` (each dials the next), running once the first has a route to the last;
    their links at ``inbound-transaction-size`` ``size`` (None: the routers' default)."""
    link = {"xa": str(xa).lower(), "size": "" if size is None else f' inbound-transaction-size="{size}"'}
    routing = {name: free_port() for name in path}
    running = Network()
    with ExitStack() as stack:
        for index, name in enumerate(path):
            amqp = running.amqp[name] = free_port()
            listener = LISTENER.format(port=routing[name], **link)
            target = path[index + 1] if index + 1 < len(path) else None
            connector = CONNECTOR.format(target=target, port=routing[target], **link) if target else ""
            where = folder / f"{'-'.join(path)}-{'xa' if xa else 'nonxa'}-{size or 'default'}-{routing[path[0]]}" / name
            config = ROUTER.format(name=name, amqp=amqp, listener=listener, connector=connector)
            running.pids[name] = stack.enter_context(martinet_router(where, config, port=amqp)).pid
            running.logs[name] = where / "stderr.log"
        needle = f"route to {path[-1]} via {path[1]}"
        deadline = time.monotonic() + 60
        while needle not in running.logs[path[0]].read_text():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path[0]} has no route to {path[-1]} after 60 s; see {running.logs[path[0]]}")
            time.sleep(0.1)
        yield running


class Bench:
    def __init__(self, loadgen: Path, folder: Path, args: argparse.Namespace):
        self.loadgen, self.folder, self.args = loadgen, folder, args
        self.rounds = 0
        self.single: dict[bool, float] = {}
        self.results: dict[tuple[str, bool, bool], float] = {}
        self.cpu: dict[tuple[str, bool, bool], dict[str, float]] = {}  # each router's µs per message
        self.single_cpu: dict[bool, float] = {}

    def count(self, durable: bool) -> int:
        return self.args.messages // 2 if durable else self.args.messages

    def measure(
        self, label: str, running: Network, sender: str, receiver: str, *, durable: bool
    ) -> tuple[float, dict[str, float]]:
        """The best rate of the rounds, printed with the routers' CPU per message, and each
        router's CPU per message (µs) in the round that took the least."""
        count = self.count(durable)
        rates, cpu = [], []
        for _ in range(self.args.rounds):
            self.rounds += 1
            queue = f"bench{self.rounds}"
            address = queue if sender == receiver else f"{queue}@{receiver}"
            before = running.cpu()
            rates.append(
                run_round(
                    self.loadgen,
                    (running.amqp[sender], address),
                    (running.amqp[receiver], queue),
                    count,
                    durable=durable,
                    size=self.args.size,
                    pace=self.args.pace,
                )
            )
            after = running.cpu()
            cpu.append({name: (after[name] - before[name]) / count * 1e6 for name in before})
        best = min(cpu, key=lambda usage: sum(usage.values()))
        each = ", ".join(f"{name} {value:.1f}" for name, value in best.items())
        print(
            f"{label:44} {max(rates):>9,.0f} msgs/s   router CPU {sum(best.values()):6.1f} µs/msg ({each})"
            f"{'' if len(rates) == 1 else '   rounds: ' + ', '.join(f'{r:,.0f}' for r in rates)}",
            flush=True,
        )
        return max(rates), best

    def paths(self, path: tuple[str, ...], name: str, single: bool) -> None:
        for xa in (True, False):
            with network(self.folder, path, xa=xa) as running:
                if single and not self.single:
                    for durable in (False, True):
                        self.single[durable], cpu = self.measure(
                            f"single router B, {kind(durable)}", running, path[-1], path[-1], durable=durable
                        )
                        self.single_cpu[durable] = cpu[path[-1]]
                for durable in (False, True):
                    rate, cpu = self.measure(
                        f"{name}, {kind(durable)}, {'XA' if xa else 'non-XA'}",
                        running,
                        path[0],
                        path[-1],
                        durable=durable,
                    )
                    self.results[(name, durable, xa)], self.cpu[(name, durable, xa)] = rate, cpu

    def sweep(self) -> None:
        for size in (1, 20, 100, 500):
            with network(self.folder, ("A", "B"), xa=True, size=size) as running:
                self.measure(f"one hop, persistent, XA, transaction size {size}", running, "A", "B", durable=True)

    def shovel(self) -> float | None:
        """RabbitMQ: node A's queue shovelled to node B's; persistent; the rate."""
        if not rabbitmq_installed():
            print("RabbitMQ: not installed (apt-get install rabbitmq-server) — comparison skipped")
            return None
        epmd_port = free_port()
        plugins = ("rabbitmq_amqp1_0", "rabbitmq_shovel")
        try:
            with (
                rabbitmq_node(self.folder, "bench-a", plugins, epmd_port) as node_a,
                rabbitmq_node(self.folder, "bench-b", plugins, epmd_port) as node_b,
            ):
                count = self.count(True)
                # the shovel declares both queues durable; the load generator names them without
                # declaring (/amq/queue/ at both ends: /queue/ would redeclare them, which fails on
                # the durable queue and leaves the sender waiting for credit)
                start_shovel(node_a, "bench", "shovelled", node_a.port, node_b.port)
                print(
                    f"RabbitMQ {node_a.ctl('version')}: two nodes, dynamic shovel A → B (AMQP 0-9-1, "
                    f"on-confirm), load through the amqp1_0 plugin",
                    flush=True,
                )
                rates = [
                    run_round(
                        self.loadgen,
                        (node_a.port, "/amq/queue/shovelled"),
                        (node_b.port, "/amq/queue/shovelled"),
                        count,
                        durable=True,
                        size=self.args.size,
                        credentials=("guest", "guest"),
                        timeout=120,
                    )
                    for _ in range(self.args.rounds)
                ]
                print(f"{'RabbitMQ shovel, one hop, persistent':44} {max(rates):>9,.0f} msgs/s", flush=True)
                return max(rates)
        finally:
            stop_epmd(epmd_port)


def kind(durable: bool) -> str:
    return "persistent" if durable else "non-persistent"


def main(args: argparse.Namespace) -> None:
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build the load generator")
    sections = set(args.only.split(",")) if args.only else set(SECTIONS)
    if args.no_rabbitmq:
        sections.discard("rabbitmq")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        bench = Bench(build_loadgen(folder), folder, args)
        print(
            f"C sender on A to q@B, C receiver on B, concurrent, {args.size}-byte messages, at-least-once; "
            f"{args.messages:,} messages a round ({args.messages // 2:,} persistent); {os.cpu_count()} CPUs; "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
            f"{f'; Martinet senders paced at {args.pace:,.0f} msgs/s' if args.pace else ''}",
            flush=True,
        )
        if "one-hop" in sections or "single" in sections:
            bench.paths(("A", "B"), "one hop", single="single" in sections)
        if "two-hops" in sections:
            bench.paths(("A", "M", "B"), "two hops", single=False)
        if "sweep" in sections:
            bench.sweep()
        try:
            rabbit = bench.shovel() if "rabbitmq" in sections else None
        except RuntimeError as exc:
            print(f"RabbitMQ shovel: failed: {exc}")
            rabbit = None
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for (path, durable, xa), rate in sorted(bench.results.items()):
            ratios = [f"{rate / bench.single[durable]:.2f} of a single router" if bench.single else ""]
            one_hop = bench.results.get(("one hop", durable, xa))
            if path == "two hops" and one_hop:
                ratios.append(f"{rate / one_hop:.2f} of one hop")
            if rabbit and durable and path == "one hop":
                ratios.append(f"{rate / rabbit:.2f}x the RabbitMQ shovel")
            if bench.single_cpu:
                each = ", ".join(
                    f"{name} {usage / bench.single_cpu[durable]:.2f}x"
                    for name, usage in bench.cpu[(path, durable, xa)].items()
                )
                ratios.append(f"router CPU per message against a single router's: {each}")
            if any(ratios):
                print(f"ratio {path}, {kind(durable)}, {'XA' if xa else 'non-XA'}: {'; '.join(r for r in ratios if r)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="per non-persistent round (half persistent)")
    parser.add_argument("--size", type=int, default=100, help="message body bytes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--only", help=f"a comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--pace", type=float, help="messages a second each Martinet sender keeps to (default: at once)")
    main(parser.parse_args())
