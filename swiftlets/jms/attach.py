"""A client connection's attaches and detaches: which link state serves each link.

Theory of operation
-------------------
The engine reports the client's attach, detach, flow and session end between reads;
:class:`Attaches` answers them. An attach is checked (:mod:`.addresses`) and given its
link state (:mod:`.links`, :class:`.transactions.CoordinatorLink`) before it is
answered; a durable subscription's attach waits for its store record
(:mod:`.durable`) and is answered then, together with a detach the client sent
meanwhile. Refused attaches answer with a null terminus and a detach carrying
``amqp:not-found``, ``amqp:unauthorized-access``, ``amqp:invalid-field``,
``amqp:resource-locked`` or ``amqp:resource-limit-exceeded``. A detach or a session's
end releases the link's consumer, temporary queue or subscription.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from martinet.messaging import amqp
from martinet.messaging.amqp import (
    COORDINATOR,
    NO_LOCAL_FILTER,
    NO_LOCAL_FILTER_CODE,
    QUEUE_PREFIX,
    SELECTOR_FILTER,
    SELECTOR_FILTER_CODE,
    TOPIC_PREFIX,
    Error,
)
from martinet.messaging.codec import Described
from martinet.messaging.selector import SelectorError, compile_selector
from martinet.swiftlets.queuemanager.api import ConsumerRefused, TooManyQueues

from .access import Refused
from .links import BrowsingLink, IncomingLink, OutgoingLink
from .transactions import CoordinatorLink

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["Attaches", "LinkState"]

log = logging.getLogger(__name__)

SELECTOR_FILTERS = (SELECTOR_FILTER, SELECTOR_FILTER_CODE)
NO_LOCAL_FILTERS = (NO_LOCAL_FILTER, NO_LOCAL_FILTER_CODE)

LinkState = IncomingLink | OutgoingLink | BrowsingLink | CoordinatorLink


def _filters(source: amqp.Terminus) -> tuple[str | None, bool]:
    """(selector, no-local) from a source's filter set (the Qpid JMS filter descriptors)."""
    selector, no_local = None, False
    for value in (source.filter or {}).values():
        if isinstance(value, Described) and value.descriptor in SELECTOR_FILTERS:
            selector = str(value.value)
        elif isinstance(value, Described) and value.descriptor in NO_LOCAL_FILTERS:
            no_local = True
    return selector, no_local


def _destination(terminus: amqp.Terminus) -> tuple[str, bool]:
    """(name, is_topic) of a source or target: ``topic://`` or capability ``topic`` make a topic."""
    address = terminus.address or ""
    if address.startswith(TOPIC_PREFIX):
        return address[len(TOPIC_PREFIX) :], True
    if address.startswith(QUEUE_PREFIX):
        return address[len(QUEUE_PREFIX) :], False
    return address, bool({"topic", "temporary-topic"} & set(terminus.capabilities))


class _Deferred(Exception):
    """An attach that must await something (a durable subscription's store record) first."""

    def __init__(self, finish: Callable[[], Awaitable[OutgoingLink]]):
        super().__init__("deferred attach")
        self.finish = finish


class Attaches:
    """The link events of one connection: attach, detach, flow, session end."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection
        self.links = connection.links  # (the connection's dict, looked up here once: on_flow is per flow frame)
        self._pending: dict[amqp.Link, bool | None] = {}  # attaches that wait → the peer's detach (closed?)

    def on_link_open(self, event: amqp.LinkAttached) -> None:
        link = event.link
        try:
            if link.is_sender:
                state: LinkState = self._attach_outgoing(link)
            else:
                state = self._attach_incoming(link)
        except Refused as refusal:
            self._refuse(link, refusal)
            return
        except TooManyQueues as exc:  # a temporary queue (of a subscription, too) beyond max-queues
            self._refuse(link, Refused("amqp:resource-limit-exceeded", str(exc)))
            return
        except _Deferred as deferred:
            self._pending[link] = None
            driver = self.connection.driver
            assert driver is not None  # events come while the driver runs
            driver.start_soon(self._finish_attach, link, deferred.finish)
            return
        self._activate(link, state)

    def _activate(self, link: amqp.Link, state: LinkState) -> None:
        self.links[link] = state
        link.handler = state  # type: ignore[assignment]  # (each serves one role: the one method the engine calls)
        link.attach()
        state.start()

    def _refuse(self, link: amqp.Link, refusal: Refused) -> None:
        """Answer with a null terminus and detach with the reason [2.6.3]."""
        connection = self.connection
        connection.swiftlet.refusals.warn(connection.host, "attach", refusal)
        link.source, link.target = (None, link.remote_target) if link.is_sender else (link.remote_source, None)
        link.attach()
        link.detach(closed=True, error=Error(refusal.condition, str(refusal)))

    async def _finish_attach(self, link: amqp.Link, finish: Callable[[], Awaitable[OutgoingLink]]) -> None:
        """Answer an attach that had to wait — and the peer's detach, if it came meanwhile
        (a client may send attach and detach in one go): a closing detach of a durable
        subscriber deletes the subscription that the attach created or resumed."""
        connection = self.connection
        try:
            state = await finish()
        except Refused as refusal:
            self._pending.pop(link, None)
            if not connection.closed:
                self._refuse(link, refusal)
        else:
            detached = self._pending.pop(link, None)  # None: not detached; else closed or not
            if connection.closed:
                state.close()
            elif detached is None:
                self._activate(link, state)
            else:
                state.close()
                link.attach()
                if detached and state.durable:
                    driver = connection.driver
                    assert driver is not None  # this task runs in the driver's nursery
                    driver.start_soon(connection.durables.unsubscribe, link, *state.durable)  # detaches once gone
                else:
                    link.detach(closed=detached)
        connection.wake()

    def _attach_incoming(self, link: amqp.Link) -> IncomingLink | CoordinatorLink:
        connection = self.connection
        # Announced in our attach [2.7.3]: the engine detaches the link with
        # amqp:link:message-size-exceeded as soon as a message's frames pass it, so a client
        # learns early and the router never collects the whole of an oversized message.
        link.max_message_size = connection.queue_manager.max_message_size
        link.source = link.remote_source
        link.target = target = (link.remote_target or amqp.Terminus(kind=amqp.TARGET)).copy()
        if target.kind == COORDINATOR:
            return CoordinatorLink(connection, link)
        if target.dynamic:  # a temporary queue or topic, gone with this link (Qpid JMS style)
            return connection.temporaries.destination(link, target)
        if target.address is None:
            return IncomingLink(connection, link, None, False)  # anonymous relay
        name, topic = _destination(target)
        address = connection.addresses.check(name, "publish" if topic else "send", topic=topic)
        return IncomingLink(connection, link, address, topic)

    def _attach_outgoing(self, link: amqp.Link) -> OutgoingLink | BrowsingLink:
        connection = self.connection
        addresses, temporaries = connection.addresses, connection.temporaries
        link.target = link.remote_target
        link.source = source = (link.remote_source or amqp.Terminus(kind=amqp.SOURCE)).copy()
        text, no_local = _filters(source)
        try:
            selector = compile_selector(text) if text else None
        except SelectorError as exc:
            raise Refused("amqp:invalid-field", f"invalid selector: {exc}") from None
        if source.dynamic:  # a temporary queue, gone with the link
            queue = temporaries.create()
            source.address = temporaries.address(queue.name)
            return OutgoingLink(
                connection, link, queue.consumer(selector, owner=connection), lambda: temporaries.delete(queue.name)
            )
        if source.address is None:  # Qpid JMS looks a durable subscription up by link name
            return connection.durables.existing(link)
        name, topic = _destination(source)
        if topic and source.durable:
            name = addresses.check(name, "durable", topic=True)
            raise _Deferred(lambda: connection.durables.attach(link, name, text, no_local))
        if not topic and source.distribution_mode == "copy":
            address = addresses.check(name, "browse")
            queue_manager = connection.queue_manager
            return BrowsingLink(connection, link, queue_manager.queue(address).browse(selector), queue_manager)
        if topic:
            topic_manager = connection.topic_manager
            assert topic_manager is not None  # (checked as a topic)
            name = addresses.check(name, "subscribe", topic=True)
            subscription = topic_manager.subscribe(
                name,
                selector=text,
                no_local=no_local,
                client_id=connection.client_id,
                owner=connection,
                creator=connection.creator,
            )
            return OutgoingLink(connection, link, subscription.consumer(), subscription.close)
        address = addresses.check(name, "receive")
        try:
            consumer = connection.queue_manager.queue(address).consumer(selector, owner=connection)
        except ConsumerRefused as exc:
            raise Refused("amqp:resource-locked", str(exc)) from None
        return OutgoingLink(connection, link, consumer)

    def on_link_detach(self, event: amqp.LinkDetached) -> None:
        """The client detached the link, or its session ended, or the engine detached it
        because the client broke the protocol on it (``by_peer`` false). Its consumer,
        temporary queue or subscription goes with it. The client's detach keeps a durable
        subscription and its close (``closed=true``) deletes it; the engine's never does."""
        connection = self.connection
        link, closed = event.link, event.closed
        if event.error is not None:
            log.info("link %r of %s detached: %s", link.name, connection.host, event.error)
        state = self.links.pop(link, None)
        if state is not None:
            state.close()
            if (
                closed
                and event.by_peer
                and isinstance(state, OutgoingLink)
                and state.durable
                and connection.driver is not None
            ):
                connection.driver.start_soon(connection.durables.unsubscribe, link, *state.durable)
                return  # answered once the subscription is gone
        elif link in self._pending:  # answered with the attach, which waits (_finish_attach)
            self._pending[link] = closed and event.by_peer  # (the engine's detach deletes nothing)
            return
        if not link.attached:  # detached while its attach was pending: answer both
            link.attach()
        link.detach(closed=closed)  # (nothing where no answer is due: the engine's own detach)

    def on_session_end(self, event: amqp.SessionEnded) -> None:
        """The client ended a session, or the engine did because the client broke the
        protocol on it. Its links' LinkDetached came first; any link of ours still on it
        is released here all the same, so no consumer outlives its session."""
        connection = self.connection
        if not event.by_peer:
            log.info("session of %s ended: %s", connection.host, event.error)
        links = self.links
        for link in [link for link in links if link.session is event.session]:
            links.pop(link).close()

    def detach(self, state: OutgoingLink, condition: str, description: str) -> None:
        """End a link from our side, with an error condition."""
        connection = self.connection
        self.links.pop(state.link, None)
        state.close()
        state.link.detach(closed=True, error=Error(condition, description))
        log.info("link %s of %s closed: %s", state.link.name, connection.host, description)

    def on_flow(self, event: amqp.LinkFlow) -> None:
        state = self.links.get(event.link)
        if isinstance(state, (OutgoingLink, BrowsingLink)):
            state.sync_credit()
