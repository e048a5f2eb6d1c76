"""The addresses a client connection uses: checked by the access policy, then looked up or created.

Theory of operation
-------------------
:class:`Addresses` applies :mod:`.access` for one connection: it gathers the facts the
policy needs about a ``$`` queue name (a temporary queue's owner, a durable
subscription's queue), asks it, and then does what it allows — resolve the router, look
the queue up, or create it on first use. A connection creates at most
``max-auto-created-queues-per-connection`` queues (auto-created ones, and its temporary
ones alive: :mod:`.temporary`); across connections the queue manager counts each queue for
the user and the address it was made for (:class:`Creator`: ``max-queues-per-user``,
``max-queues-per-address``, and the clients' share of ``max-queues``). Every failure
becomes a :class:`.access.Refused` with the condition for the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from martinet.messaging.amqp import JMS_DEST, JMS_TEMPORARY_TOPIC, JMS_TOPIC, QUEUE_PREFIX, TOPIC_PREFIX
from martinet.messaging.message import Message
from martinet.swiftlets.queuemanager.api import TEMPORARY_PREFIX, Queue, QueueError, QueueNotFound, TooManyQueues

from .access import CREATE, EXISTING, MINE, MISSING, OTHERS, RESOLVE, Refused, queue_access, topic_access

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["Addresses"]

JMS_TOPIC_TYPES = (JMS_TOPIC, JMS_TEMPORARY_TOPIC)


class Addresses:
    """Address checks and queue creation for one connection."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection
        self.auto_created = 0  # queues auto-created for this connection (they outlive it)
        self._router = connection.swiftlet.router_name

    def check(self, address: str | None, action: str, *, topic: bool = False) -> str:
        """The queue or topic an address names, once checked (a topic in the topic manager's
        syntax: with the listener's ``topic-wildcards``, ``*`` and ``#`` levels translated).

        Raises: Refused, with the condition for the client.
        """
        connection = self.connection
        if topic:
            checked = topic_access(
                address,
                action,
                available=connection.topic_manager is not None,
                wildcards=connection.config.topic_wildcards,
                grants=connection.principal,
            )
            if isinstance(checked, Refused):
                raise checked
            return checked
        if not address:
            raise Refused("amqp:invalid-field", "an address is required")
        try:
            if "$" in address:
                self.check_queue(address, action)
            else:  # (check_queue's common case, one call less: an anonymous relay checks each message's 'to')
                access = queue_access(address, action, self._router, connection.principal)
                if access is CREATE:
                    self.queue(address)  # created on first use if auto-create-queues is on (counted)
                elif isinstance(access, Refused):
                    raise access
        except QueueNotFound as exc:
            raise Refused("amqp:not-found", str(exc)) from None
        except TooManyQueues as exc:
            raise Refused("amqp:resource-limit-exceeded", str(exc)) from None
        except QueueError as exc:
            raise Refused("amqp:invalid-field", str(exc)) from None
        return address

    def check_queue(self, address: str, action: str, *, create: bool = True) -> None:
        """Whether this connection may ``action`` (send, receive, browse) queue ``address``
        (:func:`.access.queue_access`); if so, the queue exists afterwards (created on first
        use where that is allowed, and ``create``: a management reply-to is checked
        without, as it must exist already).

        Raises:
            Refused; QueueNotFound, QueueError (the look-up's, mapped by :meth:`check`).
        """
        connection, router = self.connection, self._router
        if "$" not in address:  # (the common case, per message on an anonymous relay: no facts to gather)
            access = queue_access(address, action, router, connection.principal, create)
        else:  # the facts the policy needs about a router's name
            temporary, durable = MISSING, False
            name, at, where = address.rpartition("@")
            if not at:
                name = address
            if not at or where == router:
                if name.startswith(TEMPORARY_PREFIX):
                    queue = connection.queue_manager.queues.get(name)
                    if queue is not None:
                        temporary = MINE if queue.owner is connection else OTHERS
                elif connection.topic_manager is not None:
                    durable = connection.topic_manager.is_durable_queue(name)
            access = queue_access(
                address,
                action,
                router=router,
                grants=connection.principal,
                create=create,
                temporary=temporary,
                durable=durable,
            )
        if access is CREATE:
            self.queue(address)  # created on first use if auto-create-queues is on (counted)
        elif access is EXISTING:
            connection.queue_manager.queue(address, create=False)
        elif access is RESOLVE:
            connection.queue_manager.resolve(address)
        elif isinstance(access, Refused):
            raise access

    def route(self, message: Message) -> tuple[str, bool]:
        """Where an anonymous-relay message goes: its ``to``, as a topic or a queue."""
        to = message.properties.to
        if not to or not isinstance(to, str):
            raise Refused("amqp:invalid-field", "a message on an anonymous relay link needs a 'to' address")
        if to.startswith(TOPIC_PREFIX):
            return self.check(to[len(TOPIC_PREFIX) :], "publish", topic=True), True
        if message.message_annotations.get(JMS_DEST) in JMS_TOPIC_TYPES:
            return self.check(to, "publish", topic=True), True
        return self.check(to[len(QUEUE_PREFIX) :] if to.startswith(QUEUE_PREFIX) else to, "send"), False

    def queue(self, address: str) -> Queue:
        """The queue for ``address``; one to be auto-created counts towards the connection's
        ``max-auto-created-queues-per-connection``.

        Raises:
            Refused: that limit is reached (amqp:resource-limit-exceeded).
            QueueError: as ``QueueManager.queue``.
        """
        connection = self.connection
        manager = connection.queue_manager
        queue = manager.queues.get(manager.resolve(address))
        if queue is not None:  # (as cheap as manager.queue: an anonymous relay's sends come here)
            return queue
        self.may_create(address)
        queue = manager.queue(address, creator=connection.creator)
        self.auto_created += 1
        return queue

    def may_create(self, name: str) -> None:
        """Raises Refused (amqp:resource-limit-exceeded) once this connection has created
        ``max-auto-created-queues-per-connection`` queues (its live temporary ones included)."""
        connection = self.connection
        limit = connection.config.max_auto_created_queues_per_connection
        if 0 <= limit <= self.auto_created + connection.temporaries.alive:
            raise Refused(
                "amqp:resource-limit-exceeded",
                f"queue {name!r} not created: this connection "
                f"created max-auto-created-queues-per-connection {limit} queues already",
            )
