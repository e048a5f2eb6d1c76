"""Router memory per queued message, in-process; consuming a queue whose bodies are in the store.

    .venv/bin/python bench/memory_bench.py [--messages N] [--size BYTES] [--cases CASE ...]

A real router (sys$store on a temporary SQLite file, ``sync="normal"``; sys$queuemanager)
in this process; ``N`` messages with a ``BYTES`` body, built like a JMS client's (header,
properties with a uuid message-id and creation-time, two application properties: 97 bytes
before the body), are sent to a queue nobody reads (its ``max-messages``, ``max-bytes``
and flow control off, so that every message stays). Printed per case: the growth of the
router process's resident set (RSS, from ``/proc/self/statm``, after a full garbage
collection) per queued message next to the encoded message size, the queue's
``cached``/``swapped`` counts, what the router's memory budget (``memory-limit-kb``)
counts per message (``memory-used``), and for the persistent cases the time to consume the
whole queue (one in-process consumer, credit 1000, accepting each delivery; swapped-out
bodies are read back from the store process in batches) and the CPU time per message the
router and the store process used meanwhile (the figure that survives a machine shared
with other work, where the time does not). Every case runs in a fresh process, so that one
case's freed memory does not flatter the next.

Cases:

- ``transient``: non-persistent messages (always in memory);
- ``persistent``: persistent messages, the queue's default ``cache-size`` (500) and
  ``cache-size-bytes-kb`` (16 MiB): bodies beyond the cache are only in the store (its own
  process, not counted here);
- ``persistent-all``: persistent messages with ``cache-size="-1"`` and
  ``cache-size-bytes-kb="-1"``: every body stays in memory (the behaviour before bodies
  were swapped out);

plus, with the figures of the two persistent cases, the router's RSS for a queue full to
the default ``max-messages`` of such messages.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import uuid
from random import Random

import trio
from _router import accept_all, running_router

from martinet.kernel import Router
from martinet.messaging.message import build
from martinet.swiftlets.queuemanager.api import QueueSettings

CONFIG = """<router name="bench" startorder="sys$store sys$queuemanager">
  <swiftlet name="sys$store" path="{path}" sync="normal"/>
  <swiftlet name="sys$queuemanager">
    <queues>
      <queue name="transient" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"/>
      <queue name="persistent" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"/>
      <queue name="persistent-all" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"
             cache-size="-1" cache-size-bytes-kb="-1"/>
    </queues>
  </swiftlet>
</router>"""

PAGE = os.sysconf("SC_PAGE_SIZE")
CASES = ("transient", "persistent", "persistent-all")


def rss() -> int:
    """This process's resident set in bytes, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


_IDS = Random(1)  # (seeded: every run queues the same messages)


def make_message(n: int, size: int, durable: bool):
    return build(
        b"x" * size,
        durable=durable,
        message_id=f"ID:{uuid.UUID(int=_IDS.getrandbits(128), version=4)}",  # as our JMS client makes them
        creation_time=1_700_000_000_000 + n,
        properties={"n": n, "kind": "bench"},
    )


async def fill(router: Router, queue_name: str, count: int, size: int, durable: bool) -> tuple[float, int]:
    """RSS growth per message for ``count`` queued messages, and one message's encoded size."""
    queue_manager = router.swiftlet("sys$queuemanager")
    window = trio.Semaphore(5000)

    def stored(error: BaseException | None) -> None:
        assert error is None, error
        window.release()

    before = rss()
    for n in range(count):
        if durable:
            await window.acquire()
        queue_manager.send_nowait(queue_name, make_message(n, size, durable), on_durable=stored if durable else None)
        if n % 1000 == 999:
            await trio.sleep(0)
    for _ in range(5000 if durable else 0):  # every persistent send is stored
        await window.acquire()
    await trio.sleep(0.5)  # let the store's usage settle
    assert queue_manager.queue(queue_name).size == count
    return (rss() - before) / count, len(make_message(count, size, durable).raw)


def store_process_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's children: the store process."""
    total = 0.0
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as children:
            for pid in children.read().split():
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def consume(router: Router, queue_name: str, count: int) -> tuple[float, float, float]:
    """Seconds to consume ``count`` messages (credit kept at 1000, each accepted), and the CPU
    seconds the router (this process) and the store process used meanwhile."""
    queue = router.swiftlet("sys$queuemanager").queue(queue_name)
    consumer = queue.consumer()
    begin, cpu, store_cpu = time.perf_counter(), time.process_time(), store_process_cpu()
    for done in range(0, count, 1000):
        consumer.flow(min(1000, count - done))
        await accept_all(consumer, min(1000, count - done))
    elapsed = time.perf_counter() - begin
    assert queue.size == 0
    return elapsed, time.process_time() - cpu, store_process_cpu() - store_cpu


async def run_case(args: argparse.Namespace) -> dict:
    name = args.case
    async with running_router(CONFIG) as router:
        begin = time.perf_counter()
        per_message, encoded = await fill(router, name, args.messages, args.size, name != "transient")
        filled = time.perf_counter() - begin
        figures = router.management.resolve(f"/sys$queuemanager/usage/queues/{name}").properties()
        result = {
            "case": name,
            "per_message": per_message,
            "encoded": encoded,
            "filled": filled,
            "cached": figures["cached"],
            "swapped": figures["swapped"],
            # what the router's memory budget counts for them (memory-limit-kb), per message
            "accounted": router.management.get("/sys$queuemanager/usage", "memory-used") / args.messages,
        }
        if name != "transient":
            result["consumed"], result["cpu"], result["store_cpu"] = await consume(router, name, args.messages)
            figures = router.management.resolve(f"/sys$queuemanager/usage/queues/{name}").properties()
            result["reads"] = figures["reads"]
    return result


def main(args: argparse.Namespace) -> None:
    if args.case:
        print(json.dumps(trio.run(run_case, args)))
        return
    defaults = QueueSettings()
    results = {}
    for case in args.cases:
        output = subprocess.run(
            [sys.executable, __file__, "--case", case, "--messages", str(args.messages), "--size", str(args.size)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result = results[case] = json.loads(output.splitlines()[-1])
        line = (
            f"{case:15}: RSS +{result['per_message'] * args.messages / 2**20:,.0f} MiB, "
            f"{result['per_message']:,.0f} bytes per queued message ({result['encoded']} "
            f"encoded bytes, {args.size}-byte body; {args.messages:,} queued in {result['filled']:.1f} s; "
            f"cached {result['cached']:,}, swapped {result['swapped']:,}; the memory budget counts "
            f"{result['accounted']:,.0f} bytes per message)"
        )
        if "consumed" in result:
            line += (
                f"; consumed in {result['consumed']:.2f} s = {args.messages / result['consumed']:,.0f} msg/s "
                f"({result['reads']:,} reads from the store), CPU per message: router "
                f"{result['cpu'] / args.messages * 1e6:.1f} µs, store process "
                f"{result['store_cpu'] / args.messages * 1e6:.1f} µs"
            )
        print(line, flush=True)
    for case in ("persistent", "persistent-all"):
        if case in results:
            per_message = results[case]["per_message"]
            print(
                f"default max-messages {defaults.max_messages:,} of such messages, {case}: about "
                f"{defaults.max_messages * per_message / 2**20:,.0f} MiB of RSS",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process
    main(parser.parse_args())
