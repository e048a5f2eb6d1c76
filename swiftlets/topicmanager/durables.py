"""Durable subscriptions: records in the store (kind ``durable``), rebuilt at start, each
delivering into the queue ``<client id>$<durable name>``. A name that cannot make a queue is
refused before anything is stored. A record that cannot be restored (an older version stored
it, or it is damaged) is logged with one ERROR line, kept in the store and set aside —
listed under ``usage/unrestorable`` until the same client id and name subscribe again (which
replaces it) or unsubscribe (which deletes it) — and never stops the router from starting."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from martinet.kernel import SwiftletContext, UsageList, Veto
from martinet.messaging.selector import compile_selector
from martinet.swiftlets.queuemanager.api import TEMPORARY_PREFIX, Creator, QueueError, QueueManager, check_queue_name
from martinet.swiftlets.store.api import DeleteRecord, PutRecord, Store

from .api import TopicError, durable_queue_name
from .hierarchy import TopicNameError, parse_topic

if TYPE_CHECKING:
    from .manager import Subscription, TopicManager

__all__ = ["Durables"]

log = logging.getLogger(__name__)


class Durables:
    """The durable subscriptions of one topic manager, by queue name, and the records set
    aside at start. The manager registers a durable subscription here when it adds one to
    its root (:meth:`added`, :meth:`removed`); ``growing``: the backlog watch's queues."""

    def __init__(self, context: SwiftletContext, manager: TopicManager, growing: Callable[[], Mapping[str, int]]):
        self.context = context
        self._manager = manager
        self._growing = growing
        self.by_queue: dict[str, Subscription] = {}
        self.unrestorable: dict[str, str] = {}  # records set aside at start: key → why
        self._usage: UsageList | None = None
        self._unrestorable_usage: UsageList | None = None
        self._queue_manager: QueueManager  # both given to recover()
        self._store: Store

    def start(self, store: Store, queue_manager: QueueManager) -> None:
        """The router runs: its store and queue manager, and the usage lists."""
        self._store, self._queue_manager = store, queue_manager
        usage = self.context.usage
        self._usage = usage.add_list("durable-subscribers")
        self._unrestorable_usage = usage.add_list("unrestorable")

    def recover(self) -> None:
        """Rebuild the durable subscriptions from their store records. A record that cannot
        be restored is set aside (:meth:`_set_aside`), never a reason not to start."""
        from .manager import Subscription  # (the manager's module imports this one)

        queue_manager = self._queue_manager
        for key, record in self._store.recovered.records.get("durable", {}).items():
            try:
                data = json.loads(record)
                topic = parse_topic(data["topic"])
                selector = compile_selector(data["selector"]) if data["selector"] else None
                _check_queue_name(key)
                subscription = Subscription(
                    self._manager,
                    topic,
                    queue_manager.queue(key, create=True),
                    selector=selector,
                    no_local=bool(data["no_local"]),
                    client_id=data["client_id"],
                    durable_name=data["name"],
                )
            except (ValueError, KeyError, TypeError, TopicNameError, QueueError) as exc:  # (JSON, selector: ValueError)
                self._set_aside(key, record, f"{type(exc).__name__}: {exc}")
                continue
            self._manager._add(subscription)
        if self.by_queue:
            log.info("topic manager restored %d durable subscription(s)", len(self.by_queue))

    def is_durable_queue(self, name: str) -> bool:
        """Whether queue ``name`` belongs to a durable subscription (one restored or
        created, or a record set aside at start): it is used only through the subscription."""
        return name in self.by_queue or name in self.unrestorable

    def added(self, subscription: Subscription) -> None:
        self.by_queue[subscription.queue.name] = subscription
        if self._usage is not None:
            entry = self._usage.add(subscription.queue.name, lambda: _usage(subscription, self._growing()))
            entry.add_operation(
                "delete",
                lambda: self._delete(subscription),
                "Delete this durable subscription and the messages it holds (refused while it has consumers).",
                destroys=lambda: subscription.queue.size,
            )

    def removed(self, subscription: Subscription) -> None:
        self.by_queue.pop(subscription.queue.name, None)
        if self._usage is not None:
            self._usage.remove(subscription.queue.name)

    async def subscribe(
        self,
        client_id: str,
        name: str,
        topic: str,
        *,
        selector: str | None,
        no_local: bool,
        creator: Creator | None,
    ) -> Subscription:
        """See :meth:`.manager.TopicManager.durable_subscribe`."""
        from .manager import Subscription

        if not client_id or not name or "$" in name or "/" in name or "/" in client_id:
            raise TopicError(
                f"invalid durable subscription {client_id!r} / {name!r}: both non-empty, the name without '$' or '/'"
            )
        key = durable_queue_name(client_id, name)
        try:  # checked before anything is stored: a record whose queue cannot be made would stop every start
            _check_queue_name(key)
        except QueueError as exc:
            raise TopicError(
                f"invalid durable subscription {client_id!r} / {name!r}: its queue {key!r} cannot "
                f"exist ({exc}); client id and name must not contain '/', '@' or spaces"
            ) from None
        topic_name, compiled = self._manager._check(topic, selector)
        existing = self.by_queue.get(key)
        if existing is None and key not in self._queue_manager.queues:
            self._queue_manager.check_room(key, creator)  # a new queue: counted for its creator (TooManyQueues)
        if existing is not None:
            if (existing.topic.text, existing.selector, existing.no_local) == (topic, compiled, no_local):
                return existing
            await self.unsubscribe(client_id, name)
            log.info("durable subscription %s changed: dropped and created anew", key)
        self._manager._root(topic_name.root)
        record = {
            "client_id": client_id,
            "name": name,
            "topic": topic,
            "selector": selector or "",
            "no_local": no_local,
        }
        await self._store.commit([PutRecord("durable", key, json.dumps(record).encode())])
        self._forget_unrestorable(key)  # the record set aside at start is replaced
        queue = self._queue_manager.queue(key, create=True, creator=creator or Creator())
        subscription = Subscription(
            self._manager,
            topic_name,
            queue,
            selector=compiled,
            no_local=no_local,
            client_id=client_id,
            durable_name=name,
        )
        self._manager._add(subscription)
        return subscription

    async def unsubscribe(self, client_id: str, name: str) -> None:
        """See :meth:`.manager.TopicManager.unsubscribe`."""
        key = durable_queue_name(client_id, name)
        subscription = self.by_queue.get(key)
        if subscription is None and key in self.unrestorable:  # set aside at start: forget the record
            queue = self._queue_manager.queues.get(key)
            if queue is not None and queue.consumers:
                raise TopicError(f"queue {key} of the unrestorable durable subscription has consumers")
            await self._store.commit([DeleteRecord("durable", key)])
            self._forget_unrestorable(key)
            if key in self._queue_manager.queues:
                self._queue_manager.delete_queue(key)
            log.info("unrestorable durable subscription record %r deleted", key)
            return
        if subscription is None:
            raise TopicError(f"no durable subscription {key!r} on router {self.context.router_name}")
        if subscription.queue.consumers:
            raise TopicError(
                f"durable subscription {key} has {len(subscription.queue.consumers)} active "
                "consumer(s): close them first"
            )
        del self.by_queue[key]  # gone for everyone from now on, while the store forgets it
        await self._store.commit([DeleteRecord("durable", key)])
        self._manager._remove(subscription)

    async def _delete(self, subscription: Subscription) -> dict[str, Any]:
        """The operator's delete of a durable subscription (management): the queue deleted and
        how many messages it dropped (``martinet-pipeline --drop`` prints them)."""
        assert subscription.client_id is not None and subscription.durable_name is not None  # a durable one
        dropped = subscription.queue.size
        try:
            await self.unsubscribe(subscription.client_id, subscription.durable_name)
        except TopicError as exc:
            raise Veto(str(exc)) from None
        log.info(
            "durable subscription %s deleted by management (%d message(s) dropped)", subscription.queue.name, dropped
        )
        return {"deleted": subscription.queue.name, "dropped": dropped}

    def _set_aside(self, key: str, record: bytes, reason: str) -> None:
        """Keep a durable record that cannot be restored in the store, log it once, and list
        it under ``usage/unrestorable/<key>`` (a ``/`` in the key shows as ``%2F``)."""
        self.unrestorable[key] = reason
        log.error(
            "durable subscription record %r cannot be restored and is set aside (kept in the store, listed "
            "under /%s/usage/unrestorable): %s",
            key,
            self.context.name,
            reason,
        )
        if self._unrestorable_usage is not None:
            text = record.decode("utf-8", "replace")
            self._unrestorable_usage.add(
                key.replace("/", "%2F"),
                lambda: {"key": key, "reason": reason, "record": text if len(text) <= 500 else text[:500] + "…"},
            )

    def _forget_unrestorable(self, key: str) -> None:
        if self.unrestorable.pop(key, None) is not None and self._unrestorable_usage is not None:
            self._unrestorable_usage.remove(key.replace("/", "%2F"))


def _check_queue_name(key: str) -> None:
    """A durable subscription's queue name must be a valid queue name and must not look
    like a temporary queue's (client id ``tmp``): ``tmp$5`` may be another connection's.

    Raises:
        QueueError: it may not name a durable subscription's queue.
    """
    check_queue_name(key)
    if key.startswith(TEMPORARY_PREFIX):
        raise QueueError(f"{key!r} is a temporary queue's name (client id {TEMPORARY_PREFIX[:-1]!r} is reserved)")


def _usage(subscription: Subscription, growing: Mapping[str, int]) -> dict[str, Any]:
    return {
        "client-id": subscription.client_id,
        "name": subscription.durable_name,
        "topic": subscription.topic.text,
        "selector": subscription.selector.text if subscription.selector else "",
        "no-local": subscription.no_local,
        "messages": subscription.queue.size,
        "consumers": len(subscription.queue.consumers),
        "backlog-growing": subscription.queue.name in growing,
    }
