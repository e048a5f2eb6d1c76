"""The running ``sys$store``: the kernel-facing shell around the SQLite backend.

It builds the backend (:mod:`.sqlite`, which drives the engine process of :mod:`.engine`)
from the config, publishes its usage, applies runtime changes of ``max-batch``, and
offers other swiftlets the :class:`~.api.Store` protocol by delegating to the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from martinet.kernel import SwiftletContext

from .api import Op, Recovered, StoredMessage
from .space import SpaceAlarm
from .sqlite import SqliteStore

__all__ = ["StoreSwiftlet"]


class StoreSwiftlet:
    """The running store; the object ``context.lookup("sys$store", Store)`` returns."""

    def __init__(self, context: SwiftletContext):
        config = context.config
        folder = Path(config.path).absolute()  # absolute, as the start-up log line and the usage show it
        self.space = SpaceAlarm(folder, config.disk_free_limit_kb * 1024, router=context.router_name)
        self._store = SqliteStore(
            folder / f"{context.router_name}.sqlite",
            space=self.space,
            sync=config.sync,
            max_batch=config.max_batch,
            name=context.router_name,
            accept_empty=config.accept_empty_store,
        )
        self._context = context

    @property
    def recovered(self) -> Recovered:
        return self._store.recovered

    def take_recovered_messages(self) -> list[StoredMessage]:
        return self._store.take_recovered_messages()

    async def commit(self, ops: list[Op]) -> None:
        await self._store.commit(ops)

    def commit_nowait(self, ops: list[Op], on_done: Callable[[BaseException | None], None]) -> None:
        self._store.commit_nowait(ops, on_done)

    async def read_messages(self, ids: Sequence[int]) -> Mapping[int, bytes]:
        return await self._store.read_messages(ids)

    @property
    def database(self) -> Path:
        """The database file (for the Store jobs: backups are named after it)."""
        return self._store.path

    async def backup(self, target: Path) -> int:
        """A consistent online copy of the database in the file ``target``; its size.

        Raises:
            StoreError: the copy failed (the store goes on).
        """
        return await self._store.maintain(["backup", str(target)])

    async def vacuum(self) -> int:
        """Give the database's free pages back to the file system; the bytes freed.

        Raises:
            StoreError: the vacuum failed (the store goes on).
        """
        return await self._store.maintain(["vacuum"])

    def _on_change(self, change: Any) -> None:
        if change.field == "max_batch":
            self._store.max_batch = change.new
        elif change.field == "disk_free_limit_kb":
            self.space.set_limit(change.new * 1024)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._context.usage.provide(lambda: self._store.usage() | self.space.usage())
        self._context.entity.on_change(self._on_change)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._store.run)
            # the interval is read at each round: a changed disk-check-interval applies from the next
            await nursery.start(self._watch_space)
            task_status.started()

    async def _watch_space(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.space.folder.mkdir(parents=True, exist_ok=True)
        await self.space.check()
        task_status.started()
        while True:
            await trio.sleep(self._context.config.disk_check_interval / 1000)
            await self.space.check()
