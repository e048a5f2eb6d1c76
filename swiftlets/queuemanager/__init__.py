"""``sys$queuemanager``: local queues with persistence, consumers, transactions, expiry,
dead letters, duplicate detection and flow control.

Other swiftlets use ``context.lookup("sys$queuemanager")``, a
:class:`~.manager.QueueManager`: ``queue(address)``, ``send(address, message)``,
``transaction()``, ``create_temporary_queue(owner)``, ``add_redirection(...)``,
``prepared_transactions()`` / ``resolve_prepared(xid, commit=…)``; a queue's
``consumer(selector)`` and ``browse(selector)``. Needs ``sys$store`` started before it.

Usage: ``/sys$queuemanager/usage/queues/<name>`` (messages, available, enqueued, dequeued,
expired, dead-lettered, duplicates-dropped, consumers, send-rate, receive-rate).
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl

from .config import QueueManagerConfig
from .manager import MessageTooLarge, QueueManager, QueueNotFound, SendResult, Transaction, TransactionError
from .queue import Consumer, ConsumerRefused, Entry, Queue, QueueError, QueueFull

__all__ = [
    "QueueManager", "Transaction", "SendResult", "Queue", "Consumer", "Entry",
    "QueueError", "QueueNotFound", "QueueFull", "MessageTooLarge", "ConsumerRefused", "TransactionError",
]


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$queuemanager",
            description="Local queues: persistence, consumers, transactions, expiry, dead letters.",
            config=QueueManagerConfig,
            factory=QueueManager,
        )
    ]
