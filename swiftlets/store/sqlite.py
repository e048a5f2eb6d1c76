"""The SQLite backend: WAL mode, one dedicated thread, group commit.

Theory of operation
-------------------
One OS thread (:class:`_Thread`) owns the SQLite connection and runs every database call,
one at a time; trio tasks hand it work and wait on a trio event, so the router's event
loop never blocks on disk.

Group commit: :meth:`SqliteStore.commit` appends its operations to the pending list and
waits. A single committer task takes *everything* pending whenever the thread is free
and applies it in one transaction — one WAL append and, with ``sync="full"``, one fsync —
then wakes every waiter of that batch. While the thread works, new commits pile up for
the next batch, so the batch size adapts to the load by itself: throughput is bounded by
fsync rate × batch, not by the fsync rate.

Within a batch, a message stored and deleted again (consumed before its insert reached
the disk) is dropped from both lists and never written: at high rates most messages of
a fast queue never touch the disk, which is safe because nobody was told the insert was
durable before the batch commits.

Crash safety is SQLite's: a transaction is in the WAL completely or not at all, so after
``kill -9`` every acknowledged commit is there and no part of an unacknowledged one is.

Schema version 1: ``messages`` (rowid = message id), ``records`` (kind, key → blob),
``remembered_ids`` (duplicate-detection backlogs), ``meta`` (``schema-version``).
"""

from __future__ import annotations

import functools
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import outcome
import trio

from .api import (
    DeleteMessage,
    DeleteRecord,
    Op,
    PutMessage,
    PutRecord,
    Recovered,
    RememberId,
    SetDeliveryCount,
    SetTransaction,
    StoredMessage,
    StoreError,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    body BLOB NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    txid TEXT
);
CREATE TABLE IF NOT EXISTS records (
    kind TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS remembered_ids (
    id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, message_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS remembered_ids_queue ON remembered_ids (queue, id);
"""


class _Thread:
    """A dedicated OS thread running submitted calls in order."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, token, deliver = job
            result = outcome.capture(call)
            try:
                token.run_sync_soon(deliver, result)
            except trio.RunFinishedError:  # nobody is waiting any more
                pass

    async def run(self, call: Callable[[], T]) -> T:
        """Run ``call`` on the thread and return its result (or raise its exception).

        Not cancellable: once submitted, the call runs to completion and this waits for it,
        so the caller always learns whether the database call happened.
        """
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome] = []

        def deliver(result: outcome.Outcome) -> None:
            box.append(result)
            done.set()

        self._jobs.put((call, token, deliver))
        with trio.CancelScope(shield=True):
            await done.wait()
        return box[0].unwrap()

    def close(self) -> None:
        """Stop the thread after the calls already submitted."""
        self._jobs.put(None)
        self._thread.join()


class _Pending:
    __slots__ = ("ops", "done", "error")

    def __init__(self, ops: Sequence[Op]):
        self.ops = ops
        self.done = trio.Event()
        self.error: BaseException | None = None


class SqliteStore:
    """A :class:`swiftlets.store.api.Store` on one SQLite file."""

    def __init__(self, path: Path, *, sync: str, max_batch: int, name: str):
        self.path = path
        self.sync = sync
        self.max_batch = max_batch
        self._name = name
        self._pending: list[_Pending] = []
        self._pending_ops = 0
        self._wakeup = trio.Event()
        self._thread: _Thread | None = None
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._recovered: Recovered | None = None
        # usage counters
        self.transactions = 0
        self.operations = 0
        self.cancelled_pairs = 0
        self.largest_batch = 0
        self.commit_seconds = 0.0

    @property
    def recovered(self) -> Recovered:
        if self._recovered is None:
            raise StoreError("the store has not been opened")
        return self._recovered

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open (creating or upgrading) the database, recover, then commit until cancelled.

        Raises:
            StoreError: the file cannot be opened, is not a Martinet store, or has a newer
                schema; or a commit failed (the router must stop).
        """
        self._thread = _Thread(f"store-{self._name}")
        try:
            self._recovered = await self._thread.run(self._open)
            task_status.started()
            await self._commit_forever()
        finally:
            self._closed = True
            for pending in self._pending:
                pending.error = StoreError("the store stopped before this commit was applied")
                pending.done.set()
            self._pending.clear()
            with trio.CancelScope(shield=True):
                await self._thread.run(self._close)
            self._thread.close()

    async def commit(self, ops: Sequence[Op]) -> None:
        if self._closed or self._thread is None:
            raise StoreError("the store is not running")
        if not ops:
            return
        pending = _Pending(ops)
        self._pending.append(pending)
        self._pending_ops += len(ops)
        self._wakeup.set()
        with trio.CancelScope(shield=True):
            await pending.done.wait()
        if pending.error is not None:
            raise StoreError(f"commit failed: {pending.error}") from pending.error

    async def _commit_forever(self) -> None:
        assert self._thread is not None
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._pending:
                batch, ops = self._take_batch()
                begin = time.perf_counter()
                try:
                    await self._thread.run(functools.partial(self._apply, ops))
                except Exception as exc:
                    for pending in batch:
                        pending.error = exc
                        pending.done.set()
                    raise StoreError(f"{self.path}: commit failed: {exc}") from exc
                self.commit_seconds += time.perf_counter() - begin
                for pending in batch:
                    pending.done.set()

    def _take_batch(self) -> tuple[list[_Pending], list[Op]]:
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

    # -- on the store thread --------------------------------------------------------------

    def _open(self) -> Recovered:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA page_size = 16384")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{self.path}: cannot use WAL mode (got {mode})")
            db.execute(f"PRAGMA synchronous = {self.sync.upper()}")
            db.executescript(_SCHEMA)
            found = db.execute("SELECT value FROM meta WHERE key = 'schema-version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable Martinet store: {exc}") from None
        if found is None:
            db.execute("INSERT INTO meta VALUES ('schema-version', ?)", (str(SCHEMA_VERSION),))
        elif int(found[0]) > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {found[0]} is newer than this release "
                             f"understands ({SCHEMA_VERSION})")
        self._db = db
        messages = [StoredMessage(*row) for row in db.execute(
            "SELECT id, queue, body, delivery_count, txid FROM messages ORDER BY id")]
        records: dict[str, dict[str, bytes]] = {}
        for kind, key, value in db.execute("SELECT kind, key, value FROM records"):
            records.setdefault(kind, {})[key] = value
        remembered: dict[str, list[str]] = {}
        for queue_name, message_id in db.execute("SELECT queue, message_id FROM remembered_ids ORDER BY id"):
            remembered.setdefault(queue_name, []).append(message_id)
        next_id = (messages[-1].id + 1) if messages else 1
        log.info("store %s opened: %d messages, %d records", self.path, len(messages),
                 sum(len(v) for v in records.values()))
        return Recovered(messages, records, remembered, next_id)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _apply(self, ops: list[Op]) -> None:
        """Apply one batch in one transaction; a failure rolls back all of it."""
        db = self._db
        assert db is not None
        puts: dict[int, PutMessage] = {}
        deletes: list[tuple[int]] = []
        counts: list[tuple[int, int]] = []
        transactions: list[tuple[str | None, int]] = []
        records: list[tuple[str, str, bytes]] = []
        record_deletes: list[tuple[str, str]] = []
        remembered: list[tuple[str, str]] = []
        keep: dict[str, int] = {}
        for op in ops:
            kind = type(op)
            if kind is PutMessage:
                puts[op.id] = op
            elif kind is DeleteMessage:
                if puts.pop(op.id, None) is not None:
                    self.cancelled_pairs += 1  # stored and consumed within one batch
                else:
                    deletes.append((op.id,))
            elif kind is SetDeliveryCount:
                put = puts.get(op.id)
                if put is not None:
                    puts[op.id] = put._replace(delivery_count=op.delivery_count)
                else:
                    counts.append((op.delivery_count, op.id))
            elif kind is SetTransaction:
                put = puts.get(op.id)
                if put is not None:
                    puts[op.id] = put._replace(txid=op.txid)
                else:
                    transactions.append((op.txid, op.id))
            elif kind is PutRecord:
                records.append((op.kind, op.key, op.value))
            elif kind is DeleteRecord:
                record_deletes.append((op.kind, op.key))
            elif kind is RememberId:
                remembered.append((op.queue, op.message_id))
                keep[op.queue] = op.keep
            else:
                raise TypeError(f"unknown store operation {op!r}")
        db.execute("BEGIN")
        try:
            if puts:
                db.executemany("INSERT INTO messages (id, queue, body, delivery_count, txid) VALUES (?, ?, ?, ?, ?)",
                               puts.values())
            if deletes:
                db.executemany("DELETE FROM messages WHERE id = ?", deletes)
            if counts:
                db.executemany("UPDATE messages SET delivery_count = ? WHERE id = ?", counts)
            if transactions:
                db.executemany("UPDATE messages SET txid = ? WHERE id = ?", transactions)
            if records:
                db.executemany("INSERT OR REPLACE INTO records (kind, key, value) VALUES (?, ?, ?)", records)
            if record_deletes:
                db.executemany("DELETE FROM records WHERE kind = ? AND key = ?", record_deletes)
            if remembered:
                db.executemany("INSERT INTO remembered_ids (queue, message_id) VALUES (?, ?)", remembered)
                for queue_name, size in keep.items():
                    db.execute(
                        "DELETE FROM remembered_ids WHERE queue = ?1 AND id <= (SELECT id FROM remembered_ids "
                        "WHERE queue = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)", (queue_name, size))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.transactions += 1
        self.operations += len(ops)
        self.largest_batch = max(self.largest_batch, len(ops))

    def usage(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "sync": self.sync,
            "transactions": self.transactions,
            "fsyncs": self.transactions if self.sync == "full" else 0,
            "operations": self.operations,
            "cancelled-pairs": self.cancelled_pairs,
            "largest-batch": self.largest_batch,
            "pending-operations": self._pending_ops,
            "commit-seconds": round(self.commit_seconds, 3),
        }
