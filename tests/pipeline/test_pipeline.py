"""The PySpark pipeline and the live source, with real Spark (a ``martinet-pipeline``
subprocess per run: each costs a Spark start, so the runs are few and each checks much)."""

from __future__ import annotations

import bisect
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import trio

from martinet.kernel import Router, RouterConfig
from martinet.messaging.client import Queue, TextMessage, Topic, connect
from martinet.swiftlets.jms.config import JmsConfig
from martinet.swiftlets.jms.config import ListenerConfig as AmqpListenerConfig
from martinet.swiftlets.spark.config import SparkConfig

from tests.harness.network import ROUTING_STACK, STACK, Network, routing_config
from tests.harness.paths import HARNESS
from tests.harness.polling import wait_until

pytestmark = pytest.mark.slow

PIPELINE_TIMEOUT = 300  # a busy 2-core machine: Spark starts in 5-20 s, a run takes 30-90 s


LOCAL = "local[2]"


def pipeline_command(*args: str, master: str = LOCAL) -> list[str]:
    """``martinet-pipeline`` on ``master``: a Spark master URL, or a Spark Connect server's
    ``sc://`` address (``--remote``)."""
    where = ["--remote", master] if master.startswith("sc://") else ["--master", master]
    return [sys.executable, "-m", "martinet.pipeline", *where, *args]


async def run_pipeline(*args: str, master: str = LOCAL, env: dict[str, str] | None = None) -> str:
    """Run the pipeline to its end (``env``: added to its environment); its stderr (its
    output is shown when it fails)."""
    env = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"} | (env or {})
    with trio.fail_after(PIPELINE_TIMEOUT):
        result = await trio.run_process(
            pipeline_command(*args, master=master), capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    assert result.returncode == 0, failure(result.stderr.decode())
    assert b"report: " in result.stdout
    return result.stderr.decode()


def failure(stderr: str) -> str:
    """What a failed pipeline printed: its own lines and error lines (a JVM stack trace would
    push the cause out of a plain tail), then the tail."""
    causes = [
        line
        for line in stderr.splitlines()
        if ("Error" in line or "Exception" in line or line.startswith("martinet-pipeline:"))
        and not line.lstrip().startswith("at ")
    ]
    return "\n".join(causes[:30]) + "\n...\n" + stderr[-3000:]


async def poll_pipeline(process: subprocess.Popen, log: Path, found: Callable[[], object], what: str) -> None:
    """Wait for ``found()`` while the pipeline ``process`` (writing to ``log``) runs: it must
    not end meanwhile (its error lines then fail the test). Read every 0.5 s: ``found``
    reads files Spark is writing."""
    with trio.move_on_after(PIPELINE_TIMEOUT):
        while not found():
            assert process.poll() is None, failure(log.read_text(errors="replace"))
            await trio.sleep(0.5)
        return
    raise AssertionError(f"not within {PIPELINE_TIMEOUT} s: {what}")


def at(moment: datetime) -> float:
    """Seconds since the epoch of a window's start (Spark's Parquet timestamps are UTC)."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def table(output: Path, name: str) -> list[dict]:
    return pq.read_table(output / "tables" / name).to_pylist()


def ingested(output: Path, name: str = "rows") -> list[dict]:
    """The rows of an ingested table's committed files: those its ``_spark_metadata`` log lists
    (a query killed mid-batch leaves a partial file, which Spark's readers skip as well)."""
    files = set()
    for log in (output / name / "_spark_metadata").iterdir():
        if not log.name.startswith("."):
            files.update(json.loads(line)["path"] for line in log.read_text().splitlines()[1:])
    return [row for path in files for row in pq.read_table(path.removeprefix("file://")).to_pylist()]


async def paced_sends(
    url: str,
    queue: str,
    rate: float,
    seconds: float,
    *,
    window: float = 0,
    sent: list[float] | None = None,
    began: list[float] | None = None,
) -> float:
    """Send ``rate`` messages a second for ``seconds``. With ``window``, start 0.3 s into the next
    window of that many seconds (wall clock, like Spark's windows), once connected, and return
    that window's start. ``sent`` and ``began`` get when each send was done and begun."""
    async with connect(url) as connection, connection.session() as session:
        producer = await session.producer(Queue(queue))
        if window:
            await trio.sleep(window - time.time() % window + 0.3)
        begin = time.time() // window * window if window else 0.0
        start = trio.current_time()
        for n in range(int(rate * seconds)):
            await trio.sleep_until(start + n / rate)
            if began is not None:  # (the message was not in the queue before)
                began.append(time.time())
            await producer.send(TextMessage(f"m{n}"))
            if sent is not None:  # when the send was done: the message was in the queue before
                sent.append(time.time())
    return begin


async def consume(url: str, queue: str, stop: trio.Event) -> None:
    async with connect(url) as connection, connection.session() as session:
        consumer = await session.consumer(Queue(queue))
        while not stop.is_set():
            await consumer.receive(timeout=0.2)


async def test_known_load_gives_its_windows_across_a_restart_and_flaps_lower_availability(network, tmp_path):
    await known_load(network, tmp_path, LOCAL)


async def known_load(network, tmp_path: Path, master: str) -> None:
    """Queues under known load (``flow`` consumed at 40/s, ``load`` growing 50/s, ``idle`` at 5
    messages, ``burst``: 60 messages in half a second inside one 2 s window) and two flaps of a
    link, published to the metrics topic; the router's collector writes them as files and a
    live pipeline's subscriptions keep them. The pipeline on ``master`` reads them live, and
    from the files twice on one checkpoint, the second time over the files the first did not
    see (a restarted job): both give the known windows, and the same result tables."""
    export = tmp_path / "metrics"
    spark = SparkConfig(
        collect_interval=200,
        roll_interval=1000,
        output="none",
        collector_enabled=True,
        folder=str(export),
        exclude_entities="queues/spark-%",  # the live source's subscriptions: backlogs until it runs
    )
    a = await network.start(
        network.config(
            "a",
            startorder=(*ROUTING_STACK, "sys$spark"),
            swiftlets={"sys$spark": spark, "sys$routing": routing_config()},
        )
    )
    url = network.url("a")
    await subscribe_live(url)  # before the first row is published, like the collector's
    a.management.set("/sys$spark", "output", "topic")
    await network.start_routers("b")
    network.connect("a", "b", **{"retry-time": "1000"})
    await network.settle({"a": {"b": 1}})
    await paced_sends(url, "idle", 100, 0.05)
    await paced_sends(url, "burst", 100, 0.01)
    stop = trio.Event()
    started = time.time()
    sent: dict[str, list[float]] = {"flow": [], "load": [], "burst": [], "burst-began": []}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume, url, "flow", stop)
        nursery.start_soon(functools.partial(paced_sends, url, "flow", 40, 12, sent=sent["flow"]))
        # nobody consumes: the backlog grows 50/s
        nursery.start_soon(functools.partial(paced_sends, url, "load", 50, 12, sent=sent["load"]))
        # windows start at multiples of 2 s
        burst = await paced_sends(url, "burst", 120, 0.5, window=2, sent=sent["burst"], began=sent["burst-began"])
        for _ in range(2):  # two flaps of the link a -> b
            a.management.set("/sys$routing/connectors/b", "enabled", "false")
            await trio.sleep(1.5)
            a.management.set("/sys$routing/connectors/b", "enabled", "true")
            await network.settle({"a": {"b": 1}})
            await trio.sleep(1)
        await trio.sleep(max(0.0, started + 20 - time.time()))  # well past the end of the sends
        stop.set()
    a.management.set("/sys$spark", "output", "none")

    window = ["--once", "--window", "2 seconds", "--delay", "2 seconds", "--alert-windows", "3"]
    live = tmp_path / "live"
    await run_pipeline("--source", "live", "--url", url, "--output", str(live), *window, master=master)
    await network.stop("a")  # the collector writes what it holds

    output, later = tmp_path / "analysis", tmp_path / "later"
    halfway = int((started + 6) * 1000)
    for path in list(export.rglob("part-*")):  # the files from halfway on come after the first run
        if int(path.name.split("-")[1]) >= halfway:
            (later / path.relative_to(export)).parent.mkdir(parents=True, exist_ok=True)
            path.rename(later / path.relative_to(export))
    arguments = ["--source", "files", "--input", str(export), "--output", str(output), *window]
    await run_pipeline(*arguments, master=master)
    assert table(output, "rates"), "the first run closed no window"
    for path in list(later.rglob("part-*")):
        path.rename(export / path.relative_to(later))
    await run_pipeline(*arguments, master=master)
    assert not (output / "_spark").exists()  # Spark's local files (blockmgr-*, …) were there, not in /tmp

    check_known_load(output, started, burst, sent)
    check_known_load(live, started, burst, sent)
    for name in ("rows", "events"):
        files, topic = ingested(output, name), ingested(live, name)
        assert len(files) == len(topic) and sorted(files, key=by_key) == sorted(topic, key=by_key), name
    for name in ("rates", "backlog_alerts", "link_availability", "link_rates", "route_changes", "series"):
        assert sorted_rows(table(output, name)) == sorted_rows(table(live, name)), name


def by_key(row: dict) -> tuple:
    return row["router"], row["epoch"], row["seq"]


def sorted_rows(rows: list[dict]) -> list[tuple]:
    """Rows comparable as a whole, without the ``batch`` they were written in."""
    return sorted(tuple(sorted((k, repr(v)) for k, v in row.items() if k != "batch")) for row in rows)


async def subscribe_live(url: str) -> None:
    """Make the live source's durable subscriptions (it names them spark-<table>, with that
    client id): from then on they keep every row published, for a pipeline started later."""
    for name in ("spark-rows", "spark-events"):
        async with connect(url, client_id=name) as connection, connection.session() as session:
            await (await session.durable_subscriber(Topic("martinet.metrics"), name)).close()


class Samples:
    """The collector's samples of one queue's metric (``ingested`` rows): when each was taken
    and what it read, in time order."""

    def __init__(self, rows: list[dict], queue: str, metric: str, router: str = "a"):
        points = sorted(
            (at(r["time"]), r["value"])
            for r in rows
            if r["router"] == router and r["entity"] == f"queues/{queue}" and r["metric"] == metric
        )
        self.times = [t for t, _ in points]
        self.values = [v for _, v in points]

    def last_before(self, moment: float) -> int:
        """The index of the last sample taken before ``moment``."""
        return bisect.bisect_left(self.times, moment) - 1

    def average(self, start: float, end: float) -> float:
        """The time-weighted average over ``[start, end)`` of the value each sample read, held
        until the next sample (the series' rule), from the last sample before ``start``."""
        index = self.last_before(start)
        at_, value, area = start, self.values[index], 0.0
        for t, new in zip(self.times[index + 1 :], self.values[index + 1 :], strict=False):
            if t >= end:
                break
            area += value * (t - at_)
            at_, value = t, new
        return (area + value * (end - at_)) / (end - start)


def sent_between_samples(samples: Samples, sent: list[float], window: float, width: float) -> int:
    """Of the messages sent at the times ``sent``, those sent between the last samples before
    and in the window ``[window, window + width)``: what the window's rise of the counter
    counts, give or take the one send under way at each of the two samples."""
    begin = samples.times[samples.last_before(window)]
    end = samples.times[samples.last_before(window + width)]
    return sum(1 for t in sent if begin < t <= end)


def check_known_load(output: Path, started: float, burst: float, sent: dict[str, list[float]]) -> None:
    """The windows of :func:`known_load`'s load in the result tables below ``output``.

    A window's rise of a counter is what the collector's last sample in it read minus what
    its last sample before it read; so the messages it counts are those sent between those
    two samples, give or take the one send under way at each (a producer waits for each
    send), whatever the load of the machine made of the producers' pace. The samples are
    the collector's own rows (``ingested``), the send times the producers' clocks."""
    rows = ingested(output, "rows")
    rates = table(output, "rates")
    keys = [(r["router"], r["queue"], r["window_start"]) for r in rates]
    assert len(keys) == len(set(keys)), "a window was written twice"
    by_queue = {
        name: sorted((r for r in rates if r["queue"] == name), key=lambda r: r["window_start"])
        for name in ("flow", "load", "idle", "burst")
    }
    every = sorted({r["window_start"] for r in rates})
    # the windows reach past the 12 s of sends: a window [w, w + 2 s) closes once rows of w + 4 s
    # came (2 s of --delay), and the last rows come at about started + 20, so the last window
    # closed starts between started + 14 and + 16, by where the 2 s grid falls: + 12 is certain
    assert at(every[-1]) >= started + 12
    for name in ("load", "idle", "burst"):  # every window has a row, moving or not
        assert [r["window_start"] for r in by_queue[name]] == every[every.index(by_queue[name][0]["window_start"]) :]
    inner = [r for r in by_queue["load"] if started <= at(r["window_start"]) <= started + 10]
    assert len(inner) >= 3
    counted = {name: Samples(rows, name, "enqueued") for name in ("load", "flow", "burst")}
    backlog, burst_backlog = Samples(rows, "load", "messages"), Samples(rows, "burst", "messages")

    def sent_in(name: str, window: float) -> int:
        return sent_between_samples(counted[name], sent[name], window, 2)

    for row in inner:
        window = at(row["window_start"])
        if counted["load"].last_before(window) < 0:  # the queue's first window: rated from its first sample
            continue
        assert abs(row["in_rate"] * 2 - sent_in("load", window)) <= 2, (row, sent_in("load", window))
        assert not row["out_rate"], row
        assert row["backlog_growth"] == row["in_rate"] * 2, row  # nobody consumes
        assert abs(row["backlog_avg"] - backlog.average(window, window + 2)) < 1e-3, row  # (ms, as floats)
    first, *after = by_queue["load"]  # the queue appeared in its first window, with first["backlog_last"] in it
    received = first["backlog_last"] + sum(r["in_rate"] * 2 for r in after)
    assert abs(received - 600) < 1e-6, "the restarted job counted a window twice or lost one"
    assert by_queue["load"][-1]["backlog_last"] == 600
    for row in by_queue["flow"]:
        window = at(row["window_start"])
        if started + 2 <= window <= started + 8:
            assert abs(row["in_rate"] * 2 - sent_in("flow", window)) <= 2, (row, sent_in("flow", window))
            # what came in and did not stay went out: the three counters read at the same instants
            assert row["out_rate"] * 2 == row["in_rate"] * 2 - row["backlog_growth"] and row["out_rate"] > 0, row
    for row in by_queue["idle"][2:]:  # its first window(s) saw its 5 messages come
        assert row["in_rate"] == 0 and row["backlog_avg"] == row["backlog_last"] == 5, row
    assert burst in {at(r["window_start"]) for r in by_queue["burst"]}
    # A loaded machine may stretch the burst's half second past its window's end, or past the
    # window's last sample: each window counts what was sent between its samples, exactly so
    # when no send was under way at either sample. The backlog's average is the samples' (how
    # the burst rose depends on the producer's pace).
    sends = list(zip(sent["burst-began"], sent["burst"], strict=True))
    for row in by_queue["burst"][1:]:  # rated over the whole window, not the half second it moved
        window = at(row["window_start"])
        count = sent_in("burst", window)
        assert abs(row["in_rate"] * 2 - count) <= 2, (row, count)
        samples = [counted["burst"].times[counted["burst"].last_before(w)] for w in (window, window + 2)]
        if not any(begun <= sample <= done for begun, done in sends for sample in samples):
            assert row["in_rate"] * 2 == count, (row, count)
        assert abs(row["backlog_avg"] - burst_backlog.average(window, window + 2)) < 1e-3, row
    alerts = table(output, "backlog_alerts")
    assert {r["queue"] for r in alerts} == {"load"}

    links = [r for r in table(output, "link_availability") if r["router"] == "a" and r["link"] == "b"]
    assert min(r["availability"] for r in links) < 1.0
    assert max(r["availability"] for r in links) == 1.0
    assert sum(r["flaps"] for r in links) == 2
    changes = table(output, "route_changes")
    assert {"RouteAdded", "RouteRemoved"} <= {r["kind"] for r in changes if r["router"] == "a"}
    report = (output / "report.html").read_text()
    assert report.count("data:image/png;base64,") == 4 and "load" in report and "<td>load</td>" in report


FAULT_POINTS = HARNESS / "sparkfaults"  # a sitecustomize: kill points in the source

#: Where the live source's rows reader is killed, run after run on one checkpoint, as
#: ``<method>:<before|after>:<n-th call in that run>``. Each leaves the next run a state to
#: recover from.
KILLS = [
    # latestOffset (messages received, the batch's parts kept for a replay), before Spark logs
    # the batch: the messages must not have been acknowledged, they come again
    ("latestOffset:after:3", "received, not logged"),
    # the reader's commit of batch N-1 is called after Spark logged batch N: N is logged and
    # not committed, N-1 committed by Spark and not acknowledged
    ("commit:before:2", "logged, before Spark's commit"),
    # the restart replays batch N from the replay folder, its parts read in executors: killed
    # at the first read
    ("read:before:1", "during a replay"),
    # the replay again, then batches; the next latestOffset comes after Spark committed the
    # batch before it, whose messages are not acknowledged yet
    ("latestOffset:before:3", "after Spark's commit, before the acknowledgement"),
    # the acknowledgement is at the router, the batch logged after it not committed
    ("commit:after:2", "after the acknowledgement"),
]


FAULT_SETTINGS = ("PYTHONPATH", "MARTINET_KILL_AT", "MARTINET_KILL_MARK")  # what fault_env adds for them


def fault_env(kill_at: str, mark: Path) -> dict[str, str]:
    """The environment of a pipeline whose rows reader stops at ``kill_at`` (tests/harness/sparkfaults)."""
    return os.environ | {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(FAULT_POINTS), os.environ.get("PYTHONPATH")])),
        "MARTINET_KILL_AT": kill_at,
        "MARTINET_KILL_MARK": str(mark),
    }


def keys_of(output: Path) -> list[tuple[int, int]]:
    """The ``(epoch, seq)`` of router r1's ingested rows, as committed so far (the sink may be
    writing: a log being written is read next time)."""
    try:
        return [(row["epoch"], row["seq"]) for row in ingested(output) if row["router"] == "r1"]
    except (OSError, ValueError):
        return []


async def publishing(network: Network, config: RouterConfig) -> tuple[Router, int]:
    """Start router r1 of ``config`` publishing its rows (once its first sample is taken) and
    return it with the ``seq`` of its first published row."""
    router = await network.start(config)
    first = router.management.get("/sys$spark/usage", "rows") + 1  # no await in between: no sample
    router.management.set("/sys$spark", "output", "topic")
    return router, first


async def live_kills(
    network, tmp_path: Path, master: str, kills: list[tuple[str, str]], *, restart_router: bool = True
) -> None:
    """The pipeline on ``master`` killed at each of ``kills``, run after run on one checkpoint;
    with ``restart_router``, then its router restarted under a running pipeline; then a run to
    the end: every row published (of every epoch of the router) came in exactly once. Each
    batch is split into two partitions, read by two executor tasks (one partition is the same
    code with one part file)."""
    spark = SparkConfig(collect_interval=100, output="none", events_enabled=False, include_swiftlets="sys$store")
    config = network.config("r1", startorder=(*STACK, "sys$spark"), swiftlets={"sys$spark": spark})
    router = await network.start(config)
    # The reader's durable subscription exists before the first row is published (the source
    # names it spark-<table> with that client id), so every published row must arrive: a row
    # lost before the first one the pipeline saw is noticed too.
    url = network.url("r1")
    async with connect(url, client_id="spark-rows") as connection, connection.session() as session:
        await (await session.durable_subscriber(Topic("martinet.metrics"), "spark-rows")).close()
    first = router.management.get("/sys$spark/usage", "rows") + 1  # no await in between: no sample
    router.management.set("/sys$spark", "output", "topic")

    output = tmp_path / "analysis"
    arguments = ["--source", "live", "--url", url, "--output", str(output), "--partitions", "2"]
    for kill_at, what in kills:
        mark = tmp_path / f"killed-{kill_at.replace(':', '-')}"
        env = fault_env(kill_at, mark)
        # an executor of a cluster is not a child of the pipeline: the kill points reach its
        # Python workers through the executors' environment
        executors = [f"--conf=spark.executorEnv.{name}={env[name]}" for name in FAULT_SETTINGS]
        log = tmp_path / f"{mark.name}.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                pipeline_command(*arguments, "--interval", "1", *executors, master=master),
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            with trio.fail_after(PIPELINE_TIMEOUT):
                returncode = await trio.to_thread.run_sync(process.wait)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                await trio.to_thread.run_sync(process.wait)
        assert mark.exists() and mark.read_text() == kill_at, (
            f"the pipeline ended before {what} ({kill_at}):\n{failure(log.read_text(errors='replace'))}"
        )
        assert returncode == -signal.SIGKILL, (kill_at, returncode)

    published: dict[int, tuple[int, int]] = {}  # per epoch, the seqs of the first and last row published
    if restart_router:
        command = pipeline_command(*arguments, "--interval", "1", master=master)
        router, first = await restarted_under_a_pipeline(
            network, router, spark, first, published, command, output, tmp_path / "restart.log"
        )
    router.management.set("/sys$spark", "output", "none")
    epoch = router.management.get("/sys$spark/usage", "epoch")
    published[epoch] = (first, router.management.get("/sys$spark/usage", "rows"))

    await run_pipeline(*arguments, "--once", master=master)
    keys = keys_of(output)
    assert len(keys) == len(set(keys)), "a row was delivered twice"
    expected = {(e, seq) for e, (low, high) in published.items() for seq in range(low, high + 1)}
    lost = sorted(expected - set(keys))
    assert not lost, f"{len(lost)} rows were lost, from {lost[0]} to {lost[-1]}"
    assert set(keys) == expected


async def restarted_under_a_pipeline(
    network: Network,
    router: Router,
    spark: SparkConfig,
    first: int,
    published: dict[int, tuple[int, int]],
    command: list[str],
    output: Path,
    log: Path,
) -> tuple[Router, int]:
    """Router r1 (``spark`` its sys$spark, publishing since the row ``first``) restarts on the
    same port, with a new epoch, while the pipeline ``command`` reads into ``output``: the
    reader connects again, and what it had not acknowledged comes again. Adds the old epoch's
    rows to ``published``; returns the restarted router, publishing, and its first row's
    ``seq``."""
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            command,
            env=os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        seen = router.management.get("/sys$spark/usage", "rows")
        epoch = router.management.get("/sys$spark/usage", "epoch")
        await poll_pipeline(process, log, lambda: (epoch, seen) in keys_of(output), "the running pipeline's first rows")
        router.management.set("/sys$spark", "output", "none")
        published[epoch] = (first, router.management.get("/sys$spark/usage", "rows"))
        port = router.management.get("/sys$jms/usage/listeners/amqp", "port")
        await network.stop("r1")
        listener = AmqpListenerConfig(name="amqp", port=port, bind_address="127.0.0.1")
        swiftlets = {"sys$spark": spark, "sys$jms": JmsConfig(listeners=[listener])}
        router, first_again = await publishing(
            network, network.config("r1", startorder=(*STACK, "sys$spark"), swiftlets=swiftlets)
        )
        epoch_again = router.management.get("/sys$spark/usage", "epoch")
        assert epoch_again > epoch
        await poll_pipeline(
            process, log, lambda: any(key[0] == epoch_again for key in keys_of(output)), "rows of the restarted router"
        )
        process.send_signal(signal.SIGINT)  # Ctrl-C: the queries stop, the job ends
        with trio.fail_after(120):
            code = await trio.to_thread.run_sync(process.wait)
        assert code == 0, failure(log.read_text(errors="replace"))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(process.wait)
    return router, first_again


async def test_three_routers_collected_into_one_folder_are_one_spark_table(network, tmp_path):
    await three_routers(network, tmp_path, LOCAL)


async def three_routers(network, tmp_path: Path, master: str) -> None:
    """Three routers publish their rows, one collects them into a folder: the pipeline on
    ``master`` ingests that folder as one table, every row once, and says so on stderr."""
    folder = tmp_path / "collected"
    for name in ("a", "b", "c"):
        spark = SparkConfig(
            collect_interval=200, roll_interval=500, output="topic", collector_enabled=name == "a", folder=str(folder)
        )
        await network.start(
            network.config(
                name,
                startorder=(*ROUTING_STACK, "sys$spark"),
                swiftlets={"sys$spark": spark, "sys$routing": routing_config()},
            )
        )
    network.connect("b", "a")
    network.connect("c", "b")
    await network.settle({"a": {"b": 1, "c": 2}, "c": {"a": 2, "b": 1}})
    await wait_until(
        lambda: {p.name for p in (folder / "rows").glob("*/router=*")} == {"router=a", "router=b", "router=c"},
        timeout=30,
        what="rows of a, b and c collected",
    )
    await trio.sleep(1)
    await network.stop_all()

    output = tmp_path / "analysis"
    stderr = await run_pipeline(
        "--source", "files", "--input", str(folder), "--output", str(output), "--once", master=master
    )
    rows = ingested(output)
    assert {row["router"] for row in rows} == {"a", "b", "c"}
    keys = [(row["router"], row["epoch"], row["seq"]) for row in rows]
    assert len(keys) == len(set(keys))
    written = sum(len(pq.read_table(p)) for p in (folder / "rows").rglob("part-*.parquet"))
    assert len(rows) == written
    # its progress on stderr: the stages, the rows of each batch, a summary with the same counts
    lines = [line.removeprefix("martinet-pipeline: ") for line in stderr.splitlines() if line.startswith("martinet-")]
    assert lines[:2] == ["starting Spark", f"ingest from {folder} (files) into {output}: rows, events"]
    assert "analyses: route-changes, series" in lines
    batches = [line for line in lines if line.startswith("ingest-rows: batch ")]
    assert batches and sum(int(line.split(", ")[1].split()[0].replace(",", "")) for line in batches) == len(rows)
    events = len(ingested(output, "events"))
    summary = lines[-1]
    assert summary.startswith("done in ")
    assert f": {len(rows):,} rows and {events:,} events ingested; results: rates " in summary
    assert summary.endswith(f"; report: {(output / 'report.html').resolve()}")


async def test_the_continuous_job_reports_windows_of_files_that_arrive_while_it_runs(network, tmp_path):
    """Without ``--once`` the ingest and the analyses keep running: windows of load that starts
    after the job started appear in the result tables and the report, and an interrupt (Ctrl-C)
    stops the job cleanly."""
    export = tmp_path / "metrics"
    spark = SparkConfig(collect_interval=200, roll_interval=1000, folder=str(export))
    await network.start(network.config("r1", startorder=(*STACK, "sys$spark"), swiftlets={"sys$spark": spark}))
    url = network.url("r1")
    await wait_until(lambda: any(export.rglob("part-*")), timeout=30, what="the export's first file")
    output = tmp_path / "analysis"
    report = output / "report.html"

    def steady_windows() -> list[dict]:
        """The windows of ``steady`` the job reported, wholly inside its load."""
        try:
            rows = table(output, "rates")
        except (OSError, ValueError):  # not there yet, or a file being written
            return []
        return [r for r in rows if r["queue"] == "steady" and started + 2 <= at(r["window_start"]) <= started + 6]

    env = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"}
    log = tmp_path / "pipeline.log"
    with log.open("wb") as output_file:
        process = subprocess.Popen(
            pipeline_command(
                "--source",
                "files",
                "--input",
                str(export),
                "--output",
                str(output),
                "--interval",
                "1",
                "--window",
                "2 seconds",
                "--delay",
                "2 seconds",
            ),
            env=env,
            start_new_session=True,
            stdout=output_file,
            stderr=subprocess.STDOUT,
        )
    try:
        await poll_pipeline(process, log, report.exists, "the continuous job's first report")
        started = time.time()  # the job runs: this load comes while it does
        stop = trio.Event()
        sent: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, url, "steady", stop)
            await paced_sends(url, "steady", 30, 8, sent=sent)
            stop.set()
        await poll_pipeline(
            process, log, lambda: len(steady_windows()) >= 2, "windows of the load sent after the job started"
        )
        # each window counts what was sent in it (by the collector's samples, so whatever pace
        # a loaded machine left the producer), and what came in and did not stay went out
        rows: list[dict] = []

        def read_rows() -> bool:
            try:
                rows[:] = ingested(output, "rows")
            except (OSError, ValueError):  # a file being written
                return False
            return True

        await poll_pipeline(process, log, read_rows, "the ingested rows")
        counted = Samples(rows, "steady", "enqueued", router="r1")
        for row in steady_windows():
            expected = sent_between_samples(counted, sent, at(row["window_start"]), 2)
            assert expected > 0 and abs(row["in_rate"] * 2 - expected) <= 2, (row, expected)
            assert row["out_rate"] * 2 == row["in_rate"] * 2 - row["backlog_growth"] and row["out_rate"] > 0, row
        await poll_pipeline(
            process, log, lambda: "steady" in report.read_text(), "the report rewritten with the new queue"
        )
        process.send_signal(signal.SIGINT)  # Ctrl-C: the queries stop, the job ends
        with trio.fail_after(120):
            code = await trio.to_thread.run_sync(process.wait)
        assert code == 0, log.read_text()[-5000:]
        # its progress: the stage, batches of rows as they came, a summary after Ctrl-C
        lines = [line.removeprefix("martinet-pipeline: ") for line in log.read_text().splitlines()]
        lines = [line for line in lines if line.startswith(("analyses: ", "ingest-rows: batch ", "done in "))]
        assert lines[0] == "analyses: route-changes, series; every 1 s until Ctrl-C"
        so_far = [int(line.split("(")[1].split()[0].replace(",", "")) for line in lines if "ingest-rows" in line]
        assert len(so_far) >= 2 and so_far == sorted(so_far)  # rows keep coming while it runs
        assert lines[-1].startswith("done in ") and f": {so_far[-1]:,} rows and " in lines[-1]
        assert lines[-1].endswith(f"; report: {report.resolve()}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(process.wait)
