"""Router memory per queued message, in-process. Prints its figures.

    .venv/bin/python bench/memory_bench.py [--messages N] [--size BYTES]

A real router (sys$store on a temporary SQLite file, ``sync="normal"``; sys$queuemanager)
in this process; ``N`` messages with a ``BYTES`` body, built like a JMS client's (header,
properties with message-id and creation-time, two application properties), are sent to a
queue nobody reads (its ``max-messages``, ``max-bytes`` and flow control off, so that every
message stays). Printed: the growth of this process's resident set (RSS, from
``/proc/self/statm``, after a full garbage collection) per queued message, for
non-persistent and for persistent messages (a persistent message is also in the store, in
its own process, not counted here), next to the encoded message size; and the router's
usage of the default memory budget (the default ``max-messages`` and ``max-bytes``).

The router keeps every queued message's bytes in memory, persistent ones too: the RSS
per persistent message is the figure a queue of stored messages costs (issue 13, 7c part 3,
moving bodies of long queues out of memory, is not done yet).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import trio
from _router import running_router

from martinet.kernel import Router
from martinet.messaging.message import build
from martinet.swiftlets.queuemanager.api import QueueSettings

CONFIG = """<router name="bench" startorder="sys$store sys$queuemanager">
  <swiftlet name="sys$store" path="{path}" sync="normal"/>
  <swiftlet name="sys$queuemanager">
    <queues>
      <queue name="transient" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"/>
      <queue name="persistent" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"/>
    </queues>
  </swiftlet>
</router>"""

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """This process's resident set in bytes, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def make_message(n: int, size: int, durable: bool):
    return build(b"x" * size, durable=durable, message_id=f"ID:bench:{n}", creation_time=1_700_000_000_000 + n,
                 properties={"n": n, "kind": "bench"})


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


async def main(args: argparse.Namespace) -> None:
    defaults = QueueSettings()
    async with running_router(CONFIG) as router:
        for durable in (False, True):
            begin = time.perf_counter()
            name = "persistent" if durable else "transient"
            per_message, encoded = await fill(router, name, args.messages, args.size, durable)
            print(f"{name:10}: {per_message:,.0f} bytes of RSS per queued message ({encoded} encoded bytes, "
                  f"{args.size}-byte body; {args.messages:,} queued in {time.perf_counter() - begin:.1f} s)",
                  flush=True)
    budget = min(defaults.max_messages * per_message, defaults.max_bytes / encoded * per_message)
    print(f"default budget per queue: max-messages {defaults.max_messages:,}, max-bytes "
          f"{defaults.max_bytes / 2**20:.0f} MiB: at most about {budget / 2**20:,.0f} MiB of RSS for one full queue "
          f"of such messages", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    trio.run(main, parser.parse_args())
