"""AMQP end to end through a live router: producer and consumer processes. Prints figures.

    .venv/bin/python bench/amqp_bench.py [--messages N] [--producers P]

A router (store, queue manager, sys$jms on a free loopback port) runs in this process; P
producer processes and one consumer process (python-qpid-proton reactor clients, 100-byte
messages, at-least-once: the producer keeps up to 1000 unsettled, the consumer accepts
each) run concurrently; the figure is messages per second from the first send to the last
accept, non-persistent and persistent (sync=full).

Limits: proton's Python clients top out near 20k msg/s per process, so with few processes
this measures the load generator as much as the router. The issue's comparison with
RabbitMQ uses a C load generator (not written yet).
"""

from __future__ import annotations

import argparse
import sys
import time

import trio
from _router import running_router

CONFIG = """<router name="bench" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{path}" sync="full"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="0" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""

CLIENT = r'''
import sys, time
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

url, role, count, durable = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

class Client(MessagingHandler):
    def __init__(self):
        super().__init__(prefetch=1000 if role == "recv" else 0)
        self.sent = self.confirmed = self.received = 0
    def on_start(self, event):
        conn = event.container.connect(url)
        if role == "send":
            event.container.create_sender(conn, "bench")
        else:
            event.container.create_receiver(conn, "bench")
    def send(self, sender):
        while sender.credit and self.sent < count and self.sent - self.confirmed < 1000:
            sender.send(Message(body=b"x" * 100, durable=durable))
            self.sent += 1
    def on_sendable(self, event):
        self.send(event.sender)
    def on_accepted(self, event):
        self.confirmed += 1
        if self.confirmed == count:
            event.connection.close()
        else:
            self.send(event.link)  # our window of 1000 unconfirmed may have been what stopped us
    def on_message(self, event):
        self.received += 1
        if self.received == count:
            print(time.time(), flush=True)
            event.connection.close()

Container(Client()).run()
'''


async def run_round(url: str, total: int, producers: int, durable: bool) -> float:
    per_producer = total // producers
    total = per_producer * producers
    begin = time.time()
    async with trio.open_nursery() as nursery:
        receiver = trio.Event()
        result = {}

        async def consume():
            done = await trio.run_process([sys.executable, "-c", CLIENT, url, "recv", str(total), str(int(durable))],
                                          capture_stdout=True)
            result["end"] = float(done.stdout.split()[-1])
            receiver.set()

        nursery.start_soon(consume)
        for _ in range(producers):
            nursery.start_soon(trio.run_process, [sys.executable, "-c", CLIENT, url, "send", str(per_producer),
                                                  str(int(durable))])
    return total / (result["end"] - begin)


async def main(args: argparse.Namespace) -> None:
    async with running_router(CONFIG) as router:
        port = router.management.get("/sys$jms/usage/listeners/amqp", "port")
        url = f"amqp://127.0.0.1:{port}"
        for durable in (False, True):
            rate = await run_round(url, args.messages, args.producers, durable)
            kind = "persistent" if durable else "non-persistent"
            print(f"AMQP {kind}, 100-byte, {args.producers} producer process(es) + 1 consumer: {rate:,.0f} msgs/s "
                  f"(python-qpid-proton clients; includes process start-up)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--producers", type=int, default=2)
    trio.run(main, parser.parse_args())
