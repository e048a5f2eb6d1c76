"""``spark.readStream.format("martinet")``: the metrics topic of a router as a Spark stream.

A Spark 4 Python data source (:class:`MartinetSource`, register it with
``spark.dataSource.register(MartinetSource)``; :func:`martinet.pipeline.jobs.session` does).
Options: ``url`` (``amqp://host:port``, required), ``replay-folder`` (required, see below),
``topic`` (``martinet.metrics``), ``table`` (``rows`` or ``events``), ``client-id`` and
``subscription`` (the durable subscription; default ``spark-<table>``: one per query that
reads the topic; ``martinet-pipeline --drop`` deletes the default ones), ``partitions`` (how
many Spark partitions, so tasks read in parallel, each micro-batch is split into; default 1,
``martinet-pipeline --partitions`` defaults to the cluster's parallelism), ``wait`` (seconds
a micro-batch waits for the first message, default 0.5) and ``max-messages`` per micro-batch
(default 500).

Who does what
-------------
The reader is a partitioned :class:`DataSourceStreamReader`. Its driver side (one long-lived
Python process next to Spark's driver) holds the query's durable subscription in a
CLIENT_ACKNOWLEDGE session: ``latestOffset`` receives the messages, takes each one's router and
highest ``(epoch, seq)`` from its application properties (``router``, ``epoch``, ``seq``: the
export sets them; a message without them is decoded here instead) without decoding its body,
and stores the batch's raw bodies in ``replay-folder`` as ``partitions`` files of about equal
size (:mod:`.replay`). ``partitions`` hands Spark one partition per file; ``read`` runs in
executors' Python workers, each decoding its file's JSON into rows, in parallel. Decoding,
row conversion and the hand-over to the JVM — most of the cost of a row — run on as many
cores as there are partitions; receiving stays in one process on the driver (in
``bench/live_source_bench.py``, a million rows in 500 messages: 3-7 s of a query's time outside
its tasks, the query's start included, against 13-26 s in its tasks).

Why not a subscription per partition, received in the executors: acknowledging must wait
until Spark has committed the batch, after its tasks ended, and an executor's Python worker
is short-lived and may be another process (or host) for every batch; a message received there
could only be acknowledged on the same connection, by the same process. And Spark asks for a
batch's end offset (``latestOffset``) on the driver before any task runs, so the driver must
know what arrived. One subscription also keeps ``--partitions`` free to change between runs
(a removed shard's subscription would keep its messages) and ``--drop`` as it was.

Exactly once
------------
Every row carries its router's ``(epoch, seq)``, increasing in the order the router made them,
and a router's messages arrive in order. The **offset** is, per router, the highest ``(epoch,
seq)`` a batch includes; the batch ``(start, end]`` is the rows with ``start < key <= end``, per
router, whichever message or file holds them. So:

- ``latestOffset(start)`` returns ``end``, ``start`` raised by the messages received so far,
  only after the batch's files are in the replay folder (complete or not at all): Spark logs
  ``end`` next, and may replay the batch from the files alone, in another process;
- ``read`` keeps of its file's rows those in ``(start, end]``, so a message received twice
  (redelivered after a restart: it was not acknowledged) adds nothing a batch had;
- ``commit(end)`` acknowledges only the oldest messages whose rows are all within ``end``
  (``Session.acknowledge(count)``): Spark asks for the next batch *before* it commits the
  previous one, so messages of an uncommitted batch stay unacknowledged; then it deletes the
  files of the committed batches.

A killed query: Spark replays its logged, uncommitted batch from the files; the unacknowledged
messages come again to the new reader, whose start already covers the replayed rows. A killed
executor (its Python worker or its JVM): the batch's task fails; Spark runs it again (or, with
no retries left, the query fails and a restart replays it), reading the same file; the sink
commits a batch's output only once every task of it succeeded. A restarted router: the
subscription and its unacknowledged messages are persistent; the reader notices the lost
connection, forgets what it received (it will come again), and connects anew at the next
micro-batch (until then, batches are empty); the router's new epoch orders after its old one.
Nothing is lost (a message is acknowledged only after Spark committed every row of it) and
nothing is counted twice (the offsets filter by key).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from martinet.messaging.client import ConnectionLost
from martinet.swiftlets.spark.api import decode_batch

from .drop import subscription
from .replay import NOTHING, Key, Marks, batch_parts, bodies, delete_committed, legacy_rows, marks, offset, write_batch
from .schema import spark_schema

__all__ = ["MartinetSource", "BatchPart"]

GAP = 0.05  # seconds without a message that end a micro-batch's receive


class MartinetSource(DataSource):
    """The ``martinet`` format."""

    @classmethod
    def name(cls) -> str:
        return "martinet"

    def schema(self) -> StructType:
        return spark_schema(self.options.get("table", "rows"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _Reader(self.options)


@dataclass(frozen=True)
class BatchPart(InputPartition):
    """One Spark partition of a batch: a part file and the batch's bounds."""

    path: str
    table: str
    start: Marks
    end: Marks


@dataclass
class _Received:
    marks: Marks  # per router the highest key of the message's rows and events ({}: not a batch)
    body: bytes


def _message_marks(message: Any) -> Marks:
    """A message's router and highest key, from its properties, else from its body."""
    properties = message.properties
    router, epoch, seq = properties.get("router"), properties.get("epoch"), properties.get("seq")
    if isinstance(router, str) and isinstance(epoch, int) and isinstance(seq, int):
        return {router: (epoch, seq)}
    try:  # an export without the properties
        rows, events = decode_batch(bytes(message.body))
    except ValueError:  # not a metrics batch: skipped, acknowledged with its neighbours
        return {}
    found: Marks = {}
    for row in rows + events:  # column 0 the router, the last two epoch and seq
        found[row[0]] = max(found.get(row[0], NOTHING), (row[-2], row[-1]))
    return found


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]):
        self.table = options.get("table", "rows")
        if self.table not in ("rows", "events"):
            raise ValueError(f"martinet source: option table={self.table!r}: use rows or events")
        if "url" not in options:
            raise ValueError("martinet source: option url (amqp://host:port of a router) is required")
        if "replay-folder" not in options:
            raise ValueError("martinet source: option replay-folder (a folder kept with the checkpoint) is required")
        self.url = options["url"]
        self.replay = Path(options["replay-folder"])
        self.topic = options.get("topic", "martinet.metrics")
        client_id, name = subscription(self.table)  # what --drop deletes
        self.client_id = options.get("client-id", client_id)
        self.subscription = options.get("subscription", name)
        self.partitions_wanted = _positive(options, "partitions", "1")
        self.wait = float(options.get("wait", "0.5"))
        self.max_messages = _positive(options, "max-messages", "500")
        # The driver side's state (the reader is pickled to the executors before it connects).
        self._connection: Any = None
        self._connected_once = False
        self._pending: list[_Received] = []  # unacknowledged messages, in order
        self._available_now = False

    # -- the subscription (driver side) -----------------------------------------------------------

    def _consumer(self) -> Any:
        if self._connection is None:
            from martinet.messaging.client import AckMode, Topic
            from martinet.messaging.client.blocking import BlockingConnection

            self._connection = BlockingConnection(self.url, client_id=self.client_id)
            self._session = self._connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
            self._subscriber = self._session.durable_subscriber(Topic(self.topic), self.subscription)
            self._connected_once = True
        return self._subscriber

    def _lost(self) -> None:
        """The connection went (the router stopped): what was received and not acknowledged
        stays in the subscription and comes again to the next connection."""
        connection, self._connection = self._connection, None
        self._pending.clear()
        if connection is not None:
            try:
                connection.close()
            except (ConnectionLost, OSError, trio.RunFinishedError):
                pass

    def _receive(self, wait: float, *, gap: float = GAP, until: float = math.inf) -> bool:
        """Take what the subscription has, at most ``max-messages``: wait up to ``wait`` s for
        the first message, then take messages while the next one comes within ``gap`` s (the
        client's prefetch holds only part of a backlog), up to the first one sent at ``until``
        (ms since the epoch) or later. Returns whether it stopped at ``max-messages`` (more may
        be waiting). While the router cannot be reached it takes nothing (once it could: a
        first connection that fails fails the query with the cause)."""
        try:
            consumer = self._consumer()
            for count in range(self.max_messages):
                message = consumer.receive(timeout=wait if count == 0 else gap)
                if message is None:
                    return False
                self._pending.append(_Received(_message_marks(message), bytes(message.body)))
                if message.timestamp >= until:
                    return False
        except (ConnectionLost, OSError, trio.RunFinishedError):
            if not self._connected_once:
                raise
            self._lost()
            return False
        return True

    # -- DataSourceStreamReader, driver side ------------------------------------------------------

    def initialOffset(self) -> dict:
        return {"routers": {}}

    def prepareForTriggerAvailableNow(self) -> None:
        """``availableNow``: take everything the subscription holds now: every message sent
        before now (a pause of ``wait`` ends it too: a router under load may send a backlog
        with pauses longer than a micro-batch's :data:`GAP`); batches then hold only that."""
        now = time.time() * 1000
        while self._receive(self.wait, gap=self.wait, until=now):
            pass  # more may be waiting
        self._available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if not self._available_now:
            self._receive(self.wait)
        bounds = marks(start)
        fresh = [m for m in self._pending if any(key > bounds.get(r, NOTHING) for r, key in m.marks.items())]
        if not fresh:
            return start  # nothing new: Spark runs no batch
        reached = dict(bounds)
        for message in fresh:
            for router, key in message.marks.items():
                reached[router] = max(reached.get(router, NOTHING), key)
        end = offset(reached)
        # stored before Spark logs end: from then on it may replay the batch, in another process
        write_batch(self.replay, start, end, self._split(fresh))
        return end

    def _split(self, messages: list[_Received]) -> list[list[bytes]]:
        """The bodies in ``partitions`` parts of about equal size (the largest first, each to
        the smallest part), none empty."""
        count = min(self.partitions_wanted, len(messages))
        parts: list[list[bytes]] = [[] for _ in range(count)]
        sizes = [0] * count
        for message in sorted(messages, key=lambda m: len(m.body), reverse=True):
            smallest = sizes.index(min(sizes))
            parts[smallest].append(message.body)
            sizes[smallest] += len(message.body)
        return parts

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        bounds, reached = marks(start), marks(end)
        if bounds == reached:
            return []  # the first batch of an empty subscription: nothing to read
        return [BatchPart(str(path), self.table, bounds, reached) for path in batch_parts(self.replay, start, end)]

    def commit(self, end: dict) -> None:
        committed = marks(end)
        done = 0
        for message in self._pending:
            if any(key > committed.get(router, NOTHING) for router, key in message.marks.items()):
                break
            done += 1
        if done:
            try:
                self._consumer()
                self._session.acknowledge(done)
                del self._pending[:done]
            except (ConnectionLost, OSError, trio.RunFinishedError):
                self._lost()  # not acknowledged: they come again, at or below a committed offset
        delete_committed(self.replay, end)

    def stop(self) -> None:
        if self._connection is not None:
            self._lost()

    # -- DataSourceStreamReader, executor side ----------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, BatchPart)
        return _rows(partition)


def _rows(part: BatchPart) -> Iterator[tuple]:
    """The rows of a part file within its batch's bounds."""
    if part.path.endswith(".json"):  # a batch kept before the source was partitioned
        for plain in legacy_rows(Path(part.path)):
            yield (plain[0], datetime.fromtimestamp(plain[1] / 1000, UTC), *plain[2:])
        return
    for body in bodies(Path(part.path)):
        try:
            rows, events = decode_batch(body)
        except ValueError:  # not a metrics batch (it had the properties of one): skipped
            continue
        for row in rows if part.table == "rows" else events:
            key: Key = (row[-2], row[-1])
            if part.start.get(row[0], NOTHING) < key <= part.end.get(row[0], NOTHING):
                yield (row[0], datetime.fromtimestamp(row[1] / 1000, UTC), *row[2:])


def _positive(options: Mapping[str, str], name: str, default: str) -> int:
    text = options.get(name, default)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"martinet source: option {name}={text!r}: use a whole number of at least 1")
    return value
