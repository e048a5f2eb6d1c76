"""What the queue manager does to a queue's messages on an operator's request: purge, move and
view, offered as management operations on each queue's usage entry
(``/sys$queuemanager/usage/queues/<name>``) and used by the scheduler jobs (:mod:`.jobs`).

Purging and moving consume like any consumer (through :mod:`.api`): messages delivered to
other consumers and not yet settled stay where they are, and in ``exclusive`` mode a queue
with a consumer refuses. They work in batches of :data:`BATCH`, yielding between batches,
so stopping them (a cancelled caller) ends them at a batch boundary; a move sends and
acknowledges each batch in one local transaction, so a crash moves a batch entirely or not
at all. Viewing browses: nothing is consumed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from martinet.kernel import Parameter, Usage, Veto
from martinet.messaging.message import Message, MessageError
from martinet.messaging.selector import SelectorError, compile_selector

from .api import Consumer, Entry, Queue, QueueError, QueueManager

__all__ = ["BATCH", "OWNER", "consume", "whole_messages", "purge", "move", "view", "offer_operations"]

BATCH = 500
OWNER = "queue operation"  # what an operation's (or job's) consumer shows as its owner
VIEW_MAX = 100  # messages one view returns at most
TEXT_MAX = 1000  # characters of a body a view shows


async def consume(queue: Queue, selector: Any, handle: Callable[[Consumer, list[Entry]], Awaitable[None]]) -> int:
    """Take the available messages of ``queue`` in batches and ``handle`` each batch (which
    settles them); how many were taken.

    Raises:
        QueueError: the queue refuses a consumer (exclusive and in use, or deleted).
    """
    consumer = queue.consumer(selector, owner=OWNER)
    taken = 0
    try:
        while True:
            consumer.set_credit(BATCH)
            entries = consumer.take(BATCH)
            if not entries:
                return taken
            await handle(consumer, entries)
            taken += len(entries)
            await trio.sleep(0)  # a batch boundary: other tasks run, a stop lands here
    finally:
        consumer.close()


async def whole_messages(manager: QueueManager, entries: Sequence[Entry]) -> dict:
    """The complete messages of ``entries`` (swapped-out bodies read back from the store)."""
    done = trio.Event()
    found: dict = {}

    def on_done(messages) -> None:
        found.update(messages)
        done.set()

    manager.fetch_messages(entries, on_done)
    await done.wait()
    return found


async def purge(queue: Queue) -> int:
    """Remove every available message of ``queue``; how many."""

    async def accept(consumer: Consumer, entries: list[Entry]) -> None:
        for entry in entries:
            consumer.accept(entry)

    return await consume(queue, None, accept)


async def move(manager: QueueManager, queue: Queue, target: str, selector: str = "") -> int:
    """Move the messages of ``queue`` (those ``selector`` matches) to ``target`` (``q`` or
    ``q@router``); how many.

    Raises:
        QueueError: the target refused a batch (it stays in ``queue``), or the queue refused.
        SelectorError: ``selector`` is malformed.
    """
    compiled = compile_selector(selector) if selector else None
    manager.resolve(target)  # an unknown router or invalid name is refused before anything moves

    async def send(consumer: Consumer, entries: list[Entry]) -> None:
        messages = await whole_messages(manager, entries)
        transaction = manager.transaction()
        try:
            for entry in entries:
                if entry.id in messages:  # else consumed meanwhile: nothing to move
                    transaction.send(target, messages[entry.id])
                transaction.acknowledge(consumer, entry)
            await transaction.commit()
        except QueueError:
            await transaction.rollback()
            raise

    return await consume(queue, compiled, send)


def _shown(body: Any) -> Any:
    if isinstance(body, (bytes, bytearray)):
        return {"bytes": len(body), "hex": bytes(body[: TEXT_MAX // 2]).hex()}
    if isinstance(body, str):
        return body[:TEXT_MAX]
    if body is None or isinstance(body, (bool, int, float)):
        return body
    return repr(body)[:TEXT_MAX]


async def view(manager: QueueManager, queue: Queue, start: int = 0, count: int = 10) -> list[dict[str, Any]]:
    """The available messages ``start`` to ``start + count`` (at most :data:`VIEW_MAX`) of
    ``queue`` in delivery order, as data: id, priority, delivery count, size, message-id,
    correlation-id, application-properties and the body (text cut at :data:`TEXT_MAX`)."""
    if start < 0 or not 1 <= count <= VIEW_MAX:
        raise QueueError(f"view: start must be 0 or more and count 1 to {VIEW_MAX}")
    entries = []
    for index, entry in enumerate(queue.browse()):
        if index >= start + count:
            break
        if index >= start:
            entries.append(entry)
    messages = await whole_messages(manager, entries)
    shown = []
    for entry in entries:
        message = messages.get(entry.id)
        if message is None:  # consumed meanwhile
            continue
        shown.append(
            {
                "id": entry.id,
                "priority": entry.priority,
                "delivery-count": entry.delivery_count,
                "size": len(message),
                **_sections(message),
            }
        )
    return shown


def _sections(message: Message) -> dict[str, Any]:
    """The ids, application-properties and body of ``message`` as data. The router passes a
    body through unread, so it may not decode (nested deeper than the codec's bound, say), and
    a message stored by an older version may have sections that do not: such a section is
    shown as ``{"unreadable": reason}`` and the rest of the view goes on."""
    readers = {
        "message-id": lambda: _shown(message.properties.message_id),
        "correlation-id": lambda: _shown(message.properties.correlation_id),
        "properties": lambda: {k: _shown(v) for k, v in message.application_properties.items()},
        "body": lambda: _shown(message.body()),
    }
    sections = {}
    for name, read in readers.items():
        try:
            sections[name] = read()
        except MessageError as exc:
            sections[name] = {"unreadable": str(exc)}
    return sections


def offer_operations(manager: QueueManager, queue: Queue, usage: Usage) -> None:
    """Offer purge, move and view on ``queue``'s usage entry."""

    async def do_purge() -> str:
        return f"{await purge(queue)} messages purged from {queue.name}"

    async def do_move(target: str, selector: str) -> str:
        try:
            moved = await move(manager, queue, target, selector)
        except SelectorError as exc:
            raise QueueError(f"bad selector: {exc}") from None
        return f"{moved} messages moved from {queue.name} to {target}"

    async def do_view(start: int, count: int) -> list[dict[str, Any]]:
        return await view(manager, queue, start, count)

    usage.add_operation(
        "purge",
        _refusing(do_purge),
        "Remove every available message of this queue.",
        destroys=lambda: queue.available,
    )
    usage.add_operation(
        "move",
        _refusing(do_move),
        "Move the messages (those a selector matches) to another queue, local or q@router, in local transactions.",
        [
            Parameter(name="target", description="Where they go: q or q@router."),
            Parameter(
                name="selector", description="A JMS selector; only matching messages move.", required=False, default=""
            ),
        ],
    )
    usage.add_operation(
        "view",
        _refusing(do_view),
        f"Show available messages in delivery order (at most {VIEW_MAX}); nothing is consumed.",
        [
            Parameter(
                name="start", description="Index of the first message shown.", type=int, required=False, default=0
            ),
            Parameter(
                name="count", description=f"How many to show (1 to {VIEW_MAX}).", type=int, required=False, default=10
            ),
        ],
    )


def _refusing(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``call`` with a QueueError turned into the management tree's refusal (a Veto)."""

    async def wrapped(**args: Any) -> Any:
        try:
            return await call(**args)
        except QueueError as exc:
            raise Veto(str(exc)) from None

    return wrapped
