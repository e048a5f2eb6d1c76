"""``sys$log``: the router's log file.

Writes the records of *this* router (by the ``router`` tag every record carries, see
:mod:`kernel.logs`) to a size-rotated file, so several routers in one process keep
separate files. Console output is the ``martinet run --log-level`` option's business; this
swiftlet adds the persistent file. ``level`` can change at runtime; the file settings
take effect at the next start.

Usage: ``/sys$log/usage`` counts the records written, by level.
"""

from __future__ import annotations

import logging
import logging.handlers
from collections import Counter
from typing import Any

import trio

from martinet.kernel import Change, SwiftletContext, SwiftletSpec, config_class, hookimpl, prop
from martinet.kernel.logs import FORMAT

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@config_class
class LogConfig:
    level: str = prop("INFO", choices=LEVELS, description="Lowest level written to the log file.")
    logfile: str = prop(
        "",
        reboot_required=True,
        description="Log file of this router; empty for none. A relative path is resolved "
        "against the directory the router was started in.",
    )
    logfile_max_size: int = prop(
        10_240, min=1, max=10_485_760, reboot_required=True,
        description="Size in KB at which the log file is rotated.",
    )
    number_old_logfiles: int = prop(
        10, min=0, max=1000, reboot_required=True,
        description="Rotated log files kept (logfile.1 is the newest).",
    )


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


class LogSwiftlet:
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
        root = logging.getLogger()
        # The root logger must let the records through for the file to see them; the
        # console handler keeps its own level (see kernel.logs.configure_logging).
        if root.getEffectiveLevel() > handler.level:
            root.setLevel(handler.level)

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


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$log",
            description="Writes this router's log records to a rotating log file.",
            config=LogConfig,
            factory=LogSwiftlet,
        )
    ]
