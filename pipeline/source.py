"""``spark.readStream.format("martinet")``: the metrics topic of a router as a Spark stream.

A Spark 4 Python data source (:class:`MartinetSource`, register it with
``spark.dataSource.register(MartinetSource)``; :func:`martinet.pipeline.jobs.session` does).
Options: ``url`` (``amqp://host:port``, required), ``replay-folder`` (required, see below),
``topic`` (``martinet.metrics``), ``table`` (``rows`` or ``events``), ``client-id`` and
``subscription`` (the durable subscription; default ``spark-<table>``: one per query that
reads the topic; ``martinet-pipeline --drop`` deletes the default ones), ``wait`` (seconds a
read waits for the first message, default 0.5) and ``max-messages`` per micro-batch (default
500).

Exactly once across restarts
----------------------------
The reader (a :class:`SimpleDataSourceStreamReader`: it runs in one long-lived Python
process next to Spark's driver) holds a durable subscription in a CLIENT_ACKNOWLEDGE session.
Every row carries its router's ``(epoch, seq)``, increasing in the order the router made them,
and a router's messages arrive in order. The **offset** is, per router, the highest
``(epoch, seq)`` a batch includes. So:

- ``read(start)`` returns the rows received that lie beyond ``start``, and the new offset;
- ``commit(end)`` acknowledges only the oldest messages whose rows are all within ``end``
  (``Session.acknowledge(count)``): Spark asks for the next batch *before* it commits the
  previous one, so messages of an uncommitted batch stay unacknowledged;
- after a restart, Spark replays a logged but uncommitted batch with
  ``readBetweenOffsets(start, end)`` — in an executor's Python worker, another process, which
  cannot share the subscription (one consumer per durable subscription and client id). So
  ``read`` stores each batch's rows in ``replay-folder`` (required; the pipeline uses the
  checkpoint folder; on a cluster it must be shared like the checkpoint) before it returns its
  offset, atomically (hidden name, rename), and ``commit`` deletes the files of committed
  batches. The messages of the replayed batch, not acknowledged, come again to the new reader,
  which drops their rows (at or below its next start) and acknowledges them with the commit.

Nothing is lost (a message is acknowledged only after Spark committed every row of it) and
nothing is counted twice (the offsets filter by key).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from martinet.swiftlets.spark.api import decode_batch

from .drop import subscription
from .schema import spark_schema

__all__ = ["MartinetSource"]

Key = tuple[int, int]  # (epoch, seq)


def _key(offset: dict, router: str) -> Key:
    mark = offset.get("routers", {}).get(router)
    return (mark["epoch"], mark["seq"]) if mark else (-1, -1)


def _offset(marks: dict[str, Key]) -> dict:
    """Offsets compare as JSON text inside Spark: always sorted."""
    return {"routers": {router: {"epoch": marks[router][0], "seq": marks[router][1]} for router in sorted(marks)}}


class MartinetSource(DataSource):
    """The ``martinet`` format."""

    @classmethod
    def name(cls) -> str:
        return "martinet"

    def schema(self) -> StructType:
        return spark_schema(self.options.get("table", "rows"))

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return _Reader(self.options)


class _Reader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
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
        self.wait = float(options.get("wait", "0.5"))
        self.max_messages = int(options.get("max-messages", "500"))
        self._connection: Any = None
        self._pending: list[tuple[dict[str, Key], list[tuple]]] = []  # unacknowledged messages, in order
        self._available_now = False
        self._newest = 0  # ms: the latest sample time of the messages received

    # -- the subscription -----------------------------------------------------------------------

    def _consumer(self) -> Any:
        if self._connection is None:
            from martinet.messaging.client import AckMode, Topic
            from martinet.messaging.client.blocking import BlockingConnection

            self._connection = BlockingConnection(self.url, client_id=self.client_id)
            self._session = self._connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
            self._subscriber = self._session.durable_subscriber(Topic(self.topic), self.subscription)
        return self._subscriber

    def _receive(self, wait: float) -> int:
        """Take what the subscription has (at most ``max-messages``): wait up to ``wait`` s for
        the first message, then take what is there without waiting. Returns how many it took."""
        consumer = self._consumer()
        for count in range(self.max_messages):
            message = consumer.receive(timeout=wait) if count == 0 else consumer.receive_nowait()
            if message is None:
                return count
            try:
                rows, events = decode_batch(bytes(message.body))
            except ValueError:  # not a metrics batch: skipped, acknowledged with its neighbours
                self._pending.append(({}, []))
                continue
            chosen = rows if self.table == "rows" else events
            marks: dict[str, Key] = {}
            for row in rows + events:  # column 0 the router, column 1 its time, the last two epoch and seq
                marks[row[0]] = max(marks.get(row[0], (-1, -1)), (row[-2], row[-1]))
                self._newest = max(self._newest, row[1])
            self._pending.append(
                (marks, [(row[0], datetime.fromtimestamp(row[1] / 1000, UTC), *row[2:]) for row in chosen])
            )
        return self.max_messages

    def _between(self, start: dict, end: dict | None) -> Iterator[tuple]:
        for _, rows in self._pending:
            for row in rows:
                key = (row[-2], row[-1])
                if key > _key(start, row[0]) and (end is None or key <= _key(end, row[0])):
                    yield row

    # -- SimpleDataSourceStreamReader -------------------------------------------------------------

    def initialOffset(self) -> dict:
        return {"routers": {}}

    def prepareForTriggerAvailableNow(self) -> None:
        """``availableNow``: take everything the subscription holds now; reads then return only
        that. Received until a wait of ``wait`` seconds brings nothing, or a message holds
        samples taken after this started (the router publishes on): a take that ended when
        no message was prefetched (the client refills its credit in the background) left
        most of a long backlog behind."""
        now = time.time() * 1000
        while self._receive(self.wait) and self._newest < now:
            pass
        self._available_now = True

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        if not self._available_now:
            self._receive(self.wait)
        rows = list(self._between(start, None))
        marks = {router: _key(start, router) for router in start.get("routers", {})}
        for marks_of_message, _ in self._pending:
            for router, key in marks_of_message.items():
                if key > marks.get(router, (-1, -1)):
                    marks[router] = key
        end = _offset(marks)
        # a batch Spark may replay, even without rows of this table or without anything (the
        # first batch of an empty subscription is logged too); the same (start, end) writes
        # the same file again, and a commit removes it
        self._keep(start, end, rows)
        return iter(rows), end

    def _replay_file(self, start: dict, end: dict) -> Path:
        return self.replay / (hashlib.sha1(json.dumps([start, end]).encode()).hexdigest() + ".json")

    def _keep(self, start: dict, end: dict, rows: list[tuple]) -> None:
        """Store a batch for its replay, complete or not at all."""
        self.replay.mkdir(parents=True, exist_ok=True)
        target = self._replay_file(start, end)
        temporary = target.with_name("." + target.name)
        plain = [(row[0], int(row[1].timestamp() * 1000), *row[2:]) for row in rows]
        temporary.write_text(json.dumps({"end": end, "rows": plain}))
        os.replace(temporary, target)

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        path = self._replay_file(start, end)
        try:
            rows = json.loads(path.read_text())["rows"]
        except FileNotFoundError:
            raise RuntimeError(
                f"martinet source: cannot replay the batch up to {end}: {path} is missing "
                "(replay-folder must be the one of the query's earlier runs)"
            ) from None
        return iter([(row[0], datetime.fromtimestamp(row[1] / 1000, UTC), *row[2:]) for row in rows])

    def commit(self, end: dict) -> None:
        done = 0
        for marks, _ in self._pending:
            if any(key > _key(end, router) for router, key in marks.items()):
                break
            done += 1
        if done:
            self._consumer()
            self._session.acknowledge(done)
            del self._pending[:done]
        for path in self.replay.glob("*.json"):  # batches up to end are done for good
            mark = json.loads(path.read_text())["end"]
            if all(_key(mark, router) <= _key(end, router) for router in mark["routers"]):
                path.unlink(missing_ok=True)
