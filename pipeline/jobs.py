"""The pipeline's Spark work: ingest (Structured Streaming) and the analyses (batch over what
was ingested).

Theory of operation
-------------------
**Ingest.** One streaming query per table (``rows``, ``events``) copies the source into the
output folder's Parquet tables ``rows`` and ``events``: from the export's files (Spark's file
source; ``recursiveFileLookup`` because the export partitions by ``date=…/router=…`` and the
router is a column already) or from the live source (:mod:`.source`). Each query has its own
checkpoint, and the Parquet sink's log makes a re-run neither skip nor repeat a file or a
batch: a restarted job continues where it stopped. ``--once`` runs them with
``availableNow`` (everything there now, then stop); otherwise they run until stopped, every
``--interval``.

**Analyses.** :func:`analyse` reads the ingested tables (a batch read: every row so far,
duplicates from a collector's redelivery removed by ``(router, epoch, seq)``) and computes the
result tables, each windowed by ``--window``: ``rates`` (per router and queue: messages in
and out per second — a counter's increase over the time between its first and last sample
in the window — and the backlog: average, maximum, last, growth), ``backlog_alerts`` (a
backlog that grew for ``--alert-windows`` windows in a row), ``link_availability`` (per
routing connector: share of samples Operational, and flaps: changes from Operational to
another state), ``route_changes`` (routing events per kind), ``slowest_consumers`` (queues
whose consumers take the smallest share of what comes in) and ``busiest_links`` (routing
links by messages per second). They are rewritten whole each time (open windows included),
then the report (:mod:`.report`) is drawn from them.

The export holds a number only when it changed (and every value at each full sample,
docs/metrics.md), so the analyses work on the rows in a window as they are: a rate is exact
while its counter moves at every sample (a busy queue) and is ``0`` for an idle one with two
full samples in the window, but a burst that stops mid-window is rated over the time it moved;
the backlog average is over the backlog's changes, not weighted by time. Texts (link states)
come at every sample, so availability is a share of samples as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .schema import spark_schema
from .source import MartinetSource

__all__ = ["session", "start_ingest", "analyse", "RESULTS"]

KEY = ["router", "epoch", "seq"]
RESULTS = ("rates", "backlog_alerts", "link_availability", "route_changes", "slowest_consumers", "busiest_links")


def session(master: str = "local[*]", name: str = "martinet-pipeline") -> SparkSession:
    """A Spark session for the pipeline, with the ``martinet`` source registered. Keeps Spark on
    loopback when nothing says otherwise (``SPARK_LOCAL_IP``) and without its web UI; Python
    workers run this interpreter (``PYSPARK_PYTHON``, unless set: the live source imports
    ``martinet`` there — on a cluster, the workers' Python needs ``martinet[spark]`` too)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName(name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(MartinetSource)
    return spark


def start_ingest(spark: SparkSession, *, source: str, output: Path, checkpoint: Path, once: bool,
                 interval: str = "10 seconds", folder: str | None = None, file_format: str = "parquet",
                 url: str | None = None, topic: str = "martinet.metrics") -> list:
    """Start the ingest queries (rows and events) and return them (``StreamingQuery``).

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
            frame = (reader.parquet(str(Path(folder, table))) if file_format == "parquet"
                     else reader.json(str(Path(folder, table))))
        elif source == "live":
            if not url:
                raise ValueError("--source live needs --url (amqp://host:port of a router)")
            frame = (spark.readStream.format("martinet").option("url", url).option("topic", topic)
                     .option("table", table).option("replay-folder", str(checkpoint / f"replay-{table}")).load())
        else:
            raise ValueError(f"unknown source {source!r}: use files or live")
        writer = (frame.writeStream.format("parquet").outputMode("append")
                  .option("path", str(output / table)).option("checkpointLocation", str(checkpoint / table))
                  .queryName(f"ingest-{table}"))
        writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=interval)
        queries.append(writer.start())
    return queries


def _ingested(spark: SparkSession, output: Path, table: str) -> DataFrame:
    path = output / table
    if not any(path.glob("*.parquet")):
        return spark.createDataFrame([], spark_schema(table))
    return spark.read.schema(spark_schema(table)).parquet(str(path)).dropDuplicates(KEY)


def _windowed(frame: DataFrame, window: str) -> DataFrame:
    return frame.withColumn("w", F.window("time", window))


def _counter_rates(frame: DataFrame, keys: list[str]) -> DataFrame:
    """Per window and ``keys`` (which include ``metric``): the counter's increase per second
    between its first and last sample in the window (null with one sample; a reset, e.g. a
    restarted router, gives null rather than a negative rate)."""
    per = frame.groupBy("w", *keys).agg(F.min_by("value", "time").alias("first"),
                                        F.max_by("value", "time").alias("last"),
                                        F.min("time").alias("t0"), F.max("time").alias("t1"))
    seconds = F.unix_millis(F.col("t1")) / 1000 - F.unix_millis(F.col("t0")) / 1000
    rate = F.when((seconds > 0) & (F.col("last") >= F.col("first")), (F.col("last") - F.col("first")) / seconds)
    return per.withColumn("rate", rate)


def analyse(spark: SparkSession, output: Path, *, window: str = "1 minute", alert_windows: int = 3,
            top: int = 20) -> dict[str, DataFrame]:
    """The result tables (see the module header) from the ingested tables below ``output``. They
    share cached inputs: ``spark.catalog.clearCache()`` once they are written."""
    rows = _ingested(spark, output, "rows").persist()  # read by every table: deduplicated once
    events = _ingested(spark, output, "events").persist()
    queues = _windowed(rows.filter((F.col("swiftlet") == "sys$queuemanager") & F.col("entity").startswith("queues/")
                                   & F.col("value").isNotNull())
                       .withColumn("queue", F.expr("substring(entity, 8)")), window)
    flows = queues.filter(F.col("metric").isin("enqueued", "dequeued"))
    counters = (_counter_rates(flows, ["router", "queue", "metric"])
                .groupBy("w", "router", "queue").pivot("metric", ["enqueued", "dequeued"]).agg(F.first("rate"))
                .withColumnRenamed("enqueued", "in_rate").withColumnRenamed("dequeued", "out_rate"))
    backlog = (queues.filter(F.col("metric") == "messages").groupBy("w", "router", "queue")
               .agg(F.avg("value").alias("backlog_avg"), F.max("value").alias("backlog_max"),
                    F.max_by("value", "time").alias("backlog_last"),
                    (F.max_by("value", "time") - F.min_by("value", "time")).alias("backlog_growth")))
    rates = (backlog.join(counters, ["w", "router", "queue"], "left")
             .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "router", "queue",
                     "in_rate", "out_rate", "backlog_avg", "backlog_max", "backlog_last", "backlog_growth")
             .persist())

    by_queue = Window.partitionBy("router", "queue").orderBy("window_start")
    growing = F.col("backlog_growth") > 0
    streaks = (rates.withColumn("run", F.sum(F.when(growing, 0).otherwise(1)).over(by_queue))
               .withColumn("streak", F.sum(F.when(growing, 1).otherwise(0))
                           .over(Window.partitionBy("router", "queue", "run").orderBy("window_start"))))
    alerts = (streaks.filter(growing & (F.col("streak") >= alert_windows))
              .select("window_start", "router", "queue", "streak", "backlog_last", "backlog_growth"))

    states = _windowed(rows.filter((F.col("swiftlet") == "sys$routing") & F.col("entity").startswith("connectors/")
                                   & (F.col("metric") == "state"))
                       .withColumn("link", F.expr("substring(entity, 12)")), window)
    availability = states.groupBy("w", "router", "link").agg(
        F.avg(F.when(F.col("text") == "operational", 1.0).otherwise(0.0)).alias("availability"),
        F.count("*").alias("samples"))
    link_events = (events.filter((F.col("kind") == "LinkStateChanged") & F.col("entity").startswith("connector:"))
                   .withColumn("link", F.expr("substring(entity, 11)"))
                   .withColumn("state", F.get_json_object("fields", "$.state")))
    before = F.lag("state").over(Window.partitionBy("router", "link").orderBy("time", "epoch", "seq"))
    flaps = (_windowed(link_events.withColumn("before", before), window)
             .filter((F.col("before") == "operational") & (F.col("state") != "operational"))
             .groupBy("w", "router", "link").agg(F.count("*").alias("flaps")))
    link_availability = (availability.join(flaps, ["w", "router", "link"], "left").fillna(0, ["flaps"])
                         .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "router",
                                 "link", "availability", "flaps", "samples"))

    route_changes = (_windowed(events.filter(F.col("kind").isin("RouteAdded", "RouteRemoved", "DestinationAdded",
                                                                "DestinationRemoved", "DestinationActivated",
                                                                "DestinationDeactivated")), window)
                     .groupBy("w", "router", "kind").agg(F.count("*").alias("changes"))
                     .select(F.col("w.start").alias("window_start"), "router", "kind", "changes"))

    slowest = (rates.filter(F.col("in_rate") > 0).groupBy("router", "queue")
               .agg(F.avg("in_rate").alias("in_rate"), F.avg("out_rate").alias("out_rate"),
                    F.max_by("backlog_last", "window_start").alias("backlog"))
               .withColumn("consumed_share", F.coalesce(F.col("out_rate"), F.lit(0.0)) / F.col("in_rate"))
               .orderBy("consumed_share", F.desc("backlog")).limit(top))

    links = _windowed(rows.filter((F.col("swiftlet") == "sys$routing") & F.col("entity").startswith("connections/")
                                  & F.col("metric").isin("messages-in", "messages-out")), window)
    busiest = (_counter_rates(links, ["router", "entity", "metric"]).groupBy("router", "entity")
               .agg((F.sum("rate") / F.countDistinct("w")).alias("messages_per_second"))
               .withColumn("link", F.expr("substring(entity, 13)")).drop("entity")
               .orderBy(F.desc("messages_per_second")).limit(top))
    return {"rates": rates, "backlog_alerts": alerts, "link_availability": link_availability,
            "route_changes": route_changes, "slowest_consumers": slowest, "busiest_links": busiest}


def write_results(results: dict[str, DataFrame], output: Path) -> dict[str, Path]:
    """Write every result table as Parquet below ``output/tables`` (replacing the last run's)."""
    paths = {}
    for name, frame in results.items():
        paths[name] = output / "tables" / name
        frame.coalesce(1).write.mode("overwrite").parquet(str(paths[name]))
    return paths
