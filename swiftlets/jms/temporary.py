"""A client connection's temporary queues and topics (dynamic sources and targets).

Theory of operation
-------------------
A dynamic source or target makes a temporary destination that lives as long as the link.
A temporary queue's address, as the client is given it, is ``tmp$<n>@<this router>``: a
reply-to that leads back here from other routers. A temporary topic is named
``tmp$topic$<router>$<n>`` by the swiftlet, unique in the network. The connection's live
temporary queues count towards its ``max-auto-created-queues-per-connection``
(:meth:`.addresses.Addresses.may_create`); across connections the queue manager counts
each for the user and address (:class:`Creator`), while one of a user in one of
sys$mgmt's groups uses the router's reserve, so that management's own client is served
when the clients' room is used up. What the connection still has when it ends goes with
it (``QueueManager.delete_temporary_queues``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from martinet.messaging import amqp
from martinet.swiftlets.queuemanager.api import Creator, Queue

from .access import Refused
from .links import IncomingLink

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["TemporaryQueues"]


class TemporaryQueues:
    """The temporary queues of one connection, counted while they live."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection
        self.alive = 0  # its temporary queues alive now

    def create(self) -> Queue:
        """A temporary queue of this connection, counted until :meth:`delete`.

        Raises:
            Refused: ``max-auto-created-queues-per-connection`` is reached.
            TooManyQueues: ``max-queues`` is reached.
        """
        connection = self.connection
        connection.addresses.may_create("tmp$<n>")
        queue = connection.queue_manager.create_temporary_queue(connection, self.creator())
        self.alive += 1
        return queue

    def creator(self) -> Creator:
        """Whom a temporary queue of this connection counts for: the router's reserve for a
        user of one of sys$mgmt's groups (its management client needs a reply queue when
        the clients have used their room), else this connection's user and address."""
        connection = self.connection
        group = getattr(connection.principal, "group", "") if connection.authenticated else ""
        if group and connection.swiftlet.manages(group):
            return attrs.evolve(connection.creator, reserved=True)
        return connection.creator

    def address(self, name: str) -> str:
        """The address a client is given for its temporary queue ``name``: ``tmp$…@<router>``,
        so that as a reply-to it reaches this router from any other (the queue manager takes
        ``name@<this router>`` as ``name``)."""
        return f"{name}@{self.connection.swiftlet.router_name}"

    def delete(self, name: str) -> None:
        """A temporary queue goes with its link (unless the connection's end took it already)."""
        self.alive -= 1
        queue_manager = self.connection.queue_manager
        if name in queue_manager.queues:
            queue_manager.delete_queue(name)

    def destination(self, link: amqp.Link, target: amqp.Terminus) -> IncomingLink:
        """The temporary destination of a dynamic ``target`` (``link``'s target)."""
        connection = self.connection
        if "temporary-topic" in target.capabilities:
            if connection.topic_manager is None:
                raise Refused("amqp:not-found", "topics are not available: sys$topicmanager is not running")
            name = connection.swiftlet.temporary_topic_name()
            target.address = name
            return IncomingLink(connection, link, name, True)
        queue = self.create()
        target.address = self.address(queue.name)
        return IncomingLink(connection, link, queue.name, False, on_close=lambda: self.delete(queue.name))
