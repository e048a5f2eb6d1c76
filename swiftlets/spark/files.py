"""Writing rows as files Spark's file source can read while they are written, and retention.

Everything here blocks (disk I/O, encoding) and runs in a worker thread
(``trio.to_thread.run_sync`` from the swiftlet's pool); it touches nothing of the router.

A file is complete when it appears: it is written under a hidden name (``.part-….tmp``: Spark's
file source ignores names starting with ``.`` or ``_``), flushed and fsynced, then renamed into
place with :func:`os.replace`, which is atomic within a folder. A reader racing the writer
sees either no file or the whole file. Names are ``part-<first ms>-<epoch>-<first seq>.<ext>``,
unique per router and ordered by time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from .api import TABLES, iso_time, partition
from .config import FileFormat

__all__ = ["write_tables", "enforce_retention"]


def _arrow_schema(columns: tuple[tuple[str, str], ...]):  # pyarrow is optional: imported when used
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "timestamp": pa.timestamp("ms", tz="UTC"),
        "double": pa.float64(),
        "long": pa.int64(),
    }
    return pa.schema([(name, types[kind]) for name, kind in columns])


def _write_parquet(path: Path, columns: tuple[tuple[str, str], ...], rows: list[tuple]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _arrow_schema(columns)
    table = pa.table({name: [row[i] for row in rows] for i, (name, _) in enumerate(columns)}, schema=schema)
    with open(path, "wb") as file:
        pq.write_table(table, file, compression="snappy")
        file.flush()
        os.fsync(file.fileno())


def _write_jsonl(path: Path, columns: tuple[tuple[str, str], ...], rows: list[tuple]) -> None:
    names = [name for name, _ in columns]
    times = [i for i, (_, kind) in enumerate(columns) if kind == "timestamp"]
    with open(path, "w", encoding="utf-8") as file:
        for row in rows:
            values = list(row)
            for i in times:
                values[i] = iso_time(values[i])
            file.write(json.dumps(dict(zip(names, values, strict=True)), separators=(",", ":")) + "\n")
        file.flush()
        os.fsync(file.fileno())


def write_tables(folder: str, file_format: FileFormat, tables: dict[str, list[tuple]]) -> tuple[int, int]:
    """Write ``tables`` (``rows``/``events`` → table tuples, time in ms) below ``folder``, one
    file per table and partition, each atomically renamed into place. Returns (files, bytes).

    Raises:
        OSError: the disk refused (files already renamed stay; nothing partial is left).
    """
    files = size = 0
    write = _write_parquet if file_format is FileFormat.PARQUET else _write_jsonl
    for table, rows in tables.items():
        columns = TABLES[table]
        parts: dict[tuple[str, int], list[tuple]] = {}
        for row in rows:  # column 0 is the router, 1 the time, the last two epoch and seq
            parts.setdefault((row[0], row[1] // 86_400_000), []).append(row)  # router and UTC day: named once
        for (router, _day), part in parts.items():
            target = Path(folder, partition(table, part[0][1], router))
            target.mkdir(parents=True, exist_ok=True)
            first = part[0]
            name = f"part-{first[1]}-{first[-2]}-{first[-1]}.{file_format.value}"
            temporary = target / f".{name}.tmp"
            try:
                write(temporary, columns, part)
                os.replace(temporary, target / name)
            finally:
                temporary.unlink(missing_ok=True)
            files += 1
            size += (target / name).stat().st_size
    return files, size


def _data_files(folder: str) -> Iterable[Path]:
    for table in TABLES:
        for root, _dirs, names in os.walk(Path(folder, table)):
            for name in names:
                if name.startswith("part-"):
                    yield Path(root, name)


def enforce_retention(folder: str, max_age_ms: int, max_bytes: int) -> int:
    """Delete files older than ``max_age_ms`` (by modification time), then the oldest files
    while all of them take more than ``max_bytes`` (-1: no limit), and partition folders left
    empty. Returns the number of files deleted."""
    if max_age_ms < 0 and max_bytes < 0:
        return 0
    files = sorted((path.stat().st_mtime, path.stat().st_size, path) for path in _data_files(folder))
    deleted = 0
    now = time.time()
    total = sum(size for _, size, _ in files)
    for mtime, size, path in files:
        too_old = max_age_ms >= 0 and (now - mtime) * 1000 > max_age_ms
        too_big = max_bytes >= 0 and total > max_bytes
        if not (too_old or too_big):
            break
        path.unlink(missing_ok=True)
        total -= size
        deleted += 1
        for parent in (path.parent, path.parent.parent):
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
    return deleted
