"""The running ``sys$topicmanager``: roots, subscriptions, publishing, durable subscribers.

Theory of operation
-------------------
Every subscription delivers into a queue of the queue manager: a non-durable one into its
own temporary queue (``tmp$…``, non-persistent, deleted with the subscription), a durable
one into the queue ``<client id>$<durable name>`` (persistent messages stay persistent
there, and the queue's contents survive restarts like any queue's). Consumers then read
those queues with everything the queue manager offers (credit, outcomes, transactions).

Publishing (:meth:`TopicManager.publish`) finds the subscriptions of the published topic's
root whose topic matches (:mod:`.hierarchy`; the list is cached per published topic until
subscriptions change), applies each one's no-local flag and selector, keeps one copy per
subscriber queue — so a subscriber receives a message once however many of its
subscriptions match — applies the root's slow-subscriber condition, and hands the message
to the queue manager once for all target queues (its metadata is read once).

Durable subscriptions (:mod:`.durables`) are records in the store, rebuilt at start; a
record that cannot be restored is set aside and never stops the router from starting.

A selector that cannot be evaluated on a published message (its properties do not decode)
does not select it; that is logged once per subscription.

Interest: when a root's subscription count goes 0 → 1 or 1 → 0 a
:class:`TopicInterestChanged` event goes on the bus; :meth:`TopicManager.interest` is the
current set.

Across routers (:mod:`.federation`): the federation announces the interest to the other
routers, a local publication is also forwarded to every router subscribed to its root, and
what other routers forward arrives through :meth:`TopicManager._deliver_forwarded`, which
delivers with the same matching (:mod:`.targets`) and never forwards again.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import attrs
import trio

from martinet.kernel import Change, Entity, SwiftletContext, UsageList, Veto
from martinet.messaging.message import Message, MessageError
from martinet.messaging.selector import Selector, compile_selector
from martinet.swiftlets.queuemanager.api import (
    Consumer,
    Creator,
    DiskFull,
    Queue,
    QueueError,
    QueueManager,
)
from martinet.swiftlets.store.api import Store

from .api import PublishResult, TopicError, TopicInterestChanged
from .backlogs import BacklogWatch
from .durables import Durables
from .federation import PUBLISHER, SOURCE, TEMPORARY_ROOT_PREFIX, TOPIC, AllDurable, Federation
from .hierarchy import TopicName, TopicNameError, parse_topic
from .targets import Targets

__all__ = ["TopicManager", "Subscription"]

log = logging.getLogger(__name__)


class Subscription:
    """A subscription delivering into ``queue`` (provides :class:`.api.Subscription`).
    Read it with :meth:`consumer`."""

    def __init__(
        self,
        manager: TopicManager,
        topic: TopicName,
        queue: Queue,
        *,
        selector: Selector | None,
        no_local: bool,
        client_id: str | None,
        durable_name: str | None = None,
        owns_queue: bool = True,
    ):
        self._manager = manager
        self.owns_queue = owns_queue
        self.topic = topic
        self.queue = queue
        self.selector = selector
        self.no_local = no_local
        self.client_id = client_id
        self.durable_name = durable_name
        self.closed = False
        self.unselectable_logged = False  # the selector met a message it could not evaluate (logged once)

    @property
    def durable(self) -> bool:
        return self.durable_name is not None

    def consumer(self) -> Consumer:
        """A consumer on the subscription's queue (give it credit to receive)."""
        return self.queue.consumer(owner=self)

    def close(self) -> None:
        """End a non-durable subscription: its queue and undelivered messages go away.
        (A durable subscription ends with :meth:`TopicManager.unsubscribe`.)"""
        if not self.closed and not self.durable:
            self._manager._remove(self)

    def usage(self) -> dict[str, Any]:
        """Its row in its root topic's ``subscriptions`` usage list."""
        return {
            "topic": self.topic.text,
            "durable": self.durable,
            "client-id": self.client_id,
            "name": self.durable_name,
            "selector": self.selector.text if self.selector else "",
            "no-local": self.no_local,
            "queue": self.queue.name,
            "messages": self.queue.size,
            "consumers": len(self.queue.consumers),
        }

    def __repr__(self) -> str:
        kind = f"durable {self.queue.name}" if self.durable else "non-durable"
        return f"<Subscription {kind} to {self.topic.text}>"


@attrs.define(eq=False)
class Root:
    name: str
    subscriptions: list[Subscription] = attrs.Factory(list)
    published: int = 0
    remote_published: int = 0  # publications other routers forwarded here
    deliveries: int = 0
    dropped: int = 0
    disconnected: int = 0
    #: its usage entry's list of subscriptions, by a number of each (several subscriptions of
    #: one subscriber can share a queue); None before the swiftlet runs
    listed: UsageList | None = None
    numbers: dict[Subscription, str] = attrs.Factory(dict)

    def usage(self) -> dict[str, Any]:
        return {
            "subscriptions": len(self.subscriptions),
            "durable-subscriptions": sum(1 for s in self.subscriptions if s.durable),
            "published": self.published,
            "remote-published": self.remote_published,
            "deliveries": self.deliveries,
            "dropped": self.dropped,
            "disconnected": self.disconnected,
        }


# -- the swiftlet -----------------------------------------------------------------------------


class TopicManager:
    """``sys$topicmanager``; what ``context.lookup("sys$topicmanager", TopicManager)`` returns
    (it provides the protocol :class:`.api.TopicManager`)."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self.auto_create_topics = context.config.auto_create_topics
        self._roots: dict[str, Root] = {}
        self._targets = Targets()
        self._queue_manager: QueueManager  # both looked up in run()
        self._store: Store
        self._root_usage: UsageList | None = None
        self._numbers = itertools.count(1)  # of subscriptions in usage
        self._federation: Federation | None = None
        self._durables = Durables(context, self, lambda: self._backlogs.growing)
        self._backlogs = BacklogWatch(
            lambda: ((name, s.queue.size, bool(s.queue.consumers)) for name, s in self._durables.by_queue.items()),
            threshold=lambda: context.config.unconsumed_backlog_warning,
            interval=lambda: context.config.backlog_check_interval,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._store = self.context.lookup("sys$store", Store)
        self._queue_manager = self.context.lookup("sys$queuemanager", QueueManager)
        usage = self.context.usage
        self._root_usage = usage.add_list("topics")
        self._durables.start(self._store, self._queue_manager)
        usage.provide(
            lambda: {
                "roots": len(self._roots),
                "durable-subscribers": len(self._durables.by_queue),
                "durable-backlogs-growing": len(self._backlogs.growing),
                "unrestorable": len(self._durables.unrestorable),
                "interest": " ".join(sorted(self.interest())),
                "interest-records-sent": self._federation.records_sent if self._federation else 0,
                "interest-records-received": self._federation.records_received if self._federation else 0,
            }
        )
        entity = self.context.entity
        entity.on_change(self._settings_changed)
        entity.entity_list("topics").bind(self._topic_defined)  # a root stays while it has subscriptions
        entity.entity_list("slow-subscriber-conditions").bind(
            self._targets.condition_added, self._targets.condition_removed
        )
        self._federation = Federation(self.context, self._queue_manager, self.interest, self._deliver_forwarded)
        self._durables.recover()
        async with trio.open_nursery() as nursery:
            await nursery.start(self._federation.run, self._store)
            await nursery.start(self._backlogs.run)
            task_status.started()

    def _settings_changed(self, change: Change) -> None:
        if change.field == "auto_create_topics":
            self.auto_create_topics = change.new

    def _topic_defined(self, entity: Entity) -> None:
        try:
            self._root(parse_topic(entity.name).root, create=True)
        except TopicNameError as exc:
            raise Veto(str(exc)) from None

    def is_durable_queue(self, name: str) -> bool:
        """Whether queue ``name`` belongs to a durable subscription (one restored or
        created, or a record set aside at start): it is used only through the subscription."""
        return self._durables.is_durable_queue(name)

    # -- roots and interest --------------------------------------------------------------------

    def _root(self, name: str, *, create: bool | None = None) -> Root:
        root = self._roots.get(name)
        if root is None:
            defined = name in {parse_topic(t).root for t in self.context.entity.entity_list("topics").entities}
            temporary = name.startswith(TEMPORARY_ROOT_PREFIX)  # a temporary topic, maybe another router's
            if not (defined or temporary or (self.auto_create_topics if create is None else create)):
                raise TopicError(f"root topic {name!r} is not defined on router {self.context.router_name}")
            root = self._roots[name] = Root(name)
            if self._root_usage is not None:
                root.listed = self._root_usage.add(name, root.usage).add_list("subscriptions")
        return root

    def interest(self, *, durable_only: bool = False) -> frozenset[str]:
        """The root topics that have local subscriptions now (``durable_only``: durable ones)."""
        return frozenset(
            name
            for name, root in self._roots.items()
            if any(s.durable for s in root.subscriptions) or (root.subscriptions and not durable_only)
        )

    def _add(self, subscription: Subscription) -> None:
        root = self._root(subscription.topic.root, create=True)
        root.subscriptions.append(subscription)
        if root.listed is not None:
            number = root.numbers[subscription] = str(next(self._numbers))
            root.listed.add(number, subscription.usage)
        self._targets.changed()
        if subscription.durable:
            self._durables.added(subscription)
        if len(root.subscriptions) == 1:
            self.context.bus.publish(TopicInterestChanged(root=root.name, interested=True))
            if self._federation is not None:
                self._federation.listen(root.name)
                self._federation.interest_changed()

    def _remove(self, subscription: Subscription) -> None:
        subscription.closed = True
        root = self._roots[subscription.topic.root]
        root.subscriptions.remove(subscription)
        number = root.numbers.pop(subscription, None)
        if number is not None and root.listed is not None:
            root.listed.remove(number)
        self._targets.changed()
        if subscription.durable:
            self._durables.removed(subscription)
        if subscription.owns_queue and subscription.queue.name in self._queue_manager.queues:
            self._queue_manager.delete_queue(subscription.queue.name)
        if not root.subscriptions:
            self.context.bus.publish(TopicInterestChanged(root=root.name, interested=False))
            if self._federation is not None:
                self._federation.interest_lost(root.name)

    # -- subscribing --------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        *,
        selector: str | None = None,
        no_local: bool = False,
        client_id: str | None = None,
        owner: Any = None,
        queue: Queue | None = None,
        creator: Creator | None = None,
    ) -> Subscription:
        """A non-durable subscription with its own temporary queue — or delivering into
        ``queue``, which a subscriber with several subscriptions shares (it then receives
        each message once, however many of them match; closing leaves the queue).

        Raises:
            TopicError: invalid topic name or selector, or an undefined root.
        """
        name, compiled = self._check(topic, selector)
        self._root(name.root)
        owns_queue = queue is None
        if queue is None:
            queue = self._queue_manager.create_temporary_queue(owner, creator)
        subscription = Subscription(
            self, name, queue, selector=compiled, no_local=no_local, client_id=client_id, owns_queue=owns_queue
        )
        self._add(subscription)
        return subscription

    def close_subscriptions(self, owner: Any) -> None:
        """Close every non-durable subscription created with ``owner`` (a lost connection)."""
        for root in list(self._roots.values()):
            for subscription in list(root.subscriptions):
                if not subscription.durable and subscription.queue.owner is owner:
                    subscription.close()

    async def durable_subscribe(
        self,
        client_id: str,
        name: str,
        topic: str,
        *,
        selector: str | None = None,
        no_local: bool = False,
        creator: Creator | None = None,
    ) -> Subscription:
        """Create the durable subscription ``client_id`` / ``name``, or resume it if it exists
        with the same topic, selector and no-local; with other parameters the old one is
        dropped with its messages and a new one created. Also the administrative create.

        Raises:
            TopicError: invalid names, topic or selector; or the old one, to be replaced,
                has active consumers.
        """
        return await self._durables.subscribe(
            client_id, name, topic, selector=selector, no_local=no_local, creator=creator
        )

    async def unsubscribe(self, client_id: str, name: str) -> None:
        """Delete the durable subscription and its messages (also the administrative delete);
        for a record set aside at start (:meth:`is_durable_queue`), the record and its queue.

        Raises:
            TopicError: no such subscription, or it has active consumers.
        """
        await self._durables.unsubscribe(client_id, name)

    def durable_subscriptions(self) -> dict[str, Subscription]:
        """Durable subscriptions by queue name (``clientid$name``)."""
        return dict(self._durables.by_queue)

    def _check(self, topic: str, selector: str | None) -> tuple[TopicName, Selector | None]:
        try:
            name = parse_topic(topic)
            return name, (compile_selector(selector) if selector else None)
        except (TopicNameError, ValueError) as exc:
            raise TopicError(str(exc)) from None

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        message: Message,
        *,
        client_id: str | None = None,
        on_durable: Callable[[BaseException | None], None] | None = None,
    ) -> PublishResult:
        """Deliver ``message`` to every matching subscription (once per subscriber).

        ``client_id`` is the publishing connection's (for no-local); ``on_durable`` is
        called once every persistent copy is stored.

        Raises:
            TopicError: invalid topic, undefined root, or a message the queues refuse.
            DiskFull: the message is persistent for a subscriber and the store's disk alarm is on.
        """
        try:
            name = parse_topic(topic)
        except TopicNameError as exc:
            raise TopicError(str(exc)) from None
        root = self._root(name.root)
        root.published += 1
        queues, pressure, dropped = self._targets.select(root, name, message, client_id)
        forwarding = self._federation is not None and bool(self._federation.subscriptions.of_root(name.root))
        durable = AllDurable(on_durable) if forwarding and on_durable is not None else None
        try:
            delay, full = self._queue_manager.send_to_queues(
                queues, message, on_durable=durable.add() if durable is not None else on_durable
            )
        except DiskFull:
            raise  # (a resource limit the publisher is told as such; it may try again later)
        except QueueError as exc:
            raise TopicError(f"cannot publish to {topic}: {exc}") from None
        delivered = len(queues) - len(full)
        root.deliveries += delivered
        root.dropped += dropped + len(full)
        if forwarding:
            assert self._federation is not None  # (forwarding needs one)
            forward_delay, forwarded = self._federation.forward(name, message, client_id, durable)
            delay, delivered = max(delay, forward_delay), delivered + forwarded
            if durable is not None:
                durable.one()  # everything is sent: the guard copy
        return PublishResult(max(delay, pressure), delivered, dropped + len(full))

    def _deliver_forwarded(self, message: Message, transaction: Any) -> None:
        """Deliver a publication another router forwarded (``tpc$<root>``) to the local
        subscribers, staged in ``transaction`` (None: at once); it is never forwarded
        again. No-local compares the original publisher's client id. A message without a
        valid topic, or that a selector cannot read, is dropped with a WARNING."""
        try:
            annotations = message.message_annotations
            name = parse_topic(annotations.get(TOPIC))
            root = self._roots.get(name.root)
            if root is None:  # no subscriptions here (any more)
                return
            publisher = annotations.get(PUBLISHER)
            queues, _, dropped = self._targets.select(
                root, name, message, publisher if isinstance(publisher, str) else None
            )
        except (MessageError, TopicNameError, TopicError, TypeError) as exc:
            log.warning("a publication forwarded by another router is dropped: %s", exc)
            return
        root.remote_published += 1
        if transaction is None:
            try:
                _, full = self._queue_manager.send_to_queues(queues, message)
            except QueueError as exc:
                log.warning(
                    "a publication to %s forwarded by router %s is dropped: %s", name.text, annotations.get(SOURCE), exc
                )
                return
            root.deliveries += len(queues) - len(full)
            root.dropped += dropped + len(full)
            return
        for queue in queues:
            try:
                transaction.send(queue.name, message)
            except QueueError:  # full, or deleted since
                dropped += 1
            else:
                root.deliveries += 1
        root.dropped += dropped
