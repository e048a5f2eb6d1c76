"""The running ``sys$spark``: samples, events, files, the metrics topic, the collector.

Theory of operation
-------------------
Every ``collect-interval`` the :class:`~.sampler.Sampler` walks the management tree (in the
router's thread; it is not thread-safe) and the rows (every ``full-sample-interval``-th sample
all values, the others only the numbers that changed and the texts: the export's cost follows
what moves, not what exists), stamped with the router, the time and
``(epoch, seq)``, go where ``output`` says. Bus events are taken from a subscription with
``DROP_OLDEST`` (a burst must never stall or fail the publishers; what is dropped is counted)
and become event rows at once.

- ``files``: rows gather in memory; every ``roll-interval`` they are handed, with the
  events, to a job of the swiftlet's pool ``spark.writer`` (one at a time, so files appear in
  order), which writes them in a worker thread (:mod:`.files`: hidden name, fsync, atomic
  rename) and then applies retention. A full pool queue (the disk is slower than the rows
  come) drops the batch and counts it: the router's own work comes first.
- ``topic``: each sample (with the events since the last one) is published to ``topic`` as
  persistent messages of at most :data:`CHUNK` rows (:func:`.api.encode_batch`); the topic
  manager forwards them to every router that subscribes (the routing network).
- ``collector-enabled``: a durable subscription (client id :data:`COLLECTOR_CLIENT`, name
  ``collector``) to ``topic`` on this router; received batches join the rows to write, and
  their messages are accepted only once the file holding them is renamed into place, so a
  crash loses nothing (a batch written but not yet accepted comes again: readers drop the
  duplicate by ``(router, epoch, seq)``). A roll comes at ``roll-interval`` or earlier, when
  the messages or the rows held unaccepted near their limits (:data:`MAX_HELD_MESSAGES`,
  :data:`MAX_HELD_ROWS`), and no credit is given past them: the rows of many small samples
  share a file per router, large samples are bounded in memory. A message that is not a
  metrics batch is rejected (to the dead-letter queue) with a warning. A write that fails
  releases the messages: they come again.

On stop, the rows still gathered are written (bounded by the router's shutdown timeout).
"""

from __future__ import annotations

import json
import time
from typing import Any

import trio

from martinet.kernel import Event, Overflow, PoolFull, SwiftletContext
from martinet.messaging.message import MessageError, build
from martinet.swiftlets.topicmanager.api import TopicError, TopicManager

from .api import decode_batch, encode_batch
from .config import Output, SparkConfig
from .files import enforce_retention, write_tables
from .sampler import Filter, Sampler, event_row_parts

__all__ = ["SparkSwiftlet", "POOL", "COLLECTOR_CLIENT", "CHUNK", "MAX_HELD_MESSAGES", "MAX_HELD_ROWS"]

POOL = "spark.writer"
COLLECTOR_CLIENT = "martinet-spark"
CHUNK = 2000  # rows per topic message (about 150 kB of JSON)
# The collector holds received messages unaccepted until their rows are in a file. A roll is
# forced when the batch being gathered reaches 3/4 of MAX_HELD_MESSAGES or of MAX_HELD_ROWS,
# and no credit is given while all that is held (with the batches not written yet; the rows
# are the memory) is past either. By rows, so that a network of
# many routers with small samples gets files of several samples per router (each file costs
# about a millisecond and an fsync) while large samples still roll as often as the memory
# needs. At most CREDIT_WINDOW messages are on their way beyond the limits (each at most
# CHUNK rows): at most 400,000 rows held.
MAX_HELD_MESSAGES = 1000
MAX_HELD_ROWS = 300_000
CREDIT_WINDOW = 50
EVENT_BUFFER = 10_000


class SparkSwiftlet:
    def __init__(self, context: SwiftletContext):
        self.context = context
        self.epoch = int(time.time() * 1000)
        self._seq = 0
        self._rows: list[tuple] = []
        self._events: list[tuple] = []
        self._outbox: list[tuple] = []  # events waiting for the next topic publish
        self._entries: list[Any] = []  # collected messages whose rows are in _rows/_events
        self._held_rows: dict[int, int] = {}  # rows of each collected message not settled yet, by id(entry)
        self._rows_held = 0  # their sum
        self._credit = 0  # credit given to the collector's consumer and not used yet
        self._queued: list[Any] = []  # batches handed to the pool and not written yet
        self._write_lock = trio.Lock()
        self._consumer: Any = None
        self._roll_now = trio.Event()
        self._filters: tuple[Any, Filter, Filter] | None = None
        self._sampler: Sampler | None = None
        self.counters = dict.fromkeys(
            (
                "samples",
                "rows",
                "events",
                "events-dropped",
                "files",
                "bytes",
                "rows-dropped",
                "write-errors",
                "published",
                "collected",
                "rejected",
                "files-deleted",
            ),
            0,
        )
        self.last_sample_ms = 0.0

    @property
    def config(self) -> SparkConfig:
        return self.context.config

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        self.context.usage.provide(
            lambda: {**self.counters, "epoch": self.epoch, "last-sample-ms": round(self.last_sample_ms, 2)}
        )
        with self.context.bus.subscribe(Event, max_buffer=EVENT_BUFFER, overflow=Overflow.DROP_OLDEST) as events:
            try:
                async with trio.open_nursery() as nursery:
                    if config.collector_enabled:
                        await self._subscribe()
                        nursery.start_soon(self._collect)
                    nursery.start_soon(self._record, events)
                    nursery.start_soon(self._sample_loop)
                    nursery.start_soon(self._roll_loop)
                    task_status.started()
            finally:
                self.counters["events-dropped"] += events.dropped
                with self.context.shutdown_scope():  # what the pool did not write yet, in order
                    for batch in list(self._queued):
                        await self._flush(batch)
                    await self._flush(self._take(), queued=False)
                if self._consumer is not None:
                    self._consumer.close()  # unaccepted messages go back to the subscription

    # -- rows ---------------------------------------------------------------------------------

    def _stamp(self) -> int:
        self._seq += 1
        return self._seq

    def _sampler_now(self) -> Sampler:
        config = self.config
        key = (
            config.include_swiftlets,
            config.exclude_swiftlets,
            config.include_entities,
            config.exclude_entities,
            config.full_sample_interval,
        )
        if self._filters is None or self._filters[0] != key:  # a new sampler: its first sample is full
            swiftlets, entities = Filter(*key[:2]), Filter(*key[2:4])
            self._filters = (key, swiftlets, entities)
            self._sampler = Sampler(self.context.management, swiftlets, entities, config.full_sample_interval)
        assert self._sampler is not None  # made with the filters
        return self._sampler

    def sample(self) -> None:
        """Take one sample now and send it on (also called by tests and management)."""
        started = time.perf_counter()
        sampler = self._sampler_now()
        parts, changes = sampler.sample()
        now = int(time.time() * 1000)
        router, epoch = self.context.router_name, self.epoch
        for kind, swiftlet, entity in changes:
            self._event(now, swiftlet, kind, entity, json.dumps({"swiftlet": swiftlet, "entity": entity}))
        first, self._seq = self._seq + 1, self._seq + len(parts)
        rows = [(router, now, *part, epoch, seq) for part, seq in zip(parts, range(first, self._seq + 1), strict=True)]
        self.counters["samples"] += 1
        self.counters["rows"] += len(rows)
        output = self.config.output
        if output is Output.FILES:
            self._rows.extend(rows)
        elif output is Output.TOPIC:
            events, self._outbox = self._outbox, []
            for start in range(0, max(len(rows), 1 if events else 0), CHUNK):
                self._publish(rows[start : start + CHUNK], events if start == 0 else [])
        else:
            self.counters["rows-dropped"] += len(rows)
        self.last_sample_ms = (time.perf_counter() - started) * 1000

    def _event(self, now: int, swiftlet: str, kind: str, entity: str, fields: str) -> None:
        if not self.config.events_enabled or not self._sampler_now().entities(entity):
            return
        event = (self.context.router_name, now, swiftlet, kind, entity, fields, self.epoch, self._stamp())
        self.counters["events"] += 1
        if self.config.output is Output.FILES:
            self._events.append(event)
        elif self.config.output is Output.TOPIC:
            self._outbox.append(event)

    def _publish(self, rows: list[tuple], events: list[tuple]) -> None:
        body = encode_batch(
            self.context.router_name,
            self.epoch,
            [row[1:7] + row[8:] for row in rows],
            [event[1:6] + event[7:] for event in events],
        )
        try:
            topics = self.context.lookup("sys$topicmanager", TopicManager)
            # the router and the highest (epoch, seq) as properties: a reader can order and
            # place the message without decoding it (the live source's driver does)
            last = max([row[-1] for row in rows] + [event[-1] for event in events])
            properties = {"router": self.context.router_name, "epoch": self.epoch, "seq": last}
            message = build(
                body, durable=True, subject="metrics", properties=properties, creation_time=int(time.time() * 1000)
            )
            topics.publish(self.config.topic, message)
            self.counters["published"] += 1
        except (LookupError, TopicError, MessageError) as exc:
            self.counters["rows-dropped"] += len(rows)
            self.context.log.warning("cannot publish metrics to topic %s: %s", self.config.topic, exc)

    async def _sample_loop(self) -> None:
        while True:
            await trio.sleep(self.config.collect_interval / 1000)
            self.sample()

    async def _record(self, events: Any) -> None:
        async for event in events:
            swiftlet, kind, entity, fields = event_row_parts(event)
            if self._sampler_now().swiftlets(swiftlet):
                self._event(int(time.time() * 1000), swiftlet, kind, entity, fields)

    # -- files --------------------------------------------------------------------------------

    def _take(self) -> tuple[dict[str, list[tuple]], list[Any]]:
        tables = {"rows": self._rows, "events": self._events}
        entries = self._entries
        self._rows, self._events, self._entries = [], [], []
        return tables, entries

    async def _roll_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.roll_interval / 1000):
                await self._roll_now.wait()
            self._roll_now = trio.Event()
            batch = self._take()
            if not any(batch[0].values()) and not batch[1]:
                continue
            try:
                self.context.pools[POOL].submit_nowait(self._flush, batch)
                self._queued.append(batch)
            except PoolFull:
                self._dropped(batch, "the writer is behind (pool spark.writer full)")

    async def _flush(self, batch: tuple[dict[str, list[tuple]], list[Any]], *, queued: bool = True) -> None:
        """Write one batch of tables, then accept its collected messages (release them if the
        write failed) and apply retention. One write at a time (the pool's job and the final
        flush at stop share the lock), and a write is not cancellable (it is bounded): a
        ``queued`` batch is either written and off ``_queued`` or still there for the final
        flush, never written twice."""
        tables, entries = batch
        config = self.config
        async with self._write_lock:
            if queued and not any(waiting is batch for waiting in self._queued):
                return  # written meanwhile
            # Shielded: a batch taken off ``_queued`` is written. (A cancellation used to stop
            # it between the two, at the thread call's first checkpoint: a batch lost uncounted.)
            with trio.CancelScope(shield=True):
                self._queued = [waiting for waiting in self._queued if waiting is not batch]
                if any(tables.values()):
                    try:
                        files, size = await trio.to_thread.run_sync(write_tables, config.folder, config.format, tables)
                    except OSError as exc:
                        self.counters["write-errors"] += 1
                        self._dropped(batch, f"cannot write to {config.folder}: {exc}")
                        return
                    self.counters["files"] += files
                    self.counters["bytes"] += size
                self._settle(entries, accept=True)
        if config.retention_age >= 0 or config.retention_size >= 0:
            try:
                self.counters["files-deleted"] += await trio.to_thread.run_sync(
                    enforce_retention, config.folder, config.retention_age, config.retention_size
                )
            except OSError as exc:
                self.context.log.warning("retention in %s: %s", config.folder, exc)

    def _dropped(self, batch: tuple[dict[str, list[tuple]], list[Any]], why: str) -> None:
        tables, entries = batch
        if entries:
            self._settle(entries, accept=False)
            self.context.log.warning("%s; %d collected messages go back to the subscription", why, len(entries))
        else:
            self.counters["rows-dropped"] += sum(len(rows) for rows in tables.values())
            self.context.log.warning("%s; %d rows dropped", why, sum(len(rows) for rows in tables.values()))

    def _settle(self, entries: list[Any], *, accept: bool) -> None:
        consumer = self._consumer
        if consumer is None or consumer.closed or not entries:
            return  # closed: the unaccepted messages went back to the subscription
        for entry in entries:
            self._rows_held -= self._held_rows.pop(id(entry), 0)
            consumer.accept(entry) if accept else consumer.release(entry)
        self._give_credit()

    def _give_credit(self) -> None:
        """Credit up to CREDIT_WINDOW while the messages and rows held are below their limits."""
        if self._rows_held >= MAX_HELD_ROWS:
            return
        more = min(CREDIT_WINDOW, MAX_HELD_MESSAGES - len(self._held_rows)) - self._credit
        if more > 0:
            self._consumer.flow(more)
            self._credit += more

    # -- collector ----------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        topics = self.context.lookup("sys$topicmanager", TopicManager)
        subscription = await topics.durable_subscribe(COLLECTOR_CLIENT, "collector", self.config.topic)
        self._consumer = subscription.consumer()
        self._give_credit()

    async def _collect(self) -> None:
        consumer = self._consumer
        while True:
            entry = await consumer.receive()
            self._credit -= 1
            try:
                rows, events = decode_batch(entry.message.body())
            except (ValueError, MessageError) as exc:
                self.counters["rejected"] += 1
                consumer.reject(entry, f"not a metrics batch: {exc}")
                self._give_credit()
                self.context.log.warning(
                    "message %s on topic %s rejected: %s", entry.message.message_id, self.config.topic, exc
                )
                continue
            self.counters["collected"] += 1
            self._rows.extend(rows)
            self._events.extend(events)
            self._entries.append(entry)
            self._held_rows[id(entry)] = len(rows) + len(events)
            self._rows_held += len(rows) + len(events)
            # the batch being gathered, not what is held in all (that includes batches the
            # writer has not written yet: rolling on it would hand it batches of one message)
            if len(self._entries) >= MAX_HELD_MESSAGES * 3 // 4 or len(self._rows) >= MAX_HELD_ROWS * 3 // 4:
                self._roll_now.set()
            self._give_credit()
