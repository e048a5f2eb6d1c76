"""A router under load for the crash test: prints each commit it has been told is durable.

    python tests/harness/crash_writer.py CONFIG RUN

Four tasks loop: a transaction sending 3 persistent messages to queue ``a`` and 2 to ``b``
(application property ``txn``), printed as ``txn <id>`` once ``commit`` returned; and plain
persistent sends to ``c``, printed as ``send <id>`` once ``send`` returned. It also
consumes from ``c`` and accepts, so deletes race with inserts. It runs until killed.
"""

import sys

import trio

from martinet.kernel import Router
from martinet.messaging.message import build


async def main(config: str, run: str) -> None:
    router = Router.from_file(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        queue_manager = router.swiftlet("sys$queuemanager")
        print("ready", flush=True)

        async def transactions(worker: int) -> None:
            n = 0
            while True:
                txn = f"{run}-{worker}-{n}"
                transaction = queue_manager.transaction()
                for queue, count in (("a", 3), ("b", 2)):
                    for k in range(count):
                        transaction.send(
                            queue,
                            build(b"x" * 200, durable=True, message_id=f"{txn}-{queue}{k}", properties={"txn": txn}),
                        )
                await transaction.commit()
                print("txn", txn, flush=True)
                n += 1

        async def sends() -> None:
            n = 0
            while True:
                key = int(run) * 10_000_000 + n
                await queue_manager.send(
                    "c", build(b"y" * 300, durable=True, message_id=f"c-{key}", properties={"id": key})
                )
                print("send", key, flush=True)
                n += 1

        async def consume() -> None:
            consumer = queue_manager.queue("c").consumer()
            consumer.flow(10_000_000)
            while True:
                entry = await consumer.receive()
                if entry.message.application_properties["id"] % 2:  # accept half of them
                    consumer.accept(entry)

        for worker in range(4):
            nursery.start_soon(transactions, worker)
        nursery.start_soon(sends)
        nursery.start_soon(consume)


trio.run(main, sys.argv[1], sys.argv[2])
