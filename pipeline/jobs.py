"""The pipeline's Spark work: the ingest and the windowed analyses, all Structured Streaming.

Theory of operation
-------------------
**Ingest.** One streaming query per table (``rows``, ``events``) copies the source into the
output folder's Parquet tables ``rows`` and ``events``: from the export's files (Spark's file
source; ``recursiveFileLookup`` because the export partitions by ``date=…/router=…`` and the
router is a column already) or from the live source (:mod:`.source`). The Parquet sink's log
(``_spark_metadata``) makes a re-run neither skip nor repeat a file or a batch.

**Analyses.** Two streaming queries read the ingested tables as streams (the file source
follows the sink's log, so they see committed batches only) with an event-time watermark of
``--delay`` (how late rows may come: a router's file holds ``roll-interval`` of rows), and
count a row a collector wrote twice once (same ``(router, epoch, seq)``):

- ``route_changes``: a plain windowed count of routing events per router and kind
  (duplicates dropped by ``dropDuplicatesWithinWatermark``: few rows), in append mode to
  the Parquet table ``tables/route_changes`` (a window is written once the watermark has
  passed it).
- ``series``: the export holds a number only when it changed, so windowed aggregation of
  the rows as they are would rate a burst that stops mid-window over the time it moved, weight
  a backlog by its changes and give an idle queue no row at all. The values are
  forward-filled per key instead, which needs state across windows: queue counters and
  backlogs (``sys$queuemanager queues/…``), link states (``sys$routing connectors/…`` from the
  rows and from ``LinkStateChanged`` events, as 1 for Operational and 0 otherwise) and link
  counters (``connections/…``) go through ``applyInPandasWithState`` grouped by router,
  swiftlet and entity, with an event-time timeout (:mod:`.series`: time-weighted averages,
  restart-proof counter increases, growth streaks, link states that count as down once no
  longer sampled; every closed window, also with no new row). Chosen over Spark 4's
  ``transformWithStateInPandas`` as the older, simpler API that runs on the default state
  store (the newer one needs RocksDB's), and over state kept in our own tables because Spark
  checkpoints it with the query. Its output goes through ``foreachBatch``, which writes
  ``tables/series`` (one row per window, key and metric) and the tables derived from it —
  ``rates`` (per router and queue: messages in and out per second, backlog average, maximum,
  last, growth and streak),
  ``backlog_alerts`` (a backlog that grew ``--alert-windows`` windows in a row),
  ``link_availability`` (per connector: share of time Operational, flaps) and ``link_rates``
  (messages per second per routing connection) — each batch into ``batch=<id>`` partitions,
  replaced whole when a restarted query runs a batch again: exactly once. All of one entity's
  metrics close in the same batch, so the per-batch pivot is complete.

Each query has its own checkpoint below ``--checkpoint``: a restarted job continues where it
stopped, its open windows included (keep ``--window`` and ``--delay`` for a checkpoint).
``--once`` runs them with ``availableNow`` (the ingest first, then the analyses: everything
there now, then stop); windows the watermark has not passed yet stay open until a later run.
Otherwise they all run until stopped, every ``--interval``. :func:`results` reads the result
tables for the report, ranking ``slowest_consumers`` and ``busiest_links`` over all windows.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException, PySparkAttributeError, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from .cluster import worker_launcher
from .schema import spark_schema
from .series import OUTPUT_SCHEMA, STATE_SCHEMA, Windows
from .source import MartinetSource

__all__ = ["session", "start_ingest", "start_analyses", "results", "RESULTS"]

KEY = ["router", "epoch", "seq"]
RESULTS = ("rates", "backlog_alerts", "link_availability", "route_changes", "slowest_consumers", "busiest_links")
ROUTE_EVENTS = (
    "RouteAdded",
    "RouteRemoved",
    "DestinationAdded",
    "DestinationRemoved",
    "DestinationActivated",
    "DestinationDeactivated",
)


def session(
    master: str = "local[*]",
    name: str = "martinet-pipeline",
    scratch: Path | None = None,
    *,
    remote: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session for the pipeline, with the ``martinet`` source registered. Keeps Spark on
    loopback when nothing says otherwise (``SPARK_LOCAL_IP``) and without its web UI; Python
    workers run this interpreter (``PYSPARK_PYTHON``, unless set: the live source imports
    ``martinet`` there — on a cluster, the workers' Python needs ``martinet[spark]`` too), on a
    local master through :func:`~martinet.pipeline.cluster.worker_launcher` in ``scratch``.
    ``scratch`` takes Spark's local files (``spark.local.dir`` and the JVM's temporary folder:
    ``blockmgr-*``, ``spark-*``, ``artifacts-*``) instead of ``/tmp``; the caller removes it
    after ``spark.stop()`` (a killed driver leaves them there, not in ``/tmp``). ``conf``:
    more Spark settings (``spark.executor.memory``, ``spark.executorEnv.*``…), after these
    (JVM options added to the scratch folder's: :func:`local_settings`).

    With ``remote`` (``sc://host:port``) the session is a Spark Connect client of that server
    instead: no JVM here, ``master`` and ``scratch`` are the server's business, and only
    settings a running session takes apply (``conf`` too: a static one, like
    ``spark.executor.memory``, is refused).

    Raises:
        ValueError: ``remote`` is not a Spark Connect address or nothing listens there, or the
            server refused a setting of ``conf``.
    """
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
    }
    if remote is not None:
        _reachable(remote)
        spark = SparkSession.builder.remote(remote).getOrCreate()
        for key, value in (settings | dict(conf or {})).items():
            try:
                spark.conf.set(key, value)
            except PySparkException as exc:  # a static setting: the server's Spark has it fixed
                spark.stop()
                reason = str(exc).splitlines()[0]
                raise ValueError(f"--conf {key}={value}: the Spark Connect server refused it: {reason}") from None
        spark.dataSource.register(MartinetSource)
        return spark
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(name)
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    for key, value in local_settings(settings, scratch, conf or {}).items():
        builder = builder.config(key, value)
    unset = "PYSPARK_PYTHON" not in os.environ
    if unset:
        # On this machine (local masters) the workers start through the launcher that keeps
        # Spark's pyspark.zip off their path: 0.6 s less CPU for each of the dozens of Python
        # workers a run starts. A cluster's executors may not see the scratch folder.
        python = sys.executable
        if master.startswith("local") and scratch is not None:
            python = str(worker_launcher(scratch, python))
        os.environ["PYSPARK_PYTHON"] = python
    try:
        spark = builder.getOrCreate()  # its JVM and context take the variable as they start
    finally:
        if unset:  # a later session of this process, with another scratch folder, chooses again
            del os.environ["PYSPARK_PYTHON"]
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(MartinetSource)
    return spark


JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def local_settings(settings: Mapping[str, str], scratch: Path | None, conf: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings of a session whose JVM starts here: ``settings``, the scratch
    folder's (see :func:`session`), no web UI, then ``conf``. The JVM options of ``conf``
    follow the scratch folder's instead of replacing them: ``--conf
    spark.executor.extraJavaOptions=-XX:+UseG1GC`` must not send the executors' temporary
    files back to ``/tmp``."""
    result = dict(settings)
    if scratch is not None:
        temporary = f"-Djava.io.tmpdir={scratch.resolve()}"
        result |= {"spark.local.dir": str(scratch.resolve())} | dict.fromkeys(JAVA_OPTIONS, temporary)
    result |= {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # PySpark's own applyInPandasWithState code warns about its pandas use in every batch
        "spark.executorEnv.PYTHONWARNINGS": "ignore::FutureWarning:pyspark.worker",
    }
    for key, value in conf.items():
        result[key] = f"{result[key]} {value}" if key in JAVA_OPTIONS and key in result else value
    return result


CONNECT_PORT = 15002  # Spark Connect's default port


def _reachable(remote: str) -> None:
    """Fail fast when nothing listens at the Spark Connect address: its client retries a
    refused connection for minutes, silently.

    Raises:
        ValueError: not an ``sc://host:port`` address, or nothing answers there.
    """
    parts = urllib.parse.urlsplit(remote)
    try:
        port = parts.port or CONNECT_PORT
    except ValueError:
        port = -1
    if parts.scheme != "sc" or not parts.hostname or port < 0:
        raise ValueError(f"--remote {remote!r} is not a Spark Connect address (like sc://host:15002)")
    try:
        socket.create_connection((parts.hostname, port), timeout=10).close()
    except OSError as exc:
        raise ValueError(f"no Spark Connect server at {remote}: {exc.strerror or exc}") from None


def drop_unfinished_log_writes(checkpoint: Path) -> list[Path]:
    """Remove what a killed driver left half-written in the queries' offset and commit logs
    below ``checkpoint``, and return it. Spark writes each log entry to a hidden temporary
    file (``.0.<uuid>.tmp``, with its ``.crc``) and renames it; a driver killed between the
    two leaves the temporary file, which no reader takes for an entry, but Spark 4 refuses
    to start a query at batch 0 whose offset log folder is not empty
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): a pipeline killed during its first batch
    could not start again. Run it before the queries start: one pipeline per checkpoint."""
    found = [path for log in ("offsets", "commits") for path in checkpoint.glob(f"*/{log}/.*.tmp*")]
    for path in found:
        path.unlink(missing_ok=True)
    return found


def start_ingest(
    spark: SparkSession,
    *,
    source: str,
    output: Path,
    checkpoint: Path,
    once: bool,
    interval: str = "10 seconds",
    folder: str | None = None,
    file_format: str = "parquet",
    url: str | None = None,
    topic: str = "martinet.metrics",
    partitions: int | None = None,
) -> list:
    """Start the ingest queries (rows and events) and return them (``StreamingQuery``).
    ``partitions``: the live source's partitions per micro-batch (default: the cluster's
    default parallelism, ``spark.default.parallelism`` or its cores).

    Raises:
        ValueError: ``source`` is not files or live, or its location is missing.
    """
    queries = []
    for table in ("rows", "events"):
        schema = spark_schema(table)
        if source == "files":
            if not folder:
                raise ValueError("--source files needs --input (the export's folder)")
            Path(folder, table).mkdir(parents=True, exist_ok=True)
            reader = spark.readStream.schema(schema).option("recursiveFileLookup", "true")
            frame = (
                reader.parquet(str(Path(folder, table)))
                if file_format == "parquet"
                else reader.json(str(Path(folder, table)))
            )
        elif source == "live":
            if not url:
                raise ValueError("--source live needs --url (amqp://host:port of a router)")
            frame = (
                spark.readStream.format("martinet")
                .option("url", url)
                .option("topic", topic)
                .option("table", table)
                .option("replay-folder", str(checkpoint / f"replay-{table}"))
                .option("partitions", str(partitions or default_parallelism(spark)))
                .load()
            )
        else:
            raise ValueError(f"unknown source {source!r}: use files or live")
        # the analyses stream from this table: with its log there from the start they never
        # take it for a plain folder (and read a file the sink has not committed yet)
        (output / table / "_spark_metadata").mkdir(parents=True, exist_ok=True)
        writer = (
            frame.writeStream.format("parquet")
            .outputMode("append")
            .option("path", str(output / table))
            .option("checkpointLocation", str(checkpoint / table))
            .queryName(f"ingest-{table}")
        )
        writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=interval)
        if source == "live":  # (its reader runs in a Python process of the driver's: see there)
            queries.append(_start_with_worker(writer, f"ingest-{table}", first_batch=True))
        else:
            queries.append(writer.start())
    return queries


def default_parallelism(spark: SparkSession) -> int:
    """The cluster's default parallelism (``spark.default.parallelism``, else its cores); over
    Spark Connect, which has no SparkContext, the setting or 1."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except PySparkAttributeError:
        return int(spark.conf.get("spark.default.parallelism", "1") or "1")


FIRST_BATCH_TIMEOUT = 120.0  # seconds a live ingest query may take for its first batch before the next one starts


def _first_batch(query: Any) -> None:
    """Wait (bounded) until ``query`` has run its first batch, or stopped. After a crash both
    live ingest queries replay a batch at start; started together, Spark 4 now and then fails
    one of their first tasks (java.io.OptionalDataException deserializing it on the
    executor) and the pipeline exits. One after the other, they do not meet there."""
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.1)


def _trigger(writer: Any, once: bool, interval: str) -> Any:
    return writer.trigger(availableNow=True) if once else writer.trigger(processingTime=interval)


def _stream(spark: SparkSession, output: Path, table: str) -> DataFrame:
    return spark.readStream.schema(spark_schema(table)).parquet(str(output / table))


def _milliseconds(spark: SparkSession, option: str, interval: str) -> int:
    """``'2 minutes'`` in ms (Spark's own interval syntax, so ``--window`` means what
    ``window()`` takes).

    Raises:
        ValueError: not an interval, or not positive; the message names ``option``.
    """
    try:
        row = spark.sql(f"SELECT unix_millis(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL {interval})").first()
    except Exception:  # Spark's parse error: long and Java-flavoured
        raise ValueError(f"{option} {interval!r} is not an interval (like '30 seconds' or '2 minutes')") from None
    assert row is not None  # a SELECT without FROM has exactly one row
    value = row[0]
    if value <= 0:
        raise ValueError(f"{option} {interval!r} must be positive")
    return value


def start_analyses(
    spark: SparkSession,
    *,
    output: Path,
    checkpoint: Path,
    once: bool,
    interval: str = "10 seconds",
    window: str = "1 minute",
    delay: str = "2 minutes",
    fill: str = "10 minutes",
    state_timeout: str = "30 seconds",
    alert_windows: int = 3,
) -> list:
    """Start the analysis queries over the ingested tables below ``output`` (see the module
    header) and return them (``StreamingQuery``). ``fill``: how long a key without rows is still
    forward-filled (longer than the export's full-sample period, or idle queues get gaps);
    ``state_timeout``: how long a link state holds without a sample (longer than the export's
    collect-interval; past it the link counts as down: its router stopped).

    Raises:
        ValueError: an interval that Spark cannot parse or that is not positive.
    """
    window_ms, delay_ms, fill_ms, expire_ms = (
        _milliseconds(spark, option, value)
        for option, value in (
            ("--window", window),
            ("--delay", delay),
            ("--fill", fill),
            ("--state-timeout", state_timeout),
        )
    )
    rows, events = _stream(spark, output, "rows"), _stream(spark, output, "events")

    changes = (
        events.filter(F.col("kind").isin(*ROUTE_EVENTS))
        .withWatermark("time", delay)
        .dropDuplicatesWithinWatermark(KEY)
        .groupBy(F.window("time", window).alias("w"), "router", "kind")
        .agg(F.count("*").alias("changes"))
        .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "router", "kind", "changes")
    )
    queries = [
        _trigger(
            changes.writeStream.format("parquet")
            .outputMode("append")
            .queryName("route-changes")
            .option("path", str(output / "tables" / "route_changes"))
            .option("checkpointLocation", str(checkpoint / "route_changes")),
            once,
            interval,
        ).start()
    ]

    entity, metric = F.col("entity"), F.col("metric")
    numbers = rows.filter(
        (
            (F.col("swiftlet") == "sys$queuemanager")
            & entity.startswith("queues/")
            & metric.isin("messages", "enqueued", "dequeued")
        )
        | (
            (F.col("swiftlet") == "sys$routing")
            & entity.startswith("connections/")
            & metric.isin("messages-in", "messages-out")
        )
    )
    states = rows.filter(
        (F.col("swiftlet") == "sys$routing") & entity.startswith("connectors/") & (metric == "state")
    ).withColumn("value", (F.col("text") == "operational").cast("double"))
    link_events = events.filter((F.col("kind") == "LinkStateChanged") & entity.startswith("connector:")).select(
        "router",
        "time",
        F.lit("sys$routing").alias("swiftlet"),
        F.concat(F.lit("connectors/"), F.expr("substring(entity, 11)")).alias("entity"),
        F.lit("state").alias("metric"),
        (F.get_json_object("fields", "$.state") == "operational").cast("double").alias("value"),
        "epoch",
        "seq",
    )
    columns = ["router", "time", "swiftlet", "entity", "metric", "value", "epoch", "seq"]
    points = (
        numbers.select(*columns)
        .unionByName(states.select(*columns))
        .unionByName(link_events)
        .filter(F.col("value").isNotNull())
        .withWatermark("time", delay)
        .withColumn("t", F.unix_millis("time"))
    )
    series = (
        points.groupBy("router", "swiftlet", "entity")
        .applyInPandasWithState(
            Windows(window_ms, delay_ms, fill_ms, {"state": expire_ms}).step,
            OUTPUT_SCHEMA,
            STATE_SCHEMA,
            "append",
            GroupStateTimeout.EventTimeTimeout,
        )
        .withColumn("window_start", F.timestamp_millis("window_start"))
        .withColumn("window_end", F.timestamp_millis("window_end"))
    )

    def write(frame: DataFrame, batch: int) -> None:
        _write_batch(frame, batch, output / "tables", alert_windows)

    writer = _trigger(
        series.writeStream.foreachBatch(write)
        .queryName("series")
        .option("checkpointLocation", str(checkpoint / "series")),
        once,
        interval,
    )
    queries.append(_start_with_worker(writer, "series"))
    return queries


WORKER_ATTEMPTS = 5  # starts of a query whose Python worker was late: 50 s or more
_LATE_WORKER = "Python worker failed to connect back"


def _start_with_worker(writer: Any, name: str, *, first_batch: bool = False) -> Any:
    """Start the query ``name`` that needs a Python worker of its own, which Spark gives a
    fixed 10 s to connect back (Spark 4's ``PythonWorkerFactory``, no setting changes it). A
    loaded machine's worker, importing pyspark, pandas and pyarrow, may take longer. The
    query then fails before its first batch, with nothing written, and is started again,
    up to :data:`WORKER_ATTEMPTS` times. Two queries have such a worker:

    - ``foreachBatch`` (the series) through Spark Connect: the server's worker runs the
      function, and the start itself fails;
    - the live source's reader (``first_batch``): the driver's worker runs it, and the query
      fails as it initialises, so it is watched until its first batch (:func:`_first_batch`).

    A worker that cannot start at all looks the same; after the last attempt the error says
    where its reason is.

    Raises:
        ValueError: the worker did not connect back at any attempt (one line for the user).
    """
    connect = name == "series"  # (only a Connect session starts a worker for it)
    whose = "the Spark server's" if connect else "Spark's"
    for attempt in range(1, WORKER_ATTEMPTS + 1):
        try:
            query = writer.start()
        except PySparkException as exc:
            if _LATE_WORKER not in str(exc):
                raise
        else:
            if not first_batch:
                return query
            _first_batch(query)
            failure = None if query.isActive else query.exception()
            if failure is None or _LATE_WORKER not in str(failure):
                return query
        if attempt < WORKER_ATTEMPTS:
            print(
                f"martinet-pipeline: {whose} Python worker for the {name} query did not connect back "
                f"in time (attempt {attempt} of {WORKER_ATTEMPTS}); starting it again",
                file=sys.stderr,
                flush=True,
            )
    if connect:
        raise ValueError(
            f"the Spark Connect server's Python worker for the series query did not connect back within "
            f"Spark's fixed 10 s, {WORKER_ATTEMPTS} times: the server is overloaded, or its Python cannot "
            f"start the worker (the server's log has the worker's error; its PYSPARK_PYTHON needs "
            f"martinet[spark])"
        )
    raise ValueError(
        f"Spark's Python worker for the {name} query did not connect back within Spark's fixed 10 s, "
        f"{WORKER_ATTEMPTS} times: the machine is overloaded, or its Python cannot start the worker (Spark's "
        f"log above has the worker's error; PYSPARK_PYTHON needs martinet[spark])"
    )


def _write_batch(series: DataFrame, batch: int, tables: Path, alert_windows: int) -> None:
    """One batch of closed windows into ``tables/<name>/batch=<batch>``, each replaced whole (a
    batch run again after a restart writes the same rows)."""
    series = series.persist()
    try:
        kinds = {
            row.kind for row in series.select(F.substring_index("entity", "/", 1).alias("kind")).distinct().collect()
        }
        if not kinds:
            return
        frames = {"series": series}
        window = ["window_start", "window_end", "router"]
        if "queues" in kinds:

            def of(name: str, value: Any) -> Any:
                return F.max(F.when(F.col("metric") == name, value))

            rates = (
                series.filter(F.col("swiftlet") == "sys$queuemanager")
                .groupBy(*window, "entity")
                .agg(
                    of("enqueued", F.col("increase") / F.col("seconds")).alias("in_rate"),
                    of("dequeued", F.col("increase") / F.col("seconds")).alias("out_rate"),
                    of("messages", F.col("average")).alias("backlog_avg"),
                    of("messages", F.col("maximum")).alias("backlog_max"),
                    of("messages", F.col("last")).alias("backlog_last"),
                    of("messages", F.col("last") - F.col("first")).alias("backlog_growth"),
                    of("messages", F.col("streak")).alias("streak"),
                )
                .select(
                    *window,
                    F.expr("substring(entity, 8)").alias("queue"),
                    "in_rate",
                    "out_rate",
                    "backlog_avg",
                    "backlog_max",
                    "backlog_last",
                    "backlog_growth",
                    "streak",
                )
            )
            frames["rates"] = rates
            frames["backlog_alerts"] = rates.filter(F.col("streak") >= alert_windows)
        if "connectors" in kinds:
            frames["link_availability"] = series.filter(F.col("entity").startswith("connectors/")).select(
                *window,
                F.expr("substring(entity, 12)").alias("link"),
                F.col("average").alias("availability"),
                F.col("drops").alias("flaps"),
                "seconds",
            )
        if "connections" in kinds:
            frames["link_rates"] = (
                series.filter(F.col("entity").startswith("connections/"))
                .groupBy(*window, F.expr("substring(entity, 13)").alias("link"))
                .agg(F.sum(F.col("increase") / F.col("seconds")).alias("messages_per_second"))
            )
        for name, frame in frames.items():
            frame.write.mode("overwrite").parquet(str(tables / name / f"batch={batch}"))
    finally:
        series.unpersist()


def _table(spark: SparkSession, tables: Path, name: str) -> DataFrame | None:
    """The committed rows of result table ``name``; None while it has none. A running job
    writes while the report reads: a table of ``batch=<id>`` parts is read from the parts
    whose write finished (``_SUCCESS``), a streaming sink's through its ``_spark_metadata`` log
    (which lists committed files only)."""
    path = tables / name
    if (path / "_spark_metadata").is_dir():
        if not any(path.glob("*.parquet")):
            return None
        try:
            return spark.read.parquet(str(path))
        except AnalysisException:  # files written, none committed yet
            return None
    parts = sorted(str(done.parent) for done in path.glob("batch=*/_SUCCESS"))
    return spark.read.option("basePath", str(path)).parquet(*parts) if parts else None


def results(spark: SparkSession, output: Path, *, top: int = 20) -> dict[str, list]:
    """The result tables below ``output/tables`` as rows for the report (:mod:`.report`):
    ``rates``, ``backlog_alerts``, ``link_availability``, ``route_changes`` by window, and the
    rankings ``slowest_consumers`` (smallest share of the inflow consumed, over every window
    with an inflow) and ``busiest_links`` (messages per second over all windows)."""
    tables = output / "tables"
    found = {name: _table(spark, tables, name) for name in (*RESULTS[:4], "link_rates")}
    out: dict[str, list] = {}
    for name in RESULTS[:4]:
        frame = found[name]
        out[name] = [] if frame is None else frame.drop("batch").orderBy("window_start").collect()
    rates, links = found["rates"], found["link_rates"]
    out["slowest_consumers"] = (
        []
        if rates is None
        else (
            rates.filter(F.col("in_rate") > 0)
            .groupBy("router", "queue")
            .agg(
                F.avg("in_rate").alias("in_rate"),
                F.avg("out_rate").alias("out_rate"),
                F.max_by("backlog_last", "window_start").alias("backlog"),
            )
            .withColumn("consumed_share", F.coalesce(F.col("out_rate"), F.lit(0.0)) / F.col("in_rate"))
            .orderBy("consumed_share", F.desc("backlog"))
            .limit(top)
            .collect()
        )
    )
    out["busiest_links"] = (
        []
        if links is None
        else (
            links.groupBy("router", "link")
            .agg(F.avg("messages_per_second").alias("messages_per_second"))
            .orderBy(F.desc("messages_per_second"))
            .limit(top)
            .collect()
        )
    )
    return out
