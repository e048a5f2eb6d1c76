"""A wide-area link between two local processes: a TCP proxy that delays every byte, with
jitter and an optional bandwidth cap, in user space (this machine has no kernel ``netem``).

    python bench/_wanproxy.py LISTEN_PORT TARGET_PORT [--delay-ms D] [--jitter-ms J] [--mbit R]

Listens on 127.0.0.1:LISTEN_PORT and forwards each connection to 127.0.0.1:TARGET_PORT.
Each direction of each connection is its own one-way link of delay ``D`` ms (a round trip
is ``2 × D``): a chunk read at ``t`` is written at ``t + D`` (± a uniform jitter of ``J``
ms, never before the chunk ahead of it: a link keeps the order of its bytes). With a cap
of ``R`` Mbit/s the chunk first waits for the link to be free, then takes ``bytes × 8 / R``
µs to cross it, as a serial line does. What is in flight is held in the proxy, up to
:data:`BUFFER` bytes a direction (a deep router queue); past that the reader stops reading
and TCP's own flow control pushes back on the sender, so the proxy itself never limits a
link below its bandwidth-delay product.

Unlike the test suite's fault proxy (``tests/harness/faultproxy.py``, bounded to a few chunks so
that faults apply at once), this one holds a whole bandwidth-delay product: at 200 ms and
100 Mbit/s that is 2.5 MB in flight.
"""

from __future__ import annotations

import argparse
import collections
import random

import trio

BUFFER = 64 * 1024 * 1024  # bytes in flight per direction before the reader waits
READ_SIZE = 256 * 1024


class OneWay:
    """One direction of one connection: a delay line."""

    def __init__(self, delay: float, jitter: float, bits_per_second: float | None, rng: random.Random):
        self.delay, self.jitter, self.rate, self.rng = delay, jitter, bits_per_second, rng
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.held = 0
        self.free_at = 0.0  # when the capped link has sent what it has
        self.last_due = 0.0
        self.changed = trio.Event()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def read(self, source: trio.SocketStream) -> None:
        while True:
            while self.held >= BUFFER:
                await self.changed.wait()
            data = await source.receive_some(READ_SIZE)
            now = trio.current_time()
            sent = now
            if self.rate:
                sent = self.free_at = max(now, self.free_at) + len(data) * 8 / self.rate
            due = sent + self.delay + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
            due = self.last_due = max(due, self.last_due)
            self.queue.append((due, data))
            self.held += len(data)
            self._notify()
            if not data:
                return

    async def write(self, sink: trio.SocketStream) -> None:
        while True:
            while not self.queue:
                await self.changed.wait()
            due, _ = self.queue[0]
            await trio.sleep_until(due)
            now, parts = trio.current_time(), []
            while self.queue and self.queue[0][0] <= now:
                _, data = self.queue.popleft()
                self.held -= len(data)
                if not data:  # the end of the stream, after everything before it
                    if parts:
                        await sink.send_all(b"".join(parts))
                    await sink.send_eof()
                    self._notify()
                    return
                parts.append(data)
            self._notify()
            await sink.send_all(b"".join(parts))


async def serve(client: trio.SocketStream, target: int, args: argparse.Namespace, rng: random.Random) -> None:
    try:
        upstream = await trio.open_tcp_stream("127.0.0.1", target)
    except OSError:
        await client.aclose()
        return
    for stream in (client, upstream):
        stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
    rate = args.mbit * 1e6 if args.mbit else None
    try:
        async with client, upstream, trio.open_nursery() as nursery:
            for source, sink in ((client, upstream), (upstream, client)):
                line = OneWay(args.delay_ms / 1000, args.jitter_ms / 1000, rate, rng)
                nursery.start_soon(line.read, source)
                nursery.start_soon(line.write, sink)
    except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # one side went away: the connection ends, as a real link's would


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)

    async def handler(client: trio.SocketStream) -> None:
        await serve(client, args.target, args, rng)

    await trio.serve_tcp(handler, args.listen, host="127.0.0.1")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("listen", type=int)
    parser.add_argument("target", type=int)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of each direction")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="± uniform jitter of each chunk's delay")
    parser.add_argument("--mbit", type=float, default=0.0, help="bandwidth cap of each direction (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    try:
        trio.run(main, parser.parse_args())
    except KeyboardInterrupt:
        pass
