"""The trio driver of sans-IO connections (messaging/io.py): what a read causes is written at
once by the reader (Driver.flush) when the writer is idle, what the socket does not take is
left to the writer in order, and a stream that is not a plain socket is written by the writer
alone. Real sockets (a connected pair), a toy protocol."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from martinet.messaging.io import Driver


class Answering:
    """A sans-IO toy: each input is answered with ``size`` bytes made from it."""

    def __init__(self, size: int):
        self.size = size
        self.out = bytearray()
        self.closed = False

    def receive_data(self, data: bytes) -> None:
        if data == b"":
            self.closed = True
        else:
            self.out += (data * (self.size // len(data) + 1))[: self.size]

    def data_to_send(self) -> bytes | None:
        if self.closed and not self.out:
            return None
        out, self.out = bytes(self.out), bytearray()
        return out

    def tick(self, now: float) -> float:
        return 0

    @property
    def finished(self) -> bool:
        return self.closed and not self.out


class Counting:
    """The owner's callbacks: how often the writer task (not a flush) came to write."""

    def __init__(self) -> None:
        self.writer_turns = 0

    def on_input(self) -> None:
        pass

    def before_write(self) -> None:
        if trio.lowlevel.current_task().name.endswith("Driver._write"):
            self.writer_turns += 1


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = await stream.receive_some(65536)
        assert chunk, f"the connection ended after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    ours, theirs = trio.socket.socketpair()
    return trio.SocketStream(ours), trio.SocketStream(theirs)


@asynccontextmanager
async def running(
    ours: trio.abc.Stream, peer: trio.abc.Stream, answer_size: int, timeout: float = 10
) -> AsyncIterator[Counting]:
    """A Driver of :class:`Answering` on ``ours``, started and settled; the owner's counts
    from then on (the writer's first look, at the start, is not counted)."""
    owner = Counting()
    driver = Driver(ours, Answering(answer_size), on_input=owner.on_input, before_write=owner.before_write)
    async with ours, peer:
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                await nursery.start(driver.run)
                await trio.testing.wait_all_tasks_blocked()
                owner.writer_turns = 0
                yield owner
                nursery.cancel_scope.cancel()


async def test_the_answer_to_a_read_leaves_without_the_writer():
    ours, peer = socket_pair()
    async with running(ours, peer, 100) as owner:
        for request in (b"a", b"bc", b"def"):
            await peer.send_all(request)
            assert await receive_exactly(peer, 100) == (request * 100)[:100]
        assert owner.writer_turns == 0  # written by the reader, three times


async def test_what_the_socket_does_not_take_is_written_by_the_writer_in_order():
    ours, peer = socket_pair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    size = 2_000_000  # far more than the socket buffers hold: a flush writes part of it
    async with running(ours, peer, size, timeout=20) as owner:
        await peer.send_all(b"x")
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for room now
        await peer.send_all(b"y")  # answered while the first answer is still being written
        await trio.testing.wait_all_tasks_blocked()
        assert await receive_exactly(peer, 2 * size) == b"x" * size + b"y" * size
        assert owner.writer_turns > 0


async def test_a_stream_that_is_not_a_socket_is_written_by_the_writer():
    ours, peer = trio.testing.memory_stream_pair()
    async with running(ours, peer, 10) as owner:
        await peer.send_all(b"z")
        assert await receive_exactly(peer, 10) == b"z" * 10
        assert owner.writer_turns == 1


async def test_a_peer_gone_before_the_flush_ends_the_connection():
    ours, peer = socket_pair()
    owner = Counting()
    protocol = Answering(100)
    driver = Driver(ours, protocol, on_input=owner.on_input, before_write=owner.before_write)
    async with ours:
        with trio.fail_after(10):
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(driver.run)
                    await peer.aclose()
                    protocol.out += b"late" * 100_000  # more than the socket takes once the peer is gone
                    driver.flush()  # never raises: the writer finds the broken socket
            except* trio.BrokenResourceError:
                pass  # the writer's error (or the reader saw the end first and the driver ended cleanly)
    assert protocol.closed  # the reader saw the end; run() returned
