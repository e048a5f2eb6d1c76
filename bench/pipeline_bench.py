"""The pipeline's throughput: synthetic export files through ``martinet-pipeline --once``'s
work on ``local[2]``, a standalone cluster, or both.

    .venv/bin/python bench/pipeline_bench.py [--rows N] [--files F] [--master M ...] [--cluster]

Writes ``N`` rows (10 million by default) as the export would (Parquet, partitioned by date
and router, with :func:`martinet.swiftlets.spark.files.write_tables`): 3 routers, 200 queues
each sampled every second (messages, enqueued, dequeued and a text value per sample), spread
over ``F`` files. Then, on each master in turn (``--master``, repeatable, default
``local[2]``; ``--cluster`` adds a standalone cluster it starts on this machine: a master and
two workers of 1 core and 1 GiB, :class:`martinet.pipeline.cluster.StandaloneCluster`), runs
the ingest and the analyses (Structured Streaming, ``availableNow``, one after the other as
``--once`` does) and the report, each timed, in one Spark session per master, and prints rows
per second. The masters read the same files; on a cluster its executors read and write the
temporary folder (one machine: it is their shared mount).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from martinet.pipeline.cluster import StandaloneCluster
from martinet.pipeline.jobs import results, session, start_analyses, start_ingest
from martinet.pipeline.report import write_report
from martinet.swiftlets.spark.config import FileFormat
from martinet.swiftlets.spark.files import write_tables

ROUTERS, QUEUES, METRICS = ("paris", "lyon", "tokyo"), 200, ("messages", "enqueued", "dequeued", "state")


def synthesize(folder: Path, rows: int, files: int) -> None:
    per_second = len(ROUTERS) * QUEUES * len(METRICS)
    seconds = rows // per_second
    start = int(time.time() * 1000) - seconds * 1000
    batch, seq = [], 0
    per_file = max(seconds // files, 1)
    for second in range(seconds):
        now = start + second * 1000
        for router in ROUTERS:
            for q in range(QUEUES):
                seq += 1
                sent = second * (q + 1)
                entity = f"queues/q{q}"
                batch += [
                    (router, now, "sys$queuemanager", entity, "messages", float(sent // 10), None, 1, seq * 4),
                    (router, now, "sys$queuemanager", entity, "enqueued", float(sent), None, 1, seq * 4 + 1),
                    (
                        router,
                        now,
                        "sys$queuemanager",
                        entity,
                        "dequeued",
                        float(sent - sent // 10),
                        None,
                        1,
                        seq * 4 + 2,
                    ),
                    (router, now, "sys$queuemanager", entity, "state", None, "ok", 1, seq * 4 + 3),
                ]
        if (second + 1) % per_file == 0 or second == seconds - 1:
            write_tables(str(folder), FileFormat.PARQUET, {"rows": batch, "events": []})
            batch = []


def measure(master: str, folder: Path, label: str) -> str:
    """The ingest, the analyses and the report on ``master`` over ``folder/export``; the
    summary line."""
    started = time.perf_counter()
    spark = session(master, "pipeline-bench", scratch=folder / f"spark-{label}")
    print(f"[{label}] Spark {spark.version} on {master}: session in {time.perf_counter() - started:.1f} s", flush=True)
    output = folder / f"analysis-{label}"
    try:
        started = time.perf_counter()
        for query in start_ingest(
            spark,
            source="files",
            output=output,
            checkpoint=output / "_checkpoints",
            once=True,
            folder=str(folder / "export"),
        ):
            query.awaitTermination()
        ingest = time.perf_counter() - started
        count = spark.read.parquet(str(output / "rows")).count()
        print(
            f"[{label}] ingest (streaming, availableNow): {count:,} rows in {ingest:.1f} s "
            f"= {count / ingest:,.0f} rows/s",
            flush=True,
        )
        started = time.perf_counter()
        for query in start_analyses(
            spark, output=output, checkpoint=output / "_checkpoints", once=True, window="1 minute", delay="1 minute"
        ):
            query.awaitTermination()
        analysis = time.perf_counter() - started
        windows = spark.read.parquet(str(output / "tables" / "rates")).count()
        print(
            f"[{label}] analyses (streaming, availableNow): {analysis:.1f} s = {count / analysis:,.0f} rows/s "
            f"({windows:,} queue windows)",
            flush=True,
        )
        started = time.perf_counter()
        write_report(results(spark, output), output / "report.html")
        print(f"[{label}] report: {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        spark.stop()
    return (
        f"{label} ({master}): ingest {count / ingest:,.0f} rows/s, analyses {count / analysis:,.0f} rows/s, "
        f"ingest + analyses {count / (ingest + analysis):,.0f} rows/s ({windows:,} queue windows)"
    )


def measure_apart(master: str, folder: Path, label: str) -> str:
    """:func:`measure` in a Python process of its own: each master gets a JVM of its own, started
    and stopped with it (a second session in one process shares the first one's JVM)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, master, folder, label).result()


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as name, contextlib.ExitStack() as stack:
        folder = Path(name)
        started = time.perf_counter()
        synthesize(folder / "export", args.rows, args.files)
        files = list((folder / "export" / "rows").rglob("part-*.parquet"))
        print(
            f"synthetic export: {args.rows:,} rows in {len(files)} Parquet files, "
            f"{sum(f.stat().st_size for f in files) / 1e6:.0f} MB, written in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        masters = [(master, master) for master in args.master or ["local[2]"]]
        if args.cluster:
            started = time.perf_counter()
            cluster = stack.enter_context(StandaloneCluster(folder / "cluster"))
            print(
                f"standalone cluster at {cluster.master_url}: 2 workers of 1 core and 1 GiB, "
                f"started in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
            masters.append(("cluster", cluster.master_url))
        print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        summary = [measure_apart(master, folder, label.replace("[", "").replace("]", "")) for label, master in masters]
        print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print("\n".join(summary))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument(
        "--master", action="append", help="A Spark master URL (repeatable; default local[2] unless --cluster)."
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="Also start a standalone cluster here (2 workers × 1 core) and run on it.",
    )
    main(parser.parse_args())
