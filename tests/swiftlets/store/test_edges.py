"""sys$store edge cases that used to lose data silently and the hand-over
of recovered messages (item 7e): real SQLite files, real store processes."""

from __future__ import annotations

import gc
import logging
import os
import shutil

import pytest
import trio

from martinet.kernel import Router, SwiftletFailed
from martinet.messaging.message import build
from martinet.swiftlets.store.api import PutMessage, StoredMessage, StoreError
from martinet.swiftlets.store.dbprocess import Database

from tests.harness.routers import RunningRouter


def body(size: int = 1) -> bytes:
    """A stored message as the queue manager stores it (a durable AMQP message)."""
    return build(os.urandom(size), durable=True).raw


def accept_empty(running: RunningRouter) -> None:
    text = running.path.read_text()
    running.path.write_text(text.replace('sync="normal"', 'sync="normal" accept-empty-store="true"'))


async def test_a_store_truncated_to_zero_bytes_is_refused_unless_accepted(make_broker, tmp_path, caplog):
    running = make_broker()
    await running.start()
    await running.store.commit([PutMessage(n, "q", b"x") for n in range(1, 101)])
    await running.stop()
    database = tmp_path / "store" / "r1.sqlite"
    assert (tmp_path / "store" / "r1.sqlite.store-id").exists()
    database.write_bytes(b"")  # someone truncated it
    with pytest.raises(
        SwiftletFailed,
        match=r"r1.sqlite: the store existed \(its marker r1.sqlite.store-id says "
        r"so\) but the database is empty or missing — refusing to start",
    ):
        await refused_run(running.path)
    # one ERROR line that says it all, no traceback (StoreError is a kernel ExplainedError)
    refusals = [r for r in caplog.records if r.levelname == "ERROR" and "refusing to start" in r.getMessage()]
    assert len(refusals) == 1 and not [r for r in caplog.records if r.exc_info], caplog.text
    database.unlink()  # or deleted it: the same
    with pytest.raises(SwiftletFailed, match="the database is empty or missing"):
        await refused_run(running.path)
    accept_empty(running)
    with caplog.at_level("ERROR", logger="martinet.swiftlets.store"):
        await running.start()
    assert any("the database is empty or missing — accepted (accept-empty-store)" in m for m in caplog.messages)
    assert running.store.recovered.message_count == 0
    await running.stop()


async def test_a_new_store_starts_empty_without_a_word(make_broker, tmp_path, caplog):
    running = make_broker()
    with caplog.at_level("ERROR"):
        await running.start()
    await running.stop()
    await running.start()  # and restarts: the marker matches
    await running.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_another_database_in_place_of_the_store_is_refused(make_broker, nursery, tmp_path):
    running = make_broker()
    await running.start()
    await running.stop()
    (tmp_path / "other").mkdir()
    other = RunningRouter(nursery, tmp_path / "other")
    await other.start()
    await other.stop()
    shutil.copy(tmp_path / "other" / "store" / "r1.sqlite", tmp_path / "store" / "r1.sqlite")
    with pytest.raises(SwiftletFailed, match="but the database is another store's"):
        await refused_run(running.path)


async def refused_run(path) -> None:
    """Run the router of ``path``, which must refuse to start (bounded: a start that is not
    refused fails the test instead of running on)."""
    with trio.fail_after(30):
        await Router.from_file(path).run()
    raise AssertionError("the router ran and stopped")


def frames(wal: bytes) -> int:
    page_size = int.from_bytes(wal[8:12], "big")
    return (len(wal) - 32) // (page_size + 24)


async def test_a_damaged_wal_is_refused_with_counts_unless_accepted(make_broker, nursery, tmp_path, caplog):
    running = make_broker()
    await running.start()
    for batch in range(20):
        await running.store.commit([PutMessage(batch * 100 + n, "q", os.urandom(200)) for n in range(1, 101)])
    # What both processes leave when killed: the database and its WAL as they are on disk now.
    copy = tmp_path / "copy"
    (copy / "store").mkdir(parents=True)
    for name in ("r1.sqlite", "r1.sqlite-wal", "r1.sqlite.store-id"):
        shutil.copy(tmp_path / "store" / name, copy / "store" / name)
    await running.stop()
    wal = bytearray((copy / "store" / "r1.sqlite-wal").read_bytes())
    page_size = int.from_bytes(wal[8:12], "big")
    total = frames(bytes(wal))
    assert total >= 20
    damaged = total // 2
    offset = 32 + damaged * (page_size + 24) + 24 + 1000
    wal[offset : offset + 8] = bytes(8) if wal[offset : offset + 8] != bytes(8) else b"\xff" * 8
    (copy / "store" / "r1.sqlite-wal").write_bytes(bytes(wal))
    saved = {name: (copy / "store" / name).read_bytes() for name in ("r1.sqlite", "r1.sqlite-wal")}
    crashed = RunningRouter(nursery, copy)
    with pytest.raises(
        SwiftletFailed,
        match=rf"the WAL is damaged: frame {damaged + 1} of {total} fails its "
        rf"checksum; recovery drops {total - damaged} frame\(s\) from there, with [1-9]\d* committed "
        r"transaction\(s\) — refusing to start",
    ):
        await refused_run(crashed.path)
    for name, data in saved.items():  # a refused start changed nothing: it can be retried as it was
        (copy / "store" / name).write_bytes(data)
    accept_empty(crashed)
    with caplog.at_level("ERROR", logger="martinet.swiftlets.store"):
        await crashed.start()
    assert any("the WAL is damaged" in m and "accepted (accept-empty-store)" in m for m in caplog.messages)
    assert 0 < crashed.store.recovered.message_count < 2000
    await crashed.stop()


async def test_a_wal_with_an_interrupted_transaction_only_is_accepted(make_broker, nursery, tmp_path, caplog):
    running = make_broker()
    await running.start()
    await running.store.commit([PutMessage(n, "q", body(100)) for n in range(1, 51)])
    copy = tmp_path / "copy"
    (copy / "store").mkdir(parents=True)
    for name in ("r1.sqlite", "r1.sqlite-wal", "r1.sqlite.store-id"):
        shutil.copy(tmp_path / "store" / name, copy / "store" / name)
    await running.stop()
    wal = (copy / "store" / "r1.sqlite-wal").read_bytes()
    page_size = int.from_bytes(wal[8:12], "big")
    frame = wal[32 : 32 + 24 + page_size]
    # A torn last frame of a transaction that never committed (commit size 0, bad checksum).
    torn = frame[:4] + bytes(4) + frame[8:24] + bytes(page_size)
    (copy / "store" / "r1.sqlite-wal").write_bytes(wal + torn)
    crashed = RunningRouter(nursery, copy)
    with caplog.at_level("ERROR"):
        await crashed.start()
    assert crashed.store.recovered.message_count == 50
    await crashed.stop()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_disk_full_is_reported_as_disk_full(tmp_path):
    """The in-process stand-in for a full disk (``max_page_count``), for machines where the
    tmpfs tests (tests/swiftlets/store/test_disk_full.py) are skipped. SQLite only rolls the statement back
    here, so this one does not reproduce a cause masked by a failed rollback; those do."""
    database = Database(str(tmp_path / "r1.sqlite"), "normal")
    pages = database.db.execute("PRAGMA page_count").fetchone()[0]
    database.db.execute(f"PRAGMA max_page_count = {pages + 4}")
    with pytest.raises(Exception, match="database or disk is full"):
        database.apply([[1, n, "q", os.urandom(1000), 0, None] for n in range(1, 500)])
    database.apply([[1, 1, "q", b"x", 0, None]])  # the store still works after the failure
    database.close()


async def test_recovered_messages_are_handed_over_and_not_kept(make_broker, tmp_path):
    running = make_broker()
    await running.start()
    await running.store.commit([PutMessage(n, "q", body()) for n in range(1, 11)])
    await running.stop()
    await running.start()
    store = running.store
    assert store.recovered.message_count == 10
    with pytest.raises(StoreError, match="the recovered messages were taken already"):
        store.take_recovered_messages()  # the queue manager took them
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, StoredMessage)]  # and nobody keeps them
    await running.stop()
