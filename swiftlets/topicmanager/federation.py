"""Publish/subscribe across the router network (SwiftMQ's federated topic managers).

Theory of operation
-------------------
**Interest, some/none, per root topic.** A router's interest is the set of root topics that
have at least one local subscription (durable ones count, connected or not). It travels as
an *interest record* (:class:`InterestRecord`, versioned JSON, docs/topicmanager.md, "Topics
across routers") sent as an ordinary non-persistent message to ``sys$topic@R`` for every active
destination ``R`` of the routing table, so the routing network carries it however many hops
away ``R`` is. A record always holds the *whole* set (after the announce filter for ``R``),
never a change: it is sent when the set changes, again on every activation of ``R``
(``DestinationActivated``: a link flap, ``R`` restarting, a new route) and, when this router
stops orderly, with its durable subscriptions' roots only. SwiftMQ has a stopping router
unsubscribe from everything, so that its durable subscribers lose what is published while it
is down unless the others hold a static subscription with ``keep-on-unsubscribe``; here a
stop (orderly or a crash) never withdraws durable interest: a maintenance restart loses
nothing. What only non-durable subscribers wanted is withdrawn (they are gone). A node
leaves the network as in SwiftMQ: its clients unsubscribe (their durable
subscriptions too), then it stops; or an operator deletes its remote subscriptions. Empty
records are sent only by a router that has ever sent a non-empty one (a store record says
so): one that never had interest in anything has nothing to withdraw, and its routing links
carry none of its records — unless a router asks for one: a router holding static
subscriptions to ``R`` that has not heard from ``R`` yet sets ``reply`` in its own records
to ``R``, and ``R`` answers with its record. The receiver keeps the newest record per
router, by (epoch, sequence): the epoch is the sender's start time (above the one in its
store, if the clock went back), so a restarted router replaces what it said before, and a
record overtaken on another path is ignored. The newest record of each router is kept in the
store (``federation``/``interest:<router>``, written before the record is acknowledged) and
applied again at start: a router restarted after a crash forwards what its publishers send
at once, not only after the other routers' records have come again (publications of that gap
were lost for remote durable subscribers).

**Remote subscriptions.** A record's roots become remote subscriptions of its router (usage
``remote-router-subscriptions/<router>/topics/<root>``). A message *published locally* under
such a root is sent, by the queue manager, to ``tpc$<root>@<router>`` — into ``rt$<router>``
and over the exactly-once transfer — annotated with its topic (``x-opt-martinet-topic``) and
its publisher's client id (``x-opt-martinet-cid``). At the far end the topic manager consumes
its local queue ``tpc$<root>`` and delivers each message to its own matching subscribers
(hierarchy, predicates, selectors, no-local by that client id); persistent ones in one local
transaction per batch together with their acknowledgements, so a crash delivers a batch
entirely or not at all (non-persistent ones at once, as a local publish). It never forwards
such a message again: only local publications are forwarded, which is why each subscriber
gets each message once in rings and meshes alike.

**Static remote subscriptions** (config) exist from the start; they need a static
route to their router (checked at start and when one is added; a static route keeps
``rt$<router>`` and its messages while the router is unreachable). The router's first
record replaces them, except those with ``keep-on-unsubscribe``, which keep forwarding
whatever it announces. An operator may delete a remote subscription (the management
operation ``delete``, for a router taken out of service); the router's next record brings
it back if it still has interest.

Sans-IO: :class:`InterestRecord` and :class:`RemoteSubscriptions` hold the rules;
:class:`Federation` is the trio shell (consumers, bus events), :class:`SubscriptionListing`
their mirror in usage.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from martinet.kernel import Change, Entity, ManagementError, SwiftletContext, Usage, UsageList, Veto
from martinet.messaging.codec import Symbol, UInt
from martinet.messaging.message import Message, build
from martinet.swiftlets.queuemanager.api import Consumer, QueueError, QueueManager, check_queue_name
from martinet.swiftlets.routing.api import DestinationActivated, Routing
from martinet.swiftlets.store.api import DeleteRecord, PutRecord, Store

from .api import TopicError
from .config import AnnounceFilter
from .forwarded import ForwardedDelivery
from .hierarchy import TopicName

__all__ = [
    "INTEREST_QUEUE",
    "REMOTE_PREFIX",
    "SOURCE",
    "TOPIC",
    "PUBLISHER",
    "InterestRecord",
    "RemoteSubscriptions",
    "Federation",
    "AllDurable",
]

log = logging.getLogger(__name__)

#: The queue that receives other routers' interest records (``sys$topic@<router>``).
INTEREST_QUEUE = "sys$topic"
#: ``tpc$<root>``: the queue that receives publications forwarded by other routers.
REMOTE_PREFIX = "tpc$"
#: Store records (kind ``federation``) ``interest:<router>``: the newest record applied of each router.
INTEREST_KEY = "interest:"
#: Routing's annotations (docs/routing-protocol.md §12): the router a message entered the
#: network at, its destination router and queue, the hops so far.
SOURCE = Symbol("x-opt-martinet-src")
DESTINATION = Symbol("x-opt-martinet-dest")
QUEUE = Symbol("x-opt-martinet-queue")
HOPS = Symbol("x-opt-martinet-hops")
#: The topic a forwarded message was published to.
TOPIC = Symbol("x-opt-martinet-topic")
#: The publisher's client id (the listener's annotation, SwiftMQ's JMS_SWIFTMQ_CID), for no-local.
PUBLISHER = Symbol("x-opt-martinet-cid")
#: Roots of temporary topics (``tmp$topic$<router>$<n>``): their ``tpc$`` queue goes with their interest.
TEMPORARY_ROOT_PREFIX = "tmp$"
RECORD_VERSION = 1
CREDIT = 100  # interest records taken from sys$topic ahead


@attrs.frozen
class InterestRecord:
    """Everything ``router`` announces to one other router: the roots it has subscriptions under."""

    router: str
    epoch: int  # the sender's start, ns since the epoch: a restart supersedes earlier records
    seq: int  # per sender and epoch, ascending
    roots: frozenset[str]
    reply: bool = False  # the sender waits for the receiver's record (it holds static subscriptions to it)

    def body(self) -> bytes:
        """The record as JSON (the message body, and the store record of the receiver)."""
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "router": self.router,
                "epoch": self.epoch,
                "seq": self.seq,
                "roots": sorted(self.roots),
                "reply": self.reply,
            }
        ).encode()

    def encode(self) -> Message:
        return build(self.body(), subject="topic-interest", content_type="application/json")

    @classmethod
    def decode(cls, message: Message) -> InterestRecord:
        """Raises: ValueError (with what is wrong) for a record this version cannot read."""
        return cls.parse(message.body())

    @classmethod
    def parse(cls, body: bytes) -> InterestRecord:
        """Raises: ValueError (with what is wrong) for a record this version cannot read."""
        try:
            data = json.loads(body)
            if data["version"] != RECORD_VERSION:
                raise ValueError(f"version {data['version']!r}, this router reads {RECORD_VERSION}")
            roots = data["roots"]
            if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
                raise ValueError("roots must be a list of strings")
            if not isinstance(data["router"], str) or not all(isinstance(data[k], int) for k in ("epoch", "seq")):
                raise ValueError("router must be a string, epoch and seq integers")
            reply = data.get("reply", False)
            if not isinstance(reply, bool):
                raise ValueError("reply must be a boolean")
            return cls(data["router"], data["epoch"], data["seq"], frozenset(roots), reply)
        except (TypeError, KeyError, json.JSONDecodeError) as exc:
            raise ValueError(f"malformed interest record: {type(exc).__name__}: {exc}") from None


@attrs.define(eq=False)
class RemoteSubscription:
    router: str
    root: str
    static: bool = False  # from the config
    keep: bool = False  # keep-on-unsubscribe
    announced: bool = False  # the router's newest record names the root
    forwarded: int = 0
    unroutable: int = 0  # the forward was refused (the router is unknown, the routing queue is full)

    def usage(self) -> dict[str, Any]:
        return {
            "forwarded": self.forwarded,
            "unroutable": self.unroutable,
            "static": self.static,
            "keep-on-unsubscribe": self.keep,
            "announced": self.announced,
        }


class RemoteSubscriptions:
    """Remote subscriptions by router and root, and the rules that change them (no I/O)."""

    def __init__(self, local: str):
        self.local = local
        self.routers: dict[str, dict[str, RemoteSubscription]] = {}
        self._newest: dict[str, tuple[int, int]] = {}  # router → (epoch, seq) of its newest record
        self._by_root: dict[str, tuple[RemoteSubscription, ...]] = {}

    def of_root(self, root: str) -> tuple[RemoteSubscription, ...]:
        """The remote subscriptions a publication under ``root`` is forwarded to."""
        found = self._by_root.get(root)
        if found is None:
            found = self._by_root[root] = tuple(
                s for subs in self.routers.values() for s in subs.values() if s.root == root
            )
        return found

    def heard_from(self, router: str) -> bool:
        """Whether a record of ``router`` was applied (its static subscriptions then ended)."""
        return router in self._newest

    def add_static(self, router: str, root: str, *, keep: bool) -> None:
        subscription = self.routers.setdefault(router, {}).setdefault(root, RemoteSubscription(router, root))
        subscription.static, subscription.keep = True, keep
        self._by_root.clear()

    def remove_static(self, router: str, root: str) -> None:
        subscription = self.routers.get(router, {}).get(root)
        if subscription is not None:
            subscription.static = subscription.keep = False
            if not subscription.announced:
                self.delete(router, root)

    def apply(self, record: InterestRecord) -> bool:
        """Take ``record`` as its router's whole interest; False when it is older than one
        applied before (or comes from this router). A router's first record ends the static
        subscriptions without keep-on-unsubscribe that it does not name."""
        if record.router == self.local or self._newest.get(record.router, (-1, -1)) >= (record.epoch, record.seq):
            return False
        self._newest[record.router] = (record.epoch, record.seq)
        subscriptions = self.routers.setdefault(record.router, {})
        for root in record.roots:
            subscriptions.setdefault(root, RemoteSubscription(record.router, root)).announced = True
        for root, subscription in list(subscriptions.items()):
            if root not in record.roots:
                subscription.announced = False
                if not subscription.keep:
                    del subscriptions[root]
        if not subscriptions:
            del self.routers[record.router]
        self._by_root.clear()
        return True

    def delete(self, router: str, root: str | None = None) -> None:
        """Delete one remote subscription (or all of ``router``'s) until the next record.

        Raises: TopicError: there is none."""
        subscriptions = self.routers.get(router, {})
        if root is not None and root not in subscriptions or not subscriptions:
            raise TopicError(f"no remote router subscription {router}/{root or '*'}")
        for name in [root] if root is not None else list(subscriptions):
            del subscriptions[name]
        if not subscriptions:
            del self.routers[router]
        self._by_root.clear()


class AllDurable:
    """Calls ``done(error)`` once every copy of one publication is durable (local fan-out and
    forwards); :meth:`add` counts a copy, :meth:`one` reports one. It starts with one pending
    copy, the caller's, released by its last :meth:`one` once everything is sent."""

    def __init__(self, done: Callable[[BaseException | None], None]):
        self._done = done
        self._pending = 1
        self._error: BaseException | None = None

    def add(self) -> Callable[[BaseException | None], None]:
        self._pending += 1
        return self.one

    def one(self, error: BaseException | None = None) -> None:
        self._error = self._error or error
        self._pending -= 1
        if self._pending == 0:
            self._done(self._error)


def federable(root: str) -> bool:
    """Whether ``tpc$<root>`` can name a queue (a root with ``@``, ``/`` or spaces stays local)."""
    try:
        check_queue_name(REMOTE_PREFIX + root)
    except QueueError:
        return False
    return True


class SubscriptionListing:
    """Usage ``remote-router-subscriptions/<router>/topics/<root>`` in line with
    ``subscriptions``, each entry with the operation ``delete`` (``delete(router, root)``,
    ``root`` None for all of a router's)."""

    def __init__(self, subscriptions: RemoteSubscriptions, usage: UsageList, delete: Callable[[str, str | None], None]):
        self.subscriptions = subscriptions
        self._usage = usage
        self._delete = delete
        self._listed: dict[str, tuple[UsageList, set[str]]] = {}  # router → its usage list of roots, listed

    def update(self, router: str) -> None:
        """Bring ``router``'s entry in line with its subscriptions now."""
        subscriptions = self.subscriptions.routers.get(router, {})
        if not subscriptions:
            self._listed.pop(router, None)
            self._usage.remove(router)
            return
        if router not in self._listed:
            entry: Usage = self._usage.add(router, lambda: {"topics": len(self.subscriptions.routers.get(router, {}))})
            entry.add_operation(
                "delete",
                lambda: self._delete(router, None),
                f"Delete every remote subscription of router {router} (until it announces again).",
            )
            self._listed[router] = (entry.add_list("topics"), set())
        topics, listed = self._listed[router]
        for root in listed - subscriptions.keys():
            topics.remove(root)
        for root in subscriptions.keys() - listed:
            subscription = subscriptions[root]
            topics.add(root, subscription.usage).add_operation(
                "delete",
                lambda root=root: self._delete(router, root),
                f"Delete the remote subscription of router {router} to {root} (until it announces again).",
            )
        listed.clear()
        listed.update(subscriptions)


class Federation:
    """The topic manager's part in the network: announces, forwards, receives.

    ``interest(durable_only=False)`` is the local interest now; ``deliver(message, transaction)`` delivers a
    forwarded message to local subscribers (the manager's): staged in ``transaction``, or
    at once when it is None."""

    def __init__(
        self,
        context: SwiftletContext,
        queue_manager: QueueManager,
        interest: Callable[..., frozenset[str]],
        deliver: Callable[[Message, Any], None],
    ):
        self.context = context
        self.local = context.router_name
        self.subscriptions = RemoteSubscriptions(self.local)
        self._queue_manager = queue_manager
        self._interest = interest
        self._epoch = time.time_ns()
        self._seq = itertools.count(1)
        self._routing: Routing | None = None
        self._nursery: trio.Nursery | None = None
        self._forwarded = ForwardedDelivery(queue_manager, deliver)
        self._filters: dict[str, AnnounceFilter] = {}  # by remote router
        self._listing = SubscriptionListing(
            self.subscriptions, context.usage.add_list("remote-router-subscriptions"), self.delete
        )
        self._store: Store | None = None
        self._announced = False  # a non-empty record left this router, in this run or before (store)
        self.records_sent = 0  # interest records
        self.records_received = 0

    # -- running ----------------------------------------------------------------------------------

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Announce, forward and receive until cancelled; ``store`` keeps the last epoch.

        Raises: TopicError (at start): a static remote subscription without a static route."""
        entity = self.context.entity
        entity.entity_list("static-remote-router-subscriptions").bind(
            self._static_router_added, self._static_router_removed
        )
        entity.entity_list("announce-filters").bind(self._filter_added, self._filter_removed)
        try:
            self.context.management.resolve("/sys$routing")
        except ManagementError:  # no routing on this router: no federation (and no sys$topic queue)
            task_status.started()
            await trio.sleep_forever()
        await self._new_epoch(store)
        with self.context.bus.subscribe(DestinationActivated, max_buffer=100_000) as activated:
            async with trio.open_nursery() as nursery:
                self._nursery = self._forwarded.nursery = nursery
                nursery.start_soon(self._receive_records, self._queue_manager.queue(INTEREST_QUEUE, create=True))
                for name in list(self._queue_manager.queues):  # forwarded messages recovered from the store
                    if name.startswith(REMOTE_PREFIX):
                        self.listen(name[len(REMOTE_PREFIX) :])
                for root in self._interest():
                    self.listen(root)
                if self._lookup_routing() is not None:  # routing started first: its destinations are active already
                    self.interest_changed()
                nursery.start_soon(self._follow_activations, activated)
                self.context.before_stop(self._goodbye)  # (before routing's: it then carries the records)
                task_status.started()

    async def _new_epoch(self, store: Store) -> None:
        """An epoch above every earlier one of this router, even if the clock went back:
        other routers ignore records of an epoch not newer than the last they applied. And
        the remote subscriptions of the newest records kept in ``store``, so that what is
        published before the other routers' records come again is forwarded."""
        records = store.recovered.records.get("federation", {})
        stored = records.get("epoch")
        if stored is not None and int(stored) >= self._epoch:
            self._epoch = int(stored) + 1
        self._store = self._forwarded.store = store
        self._announced = "announced" in records
        for key, body in sorted(records.items()):
            if key.startswith(INTEREST_KEY):
                try:
                    self._apply(InterestRecord.parse(body))
                except ValueError as exc:  # e.g. from another version: that router's next record replaces it
                    log.warning("stored interest record %s ignored: %s", key, exc)
        await store.commit([PutRecord("federation", "epoch", str(self._epoch).encode())])

    def _lookup_routing(self) -> Routing | None:
        if self._routing is None:
            try:
                self._routing = self.context.lookup("sys$routing", Routing)
            except LookupError:  # a router without routing: no federation
                return None
        return self._routing

    async def _follow_activations(self, activated: Any) -> None:
        async for event in activated:
            self._lookup_routing()
            self._announce(event.router)

    def _check_static_route(self, router: str) -> None:
        """Raises: TopicError: sys$routing has no static route to ``router``."""
        try:
            routes = self.context.management.entity_list("/sys$routing/static-routes").entities
        except ManagementError:  # sys$routing is not configured on this router
            routes = {}
        if router not in routes:
            raise TopicError(
                f"/{self.context.name}/static-remote-router-subscriptions/{router}: a static remote "
                f"subscription needs a static route to {router} (/sys$routing/static-routes/{router})"
            )

    async def _goodbye(self) -> None:
        """The router stops orderly: every active destination hears the interest of the
        durable subscriptions only (they keep theirs while this router is down); what only
        non-durable subscribers wanted goes. Sent before routing's last transfers."""
        for router in self._active():
            self._announce(router, durable_only=True)

    # -- announcing ---------------------------------------------------------------------------------

    def _active(self) -> list[str]:
        routing = self._routing
        return [d.name for d in routing.destinations() if d.active] if routing is not None else []

    def interest_changed(self) -> None:
        """The local interest changed: every active destination gets the new whole record."""
        for router in self._active():
            self._announce(router)

    def _announce(self, router: str, *, answer: bool = False, durable_only: bool = False) -> None:
        """Send ``router`` our whole interest (``durable_only``: of durable subscriptions);
        ``answer``: even if empty (it asked)."""
        roots = frozenset(r for r in self._interest(durable_only=durable_only) if federable(r))
        announce_filter = self._filters.get(router)
        if announce_filter is not None:
            listed = frozenset(announce_filter.roots.split())
            roots = roots & listed if announce_filter.mode == "include" else roots - listed
        self._send_record(router, roots, answer=answer)

    def _send_record(self, router: str, roots: frozenset[str], *, answer: bool = False) -> None:
        # Static subscriptions to ``router`` wait for its first record: ask it for one.
        reply = router in self.subscriptions.routers and not self.subscriptions.heard_from(router)
        if not (roots or self._announced or answer or reply):
            return  # no router has ever heard of interest here: nothing to withdraw
        if roots and not self._announced and self._nursery is not None:
            self._announced = True
            assert self._store is not None  # _new_epoch set it before the nursery started
            self._nursery.start_soon(self._store.commit, [PutRecord("federation", "announced", b"1")])
        record = InterestRecord(self.local, self._epoch, next(self._seq), roots, reply)
        try:
            self._queue_manager.send_nowait(f"{INTEREST_QUEUE}@{router}", record.encode())
        except QueueError as exc:  # the destination went meanwhile: its next activation sends again
            log.info("interest record for router %s not sent: %s", router, exc)
            return
        self.records_sent += 1

    def _filter_added(self, entity: Entity) -> None:
        self._filters[entity.name] = entity.config
        entity.on_change(lambda change: self._filter_changed(entity.name, change))
        self._announce_if_active(entity.name)

    def _filter_changed(self, router: str, change: Change) -> None:
        self._filters[router] = attrs.evolve(self._filters[router], **{change.field: change.new})
        self._announce_if_active(router)

    def _filter_removed(self, entity: Entity) -> None:
        self._filters.pop(entity.name, None)
        self._announce_if_active(entity.name)

    def _announce_if_active(self, router: str) -> None:
        if router in self._active():
            self._announce(router)

    # -- receiving records ---------------------------------------------------------------------

    async def _receive_records(self, queue: Any) -> None:
        consumer: Consumer = queue.consumer(owner=self)
        consumer.flow(CREDIT)
        while True:
            entry = await consumer.receive()
            try:
                record = InterestRecord.decode(entry.message)
            except ValueError as exc:
                log.warning("interest record in %s dropped: %s", INTEREST_QUEUE, exc)
            else:
                self.records_received += 1
                if self._apply(record):
                    assert self._store is not None  # _new_epoch set it before the nursery started
                    await self._store.commit([PutRecord("federation", INTEREST_KEY + record.router, record.body())])
                    if record.reply:
                        self._announce(record.router, answer=True)
            consumer.accept(entry)
            consumer.flow(1)

    def _apply(self, record: InterestRecord) -> bool:
        """Take ``record`` (see :meth:`RemoteSubscriptions.apply`); log and list what it changed."""
        if not self.subscriptions.apply(record):
            return False
        log.info("interest of router %s: %s", record.router, " ".join(sorted(record.roots)) or "none")
        self._listing.update(record.router)
        return True

    # -- forwarding ------------------------------------------------------------------------------

    def forward(
        self, topic: TopicName, message: Message, client_id: str | None, durable: AllDurable | None
    ) -> tuple[int, int]:
        """Send a local publication to every router subscribed to its root; returns the
        largest flow-control delay and the number of routers it went to. A router the
        queue manager refuses (unknown, its routing queue full) is counted as unroutable."""
        subscriptions = self.subscriptions.of_root(topic.root)
        if not subscriptions:
            return 0, 0
        queue = REMOTE_PREFIX + topic.root
        changes: dict[Any, Any] = {TOPIC: topic.text, SOURCE: self.local, QUEUE: queue, HOPS: UInt(0)}
        if client_id is not None:
            changes[PUBLISHER] = client_id
        delay = sent = 0
        for subscription in subscriptions:
            # The routing annotations are set here, with ours in one patch: routing's rewrite keeps
            # them (a message that has them is already travelling), and stale ones of a message that
            # travelled before and is published again are replaced.
            changes[DESTINATION] = subscription.router
            try:
                result = self._queue_manager.send_nowait(
                    f"{queue}@{subscription.router}",
                    message.with_annotations(changes),
                    on_durable=durable.add() if durable else None,
                )
            except QueueError as exc:
                if durable is not None:
                    durable.one()  # the copy counted by add() never comes
                if not subscription.unroutable:
                    log.warning(
                        "publication under %s not forwarded to router %s: %s (logged once per remote "
                        "subscription; see its unroutable count)",
                        topic.root,
                        subscription.router,
                        exc,
                    )
                subscription.unroutable += 1
                continue
            subscription.forwarded += 1
            sent += 1
            delay = max(delay, result.delay_ms)
        return delay, sent

    # -- receiving forwarded publications ----------------------------------------------------------

    def listen(self, root: str) -> None:
        """Consume ``tpc$<root>`` from now on (called when the root gets local interest)."""
        if self._forwarded.listening(root) or not federable(root) or self._nursery is None:
            return
        self._forwarded.listen(root, self._queue_manager.queue(REMOTE_PREFIX + root, create=True))

    def interest_lost(self, root: str) -> None:
        """The last local subscription under ``root`` went: announce it; a temporary topic's
        ``tpc$`` queue goes too (its name is never used again)."""
        self.interest_changed()
        if root.startswith(TEMPORARY_ROOT_PREFIX) and self._forwarded.stop(root):
            if REMOTE_PREFIX + root in self._queue_manager.queues:
                self._queue_manager.delete_queue(REMOTE_PREFIX + root)

    # -- the operator's delete -----------------------------------------------------------------------

    def delete(self, router: str, root: str | None = None) -> None:
        """The operator's delete of a remote subscription (a router taken out of service).
        The router's stored record goes too (a restart forgets all its subscriptions).

        Raises: Veto: there is none."""
        try:
            self.subscriptions.delete(router, root)
        except TopicError as exc:
            raise Veto(str(exc)) from None
        log.info("remote router subscription %s/%s deleted by the operator", router, root or "*")
        self._listing.update(router)
        if self._nursery is not None:  # a restart must not bring it back: forget the router's record
            assert self._store is not None  # _new_epoch set it before the nursery started
            self._nursery.start_soon(self._store.commit, [DeleteRecord("federation", INTEREST_KEY + router)])

    # -- static remote subscriptions --------------------------------------------------------------

    def _static_router_added(self, entity: Entity) -> None:
        router = entity.name
        try:
            self._check_static_route(router)
        except TopicError as exc:
            raise Veto(str(exc)) from None
        entity.entity_list("static-topic-subscriptions").bind(
            lambda topic: self._static_topic_added(router, topic),
            lambda topic: self._static_topic_removed(router, topic.name),
        )

    def _static_router_removed(self, entity: Entity) -> None:
        for name in list(entity.entity_list("static-topic-subscriptions").entities):
            self._static_topic_removed(entity.name, name)

    def _static_topic_added(self, router: str, entity: Entity) -> None:
        if not federable(entity.name) or "." in entity.name:
            raise Veto(f"{entity.name!r} is not a root topic that can be forwarded")
        self.subscriptions.add_static(router, entity.name, keep=entity.config.keep_on_unsubscribe)
        entity.on_change(lambda change: self.subscriptions.add_static(router, entity.name, keep=change.new))
        self._listing.update(router)

    def _static_topic_removed(self, router: str, root: str) -> None:
        self.subscriptions.remove_static(router, root)
        self._listing.update(router)
