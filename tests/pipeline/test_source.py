"""The live source without Spark: its acknowledgements (``commit(end)`` acknowledges only the
oldest messages whose rows are all within ``end``: a message of a batch Spark has not
committed stays unacknowledged, so that a crash before that commit brings it back), and its
batches (stored in the replay folder by the driver side, split into parts that executors read
each on its own, in another process: together exactly the rows of the batch)."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from martinet.messaging.client import BytesMessage
from martinet.pipeline.source import BatchPart, _message_marks, _Reader, _Received
from martinet.swiftlets.spark.api import encode_batch


class Session:
    """Records what the reader acknowledges (``Session.acknowledge(count)``)."""

    def __init__(self) -> None:
        self.acknowledged: list[int] = []

    def acknowledge(self, count: int) -> None:
        self.acknowledged.append(count)


def offset(**marks: tuple[int, int]) -> dict:
    return {"routers": {router: {"epoch": epoch, "seq": seq} for router, (epoch, seq) in sorted(marks.items())}}


def message(router: str, epoch: int, seqs: range, events: range = range(0)) -> _Received:
    """A received metrics message of ``router`` with a row per seq of ``seqs`` and an event per
    seq of ``events``."""
    rows = [(1_000 + seq, "sys$store", "", "bytes", float(seq), None, seq) for seq in seqs]
    made = [(1_000 + seq, "sys$routing", "RouteAdded", "b", "{}", seq) for seq in events]
    body = encode_batch(router, epoch, rows, made)
    return _Received({router: (epoch, max([*seqs, *events]))}, body)


def reader(tmp_path, **options: str) -> _Reader:
    return _Reader({"url": "amqp://127.0.0.1:1", "replay-folder": str(tmp_path / "replay"), **options})


def read_all(tmp_path, parts: list) -> list[tuple[str, int, int]]:
    """What executors would read: each part through a reader pickled as Spark sends it."""
    keys = []
    for part in parts:
        executor = pickle.loads(pickle.dumps(reader(tmp_path)))
        keys += [(row[0], row[-2], row[-1]) for row in executor.read(pickle.loads(pickle.dumps(part)))]
    return keys


def test_commit_acknowledges_only_the_messages_whose_rows_spark_committed(tmp_path):
    source = reader(tmp_path)
    session = Session()
    source._connection, source._subscriber, source._session = object(), None, session  # (connected)
    source._pending = [  # (per router the highest (epoch, seq) of the message's rows, its body)
        _Received({"a": (1, 1)}, b""),
        _Received({"a": (1, 2), "b": (5, 1)}, b""),
        _Received({}, b""),  # not a metrics batch: acknowledged with its neighbours
        _Received({"b": (5, 2)}, b""),
    ]
    source.commit(offset(a=(1, 1), b=(5, 0)))  # the second message has a row beyond the commit
    assert session.acknowledged == [1] and len(source._pending) == 3
    source.commit(offset(a=(1, 1), b=(5, 1)))  # a (1, 2) is not committed yet
    assert session.acknowledged == [1] and len(source._pending) == 3
    source.commit(offset(a=(1, 2), b=(5, 1)))
    assert session.acknowledged == [1, 2] and source._pending == [_Received({"b": (5, 2)}, b"")]
    source.commit(offset(a=(1, 2), b=(5, 2)))
    assert session.acknowledged == [1, 2, 1] and source._pending == []


def test_a_batch_split_in_parts_is_read_by_executors_exactly_once_and_replayed_without_its_reader(tmp_path):
    """Three parts of about equal size, read each in a reader of its own (as executors do),
    give exactly the rows of ``(start, end]``: rows of a redelivered message at or below
    ``start`` are left out, and a later reader (a restarted query) plans the same parts from
    the replay folder alone. The commit of the batch deletes its files."""
    driver = reader(tmp_path, partitions="3")
    driver._available_now = True  # read what is pending, receive nothing more
    driver._pending = [
        message("a", 7, range(1, 5)),  # redelivered: a (7, 4) was in the previous batch
        message("a", 7, range(5, 9)),
        message("b", 2, range(1, 3), events=range(3, 4)),  # b's highest key is an event's
        message("a", 8, range(1, 4)),  # a restarted: a new epoch
        _Received({}, b"not json"),  # not a metrics batch, never in a part
    ]
    start = offset(a=(7, 4))
    end = driver.latestOffset(start, ReadAllAvailable())
    assert end == offset(a=(8, 3), b=(2, 3))
    parts = driver.partitions(start, end)
    assert len(parts) == 3 and all(isinstance(part, BatchPart) for part in parts)
    expected = [("a", 7, seq) for seq in range(5, 9)] + [("b", 2, 1), ("b", 2, 2)] + [("a", 8, s) for s in range(1, 4)]
    assert sorted(read_all(tmp_path, parts)) == sorted(expected)
    assert reader(tmp_path).partitions(start, end) == parts  # a restarted query replays it
    assert driver.latestOffset(end, ReadAllAvailable()) == end  # nothing new: no batch

    driver._connection, driver._subscriber, driver._session = object(), None, Session()
    driver.commit(end)
    assert list((tmp_path / "replay").iterdir()) == [] and driver._pending == []


def test_a_batch_without_rows_of_its_table_is_kept_for_its_replay(tmp_path):
    """A batch whose messages hold only rows of the other table (events, for a query of rows)
    still moves the offset, so Spark may replay it after a restart, in another process: it is
    kept for that like any other batch (else the restarted query could not go on)."""
    source = reader(tmp_path, partitions="2")
    source._available_now = True
    source._pending = [message("a", 1, range(0), events=range(1, 2))]  # its rows are all events
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())
    assert end == offset(a=(1, 1))
    assert read_all(tmp_path, reader(tmp_path).partitions(start, end)) == []


def test_a_batch_of_nothing_has_no_partitions(tmp_path):
    """The first run on an empty subscription: Spark may log a batch that ends where it starts
    (nothing arrived) and, restarted, plan it again: it has nothing to read, no file to find."""
    source = reader(tmp_path)
    source._available_now = True  # nothing pending, nothing more to receive
    start = source.initialOffset()
    assert source.latestOffset(start, ReadAllAvailable()) == start
    assert reader(tmp_path).partitions(start, start) == []


def test_the_driver_places_a_message_by_its_properties_or_else_by_its_body():
    body = encode_batch("a", 3, [(1_000, "sys$store", "", "bytes", 1.0, None, 9)], [])
    plain = BytesMessage(body)
    assert _message_marks(plain) == {"a": (3, 9)}
    plain.properties = {"router": "a", "epoch": 3, "seq": 12}  # the export's properties win
    assert _message_marks(plain) == {"a": (3, 12)}
    assert _message_marks(BytesMessage(b"not json")) == {}


@pytest.mark.parametrize("text", ["0", "two"])
def test_a_bad_partitions_option_is_one_clear_error(tmp_path, text):
    with pytest.raises(ValueError) as error:
        reader(tmp_path, partitions=text)
    assert str(error.value) == f"martinet source: option partitions={text!r}: use a whole number of at least 1"


def test_a_batch_kept_before_the_source_was_partitioned_is_replayed_and_deleted(tmp_path):
    """A checkpoint of the earlier, unpartitioned source may end with a logged batch kept as
    one file of rows (``<sha1 of [start, end]>.json``): the restarted query replays it as one
    partition, and its commit deletes it."""
    start, end = offset(a=(1, 2)), offset(a=(1, 4))
    folder = tmp_path / "replay"
    folder.mkdir()
    rows = [["a", 1_000, "sys$store", "", "bytes", 1.0, None, 1, seq] for seq in (3, 4)]
    name = hashlib.sha1(json.dumps([start, end]).encode()).hexdigest() + ".json"
    (folder / name).write_text(json.dumps({"end": end, "rows": rows}))
    source = reader(tmp_path)
    assert sorted(read_all(tmp_path, source.partitions(start, end))) == [("a", 1, 3), ("a", 1, 4)]
    source.commit(end)
    assert list(folder.iterdir()) == []
