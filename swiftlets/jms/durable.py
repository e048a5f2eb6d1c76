"""A client connection's durable subscriptions: attached, looked up, deleted.

Theory of operation
-------------------
A durable subscription is named by the client id (container id) and the link name. An
attach to a topic with a durable source creates it, resumes it, or replaces it when its
topic or selector changed (the topic manager awaits its store record, so the attach is
answered later: :class:`.attach.Attaches`); an attach with a null source (how Qpid JMS
looks one up) resumes it by link name. One link at a time uses it: while another has it
(the client id's other connection, say), the attach is refused with
``amqp:resource-locked``. A detach keeps it; the client's closing detach deletes it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from martinet.messaging import amqp
from martinet.messaging.amqp import TOPIC_PREFIX, Error
from martinet.swiftlets.queuemanager.api import TooManyQueues
from martinet.swiftlets.topicmanager.api import TopicError, TopicManager, durable_queue_name

from .access import Refused
from .links import OutgoingLink

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["DurableSubscriptions"]

log = logging.getLogger(__name__)


class DurableSubscriptions:
    """The durable subscriptions one connection attaches to (its client id's)."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection

    def _topics(self) -> TopicManager:
        topic_manager = self.connection.topic_manager
        assert topic_manager is not None  # (a durable attach is checked as a topic first)
        return topic_manager

    async def attach(self, link: amqp.Link, topic: str, selector: str | None, no_local: bool) -> OutgoingLink:
        """A durable subscription named by the client id (container id) and the link name:
        created, resumed, or replaced when its topic or selector changed. One link at a time
        uses it: while another has it (the client id's other connection, say), the attach is
        refused with amqp:resource-locked."""
        connection = self.connection
        client_id = connection.client_id
        if not client_id:
            raise Refused("amqp:invalid-field", "a durable subscription needs a client id (container id)")
        self._check_not_in_use(link.name)  # (before: a changed one would be dropped otherwise)
        new = durable_queue_name(client_id, link.name) not in connection.queue_manager.queues
        if new:  # its queue counts towards max-auto-created-queues-per-connection (and max-queues)
            connection.addresses.may_create(durable_queue_name(client_id, link.name))
        try:
            subscription = await self._topics().durable_subscribe(
                client_id, link.name, topic, selector=selector, no_local=no_local, creator=connection.creator
            )
        except TopicError as exc:
            raise Refused("amqp:invalid-field", str(exc)) from None
        except TooManyQueues as exc:
            raise Refused("amqp:resource-limit-exceeded", str(exc)) from None
        if new:
            connection.addresses.auto_created += 1
        self._check_not_in_use(link.name)  # (and after: another attach may have taken it meanwhile)
        return OutgoingLink(connection, link, subscription.consumer(), durable=(client_id, link.name))

    def _check_not_in_use(self, name: str) -> None:
        """Raises Refused (amqp:resource-locked) while a link consumes the client id's
        durable subscription ``name``."""
        client_id = self.connection.client_id
        subscription = self._topics().durable_subscriptions().get(durable_queue_name(client_id or "", name))
        if subscription is not None and subscription.queue.consumers:
            raise Refused(
                "amqp:resource-locked",
                f"durable subscription {name!r} of client {client_id!r} is in use by another link",
            )

    def existing(self, link: amqp.Link) -> OutgoingLink:
        """The client id's durable subscription named as ``link`` (whose source was null)."""
        connection = self.connection
        topic_manager = connection.topic_manager
        subscription = (
            topic_manager.durable_subscriptions().get(durable_queue_name(connection.client_id or "", link.name))
            if topic_manager
            else None
        )
        if subscription is None:
            raise Refused(
                "amqp:not-found", f"no durable subscription {link.name!r} for client {connection.client_id!r}"
            )
        self._check_not_in_use(link.name)

        # the grant, as for the attach that made it
        connection.addresses.check(subscription.topic.text, "durable", topic=True)
        link.source = amqp.Terminus(
            kind=amqp.SOURCE, address=f"{TOPIC_PREFIX}{subscription.topic.text}", durable=2, expiry_policy="never"
        )  # the request's source was null
        return OutgoingLink(connection, link, subscription.consumer(), durable=(connection.client_id or "", link.name))

    async def unsubscribe(self, link: amqp.Link, client_id: str, name: str) -> None:
        """Delete a durable subscription, then answer the client's closing detach."""
        connection = self.connection
        error = None
        try:
            await self._topics().unsubscribe(client_id, name)
        except TopicError as exc:
            log.info("durable subscription %s/%s not deleted: %s", client_id, name, exc)
            error = Error("amqp:resource-locked", str(exc))
        if not connection.closed:
            link.detach(closed=True, error=error)
            connection.wake()
