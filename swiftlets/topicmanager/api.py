"""The topic manager's public interface: subscribing, publishing, durable subscriptions,
interest, topic names, and the errors.

A swiftlet gets the topic manager with ``context.lookup("sys$topicmanager", TopicManager)``
and uses only what is defined here; the rest of :mod:`swiftlets.topicmanager` is its
inside. Topic names are plain values: :func:`parse_topic` (with :class:`TopicName`,
:class:`TopicNameError`, :func:`matches` and :func:`from_wildcards`, from :mod:`.hierarchy`,
re-exported here) and
:func:`durable_queue_name` need no running topic manager.

Theory of operation, for callers
--------------------------------
Every subscription delivers into a queue of the queue manager (its own temporary queue,
a queue shared by one subscriber's subscriptions, or a durable subscription's queue
``<client id>$<name>``); a subscriber reads it with
:meth:`Subscription.consumer`, a queue-manager consumer with credit and outcomes. A
publish reaches every subscription whose topic matches, once per subscriber queue, and
returns a :class:`PublishResult` with the flow-control delay the publisher should observe.
When a root topic gets its first local subscription, or loses its last, a
:class:`TopicInterestChanged` event goes on the router's bus. With ``sys$routing`` running,
a publish is also forwarded to the other routers that have subscriptions under its root
(docs/topicmanager.md, "Topics across routers"); ``on_durable`` then waits for those copies too.

**Durable records that cannot be restored** at start (stored by an older version, or
damaged: a name that cannot make a queue, a topic or selector that no longer parses) are
logged once at ERROR, kept in the store and listed under
``/sys$topicmanager/usage/unrestorable/<client id>$<name>`` with the reason; the router
starts all the same. Subscribing again with that client id and name replaces the record,
:meth:`TopicManager.unsubscribe` deletes it.

Everything runs in the router's trio thread. Only the durable-subscription calls await
(the store); they are not interrupted by cancellation once the store has the record: they
finish and the cancellation takes effect at the caller's next checkpoint. Refusals raise
:class:`TopicError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import attrs

from martinet.kernel import Event
from martinet.messaging.message import Message
from martinet.messaging.selector import Selector
from martinet.swiftlets.queuemanager.api import Consumer, Creator, Queue

from .hierarchy import TopicName, TopicNameError, from_wildcards, matches, parse_topic

__all__ = [
    "TopicManager",
    "Subscription",
    "PublishResult",
    "TopicInterestChanged",
    "TopicError",
    "TopicName",
    "TopicNameError",
    "parse_topic",
    "matches",
    "from_wildcards",
    "durable_queue_name",
]


class TopicError(Exception):
    """A topic operation was refused; the message says why."""


@attrs.frozen(kw_only=True)
class TopicInterestChanged(Event):
    """Local subscriptions under ``root`` appeared (``interested``) or all went away."""

    root: str
    interested: bool


class PublishResult(NamedTuple):
    """Flow-control delay for the publisher (ms), subscriber queues that got a copy, and
    subscribers that missed it (dropped as slow, or their queue was full)."""

    delay_ms: int
    deliveries: int
    dropped: int = 0


def durable_queue_name(client_id: str, name: str) -> str:
    """The queue of a durable subscription: ``<client id>$<name>`` (an ``@router`` suffix of
    the client id is dropped, as SwiftMQ does)."""
    return f"{client_id.split('@', 1)[0]}${name}"


class Subscription(Protocol):
    """A subscription delivering into :attr:`queue`. Read it with :meth:`consumer`."""

    @property
    def topic(self) -> TopicName:
        """The topic subscribed to (it may hold predicate levels)."""

    @property
    def queue(self) -> Queue:
        """The queue the subscription delivers into."""

    @property
    def selector(self) -> Selector | None:
        """Only messages it selects are delivered; None: all."""

    @property
    def no_local(self) -> bool:
        """Messages published by the subscriber's own client id are not delivered."""

    @property
    def client_id(self) -> str | None:
        """The subscriber's client id (for no-local, and a durable subscription's key)."""

    @property
    def durable_name(self) -> str | None:
        """The durable subscription's name; None for a non-durable one."""

    @property
    def durable(self) -> bool:
        """``durable_name is not None``."""

    @property
    def closed(self) -> bool:
        """Ended: nothing is delivered to it any more."""

    def consumer(self) -> Consumer:
        """A consumer on the subscription's queue (give it credit to receive).

        Raises:
            ConsumerRefused, QueueError: the queue refuses another consumer, or is gone.
        """

    def close(self) -> None:
        """End a non-durable subscription: its own queue and undelivered messages go away
        (a shared queue stays). A durable subscription ends with
        :meth:`TopicManager.unsubscribe`; for it this does nothing."""


@runtime_checkable
class TopicManager(Protocol):
    """What ``context.lookup("sys$topicmanager", TopicManager)`` returns."""

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
        """A non-durable subscription with its own temporary queue (owned by ``owner``, made
        for ``creator``: the queue manager's ``create_temporary_queue``) — or
        delivering into ``queue``, which a subscriber with several subscriptions shares (it
        then receives each message once, however many of them match; closing leaves the
        queue).

        Raises:
            TopicError: invalid topic name or selector, or an undefined root.
        """

    def close_subscriptions(self, owner: Any) -> None:
        """Close every non-durable subscription created with ``owner`` (a lost connection)."""

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
        dropped with its messages and a new one created. Everything is checked before the
        record is stored (the queue name :func:`durable_queue_name` makes must pass the
        queue manager's ``check_queue_name``), so a refused call stores nothing. A record
        of the same client id and name that was set aside at start is replaced.

        Raises:
            TopicError: invalid names (empty, ``$`` or ``/`` in the name, a queue name with
                ``/``, ``@`` or spaces, or the client id ``tmp``, whose queue names are
                temporary queues'), topic or selector; or the old one, to be replaced, has
                active consumers.
            TooManyQueues: it is new and there is no room for its queue, made for
                ``creator`` (the queue manager's ``check_room``; nothing is stored).
            StoreError: the store failed to record it.
        """

    async def unsubscribe(self, client_id: str, name: str) -> None:
        """Delete the durable subscription and its messages — or a record of that client id
        and name that was set aside at start, with its queue.

        Raises:
            TopicError: no such subscription, or it has active consumers.
            StoreError: the store failed to forget it.
        """

    def durable_subscriptions(self) -> dict[str, Subscription]:
        """Durable subscriptions by queue name (:func:`durable_queue_name`)."""

    def is_durable_queue(self, name: str) -> bool:
        """Whether queue ``name`` belongs to a durable subscription — a live one, or a record
        that could not be restored at start. Such a queue is the subscription's: a listener
        lets clients use it only through the subscription, never as a plain queue."""

    def publish(
        self,
        topic: str,
        message: Message,
        *,
        client_id: str | None = None,
        on_durable: Callable[[BaseException | None], None] | None = None,
    ) -> PublishResult:
        """Deliver ``message`` to every matching subscription (once per subscriber queue).

        ``client_id`` is the publishing connection's (for no-local); ``on_durable`` is
        called once every persistent copy is stored (at once when there is none).

        Raises:
            TopicError: invalid topic, undefined root, or a message the queues refuse.
        """

    def interest(self, *, durable_only: bool = False) -> frozenset[str]:
        """The root topics that have local subscriptions now (``durable_only``: durable ones)."""
