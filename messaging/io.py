"""The one trio driver of a sans-IO connection: lead-in stages, then one reader and one writer.

Theory of operation
-------------------
Protocol code here is sans-IO (:mod:`.amqp`): it takes bytes, returns bytes and is told
the time. This module is the only place that puts such a machine on a socket, for the
router's listener, the Python client and the router-to-router links alike:

1. **Lead-in stages** (:func:`lead_in`): exchanges that run before the connection protocol
   and hand it what followed them — SASL today (:mod:`.amqp.sasl`), routing's handshake
   next. A stage is fed what the peer sends and answers through ``data_to_send``; it says
   when it is done and keeps the bytes that came after it in ``remaining``.
2. **The driver** (:class:`Driver`): one nursery per connection with a reader and a writer.
   The reader feeds what arrives to the protocol, ticks its timers at their deadlines
   (heartbeats, idle timeout) and calls the owner's ``on_input`` (handle the events the
   input caused); the writer wakes up when anyone calls :meth:`Driver.wake`, lets the owner
   prepare output (``before_write``: e.g. move queued messages onto links) and writes what
   the protocol has. The owner's own work for this connection (slow attaches, commits)
   runs in the same nursery (:meth:`Driver.start_soon`), so it ends with the connection.

**Writing at once** (:meth:`Driver.flush`). A task woken now runs in trio's *next* batch
of runnable tasks, after every task of the current one; on a busy router one task's step
(a producer's 16 KiB of transfers) takes hundreds of microseconds, so each wake-up on the
way of an answer costs that much again. What the protocol has after the reader handled its
input, or when an owner's task is about to wait, is therefore written at once with one
non-blocking ``send`` on the socket, when the writer is not in the middle of a write; what
the socket does not take (its buffer is full) is left to the writer, which writes it before
anything newer. Measured on the routing links (``bench/routing_bench.py``): the time from
a routing transaction handed to the link to its bytes on the socket fell from about 1 ms to
0.1 ms, and a one-hop transfer, bounded by how many transactions may be open at once, went
about 10 % faster; a single router's throughput did not change. A TLS stream (not a plain
socket) is always written by the writer.

The connection is over when the protocol says so (``data_to_send`` returns None) or when
the peer closed its side; in the second case what the protocol still had queued is
written first, within :data:`FLUSH_TIMEOUT`. Everything runs in one trio thread: the
protocol needs no lock, and the reader only ever writes without waiting.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, Protocol

import trio

__all__ = ["SansIO", "Stage", "Driver", "lead_in", "PeerClosed", "FLUSH_TIMEOUT", "READ_SIZE"]

READ_SIZE = 65536
FLUSH_TIMEOUT = 1.0  # seconds to write what is queued once the peer closed its side


class PeerClosed(trio.BrokenResourceError):
    """The peer closed the connection before the lead-in was over."""


class SansIO(Protocol):
    """A connection protocol without I/O (:class:`messaging.amqp.Connection` is one)."""

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed what the peer sent (what the stream read: bytes or a bytearray); ``b""``
        means it closed its side."""

    def data_to_send(self) -> bytes | None:
        """What to write now (``b""``: nothing yet); None once the connection is over."""

    def tick(self, now: float) -> float:
        """Act on the time ``now`` (trio's clock); the next deadline, 0 for none."""

    @property
    def finished(self) -> bool:
        """Everything was taken from :meth:`data_to_send` and the connection is over."""


class Stage(Protocol):
    """A lead-in exchange in front of the connection protocol (SASL, a handshake)."""

    def receive_data(self, data: bytes) -> bool:
        """Feed what the peer sent; True once the stage is over.

        Raises: the stage's own error when the peer broke it or was refused; what
        :attr:`data_to_send` then holds is still written (a refusal, our header).
        """

    @property
    def data_to_send(self) -> bytes:
        """What to write now (taking it empties it)."""

    @property
    def remaining(self) -> bytes:
        """What the peer sent after the stage ended: the next stage's or protocol's input."""


async def lead_in(stream: trio.abc.Stream, stage: Stage) -> bytes:
    """Run one lead-in stage on ``stream``: write what it has (a client speaks first), then
    feed it what arrives until it is over; what the peer sent after it.

    Raises:
        PeerClosed: the peer closed the connection before the stage ended.
        Whatever ``stage.receive_data`` raises, after its answer was written.
        What the stream raises. Cancellation (e.g. the caller's timeout) is not caught.
    """
    if out := stage.data_to_send:
        await stream.send_all(out)
    while True:
        data = await stream.receive_some(READ_SIZE)
        if not data:
            raise PeerClosed("the peer closed the connection during the lead-in")
        try:
            done = stage.receive_data(bytes(data))  # (a stream may read into a bytearray)
        except Exception:
            if out := stage.data_to_send:
                await stream.send_all(out)
            raise
        if out := stage.data_to_send:
            await stream.send_all(out)
        if done:
            return stage.remaining


class Driver:
    """Runs ``protocol`` on ``stream`` (after the lead-in) until the connection is over.

    ``on_input()`` is called after each read (of at most ``read_size`` bytes) or tick, to
    handle the events it caused; ``before_write()`` each time the writer is about to take the
    protocol's output. Both run in the reader's or writer's task and must not block.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        protocol: SansIO,
        *,
        on_input: Callable[[], None],
        before_write: Callable[[], None] | None = None,
        read_size: int = READ_SIZE,
    ):
        self.stream = stream
        self.protocol = protocol
        self._on_input = on_input
        self._before_write = before_write or on_input
        self._read_size = read_size
        self._wakeup = trio.Event()
        self._written = trio.Event()  # set when the writer is done
        self._nursery: trio.Nursery | None = None
        # what flush() may write to directly: a plain socket (trio made it non-blocking)
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._writing = False  # the writer is in a send_all: flush() must not write beside it
        self._unsent = b""  # what a flush() could not write: the writer sends it first

    def wake(self) -> None:
        """Have the writer look for output soon (cheap; call it whenever output may exist)."""
        self._wakeup.set()

    def flush(self) -> None:
        """Take the writer's turn now, without waiting: ``before_write()``, then one
        non-blocking send of what the protocol has when the writer is idle (else, or for
        what the socket does not take, the writer is woken).
        Never raises: a broken socket is left for the writer to find."""
        if self._socket is None or self._writing or self._unsent:
            self._wakeup.set()
            return
        self._before_write()  # a writer's turn, done here: the owner's output is prepared first
        # until the protocol has nothing more: a close leaves it with None to give, which
        # only the writer may act on (it ends the connection)
        while data := self.protocol.data_to_send():
            try:
                sent = os.write(self._socket.fileno(), data)
            except OSError:  # (BlockingIOError: the buffer is full) the writer takes over
                sent = 0
            if sent < len(data):
                self._unsent = data[sent:]
                break
        if data is None or self._unsent or self.protocol.finished:
            self._wakeup.set()

    def start_soon(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` in the connection's nursery: it is cancelled when the
        connection ends, and its errors end the connection. Only while :meth:`run` runs."""
        if self._nursery is None:
            raise RuntimeError("the connection is not running")
        self._nursery.start_soon(function, *args)

    async def run(
        self, remaining: bytes = b"", *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Drive the connection; ``remaining``: what the lead-in left, fed first (once the
        nursery exists, so owner work it causes can start). Started once that is done;
        returns when the connection is over (its output ended, or the peer closed its side
        and what was queued is written).

        Raises: what the stream raises (a broken or closed socket), and what the owner's
        callbacks or tasks raise. On cancellation the socket is left to the owner to close.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if remaining:  # (empty is not end of input here)
                self.protocol.receive_data(remaining)
                self._on_input()
            self.wake()  # what the protocol has already (a client's open, answers to remaining)
            nursery.start_soon(self._write)
            task_status.started()
            await self._read()
            with trio.move_on_after(FLUSH_TIMEOUT):  # the peer closed its side: write what is queued
                await self._written.wait()
            nursery.cancel_scope.cancel()
        self._nursery = None

    async def _read(self) -> None:
        protocol, stream = self.protocol, self.stream
        while True:
            data = None
            deadline = protocol.tick(trio.current_time())
            self.flush()  # what the last input and the tick caused (answers, a heartbeat, a close)
            with trio.move_on_at(deadline if deadline else math.inf):
                data = await stream.receive_some(self._read_size)
                protocol.receive_data(data)
            self._on_input()
            if data == b"":
                self.flush()
                self.wake()
                return

    async def _write(self) -> None:
        protocol, stream = self.protocol, self.stream
        try:
            while True:
                # Wait for a wake-up even right after a write: output that builds up meanwhile
                # without waking us goes out in the next, larger write.
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                self._before_write()
                data = protocol.data_to_send()
                if self._unsent:
                    data, self._unsent = self._unsent + (data or b""), b""
                if data:
                    self._writing = True
                    try:
                        await stream.send_all(data)
                    finally:
                        self._writing = False
                if data is None or protocol.finished:  # the connection is over
                    return
        finally:
            self._written.set()
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
