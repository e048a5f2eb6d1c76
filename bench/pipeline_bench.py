"""The pipeline's throughput: synthetic export files through ``martinet-pipeline --once`` on ``local[2]``.

    .venv/bin/python bench/pipeline_bench.py [--rows N] [--files F] [--master M]

Writes ``N`` rows (10 million by default) as the export would (Parquet, partitioned by date
and router, with :func:`martinet.swiftlets.spark.files.write_tables`): 3 routers, 200 queues
each sampled every second (messages, enqueued, dequeued and a text value per sample), spread
over ``F`` files. Then runs the ingest and the analyses (Structured Streaming, ``availableNow``,
one after the other as ``--once`` does) and the report, each timed, in one Spark session, and
prints rows per second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

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


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        started = time.perf_counter()
        synthesize(folder / "export", args.rows, args.files)
        files = list((folder / "export" / "rows").rglob("part-*.parquet"))
        print(
            f"synthetic export: {args.rows:,} rows in {len(files)} Parquet files, "
            f"{sum(f.stat().st_size for f in files) / 1e6:.0f} MB, written in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        started = time.perf_counter()
        spark = session(args.master, "pipeline-bench", scratch=folder / "spark")
        print(f"Spark {spark.version} on {args.master}: session in {time.perf_counter() - started:.1f} s", flush=True)
        output = folder / "analysis"
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
            f"ingest (streaming, availableNow): {count:,} rows in {ingest:.1f} s = {count / ingest:,.0f} rows/s",
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
            f"analyses (streaming, availableNow): {analysis:.1f} s = {count / analysis:,.0f} rows/s "
            f"({windows:,} queue windows)",
            flush=True,
        )
        started = time.perf_counter()
        write_report(results(spark, output), output / "report.html")
        print(f"report: {time.perf_counter() - started:.1f} s")
        print(f"ingest + analyses: {count / (ingest + analysis):,.0f} rows/s")
        spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--master", default="local[2]")
    main(parser.parse_args())
