"""A queue bridge's own cost: messages/s it moves from a backlog, by transaction size.

    .venv/bin/python bench/bridge_bench.py [--messages N] [--size BYTES]

One router in this process (``sync="normal"`` store, queue manager, routing without links).
For each ``transaction-size`` (1, 10, 100, 1000) the queue ``outbox`` is filled with ``N``
persistent messages of ``BYTES`` (flow control and limits off), then a bridge ``outbox`` →
``inbox@bench`` (this router: the same local transaction a bridge to another router does,
without the transfer after it) is added at runtime; printed: the rate from the add until
``inbox`` holds all ``N`` (each batch is one store commit: acknowledgements and sends).
"""

from __future__ import annotations

import argparse
import time

import trio
from _router import running_router

from martinet.messaging.message import build

CONFIG = """<router name="bench" startorder="sys$store sys$queuemanager sys$routing">
  <swiftlet name="sys$store" path="{path}/store" sync="normal"/>
  <swiftlet name="sys$queuemanager">
    <queues>
      <queue name="outbox" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"/>
      <queue name="inbox" max-messages="-1" max-bytes="-1" flowcontrol-start-queuesize="-1"/>
    </queues>
  </swiftlet>
  <swiftlet name="sys$routing"/>
</router>"""


async def fill(manager, count: int, size: int) -> None:
    stored = 0
    done = trio.Event()

    def durable(error: BaseException | None) -> None:
        nonlocal stored
        if error is not None:
            raise error
        stored += 1
        if stored == count:
            done.set()

    body = b"x" * size
    for _ in range(count):
        manager.send_nowait("outbox", build(body, durable=True), on_durable=durable)
        if manager.queues["outbox"].size % 1000 == 0:
            await trio.sleep(0)  # let the store's group commits go
    await done.wait()


async def run(args: argparse.Namespace) -> None:
    print(f"{args.messages:,} persistent messages of {args.size} bytes moved by a bridge outbox -> inbox@bench")
    for size in (1, 10, 100, 1000):
        async with running_router(CONFIG) as router:
            manager = router.swiftlet("sys$queuemanager")
            await fill(manager, args.messages, args.size)
            inbox = manager.queues["inbox"]
            start = time.perf_counter()
            router.management.add(
                "/sys$routing/queue-bridges",
                "b",
                {"source-queue": "outbox", "destination": "inbox@bench", "transaction-size": str(size)},
            )
            while inbox.size < args.messages:
                await trio.sleep(0.01)
            elapsed = time.perf_counter() - start
            print(f"  transaction-size {size:>5}: {args.messages / elapsed:>9,.0f} msg/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
