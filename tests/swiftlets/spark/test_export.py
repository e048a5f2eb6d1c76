"""``sys$spark``, the export: files complete while read, a stable schema, filters, retention,
events, the metrics topic and the collector (no Spark here: tests/pipeline/test_pipeline.py)."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.kernel import ConfigErrors, load_config, load_swiftlet_specs
from martinet.messaging.client import Topic, connect
from martinet.messaging.message import build
from martinet.swiftlets.spark import swiftlet as spark_swiftlet
from martinet.swiftlets.spark.api import EVENT_COLUMNS, ROW_COLUMNS, _decode_rows, decode_batch, encode_batch
from martinet.swiftlets.spark.config import SparkConfig
from martinet.swiftlets.spark.sampler import Filter, Sampler

from tests.harness.network import ROUTING_STACK, STACK, routing_config
from tests.harness.paths import ROOT
from tests.harness.polling import wait_until

SPARK_STACK = (*STACK, "sys$spark")


async def start(network, name: str, folder: Path, *, routing: bool = False, **spark):
    settings = {"collect_interval": 100, "roll_interval": 200, "folder": str(folder), **spark}
    swiftlets = {"sys$spark": SparkConfig(**settings)}
    if routing:
        swiftlets["sys$routing"] = routing_config()
    return await network.start(
        network.config(name, startorder=(*ROUTING_STACK, "sys$spark") if routing else SPARK_STACK, swiftlets=swiftlets)
    )


def usage(router) -> dict:
    return router.management.resolve("/sys$spark/usage").properties()


def data_files(folder: Path, table: str = "rows") -> list[Path]:
    """The files Spark's file source would read (hidden names ignored)."""
    return sorted(p for p in (folder / table).rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


def read_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_sample_holds_the_changed_numbers_and_every_full_sample_interval_all_values(network, tmp_path):
    router = await start(network, "r1", tmp_path / "metrics", collect_interval=86_400_000)  # samples taken here
    queues = router.swiftlet("sys$queuemanager")
    for name in ("busy", "idle"):
        queues.queue(name, create=True)
    sampler = Sampler(router.management, Filter("sys$queuemanager router", ""), Filter("%", ""), full_every=3)

    def numbers(rows: list[tuple]) -> dict[tuple[str, str], float]:
        return {(entity, metric): value for _, entity, metric, value, _ in rows if value is not None}

    def texts(rows: list[tuple]) -> set[tuple[str, str, str]]:
        return {(swiftlet, entity, metric) for swiftlet, entity, metric, value, _ in rows if value is None}

    first, _ = sampler.sample()  # the first sample is full
    everything = numbers(first)
    assert {("queues/busy", "messages"), ("queues/idle", "messages"), ("queues/idle", "enqueued")} <= everything.keys()
    assert texts(first) and all(swiftlet == "router" for swiftlet, _, _ in texts(first))  # e.g. the state

    await queues.send("busy", build(b"one"))
    changed, _ = sampler.sample()
    assert numbers(changed)[("queues/busy", "messages")] == everything[("queues/busy", "messages")] + 1
    assert numbers(changed)[("queues/busy", "enqueued")] == everything[("queues/busy", "enqueued")] + 1
    assert "queues/idle" not in {entity for entity, _ in numbers(changed)}  # unchanged: not exported
    # of the manager's own values only the counts of what it holds changed (the message)
    assert {metric for entity, metric in numbers(changed) if entity == ""} == {
        "memory-used",
        "memory-messages",
        "messages",
    }
    assert texts(changed) == texts(first)  # texts at every sample
    queues.queue("fresh", create=True)
    third, changes = sampler.sample()
    assert ("UsageAdded", "sys$queuemanager", "queues/fresh") in changes
    assert {entity for entity, _ in numbers(third)} <= {"queues/fresh", ""}  # a new entity: all its values
    assert ("queues/fresh", "messages") in numbers(third) and ("queues/busy", "messages") not in numbers(third)

    full, _ = sampler.sample()  # the fourth: full again
    assert numbers(full).keys() == everything.keys() | {key for key in numbers(third) if key[0] == "queues/fresh"}
    assert numbers(full)[("queues/busy", "messages")] == everything[("queues/busy", "messages")] + 1
    assert not {entity for entity, _ in numbers(sampler.sample()[0])} & {"queues/busy", "queues/idle", "queues/fresh"}


@pytest.mark.parametrize("file_format", ["parquet", "jsonl"])
async def test_a_reader_racing_the_writer_sees_only_complete_files(network, tmp_path, file_format):
    folder = tmp_path / "metrics"
    router = await start(network, "r1", folder, format=file_format, collect_interval=20, roll_interval=50)
    for n in range(50):  # something to sample: 50 queues
        router.swiftlet("sys$queuemanager").queue(f"q{n}", create=True)
    seen: dict[Path, int] = {}
    problems: list[str] = []
    stop = threading.Event()

    def race() -> None:
        while not stop.is_set():
            for path in data_files(folder):
                try:
                    rows = read_rows(path)
                except Exception as exc:  # what a partial file would cause
                    problems.append(f"{path.name}: {exc!r}")
                    continue
                if seen.setdefault(path, len(rows)) != len(rows) or not rows:
                    problems.append(f"{path.name}: {len(rows)} rows, earlier {seen[path]}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, race)
        await wait_until(lambda: usage(router)["files"] >= 30, timeout=30, what="30 files written")
        await network.stop("r1")
        stop.set()
    assert not problems
    written = {p: len(read_rows(p)) for p in data_files(folder)}
    # every sampled row is in a file, once — but for batches dropped because the writer fell
    # behind (a full pool queue; on a busy machine at a 50 ms roll), which are counted
    counters = usage(router)
    assert sum(written.values()) == counters["rows"] - counters["rows-dropped"] > 0
    assert all(p.parent.name == "router=r1" and p.parent.parent.name.startswith("date=") for p in written)


async def test_the_schema_is_the_documented_one_in_every_file(network, tmp_path):
    folder = tmp_path / "metrics"
    router = await start(network, "r1", folder)
    await wait_until(lambda: usage(router)["files"] >= 3, timeout=20)
    await network.stop("r1")
    expected = {"rows": [name for name, _ in ROW_COLUMNS], "events": [name for name, _ in EVENT_COLUMNS]}
    for table, columns in expected.items():
        files = data_files(folder, table)
        assert files
        for path in files:
            schema = pq.read_schema(path)
            assert schema.names == columns
            assert str(schema.field("time").type) == "timestamp[ms, tz=UTC]"
            assert str(schema.field("seq").type) == "int64"
    rows = [row for path in data_files(folder) for row in read_rows(path)]
    queues = {(row["entity"], row["metric"]) for row in rows if row["swiftlet"] == "sys$queuemanager"}
    assert ("queues/unroutable", "messages") in queues or ("", "queues") in queues
    assert any(row["swiftlet"] == "router" for row in rows)  # the router's own usage
    assert any(row["text"] is not None and row["value"] is None for row in rows)  # strings as text
    keys = [(row["epoch"], row["seq"]) for row in rows]
    assert len(set(keys)) == len(keys)


async def test_include_and_exclude_predicates_choose_swiftlets_and_entities(network, tmp_path):
    folder = tmp_path / "metrics"
    router = await start(
        network, "r1", folder, format="jsonl", include_swiftlets="sys$queuemanager", exclude_entities="queues/tmp%"
    )
    for name in ("orders", "tmp1", "tmp2"):
        router.swiftlet("sys$queuemanager").queue(name, create=True)
    await wait_until(lambda: usage(router)["samples"] >= 3, timeout=20)
    await network.stop("r1")
    rows = [row for path in data_files(folder) for row in read_rows(path)]
    assert {row["swiftlet"] for row in rows} == {"sys$queuemanager"}
    entities = {row["entity"] for row in rows}
    assert "queues/orders" in entities and not any(e.startswith("queues/tmp") for e in entities)


async def test_retention_by_size_deletes_the_oldest_files(network, tmp_path):
    folder = tmp_path / "metrics"
    router = await start(
        network, "r1", folder, format="jsonl", collect_interval=20, roll_interval=50, retention_size=60_000
    )
    await wait_until(lambda: usage(router)["files-deleted"] >= 5, timeout=30)
    files = data_files(folder) + data_files(folder, "events")
    assert sum(p.stat().st_size for p in files) <= 60_000
    assert usage(router)["bytes"] > 60_000


async def test_retention_by_age_deletes_old_files(network, tmp_path):
    folder = tmp_path / "metrics"
    router = await start(network, "r1", folder, format="jsonl", retention_age=300)
    await wait_until(lambda: usage(router)["files-deleted"] >= 3, timeout=30)
    await trio.sleep(0.1)
    assert len(data_files(folder)) <= 3  # what one 300 ms span holds at a 200 ms roll


def test_parquet_without_pyarrow_is_a_config_error_with_its_line(tmp_path, monkeypatch):
    path = tmp_path / "router.xml"
    path.write_text(
        '<router name="r1" startorder="sys$spark">\n  <swiftlet name="sys$spark" format="parquet"/>\n</router>\n'
    )
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if the spark extra were not installed
    with pytest.raises(ConfigErrors, match=r"router.xml:2.*pyarrow"):
        load_config(path, load_swiftlet_specs())


async def test_events_record_usage_entries_that_come_and_go(network, tmp_path):
    folder = tmp_path / "metrics"
    router = await start(network, "r1", folder, format="jsonl")
    await wait_until(lambda: usage(router)["samples"] >= 2, timeout=20)
    router.swiftlet("sys$queuemanager").queue("fresh", create=True)
    await wait_until(lambda: usage(router)["samples"] >= 5, timeout=20)
    await network.stop("r1")
    events = [row for path in data_files(folder, "events") for row in read_rows(path)]
    added = [e for e in events if e["kind"] == "UsageAdded" and e["entity"] == "queues/fresh"]
    assert added and added[0]["swiftlet"] == "sys$queuemanager"
    assert any(e["kind"] == "RouterStarted" for e in events)


def test_a_batch_round_trips_and_garbage_is_refused():
    body = encode_batch("r1", 7, [(1000, "sys$x", "e", "m", 1.5, None, 3)], [(1001, "sys$y", "K", "e", "{}", 4)])
    rows, events = decode_batch(body)
    assert rows == [("r1", 1000, "sys$x", "e", "m", 1.5, None, 7, 3)]
    assert events == [("r1", 1001, "sys$y", "K", "e", "{}", 7, 4)]
    for garbage in (
        b"",
        b"[]",
        b'{"router":"r"}',
        b'{"router":"r","epoch":1,"rows":[[1]],"events":[]}',
        b'{"router":"r","epoch":1,"rows":[[1,"s","e","m","not a number",null,3]],"events":[]}',
    ):
        with pytest.raises(ValueError, match="not a metrics batch"):
            decode_batch(garbage)


def test_a_batch_decoded_by_columns_gives_the_rows_of_the_row_by_row_path():
    rows = [
        [1000, "sys$queuemanager", "queues/q1", "messages", 3, None, 1],
        [1000, "router", "", "state", None, "up", 2],
    ]
    longer = [[1001, "sys$x", "e", "m", 2.5, None, 3, "a later field"]]
    events = [[1002, "sys$routing", "LinkStateChanged", "l1", "{}", 4]]
    body = encode_batch("paris", 9, rows + longer, events)
    expected = (
        [
            ("paris", 1000, "sys$queuemanager", "queues/q1", "messages", 3, None, 9, 1),
            ("paris", 1000, "router", "", "state", None, "up", 9, 2),
            ("paris", 1001, "sys$x", "e", "m", 2.5, None, 9, 3),
        ],
        [("paris", 1002, "sys$routing", "LinkStateChanged", "l1", "{}", 9, 4)],
    )
    assert decode_batch(body) == expected == _decode_rows(json.loads(body))
    with pytest.raises(ValueError, match=r"not a metrics batch: \('paris', 1000, 'sys\$x', 'e', 'm', True"):
        decode_batch(encode_batch("paris", 9, [[1000, "sys$x", "e", "m", True, None, 1]], []))


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3))
_ROW = st.tuples(
    st.integers(),
    *[st.one_of(st.none(), st.text(max_size=3))] * 3,
    st.one_of(st.none(), st.integers(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.text(max_size=3)),
    st.integers(),
).map(list)
_EVENT = st.tuples(st.integers(), *[st.one_of(st.none(), st.text(max_size=3))] * 4, st.integers()).map(list)
_ANY_ROW = st.one_of(
    st.lists(_VALUES, min_size=4, max_size=9),
    st.integers(),
    st.text(max_size=8),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=8),
)


_ODD = st.sampled_from([True, False, 0, 1.5, "x", None, [], {}])


def _tables(rows: st.SearchStrategy[list]) -> st.SearchStrategy[list]:
    """Wire tables of rows that fit, with at most one row that fits but for one thing (a
    value of another type in one column, one value short, or one more), or of any rows."""

    def alter(table: list, where: int, column: int, value: object, how: int) -> list:
        row = table[where % len(table)]
        if how == 0:
            row[column % len(row)] = value
        elif how == 1:
            row.pop()
        else:
            row.append(value)
        return table

    one_off = st.builds(
        alter, st.lists(rows, min_size=1, max_size=4), st.integers(0, 3), st.integers(0, 6), _ODD, st.integers(0, 2)
    )
    return st.one_of(st.lists(rows, max_size=4), one_off, one_off, st.lists(st.one_of(rows, _ANY_ROW), max_size=4))


@settings(max_examples=400)
@given(rows=_tables(_ROW), events=_tables(_EVENT))
def test_decoding_by_columns_and_row_by_row_agree_on_any_batch(rows, events):
    body = json.dumps({"router": "r", "epoch": 5, "rows": rows, "events": events}).encode()
    try:
        expected = _decode_rows(json.loads(body))
    except ValueError as exc:
        with pytest.raises(ValueError) as refused:
            decode_batch(body)
        assert str(refused.value) == str(exc)
    else:
        assert decode_batch(body) == expected


async def test_three_routers_publish_and_one_collector_writes_the_whole_network(network, tmp_path, caplog):
    folder = tmp_path / "collected"
    for name in ("a", "b", "c"):
        await start(
            network,
            name,
            folder if name == "a" else tmp_path / "unused",
            routing=True,
            output="topic",
            collector_enabled=name == "a",
            format="jsonl",
        )
    network.connect("b", "a")
    network.connect("c", "a")
    await network.settle({"a": {"b": 1, "c": 1}, "b": {"a": 1, "c": 2}, "c": {"a": 1, "b": 2}})
    collector = network.routers["a"]
    # a message on the topic that is no metrics batch: rejected, the collector goes on
    collector.swiftlet("sys$topicmanager").publish("martinet.metrics", build(b"garbage", durable=True))

    def routers_seen() -> set[str]:
        return {p.parent.name for p in data_files(folder)}

    await wait_until(
        lambda: routers_seen() == {"router=a", "router=b", "router=c"},
        timeout=30,
        what="rows of a, b and c in the collector's folder",
    )
    assert usage(collector)["rejected"] == 1
    assert "not a metrics batch" in caplog.text and "Traceback" not in caplog.text
    for name in ("b", "c"):  # events of every router arrive too
        network.routers[name].swiftlet("sys$queuemanager").queue(f"new-on-{name}", create=True)

    def events_seen() -> set[str]:
        return {
            (e["router"], e["entity"])
            for path in data_files(folder, "events")
            for e in read_rows(path)
            if e["kind"] == "UsageAdded"
        }

    await wait_until(lambda: events_seen() >= {("b", "queues/new-on-b"), ("c", "queues/new-on-c")}, timeout=30)
    assert not (tmp_path / "unused").exists()  # output topic: no files of their own


async def test_a_topic_message_says_its_router_and_highest_key_in_its_properties(network, tmp_path):
    """The properties the live source's driver places a message by, without its body: the
    router, the epoch and the highest seq of its rows and events (an event's, when an event
    came last) — and the time it was sent (an ``availableNow`` read stops at the first one sent
    after it started)."""
    before = int(time.time() * 1000)
    router = await start(network, "r1", tmp_path / "unused", output="topic")
    epoch = usage(router)["epoch"]
    async with connect(network.url("r1")) as connection, connection.session() as session:
        consumer = await session.consumer(Topic("martinet.metrics"))
        router.swiftlet("sys$queuemanager").queue("new", create=True)  # a UsageAdded event
        checked, with_events = 0, 0
        with trio.fail_after(30):
            while checked < 5 or not with_events:
                message = await consumer.receive()
                rows, events = decode_batch(bytes(message.body))
                last = max(row[-1] for row in rows + events)
                assert message.properties == {"router": "r1", "epoch": epoch, "seq": last}
                assert message.timestamp >= before
                checked, with_events = checked + 1, with_events + bool(events)


async def test_two_collectors_each_write_their_own_part_of_the_network_by_topic_root(network, tmp_path):
    # east: r1 and its collector e publish to the root metrics-east; west: r2 and w to metrics-west.
    # Interest goes per root, so nothing of one part is forwarded to the other part's collector.
    parts = {"e": "metrics-east", "r1": "metrics-east", "w": "metrics-west", "r2": "metrics-west"}
    for name, topic in parts.items():
        collector = name in ("e", "w")
        folder = tmp_path / (name if collector else "unused")
        await start(
            network,
            name,
            folder,
            routing=True,
            output="topic",
            topic=topic,
            collector_enabled=collector,
            format="jsonl",
        )
    network.connect("r1", "e")
    network.connect("e", "w")
    network.connect("r2", "w")
    await network.settle({"e": {"r1": 1, "w": 1, "r2": 2}, "w": {"r2": 1, "e": 1, "r1": 2}})

    def routers_seen(collector: str) -> set[str]:
        return {p.parent.name for p in data_files(tmp_path / collector)}

    await wait_until(
        lambda: routers_seen("e") == {"router=e", "router=r1"} and routers_seen("w") == {"router=w", "router=r2"},
        timeout=30,
        what="each collector's part in its folder",
    )
    collected = {name: usage(network.routers[name])["collected"] for name in ("e", "w")}
    await wait_until(
        lambda: all(usage(network.routers[name])["collected"] >= collected[name] + 10 for name in ("e", "w")),
        timeout=30,
        what="ten more batches at each collector",
    )
    assert routers_seen("e") == {"router=e", "router=r1"}
    assert routers_seen("w") == {"router=w", "router=r2"}
    for name, other in (("e", "metrics-west"), ("w", "metrics-east")):
        topics = network.routers[name].management.resolve("/sys$topicmanager/usage/topics").children
        assert other not in topics  # never received there, not even to be dropped
    assert not (tmp_path / "unused").exists()


def collect(router, batches: list[bytes]) -> None:
    topics = router.swiftlet("sys$topicmanager")
    for body in batches:
        topics.publish("martinet.metrics", build(body, durable=True))


def sample_batch(router: str, seq: int, rows: int) -> bytes:
    return encode_batch(
        router,
        7,
        [[1000 + seq, "sys$queuemanager", f"queues/q{n}", "messages", 1.0, None, seq + n] for n in range(rows)],
        [],
    )


async def test_a_collector_writes_many_small_samples_of_a_router_into_one_file(network, tmp_path):
    # 50 routers x 8 samples of 3 rows: 400 messages, held together (far below the limits of
    # 1,000 messages and 300,000 rows) until the roll at stop: one file per router, not one per
    # 150 messages
    folder = tmp_path / "collected"
    collector = await start(
        network, "a", folder, output="none", collector_enabled=True, collect_interval=86_400_000, roll_interval=600_000
    )
    collect(collector, [sample_batch(f"r{r:02d}", n * 3 + 1, 3) for n in range(8) for r in range(50)])
    await wait_until(lambda: usage(collector)["collected"] == 400, timeout=30, what="400 batches collected")
    await network.stop("a")
    files = data_files(folder)
    assert sorted(p.parent.name for p in files) == [f"router=r{r:02d}" for r in range(50)]
    assert sum(len(read_rows(p)) for p in files) == 400 * 3


async def test_a_collector_holds_no_more_rows_than_its_limit_and_loses_none(network, tmp_path, monkeypatch):
    # a limit of 1,000 rows and a credit window of 2: a roll when the batch gathered reaches
    # 750 rows, and never more than 1,000 + 2 x 200 rows held (each file's rows were held at
    # once); the rest is written at stop
    monkeypatch.setattr(spark_swiftlet, "MAX_HELD_ROWS", 1000)
    monkeypatch.setattr(spark_swiftlet, "CREDIT_WINDOW", 2)
    folder = tmp_path / "collected"
    collector = await start(
        network, "a", folder, output="none", collector_enabled=True, collect_interval=86_400_000, roll_interval=600_000
    )
    collect(collector, [sample_batch("big", n * 200 + 1, 200) for n in range(40)])
    await wait_until(lambda: usage(collector)["collected"] == 40, timeout=30, what="40 batches collected")
    await network.stop("a")
    sizes = [len(read_rows(p)) for p in data_files(folder)]
    assert sum(sizes) == 40 * 200 and max(sizes) <= 1400
    assert len([size for size in sizes if size < 800]) <= 1  # a roll holds 4 batches or more; the one at stop less
    seqs = sorted(row["seq"] for p in data_files(folder) for row in read_rows(p))
    assert seqs == list(range(1, 40 * 200 + 1))


async def test_a_collector_rolls_on_the_batch_it_gathers_not_on_what_the_writer_holds(network, tmp_path, monkeypatch):
    # at most 8 messages held: a roll when the batch gathered has 6; the 2 messages that come
    # while that batch is written join the next batch (not a file each)
    monkeypatch.setattr(spark_swiftlet, "MAX_HELD_MESSAGES", 8)
    folder = tmp_path / "collected"
    collector = await start(
        network, "a", folder, output="none", collector_enabled=True, collect_interval=86_400_000, roll_interval=600_000
    )
    for n in range(60):  # one at a time, as samples come: the roll starts while more arrive
        collect(collector, [sample_batch("small", n + 1, 1)])
        await trio.sleep(0.01)
    await wait_until(lambda: usage(collector)["collected"] == 60, timeout=30, what="60 batches collected")
    await network.stop("a")
    sizes = [len(read_rows(p)) for p in data_files(folder)]
    assert sum(sizes) == 60 and max(sizes) <= 8
    assert len([size for size in sizes if size < 6]) <= 1  # the batch written at stop may hold fewer


BENCH = ROOT / "bench"


def test_the_collector_bench_gets_every_row_of_its_simulated_routers_into_the_files(monkeypatch):
    """bench/collector_bench.py at its smallest: a ``martinet run`` collector, two simulated
    routers with three queues each publishing over AMQP every 200 ms for 4 s: the files hold
    exactly the rows they published, none dropped."""
    monkeypatch.syspath_prepend(str(BENCH))
    bench = runpy.run_path(str(BENCH / "collector_bench.py"))
    args = argparse.Namespace(
        interval=200, seconds=3, warmup=1, busy=1.0, format="parquet", roll=500, drain=20, publishers=2
    )
    point = bench["run_point"](args, 2, 3, sys.executable)
    assert point["offered"] > 0
    assert (point["missing"], point["dropped"], point["write-errors"], point["released"]) == (0, 0, 0, 0)
