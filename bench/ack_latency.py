"""Producer acknowledgement latency for persistent messages at a steady rate. Prints figures.

    .venv/bin/python bench/ack_latency.py [--rate 1000] [--seconds 30] [--runs 1] [--folder DIR]
                                          [--no-consumer] [--baseline-seconds 10]

A router runs as a real ``martinet run`` process (``sys$store`` with ``sync="full"``, its
store in a temporary folder under ``--folder``, default the system's temp folder). A
producer (our client, in this process) sends persistent 100-byte messages to one queue at a
steady ``--rate`` per second, open loop: message *i* is sent at ``start + i / rate`` by its
own task, whether or not earlier ones were acknowledged, so a stall shows as latency
instead of a slower rate (no coordinated omission). For each message it measures send →
accepted (the router settles a persistent message once its group commit is durable) and
prints p50 / p90 / p99 / p99.9 / max over the run. The garbage collector of this process is
off during a run so that the figures are the router's, not the client's.

A consumer (our client, in a child process) accepts everything, as in production; with
``--no-consumer`` the queue just fills (its flow control is off so the producer is never
held back).

The baseline, on the same disk: the same rate of bare 4 KiB ``write`` + ``fsync`` on one file
(``os.pwrite`` at a rolling offset, like a WAL append), its latency percentiles — what
the disk gives before any database or router adds to it.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROUTER = """<router name="latency" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{folder}/store" sync="full"/>
  <swiftlet name="sys$queuemanager">
    <queues><queue name="latency" flowcontrol-start-queuesize="{start}"/></queues>
  </swiftlet>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, timeout: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the router exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def percentiles(samples: list[float]) -> str:
    """p50 / p90 / p99 / p99.9 / max of ``samples`` (seconds), in ms."""
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000

    return (
        f"p50 {at(0.50):6.2f}  p90 {at(0.90):6.2f}  p99 {at(0.99):6.2f}  p99.9 {at(0.999):7.2f}  "
        f"max {ordered[-1] * 1000:7.2f} ms  ({len(ordered):,} samples)"
    )


def baseline(folder: Path, rate: int, seconds: float) -> list[float]:
    """Latencies of ``rate`` 4 KiB write + fsync per second on a file in ``folder``."""
    path = folder / "fsync-baseline"
    block = os.urandom(4096)
    latencies = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            begin = time.perf_counter()
            os.pwrite(fd, block, (i % 4096) * 4096)  # a rolling 16 MiB, like a WAL file
            os.fsync(fd)
            latencies.append(time.perf_counter() - begin)
    finally:
        os.close(fd)
        path.unlink()
    return latencies


async def produce(url: str, rate: int, seconds: float) -> list[float]:
    """Send persistent 100-byte messages at ``rate``/s for ``seconds``; each one's send → accepted."""
    from martinet.messaging.client import DeliveryMode, Queue, TextMessage, connect

    latencies: list[float] = []
    body = "x" * 100
    async with connect(url) as connection:
        session = await connection.session()
        producer = await session.producer(Queue("latency"), delivery_mode=DeliveryMode.PERSISTENT)
        for _ in range(200):  # warm up: connection, store, code paths
            await producer.send(TextMessage(body))

        async def one(message: TextMessage) -> None:
            begin = time.perf_counter()
            await producer.send(message)
            latencies.append(time.perf_counter() - begin)

        gc.collect()
        gc.disable()
        try:
            async with trio.open_nursery() as nursery:
                start = trio.current_time()
                for i in range(int(rate * seconds)):
                    await trio.sleep_until(start + i / rate)
                    nursery.start_soon(one, TextMessage(body))
        finally:
            gc.enable()
    return latencies


async def consume(url: str) -> None:
    """Accept every message of queue ``latency`` until killed."""
    from martinet.messaging.client import Queue, connect

    async with connect(url) as connection:
        session = await connection.session()
        async with session.consumer(Queue("latency")) as consumer:
            async for _ in consumer:
                pass


def main(args: argparse.Namespace) -> None:
    root = Path(args.folder) if args.folder else None
    with tempfile.TemporaryDirectory(dir=root) as name:
        folder = Path(name)
        print(
            f"persistent 100-byte messages at {args.rate}/s for {args.seconds} s, send -> accepted, "
            f"sync=full, store in {folder} ({os.cpu_count()} CPUs); "
            f"{'no consumer' if args.no_consumer else 'a consumer in another process'}",
            flush=True,
        )
        for run in range(1, args.runs + 1):
            port = free_port()
            config = folder / "router.xml"
            config.write_text(ROUTER.format(folder=folder, port=port, start=-1 if args.no_consumer else 400))
            url = f"amqp://127.0.0.1:{port}"
            with (folder / "router.log").open("w") as log:
                router = subprocess.Popen(
                    [sys.executable, "-m", "martinet.kernel", "run", str(config)], stderr=log, cwd=folder
                )
            consumer = None
            try:
                wait_for_port(port, 60, router)
                if not args.no_consumer:
                    consumer = subprocess.Popen([sys.executable, __file__, "--consume", url])
                latencies = trio.run(produce, url, args.rate, args.seconds)
                print(f"router  run {run}: {percentiles(latencies)}", flush=True)
            finally:
                if consumer is not None:
                    consumer.kill()
                    consumer.wait()
                router.send_signal(signal.SIGTERM)
                router.wait(60)
            for leftover in (folder / "store").glob("*"):
                leftover.unlink()
        if args.baseline_seconds > 0:
            latencies = baseline(folder, args.rate, args.baseline_seconds)
            print(
                f"4 KiB write + fsync, same disk, {args.rate}/s for {args.baseline_seconds} s: "
                f"{percentiles(latencies)}",
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--consume":
        trio.run(consume, sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=30, help="length of one run")
    parser.add_argument("--runs", type=int, default=1, help="runs, each with a new router and store")
    parser.add_argument("--folder", help="where the store and the baseline file go (default: temp folder)")
    parser.add_argument("--no-consumer", action="store_true", help="let the queue fill instead")
    parser.add_argument("--baseline-seconds", type=float, default=10, help="0: no write + fsync baseline")
    main(parser.parse_args())
