"""The live source's replay folder: each micro-batch's messages, as files, until Spark commits it.

A batch is a folder ``<sha1 of (start, end)>/`` holding ``batch.json`` (its start and end
offsets) and ``part-<k>`` files, one per Spark partition: the raw bodies of the batch's
metrics messages (each a 4-byte big-endian length, then the body). It appears complete or not
at all (written under a hidden name, then renamed). The driver writes it before it hands the
batch's end offset to Spark; executors read one part each, on any host that sees the folder;
the commit of a later offset deletes it. A batch the source kept before it was partitioned
(``<sha1>.json``: the batch's rows) is replayed and deleted too. Nothing here knows AMQP or
Spark.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "Key",
    "Marks",
    "marks",
    "offset",
    "write_batch",
    "batch_parts",
    "bodies",
    "legacy_rows",
    "delete_committed",
]

Key = tuple[int, int]  # (epoch, seq)
Marks = dict[str, Key]  # per router, the highest key
NOTHING: Key = (-1, -1)
_LENGTH = struct.Struct(">I")


def marks(offset_: dict) -> Marks:
    """An offset's keys by router."""
    return {router: (mark["epoch"], mark["seq"]) for router, mark in offset_.get("routers", {}).items()}


def offset(marks_: Marks) -> dict:
    """Offsets compare as JSON text inside Spark: always sorted."""
    return {"routers": {router: {"epoch": marks_[router][0], "seq": marks_[router][1]} for router in sorted(marks_)}}


def _name(start: dict, end: dict) -> str:
    normal = [offset(marks(start)), offset(marks(end))]
    return hashlib.sha1(json.dumps(normal, sort_keys=True).encode()).hexdigest()


def write_batch(folder: Path, start: dict, end: dict, parts: Sequence[Sequence[bytes]]) -> None:
    """Store the batch ``(start, end]`` as ``parts`` (the bodies of each part), complete or not
    at all. The same batch written again (its earlier writer was killed before Spark logged
    it) replaces the earlier one."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / _name(start, end)
    temporary = folder / ("." + target.name)
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    for number, part in enumerate(parts):
        with (temporary / f"part-{number:04d}").open("wb") as file:
            for body in part:
                file.write(_LENGTH.pack(len(body)))
                file.write(body)
    (temporary / "batch.json").write_text(json.dumps({"start": start, "end": end}))
    if target.exists():  # written but never logged by Spark: nothing reads it
        shutil.rmtree(target)
    os.replace(temporary, target)


def batch_parts(folder: Path, start: dict, end: dict) -> list[Path]:
    """The part files of the batch ``(start, end]``.

    Raises:
        RuntimeError: the batch is not in ``folder``.
    """
    batch = folder / _name(start, end)
    if not batch.is_dir():
        legacy = folder / (hashlib.sha1(json.dumps([start, end]).encode()).hexdigest() + ".json")
        if legacy.is_file():  # kept by the source before it was partitioned: the batch's rows
            return [legacy]
        raise RuntimeError(
            f"martinet source: cannot replay the batch up to {end}: {batch} is missing "
            "(replay-folder must be the one of the query's earlier runs)"
        )
    return sorted(batch.glob("part-*"))


def legacy_rows(path: Path) -> list[list]:
    """The rows of a batch the source kept before it was partitioned (``{"end", "rows"}``,
    time in ms), already those of the batch and its table."""
    rows: list[list] = json.loads(path.read_text())["rows"]
    return rows


def bodies(path: Path) -> Iterator[bytes]:
    """The message bodies of a part file.

    Raises:
        RuntimeError: the file is missing (the replay folder is not shared with this host).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RuntimeError(
            f"martinet source: {path} is missing here (on a cluster, replay-folder must be on "
            "storage every executor sees, like the checkpoint)"
        ) from None
    position = 0
    while position < len(data):
        (length,) = _LENGTH.unpack_from(data, position)
        position += _LENGTH.size
        yield data[position : position + length]
        position += length


def delete_committed(folder: Path, end: dict) -> None:
    """Delete the batches up to ``end`` (Spark committed them: never replayed) and what a killed
    writer left half written."""
    committed = marks(end)
    if not folder.is_dir():
        return
    for batch in folder.iterdir():
        if batch.name.startswith("."):
            shutil.rmtree(batch, ignore_errors=True)  # a writer killed before its rename
            continue
        try:
            stored = batch / "batch.json" if batch.is_dir() else batch  # (or a legacy batch's rows)
            mark = marks(json.loads(stored.read_text())["end"])
        except (FileNotFoundError, NotADirectoryError):
            continue
        if all(key <= committed.get(router, NOTHING) for router, key in mark.items()):
            if stored is batch:
                batch.unlink(missing_ok=True)
            else:
                shutil.rmtree(batch, ignore_errors=True)
