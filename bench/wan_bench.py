"""Routing across distance: link throughput at round trips of 0 to 200 ms, against RabbitMQ's shovel. Prints figures.

    .venv/bin/python bench/wan_bench.py [--messages N] [--size BYTES] [--rtts 0,20,50,100,200]
                                        [--only one-hop,two-hops,rabbitmq] [--modes xa,nonxa]
                                        [--kinds persistent,non-persistent] [--jitter-ms J] [--mbit R]
                                        [--link 'name="value" …'] [--rounds R]

Routers are real ``martinet run`` processes (``sync="full"``) on loopback, one hop A → B or
two hops A → M → B, with their default link settings. Every routing link goes through a
WAN proxy (``_wanproxy.py``, a process of its own) that delays each direction by half the
round trip, with ``--jitter-ms`` and a ``--mbit`` bandwidth cap if given; the 0 ms row goes
through the same proxy with no delay. The C load generator (``amqp_loadgen.c``) sends to
``q@B`` on A and receives from ``q`` on B, concurrently; the figure is messages per second
from the first send to the last receive.

For every row: the rate, its ratio to the same row at 0 ms, each router's CPU per message
(user + system, from ``/proc``) and each router's resident memory after the round. RabbitMQ
3.10 (Debian's ``rabbitmq-server``): two private nodes, a dynamic shovel (AMQP 0-9-1,
on-confirm) whose destination URI is the proxy in front of node B, persistent; the one-hop
persistent rows are printed as a ratio to it at the same round trip.

A fresh network (and proxy) is started for every round trip and mode, so each link starts
from its initial window, as after a restart. ``--link`` adds attributes to both ends of
every link (``inbound-window-size="100"``, ``use-compression="true"``) to compare settings.

``--only compression`` (not in the default run): one hop, XA, at the first round trip,
``use-compression`` off and on; with ``--mbit 10 --size 1024 --text`` it shows what
compression does for a link whose bandwidth, not its round trip, is the limit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
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
    wait_for_port,
)
from routing_bench import ROUTER, kind  # the same routers, linked through the proxy

HERE = Path(__file__).resolve().parent
LINK = 'password="bench" use-xa="{xa}" {extra}'
LISTENER = '<listener name="routing" port="{port}" bindaddress="127.0.0.1" ' + LINK + "/>"
CONNECTOR = '<connector name="{target}" hostname="127.0.0.1" port="{port}" retry-time="1000" ' + LINK + "/>"
SECTIONS = ("one-hop", "two-hops", "rabbitmq", "compression")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def wan_proxy(target: int, rtt_ms: float, args: argparse.Namespace) -> Iterator[int]:
    """A proxy process in front of ``target``, each direction delayed by half ``rtt_ms``; its port."""
    port = free_port()
    command = [sys.executable, str(HERE / "_wanproxy.py"), str(port), str(target), "--delay-ms", str(rtt_ms / 2)]
    command += ["--jitter-ms", str(args.jitter_ms), "--mbit", str(args.mbit)]
    proxy = subprocess.Popen(command)
    try:
        wait_for_port(port, 30, proxy)
        yield port
    finally:
        proxy.terminate()
        proxy.wait()


class Network:
    def __init__(self) -> None:
        self.amqp: dict[str, int] = {}
        self.pids: dict[str, int] = {}


@contextmanager
def network(folder: Path, path: tuple[str, ...], rtt_ms: float, *, xa: bool, args: argparse.Namespace, extra: str = ""):
    """Routers ``path``, each dialing the next through a WAN proxy, once the first has a route
    to the last."""
    link = {"xa": str(xa).lower(), "extra": f"{args.link} {extra}"}
    routing = {name: free_port() for name in path}
    running = Network()
    with ExitStack() as stack:
        logs = {}
        for index, name in enumerate(path):
            amqp = running.amqp[name] = free_port()
            listener = LISTENER.format(port=routing[name], **link)
            target = path[index + 1] if index + 1 < len(path) else None
            connector = ""
            if target:
                proxy = stack.enter_context(wan_proxy(routing[target], rtt_ms, args))
                connector = CONNECTOR.format(target=target, port=proxy, **link)
            where = folder / f"{'-'.join(path)}-{'xa' if xa else 'nonxa'}-{rtt_ms:g}ms-{free_port()}" / name
            config = ROUTER.format(name=name, amqp=amqp, listener=listener, connector=connector)
            running.pids[name] = stack.enter_context(martinet_router(where, config, port=amqp)).pid
            logs[name] = where / "stderr.log"
        needle = f"route to {path[-1]} via {path[1]}"
        deadline = time.monotonic() + 60
        while needle not in logs[path[0]].read_text():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path[0]} has no route to {path[-1]} after 60 s; see {logs[path[0]]}")
            time.sleep(0.1)
        yield running


class Bench:
    def __init__(self, loadgen: Path, folder: Path, args: argparse.Namespace):
        self.loadgen, self.folder, self.args = loadgen, folder, args
        self.rounds = 0
        self.results: dict[tuple[str, bool, bool, float], float] = {}
        self.shovel: dict[float, float] = {}

    def count(self, durable: bool) -> int:
        return self.args.messages // 2 if durable else self.args.messages

    def measure(self, running: Network, label: str, *, durable: bool) -> tuple[float, str]:
        """``--rounds`` rounds A → B on one network (its link's window kept from round to
        round): the best rate, with that round's routers' CPU per message and memory."""
        best = (0.0, "")
        for _ in range(self.args.rounds):
            best = max(best, self._round(running, label, durable=durable))
        return best

    def _round(self, running: Network, label: str, *, durable: bool) -> tuple[float, str]:
        count = self.count(durable)
        self.rounds += 1
        queue = f"bench{self.rounds}"
        sender, receiver = next(iter(running.amqp)), list(running.amqp)[-1]
        before = {name: cpu_seconds(pid) for name, pid in running.pids.items()}
        try:
            rate = run_round(
                self.loadgen,
                (running.amqp[sender], f"{queue}@{receiver}"),
                (running.amqp[receiver], queue),
                count,
                durable=durable,
                size=self.args.size,
                timeout=self.args.timeout,
            )
        except RuntimeError as exc:
            print(f"{label:52} failed: {exc}", flush=True)
            return 0.0, ""
        cpu = {name: (cpu_seconds(pid) - before[name]) / count * 1e6 for name, pid in running.pids.items()}
        rss = {name: rss_mib(pid) for name, pid in running.pids.items()}
        detail = ", ".join(f"{name} {cpu[name]:.1f} µs {rss[name]:.0f} MiB" for name in running.pids)
        return rate, f"router CPU {sum(cpu.values()):6.1f} µs/msg, RSS ({detail})"

    def paths(self, path: tuple[str, ...], name: str) -> None:
        for xa in self.args.xa_modes:
            for rtt in self.args.rtt_list:
                with network(self.folder, path, rtt, xa=xa, args=self.args) as running:
                    for durable in self.args.durabilities:
                        label = f"{name}, {kind(durable)}, {'XA' if xa else 'non-XA'}, {rtt:g} ms"
                        rate, detail = self.measure(running, label, durable=durable)
                        self.results[(name, durable, xa, rtt)] = rate
                        base = self.results.get((name, durable, xa, self.args.rtt_list[0]))
                        ratio = f"{rate / base:5.2f} of {self.args.rtt_list[0]:g} ms" if base else ""
                        print(f"{label:52} {rate:>9,.0f} msgs/s {ratio:>14}   {detail}", flush=True)

    def compression(self) -> None:
        """One hop, XA, at the first round trip, with ``use-compression`` off and on (both
        ends): rate and CPU. Meant for ``--mbit 10 --size 1024 --text``."""
        rtt = self.args.rtt_list[0]
        rates = {}
        for compressed in (False, True):
            extra = 'use-compression="true"' if compressed else ""
            with network(self.folder, ("A", "B"), rtt, xa=True, args=self.args, extra=extra) as running:
                for durable in self.args.durabilities:
                    label = f"one hop, {kind(durable)}, XA, {rtt:g} ms, compression {'on' if compressed else 'off'}"
                    rate, detail = self.measure(running, label, durable=durable)
                    rates[(compressed, durable)] = rate
                    print(f"{label:52} {rate:>9,.0f} msgs/s {'':>14}   {detail}", flush=True)
        for durable in self.args.durabilities:
            if rates.get((False, durable)):
                ratio = rates[(True, durable)] / rates[(False, durable)]
                print(f"ratio compression on / off, {kind(durable)}: {ratio:.2f}")

    def rabbitmq(self) -> None:
        """The shovel A → B, node B behind the proxy, persistent; a rate per round trip."""
        if not rabbitmq_installed():
            print("RabbitMQ: not installed (apt-get install rabbitmq-server): comparison skipped")
            return
        epmd_port = free_port()
        plugins = ("rabbitmq_amqp1_0", "rabbitmq_shovel")
        try:
            with (
                rabbitmq_node(self.folder, "wan-a", plugins, epmd_port) as node_a,
                rabbitmq_node(self.folder, "wan-b", plugins, epmd_port) as node_b,
            ):
                print(f"RabbitMQ {node_a.ctl('version')}: dynamic shovel A → B (AMQP 0-9-1, on-confirm)", flush=True)
                for rtt in self.args.rtt_list:
                    with wan_proxy(node_b.port, rtt, self.args) as proxy:
                        queue = f"shovelled{int(rtt)}"
                        start_shovel(node_a, queue, queue, node_a.port, proxy)
                        rate = run_round(
                            self.loadgen,
                            (node_a.port, f"/amq/queue/{queue}"),
                            (node_b.port, f"/amq/queue/{queue}"),
                            self.count(True),
                            durable=True,
                            size=self.args.size,
                            credentials=("guest", "guest"),
                            timeout=self.args.timeout,
                        )
                        node_a.ctl("clear_parameter", "shovel", queue)
                        self.shovel[rtt] = rate
                        label = f"RabbitMQ shovel, persistent, {rtt:g} ms"
                        base = self.shovel[self.args.rtt_list[0]]
                        print(f"{label:52} {rate:>9,.0f} msgs/s {rate / base:5.2f} of 0 ms", flush=True)
        finally:
            stop_epmd(epmd_port)


def main(args: argparse.Namespace) -> None:
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build the load generator")
    args.rtt_list = [float(x) for x in args.rtts.split(",")]
    args.xa_modes = [{"xa": True, "nonxa": False}[m] for m in args.modes.split(",")]
    args.durabilities = [{"persistent": True, "non-persistent": False}[k] for k in args.kinds.split(",")]
    sections = set(args.only.split(",")) if args.only else set(SECTIONS) - {"compression"}
    if args.text:
        os.environ["LOADGEN_TEXT"] = "1"  # the load generator's text bodies (amqp_loadgen.c)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(args.folder or name)
        bench = Bench(build_loadgen(folder), folder, args)
        print(
            f"C sender on A to q@B, C receiver on B, {args.size}-byte messages; {args.messages:,} messages a round "
            f"({args.messages // 2:,} persistent); jitter ±{args.jitter_ms:g} ms; "
            f"cap {f'{args.mbit:g} Mbit/s' if args.mbit else 'none'}; link settings: {args.link or 'defaults'}; "
            f"{'text' if args.text else 'one repeated byte'} bodies; "
            f"{os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            flush=True,
        )
        if "one-hop" in sections:
            bench.paths(("A", "B"), "one hop")
        if "two-hops" in sections:
            bench.paths(("A", "M", "B"), "two hops")
        if "compression" in sections:
            bench.compression()
        if "rabbitmq" in sections:
            try:
                bench.rabbitmq()
            except RuntimeError as exc:
                print(f"RabbitMQ shovel: failed: {exc}")
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for rtt, shovel in bench.shovel.items():
            for xa in args.xa_modes:
                rate = bench.results.get(("one hop", True, xa, rtt))
                if rate:
                    print(
                        f"ratio one hop, persistent, {'XA' if xa else 'non-XA'}, {rtt:g} ms: "
                        f"{rate / shovel:.2f}x the RabbitMQ shovel"
                    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per non-persistent round (half persistent)")
    parser.add_argument("--size", type=int, default=100, help="message body bytes")
    parser.add_argument("--rtts", default="0,20,50,100,200", help="round trips in ms, the first is the base")
    parser.add_argument("--only", help=f"a comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--modes", default="xa,nonxa")
    parser.add_argument("--kinds", default="persistent,non-persistent")
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--mbit", type=float, default=0.0, help="bandwidth cap per direction (0: none)")
    parser.add_argument("--link", default="", help="more attributes for both ends of every link")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a round may take")
    parser.add_argument("--folder", help="keep the routers' folders (configs, stores, logs) here")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per row (on one network); the best is printed")
    parser.add_argument("--text", action="store_true", help="text-like bodies (64 different ones), not one byte")
    main(parser.parse_args())
