"""A long persistent backlog over AMQP: router RSS and the consumer's rate, bodies in the store vs in memory.

    .venv/bin/python bench/backlog_bench.py [--messages N] [--size BYTES]

A ``martinet run`` router process (``sync="normal"``), our C load generator
(``bench/amqp_loadgen.c``, built as ``bench/amqp_bench.py`` builds it). For each queue
setting — the default ``cache-size`` (500; bodies beyond it only in the store) and
``cache-size="-1" cache-size-bytes-kb="-1"`` (every body in memory, as before bodies
were swapped out) — and each way of getting to the backlog — ``live`` (sent to the running router) and
``restarted`` (sent, then the router stopped and started again on its store) — one sender
puts ``N`` persistent messages of ``BYTES`` into a queue nobody reads (its limits and flow
control off), then one receiver takes and accepts them all. Printed: the router's RSS
(``VmRSS``) before the backlog, with it, and the receiver's rate (messages per second,
first to last receive).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from amqp_bench import build_loadgen, free_port, wait_for_port

ROUTER = """<router name="bench" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{folder}/store" sync="normal"/>
  <swiftlet name="sys$queuemanager">
    <queues><queue name="backlog" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1" {cache}/></queues>
  </swiftlet>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""

SETTINGS = {"cache-size 500 (default)": "", "cache off (-1)": 'cache-size="-1" cache-size-bytes-kb="-1"'}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Router:
    def __init__(self, folder: Path, cache: str):
        self.folder = folder
        self.port = free_port()
        self.config = folder / "router.xml"
        self.config.write_text(ROUTER.format(folder=folder, port=self.port, cache=cache))
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with (self.folder / "martinet.log").open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "martinet.kernel", "run", str(self.config)], stderr=log, cwd=self.folder
            )
        wait_for_port(self.port, 300, self.process)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)


def loadgen_run(loadgen: Path, mode: str, port: int, count: int, size: int) -> float:
    """Run the load generator; its rate (messages per second, first to last)."""
    done = subprocess.run(
        [str(loadgen), mode, "127.0.0.1", str(port), "backlog", str(count), str(size), "durable"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        raise RuntimeError(f"load generator {mode} failed: {done.stderr.strip()}")
    return float(done.stdout.split()[4])


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as name:
        loadgen = build_loadgen(Path(name))
        print(
            f"{args.messages:,} persistent messages of {args.size} bytes, one C sender then one C receiver", flush=True
        )
        for label, cache in SETTINGS.items():
            for restarted in (False, True):
                with tempfile.TemporaryDirectory() as folder:
                    router = Router(Path(folder), cache)
                    router.start()
                    before = rss_mib(router.process.pid)
                    sent = loadgen_run(loadgen, "send", router.port, args.messages, args.size)
                    if restarted:
                        router.stop()
                        router.start()
                    backlog = rss_mib(router.process.pid)
                    rate = loadgen_run(loadgen, "recv", router.port, args.messages, args.size)
                    after = rss_mib(router.process.pid)
                    router.stop()
                print(
                    f"{label:24} {'restarted' if restarted else 'live':9}: RSS {before:6.1f} MiB empty, "
                    f"{backlog:7.1f} MiB with the backlog, {after:7.1f} MiB after consuming it; "
                    f"sent at {sent:,.0f}/s, consumed at {rate:,.0f} msgs/s",
                    flush=True,
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    main(parser.parse_args())
