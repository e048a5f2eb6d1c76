"""Topic fan-out across three routers in a line, next to one router's. Prints its figures.

    .venv/bin/python bench/topic_network_bench.py [--messages N] [--subscribers 10]

Routers ``a - b - c`` (tests/harness/network.py: the full stack with routing, stores in a temporary
folder, sync "normal", one trio process, links on loopback sockets, XA transfer). The
publisher is on ``a``; each router has ``--subscribers`` non-durable subscriptions to
``bench``, each read by a consumer task that accepts every message (in-process, as
bench/topic_bench.py: the figure is the routers' work, not an AMQP client's). 100-byte
messages are published to ``bench.prices`` through the topic manager's ``publish`` on ``a``,
yielding every 50 as a listener does between batches of frames.

Per mode (non-persistent, persistent):

- ``single router``: only ``a``'s subscribers (``b`` and ``c`` have none, so nothing is
  forwarded): deliveries/s = messages × subscribers / time until the last one has all.
- ``3 routers``: every router's subscribers: deliveries/s network-wide = messages × 3 ×
  subscribers / time until every subscriber on every router has every message; plus the
  time until ``a``'s own subscribers had them all. The publication is forwarded once per
  remote router (``tpc$bench@b``, ``tpc$bench@c``), ``c``'s copy through ``b``.

The three routers share one core, so the network figure includes forwarding, two transfers
and the remote deliveries of all three. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import trio
from _router import accept_all

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness

from martinet.messaging.message import build  # noqa: E402

from tests.harness.network import Network  # noqa: E402

ROUTERS = ("a", "b", "c")


def remote(network: Network, router: str) -> dict[str, set[str]]:
    listing = network.routers[router].management.resolve("/sys$topicmanager/usage/remote-router-subscriptions")
    return {name: set(entry.children["topics"].children) for name, entry in listing.children.items()}


async def wait_for(condition, what: str) -> None:
    with trio.move_on_after(30) as timeout:
        while not condition():
            await trio.sleep(0.01)
    if timeout.cancelled_caught:
        raise RuntimeError(f"{what}: not reached in 30 s")


async def fan_out(
    network: Network, routers: tuple[str, ...], subscribers: int, count: int, persistent: bool
) -> tuple[float, float]:
    """(deliveries/s over every subscriber, seconds until a's subscribers had everything)."""
    managers = {r: network.routers[r].swiftlet("sys$topicmanager") for r in routers}
    subscriptions = {r: [managers[r].subscribe("bench") for _ in range(subscribers)] for r in routers}
    others = set(routers) - {"a"}
    await wait_for(lambda: {r for r, roots in remote(network, "a").items() if "bench" in roots} == others, "interest")
    message = build(b"p" * 100, message_id="ID:bench:1", durable=persistent)
    local_done = trio.Event()
    remaining = {"a": subscribers}

    async def consume(router: str, subscription) -> None:
        consumer = subscription.consumer()
        consumer.flow(count)
        await accept_all(consumer, count)
        if router == "a":
            remaining["a"] -= 1
            if not remaining["a"]:
                local_done.set()

    begin = time.perf_counter()
    local = 0.0
    async with trio.open_nursery() as nursery:
        for router, subs in subscriptions.items():
            for subscription in subs:
                nursery.start_soon(consume, router, subscription)
        publisher = managers["a"]
        for n in range(count):
            publisher.publish("bench.prices", message)
            if n % 50 == 49:
                await trio.sleep(0)
        await local_done.wait()
        local = time.perf_counter() - begin
    elapsed = time.perf_counter() - begin
    for subs in subscriptions.values():
        for subscription in subs:
            subscription.close()
    await wait_for(lambda: not remote(network, "a"), "interest withdrawn")
    return count * subscribers * len(routers) / elapsed, local


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        async with trio.open_nursery() as nursery:
            network = Network(nursery, Path(folder))
            await network.start_routers(*ROUTERS)
            network.connect("a", "b")
            network.connect("b", "c")
            await network.settle({"a": {"b": 1, "c": 2}, "c": {"a": 2, "b": 1}})
            n = args.subscribers
            for persistent in (False, True):
                mode = "persistent" if persistent else "non-persistent"
                single, _ = await fan_out(network, ("a",), n, args.messages, persistent)
                print(
                    f"{mode:>14}, single router, {n} subscribers:        {single:>9,.0f} deliveries/s "
                    f"({args.messages:,} messages, 100-byte)",
                    flush=True,
                )
                wide, local = await fan_out(network, ROUTERS, n, args.messages, persistent)
                print(
                    f"{mode:>14}, 3 routers in a line, {n} subscribers each: {wide:>9,.0f} deliveries/s "
                    f"network-wide (a's own subscribers done after {local:.2f} s)",
                    flush=True,
                )
            await network.stop_all()
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages published per round")
    parser.add_argument("--subscribers", type=int, default=10, help="subscribers per router")
    trio.run(main, parser.parse_args())
