"""The queue manager's queues by name: made, found, configured and deleted.

Theory of operation
-------------------
The queues are those defined in the config (made at start and whenever one is added), the
predefined ``unroutable`` and ``routerdlq`` (never deleted), temporary queues (``tmp$<n>``,
deleted with their owner) and the queues made on first use. A queue not defined in the
config is created on first use when ``auto-create-queues`` is on, with the settings of the
first queue controller (in name order) whose predicate matches its name — unless there is
no room for it (then neither an auto-created nor a temporary queue is made:
``TooManyQueues``): the router holds ``max-queues`` queues (routing's ``rt$`` queues not
counted), or it is made for a client and the clients' share of ``max-queues`` (all but
``reserved-queues-percent``, kept for the router's own needs), its user's
``max-queues-per-user`` or its address's ``max-queues-per-address`` is used up
(:mod:`.budget`). A temporary name is never created on first use: its queue went with its
owner. Deleting a queue closes its consumers and drops its messages (their deletion from
the store deferred).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from martinet.kernel import Change, Entity, SwiftletContext, UsageList, Veto
from martinet.messaging.like import like_pattern
from martinet.swiftlets.store.api import DeleteMessage

from .api import TEMPORARY_PREFIX, Creator, QueueError, QueueNotFound, check_queue_name
from .budget import QueueBudget
from .config import QueueManagerConfig, QueueSettings
from .memory import wait_in
from .operations import offer_operations
from .persistence import Persistence
from .queue import Queue, QueueServices

if TYPE_CHECKING:
    from .manager import QueueManager

log = logging.getLogger(__name__)

__all__ = ["PREDEFINED", "Catalogue"]

PREDEFINED = ("unroutable", "routerdlq")


class Catalogue:
    """The local queues by name (``queues``), each made with ``manager`` as the
    :class:`.queue.QueueServices` it calls."""

    def __init__(self, context: SwiftletContext, manager: QueueManager, persistence: Persistence):
        self.context = context
        self.router_name = context.router_name
        config: QueueManagerConfig = context.config
        self._services: QueueServices = manager  # what its queues call
        self._resolve = manager.resolve  # (bound once: Catalogue.queue calls it per transactional send)
        self._persistence = persistence
        self._memory = manager.memory
        self.budget = QueueBudget.of(config)
        self.auto_create_queues = config.auto_create_queues
        self.queues: dict[str, Queue] = {}
        self._temporary = 0
        self._usage: UsageList | None = None

    def start(self, usage: UsageList) -> None:
        """Make the predefined queues and those the config defines (and from now on, those it
        gets); each queue's usage goes into ``usage``."""
        self._usage = usage
        for name in PREDEFINED:
            self.queue(name, create=True)
        self.context.entity.entity_list("queues").bind(
            self._queue_configured, self._queue_unconfigured, destroys=self._messages_of
        )

    def settings_for(self, name: str) -> QueueSettings:
        """The settings of queue ``name``: its own definition, else the first controller
        (in name order) whose predicate matches."""
        entity = self.context.entity
        defined = entity.entity_list("queues").entities.get(name)
        if defined is not None:
            return defined.config
        controllers = entity.entity_list("queue-controllers").entities
        for controller_name in sorted(controllers):
            controller = controllers[controller_name]
            if like_pattern(controller.get("predicate")).matches(name):
                return controller.config
        return QueueSettings()

    def queue(self, address: str, *, create: bool | None = None, creator: Creator | None = None) -> Queue:
        """The local queue for ``address``, created if allowed (``create`` overrides
        ``auto-create-queues``).

        A temporary name (``tmp$…``) is never created on first use: its queue went with its
        owner, and a send to it must fail rather than make a queue nobody reads.

        Raises:
            QueueNotFound: unknown and not to be created, or no route.
            TooManyQueues: unknown, to be auto-created (``create`` not given), and no room
                for ``creator`` (:meth:`check_room`).
            QueueError: an invalid queue name.
        """
        name = self._resolve(address)
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        if create is None and name.startswith(TEMPORARY_PREFIX):  # deleted with its owner: not made anew
            raise QueueNotFound(
                f"temporary queue {name!r} does not exist on router {self.router_name} "
                "(it was deleted with the connection or link that created it)"
            )
        if not (self.auto_create_queues if create is None else create):
            raise QueueNotFound(f"queue {name!r} does not exist on router {self.router_name}")
        check_queue_name(name)
        if create is None:  # auto-created (explicit creates: recovery; durable subscriptions check_room first)
            self.check_room(name, creator)
            creator = creator or Creator()
        return self._create(name, self.settings_for(name), creator=creator)

    def when_backlog_cleared(self, address: str, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While sends to ``address`` are slowed down — its queue's backlog (:attr:`Queue.backlog`) is above its
        ``flowcontrol-start-queuesize``, with or without consumers — call ``callback`` once a consumed message
        brings it back to that size, and return a function that cancels the call; None when
        the queue is not slowing sends now. (A listener holding a producer back for a
        flow-control delay lets it go early with this.)"""
        try:
            queue = self.queues.get(self._resolve(address))
        except QueueError:  # no route any more
            return None
        if queue is None or not 0 <= queue.settings.flowcontrol_start_queuesize < queue.backlog:
            return None
        return wait_in(queue.backlog_callbacks, callback)

    def when_room(self, name: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` once there may be room: the memory alarm or the disk alarm is off,
        or queue ``name`` has room (at once if there is no such queue)."""
        if self._memory.when_clear(callback) is not None:  # (a MemoryFull names no queue)
            return
        store = self._persistence.store
        if store is not None and store.space.when_clear(callback) is not None:  # (nor a DiskFull)
            return
        queue = self.queues.get(name)
        if queue is None:
            callback()
        else:
            queue.room_callbacks.append(callback)

    def check_room(self, name: str, creator: Creator | None = None) -> None:
        """Raises TooManyQueues unless one more queue (auto-created, temporary, or a new
        durable subscription's) for ``creator`` (None: a client not named) fits: see
        :class:`.budget.QueueBudget`. (Queues defined in the config, and those recovered at
        start, are created regardless.)"""
        self.budget.check(name, creator or Creator(), len(self.queues), self.router_name)

    def _create(self, name: str, settings: QueueSettings, owner: Any = None, creator: Creator | None = None) -> Queue:
        queue = self.queues[name] = Queue(self._services, name, settings, owner=owner)
        self.budget.created(name, creator)
        if self._usage is not None:
            # The api protocols take back any Entry or Consumer; the implementation only its own
            # (those it handed out), so mypy does not count it as one (context.lookup casts too).
            offer_operations(self._services, queue, self._usage.add(name, queue.usage))  # type: ignore[arg-type]
        return queue

    def create_temporary_queue(self, owner: Any, creator: Creator | None = None) -> Queue:
        """A new ``tmp$<n>`` queue, deleted by :meth:`delete_temporary_queues` (owner), made
        for ``creator`` (None: a client not named).

        Raises:
            TooManyQueues: no room for ``creator`` (:meth:`check_room`).
        """
        creator = creator or Creator()
        self.check_room("tmp$<n>", creator)
        self._temporary += 1
        name = f"{TEMPORARY_PREFIX}{self._temporary}"
        while name in self.queues:
            self._temporary += 1
            name = f"{TEMPORARY_PREFIX}{self._temporary}"
        return self._create(name, self.settings_for(name), owner, creator)

    def delete_temporary_queues(self, owner: Any) -> None:
        for queue in [q for q in self.queues.values() if q.owner is owner]:
            self.delete_queue(queue.name)

    def delete_queue(self, name: str, *, quiet: bool = False) -> None:
        """Delete a queue with its messages; its consumers are closed.

        Raises:
            QueueNotFound: no such queue.
            QueueError: a predefined queue.
        """
        if name in PREDEFINED:
            raise QueueError(f"queue {name} is predefined and cannot be deleted")
        queue = self.queues.pop(name, None)
        if queue is None:
            raise QueueNotFound(f"queue {name!r} does not exist on router {self.router_name}")
        queue.deleted = True
        self.budget.deleted(name)
        for consumer in list(queue.consumers):
            consumer.close()
        dropped = queue.drop_all()
        queue.room_made()  # (those waiting find it gone)
        self._persistence.defer(*(DeleteMessage(entry.id) for entry in dropped if entry.persistent))
        if self._usage is not None:
            self._usage.remove(name)
        # every client's temporary queue goes when it leaves (each admin call's reply queue),
        # and routing retires the empty queues of routers gone (their count is logged): routine,
        # unless it took messages with it
        routine = quiet or (queue.owner is not None and not dropped)
        log.log(
            logging.DEBUG if routine else logging.INFO, "queue %s deleted (%d message(s) dropped)", name, len(dropped)
        )

    def _queue_configured(self, entity: Entity) -> None:
        settings = entity.config
        queue = self.queues.get(entity.name)
        if queue is None:
            self._create(entity.name, settings)
        else:
            queue.settings = settings
            queue.room_made()
        entity.on_change(lambda change: self._queue_changed(entity.name, change))

    def _queue_changed(self, name: str, change: Change) -> None:
        queue = self.queues.get(name)
        if queue is not None:  # listeners run before the change is committed: apply it
            queue.settings = attrs.evolve(queue.settings, **{change.field: change.new})
            queue.room_made()  # (a waiting sender looks again in a job of its own, after this)

    def _messages_of(self, entity: Entity) -> int:
        """What deleting the queue of ``entity`` drops."""
        queue = self.queues.get(entity.name)
        return queue.size if queue is not None else 0

    def _queue_unconfigured(self, entity: Entity) -> None:
        queue = self.queues.get(entity.name)
        if queue is not None and queue.consumers:
            raise Veto(f"queue {entity.name} has {len(queue.consumers)} consumer(s)")
        if queue is not None:
            self.delete_queue(entity.name)

    async def tick_forever(self) -> None:
        """Every second: each queue's rates, and the cleanup of its expired messages when due."""
        while True:
            await trio.sleep(1)
            clock = time.monotonic()
            for queue in list(self.queues.values()):
                queue.sample_rates()
                if clock >= queue.next_cleanup:
                    queue.next_cleanup = clock + queue.settings.cleanup_interval / 1000
                    removed = queue.remove_expired()
                    if removed:
                        log.info("queue %s: %d expired message(s) removed", queue.name, removed)
