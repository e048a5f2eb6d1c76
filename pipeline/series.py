"""Per-key windows of a changes-only series: the stateful step of the streaming analyses.

The export holds a number only when it changed (and every value at each full sample,
docs/metrics.md): a value *holds* from its row until the next row of the same key. This
module turns such points into one row per closed window and metric with time-weighted
figures, for :func:`martinet.pipeline.jobs.start_analyses`' ``applyInPandasWithState``
(grouped by router, swiftlet and entity; the function is :meth:`Windows.step`).

Per window ``[start, end)`` and metric, with the value forward-filled from before the window:

- ``seconds``: the time covered (the whole window, or from the metric's first point on);
- ``average`` (weighted by the time each value held), ``maximum``, ``first``, ``last``;
- ``increase``: the rise of a counter; a fall, or a new epoch (a restarted router, whose
  counters start again from 0), counts as a restart: the new value is the rise since. So a
  burst that stops mid-window is spread over the window, an idle queue rises 0, and a
  restart gives neither a null nor a negative rate;
- ``drops``: how often the value fell (a link's up indicator: flaps);
- a metric sampled at every sample (a link's state: texts are exported at every sample)
  holds only ``expire`` ms after its last sample and is 0 after that: a stopped router's
  links count as down, not as they were when it stopped (its export stops first);
- ``streak``: windows in a row, up to this one, in which the value grew (``last > first``).

A window is emitted once the watermark, or the key's latest point minus the watermark's
delay, has passed its end (the state's event-time timeout fires then even when the key has no
new rows: an idle queue gets a row in every window);
points older than the last emitted window are late and ignored, and a point that came twice
(a collector's redelivery: the same ``(epoch, seq)``) counts once. A key stops being filled
``fill`` ms after its last point (it went: a deleted queue, a stopped router) and its state
is dropped. The state is one JSON string per key (``STATE_SCHEMA``): the time windows are
emitted up to, per metric the value carried over and its epoch, and the points not yet in an
emitted window.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pandas as pd

__all__ = ["Windows", "OUTPUT_SCHEMA", "STATE_SCHEMA"]

OUTPUT_SCHEMA = (
    "window_start long, window_end long, router string, swiftlet string, entity string, metric string, "
    "seconds double, average double, maximum double, first double, last double, increase double, "
    "drops long, streak long"
)
STATE_SCHEMA = "json string"
_COLUMNS = [field.split()[0] for field in OUTPUT_SCHEMA.split(", ")]


class Windows:
    """The window function for one ``window`` length, the watermark's ``delay`` and the ``fill``
    limit (all in ms); metrics in ``expire`` (name: ms) are sampled at every sample and count
    as 0 once not sampled for that long (a link's state while its router is stopped)."""

    def __init__(self, window: int, delay: int, fill: int, expire: dict[str, int]):
        self.window = window
        self.delay = delay
        self.fill = fill
        self.expire = expire

    def step(self, key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        """``applyInPandasWithState``'s function: ``frames`` hold columns ``t`` (ms), ``metric``,
        ``value``, ``epoch``, ``seq``."""
        saved = json.loads(state.get[0]) if state.exists else {"until": None, "seen": None, "metrics": {}, "points": []}
        points = saved["points"]
        for frame in frames:
            points.extend(
                zip(
                    frame["t"].tolist(),
                    frame["metric"].tolist(),
                    frame["value"].tolist(),
                    frame["epoch"].tolist(),
                    frame["seq"].tolist(),
                    strict=True,
                )
            )
        if saved["until"] is None and points:
            saved["until"] = min(p[0] for p in points) // self.window * self.window
        points.sort(key=lambda p: (p[0], p[3], p[4]))
        # late (its window was emitted) or a collector's duplicate (the same epoch and seq, so the
        # same time: next to its original): Spark's dropDuplicatesWithinWatermark would keep every
        # key of a first run's batch in the JVM's memory
        points = [p for i, p in enumerate(points) if p[0] >= saved["until"] and (i == 0 or p[3:] != points[i - 1][3:])]
        if points:
            saved["seen"] = max(saved["seen"] or 0, points[-1][0])
        # The key's own latest point minus the delay is as safe a bound as the watermark: Spark
        # drops rows older than the watermark, which will be at least that. It closes windows in
        # the batch that brings their rows (the watermark moves only after a batch), so a large
        # batch (a first run over days of files) does not pile all its points up in the state.
        watermark = max(state.getCurrentWatermarkMs(), (saved["seen"] or 0) - self.delay)
        out = []
        while saved["until"] + self.window <= watermark and saved["until"] < saved["seen"] + self.fill:
            start = saved["until"]
            end = start + self.window
            inside = 0
            while inside < len(points) and points[inside][0] < end:
                inside += 1
            out += self._close(key, start, end, points[:inside], saved["metrics"])
            points = points[inside:]
            saved["until"] = end
        if not points and saved["until"] >= saved["seen"] + self.fill:
            state.remove()  # gone: nothing to fill any more
        else:
            saved["points"] = points
            state.update((json.dumps(saved, separators=(",", ":")),))
            state.setTimeoutTimestamp(saved["until"] + self.window)  # when the next window closes
        if out:
            yield pd.DataFrame(out, columns=_COLUMNS)

    def _close(self, key: tuple, start: int, end: int, points: list, metrics: dict) -> list[tuple]:
        """The rows of window ``[start, end)`` from its ``points`` and the values carried into it
        (``metrics``, updated to the values carried out)."""
        by_metric: dict[str, list] = {name: [] for name in metrics}
        for point in points:
            by_metric.setdefault(point[1], []).append(point)
        rows = []
        for name, own in by_metric.items():
            carried = metrics.get(name)
            if carried is None:  # the metric's first point: covered from there
                since, value, epoch, sampled = own[0][0], own[0][2], own[0][3], own[0][0]
            else:
                since, value, epoch, sampled = start, carried["v"], carried["e"], carried["p"]
            expiry = self.expire.get(name)
            first, maximum, area, increase, drops, at = value, value, 0.0, 0.0, 0, since
            for t, _, new, new_epoch, _ in [*own, (end, None, None, None, None)]:
                if expiry is not None and value and t > sampled + expiry:  # not sampled: its router is gone
                    area += value * (max(at, sampled + expiry) - at)
                    value, at, drops = 0.0, max(at, sampled + expiry), drops + 1
                area += value * (t - at)
                at = t
                if new is None:
                    break
                if new < value or new_epoch != epoch:  # a restart of a counter (or a gauge that fell)
                    increase += new
                    drops += new < value
                else:
                    increase += new - value
                value, epoch, sampled = new, new_epoch, t
                maximum = max(maximum, value)
            streak = (carried["s"] + 1 if carried else 1) if value > first else 0
            metrics[name] = {"v": value, "e": epoch, "s": streak, "p": sampled}
            seconds = (end - since) / 1000
            rows.append(
                (start, end, *key, name, seconds, area / (end - since), maximum, first, value, increase, drops, streak)
            )
        return rows
