"""Spark's JVMs in the pipeline's tests start quickly (tests/harness/sparkjvm.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from martinet.pipeline.cluster import java_missing

from tests.harness.sparkjvm import quick_start_options

HERE = Path(__file__).parent


@pytest.fixture(scope="session", autouse=True)
def quick_spark_jvms(request, tmp_path_factory, worker_id) -> Iterator[None]:
    """``SPARK_SUBMIT_OPTS`` for every JVM the tests start through ``spark-submit``, when this
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
    options = quick_start_options(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_SUBMIT_OPTS", " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), options])))
        yield
