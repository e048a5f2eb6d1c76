"""``sys$store``: persistence for messages, prepared transactions, durable subscriptions
and duplicate-detection backlogs.

Other swiftlets use it through :mod:`swiftlets.store.api` only
(``store = context.lookup("sys$store")``); the backend today is SQLite
(:mod:`swiftlets.store.sqlite`).

Usage: ``/sys$store/usage`` shows transactions (group commits), fsyncs, operations, the
insert/delete pairs that never reached the disk, the largest batch and pending operations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from martinet.kernel import SwiftletContext, SwiftletSpec, config_class, hookimpl, prop

from .api import Op, Recovered
from .sqlite import SqliteStore


@config_class
class StoreConfig:
    path: str = prop(
        "store",
        reboot_required=True,
        description="Folder of the store; the database is <path>/<router name>.sqlite. A relative "
        "path is resolved against the directory the router was started in.",
    )
    sync: str = prop(
        "full",
        choices=("full", "normal", "off"),
        reboot_required=True,
        description="full: fsync every group commit (survives power loss); normal: no fsync "
        "(survives a process crash, not an OS crash); off: leave it to the OS.",
    )
    max_batch: int = prop(
        20_000, min=1, max=1_000_000,
        description="Most operations in one group commit; bounds commit latency under load.",
    )


class StoreSwiftlet:
    """The running store; the object ``context.lookup("sys$store")`` returns."""

    def __init__(self, context: SwiftletContext):
        config = context.config
        self._store = SqliteStore(
            Path(config.path) / f"{context.router_name}.sqlite",
            sync=config.sync,
            max_batch=config.max_batch,
            name=context.router_name,
        )
        self._context = context

    @property
    def recovered(self) -> Recovered:
        return self._store.recovered

    async def commit(self, ops: list[Op]) -> None:
        await self._store.commit(ops)

    def commit_nowait(self, ops: list[Op], on_done: Callable[[BaseException | None], None]) -> None:
        self._store.commit_nowait(ops, on_done)

    def _on_change(self, change: Any) -> None:
        if change.field == "max_batch":
            self._store.max_batch = change.new

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._context.usage.provide(self._store.usage)
        self._context.entity.on_change(self._on_change)
        await self._store.run(task_status=task_status)


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$store",
            description="Persistent messages, prepared transactions, durable subscriptions (SQLite, WAL).",
            config=StoreConfig,
            factory=StoreSwiftlet,
        )
    ]
