"""The live source's acknowledgements, without Spark: ``commit(end)`` acknowledges only the
oldest messages whose rows are all within ``end``. A message of a batch Spark has not
committed stays unacknowledged, so that a crash before that commit brings it back."""

from __future__ import annotations

from martinet.pipeline.source import _Reader


class Session:
    """Records what the reader acknowledges (``Session.acknowledge(count)``)."""

    def __init__(self) -> None:
        self.acknowledged: list[int] = []

    def acknowledge(self, count: int) -> None:
        self.acknowledged.append(count)


def offset(**marks: tuple[int, int]) -> dict:
    return {"routers": {router: {"epoch": epoch, "seq": seq} for router, (epoch, seq) in sorted(marks.items())}}


def test_commit_acknowledges_only_the_messages_whose_rows_spark_committed(tmp_path):
    reader = _Reader({"url": "amqp://127.0.0.1:1", "replay-folder": str(tmp_path)})
    session = Session()
    reader._connection, reader._subscriber, reader._session = object(), None, session  # (connected)
    reader._pending = [  # (per router the highest (epoch, seq) of the message's rows, its rows)
        ({"a": (1, 1)}, []),
        ({"a": (1, 2), "b": (5, 1)}, []),
        ({}, []),  # not a metrics batch: acknowledged with its neighbours
        ({"b": (5, 2)}, []),
    ]
    reader.commit(offset(a=(1, 1), b=(5, 0)))  # the second message has a row beyond the commit
    assert session.acknowledged == [1] and len(reader._pending) == 3
    reader.commit(offset(a=(1, 1), b=(5, 1)))  # a (1, 2) is not committed yet
    assert session.acknowledged == [1] and len(reader._pending) == 3
    reader.commit(offset(a=(1, 2), b=(5, 1)))
    assert session.acknowledged == [1, 2] and reader._pending == [({"b": (5, 2)}, [])]
    reader.commit(offset(a=(1, 2), b=(5, 2)))
    assert session.acknowledged == [1, 2, 1] and reader._pending == []


def test_a_batch_without_rows_of_its_table_is_kept_for_its_replay(tmp_path):
    """A batch whose messages hold only rows of the other table (events, for a query of rows)
    still moves the offset, so Spark may replay it after a restart, in another process: it is
    kept for that like any other batch (else the restarted query could not go on)."""
    options = {"url": "amqp://127.0.0.1:1", "replay-folder": str(tmp_path)}
    reader = _Reader(options)
    reader._available_now = True  # read what is pending, receive nothing more
    reader._pending = [({"a": (1, 1)}, [])]  # its rows are all events
    start = reader.initialOffset()
    rows, end = reader.read(start)
    assert list(rows) == [] and end == offset(a=(1, 1))
    assert list(_Reader(options).readBetweenOffsets(start, end)) == []


def test_a_batch_of_nothing_is_kept_for_its_replay_too(tmp_path):
    """The first run on an empty subscription: Spark logs a batch that ends where it starts
    (nothing arrived) and, restarted, replays it; with no file for it the pipeline failed
    with 'cannot replay the batch up to {'routers': {}}' on every later run on that output."""
    options = {"url": "amqp://127.0.0.1:1", "replay-folder": str(tmp_path)}
    reader = _Reader(options)
    reader._available_now = True  # nothing pending, nothing more to receive
    start = reader.initialOffset()
    rows, end = reader.read(start)
    assert list(rows) == [] and end == start
    assert list(_Reader(options).readBetweenOffsets(start, end)) == []
