"""Connection soak: a ``martinet run`` router's memory before and after thousands of
short connections. Prints RSS figures.

    .venv/bin/python bench/connection_soak.py [--connections N] [--wave W] [--warmup N]

The router runs as a real process (``python -m martinet.kernel run``: the same collector
settings as in production, ``gc.freeze()`` and a rare full collection), its listener on a
loopback port it picks. Each connection, written as raw AMQP frames (anonymous, no SASL):
open, begin, a sender to queue ``soak`` and a receiver from it (settled deliveries: what
the receivers of the connections at work get is gone, so the queue stays near empty);
once the router granted credit, one settled message and close, then wait for the
router's close. Connections come in waves of ``--wave`` open at once (each sends and
closes once all of its wave are open): a connection that lives through the collections
its wave's arrival makes is promoted to the oldest generation, where what it leaves when
it closes waits for a full collection.

RSS (``VmRSS`` of ``/proc/<pid>/status``) is read after a warm-up of ``--warmup``
connections (the start figure: imports, caches and pools are then in place) and after the
soak. Closed connections that the router keeps (reference cycles that only a full
collection frees) show as growth; a router that frees them stays near the start.
tests/swiftlets/jms/test_hostile_limits.py runs :func:`soak` and asserts a bound.
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from martinet.messaging.codec import Described, UByte, UInt, ULong, encode

ROUTER = """<router name="soak" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{folder}/store" sync="normal"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="0" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>
"""
HEADER = b"AMQP\x00\x01\x00\x00"


def frame(code: int, fields: list, payload: bytes = b"", channel: int = 0) -> bytes:
    body = b"\x00\x53" + bytes([code]) + encode(fields) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def terminus(code: int, address: str) -> Described:
    return Described(ULong(code), [address])


OPENING = (
    frame(0x11, [None, UInt(0), UInt(1000), UInt(1000)])
    + frame(0x12, ["out", UInt(0), False, None, None, None, terminus(0x29, "soak"), None, None, UInt(0)])
    + frame(0x12, ["in", UInt(1), True, UByte(1), None, terminus(0x28, "soak"), None])
    + frame(0x13, [UInt(0), UInt(1000), UInt(0), UInt(1000), UInt(1), UInt(0), UInt(10)])
)
MESSAGE = b"\x00\x53\x77\xa1\x05hello"
SENDING = frame(0x14, [UInt(0), UInt(0), b"t", UInt(0), True], MESSAGE)
CLOSING = frame(0x18, [])


def rss_kib(pid: int) -> int:
    """The process's resident set, in KiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1))


async def one_connection(port: int, number: int, opened: Any, all_open: trio.Event) -> None:
    """Open, attach a sender and a receiver; once credit came and every connection of the
    wave is that far (``opened()``, then ``all_open``), send one message and close; the
    router's close answered."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(HEADER + frame(0x10, [f"soak-{number}"]) + OPENING)  # (client ids are unique)
        received = b""
        while b"\x00\x53\x13" not in received:  # a flow: credit for the sender
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise RuntimeError("the router closed the connection early")
            received += chunk
        opened()
        await all_open.wait()
        await stream.send_all(SENDING + CLOSING)
        while await stream.receive_some(65536):  # until the router closed it
            pass
    finally:
        await stream.aclose()


async def connections(port: int, count: int, wave: int) -> None:
    """``count`` connections in waves of ``wave`` open at once."""
    for first in range(0, count, wave):
        size = min(wave, count - first)
        barrier = _Barrier(size)
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for number in range(first, first + size):
                    nursery.start_soon(one_connection, port, number, barrier.arrived, barrier.all_in)


class _Barrier:
    """``all_in`` is set once ``arrived`` was called ``size`` times."""

    def __init__(self, size: int):
        self.waiting = size
        self.all_in = trio.Event()

    def arrived(self) -> None:
        self.waiting -= 1
        if not self.waiting:
            self.all_in.set()


class Router:
    """``python -m martinet.kernel run`` on a config in a temporary folder."""

    def __init__(self, folder: Path):
        config = folder / "router.xml"
        config.write_text(ROUTER.format(folder=folder))
        self.log = folder / "stderr.log"
        with self.log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "martinet.kernel", "run", str(config)],
                cwd=folder,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + 60
        while not (match := re.search(r"AMQP listener amqp on [\d.]+:(\d+)", self.log.read_text())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the router did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        self.port = int(match.group(1))

    @property
    def rss_kib(self) -> int:
        return rss_kib(self.process.pid)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def soak(count: int, *, warmup: int = 500, wave: int = 500) -> tuple[int, int]:
    """(RSS after the warm-up, RSS after ``count`` more connections), in KiB."""
    with tempfile.TemporaryDirectory() as folder:
        router = Router(Path(folder))
        try:
            trio.run(connections, router.port, warmup, wave)
            time.sleep(0.5)  # the router's cleanup of the last ones (a bound on memory, not a timing)
            start = router.rss_kib
            trio.run(connections, router.port, count, wave)
            time.sleep(0.5)
            return start, router.rss_kib
        finally:
            router.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--wave", type=int, default=500)
    args = parser.parse_args()
    began = time.monotonic()
    start, end = soak(args.connections, warmup=args.warmup, wave=args.wave)
    print(
        f"router RSS after {args.warmup} warm-up connections: {start / 1024:.1f} MiB; "
        f"after {args.connections} more: {end / 1024:.1f} MiB ({(end - start) / 1024:+.1f} MiB; "
        f"{(end - start) * 1024 / args.connections:.0f} bytes per connection); {time.monotonic() - began:.0f} s"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
