"""Which subscriber queues a publication goes to: the subscriptions of its root whose topic
matches (:mod:`.hierarchy`; the list cached per published topic until subscriptions change),
no-local (by the publisher's client id) and each one's selector applied, one copy per
subscriber queue — a subscriber receives a message once however many of its subscriptions
match — and the root's slow-subscriber condition (drop, disconnect, or flow control). A
selector that cannot be evaluated on a message (its properties do not decode) does not
select it; that is logged once per subscription."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from martinet.kernel import Change, Entity
from martinet.messaging.message import Message, MessageError
from martinet.messaging.selector import message_identifiers
from martinet.swiftlets.queuemanager.api import Queue

from .api import TopicError
from .config import SlowSubscriberCondition
from .hierarchy import TopicName, matches

if TYPE_CHECKING:
    from .manager import Root, Subscription

__all__ = ["Targets"]

log = logging.getLogger(__name__)

MATCH_CACHE = 10_000  # published topics whose matching subscriptions are kept


class Targets:
    """The matching of one topic manager, and its roots' slow-subscriber conditions (bound
    to ``slow-subscriber-conditions``: :meth:`condition_added`, :meth:`condition_removed`)."""

    def __init__(self) -> None:
        self._matches: dict[str, tuple[Subscription, ...]] = {}
        self._conditions: dict[str, SlowSubscriberCondition] = {}

    def changed(self) -> None:
        """A subscription came or went: the matches are computed again."""
        self._matches.clear()

    def condition_added(self, entity: Entity) -> None:
        self._conditions[entity.name] = entity.config
        entity.on_change(lambda change: self._condition_changed(entity.name, change))

    def _condition_changed(self, root: str, change: Change) -> None:
        self._conditions[root] = attrs.evolve(self._conditions[root], **{change.field: change.new})

    def condition_removed(self, entity: Entity) -> None:
        self._conditions.pop(entity.name, None)

    def select(
        self, root: Root, name: TopicName, message: Message, client_id: str | None
    ) -> tuple[list[Queue], int, int]:
        """The subscriber queues a publication goes to (one per queue; no-local, selectors and
        the slow-subscriber condition applied), the flow-control delay the condition asks
        for, and how many subscribers it drops.

        Raises:
            TopicError: a selector has to read a malformed message.
        """
        topic = name.text
        targets = self._matches.get(topic)
        if targets is None:
            if len(self._matches) >= MATCH_CACHE:
                self._matches.clear()
            targets = self._matches[topic] = tuple(s for s in root.subscriptions if matches(s.topic, name))
        queues: list[Queue] = []
        seen: set[int] = set()
        lookup = None
        condition = self._conditions.get(root.name)
        slow_limit = condition.max_messages if condition is not None else -1
        pressure = 0
        dropped = 0
        for subscription in targets:
            queue = subscription.queue
            if id(queue) in seen or (
                subscription.no_local and client_id is not None and subscription.client_id == client_id
            ):
                continue
            if subscription.selector is not None:
                if lookup is None:  # the first selector: check what it reads can be read
                    try:
                        message.check_sections()
                    except MessageError as exc:
                        raise TopicError(f"cannot publish to {topic}: malformed message: {exc}") from None
                    lookup = message_identifiers(message)
                try:
                    if not subscription.selector.matches(lookup):
                        continue
                except (ValueError, TypeError) as exc:  # MessageError: a section the selector reads is bad
                    self._unselectable(subscription, exc)
                    continue
            if 0 <= slow_limit <= queue.size:
                assert condition is not None  # (slow_limit is -1 without one)
                action = condition.action if not subscription.durable else "flow-control"
                if action == "drop":
                    dropped += 1
                    continue
                if action == "disconnect":
                    log.warning("slow subscriber to %s disconnected (%d messages waiting)", topic, queue.size)
                    root.disconnected += 1
                    dropped += 1
                    subscription.close()
                    continue
                pressure = max(pressure, queue.settings.max_flowcontrol_delay)
            seen.add(id(queue))
            queues.append(queue)
        return queues, pressure, dropped

    @staticmethod
    def _unselectable(subscription: Subscription, error: Exception) -> None:
        if not subscription.unselectable_logged:
            subscription.unselectable_logged = True
            log.warning(
                "%r: selector %r cannot be evaluated on a published message (%s); such messages are "
                "not delivered to it (logged once per subscription)",
                subscription,
                subscription.selector.text if subscription.selector else "",
                error,
            )
