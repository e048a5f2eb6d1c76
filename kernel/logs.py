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
import time

__all__ = ["current_router", "install_record_factory", "configure_logging", "FORMAT", "HostLimitedLog"]

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


class HostLimitedLog:
    """Log lines about what a peer did, limited per host: what a peer can repeat at will
    (broken input, refused handshakes, refused transfers) must not write a line per try.
    One line each (``line % (what, host, reason)``, the reason on one line, never a
    traceback), at most :attr:`LIMIT` per host per :attr:`PERIOD` seconds; beyond that they
    are counted, and the count is logged in one line (``counted % host``) when the host's
    next period starts."""

    LIMIT = 10
    PERIOD = 60.0
    HOSTS = 1024  # hosts remembered; the oldest periods are forgotten beyond that

    def __init__(self, logger: logging.Logger, line: str, counted: str, level: int = logging.WARNING) -> None:
        self._periods: dict[str, list[float]] = {}  # host -> [period start, lines logged, lines suppressed]
        self._log, self._line, self._counted, self._level = logger, line, counted, level

    def warn(self, host: str, what: str, reason: object) -> None:
        now = time.monotonic()
        period = self._periods.get(host)
        if period is None or now - period[0] >= self.PERIOD:
            if period is not None and period[2]:
                self._log.log(
                    self._level,
                    "%d more %s in %.0f s (not logged one by one)",
                    period[2],
                    self._counted % host,
                    now - period[0],
                )
            if period is None and len(self._periods) >= self.HOSTS:
                for old in sorted(self._periods, key=lambda key: self._periods[key][0])[: self.HOSTS // 4]:
                    del self._periods[old]
            period = self._periods[host] = [now, 0, 0]
        if period[1] < self.LIMIT:
            period[1] += 1
            text = " ".join(str(reason).split())  # one line, whatever the peer put in it
            self._log.log(self._level, self._line, what, host, text[:300])
        else:
            period[2] += 1
