"""``martinet-pipeline``: ingest the metrics into Spark, analyse them, write tables and the report.

    martinet-pipeline --source files --input metrics --output analysis --once
    martinet-pipeline --source live --url amqp://127.0.0.1:5681 --output analysis   # until Ctrl-C

See :mod:`.jobs` for what it computes and README "Metrics into Spark" for a walkthrough.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="martinet-pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default local[*]).")
    parser.add_argument("--source", choices=("files", "live"), default="files",
                        help="files: the export's folder (--input); live: a router's metrics topic (--url).")
    parser.add_argument("--input", help="The export's folder (sys$spark's folder, or the collector's).")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="The export's format.")
    parser.add_argument("--url", help="amqp://host:port of the router holding the metrics topic (--source live).")
    parser.add_argument("--topic", default="martinet.metrics", help="The metrics topic (--source live).")
    parser.add_argument("--output", required=True, help="Folder of the ingested tables, results and report.html.")
    parser.add_argument("--checkpoint", help="Checkpoint folder (default OUTPUT/_checkpoints); keep it to continue.")
    parser.add_argument("--once", action="store_true", help="Process what is there now, report, and stop.")
    parser.add_argument("--interval", type=float, default=30, help="Seconds between batches and reports when "
                        "running continuously (default 30).")
    parser.add_argument("--window", default="1 minute", help="Window of the results (default '1 minute').")
    parser.add_argument("--alert-windows", type=int, default=3,
                        help="Alert when a backlog grew for this many windows in a row (default 3).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    from .jobs import analyse, session, start_ingest, write_results  # Spark is slow to import: after --help
    from .report import write_report

    output = Path(args.output)
    checkpoint = Path(args.checkpoint) if args.checkpoint else output / "_checkpoints"
    spark = session(args.master)
    try:
        queries = start_ingest(spark, source=args.source, output=output, checkpoint=checkpoint, once=args.once,
                               interval=f"{args.interval} seconds", folder=args.input, file_format=args.format,
                               url=args.url, topic=args.topic)
    except ValueError as exc:
        print(f"martinet-pipeline: {exc}", file=sys.stderr)
        spark.stop()
        return 2

    def report() -> None:
        results = analyse(spark, output, window=args.window, alert_windows=args.alert_windows)
        write_results(results, output)
        path = write_report(results, output / "report.html")
        spark.catalog.clearCache()
        print(f"report: {path.resolve()}", flush=True)

    try:
        if args.once:
            for query in queries:
                query.awaitTermination()
            report()
        else:
            while all(query.isActive for query in queries):
                time.sleep(args.interval)
                report()
            for query in queries:
                query.awaitTermination()  # raises what stopped it
    except KeyboardInterrupt:
        pass
    finally:
        for query in queries:
            query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
