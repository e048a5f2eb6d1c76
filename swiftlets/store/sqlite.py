"""The SQLite backend, router side: group commit in front of the store process.

Theory of operation
-------------------
The database is driven by one dedicated store process per store
(:mod:`swiftlets.store.dbprocess`, which explains why a process and not a thread), started
with the swiftlet and fed over a pipe; the router's trio loop never blocks on disk.

Group commit: :meth:`SqliteStore.commit` appends its operations to the pending list and
waits. A sender task takes *everything* pending (up to ``max-batch`` operations) and sends
it as one batch — one SQLite transaction, one WAL append and, with ``sync="full"``, one
fsync — whenever fewer than :data:`.batches.PIPELINE_DEPTH` batches are in the store process's
hands; a reply task wakes every waiter of a batch when the store process confirms it (the
replies come in order). While the store process works, new commits pile up for the next
batch, so the batch size adapts to the load by itself: throughput is bounded by fsync
rate × batch, not by the fsync rate. A message stored and consumed within one batch is
written neither way (the store process drops the pair).

Why two batches in its hands and not one: with one, the store process sat idle after each
commit until the router's loop had read the reply and sent the next batch — on a busy
machine, a wait for the loop to get the CPU as long as the commit itself
(``bench/ack_latency.py``: the round trip of a batch took about twice its SQLite commit).
With the next batch already in its pipe, it starts on it at once. The batches, their
answers and the counters are :class:`.batches.GroupCommit`'s; this class starts and
watches the store process and recovers from it.

A failed commit fails its waiters and then the store itself (the router stops): a store
that cannot write can no longer keep the broker's promises. The store process refuses every
batch after a failed one, so the batch sent behind it is not applied either. A full disk is
not such a failure: the store process rolls the batch back and tries it again until it goes
through, and says so first (``["full", text]`` before the batch's answer), which turns the
disk alarm on (:mod:`.space`); the batches behind it wait in the pipe, in order.

Maintenance (:meth:`SqliteStore.maintain`: an online backup, a vacuum) goes to the store
process on the commit pipe between two batches, so it sees every commit confirmed before it
and the commits asked meanwhile wait for it; a failed maintenance fails only its caller.

Reads (:meth:`SqliteStore.read_messages`, the bodies a queue keeps only in the store) go
over a second pair of pipes to a reader thread of the store process with a connection of
its own, so that a read never waits for the commit in progress (a consumer of a long
backlog would otherwise wait, read after read, for the commit of the deletes of what it
just consumed); in WAL mode it sees every commit finished before it began. A reader task
here sends every waiting read as one request whenever the previous one was answered.

The router lock: the store process's own lock (see :mod:`.dbprocess`) makes a new store
process wait for the previous one of a killed router, which is right after ``kill -9`` and
wrong when a second router is started on the store of a *running* one (same folder, same
name): that one waits in vain. So the router itself also holds a lock while its store runs,
``<database>.router-lock`` (``flock``, released by the kernel when the router dies, so a
restart after ``kill -9`` does not see it), holding its pid and name; a router that finds
it held fails at once and names the holder.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from . import dbprocess
from .api import Op, Recovered, StoredMessage, StoreError
from .batches import GroupCommit, Pending
from .pipes import FrameReader, enlarge_pipe
from .reads import BodyReads
from .space import SpaceAlarm

log = logging.getLogger(__name__)

ROUTER_LOCK_SUFFIX = ".router-lock"  # held by the router running on the store (see above)


def hold_router_lock(database: Path, router: str) -> int:
    """Take the router lock of ``database`` for router ``router`` of this process; its file
    descriptor, to be closed when the store has stopped.

    Raises:
        StoreError: another running router holds it (the text names it and its pid), or the
            lock file cannot be opened.
    """
    lock_path = database.with_name(database.name + ROUTER_LOCK_SUFFIX)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # never inherited by the store process
    except OSError as exc:
        raise StoreError(f"{database}: cannot open the router lock {lock_path}: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid, _, name = os.pread(fd, 4096, 0).decode(errors="replace").strip().partition(" ")
        os.close(fd)
        raise StoreError(
            f"{database}: the store is in use by the running router {name or 'unknown'} (pid {pid or 'unknown'}); "
            "a store serves one router: stop that router first, or give this one another store path"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {router}\n".encode(), 0)
    return fd


def store_process_command(path: Path, sync: str, accept_empty: bool, read_pipes: Sequence[int] = ()) -> list[str]:
    """The command line of the store process of the database ``path`` (:mod:`.dbprocess`,
    run as a script: ``-P`` keeps its folder off the import path); ``read_pipes``: the file
    descriptors of its read pipes, if it has them."""
    accept = "accept-empty" if accept_empty else "refuse-empty"
    return [sys.executable, "-P", dbprocess.__file__, str(path), sync, accept, *map(str, read_pipes)]


class SqliteStore:
    """A :class:`swiftlets.store.api.Store` on one SQLite file."""

    def __init__(
        self,
        path: Path,
        *,
        sync: str,
        max_batch: int,
        name: str,
        accept_empty: bool = False,
        space: SpaceAlarm | None = None,
    ):
        self.path = path
        self.space = space or SpaceAlarm(path.parent, 0, router=name)  # told when a commit meets a full disk
        self.accept_empty = accept_empty
        self.sync = sync
        self._name = name
        self._commits = GroupCommit(path, max_batch=max_batch, space=self.space)
        self._process_output: FrameReader | None = None
        self._reads: BodyReads | None = None  # with the store process
        self._recovered: Recovered | None = None
        self._recovered_messages: list[StoredMessage] | None = None  # until taken

    @property
    def max_batch(self) -> int:
        return self._commits.max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:  # a runtime change of max-batch
        self._commits.max_batch = value

    @property
    def recovered(self) -> Recovered:
        if self._recovered is None:
            raise StoreError("the store has not been opened")
        return self._recovered

    def take_recovered_messages(self) -> list[StoredMessage]:
        """The recovered messages, once: the store keeps no reference to them afterwards."""
        if self._recovered is None:
            raise StoreError("the store has not been opened")
        messages, self._recovered_messages = self._recovered_messages, None
        if messages is None:
            raise StoreError("the recovered messages were taken already")
        return messages

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the store process, recover, then commit until cancelled.

        Raises:
            StoreError: the database cannot be opened, is not a Martinet store or has a
                newer schema; or a commit failed (the router must stop).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        router_lock = hold_router_lock(self.path, self._name)
        try:
            await self._run(task_status)
        finally:
            os.close(router_lock)  # after the store process exited: the next router may open the store

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        requests_out, requests_in = os.pipe()  # read requests: the store process reads requests_out
        answers_out, answers_in = os.pipe()  # and writes the answers into answers_in
        try:
            process = await trio.lowlevel.open_process(
                store_process_command(self.path, self.sync, self.accept_empty, (requests_out, answers_in)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(requests_out, answers_in),
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        except BaseException:
            for fd in (requests_out, requests_in, answers_out, answers_in):
                os.close(fd)
            raise
        os.close(requests_out)
        os.close(answers_in)
        # (trio's pipes to a child are FdStreams on POSIX, where this store runs)
        assert isinstance(process.stdin, trio.lowlevel.FdStream) and isinstance(process.stdout, trio.lowlevel.FdStream)
        for fd in (process.stdin.fileno(), process.stdout.fileno(), answers_out):
            enlarge_pipe(fd)
        self._process_output = FrameReader(process.stdout)
        self._commits.attach(process.stdin, self._process_output)
        reads = self._reads = BodyReads(
            self.path, trio.lowlevel.FdStream(requests_in), FrameReader(trio.lowlevel.FdStream(answers_out))
        )
        try:
            self._recovered, self._recovered_messages = await self._recover()
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reads.run)
                nursery.start_soon(self._watch, process)
                await self._commits.run()
        finally:
            await self._commits.close()
            with trio.CancelScope(shield=True):
                await reads.aclose("the store stopped before this read was served")
                await process.stdin.aclose()  # end of input: the store process closes the database
                with trio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    log.error("store process of %s did not exit; killing it", self.path)
                    process.kill()
                    await process.wait()

    async def _recover(self) -> tuple[Recovered, list[StoredMessage]]:
        messages: list[StoredMessage] = []
        records: dict[str, dict[str, bytes]] = {}
        remembered: dict[str, list[str]] = {}
        assert self._process_output is not None  # run() started the store process
        while True:
            frame = await self._process_output.read()
            kind = frame[0]
            if kind == "messages":
                messages.extend(StoredMessage(*row) for row in frame[1])
            elif kind == "records":
                for record_kind, key, value in frame[1]:
                    records.setdefault(record_kind, {})[key] = value
            elif kind == "remembered":
                for queue_name, message_id in frame[1]:
                    remembered.setdefault(queue_name, []).append(message_id)
            elif kind == "ready":
                log.info(
                    "store %s opened: %d messages, %d records",
                    self.path,
                    len(messages),
                    sum(len(v) for v in records.values()),
                )
                return Recovered(len(messages), records, remembered, frame[1]), messages
            elif kind == "warning":  # a damaged or emptied store, accepted by accept-empty-store
                log.error("%s", frame[1])
            elif kind == "notice":  # waiting for the store lock (the previous store process is finishing)
                log.warning("%s", frame[1])
            elif kind == "error":
                raise StoreError(frame[1])
            else:
                raise StoreError(f"unexpected frame {kind!r} from the store process")

    async def commit(self, ops: Sequence[Op]) -> None:
        if not ops:
            return
        pending = self._commits.submit(Pending(ops))
        assert pending.done is not None  # made as there is no callback
        with trio.CancelScope(shield=True):
            await pending.done.wait()
        if pending.error is not None:
            raise StoreError(f"commit failed: {pending.error}") from pending.error

    def commit_nowait(self, ops: Sequence[Op], on_done: Callable[[BaseException | None], None]) -> None:
        if not ops:
            on_done(None)
            return
        self._commits.submit(Pending(ops, on_done))

    async def read_messages(self, ids: Sequence[int]) -> Mapping[int, bytes]:
        """(:class:`~.api.Store`) Served beside the commits (:mod:`.reads`)."""
        if self._commits.closed or self._reads is None:
            raise StoreError("the store is not running")
        return await self._reads.read(ids)

    async def _watch(self, process: trio.Process) -> None:
        """The store process ending on its own (killed, crashed) fails the store at once: a
        router with nothing to commit would otherwise run on without a store, its clients
        served from memory, until its next persistent message. It ends only when its input
        closes, which the stop does after this task is cancelled."""
        await process.wait()
        raise StoreError(f"{self.path}: the store process exited (status {process.returncode})")

    async def maintain(self, request: list) -> int:
        """Run a maintenance request in the store process between two batches: ``["backup",
        target]`` or ``["vacuum"]``; its answer (bytes written, bytes freed). Cancelling the
        caller abandons the answer; the store process still finishes the work.

        Raises:
            StoreError: the store is not running, or the maintenance failed (the store goes on).
        """
        return await self._commits.maintain(request)

    def usage(self) -> dict[str, Any]:
        commits = self._commits.usage()
        return {
            "path": str(self.path),
            "sync": self.sync,
            "fsyncs": commits["transactions"] if self.sync == "full" else 0,
            **commits,
        }
