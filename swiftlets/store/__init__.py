"""``sys$store``: persistence for messages, prepared transactions, durable subscriptions
and duplicate-detection backlogs.

Other swiftlets use it through :mod:`.api` only (``context.lookup("sys$store", Store)``);
the backend today is SQLite (:mod:`.sqlite`, in a store process of its own, :mod:`.dbprocess`),
run by :mod:`.swiftlet`; :mod:`.config` is its configuration; :mod:`.jobs` the Backup and
Vacuum jobs it offers ``sys$scheduler``.

Usage: ``/sys$store/usage`` shows transactions (group commits), fsyncs, operations, the
insert/delete pairs that never reached the disk, the largest batch and pending operations.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import StoreConfig
    from .swiftlet import StoreSwiftlet

    return [
        SwiftletSpec(
            name="sys$store",
            description="Persistent messages, prepared transactions, durable subscriptions (SQLite, WAL).",
            config=StoreConfig,
            factory=StoreSwiftlet,
        )
    ]


@hookimpl
def martinet_scheduler_jobs() -> list:
    from .jobs import STORE_JOBS

    return [STORE_JOBS]  # see .jobs
