"""The export's public interface: the row schemas, the metrics-topic wire format, the layout of
the files. The pipeline (``martinet.pipeline``) and any other reader use only what is here;
docs/metrics.md describes the same for people.

Two tables, each row keyed by ``(router, epoch, seq)``:

- **rows** — one sampled value: ``router, time, swiftlet, entity, metric, value, text,
  epoch, seq``. ``value`` holds numbers (booleans as 0/1), ``text`` strings (``value`` then
  null). ``entity`` is the path below the swiftlet's usage (``queues/orders``, ``''`` for
  the swiftlet's own usage).
- **events** — one bus event: ``router, time, swiftlet, kind, entity, fields, epoch, seq``.
  ``kind`` is the event class (``LinkStateChanged``) or ``UsageAdded``/``UsageRemoved`` for an
  entry of a usage list that appeared or went between two samples (e.g. an in-doubt
  transaction of ``sys$xa``); ``entity`` is the event's first field (the link, the router,
  the schedule, the usage path); ``fields`` every field as a JSON object.

``epoch`` is the millisecond the router's export started and ``seq`` counts rows and events
of that epoch from 1, in the order they were made: a key is unique, and a reader that keeps
the highest ``(epoch, seq)`` per router knows exactly what it has seen (the live source's
offsets, duplicate removal after a collector's redelivery).

On the topic, one message (persistent, a data section of JSON) carries rows and events of
one router: ``{"router", "epoch", "rows": [[time, swiftlet, entity, metric, value, text,
seq], …], "events": [[time, swiftlet, kind, entity, fields, seq], …]}`` (time in ms). Its
application properties ``router`` (string), ``epoch`` and ``seq`` (longs: the highest ``seq``
of its rows and events) say the same without decoding the body, for readers that place a
message by its key (the live source's driver) and for selectors (``router = 'paris'``).
"""

from __future__ import annotations

import json
import time as _time
from itertools import repeat
from typing import Any

__all__ = ["ROW_COLUMNS", "EVENT_COLUMNS", "TABLES", "encode_batch", "decode_batch", "partition", "iso_time"]

#: (name, type) of the rows table; types: string, timestamp (ms, UTC), double, long.
ROW_COLUMNS = (
    ("router", "string"),
    ("time", "timestamp"),
    ("swiftlet", "string"),
    ("entity", "string"),
    ("metric", "string"),
    ("value", "double"),
    ("text", "string"),
    ("epoch", "long"),
    ("seq", "long"),
)
#: (name, type) of the events table.
EVENT_COLUMNS = (
    ("router", "string"),
    ("time", "timestamp"),
    ("swiftlet", "string"),
    ("kind", "string"),
    ("entity", "string"),
    ("fields", "string"),
    ("epoch", "long"),
    ("seq", "long"),
)
#: The tables by folder name.
TABLES = {"rows": ROW_COLUMNS, "events": EVENT_COLUMNS}


def encode_batch(router: str, epoch: int, rows: list[tuple], events: list[tuple]) -> bytes:
    """A topic message body. ``rows``/``events``: tuples in table order without router and
    epoch (time in ms)."""
    return json.dumps(
        {"router": router, "epoch": epoch, "rows": rows, "events": events}, separators=(",", ":")
    ).encode()


def decode_batch(body: bytes) -> tuple[list[tuple], list[tuple]]:
    """The rows and events of a topic message body, as full table tuples (time in ms).

    A collector decodes every row of the network, so the usual batch is checked a column at a
    time (the set of the value types of each column) and its tuples are built by ``zip``, both
    in C; a batch that fails that check goes through the row-by-row path, which names the
    first row that does not fit.

    Raises:
        ValueError: not a metrics batch.
    """
    try:
        batch = json.loads(body)
        router, epoch = str(batch["router"]), int(batch["epoch"])
        rows = _columns_zipped(router, epoch, batch["rows"], _ROW_WIRE)
        events = _columns_zipped(router, epoch, batch["events"], _EVENT_WIRE)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not a metrics batch: {exc}") from None
    if rows is None or events is None:
        return _decode_rows(batch)
    return rows, events


# The wire row of each table: its columns without router and epoch, seq last (as encode_batch
# writes them), and the exact types JSON gives each column's values (bool is not a number).
_WIRE_TYPES = {
    "string": frozenset((str, type(None))),
    "timestamp": frozenset((int,)),
    "double": frozenset((int, float, type(None))),
    "long": frozenset((int,)),
}
_ROW_WIRE = tuple(_WIRE_TYPES[kind] for _, kind in (*ROW_COLUMNS[1:7], ROW_COLUMNS[8]))
_EVENT_WIRE = tuple(_WIRE_TYPES[kind] for _, kind in (*EVENT_COLUMNS[1:6], EVENT_COLUMNS[7]))


def _columns_zipped(router: str, epoch: int, wire: Any, types: tuple[frozenset, ...]) -> list[tuple] | None:
    """The table tuples of wire rows whose every column holds only its types, or None (some
    value does not fit: the row-by-row path says which). Like that path, a wire row may be
    longer than the table needs (the rest is ignored), not shorter."""
    if not isinstance(wire, list):
        return None
    if not wire:
        return []
    width = len(types)
    try:
        if min(map(len, wire)) < width:
            return None
        columns = list(zip(*wire, strict=False))[:width]
    except TypeError:  # a row without a length or not iterable
        return None
    if not all(set(map(type, column)) <= allowed for column, allowed in zip(columns, types, strict=True)):
        return None
    count = len(wire)
    return list(zip(repeat(router, count), *columns[:-1], repeat(epoch, count), columns[-1], strict=True))


def _decode_rows(batch: Any) -> tuple[list[tuple], list[tuple]]:
    """Row by row, naming the first row that does not fit (:func:`decode_batch`'s errors)."""
    try:
        router, epoch = str(batch["router"]), int(batch["epoch"])
        rows = [(router, *row[:6], epoch, row[6]) for row in batch["rows"]]
        events = [(router, *event[:5], epoch, event[5]) for event in batch["events"]]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not a metrics batch: {exc}") from None
    for table, columns in ((rows, ROW_COLUMNS), (events, EVENT_COLUMNS)):
        for row in table:
            if len(row) != len(columns) or not all(
                _fits(value, kind) for value, (_, kind) in zip(row, columns, strict=True)
            ):
                raise ValueError(f"not a metrics batch: {row!r:.200} does not fit {[kind for _, kind in columns]}")
    return rows, events


_TYPES = {"string": (str, type(None)), "timestamp": (int,), "double": (int, float, type(None)), "long": (int,)}


def _fits(value: Any, kind: str) -> bool:
    return isinstance(value, _TYPES[kind]) and not isinstance(value, bool)


def partition(table: str, time_ms: int, router: str) -> str:
    """The folder of a row below the export folder: ``rows/date=2026-11-26/router=paris``."""
    return f"{table}/date={_time.strftime('%Y-%m-%d', _time.gmtime(time_ms / 1000))}/router={router}"


def iso_time(time_ms: int) -> str:
    """``2026-11-26T14:39:21.123Z``, the time as the JSON-lines files write it."""
    seconds, millis = divmod(int(time_ms), 1000)
    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(seconds)) + f".{millis:03d}Z"
