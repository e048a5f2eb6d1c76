"""Topic fan-out in-process: 1 publisher → 1, 10 and 100 subscribers. Prints its figures.

    .venv/bin/python bench/topic_bench.py [--messages N]

100-byte non-persistent messages published to ``bench.prices`` with subscribers on
``bench`` (each a non-durable subscription read by a consumer task that accepts every
message). Deliveries per second = messages × subscribers / elapsed time, counting until
every subscriber has received every message.
"""

from __future__ import annotations

import argparse
import time

import trio
from _router import accept_all, running_router

from martinet.kernel import Router
from martinet.messaging.message import build

CONFIG = """<router name="bench" startorder="sys$store sys$queuemanager sys$topicmanager">
  <swiftlet name="sys$store" path="{path}"/>
</router>"""


async def fan_out(router: Router, subscribers: int, count: int) -> float:
    topic_manager = router.swiftlet("sys$topicmanager")
    subscriptions = [topic_manager.subscribe("bench") for _ in range(subscribers)]
    message = build(b"p" * 100, message_id="ID:bench:1")
    done = trio.Semaphore(0)

    async def consume(subscription):
        consumer = subscription.consumer()
        consumer.flow(count)
        await accept_all(consumer, count)
        done.release()

    begin = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for subscription in subscriptions:
            nursery.start_soon(consume, subscription)
        for n in range(count):
            topic_manager.publish("bench.prices", message)
            if n % 50 == 49:
                await trio.sleep(0)  # as a listener yields between batches of frames
        for _ in subscriptions:
            await done.acquire()
    elapsed = time.perf_counter() - begin
    for subscription in subscriptions:
        subscription.close()
    return count * subscribers / elapsed


async def main(args: argparse.Namespace) -> None:
    async with running_router(CONFIG) as router:
        for subscribers in (1, 10, 100):
            count = max(args.messages // subscribers, 1000)
            rate = await fan_out(router, subscribers, count)
            print(
                f"fan-out to {subscribers:>3} subscriber(s): {rate:>10,.0f} deliveries/s "
                f"({count:,} messages, 100-byte, non-persistent)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="deliveries per round (about)")
    trio.run(main, parser.parse_args())
