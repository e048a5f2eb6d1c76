"""Queue manager throughput and memory, in-process. Prints its figures.

    .venv/bin/python bench/queue_bench.py [--messages N] [--sync full|normal|off]

One producer task and one consumer task on one queue of a real router (sys$store on a
temporary SQLite file, sys$queuemanager), 1 KB messages built like a JMS client's (header,
properties with message-id and creation-time, two application properties, data body):

- persistent: the producer keeps up to 1000 sends in flight (as an AMQP producer with
  unsettled deliveries does; ``send_nowait`` with a callback when the message is
  durable); the consumer accepts each delivery. Prints msgs/s, store transactions (fsyncs) per second
  and how many messages never reached the disk (stored and consumed in one group commit).
- non-persistent: the same load without the store.
- memory: 1,000,000 queued 100-byte messages (no consumer); tracemalloc's count of bytes
  allocated per queued message beyond the message's own 100 bytes.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import trio
from _router import accept_all, running_router

from martinet.kernel import Router
from martinet.messaging.message import build

CONFIG = """<router name="bench" startorder="sys$store sys$queuemanager">
  <swiftlet name="sys$store" path="{path}" sync="{sync}"/>
  <swiftlet name="sys$queuemanager">
    <queues><queue name="memory" max-messages="-1" max-bytes="-1"/></queues>
  </swiftlet>
</router>"""


def make_message(n: int, size: int, durable: bool):
    return build(
        b"x" * size,
        durable=durable,
        message_id=f"ID:bench:{n}",
        creation_time=1_700_000_000_000 + n,
        properties={"n": n, "kind": "bench"},
    )


async def throughput(router: Router, count: int, durable: bool) -> tuple[float, dict]:
    queue_manager = router.swiftlet("sys$queuemanager")
    queue_name = "persistent" if durable else "transient"
    messages = [make_message(n, 1024 - 120, durable) for n in range(count)]
    consumer = queue_manager.queue(queue_name).consumer()
    consumer.flow(count)
    store_before = router.management.resolve("/sys$store/usage").properties()
    window = trio.Semaphore(1000)

    def stored(error):
        assert error is None, error
        window.release()

    async def produce():
        for n, message in enumerate(messages):
            try:  # at most 1000 unsettled sends, as a producer's link credit allows
                window.acquire_nowait()
            except trio.WouldBlock:
                await window.acquire()
            queue_manager.send_nowait(queue_name, message, on_durable=stored)
            if n % 100 == 99:
                await trio.sleep(0)  # as a listener yields after each batch of frames it read
        for _ in range(1000):  # until every send is durable
            await window.acquire()

    async def consume():
        await accept_all(consumer, count)

    begin = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await produce()
    elapsed = time.perf_counter() - begin
    await trio.sleep(0.2)  # let the deferred deletes reach the store
    store_after = router.management.resolve("/sys$store/usage").properties()
    delta = {k: store_after[k] - store_before[k] for k in ("transactions", "operations", "cancelled-pairs")}
    delta["seconds"] = elapsed
    consumer.close()
    return count / elapsed, delta


async def memory(router: Router, count: int) -> float:
    queue_manager = router.swiftlet("sys$queuemanager")
    queue = queue_manager.queue("memory")
    payload = b"y" * 100
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(count):
        await queue_manager.send("memory", build(payload))
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert queue.size == count
    message_bytes = len(build(payload).raw)
    return (after - before) / count - message_bytes, message_bytes


async def main(args: argparse.Namespace) -> None:
    async with running_router(CONFIG, sync=args.sync) as router:
        rate, store = await throughput(router, args.messages, durable=True)
        fsyncs = store["transactions"] / store["seconds"]
        print(
            f"persistent, 1 KB, sync={args.sync}: {rate:,.0f} msgs/s; {fsyncs:,.0f} store transactions/s "
            f"({store['transactions']} for {args.messages} messages); "
            f"{store['cancelled-pairs']:,} messages never written (stored and consumed in one commit)"
        )
        rate, _ = await throughput(router, args.messages, durable=False)
        print(f"non-persistent, 1 KB: {rate:,.0f} msgs/s")
        overhead, size = await memory(router, args.queued)
        print(
            f"memory: {overhead:,.0f} bytes per queued message beyond its {size} encoded bytes "
            f"({args.queued:,} queued 100-byte-body messages)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--sync", default="full", choices=["full", "normal", "off"])
    trio.run(main, parser.parse_args())
