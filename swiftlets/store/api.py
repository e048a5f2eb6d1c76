"""The store's public interface: what other swiftlets may call and the operations they send.

A swiftlet gets the store with ``context.lookup("sys$store", Store)`` and uses only what is
defined here, so a second backend (PostgreSQL, say) can implement the same protocol.

Everything persistent goes through :meth:`Store.commit`: a list of operations applied
atomically — all or nothing, even across a crash — and durable when the call returns
(as durable as the configured ``sync`` mode makes it). Commits from many tasks are
batched into one database transaction (group commit), so callers should commit from
concurrent tasks rather than serialise their commits.

Operations are plain named tuples (cheap: the queue manager creates one per message).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import attrs
import trio

from martinet.kernel import ExplainedError

__all__ = [
    "Store",
    "Space",
    "until_clear",
    "StoreError",
    "Recovered",
    "StoredMessage",
    "PutMessage",
    "DeleteMessage",
    "SetDeliveryCount",
    "SetMessageBody",
    "SetTransaction",
    "PutRecord",
    "DeleteRecord",
    "RememberId",
    "Op",
]


class StoreError(ExplainedError):
    """The store could not apply a commit (disk full, I/O error, closed store), or refuses to
    start (a store that existed is empty or damaged); the message says what and where."""


class PutMessage(NamedTuple):
    """Store message ``id`` (unique, ascending in send order) of ``queue``; ``txid`` set
    means it belongs to a prepared transaction and is not yet part of the queue."""

    id: int
    queue: str
    body: bytes
    delivery_count: int = 0
    txid: str | None = None


class DeleteMessage(NamedTuple):
    id: int


class SetDeliveryCount(NamedTuple):
    id: int
    delivery_count: int


class SetMessageBody(NamedTuple):
    """Replace the stored bytes of message ``id`` (a consumer's modified outcome annotated it)."""

    id: int
    body: bytes


class SetTransaction(NamedTuple):
    """Move message ``id`` into (``txid``) or out of (``None``) a prepared transaction."""

    id: int
    txid: str | None


class PutRecord(NamedTuple):
    """Store ``value`` under (``kind``, ``key``), replacing what was there.

    Kinds in use: ``xa`` (prepared transactions), ``durable`` (durable subscriptions)."""

    kind: str
    key: str
    value: bytes


class DeleteRecord(NamedTuple):
    kind: str
    key: str


class RememberId(NamedTuple):
    """Add ``message_id`` to the duplicate-detection backlog of ``queue``, which keeps
    the newest ``keep`` ids."""

    queue: str
    message_id: str
    keep: int


Op = (
    PutMessage
    | DeleteMessage
    | SetDeliveryCount
    | SetMessageBody
    | SetTransaction
    | PutRecord
    | DeleteRecord
    | RememberId
)


class StoredMessage(NamedTuple):
    """A message as recovered at start.

    ``body`` holds only the leading sections of the stored bytes — those before the
    message's body: header, annotations, properties, application-properties (see
    :func:`messaging.message.head_length`) — when it is shorter than ``size``, the length
    of the stored bytes; :meth:`Store.read_messages` reads them in full. So recovery does
    not bring every stored body into the router's memory: the queue manager reads back
    what it keeps in memory (a queue's ``cache-size``) and leaves the rest in the store.
    """

    id: int
    queue: str
    body: bytes
    delivery_count: int
    txid: str | None
    size: int

    @property
    def complete(self) -> bool:
        """``body`` is the whole stored message."""
        return len(self.body) == self.size


@attrs.frozen
class Recovered:
    """Everything the store held at start, except the messages
    (:meth:`Store.take_recovered_messages` hands those over once).

    Attributes:
        message_count: how many messages were recovered.
        records: ``{kind: {key: value}}``.
        remembered_ids: ``{queue: [message ids, oldest first]}``.
        next_id: an id larger than any stored.
    """

    message_count: int
    records: Mapping[str, Mapping[str, bytes]]
    remembered_ids: Mapping[str, Sequence[str]]
    next_id: int


class Space(Protocol):
    """The disk alarm of a store (:attr:`Store.space`): on while the store's file system has
    less free space than ``disk-free-limit-kb``, or a commit met a full disk. Meanwhile new
    persistent messages are refused and senders that can wait (routing links) wait."""

    @property
    def on(self) -> bool:
        """The alarm is on now."""

    def describe(self) -> str:
        """Why it is on, in words for an error message."""

    def when_clear(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """While the alarm is on, call ``callback`` once it ends and return a function that
        cancels the call; None when it is off."""


async def until_clear(space: Space) -> None:
    """Wait until the disk alarm ``space`` is off."""
    while space.on:
        cleared = trio.Event()
        cancel = space.when_clear(cleared.set)
        try:
            await cleared.wait()
        finally:
            if cancel is not None:
                cancel()


@runtime_checkable
class Store(Protocol):
    """What ``context.lookup("sys$store", Store)`` returns."""

    @property
    def space(self) -> Space:
        """The store's disk alarm."""

    @property
    def recovered(self) -> Recovered:
        """The state loaded at start, but the messages (read it while starting).

        Raises:
            StoreError: the store has not been opened.
        """

    def take_recovered_messages(self) -> list[StoredMessage]:
        """Every message stored at start, in ascending id order; once. A message's
        ``body`` is only its leading sections unless :attr:`StoredMessage.complete`.

        The store keeps no reference to them afterwards, so the caller (the queue manager)
        owns them: recovered messages are freed as they are consumed, as live ones are.

        Raises:
            StoreError: the store has not been opened, or the messages were taken already.
        """

    async def commit(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` atomically and durably.

        Cancelling the caller does not cancel the commit: the operations are applied (or
        fail) all the same.

        Raises:
            StoreError: the commit failed; none of its operations were applied. The store
                then stops the router, since it can no longer keep its promises. (A full
                disk is not a failure: the commit waits until space returns, see
                :class:`Space`.)
        """

    def commit_nowait(self, ops: Sequence[Op], on_done: Callable[[BaseException | None], None]) -> None:
        """Like :meth:`commit`, without waiting: ``on_done(None)`` is called once the
        operations are durable, ``on_done(error)`` if they failed. For callers with many
        commits in flight (a listener settling deliveries) that should not need a task each.
        Commits become durable, and their ``on_done`` is called, in the order they were
        queued (:meth:`commit`'s and this method's alike): callers rely on it for order.

        Raises:
            StoreError: the store is not running.
        """

    async def read_messages(self, ids: Sequence[int]) -> Mapping[int, bytes]:
        """The stored bodies of messages ``ids``, read back from the store (for a queue
        that keeps only the metadata of messages beyond a threshold in memory).

        The result maps each id to its body as :class:`PutMessage` stored it; ids with no
        stored message (never committed, or deleted) are left out. A read sees every commit
        acknowledged before it was asked (reads are served between group commits, in order
        with them), and it never waits for commits asked after it. The read does not block
        the router's event loop; cancelling the caller abandons the answer, nothing else.

        Raises:
            StoreError: the store is not running, or the read failed (the store keeps
                running: a failed read breaks no promise).
        """
