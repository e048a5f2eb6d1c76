"""Memory of recovery: RSS after a router recovered N stored 100-byte messages, and after
all of them were consumed; and the time the router took to start with them.

    python bench/recovery_bench.py --count 200000

Phase 1 (this process) fills a store with N durable messages through sys$store. Phase 2 (a
fresh process, so that phase 1's memory does not count) starts a router with sys$store and
sys$queuemanager on that store and prints its RSS: before the router starts, once it has
recovered, and once every message was consumed (accepted, deletes committed, gc run; then
again after ``malloc_trim(0)``, since glibc keeps freed heap and RSS alone would hide it).
It also counts the ``StoredMessage`` objects still alive: 0 means the store let go of them.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio
from _router import accept_all

from martinet.kernel import Router
from martinet.messaging.message import build
from martinet.swiftlets.store.api import PutMessage, StoredMessage

CONFIG = """<router name="bench" startorder="sys$store{manager}">
  <swiftlet name="sys$store" path="{path}" sync="off"/>
</router>"""


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def trim() -> bool:
    """Give freed heap back to the OS (glibc keeps it otherwise, so RSS alone hides frees)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


async def fill(folder: Path, count: int, size: int) -> None:
    path = folder / "fill.xml"
    path.write_text(CONFIG.format(path=folder / "store", manager=""))
    router = Router.from_file(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        store = router.swiftlet("sys$store")
        body = build(b"x" * size, durable=True).raw
        for start in range(1, count + 1, 10_000):
            await store.commit([PutMessage(n, "q", body) for n in range(start, min(start + 10_000, count + 1))])
        router.request_stop()


def held() -> str:
    """Python heap in use (tracemalloc), which RSS hides once pymalloc arenas are fragmented."""
    return f"; traced heap {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MiB" if tracemalloc.is_tracing() else ""


async def recover(folder: Path, count: int, traced: bool) -> None:
    path = folder / "recover.xml"
    path.write_text(CONFIG.format(path=folder / "store", manager=" sys$queuemanager"))
    if traced:
        tracemalloc.start()
    print(f"RSS before start:        {rss_mib():8.1f} MiB")
    router = Router.from_file(path)
    async with trio.open_nursery() as nursery:
        begin = time.perf_counter()
        await nursery.start(router.run)
        print(f"router started in {time.perf_counter() - begin:.1f} s (the store's recovery and the queue manager's)")
        queue = router.swiftlet("sys$queuemanager").queue("q")
        gc.collect()
        alive = sum(isinstance(o, StoredMessage) for o in gc.get_objects())
        print(f"RSS after recovering {count}: {rss_mib():8.1f} MiB  (StoredMessage objects alive: {alive}{held()})")
        consumer = queue.consumer()
        consumer.flow(count)
        await accept_all(consumer, count)
        consumer.close()
        store = router.swiftlet("sys$store")
        await store.commit([])  # nothing; the deletes go in the background:
        while router.management.get("/sys$store/usage", "pending-operations") or queue.size:
            await trio.sleep(0.1)
        await trio.sleep(1)
        gc.collect()
        alive = sum(isinstance(o, StoredMessage) for o in gc.get_objects())
        print(
            f"RSS after consuming all: {rss_mib():8.1f} MiB  (queue size {queue.size}, StoredMessage "
            f"objects alive: {alive}{held()})"
        )
        trimmed = trim()
        print(f"  after malloc_trim(0):  {rss_mib():8.1f} MiB" if trimmed else "  (no malloc_trim here)")
        router.request_stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--trace", action="store_true", help="also report tracemalloc's heap (slower)")
    parser.add_argument("--recover", type=Path, help=argparse.SUPPRESS)  # phase 2, in a fresh process
    args = parser.parse_args()
    if args.recover is not None:
        trio.run(recover, args.recover, args.count, args.trace)
        return
    with tempfile.TemporaryDirectory() as folder:
        trio.run(fill, Path(folder), args.count, args.size)
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--count",
                str(args.count),
                "--recover",
                folder,
                *(["--trace"] if args.trace else []),
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
