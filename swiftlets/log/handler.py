"""The running ``sys$log``: a rotating file handler that takes only this router's records.

Theory of operation
-------------------
Every log record carries the name of the router it was logged for (the ``router`` tag,
see :mod:`kernel.logs`). :class:`LogSwiftlet` adds one :class:`logging.handlers.RotatingFileHandler`
to the root logger, filtered to its own router's records, so several routers in one
process keep separate files; the filter also counts the records by level for usage. The
root logger's level is lowered when a file wants more than the console does (the
console handler keeps its own level). The root logger is the process's, shared by every
router in it: its level is the lowest that the running routers' files want, and goes back
to what it was when the last of them stops (:class:`_RootLevel`). The handler is removed
and closed when the swiftlet stops.
"""

from __future__ import annotations

import logging
import logging.handlers
from collections import Counter
from typing import Any

import trio

from martinet.kernel import Change, SwiftletContext
from martinet.kernel.logs import FORMAT

from .config import LEVELS

__all__ = ["LogSwiftlet"]


class _RouterFilter(logging.Filter):
    """Passes the records of one router and counts them by level."""

    def __init__(self, router: str):
        super().__init__()
        self.router = router
        self.counts: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "router", None) != self.router:
            return False
        self.counts[record.levelname] += 1
        return True


class _RootLevel:
    """The root logger's level while ``sys$log`` files of this process's routers want it
    lower: one instance per process, as the root logger it manages."""

    def __init__(self) -> None:
        self._wanted: dict[logging.Handler, int] = {}  # each running file and its level
        self._before = logging.NOTSET  # the root's level before the first file lowered it

    def want(self, handler: logging.Handler, level: int | None) -> None:
        """``handler`` wants records from ``level`` on (None: it is gone); set the root's level."""
        root = logging.getLogger()
        if not self._wanted:
            self._before = root.level
        if level is None:
            self._wanted.pop(handler, None)
        else:
            self._wanted[handler] = level
        root.setLevel(min(self._before, *self._wanted.values()) if self._wanted else self._before)


_root_level = _RootLevel()


class LogSwiftlet:
    """``sys$log``: adds the router's file handler while it runs."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self._filter = _RouterFilter(context.router_name)
        self._handler: logging.Handler | None = None

    def _on_change(self, change: Change) -> None:
        if change.field == "level" and self._handler is not None:
            self._apply_level(self._handler, change.new)

    @staticmethod
    def _apply_level(handler: logging.Handler, level: str) -> None:
        handler.setLevel(level)
        # The root logger must let the records through for the file to see them; the
        # console handler keeps its own level (see kernel.logs.configure_logging).
        _root_level.want(handler, handler.level)

    def _usage(self) -> dict[str, Any]:
        counts = self._filter.counts
        return {
            "logfile": self.context.config.logfile,
            **{f"{level.lower()}-records": counts[level] for level in LEVELS},
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.context.config
        root = logging.getLogger()
        if config.logfile:
            # Opening the file may raise OSError: the start fails with that cause.
            handler = logging.handlers.RotatingFileHandler(
                config.logfile,
                maxBytes=config.logfile_max_size * 1024,
                backupCount=config.number_old_logfiles,
                encoding="utf-8",
            )
            handler.setFormatter(logging.Formatter(FORMAT))
            handler.addFilter(self._filter)
            self._apply_level(handler, config.level)
            self._handler = handler
            root.addHandler(handler)
        self.context.entity.on_change(self._on_change)
        self.context.usage.provide(self._usage)
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            if self._handler is not None:
                root.removeHandler(self._handler)
                self._handler.close()
                _root_level.want(self._handler, None)
