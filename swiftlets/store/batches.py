"""Group commit to the store process: :class:`GroupCommit`.

Commits (:meth:`GroupCommit.submit`) pile up in the pending list; a sender task takes
everything pending, up to ``max-batch`` operations, and sends it as one batch whenever fewer
than :data:`PIPELINE_DEPTH` batches are in the store process's hands; a reply task reads
the store process's answers, which come in order, and finishes every commit of the
answered batch. Maintenance requests go on the same pipe between two batches. Why a store
process, why two batches in its hands, and what a full disk does: :mod:`.sqlite`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from .api import (
    DeleteMessage,
    DeleteRecord,
    Op,
    PutMessage,
    PutRecord,
    RememberId,
    SetDeliveryCount,
    SetMessageBody,
    SetTransaction,
    StoreError,
)
from .dbprocess import pack_frame
from .pipes import FrameReader
from .space import SpaceAlarm

__all__ = ["OP_CODES", "PIPELINE_DEPTH", "GroupCommit", "Pending", "encode_ops"]

PIPELINE_DEPTH = 2  # batches sent to the store process and not yet confirmed, at most
# Each operation's code in a commit frame. Here, not in the store process, which knows only
# the numbers: it does not import the operations' classes, and with them the kernel (its
# start would cost eight times as much CPU: the router starts one per store it opens).
OP_CODES: dict[type, int] = {
    PutMessage: 1,
    DeleteMessage: 2,
    SetDeliveryCount: 3,
    SetTransaction: 4,
    PutRecord: 5,
    DeleteRecord: 6,
    RememberId: 7,
    SetMessageBody: 8,
}


def encode_ops(ops: Sequence[Op]) -> list[tuple]:
    """Operations as msgpack-able ``(code, fields…)`` tuples."""
    return [(OP_CODES[type(op)], *op) for op in ops]


class Maintenance:
    """A maintenance request waiting for the commit loop, and its answer."""

    def __init__(self, request: list):
        self.request = request
        self.done = trio.Event()
        self.answer = 0
        self.error: str | None = None


class Pending:
    """One commit waiting for its batch: a trio event to set, or a callback to call."""

    __slots__ = ("ops", "done", "callback", "error")

    def __init__(self, ops: Sequence[Op], callback: Callable[[BaseException | None], None] | None = None):
        self.ops = ops
        self.callback = callback
        self.done = trio.Event() if callback is None else None
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        if self.callback is not None:
            self.callback(error)
        else:
            assert self.done is not None  # made when there is no callback
            self.done.set()


class GroupCommit:
    """The commits and maintenance requests of the store on ``path``, sent to its store
    process (:meth:`attach`: its input and its framed output) as batches of up to
    ``max_batch`` operations; ``space`` learns of a full disk and of each batch's size."""

    def __init__(self, path: Path, *, max_batch: int, space: SpaceAlarm):
        self.path = path
        self.max_batch = max_batch
        self.space = space
        self.closed = False
        self._input: trio.abc.SendStream | None = None
        self._output: FrameReader | None = None
        self._pending: list[Pending] = []
        self._maintenance: list[Maintenance] = []
        self._pending_ops = 0
        self._in_flight: deque[tuple[list[Pending], int, float]] = deque()  # (batch, operations, sent at)
        self._slots = trio.Semaphore(PIPELINE_DEPTH)
        self._sent = trio.Event()  # a batch was sent: the reply task has one to wait for
        self._wakeup = trio.Event()
        self._confirming: trio.CancelScope | None = None  # the confirmation under way
        # usage counters
        self.transactions = 0
        self.operations = 0
        self.cancelled_pairs = 0
        self.largest_batch = 0
        self.commit_seconds = 0.0

    def attach(self, process_input: trio.abc.SendStream, process_output: FrameReader) -> None:
        self._input = process_input
        self._output = process_output

    def submit(self, pending: Pending) -> Pending:
        """Raises: StoreError: the store is not running."""
        if self.closed or self._input is None:
            raise StoreError("the store is not running")
        self._pending.append(pending)
        self._pending_ops += len(pending.ops)
        self._wakeup.set()
        return pending

    async def maintain(self, request: list) -> int:
        """See :meth:`.sqlite.SqliteStore.maintain`."""
        if self.closed or self._input is None:
            raise StoreError("the store is not running")
        waiter = Maintenance(request)
        self._maintenance.append(waiter)
        self._wakeup.set()
        await waiter.done.wait()
        if waiter.error is not None:
            raise StoreError(f"{self.path}: {request[0]} failed: {waiter.error}")
        return waiter.answer

    async def run(self) -> None:
        """Send batches and read their answers until cancelled, or until a commit fails
        (StoreError: the router must stop)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._confirm_forever)
            await self._commit_forever()

    async def close(self) -> None:
        """Stopping (or failed): accept no more; unless the disk is full (a batch that waits
        for space would hold the stop for ever), what was sent learns its outcome and what is
        pending is still committed; whatever is left fails, so that nobody waits for ever."""
        self.closed = True
        if self.space.full is None:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._drain()
        # what a failed store never answered (a second batch in flight, one whose send
        # failed) and what was never sent: their waiters learn it now
        unanswered = [pending for batch, _, _ in self._in_flight for pending in batch]
        self._in_flight.clear()
        pending, self._pending = self._pending, []
        for waiting in unanswered + pending:
            waiting.finish(StoreError("the store stopped before this commit was applied"))
        waiting_maintenance, self._maintenance = self._maintenance, []
        for waiter in waiting_maintenance:
            waiter.error = "the store stopped first"
            waiter.done.set()

    def usage(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "operations": self.operations,
            "cancelled-pairs": self.cancelled_pairs,
            "largest-batch": self.largest_batch,
            "pending-operations": self._pending_ops,
            "commit-seconds": round(self.commit_seconds, 3),
        }

    async def _commit_forever(self) -> None:
        """Send batches while fewer than PIPELINE_DEPTH are unconfirmed."""
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._maintenance:
                await self._run_maintenance(self._maintenance.pop(0))
            while self._pending:
                await self._slots.acquire()  # released by _confirm
                await self._send()

    async def _send(self) -> None:
        assert self._input is not None  # attached before run()
        batch, ops = self._take_batch()
        self._in_flight.append((batch, len(ops), time.perf_counter()))
        self._sent.set()
        # Shielded: once in _in_flight, a batch is sent whole (its reply is awaited).
        frame = pack_frame(["commit", encode_ops(ops)])
        self.space.spend(len(frame))
        with trio.CancelScope(shield=True):
            try:
                await self._input.send_all(frame)
            except (trio.BrokenResourceError, OSError) as exc:
                raise StoreError(f"{self.path}: the store process is gone: {exc}") from exc

    async def _drain(self) -> None:
        """Stopping (or failed): the batches sent learn their outcome, and what is pending
        is still committed, one batch at a time — unless a commit fails or the store process
        is gone (what is left then fails with the store)."""
        try:
            while self._in_flight:
                await self._confirm()
            while self._pending:
                await self._send()
                await self._confirm()
        except StoreError:
            pass  # (raised already where it happened, or the waiters learn it)

    async def _confirm_forever(self) -> None:
        while True:
            if not self._in_flight:
                await self._sent.wait()
                self._sent = trio.Event()
                continue
            # (close() confirms what is left when stopping; but see _confirm on a full disk)
            with trio.CancelScope(shield=True) as self._confirming:
                await self._confirm()

    async def _confirm(self) -> None:
        """Read the store process's reply to the oldest batch sent and finish its waiters.

        Raises:
            StoreError: the batch failed (its waiters fail with it), or the store process is gone.
        """
        batch, operations, begin = self._in_flight[0]
        assert self._output is not None  # attached before run()
        try:
            reply = await self._output.read()
            while reply[0] == "full":  # the batch met a full disk; the store process tries it again
                self.space.set_full(reply[1])
                if self._confirming is not None:
                    self._confirming.shield = False  # waiting for space must not hold the router's stop
                reply = await self._output.read()
            if self.space.full is not None:
                self.space.set_full(None)
            if reply[0] != "done":
                raise StoreError(reply[1] if len(reply) > 1 else repr(reply))
        except (StoreError, trio.BrokenResourceError, OSError) as exc:
            self._in_flight.popleft()
            for pending in batch:
                pending.finish(exc)
            raise StoreError(f"{self.path}: commit failed: {exc}") from exc
        self._in_flight.popleft()
        self._slots.release()
        self.cancelled_pairs += reply[1]
        self.transactions += 1
        self.operations += operations
        self.largest_batch = max(self.largest_batch, operations)
        self.commit_seconds += time.perf_counter() - begin
        for pending in batch:
            pending.finish()

    async def _run_maintenance(self, waiter: Maintenance) -> None:
        assert self._input is not None and self._output is not None  # attached before run()
        with trio.CancelScope(shield=True):  # once sent, its answer must be read off the pipe
            try:
                await self._input.send_all(pack_frame(waiter.request))
                reply = await self._output.read()
            except (trio.BrokenResourceError, OSError) as exc:
                waiter.error = str(exc)
                waiter.done.set()
                raise StoreError(f"{self.path}: the store process is gone: {exc}") from exc
        if reply[0] == "maintained":
            waiter.answer = reply[1]
        else:
            waiter.error = reply[1] if len(reply) > 1 else repr(reply)
        waiter.done.set()

    def _take_batch(self) -> tuple[list[Pending], list[Op]]:
        """The oldest pending commits up to ``max-batch`` operations (at least one commit)."""
        count = size = 0
        for pending in self._pending:
            if count and size + len(pending.ops) > self.max_batch:
                break
            size += len(pending.ops)
            count += 1
        batch, self._pending = self._pending[:count], self._pending[count:]
        self._pending_ops -= size
        return batch, [op for pending in batch for op in pending.ops]
