"""Spark's JVMs in the pipeline's tests start quickly (tests/harness/sparkjvm.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from martinet.pipeline.cluster import java_missing

from tests.harness.sparkjvm import quick_start_environment

HERE = Path(__file__).parent


@pytest.fixture(scope="session", autouse=True)
def quick_spark_jvms(request, tmp_path_factory, worker_id) -> Iterator[None]:
    """``JAVA_TOOL_OPTIONS`` and ``SPARK_SUBMIT_OPTS`` for the JVMs the tests start, when this
    run holds a test of this folder that starts Spark (marked slow: the others need no
    archive). The archive is shared by the run's workers: it lives in their common temp
    folder."""
    items = request.session.items
    starts_spark = any(item.path.is_relative_to(HERE) and item.get_closest_marker("slow") for item in items)
    if not starts_spark or java_missing() is not None:  # the tests that need Java say so themselves
        yield
        return
    base = tmp_path_factory.getbasetemp()
    folder = base if worker_id == "master" else base.parent
    with pytest.MonkeyPatch.context() as patch:
        for name, value in quick_start_environment(folder).items():
            patch.setenv(name, value)
        yield
