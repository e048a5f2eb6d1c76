"""``sys$queuemanager``: local queues with persistence, consumers, transactions, expiry,
dead letters, duplicate detection and flow control.

Other swiftlets use ``context.lookup("sys$queuemanager", QueueManager)`` with the protocol
from :mod:`.api` (queues, sends, consumers, transactions, redirections, prepared
transactions) and import nothing else of it. Needs ``sys$store`` started before it.

Layout: :mod:`.config` (queues, controllers, limits), :mod:`.api` (the public interface),
:mod:`.budget` (room for queues made on demand), :mod:`.memory` (the router's memory
budget and its alarm), :mod:`.manager` (sending, and the parts below), :mod:`.names`
(addresses and redirections), :mod:`.catalogue` (the queues by name),
:mod:`.persistence` (deferred writes and read-backs), :mod:`.deadletters` (routerdlq),
:mod:`.transactions` (local and prepared transactions), :mod:`.recovery` (rebuilt from
the store at start), :mod:`.queue` (one queue: priorities, outcomes, expiry, usage; its
counts and limits in :mod:`.state`, its cache in :mod:`.paging`, consumers and credit in
:mod:`.dispatch` and :mod:`.consumer`, its entries in :mod:`.entry`, flow control in
:mod:`.flow`), :mod:`.jobs` (the jobs it offers ``sys$scheduler``: purger, cleanup,
cleanup to routerdlq, mover).

Usage: ``/sys$queuemanager/usage/queues/<name>`` (messages, available, enqueued, dequeued,
expired, dead-lettered, duplicates-dropped, consumers, send-rate, receive-rate, memory);
``/sys$queuemanager/usage`` has the memory budget's figures (memory-used, memory-alarm, …).
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import QueueManagerConfig
    from .manager import QueueManager

    return [
        SwiftletSpec(
            name="sys$queuemanager",
            description="Local queues: persistence, consumers, transactions, expiry, dead letters.",
            config=QueueManagerConfig,
            factory=QueueManager,
        )
    ]


@hookimpl
def martinet_scheduler_jobs() -> list:
    from .jobs import QUEUE_JOBS

    return [QUEUE_JOBS]  # see .jobs
