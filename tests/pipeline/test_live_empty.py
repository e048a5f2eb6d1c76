"""The live source's first runs on subscriptions that hold nothing yet (with real Spark, a
``martinet-pipeline`` subprocess per run).

An operator's first ``--once`` run often comes before any router publishes: it must end
cleanly, and so must every later run on the same ``--output`` (Spark replays the batches of
an unfinished run from the checkpoint, so an empty batch must be replayable like any
other). Once rows come, the next run takes each exactly once."""

from __future__ import annotations

import pytest

from martinet.swiftlets.spark.config import SparkConfig

from tests.harness.network import STACK
from tests.harness.polling import wait_until
from tests.pipeline.test_pipeline import keys_of, run_pipeline, subscribe_live

pytestmark = pytest.mark.slow


async def test_runs_on_an_empty_subscription_end_cleanly_and_the_next_takes_every_row_once(network, tmp_path):
    spark = SparkConfig(collect_interval=100, output="none", events_enabled=False, include_swiftlets="sys$store")
    router = await network.start(network.config("r1", startorder=(*STACK, "sys$spark"), swiftlets={"sys$spark": spark}))
    url = network.url("r1")
    await subscribe_live(url)  # the source's durable subscriptions, empty: nothing published yet
    output = tmp_path / "analysis-live"
    arguments = ["--source", "live", "--url", url, "--output", str(output), "--once"]
    for _ in range(2):  # the first run, and a rerun on the same output and checkpoint
        await run_pipeline(*arguments)
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
