"""Logging tagged with the router name.

Every log record gets a ``router`` attribute: the name of the router whose task emitted it
(``-`` outside any router). The name travels in a context variable that
:class:`kernel.router.Router` sets in its ``run``; trio copies context variables into every
task a router's tasks start (and ``trio.to_thread`` into threads), so records from
swiftlets, pools and libraries they call are tagged without passing loggers around —
which also keeps several routers in one process apart.

Records also carry ``record.component``: the logger's name without the ``martinet.``
namespace every module of ours lives in (``kernel.router``, ``swiftlets.jms.listener``),
which is what a log line shows.
"""

from __future__ import annotations

import contextvars
import logging
import sys

__all__ = ["current_router", "install_record_factory", "configure_logging", "FORMAT"]

current_router: contextvars.ContextVar[str] = contextvars.ContextVar("martinet_router", default="-")

FORMAT = "%(asctime)s %(levelname)-7s [%(router)s] %(component)s: %(message)s"


def install_record_factory() -> None:
    """Make every log record carry ``record.router`` and ``record.component``; idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "martinet", False):
        return

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.router = current_router.get()
        record.component = record.name.removeprefix("martinet.")
        return record

    factory.martinet = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def configure_logging(level: str = "INFO") -> None:
    """Log to stderr in :data:`FORMAT` at ``level`` (a logging level name)."""
    install_record_factory()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(level.upper())  # a swiftlet may lower the root level for its own handler
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
