"""sys$store: group commit, recovery, dropped insert/delete pairs, bad files, failures."""

from __future__ import annotations

import sqlite3

import pytest
import trio

from martinet.kernel import Router, SwiftletFailed
from martinet.swiftlets.store.api import (
    DeleteMessage,
    DeleteRecord,
    PutMessage,
    PutRecord,
    RememberId,
    SetDeliveryCount,
    SetTransaction,
    StoreError,
)


def usage(router) -> dict:
    return router.management.resolve("/sys$store/usage").properties()


def stored_messages(tmp_path) -> list[tuple]:
    """The messages in the (stopped) broker's database, read with sqlite3 itself."""
    db = sqlite3.connect(tmp_path / "store" / "r1.sqlite")
    try:
        return db.execute("SELECT id, queue, body, delivery_count, txid FROM messages ORDER BY id").fetchall()
    finally:
        db.close()


async def test_everything_committed_is_recovered(broker, tmp_path):
    store = broker.store
    await store.commit([PutMessage(1, "a", b"one"), PutMessage(2, "b", b"two", 0, "xid-1"),
                        PutMessage(3, "a", b"three"), PutRecord("durable", "c1$s", b"record"),
                        PutRecord("xa", "xid-1", b"{}"), RememberId("a", "m-1", 10), RememberId("a", "m-2", 10)])
    await store.commit([DeleteMessage(3), SetDeliveryCount(1, 4), SetTransaction(2, None),
                        DeleteRecord("xa", "xid-1")])
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


async def test_a_file_that_is_not_a_store_is_refused(make_broker, tmp_path):
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    (store_dir / "r1.sqlite").write_bytes(b"this is not a database" * 100)
    running = make_broker()
    with pytest.raises(SwiftletFailed, match="swiftlet sys\\$store failed to start: StoreError: .*r1.sqlite: "
                       "not a usable Martinet store: file is not a database"):
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
        nursery, write_config, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    router = Router.from_file(write_config('<router name="r1" startorder="sys$store">'
                                           '<swiftlet name="sys$store" path="data" sync="off"/></router>'))
    with caplog.at_level("INFO", logger="martinet.swiftlets.store"):
        await nursery.start(router.run)
    database = tmp_path / "data" / "r1.sqlite"
    assert database.exists() and usage(router)["path"] == str(database)
    assert f"store {database} opened: 0 messages, 0 records" in caplog.messages
    router.request_stop()
