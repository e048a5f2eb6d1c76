"""What the pipeline tells its operator on stderr: the stage it is in, the rows each query
took in so far, and a summary at the end — short lines between Spark's own WARN lines.

    martinet-pipeline: ingest from files into analysis: rows, events
    martinet-pipeline: ingest-rows: batch 0, 3,412 rows (3,412 so far)
    martinet-pipeline: analyses: route-changes, series
    martinet-pipeline: done in 41 s: 3,412 rows and 20 events ingested; results: rates 36, ...

Rows come from each streaming query's own progress reports (``recentProgress``: Spark keeps
the last 100 of a query, far more than the batches between two looks here), counted once
per batch id; a batch without rows says nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """Counts the input rows of the queries it is shown and prints the lines (``out``:
    stderr, where they do not mix with what scripts read from stdout)."""

    def __init__(self, out: TextIO | None = None):
        self._out = out
        self._started = time.monotonic()
        self._seen: dict[str, int] = {}  # query name → the last batch id counted
        self.rows: dict[str, int] = {}  # query name → input rows so far

    def say(self, text: str) -> None:
        print(f"martinet-pipeline: {text}", file=self._out or sys.stderr, flush=True)

    def update(self, queries: Iterable[Any]) -> None:
        """Count the batches the ``StreamingQuery`` objects ran since the last update, and say
        each one that took rows in."""
        for query in queries:
            name = query.name or str(query.id)
            for report in query.recentProgress:
                if report.batchId <= self._seen.get(name, -1):
                    continue
                self._seen[name] = report.batchId
                self.rows[name] = self.rows.get(name, 0) + report.numInputRows
                if report.numInputRows:
                    self.say(
                        f"{name}: batch {report.batchId}, {report.numInputRows:,} rows ({self.rows[name]:,} so far)"
                    )

    def summary(self, results: Mapping[str, list] | None, report: str | None) -> None:
        """The last line: how long, what was ingested, the result tables' sizes (``results``,
        as :func:`.jobs.results` gives them; None when none was read), where the report is."""
        seconds = time.monotonic() - self._started
        text = (
            f"done in {seconds:.0f} s: {self.rows.get('ingest-rows', 0):,} rows and "
            f"{self.rows.get('ingest-events', 0):,} events ingested"
        )
        if results is not None:
            text += "; results: " + ", ".join(f"{name} {len(rows):,}" for name, rows in results.items())
        if report is not None:
            text += f"; report: {report}"
        self.say(text)
