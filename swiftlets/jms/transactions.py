"""A client connection's AMQP transactions [4]: the coordinator link and the open transactions.

Theory of operation
-------------------
A client declares a transaction on its :class:`CoordinatorLink`; :class:`Transactions`
opens one of the queue manager's and names it ``txn-<n>``. Transfers and outcomes that
carry its id are staged in it (:class:`.links.IncomingLink`, :class:`.links.OutgoingLink`);
``discharge`` commits or rolls it back in a task of the connection's driver (the store is
awaited) and answers then. A lost connection rolls back what is still open.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from martinet.messaging import amqp
from martinet.messaging.amqp import ACCEPTED, DECLARE, DECLARED, DISCHARGE
from martinet.messaging.codec import DecodeError
from martinet.messaging.message import Message, MessageError
from martinet.swiftlets.queuemanager.api import QueueError, Transaction
from martinet.swiftlets.store.api import StoreError

from .access import Refused
from .links import condition_of, rejected

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["CoordinatorLink", "Transactions"]

log = logging.getLogger(__name__)


class Transactions:
    """The open transactions of one connection, by txn-id."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection
        self.open: dict[bytes, Transaction] = {}
        self._ids = itertools.count(1)

    def declare(self) -> bytes:
        txn_id = f"txn-{next(self._ids)}".encode()
        self.open[txn_id] = self.connection.queue_manager.transaction()
        return txn_id

    def get(self, txn_id: bytes | None) -> Transaction:
        """The open transaction ``txn_id`` names; a missing id (a transfer's state without
        one) is refused as an unknown one."""
        transaction = None if txn_id is None else self.open.get(txn_id)
        if transaction is None:
            raise Refused("amqp:transaction:unknown-id", f"unknown transaction {txn_id!r}")
        return transaction

    def discharge(self, link: amqp.Link, delivery_id: int, txn_id: bytes, fail: bool) -> None:
        transaction = self.get(txn_id)
        del self.open[txn_id]
        driver = self.connection.driver
        assert driver is not None  # a discharge arrives while the driver runs
        driver.start_soon(self._finish, link, delivery_id, transaction, fail)

    async def _finish(self, link: amqp.Link, delivery_id: int, transaction: Transaction, fail: bool) -> None:
        """Commit or roll back (the store is awaited), then answer the discharge."""
        connection = self.connection
        try:
            await (transaction.rollback() if fail else transaction.commit())
        except (QueueError, StoreError) as exc:
            log.warning("transaction commit failed: %s", exc)
            if not connection.closed:
                link.settle(delivery_id, rejected("amqp:transaction:rollback", str(exc)))
        else:
            if not connection.closed:
                link.settle(delivery_id, ACCEPTED)
        connection.wake()

    def rollback_all(self) -> None:
        """The connection is lost: what is open rolls back."""
        for transaction in self.open.values():
            transaction.rollback_nowait()
        self.open.clear()


class CoordinatorLink:
    """The transaction coordinator [4.2]: ``declare`` opens a transaction and answers
    ``declared`` with its id; ``discharge`` commits or rolls it back, answering accepted —
    or rejected with ``amqp:transaction:rollback`` if the commit failed."""

    def __init__(self, connection: AmqpConnection, link: amqp.Link):
        self.connection = connection
        self.link = link

    def start(self) -> None:
        self.link.flow(100)

    def on_transfer(self, delivery_id: int, data: bytes, remotely_settled: bool, state: Any) -> None:
        connection, link = self.connection, self.link
        try:
            control = Message(data).body()
            kind = amqp.descriptor_code(getattr(control, "descriptor", None))
            fields = getattr(control, "value", None)
            fields = fields if isinstance(fields, list) else []
            if kind == DECLARE:
                link.settle(delivery_id, amqp.outcome(DECLARED, connection.transactions.declare()))
            elif kind == DISCHARGE and fields and isinstance(fields[0], bytes):  # txn-id: binary [4.5.3]
                connection.transactions.discharge(
                    link, delivery_id, fields[0], bool(fields[1]) if len(fields) > 1 else False
                )
            else:
                raise Refused("amqp:invalid-field", f"not a declare or discharge: {control!r}"[:200])
        except (Refused, MessageError, DecodeError) as exc:
            link.settle(delivery_id, rejected(condition_of(exc), str(exc)))
        if link.credit < 50:
            link.flow(100)
        connection.wake()

    def close(self) -> None:
        pass
