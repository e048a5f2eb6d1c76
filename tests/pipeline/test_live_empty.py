"""The live source's first runs on subscriptions that hold nothing yet (with real Spark, a
``martinet-pipeline`` subprocess per run).

An operator's first ``--once`` run often comes before any router publishes: it must end
cleanly, and so must every later run on the same ``--output`` (Spark replays the batches of
an unfinished run from the checkpoint, so an empty batch must be replayable like any
other), also after a run killed while it wrote a query's first offset. Once rows come, the
next run takes each exactly once.

The first run's live source also meets a late Python worker: Spark gives the process that
runs the source's reader a fixed 10 s to connect back, which a loaded machine's may miss.
The pipeline starts the query again."""

from __future__ import annotations

import sys

import pytest

from martinet.swiftlets.spark.config import SparkConfig

from tests.harness.network import STACK
from tests.harness.polling import wait_until
from tests.pipeline.test_pipeline import keys_of, run_pipeline, subscribe_live

pytestmark = pytest.mark.slow


async def test_runs_on_an_empty_subscription_end_cleanly_and_the_next_takes_every_row_once(network, tmp_path):
    # the Python of Spark's workers; the first that runs the live source's reader sleeps 12 s
    late = tmp_path / "late-python"
    late.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *python_streaming_source_runner*) [ -e {tmp_path}/slept ] || '
        f"{{ touch {tmp_path}/slept; sleep 12; }};; esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    late.chmod(0o755)
    spark = SparkConfig(collect_interval=100, output="none", events_enabled=False, include_swiftlets="sys$store")
    router = await network.start(network.config("r1", startorder=(*STACK, "sys$spark"), swiftlets={"sys$spark": spark}))
    url = network.url("r1")
    await subscribe_live(url)  # the source's durable subscriptions, empty: nothing published yet
    output = tmp_path / "analysis-live"
    arguments = ["--source", "live", "--url", url, "--output", str(output), "--once"]
    # as if a run had been killed while Spark wrote the events query's first offset: its
    # temporary file is there (Spark 4 refuses to start a query at batch 0 whose offset log
    # folder is not empty)
    offsets = output / "_checkpoints" / "events" / "offsets"
    offsets.mkdir(parents=True)
    partial = offsets / ".0.d3432c3d-42c2-444c-b97f-9d6a13e7bf4d.tmp"
    partial.write_text('v1\n{"batchWatermarkMs":0')
    (offsets / f".{partial.name}.crc").write_bytes(b"crc")
    stderr = await run_pipeline(*arguments, env={"PYSPARK_PYTHON": str(late)})
    assert f"martinet-pipeline: removed {partial}: a log entry a killed run left half-written" in stderr
    assert (tmp_path / "slept").exists()
    assert [line for line in stderr.splitlines() if "did not connect back" in line] == [
        "martinet-pipeline: Spark's Python worker for the ingest-rows query did not connect back in time "
        "(attempt 1 of 5); starting it again"
    ]
    assert keys_of(output) == []
    await run_pipeline(*arguments)  # a rerun on the same output and checkpoint
    assert keys_of(output) == []

    usage = router.management
    first = usage.get("/sys$spark/usage", "rows") + 1  # no await in between: no sample
    usage.set("/sys$spark", "output", "topic")
    await wait_until(lambda: usage.get("/sys$spark/usage", "rows") >= first + 50, what="rows published")
    usage.set("/sys$spark", "output", "none")
    last = usage.get("/sys$spark/usage", "rows")
    epoch = usage.get("/sys$spark/usage", "epoch")
    await run_pipeline(*arguments)
    keys = keys_of(output)
    assert sorted(keys) == [(epoch, seq) for seq in range(first, last + 1)]  # each once, none lost
