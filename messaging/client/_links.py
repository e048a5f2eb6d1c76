"""The client's side of each link: the attach outcome, the peer's detach, and per-message work.

The engine calls these objects straight from its frame loop (``on_transfer``,
``on_outcome``; :class:`messaging.amqp.LinkHandler`): a :class:`SenderLink` resolves the
:class:`Outcome` each send awaits, a :class:`ReceiverLink` buffers what arrives and keeps
its credit near the consumer's window. Waiting is explicit: an API call that needs the
peer's answer awaits an :class:`Outcome`, which the connection's reader resolves; if the
connection is lost every outstanding one fails with :class:`ConnectionLost`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from .. import amqp
from ..amqp import (
    ACCEPTED_CODE,
    DECLARED,
    TRANSACTIONAL_STATE,
    Terminus,
)
from ..codec import Described
from ._errors import JMSError, condition_error, delivery_error

if TYPE_CHECKING:
    from ._connection import Connection

CLOSE_TIMEOUT = 5.0


class Outcome:
    """A result the peer will send: awaited by an API call, resolved by the reader."""

    __slots__ = ("_event", "value", "error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        if not self._event.is_set():
            self.value, self.error = value, error
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class Attaching:
    """What ``session.consumer(...)`` and friends return: await it for the object, or use
    it as ``async with`` to close the object at the end of the block."""

    def __init__(self, make: Callable[[], Awaitable[Any]]):
        self._make = make
        self._made: Any = None

    def __await__(self) -> Any:
        return self._make().__await__()

    async def __aenter__(self) -> Any:
        self._made = await self._make()
        return self._made

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._made.close()


class LinkState:
    """Shared link bookkeeping: the attach outcome and the peer's detach."""

    def __init__(self, connection: Connection, link: amqp.Link):
        self.connection = connection
        self.link = link
        # A handler serves one role (the engine calls on_transfer on a receiving link only,
        # on_outcome on a sending one only): each subclass has just its method, which the
        # LinkHandler protocol, listing both, cannot express.
        link.handler = self  # type: ignore[assignment]
        self.attached = Outcome()
        self.error: JMSError | None = None  # why the peer detached, or the connection ended
        self.remote_error: amqp.Error | None = None  # the condition of the peer's detach
        self.changed = trio.Event()  # credit, arrival or detach
        self.detaching = False  # we asked for the detach

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def remote_detached(self, error: amqp.Error | None) -> None:
        self.remote_error = error
        self.error = condition_error(error, "the router closed the link")
        self.attached.resolve(error=self.error)
        self.notify()

    def fail(self, error: JMSError) -> None:
        if self.error is None:
            self.error = error
        self.attached.resolve(error=error)
        self.notify()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def on_flow(self) -> None:
        self.notify()

    async def close(self, *, detach_only: bool = False) -> None:
        """Close (or only detach) the link; waits a bounded time for the peer's answer."""
        if self.error is not None or self.connection.lost is not None:
            return
        self.detaching = True
        self.link.detach(closed=not detach_only)
        self.connection.wake()
        with trio.move_on_after(CLOSE_TIMEOUT):
            while self.error is None:
                await self.changed.wait()
        self.connection.links.pop(self.link, None)


class SenderLink(LinkState):
    def __init__(self, connection: Connection, link: amqp.Link):
        super().__init__(connection, link)
        self.unsettled: dict[int, tuple[Outcome, Callable[[Outcome], None] | None]] = {}

    async def send(
        self, payload: bytes, *, state: Described | None = None, on_outcome: Callable[[Outcome], None] | None = None
    ) -> Outcome:
        """Send one message when there is credit (with a delivery ``state``: a transactional
        one); its outcome (accepted, or a :class:`JMSError`)."""
        while self.link.credit <= 0:
            self.check()
            await self.changed.wait()
        self.check()
        outcome = Outcome()
        self.unsettled[self.link.send(payload, False, state)] = (outcome, on_outcome)
        self.connection.wake()
        return outcome

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        """The router's disposition: accepted (or declared: the value is its fields), else an error."""
        outcome, callback = self.unsettled.pop(delivery_id, (None, None))
        if outcome is not None:
            code = amqp.state_code(state)
            if code == TRANSACTIONAL_STATE:  # transactional-state(txn-id, outcome) [4.5.5]
                inner = state.value[1] if isinstance(state.value, list) and len(state.value) > 1 else None
                code, state = (amqp.state_code(inner), inner) if inner is not None else (ACCEPTED_CODE, None)
            if code == ACCEPTED_CODE:
                outcome.resolve()
            elif code == DECLARED and isinstance(state.value, list) and state.value:
                outcome.resolve(state.value)
            else:
                outcome.resolve(error=delivery_error(state))
            if callback is not None:
                callback(outcome)
        if not settled:
            self.link.settle(delivery_id)

    def fail(self, error: JMSError) -> None:
        super().fail(error)
        for outcome, callback in self.unsettled.values():
            outcome.resolve(error=error)
            if callback is not None:
                callback(outcome)
        self.unsettled.clear()


class ReceiverLink(LinkState):
    def __init__(self, connection: Connection, link: amqp.Link, window: int):
        super().__init__(connection, link)
        self.window = window
        self.buffer: deque[tuple[int | None, bytes]] = deque()  # (delivery id, None if settled; the message)

    def on_transfer(self, delivery_id: int, payload: bytes, settled: bool, state: Any) -> None:
        self.buffer.append((None if settled else delivery_id, payload))
        self.notify()

    def top_up(self) -> None:
        """Keep credit + buffered near the window (refill once below half of it)."""
        wanted = self.window - self.link.credit - len(self.buffer)
        if wanted >= max(1, self.window // 2) and self.error is None:
            self.link.flow(self.link.credit + wanted)
            self.connection.wake()

    async def next(self, deadline: float) -> tuple[int | None, bytes] | None:
        """The next delivery, or None at the deadline."""
        with trio.move_on_at(deadline):
            while not self.buffer:
                self.check()
                self.connection.check()
                await self.changed.wait()
        if not self.buffer:
            return None
        item = self.buffer.popleft()
        self.top_up()
        return item

    def settle(self, delivery_id: int | None, state: Described) -> None:
        """Settle an incoming message with ``state`` (nothing for one the router sent settled)."""
        if delivery_id is not None and self.error is None and self.connection.lost is None:
            self.link.settle(delivery_id, state)
            self.connection.wake()

    def release_buffered(self) -> None:
        """Give prefetched messages back (recover and rollback redeliver in order)."""
        while self.buffer:
            delivery_id, _ = self.buffer.popleft()
            self.settle(delivery_id, amqp.RELEASED)


def sender_link(session: amqp.Session, name: str, target: Terminus) -> amqp.Link:
    link = session.link(name, sender=True)
    link.source, link.target = Terminus(kind=amqp.SOURCE), target
    return link


def receiver_link(session: amqp.Session, name: str, source: Terminus | None) -> amqp.Link:
    link = session.link(name, sender=False)
    link.source, link.target = source, Terminus(kind=amqp.TARGET)
    return link
