"""``sys$spark``: exports every swiftlet's usage and the router's events as rows for Apache Spark.

Every ``collect-interval`` it samples the management tree's usage of every swiftlet
(generically: a new counter is exported without a change here) and records bus events as
they happen; rows go to partitioned Parquet or JSON-lines files for Spark's file source, or
to a metrics topic from which a collector router writes the files of the whole network, or
which the live Spark source ``martinet`` reads (``martinet.pipeline``). Layout: :mod:`.api`
(schemas, wire format, file layout: what readers use), :mod:`.config`, :mod:`.sampler` (the
tree and events into rows: pure), :mod:`.files` (writing and retention: blocking, run in
threads) and :mod:`.swiftlet` (the running export). Start it last, after the swiftlets it
samples (``sys$topicmanager`` for the topic and the collector). docs/metrics.md has the schema.
"""

from __future__ import annotations

from martinet.kernel import PoolSpec, SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import SparkConfig
    from .swiftlet import POOL, SparkSwiftlet

    return [
        SwiftletSpec(
            name="sys$spark",
            description="Exports usage and events as rows for Apache Spark: files, a metrics topic, a collector.",
            config=SparkConfig,
            factory=SparkSwiftlet,
            pools=(
                PoolSpec(
                    POOL,
                    "Writes the files (in worker threads), one batch after the other.",
                    max_concurrency=1,
                    queue_size=16,
                ),
            ),
        )
    ]
