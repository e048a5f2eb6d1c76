"""The live source killed at each of its fault points, on ``local[2]`` (real Spark, a
``martinet-pipeline`` subprocess per run): every row once. In a file of its own so that the
suite's workers (``--dist loadfile``) run it beside the other long pipeline tests, not
after them."""

from __future__ import annotations

import pytest

from tests.pipeline.test_pipeline import KILLS, LOCAL, live_kills

pytestmark = pytest.mark.slow


async def test_the_live_source_delivers_every_row_once_across_kills_at_each_point(network, tmp_path):
    await live_kills(network, tmp_path, LOCAL, KILLS)
