"""A consumer whose selector matches nothing in a deep queue looks only at what arrives.

It used to look at every message in the queue at each arrival: one such consumer on a
queue of 100,000 messages stalled the router for about a second per message sent (any
client could do it, with one attach). The tests count the selector's evaluations, and
check every delivery against the order a queue promises (priority first, then arrival).
"""

from __future__ import annotations

import pytest
import trio

from martinet.messaging.message import build
from martinet.messaging.selector import compile_selector


class Counting:
    """A compiled selector that counts its evaluations."""

    def __init__(self, text: str):
        self.selector = compile_selector(text)
        self.text = text
        self.evaluations = 0

    def matches(self, get) -> bool:
        self.evaluations += 1
        return self.selector.matches(get)


def msg(n: int, kind: str = "plain", priority: int | None = None):
    return build(f"m{n}".encode() * 50, durable=True, priority=priority, properties={"n": n, "kind": kind})


def numbers(entries) -> list[int]:
    return [entry.message.application_properties["n"] for entry in entries]


async def take(consumer, count: int) -> list:
    got = []
    for _ in range(count):
        with trio.fail_after(10):
            got.append(await consumer.receive())
    return got


@pytest.mark.parametrize("cache", ["-1", "100"], ids=["in-memory", "swapped-out"])
async def test_a_parked_selector_consumer_looks_only_at_what_arrives(make_broker, cache):
    running = make_broker(queues=f'<queue name="deep" cache-size="{cache}"/>')
    await running.start()
    queue_manager = running.queue_manager
    for n in range(2000):
        await queue_manager.send("deep", msg(n))
    queue = queue_manager.queue("deep")
    wanted = Counting("kind = 'wanted'")
    consumer = queue.consumer(wanted)  # type: ignore[arg-type]
    consumer.flow(100)
    assert wanted.evaluations == 2000  # one look at everything: nothing selected
    wanted.evaluations = 0

    for n in range(2000, 2300):
        await queue_manager.send("deep", msg(n))
    assert wanted.evaluations == 300  # each arrival once (before: 300 walks of 2,000 and more)

    await queue_manager.send("deep", msg(2300, "wanted"))
    assert numbers(await take(consumer, 1)) == [2300]
    consumer.drain()  # several selected by the time it looks: delivery order decides
    for n, priority in ((2301, 4), (2302, 9), (2303, 4)):
        await queue_manager.send("deep", msg(n, "wanted", priority))
    consumer.flow(100)
    again = await take(consumer, 3)
    assert numbers(again) == [2302, 2301, 2303]
    consumer.release(again[1])  # back in its place: selected again
    assert numbers(await take(consumer, 1)) == [2301]

    late = Counting("kind = 'late'")  # a consumer without credit for long: it looks at everything again
    idle = queue.consumer(late)  # type: ignore[arg-type]
    idle.flow(1)
    await queue_manager.send("deep", msg(2304, "late"))
    assert numbers(await take(idle, 1)) == [2304]
    for n in range(2305, 7305):
        queue_manager.send_nowait("deep", msg(n))
    await queue_manager.send("deep", msg(7305, "late"))
    idle.flow(1)
    assert numbers(await take(idle, 1)) == [7305]
    await queue_manager.send("deep", msg(7306, "wanted"))
    assert numbers(await take(consumer, 1)) == [7306]

    everyone = queue.consumer()  # and everything else is there once, in order
    everyone.flow(10_000)
    rest = numbers(await take(everyone, 7300))
    assert rest == list(range(2300)) + list(range(2305, 7305))
    assert queue.available == 0
