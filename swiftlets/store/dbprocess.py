"""The store process: owns the SQLite database, in a process of its own
(``python -P …/dbprocess.py PATH SYNC ACCEPT [READ_IN READ_OUT]``, ACCEPT ``accept-empty``
or ``refuse-empty``; READ_IN and READ_OUT the file descriptors of the read pipes, below).

The router runs this file as a script, not as ``-m martinet.swiftlets.store`` (which does
the same by hand): ``-m`` imports the swiftlet's package first, and with it the kernel and
every swiftlet its jobs name, 0.4 s of CPU against 0.05 s for this file's own imports
(SQLite, msgpack, the message head), and 44 MB of memory against 20 MB. A router pays that
at every start, and the test suite starts some 800 routers. So this module imports nothing of
its package, and knows operations by their numbers. ``-P`` keeps its folder off the import
path: its ``pipes.py`` would stand in for the standard library's module of that name.

Theory of operation
-------------------
Why a process and not a thread: a thread doing SQLite inside the router shares the GIL
with the trio thread. Python's sqlite3 gives the GIL up inside every SQLite call and must
take it back afterwards, and a busy trio loop keeps releasing and re-taking the GIL itself
(``epoll`` with timeout 0 between batches); the two convoy. Measured on the development
machine: 5 commits of 1000 rows took 0.056 s next to a busy pure-Python thread and 1.55 s
next to a busy thread that polls epoll, and a 1000-row commit took up to 44 s inside a busy
router. In its own process the database has its own interpreter and GIL.

Protocol, over the process's stdin/stdout: frames of a 4-byte big-endian length and a
msgpack body (an array whose first element names it).

- At start the store process opens (creating or upgrading) the database, checks it (below),
  sends ``["warning", text]`` for each problem it was told to accept, then the recovered
  state: ``["messages", [[id, queue, head, delivery_count, txid, size], …]]`` (in chunks;
  ``head`` is the stored bytes up to the message's body — the sections a queue and a
  selector read, :func:`messaging.message.head_length` — and ``size`` the length of the
  whole: the router reads back only the bodies it keeps in memory),
  ``["records", [[kind, key, value], …]]``, ``["remembered", [[queue, message_id], …]]``,
  then ``["ready", next_id]``; or ``["error", text]`` and exits with status 1.
- ``["commit", [op, …]]`` applies the operations in one transaction and answers
  ``["done", cancelled_pairs]`` or ``["error", text]`` (nothing of it applied). Each op is
  ``[code, fields…]`` with the codes of :data:`.batches.OP_CODES`. The router may send the next
  commit before the answer to the last one; once one failed, every later one is answered
  with an error and not applied, so that nothing committed follows a failed batch. A batch
  that meets a full disk has not failed: SQLite rolls it back, the store process answers
  ``["full", text]`` once and tries it again until it goes through (then ``["done", …]``)
  or until its input ends (the router stopped or died: it exits with the batch not applied
  and not answered).
- ``["read", [id, …]]`` answers ``["bodies", [[id, body], …]]``: the stored bodies of those
  messages that exist (in id order), or ``["error", text]``; it changes nothing. (It serves the
  read-back of bodies a queue does not keep in memory.) With READ_IN and READ_OUT, read
  requests come on READ_IN and are answered on READ_OUT by a thread of their own with a
  connection of its own (:class:`Reader`), beside the commits: a read does not wait for the
  commit in progress, and sees every commit finished before it began (WAL). Without them
  they come on stdin, between the commits.
- ``["backup", target]`` writes a consistent copy of the database to the file ``target``
  (SQLite's online backup, from the committing connection, between two commits: it holds
  every commit confirmed before it and nothing half) and answers ``["maintained", bytes]``;
  ``["vacuum"]`` rebuilds the database to give free pages back to the file system and
  answers ``["maintained", bytes freed]``; either ``["error", text]`` (a failed maintenance
  changes nothing the router relies on). Both come from the scheduler's Store jobs.
- End of input: the store process closes the database and exits with status 0. So when the
  router dies, even by ``kill -9``, its store process applies the commits already in its pipe
  (nobody reads the answers any more; applying them is harmless, and a commit is all or
  nothing either way) and exits.

One store process per store (the store lock): before it touches SQLite the store process
takes an exclusive ``flock`` on ``<database>.lock`` and holds it until it exits (the kernel
drops it then, even after ``kill -9``). A router restarted at once after ``kill -9`` starts
its new store process while the old one may still be applying its last commits; two
processes on one store must never overlap (the new one would recover a state the old one
then changes behind its back, and the chaos harness saw a restarted router open its store
empty). So the new one waits, sending ``["notice", text]`` once (the router logs it as a
WARNING), up to :data:`LOCK_WAIT` seconds, then answers ``["error", text]`` naming the
holder's pid (written into the lock file by the holder).

Checkpoints (see :class:`Checkpointer`): SQLite's automatic WAL checkpoint is off; a thread
of the store process with its own connection copies the WAL back into the database beside
the commits, and the committing thread only catches up on the last few frames now and
then, so that the WAL can start over.

Checks at open, so that a store is never emptied or truncated silently:

- *Did it exist?* At creation the database gets a random ``store-id`` (in ``meta``) and a
  companion file ``<database>.store-id`` holding the same id, written atomically next to it.
  A marker whose id the database does not have means the store existed and its database is
  now empty (truncated to zero length, deleted, recreated) or another one: refused. The
  marker lives outside the database, so nothing that happens to the database file can
  erase the evidence; deleting the whole store folder is the way to start afresh.
- *Unclean stop* (a ``-wal`` file is left; a clean close removes it): before SQLite sees it
  the WAL is read and its checksum chain checked (:func:`inspect_wal`) — SQLite's recovery
  stops silently at the first bad frame, and Python's sqlite3 gives no access to SQLite's
  error log, so this is the only way to count what it drops. Then ``PRAGMA quick_check``.
  Damage that drops committed transactions, or a failed check, is refused.

A refused store is reported as an error with the counts; with ``accept-empty-store`` (the
ACCEPT argument) the store process goes on with what is left, and the router logs each problem as an
ERROR.

Schema version 1: ``messages`` (rowid = message id), ``records`` (kind, key → blob),
``remembered_ids`` (duplicate-detection backlogs), ``meta`` (``schema-version``, ``store-id``).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import sqlite3
import struct
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from martinet.messaging.message import head_length

SCHEMA_VERSION = 1
_SET_COLUMNS = {3: (3, "delivery_count"), 4: (4, "txid"), 8: (2, "body")}  # op code → (put field, column)
RECOVERY_CHUNK = 2000
MARKER_SUFFIX = ".store-id"  # the companion file recording that the store was created (see above)
LENGTH = struct.Struct(">I")  # the frame length prefix
LOCK_SUFFIX = ".lock"  # the store lock (see above)
LOCK_WAIT = 30.0  # seconds a store process waits for the previous one of its store to exit
FULL_RETRY = 0.2  # seconds between two tries of a batch that met a full disk
# Test hook (tests/swiftlets/store/test_lock.py and others): while the file this names exists, the store
# process waits before applying each commit (with the second one set, only each commit that
# stores a message in the queue it names), so that a test can hold a store process in the
# middle of its work deterministically. Never set them in production.
COMMIT_GATE_ENV = "MARTINET_TEST_STORE_COMMIT_GATE"
COMMIT_GATE_QUEUE_ENV = "MARTINET_TEST_STORE_COMMIT_GATE_QUEUE"

# Rows per statement: a few large statements are much cheaper than one per row.
# 5 columns x 160 rows stays well below SQLite's limit of 32766 parameters per statement.
_ROWS_PER_STATEMENT = 160

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


class DatabaseError(Exception):
    """The database cannot be used (message for the operator)."""


def pack_frame(body: Any) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    return LENGTH.pack(len(payload)) + payload


def unpack_frame(payload: bytes | memoryview) -> Any:  # (msgpack reads any buffer)
    return msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=False)


class Database:
    """The database side: open and recover, apply batches, close."""

    def __init__(self, path: str, sync: str, accept_empty: bool = False):
        """Open (creating or upgrading) the store at ``path``.

        Raises:
            DatabaseError: not a store, a newer schema, or — unless ``accept_empty`` — a store
                that existed (its marker says so) and is now empty, replaced or damaged.
        """
        self.warnings: list[str] = []  # for the router's log, sent with the recovery
        marker = Path(path + MARKER_SUFFIX)
        expected_id = marker.read_text().strip() if marker.exists() else None
        wal = Path(path + "-wal")
        unclean = wal.exists() and wal.stat().st_size > 0  # a clean close removes the WAL
        damage = inspect_wal(wal.read_bytes()) if unclean else None
        try:
            db = sqlite3.connect(path, isolation_level=None)
            db.execute("PRAGMA busy_timeout = 10000")  # the store process of a killed router may still be finishing
            db.execute("PRAGMA page_size = 16384")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise DatabaseError(f"{path}: cannot use WAL mode (got {mode})")
            db.execute(f"PRAGMA synchronous = {sync.upper()}")
            store_id = _meta(db, "store-id")
            problems = []
            if expected_id is not None and store_id != expected_id:
                problems.append(
                    f"the store existed (its marker {marker.name} says so) but the database is "
                    + (
                        "empty or missing"
                        if store_id is None
                        else f"another store's (id {store_id}, expected {expected_id})"
                    )
                )
            if damage is not None:
                problems.append(damage)
            if unclean:  # only after an unclean stop: it reads the whole database
                checked = [row[0] for row in db.execute("PRAGMA quick_check")]
                if checked != ["ok"]:
                    problems.append(f"integrity check failed ({len(checked)} problem(s)): " + "; ".join(checked[:5]))
            if problems:
                text = f"{path}: " + "; ".join(problems)
                if not accept_empty:
                    raise DatabaseError(
                        text + ' — refusing to start; start once with accept-empty-store="true" '
                        "on sys$store to accept what is left"
                    )
                self.warnings.append(text + " — accepted (accept-empty-store)")
            db.executescript(_SCHEMA)
            found = _meta(db, "schema-version")
            if found is None:
                db.execute("INSERT INTO meta VALUES ('schema-version', ?)", (str(SCHEMA_VERSION),))
            elif int(found) > SCHEMA_VERSION:
                raise DatabaseError(
                    f"{path}: schema version {found} is newer than this release understands ({SCHEMA_VERSION})"
                )
            if store_id is None:
                store_id = uuid.uuid4().hex
                db.execute("INSERT INTO meta VALUES ('store-id', ?)", (store_id,))
            if store_id != expected_id:
                _write_marker(marker, store_id)
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{path}: not a usable Martinet store: {exc}") from None
        self.db = db

    def recover(self, send: Any) -> None:
        """Send the stored state as recovery frames through ``send(frame_body)``."""
        db = self.db
        chunk: list[list[Any]] = []
        last_id = 0
        for id_, queue, body, delivery_count, txid in db.execute(
            "SELECT id, queue, body, delivery_count, txid FROM messages ORDER BY id"
        ):
            try:
                head = body[: head_length(body)]
            except (ValueError, IndexError):  # MessageError is a ValueError
                head = body  # the queue manager reports and drops what it cannot read
            chunk.append([id_, queue, head, delivery_count, txid, len(body)])
            last_id = id_
            if len(chunk) >= RECOVERY_CHUNK:
                send(["messages", chunk])
                chunk = []
        if chunk:
            send(["messages", chunk])
        send(["records", [list(row) for row in db.execute("SELECT kind, key, value FROM records")]])
        send(
            [
                "remembered",
                [list(row) for row in db.execute("SELECT queue, message_id FROM remembered_ids ORDER BY id")],
            ]
        )
        send(["ready", last_id + 1])

    def apply(self, ops: list[list[Any]]) -> int:
        """Apply one batch in one transaction; the number of insert/delete pairs dropped.

        A message stored and deleted within the batch (consumed before its insert reached
        the disk) is written neither way. Any failure rolls the whole batch back.
        """
        puts: dict[int, list[Any]] = {}
        deletes: list[int] = []
        updates: dict[str, dict[int, Any]] = {}  # column → id → its last value in this batch
        records: list[tuple] = []
        record_deletes: list[tuple] = []
        remembered: list[tuple] = []
        keep: dict[str, int] = {}
        cancelled = 0
        for op in ops:
            code = op[0]
            if code == 1:
                puts[op[1]] = op[1:]
            elif code == 2:
                if puts.pop(op[1], None) is not None:
                    cancelled += 1
                else:
                    deletes.append(op[1])
            elif code == 3 or code == 4 or code == 8:
                field, column = _SET_COLUMNS[code]
                put = puts.get(op[1])
                if put is not None:  # stored in this batch: store it changed
                    put[field] = op[2]
                else:
                    updates.setdefault(column, {})[op[1]] = op[2]
            elif code == 5:
                records.append(tuple(op[1:]))
            elif code == 6:
                record_deletes.append(tuple(op[1:]))
            elif code == 7:
                remembered.append((op[1], op[2]))
                keep[op[1]] = op[3]
            else:
                raise ValueError(f"unknown store operation code {code}")
        db = self.db
        db.execute("BEGIN")
        try:
            _insert_rows(db, "messages (id, queue, body, delivery_count, txid)", list(puts.values()))
            for start in range(0, len(deletes), _ROWS_PER_STATEMENT * 4):
                chunk = deletes[start : start + _ROWS_PER_STATEMENT * 4]
                db.execute(f"DELETE FROM messages WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
            for column, values in updates.items():  # one statement per value (a commit clears many txids)
                by_value: dict[Any, list[int]] = {}
                for id_, value in values.items():
                    by_value.setdefault(value, []).append(id_)
                for value, ids in by_value.items():
                    for start in range(0, len(ids), _ROWS_PER_STATEMENT * 4):
                        chunk = ids[start : start + _ROWS_PER_STATEMENT * 4]
                        db.execute(
                            f"UPDATE messages SET {column} = ? WHERE id IN ({', '.join('?' * len(chunk))})",
                            (value, *chunk),
                        )
            _insert_rows(db, "records (kind, key, value)", records, replace=True)
            for kind_key in record_deletes:
                db.execute("DELETE FROM records WHERE kind = ? AND key = ?", kind_key)
            if remembered:
                _insert_rows(db, "remembered_ids (queue, message_id)", remembered)
                for queue_name, size in keep.items():
                    db.execute(
                        "DELETE FROM remembered_ids WHERE queue = ?1 AND id <= (SELECT id FROM remembered_ids "
                        "WHERE queue = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                        (queue_name, size),
                    )
            db.execute("COMMIT")
        except BaseException:
            # SQLite has rolled back already after some errors (SQLITE_FULL, SQLITE_IOERR):
            # a ROLLBACK then fails with "no transaction is active" and would hide the cause.
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the original error is what the operator must see
            raise
        return cancelled

    def read(self, ids: list[int]) -> list[list[Any]]:
        """``[[id, body], …]`` of the stored messages among ``ids``, in id order."""
        return read_bodies(self.db, ids)

    def backup(self, target: str) -> int:
        """Copy the database to ``target`` (written beside it first, then renamed: a crash
        leaves no half copy under that name); its size in bytes."""
        partial = target + ".partial"
        copy = sqlite3.connect(partial)
        try:
            self.db.backup(copy)
        finally:
            copy.close()
        os.replace(partial, target)
        return os.path.getsize(target)

    def vacuum(self) -> int:
        """Rebuild the database without its free pages; the bytes given back."""

        def size() -> int:
            return (
                self.db.execute("PRAGMA page_count").fetchone()[0] * self.db.execute("PRAGMA page_size").fetchone()[0]
            )

        before = size()
        self.db.execute("VACUUM")
        return before - size()

    def close(self) -> None:
        self.db.close()


def read_bodies(db: sqlite3.Connection, ids: list[int]) -> list[list[Any]]:
    """``[[id, body], …]`` of the stored messages among ``ids``, in id order."""
    rows: list[list[Any]] = []
    for start in range(0, len(ids), _ROWS_PER_STATEMENT * 4):
        chunk = ids[start : start + _ROWS_PER_STATEMENT * 4]
        rows.extend(
            [row[0], row[1]]
            for row in db.execute(
                f"SELECT id, body FROM messages WHERE id IN ({', '.join('?' * len(chunk))}) ORDER BY id", chunk
            )
        )
    return rows


class Reader:
    """Answers read requests from their own pipe, in a thread with a connection of its own,
    so that a read does not wait for the commit the committing thread is in. Each read is
    one SQLite read transaction (autocommit): it sees every commit finished before it began.
    The thread ends at the end of its input (the router closed the pipe or is gone)."""

    def __init__(self, path: str, requests: BinaryIO, answers: BinaryIO):
        self._thread = threading.Thread(target=self._run, args=(path, requests, answers), name="reader", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(path: str, requests: BinaryIO, answers: BinaryIO) -> None:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout = 10000")
            while (header := _read_exactly(requests, 4)) is not None:
                payload = _read_exactly(requests, LENGTH.unpack(header)[0])
                if payload is None:
                    break
                request = unpack_frame(payload)
                try:
                    if request[0] != "read":
                        raise ValueError(f"unknown request {request[0]!r}")
                    answer = ["bodies", read_bodies(db, request[1])]
                except (sqlite3.Error, ValueError, TypeError) as exc:
                    answer = ["error", f"{type(exc).__name__}: {exc}"]
                answers.write(pack_frame(answer))
                answers.flush()
        except (BrokenPipeError, OSError):
            pass  # the router is gone
        finally:
            db.close()


class Checkpointer:
    """Checkpoints the WAL mostly from a thread of the store process, so that commits do not
    wait for the copying.

    With SQLite's default (``wal_autocheckpoint`` = 1000 pages) the commit that makes the
    WAL pass 1000 pages runs the whole checkpoint itself, inside the router's group commit:
    it copies those pages into the database file and fsyncs it, and every producer waiting
    for that batch waits for it too (the tail of ``bench/ack_latency.py``). Here the
    automatic checkpoint is off on the committing connection, and:

    - this thread, on a connection of its own, runs ``PRAGMA wal_checkpoint(PASSIVE)``
      after every :data:`COMMITS` commits and at least every :data:`INTERVAL` seconds. A
      PASSIVE checkpoint takes no lock a writer waits for: commits go on appending to the
      WAL while it copies what was committed when it began.
    - SQLite rewinds the WAL to its beginning at the first write after a checkpoint that
      copied *everything*; under a stream of commits the thread's checkpoints never catch
      up with the last one, so the WAL would grow for ever. So once the WAL holds
      :data:`CATCH_UP_FRAMES` frames, the committing thread, between two batches, runs one
      PASSIVE checkpoint itself (:meth:`catch_up`): it copies only the frames appended since
      the thread's last pass, and the next commit rewinds the WAL. The committing thread
      reads the WAL's length itself after each commit — ``mxFrame`` of the WAL-index header
      in the ``-shm`` file (https://www.sqlite.org/walformat.html, one ``pread``) — so the
      bound holds however late the thread runs: the WAL stays below about
      :data:`CATCH_UP_FRAMES` frames, and a commit waits for a small copy once per that many
      frames instead of a full one.
    - A rewound WAL keeps its file (``journal_size_limit`` twice that length): the next
      commits overwrite frames in place. Cut back to nothing, as before, every commit
      after a rewind grew the file again, and an ``fdatasync`` that must also record a new
      size and new blocks waits for the file system's journal: measured here with 4 KiB
      and 48 KiB writes at 1,000/s, p50 0.34–0.56 ms appending against 0.14–0.38 ms in place.

    The thread needs the GIL only between SQLite calls (sqlite3 releases it inside them),
    and the committing thread mostly waits on its pipe or in SQLite, so the two do not
    convoy as a busy trio loop would (see the module doc).

    Contract: :meth:`committed` is called by the committing thread after each commit and
    never blocks; it calls :meth:`catch_up` (blocking, in that thread) when due. Errors of a
    checkpoint are ignored (the next one tries again; commits are unaffected). :meth:`stop`
    ends the thread (a checkpoint in progress finishes first); the database's last
    connection checkpoints the rest when it closes.
    """

    COMMITS = 300
    INTERVAL = 1.0
    CATCH_UP_FRAMES = 1000

    def __init__(self, path: str, db: sqlite3.Connection):
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute("PRAGMA wal_autocheckpoint = 0")  # the committing connection checkpoints only in catch_up
        # A rewound WAL keeps its blocks, to be overwritten in place (a frame: its header and a page).
        db.execute(f"PRAGMA journal_size_limit = {2 * self.CATCH_UP_FRAMES * (page_size + 24) + 32}")
        db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()  # (a read: the WAL index exists from here on)
        self._db = db
        self._path = path
        self._index = os.open(f"{path}-shm", os.O_RDONLY)
        self._wakeup = threading.Event()
        self._stopping = False
        self._commits = 0
        self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A commit appended to the WAL (called by the committing thread)."""
        self._commits += 1
        if self._commits >= self.COMMITS:
            self._commits = 0
            self._wakeup.set()
        if self.wal_frames() >= self.CATCH_UP_FRAMES:
            self.catch_up()

    def wal_frames(self) -> int:
        """The WAL's length in frames: ``mxFrame`` of the WAL-index header (offset 16, native
        byte order), which only the committing thread changes — so read by it, it is exact."""
        return int.from_bytes(os.pread(self._index, 4, 16), sys.byteorder)

    def catch_up(self) -> None:
        """Checkpoint from the committing connection, so that no commit runs meanwhile."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            pass

    def _run(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stopping:
                self._wakeup.wait(self.INTERVAL)
                self._wakeup.clear()
                if self._stopping:
                    break
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    continue
        finally:
            db.close()

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join()
        # self._index stays open until the process exits: closing any descriptor of the -shm
        # file drops every POSIX lock this process holds on it, SQLite's own included (its
        # connections are still open here).


def lock_store(path: str, notice: Any, wait: float = LOCK_WAIT) -> int:
    """Take the store lock of database ``path`` (see the module doc); its file descriptor,
    to be kept open for the life of the process (closing it releases the lock).

    If another process holds it, calls ``notice(text)`` once and retries until ``wait``
    seconds have passed.

    Raises:
        DatabaseError: the lock is still held after ``wait`` seconds (the text names the
            lock file and the holder's pid), or the lock file cannot be opened.
    """
    lock_path = path + LOCK_SUFFIX
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise DatabaseError(f"{path}: cannot open the store lock {lock_path}: {exc}") from None
    deadline = time.monotonic() + wait
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            os.close(fd)
            raise DatabaseError(
                f"{path}: the previous store process (pid {_lock_holder(lock_path)}) still holds "
                f"the store lock {lock_path} after {wait:g} s — refusing to open the store beside it"
            )
        if not waiting:
            waiting = True
            notice(f"waiting for the previous store process of {path} (pid {_lock_holder(lock_path)}) to finish")
        time.sleep(0.01)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the error of a store process that waits in vain
    return fd


def _lock_holder(lock_path: str) -> str:
    """The pid the holder of the store lock wrote into it, or "unknown"."""
    try:
        return Path(lock_path).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    """A ``meta`` value; None when absent (or when there is no ``meta`` table: an empty file)."""
    try:
        found = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return found[0] if found is not None else None


def _write_marker(marker: Path, store_id: str) -> None:
    """Write the marker atomically and durably (temporary file, fsync, rename, fsync the folder)."""
    temporary = marker.with_name(marker.name + ".tmp")
    with temporary.open("w") as file:
        file.write(store_id + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, marker)
    folder = os.open(marker.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _wal_checksum(data: bytes, words: str, s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum over ``data`` (a multiple of 8 bytes), continuing from (s0, s1)."""
    values = struct.unpack(f"{words}{len(data) // 4}I", data)
    for i in range(0, len(values), 2):
        s0 = (s0 + values[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + values[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def inspect_wal(wal: bytes) -> str | None:
    """What a WAL left by an unclean stop would lose beyond an interrupted transaction; None if nothing.

    SQLite replays the WAL up to the last commit frame of the unbroken checksum chain and
    silently ignores the rest. Frames of an interrupted transaction (valid checksums, no commit
    frame after them) are expected after a crash. Frames of the current WAL generation (its
    salts) *after* a frame whose checksum fails are not: they were written and then damaged,
    and the commits among them are acknowledged transactions that recovery drops. Stale frames
    of an earlier generation (other salts) are ignored, as SQLite does.
    (Format: https://www.sqlite.org/fileformat.html#the_write_ahead_log)
    """
    if len(wal) < 32:
        return None
    magic, _version, page_size, _sequence, salt1, salt2 = struct.unpack_from(">6I", wal)
    if magic not in (0x377F0682, 0x377F0683) or not page_size:
        return f"the WAL ({len(wal)} bytes) has no valid header and is ignored"
    words = ">" if magic & 1 else "<"
    s0, s1 = _wal_checksum(wal[:24], words, 0, 0)
    if (s0, s1) != struct.unpack_from(">2I", wal, 24):
        return f"the WAL header fails its checksum; its {(len(wal) - 32) // (page_size + 24)} frame(s) are ignored"
    frame_size = 24 + page_size
    frames = (len(wal) - 32) // frame_size
    broken_at = None
    lost_frames = lost_commits = 0
    for index in range(frames):
        offset = 32 + index * frame_size
        _page, committed_size, frame_salt1, frame_salt2, check0, check1 = struct.unpack_from(">6I", wal, offset)
        if (frame_salt1, frame_salt2) != (salt1, salt2):
            if broken_at is None:
                break  # the end of the current generation: stale frames follow
            continue
        if broken_at is None:
            s0, s1 = _wal_checksum(wal[offset : offset + 8], words, s0, s1)
            s0, s1 = _wal_checksum(wal[offset + 24 : offset + frame_size], words, s0, s1)
            if (s0, s1) == (check0, check1):
                continue
            broken_at = index
        lost_frames += 1
        lost_commits += committed_size != 0
    if broken_at is None or not lost_commits:
        return None  # at most a torn, never acknowledged transaction: what a crash leaves
    return (
        f"the WAL is damaged: frame {broken_at + 1} of {frames} fails its checksum; recovery drops "
        f"{lost_frames} frame(s) from there, with {lost_commits} committed transaction(s)"
    )


def _insert_rows(db: sqlite3.Connection, table: str, rows: Sequence[Sequence[Any]], *, replace: bool = False) -> None:
    if not rows:
        return
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    group = "(" + ", ".join("?" * len(rows[0])) + ")"
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        db.execute(
            f"{verb} INTO {table} VALUES {', '.join([group] * len(chunk))}", [value for row in chunk for value in row]
        )


def _puts_into(ops: list[list[Any]], queue: str) -> bool:
    """The batch stores a message in ``queue`` (a put's fields: code 1, id, queue, …)."""
    return any(op[0] == 1 and op[2] == queue for op in ops)


def _hold(gate: str) -> None:
    """The tests' commit gate: while the file ``gate`` exists, wait (and say so with the file
    ``<gate>.held``, so that a test knows a commit is held before it kills something)."""
    if os.path.exists(gate):
        Path(f"{gate}.held").touch()
        while os.path.exists(gate):
            time.sleep(0.01)


def _apply_when_room(database: Database, ops: list[list[Any]], send: Any, source: int) -> int | None:
    """Apply one batch; one that meets a full disk (rolled back whole) is tried again every
    :data:`FULL_RETRY` seconds until it goes through, after one ``["full", text]`` to the
    router. None when the router ended its input meanwhile (stopped or gone): the batch was
    not applied, and was not answered either, so nobody was told it is stored.

    Raises:
        sqlite3.Error, ValueError, IndexError: the batch failed for another reason.
    """
    told = False
    while True:
        try:
            return database.apply(ops)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_FULL:
                raise
            if not told:
                send(["full", str(exc)])
                told = True
        time.sleep(FULL_RETRY)
        poller = select.poll()
        poller.register(source, select.POLLIN)
        if any(events & select.POLLHUP for _, events in poller.poll(0)):
            return None


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) < size:
        return None  # end of input (partial frames only when the router died mid-write)
    return data


def main(argv: list[str]) -> int:
    """Serve one router's store until end of input; the exit status."""
    path, sync, accept_empty, *read_pipes = argv
    # Ctrl-C and SIGTERM reach the whole process group; the store process outlives its router's
    # orderly stop (which may still commit) and leaves when its input ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    router_gone = False  # the answers cannot be delivered: the commits given are still applied

    def send(body: Any) -> None:
        nonlocal router_gone
        if router_gone:
            return
        try:
            sink.write(pack_frame(body))
            sink.flush()
        except BrokenPipeError:
            router_gone = True

    gate, gate_queue = os.environ.get(COMMIT_GATE_ENV), os.environ.get(COMMIT_GATE_QUEUE_ENV)
    try:
        # Held until the process exits (never closed: the kernel releases it after the last
        # thread and connection are gone, so the next store process never overlaps this one).
        lock_store(path, lambda text: send(["notice", text]))
        database = Database(path, sync, accept_empty == "accept-empty")
        for warning in database.warnings:
            send(["warning", warning])
        database.recover(send)
    except (DatabaseError, sqlite3.Error, OSError) as exc:
        send(["error", str(exc)])
        return 1
    checkpointer = Checkpointer(path, database.db)
    failed: str | None = None  # a commit failed: every later one is refused (see the protocol)
    if read_pipes:
        Reader(path, os.fdopen(int(read_pipes[0]), "rb"), os.fdopen(int(read_pipes[1]), "wb"))
    try:
        while (header := _read_exactly(source, 4)) is not None:
            payload = _read_exactly(source, LENGTH.unpack(header)[0])
            if payload is None:
                break
            request = unpack_frame(payload)
            if request[0] == "read":
                try:
                    send(["bodies", database.read(request[1])])
                except (sqlite3.Error, ValueError, TypeError) as exc:
                    send(["error", f"{type(exc).__name__}: {exc}"])
                continue
            if request[0] in ("backup", "vacuum"):
                try:
                    done = database.backup(request[1]) if request[0] == "backup" else database.vacuum()
                except (sqlite3.Error, OSError, ValueError, IndexError) as exc:
                    send(["error", f"{type(exc).__name__}: {exc}"])
                else:
                    send(["maintained", done])
                    checkpointer.committed()
                continue
            if request[0] != "commit":
                send(["error", f"unknown request {request[0]!r}"])
                continue
            if failed is not None:  # the router may have sent more behind the failed batch: none is applied
                send(["error", f"an earlier commit failed: {failed}"])
                continue
            if gate is not None and (gate_queue is None or _puts_into(request[1], gate_queue)):
                _hold(gate)
            try:
                cancelled = _apply_when_room(database, request[1], send, source.fileno())
            except (sqlite3.Error, ValueError, IndexError) as exc:
                failed = f"{type(exc).__name__}: {exc}"
                send(["error", failed])
            else:
                if cancelled is None:  # the router is gone while the disk was full: nothing more is applied
                    break
                send(["done", cancelled])
                checkpointer.committed()
    finally:
        checkpointer.stop()
        database.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
