"""The report: one self-contained HTML page with PNG plots (matplotlib) and the top tables.

matplotlib renders static PNGs embedded as base64, so the page opens offline, from a file,
in any browser, and is small; an interactive library (plotly) would embed megabytes of
JavaScript per page. Plots: messages in/out per second and backlog over time for the
busiest queues, link availability per window; tables: backlog alerts, slowest consumers,
busiest links, route changes.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

__all__ = ["write_report"]

QUEUES_PLOTTED = 8


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _series_plot(title: str, ylabel: str, series: dict[str, list[tuple[Any, Any, float]]]) -> str:
    """One step line per series of ``(window start, window end, value)``: a value holds for its
    window (a gap where a window has no row)."""
    figure, axes = plt.subplots(figsize=(10, 3.5))
    for label, windows in sorted(series.items()):
        times: list[Any] = []
        values: list[float] = []
        for start, end, value in sorted(windows):
            if times and times[-1] != start:
                times.append(times[-1])
                values.append(float("nan"))
            times += [start, end]
            values += [value, value]
        axes.plot(times, values, label=label)
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.set_ylim(0, 105 if ylabel == "%" else None)  # from 0: a dip looks as deep as it is
    axes.grid(alpha=0.3)
    if series:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    figure.autofmt_xdate()
    return _png(figure)


def _table(title: str, rows: list[Any], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = (
        "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row[c]))}</td>" for c in columns) + "</tr>" for row in rows)
        or f'<tr><td colspan="{len(columns)}">none</td></tr>'
    )
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "" if value is None else str(value)


def write_report(results: dict[str, Any], path: Path) -> Path:
    """Draw the report from the result tables' rows (:func:`.jobs.results`) into ``path``."""
    rates = results["rates"]
    totals: dict[str, float] = defaultdict(float)
    for row in rates:
        totals[f"{row.router}/{row.queue}"] += (row.in_rate or 0) + (row.backlog_max or 0)
    shown = set(sorted(totals, key=totals.__getitem__, reverse=True)[:QUEUES_PLOTTED])
    inflow, outflow, backlog = defaultdict(list), defaultdict(list), defaultdict(list)
    for row in rates:
        name = f"{row.router}/{row.queue}"
        if name in shown:
            if row.in_rate is not None:
                inflow[name].append((row.window_start, row.window_end, row.in_rate))
            if row.out_rate is not None:
                outflow[name].append((row.window_start, row.window_end, row.out_rate))
            backlog[name].append((row.window_start, row.window_end, row.backlog_avg))
    availability = defaultdict(list)
    for row in results["link_availability"]:
        availability[f"{row.router}→{row.link}"].append((row.window_start, row.window_end, 100 * row.availability))
    parts = [
        "<h1>Martinet metrics</h1>",
        f"<p>{len(rates)} queue windows; the {len(shown)} busiest queues are plotted.</p>",
        _series_plot("Messages in per second", "msg/s", inflow),
        _series_plot("Messages out per second", "msg/s", outflow),
        _series_plot("Backlog (messages waiting, time-weighted average of each window)", "messages", backlog),
        _series_plot("Link availability (share of the time Operational)", "%", availability),
        _table(
            "Backlog alerts",
            results["backlog_alerts"],
            ["window_start", "router", "queue", "streak", "backlog_last", "backlog_growth"],
        ),
        _table(
            "Slowest consumers",
            results["slowest_consumers"],
            ["router", "queue", "in_rate", "out_rate", "consumed_share", "backlog"],
        ),
        _table("Busiest links", results["busiest_links"], ["router", "link", "messages_per_second"]),
        _table("Route changes", results["route_changes"], ["window_start", "router", "kind", "changes"]),
    ]
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    )
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>Martinet metrics</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>",
        encoding="utf-8",
    )
    return path
