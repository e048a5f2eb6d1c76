"""sys$store: group commit, recovery, dropped insert/delete pairs, bad files, failures."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3

import pytest
import trio

from martinet.kernel import Router, SwiftletFailed
from martinet.messaging.client import JMSError, Queue, TextMessage, connect
from martinet.messaging.message import build
from martinet.swiftlets.store.api import (
    DeleteMessage,
    DeleteRecord,
    PutMessage,
    PutRecord,
    RememberId,
    SetDeliveryCount,
    SetMessageBody,
    SetTransaction,
    StoreError,
)
from martinet.swiftlets.store.sqlite import store_process_command

from tests.harness.netharness import store_engine_pid
from tests.harness.routers import amqp_router_xml


def usage(router) -> dict:
    return router.management.resolve("/sys$store/usage").properties()


def raw(body: bytes) -> bytes:
    """An encoded message with ``body`` (the queue manager drops stored bytes that are none)."""
    return build(body, durable=True).raw


def stored_messages(tmp_path) -> list[tuple]:
    """The messages in the (stopped) broker's database, read with sqlite3 itself."""
    db = sqlite3.connect(tmp_path / "store" / "r1.sqlite")
    try:
        return db.execute("SELECT id, queue, body, delivery_count, txid FROM messages ORDER BY id").fetchall()
    finally:
        db.close()


async def test_everything_committed_is_recovered(broker, tmp_path):
    store = broker.store
    await store.commit(
        [
            PutMessage(1, "a", b"one"),
            PutMessage(2, "b", b"two", 0, "xid-1"),
            PutMessage(3, "a", b"three"),
            PutRecord("durable", "c1$s", b"record"),
            PutRecord("xa", "xid-1", b"{}"),
            RememberId("a", "m-1", 10),
            RememberId("a", "m-2", 10),
        ]
    )
    await store.commit([DeleteMessage(3), SetDeliveryCount(1, 4), SetTransaction(2, None), DeleteRecord("xa", "xid-1")])
    await broker.stop()
    assert stored_messages(tmp_path) == [(1, "a", b"one", 4, None), (2, "b", b"two", 0, None)]
    await broker.start()
    recovered = broker.store.recovered
    assert recovered.message_count == 2
    assert recovered.records == {"durable": {"c1$s": b"record"}}
    assert recovered.remembered_ids == {"a": ["m-1", "m-2"]}
    assert recovered.next_id == 3


async def test_remembered_ids_keep_only_the_newest(broker):
    for n in range(10):
        await broker.store.commit([RememberId("q", f"id-{n}", 3)])
    await broker.restart()
    assert broker.store.recovered.remembered_ids == {"q": ["id-7", "id-8", "id-9"]}


async def test_concurrent_commits_share_transactions(broker):
    before = usage(broker.router)
    async with trio.open_nursery() as nursery:
        for n in range(200):
            nursery.start_soon(broker.store.commit, [PutMessage(n + 1, "q", b"x" * 100)])
    after = usage(broker.router)
    assert after["operations"] - before["operations"] == 200
    assert after["transactions"] - before["transactions"] < 200  # group commit: fewer transactions than commits
    assert after["largest-batch"] > 1


async def test_a_message_stored_and_deleted_in_one_batch_is_never_written(broker, tmp_path):
    done = []
    broker.store.commit_nowait([PutMessage(7, "q", b"x")], done.append)
    broker.store.commit_nowait([DeleteMessage(7)], done.append)  # same batch: nothing pending ran yet
    await broker.store.commit([PutRecord("k", "v", b"")])
    assert done == [None, None]
    assert usage(broker.router)["cancelled-pairs"] == 1
    await broker.restart()
    assert broker.store.recovered.message_count == 0
    await broker.stop()
    assert stored_messages(tmp_path) == []


async def test_a_failed_commit_fails_its_callers_and_stops_the_router(make_broker, tmp_path):
    running = make_broker()
    await running.start()
    await running.store.commit([PutMessage(1, "q", b"x")])
    with pytest.raises(StoreError, match="UNIQUE constraint failed"):
        await running.store.commit([PutMessage(1, "q", b"again")])
    await running._done.wait()  # the store failed, so the router stopped
    assert running.failure.swiftlet == "sys$store"
    assert "commit failed: IntegrityError: UNIQUE constraint failed: messages.id" in str(running.failure)
    assert [row[2] for row in stored_messages(tmp_path)] == [b"x"]  # the first commit is intact
    await running.start()
    assert running.store.recovered.message_count == 1
    await running.stop()


async def test_every_commit_in_flight_fails_when_the_store_process_dies(make_broker):
    """Two batches may be in the store process's hands at once: when it dies, every waiter
    learns it — of a batch whose reply never came, of one whose send failed, of what was
    never sent — and the router stops. (A batch sent while the first failure was being
    noticed used to wait for ever; timing-dependent here, the chaos test
    ``test_routers_whose_store_engine_dies_mid_transfer_stop_themselves_and_lose_nothing``
    caught it reliably.)"""
    running = make_broker()
    await running.start()
    store = running.store
    ids = itertools.count(1)
    committed = failed = 0

    async def commit_until_it_fails() -> None:
        nonlocal committed, failed
        while True:
            try:
                await store.commit([PutMessage(next(ids), "q", b"x" * 1000)])
            except StoreError:
                failed += 1
                return
            committed += 1

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(commit_until_it_fails)
            while committed < 1000:  # commits are flowing: batches are in flight
                await trio.sleep(0.001)
            os.kill(store_engine_pid(os.getpid()), signal.SIGKILL)
        await running._done.wait()  # the store failed, so the router stopped
    assert failed == 200 and running.failure.swiftlet == "sys$store"


async def test_an_idle_router_stops_when_its_store_process_dies(make_broker, caplog):
    """Nothing to commit or read: the death is noticed all the same, and the router stops
    (a five-router mesh's idle router ran on without a store)."""
    running = make_broker()
    await running.start()
    os.kill(store_engine_pid(os.getpid()), signal.SIGKILL)
    with trio.fail_after(30):
        await running._done.wait()
    assert running.failure.swiftlet == "sys$store"
    assert "the store process exited (status -9)" in str(running.failure)


async def test_a_file_that_is_not_a_store_is_refused(make_broker, tmp_path):
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    (store_dir / "r1.sqlite").write_bytes(b"this is not a database" * 100)
    running = make_broker()
    with pytest.raises(
        SwiftletFailed,
        match="swiftlet sys\\$store failed to start: StoreError: .*r1.sqlite: "
        "not a usable Martinet store: file is not a database",
    ):
        await Router.from_file(running.path).run()


async def test_a_newer_schema_is_refused(make_broker, tmp_path):
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    db = sqlite3.connect(store_dir / "r1.sqlite")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('schema-version', '99')")
    db.commit()
    db.close()
    running = make_broker()
    with pytest.raises(SwiftletFailed, match="schema version 99 is newer than this release understands \\(1\\)"):
        await Router.from_file(running.path).run()


async def test_commit_after_stop_is_refused(broker):
    store = broker.store
    await broker.stop()
    with pytest.raises(StoreError, match="the store is not running"):
        await store.commit([PutMessage(1, "q", b"x")])


async def test_a_relative_path_is_under_the_start_directory_and_logged_absolute(
    nursery, write_config, tmp_path, monkeypatch, caplog
):
    monkeypatch.chdir(tmp_path)
    router = Router.from_file(
        write_config(
            '<router name="r1" startorder="sys$store"><swiftlet name="sys$store" path="data" sync="off"/></router>'
        )
    )
    with caplog.at_level("INFO", logger="martinet.swiftlets.store"):
        await nursery.start(router.run)
    database = tmp_path / "data" / "r1.sqlite"
    assert database.exists() and usage(router)["path"] == str(database)
    assert f"store {database} opened: 0 messages, 0 records" in caplog.messages
    router.request_stop()


async def test_updates_of_one_batch_go_by_value_and_the_last_one_wins(broker, tmp_path):
    """A batch's updates are grouped into one statement per column and value (a commit
    clears the txid of all its messages at once); per message the last update counts."""
    store = broker.store
    await store.commit([PutMessage(n, "a", b"m", 0, "xid-1") for n in range(1, 5)])
    counts = [SetDeliveryCount(1, 1), SetDeliveryCount(2, 2), SetDeliveryCount(1, 7), SetDeliveryCount(3, 2)]
    await store.commit([SetTransaction(n, None) for n in (1, 2, 3)] + counts + [SetTransaction(3, "xid-2")])
    await broker.stop()
    assert stored_messages(tmp_path) == [
        (1, "a", b"m", 7, None),
        (2, "a", b"m", 2, None),
        (3, "a", b"m", 2, "xid-2"),
        (4, "a", b"m", 0, "xid-1"),
    ]


async def test_a_message_body_is_replaced_stored_or_in_the_same_batch(broker, tmp_path):
    await broker.store.commit([PutMessage(1, "a", raw(b"one"))])
    await broker.store.commit(
        [
            SetMessageBody(1, raw(b"one, annotated")),
            PutMessage(2, "a", raw(b"two")),
            SetMessageBody(2, raw(b"two, annotated")),
            SetDeliveryCount(2, 3),
        ]
    )
    await broker.restart()  # recovered (by the queue manager, which takes them) and kept
    assert broker.store.recovered.message_count == 2
    await broker.stop()
    assert stored_messages(tmp_path) == [
        (1, "a", raw(b"one, annotated"), 0, None),
        (2, "a", raw(b"two, annotated"), 3, None),
    ]


async def test_checkpoints_keep_the_wal_short_and_lose_nothing(broker, tmp_path):
    """SQLite's automatic checkpoint, which runs inside a commit, is
    off in the store process; a thread of it checkpoints beside the commits, and the
    committing thread catches up on the last frames once the WAL holds 1000, so that the WAL
    starts over. Under an uninterrupted stream of 6000 single-page commits (which a
    checkpointing thread alone never catches up with: the WAL grew to 57 MB) it stays near
    1000 frames, and everything committed is recovered. The file keeps its length when the
    WAL starts over (commits overwrite frames in place instead of growing it anew)."""
    store, frame = broker.store, 16384 + 24
    for n in range(1, 6001):  # one transaction each: one WAL frame or more each
        await store.commit([PutMessage(n, "q", raw(b"x" * 100))] + ([DeleteMessage(n - 1)] if n % 2 == 0 else []))
    wal = tmp_path / "store" / "r1.sqlite-wal"
    # Without the catch-up the WAL would hold every frame of the 6000 commits (3474 frames
    # for 3000 of them, measured). With it, it starts over near 1000 frames; on a loaded machine a little later
    # (the committer's catch-up is skipped while the thread's own checkpoint still copies),
    # and the file keeps the longest length it reached.
    assert 1000 * frame < wal.stat().st_size < 3000 * frame
    await broker.restart()
    assert broker.store.recovered.message_count == 3000
    await broker.stop()
    assert [row[0] for row in stored_messages(tmp_path)] == list(range(2, 6001, 2))


async def test_stored_bodies_are_read_back(broker, tmp_path):
    """The store's read request. A read returns the bodies of the stored
    messages among the ids asked, as stored, and leaves out what was never stored or was
    deleted; it sees every commit acknowledged before it, is served between group commits
    while commits go on (reads and commits from concurrent tasks all get their answers),
    and changes nothing (the same messages are recovered after a restart)."""
    store = broker.store
    bodies = {n: raw(bytes([n % 256]) * (n * 37 % 3000) + b"end") for n in range(1, 401)}
    await store.commit([PutMessage(n, "q", body) for n, body in bodies.items()])
    await store.commit([DeleteMessage(n) for n in range(1, 401, 4)])
    alive = {n: body for n, body in bodies.items() if n % 4 != 1}
    assert await store.read_messages([]) == {}
    assert await store.read_messages([400, 1, 2, 9999]) == {400: bodies[400], 2: bodies[2]}
    answers = {}

    async def read(start):
        answers[start] = await store.read_messages(range(start, start + 100))

    async with trio.open_nursery() as nursery:
        for n in range(401, 601):
            nursery.start_soon(store.commit, [PutMessage(n, "r", raw(b"later"))])
        for start in range(1, 401, 100):
            nursery.start_soon(read, start)
    for start, answer in answers.items():
        assert answer == {n: body for n, body in alive.items() if start <= n < start + 100}
    assert await store.read_messages(range(1, 601)) == alive | {n: raw(b"later") for n in range(401, 601)}
    await broker.restart()
    store = broker.store
    await broker.stop()
    assert {row[0]: row[2] for row in stored_messages(tmp_path)} == alive | {n: raw(b"later") for n in range(401, 601)}
    with pytest.raises(StoreError, match="not running"):
        await store.read_messages([2])


def test_the_store_process_imports_neither_the_kernel_nor_its_swiftlets_package(tmp_path):
    """A router starts a store process at every start: the process runs its own module as a
    script, which needs SQLite, msgpack and the message head, not the kernel and the
    swiftlets it would bring (0.4 s of CPU against 0.05 s). Python lists each import it
    makes (``PYTHONPROFILEIMPORTTIME``) of a real store process that opens a database."""
    import subprocess

    result = subprocess.run(
        store_process_command(tmp_path / "s.sqlite", "normal", True),
        input=b"",  # no requests: it recovers the new database and exits
        capture_output=True,
        env=os.environ | {"PYTHONPROFILEIMPORTTIME": "1"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.decode().splitlines() if "|" in line}
    assert {"sqlite3", "msgpack", "martinet.messaging.message"} <= imported
    assert not {name for name in imported if name.startswith(("martinet.kernel", "martinet.swiftlets", "trio"))}


def test_the_store_process_applies_nothing_after_a_failed_commit(tmp_path):
    """The router sends the next batch before the answer to the last one (two in the store
    process's hands): once one fails, the batches behind it must not be applied, so that
    nothing committed follows a failed batch. Spoken to a real store process over its pipes."""
    import subprocess

    from martinet.swiftlets.store.batches import encode_ops
    from martinet.swiftlets.store.dbprocess import LENGTH, pack_frame, unpack_frame

    path = tmp_path / "s.sqlite"
    process = subprocess.Popen(
        store_process_command(path, "full", False), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )

    def reply() -> list:
        size = LENGTH.unpack(process.stdout.read(4))[0]
        return unpack_frame(process.stdout.read(size))

    try:
        while reply()[0] != "ready":  # the (empty) recovery
            pass
        process.stdin.write(
            pack_frame(["commit", encode_ops([PutMessage(1, "q", b"first")])])
            + pack_frame(["commit", encode_ops([PutMessage(1, "q", b"same id")])])
            + pack_frame(["commit", encode_ops([PutMessage(2, "q", b"behind it")])])
        )
        process.stdin.flush()
        answers = [reply() for _ in range(3)]
    finally:
        process.stdin.close()
        process.wait(30)
        process.stdout.close()
    assert answers[0] == ["done", 0]
    assert answers[1][0] == "error" and "UNIQUE constraint failed" in answers[1][1]
    assert answers[2] == ["error", f"an earlier commit failed: {answers[1][1]}"]
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT id, body FROM messages").fetchall() == [(1, b"first")]
    finally:
        db.close()


async def test_producers_get_an_error_not_a_traceback_when_the_store_process_dies(tmp_path, caplog):
    """Persistent sends racing the store process's death are refused (or their connection
    closes as the router stops): none of them may end in a traceback from the listener."""
    path = tmp_path / "router.xml"
    path.write_text(amqp_router_xml(tmp_path))
    router = Router.from_file(path)
    sent = 0

    async def produce(url: str) -> None:
        nonlocal sent
        try:
            async with connect(url) as connection, connection.session() as session:
                producer = await session.producer(Queue("q"))
                while True:
                    await producer.send(TextMessage("x" * 100))
                    sent += 1
        except (JMSError, OSError):
            pass  # refused, or the router went away: what a client should see

    with trio.fail_after(60), pytest.RaisesGroup(pytest.RaisesExc(SwiftletFailed, match="sys\\$store")):
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            url = f"amqp://127.0.0.1:{router.management.get('/sys$jms/usage/listeners/amqp', 'port')}"
            for _ in range(20):
                nursery.start_soon(produce, url)
            while sent < 500:
                await trio.sleep(0.005)
            os.kill(store_engine_pid(os.getpid()), signal.SIGKILL)
    tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("martinet.swiftlets.jms")]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
