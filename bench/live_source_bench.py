"""The live source's ingest rate with 1 and with 2 partitions per micro-batch.

    .venv/bin/python bench/live_source_bench.py [--rows N] [--rounds R] [--master M | --cluster]

A ``martinet run`` router (store ``sync="normal"``) holds, for every variant of a round, a
durable subscription of its own to ``martinet.metrics``; ``N`` rows (1 million by default) are
then published there as the export would publish them (messages of 2,000 rows, 3 routers,
with the ``router``/``epoch``/``seq`` properties), so every variant reads the same messages.
Each variant is one ``rows`` query of the ``martinet`` source into Parquet with
``availableNow`` (everything there now, in one micro-batch: the driver receives every message
and stores the batch's parts, then ``partitions`` tasks decode them and write Parquet),
timed from its start to its end, in one Spark session on ``--master`` (default ``local[2]``)
or, with ``--cluster``, on a standalone cluster of two 1-core workers started here
(:mod:`martinet.pipeline.cluster`). Rounds alternate the order of the variants so that the
machine's load moves both alike. Prints rows per second per variant and round, and the
query's own split of the time (``latestOffset``: the receive and the parts; ``addBatch``:
the tasks).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import trio
from _loadgen import free_port, martinet_router

from martinet.messaging.client import BytesMessage, Topic, connect
from martinet.pipeline.cluster import StandaloneCluster
from martinet.pipeline.jobs import session
from martinet.swiftlets.spark.api import encode_batch

ROUTER = """<router name="bench" startorder="sys$store sys$authentication sys$queuemanager sys$topicmanager sys$jms">
  <swiftlet name="sys$store" path="store" sync="normal"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""
ROUTERS, CHUNK, TOPIC = ("paris", "lyon", "tokyo"), 2000, "martinet.metrics"


async def subscribe(url: str, names: list[str]) -> None:
    for name in names:
        async with connect(url, client_id=name) as connection, connection.session() as session_:
            await (await session_.durable_subscriber(Topic(TOPIC), name)).close()


async def publish(url: str, rows: int, round_: int) -> None:
    """``rows`` rows as the export publishes them: per message one router's 2,000 rows."""
    epoch = int(time.time() * 1000) + round_
    seqs = dict.fromkeys(ROUTERS, 0)
    now = int(time.time() * 1000)
    async with connect(url) as connection, connection.session() as session_:
        producer = await session_.producer(Topic(TOPIC))
        for number in range(rows // CHUNK):
            router = ROUTERS[number % len(ROUTERS)]
            first = seqs[router] + 1
            seqs[router] += CHUNK
            batch = [
                (now + seq, "sys$queuemanager", f"queues/q{seq % 200}", "messages", float(seq), None, seq)
                for seq in range(first, seqs[router] + 1)
            ]
            body = encode_batch(router, epoch, batch, [])
            await producer.send(BytesMessage(body, properties={"router": router, "epoch": epoch, "seq": seqs[router]}))


def ingest(spark, url: str, name: str, partitions: int, folder: Path) -> tuple[int, float, dict]:
    """Run one variant; its row count, seconds and the query's duration split (ms)."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("martinet")
        .option("url", url)
        .option("table", "rows")
        .option("client-id", name)
        .option("subscription", name)
        .option("partitions", str(partitions))
        .option("replay-folder", str(folder / "replay"))
        .load()
        .writeStream.format("parquet")
        .option("path", str(folder / "rows"))
        .option("checkpointLocation", str(folder / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    split: dict = {}
    for progress in query.recentProgress:
        for key, value in progress["durationMs"].items():
            split[key] = split.get(key, 0) + value
    return spark.read.parquet(str(folder / "rows")).count(), seconds, split


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as name, ExitStack() as stack:
        folder = Path(name)
        port = free_port()
        stack.enter_context(martinet_router(folder / "router", ROUTER.format(port=port), port=port))
        url = f"amqp://127.0.0.1:{port}"
        master = args.master
        if args.cluster:
            cluster = stack.enter_context(StandaloneCluster(folder / "cluster"))
            master = cluster.master_url
        spark = session(master, "live-source-bench", scratch=folder / "spark")
        print(f"Spark {spark.version} on {master}; {args.rows:,} rows a variant and round", flush=True)
        trio.run(subscribe, url, ["warm-up"])  # the session's first query pays for starting up
        trio.run(publish, url, CHUNK * 4, -1)
        ingest(spark, url, "warm-up", 2, folder / "warm-up")
        rates: dict[int, list[float]] = {1: [], 2: []}
        for round_ in range(args.rounds):
            order = (1, 2) if round_ % 2 == 0 else (2, 1)
            names = {partitions: f"bench-{round_}-{partitions}" for partitions in order}
            trio.run(subscribe, url, list(names.values()))
            started = time.perf_counter()
            trio.run(publish, url, args.rows, round_)
            print(f"round {round_ + 1}: published in {time.perf_counter() - started:.1f} s", flush=True)
            for partitions in order:
                count, seconds, split = ingest(spark, url, names[partitions], partitions, folder / names[partitions])
                assert count == args.rows // CHUNK * CHUNK, f"{count} rows ingested"
                rates[partitions].append(count / seconds)
                print(
                    f"  {partitions} partition(s): {count:,} rows in {seconds:.1f} s = {count / seconds:,.0f} rows/s"
                    f" (the tasks {split.get('addBatch', 0) / 1000:.1f} s; the rest, the driver's receive"
                    f" and parts and the query's start, {seconds - split.get('addBatch', 0) / 1000:.1f} s)",
                    flush=True,
                )
        for partitions, values in rates.items():
            print(f"{partitions} partition(s): best {max(values):,.0f} rows/s, rounds {[round(v) for v in values]}")
        spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--cluster", action="store_true", help="a standalone cluster of two 1-core workers, here")
    main(parser.parse_args())
