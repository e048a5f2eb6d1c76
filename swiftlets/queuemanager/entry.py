"""A message in a queue (:class:`Entry`), its states, and the results a send returns.

An entry is available, delivered, held (by a transaction that acknowledged it) or gone:
see :mod:`.queue` for how it moves between them. Its message may be swapped out to its
leading sections (:mod:`.paging`).
"""

from __future__ import annotations

import time

from martinet.messaging.message import Message

from .api import SendResult

__all__ = ["AVAILABLE", "DELIVERED", "GONE", "HELD", "NOT_DELAYED", "Entry", "delayed", "now_ms"]

AVAILABLE, DELIVERED, HELD, GONE = 0, 1, 2, 3


class Entry:
    """A message in one queue. Public, read-only: ``id``, ``message``, ``priority``,
    ``delivery_count``, ``redelivered``, ``acquired``; ``bytes`` is the encoded size counted
    against the queue's ``max-bytes``.

    An entry made with a delivery count (recovered, moved to routerdlq) has been acquired
    before: say so with ``acquired=True``, since only that flag makes a listener rewrite
    the header. The consumers that must not get it (undeliverable-here) are in its queue's
    ``excluded``, not here: a slot costs every stored message 8 bytes or more.

    ``swapped``: the message's bytes are only in the store; ``message`` holds its leading
    sections (what selectors and the header rewrite read) and ``bytes`` is still the size
    of the whole. Only an available (or, after a restart, held) entry is ever swapped out:
    a delivered one has its bytes. ``size`` gives ``bytes`` when ``message`` is such a
    head.

    A swapped-out entry keeps only the head's bytes: ``message`` makes a :class:`Message`
    of them for each use, and what that decodes (a selector's properties) goes with it
    instead of staying in memory. Most swapped-out entries are not kept as objects at all
    but packed in their level's arrays (:mod:`.level`), which makes an entry from them
    (:meth:`swapped_out`) where one is needed."""

    __slots__ = (
        "id",
        "_message",  # a Message; the head's bytes while swapped out
        "priority",
        "expires",
        "delivery_count",
        "state",
        "persistent",
        "acquired",
        "bytes",
        "swapped",
    )

    def __init__(
        self,
        id: int,
        message: Message,
        priority: int,
        expires: int | None,
        persistent: bool,
        delivery_count: int = 0,
        *,
        acquired: bool = False,
        size: int | None = None,
    ):
        self.id = id
        self.priority = priority
        self.expires = expires
        self.persistent = persistent
        self.delivery_count = delivery_count
        self.state = AVAILABLE
        self.acquired = acquired
        self.bytes = len(message.raw) if size is None else size
        self.swapped = size is not None and size != len(message.raw)
        self._message: Message | bytes = message.raw if self.swapped else message

    @classmethod
    def swapped_out(
        cls, id: int, head: bytes, priority: int, expires: int | None, delivery_count: int, acquired: bool, size: int
    ) -> Entry:
        """An available persistent entry swapped out to ``head`` (as a pack keeps it: see :mod:`.level`)."""
        entry = cls.__new__(cls)
        entry.id = id
        entry._message = head
        entry.priority = priority
        entry.expires = expires
        entry.delivery_count = delivery_count
        entry.state = AVAILABLE
        entry.persistent = True
        entry.acquired = acquired
        entry.bytes = size
        entry.swapped = True
        return entry

    @property
    def head(self) -> bytes:
        """A swapped-out entry's leading sections."""
        assert self.swapped
        return self._message  # type: ignore[return-value]

    @property
    def message(self) -> Message:
        message = self._message
        return Message(message) if message.__class__ is bytes else message  # type: ignore[return-value]

    @message.setter
    def message(self, message: Message) -> None:
        self._message = message

    def swap(self, head: bytes) -> None:
        """Keep only ``head``, the leading sections of the message (its bytes are in the store)."""
        self._message = head
        self.swapped = True

    @property
    def resident(self) -> int:
        """The message bytes this entry keeps in memory."""
        message = self._message
        return len(message) if message.__class__ is bytes else self.bytes

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0

    def __repr__(self) -> str:
        return f"<Entry {self.id} p{self.priority} dc{self.delivery_count}>"


def now_ms() -> int:
    return int(time.time() * 1000)


NOT_DELAYED = SendResult(0)
_DELAYED: dict[int, SendResult] = {}  # one result per delay value (at most max-flowcontrol-delay + 1)


def delayed(delay: int) -> SendResult:
    """The result for a delay, made once: a queue above its flow-control start returns one
    per send, and a NamedTuple costs more to make than the rest of the check."""
    result = _DELAYED.get(delay)
    if result is None:
        result = _DELAYED[delay] = SendResult(delay)
    return result
