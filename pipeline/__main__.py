"""``martinet-pipeline``: ingest the metrics into Spark, analyse them, write tables and the report.

    martinet-pipeline --source files --input metrics --output analysis --once
    martinet-pipeline --source live --url amqp://127.0.0.1:5681 --output analysis   # until Ctrl-C
    martinet-pipeline --source live --url amqp://127.0.0.1:5681 --drop --force     # give it up
    martinet-pipeline --master spark://10.0.0.5:7077 --source files --input /shared/metrics --output /shared/analysis
    martinet-pipeline --remote sc://10.0.0.5:15002 --source files --input /shared/metrics --output /shared/analysis

See :mod:`.jobs` for what it computes and docs/spark.md for a walkthrough.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="martinet-pipeline", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--master",
        default="local[*]",
        help="Spark master URL (default local[*]; a standalone cluster: spark://host:7077).",
    )
    where.add_argument(
        "--remote",
        help="Run the job through a Spark Connect server instead (sc://host:15002): "
        "its Spark runs the queries, next to the files (docs/spark.md, 'Spark Connect').",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A Spark setting (repeatable), e.g. spark.executor.memory=2g or spark.cores.max=4.",
    )
    parser.add_argument(
        "--source",
        choices=("files", "live"),
        default="files",
        help="files: the export's folder (--input); live: a router's metrics topic (--url).",
    )
    parser.add_argument("--input", help="The export's folder (sys$spark's folder, or the collector's).")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="The export's format.")
    parser.add_argument("--url", help="amqp://host:port of the router holding the metrics topic (--source live).")
    parser.add_argument("--topic", default="martinet.metrics", help="The metrics topic (--source live).")
    parser.add_argument(
        "--partitions",
        type=int,
        help="--source live: Spark partitions each micro-batch is split into, read in parallel "
        "(default: the cluster's default parallelism).",
    )
    parser.add_argument("--output", help="Folder of the ingested tables, results and report.html (required).")
    parser.add_argument("--checkpoint", help="Checkpoint folder (default OUTPUT/_checkpoints); keep it to continue.")
    parser.add_argument("--once", action="store_true", help="Process what is there now, report, and stop.")
    parser.add_argument(
        "--interval",
        type=float,
        default=30,
        help="Seconds between batches and reports when running continuously (default 30).",
    )
    parser.add_argument("--window", default="1 minute", help="Window of the results (default '1 minute').")
    parser.add_argument(
        "--delay",
        default="2 minutes",
        help="How late rows may arrive: the watermark's delay, at "
        "least the export's roll-interval (default '2 minutes'); a window is reported once it passed.",
    )
    parser.add_argument(
        "--fill",
        default="10 minutes",
        help="How long a value without new rows still holds: "
        "longer than the export's full-sample period (default '10 minutes').",
    )
    parser.add_argument(
        "--state-timeout",
        default="30 seconds",
        help="A link state not sampled for this long "
        "counts as down (its router stopped): longer than the export's collect-interval "
        "(default '30 seconds').",
    )
    parser.add_argument(
        "--alert-windows",
        type=int,
        default=3,
        help="Alert when a backlog grew for this many windows in a row (default 3).",
    )
    parser.add_argument(
        "--drop",
        action="store_true",
        help="Instead of running: delete the durable subscriptions the live source made on the "
        "router at --url (they keep every metrics message while no pipeline reads them), and say "
        "how many messages they held.",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="--drop: also the subscriptions that hold messages (without it they are kept, with what would be lost).",
    )
    args = parser.parse_args(argv)
    if args.partitions is not None and args.partitions < 1:
        parser.error(f"--partitions {args.partitions}: use at least 1")
    if args.drop and not args.url:
        parser.error("--drop needs --url (the router the live pipeline read from)")
    if not args.drop and not args.output:
        parser.error("the following arguments are required: --output")
    for setting in args.conf:
        key, equals, _ = setting.partition("=")
        if not equals or not key.strip():
            parser.error(f"--conf {setting!r}: use KEY=VALUE, like spark.executor.memory=2g")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.drop:
        from .drop import drop

        return drop(args.url, force=args.force)
    from .jobs import drop_unfinished_log_writes, results, session, start_analyses, start_ingest  # slow: not for --help
    from .progress import Progress
    from .report import write_report

    progress = Progress()
    progress.say("starting Spark")

    output = Path(args.output)
    checkpoint = Path(args.checkpoint) if args.checkpoint else output / "_checkpoints"
    scratch = output / "_spark"  # Spark's local files, removed at the end
    conf = dict(setting.partition("=")[::2] for setting in args.conf)
    try:
        spark = session(args.master, scratch=scratch, remote=args.remote, conf=conf)
    except ValueError as exc:  # a --remote without a server
        print(f"martinet-pipeline: {exc}", file=sys.stderr)
        return 2
    interval = f"{args.interval} seconds"
    queries = []

    def start(what: str) -> None:
        if what == "ingest":
            queries.extend(
                start_ingest(
                    spark,
                    source=args.source,
                    output=output,
                    checkpoint=checkpoint,
                    once=args.once,
                    interval=interval,
                    folder=args.input,
                    file_format=args.format,
                    url=args.url,
                    topic=args.topic,
                    partitions=args.partitions,
                )
            )
        else:
            queries.extend(
                start_analyses(
                    spark,
                    output=output,
                    checkpoint=checkpoint,
                    once=args.once,
                    interval=interval,
                    window=args.window,
                    delay=args.delay,
                    fill=args.fill,
                    state_timeout=args.state_timeout,
                    alert_windows=args.alert_windows,
                )
            )

    latest: dict[str, list] | None = None  # the results last reported
    path: Path | None = None

    def report() -> None:
        nonlocal latest, path
        latest = results(spark, output)
        path = write_report(latest, output / "report.html").resolve()
        print(f"report: {path}", flush=True)

    try:
        for path in drop_unfinished_log_writes(checkpoint):
            progress.say(f"removed {path}: a log entry a killed run left half-written")
        progress.say(f"ingest from {args.url or args.input} ({args.source}) into {output}: rows, events")
        start("ingest")
        if args.once:  # the analyses read what the ingest wrote: one after the other
            for query in queries:
                query.awaitTermination()
            progress.update(queries)
            progress.say("analyses: route-changes, series")
            start("analyses")
            for query in queries:
                query.awaitTermination()
            progress.update(queries)
            report()
        else:
            progress.say(f"analyses: route-changes, series; every {args.interval:g} s until Ctrl-C")
            start("analyses")
            while all(query.isActive for query in queries):
                time.sleep(args.interval)
                progress.update(queries)
                report()
            for query in queries:
                query.awaitTermination()  # raises what stopped it
    except ValueError as exc:
        print(f"martinet-pipeline: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        for query in queries:
            query.stop()
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    progress.summary(latest, str(path) if path else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
