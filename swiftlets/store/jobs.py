"""The store's scheduler jobs (group ``Store``), offered through the hook
``martinet_scheduler_jobs``:

- **Backup** — a consistent online copy of the store's database into ``Folder`` (relative to
  the directory the router was started in), named ``<router>-<yyyyMMdd-HHmmss>.sqlite``,
  keeping the newest ``Generations`` copies of this router there. The copy is taken by the
  store process between two group commits, so it holds every commit confirmed before it and
  nothing half. To restore: stop the router and copy a backup over ``<path>/<router>.sqlite``
  (its marker ``<router>.sqlite.store-id`` stays as it is: the copy has the same store id).
- **Vacuum** — rebuilds the database so that the space of deleted messages goes back to the
  file system (commits wait while it runs: schedule it at a quiet hour).
"""

from __future__ import annotations

import time
from pathlib import Path

from martinet.swiftlets.scheduler.api import Job, JobError, JobGroup, JobParameter, JobRun

from .api import StoreError

__all__ = ["STORE_JOBS"]


def _generations(text: str) -> None:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a whole number of copies, at least 1, found {text!r}")


async def backup(run: JobRun) -> str:
    store = run.swiftlet
    folder = Path(run.parameters["Folder"]).absolute()
    keep = int(run.parameters["Generations"])
    stem = store.database.stem
    target = folder / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.sqlite"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        size = await store.backup(target)
    except OSError as exc:
        raise JobError(f"cannot write to {folder}: {exc.strerror}") from None
    except StoreError as exc:
        raise JobError(str(exc)) from None
    copies = sorted(folder.glob(f"{stem}-????????-??????.sqlite"))
    for old in copies[:-keep]:
        old.unlink()
    return f"{target} ({size} bytes); {min(len(copies), keep)} kept"


async def vacuum(run: JobRun) -> str:
    try:
        return f"{await run.swiftlet.vacuum()} bytes freed"
    except StoreError as exc:
        raise JobError(str(exc)) from None


STORE_JOBS = JobGroup(
    name="Store",
    swiftlet="sys$store",
    jobs=[
        Job(
            name="Backup",
            run=backup,
            description="A consistent online copy of the store's database into a folder, "
            "keeping the newest generations.",
            parameters=[
                JobParameter(name="Folder", description="Where the copies go (created if missing)."),
                JobParameter(
                    name="Generations",
                    description="How many copies of this router to keep.",
                    default="3",
                    check=_generations,
                ),
            ],
        ),
        Job(name="Vacuum", run=vacuum, description="Gives the space of deleted messages back to the file system."),
    ],
)
