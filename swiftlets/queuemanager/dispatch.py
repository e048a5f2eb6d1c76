"""A queue's consumers and the dispatch of its entries to them.

Theory of operation
-------------------
Delivery is credit-driven, as AMQP links are: a consumer receives at most as many entries
as it has credit. Consumers with credit wait in a round-robin ``ready`` ring; every new
entry and every new credit runs :meth:`Queue._dispatch`, which gives the next available
entry to the next ready consumer (shared mode), to the only consumer (exclusive), or to
the first consumer only (active-standby: the others wait to take over). A consumer whose
selector matches nothing available is parked until a new entry arrives. An entry a
selector cannot be evaluated on (its sections do not decode: a message stored before the
queue manager checked messages on the way in) is not selected, and stays for consumers
without a selector; that is logged once per queue and selector, never per entry.
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import Any

from martinet.messaging.selector import Selector, message_identifiers

from .api import ConsumerRefused, QueueError
from .consumer import Consumer
from .entry import AVAILABLE, DELIVERED, Entry, now_ms
from .paging import Paging

__all__ = ["Dispatcher"]

log = logging.getLogger(__name__)

_WAIT: Any = object()  # _take: the entry to deliver next is swapped out; dispatch resumes once it is read back
_FULL: Any = object()  # _fresh_match: only a look at every available entry can tell


class Dispatcher(Paging):
    """The part of a queue that attaches consumers and hands them entries within their credit."""

    def _dispatch(self) -> None:
        ready = self._ready
        while ready and self.available:
            consumer = ready[0]
            entry = self._take(consumer)
            if entry is None:  # nothing this consumer selects: wait for new entries
                ready.popleft()
                self._parked.append(consumer)
                continue
            if entry is _WAIT:  # its bytes are being read back: fill() dispatches again
                return
            entry.state = DELIVERED
            consumer._deliver(entry)
            self.flow.received += 1
            if self.swapped and not self._reading and self._running_low():
                self._read_ahead(selector=consumer.selector)  # the next batch, for the same taste
            if consumer.credit <= 0:
                ready.popleft()
            elif len(ready) > 1:
                ready.rotate(-1)

    def _take(self, consumer: Consumer) -> Entry | None:
        """The next available entry for ``consumer`` (its selector matches, it is not
        excluded from it), out of its level; None if there is none; ``_WAIT`` if it is
        swapped out (its bytes are asked for, and it stays where it is)."""
        if consumer.selector is None:
            return self._scan(consumer)
        if consumer.seen is not None:
            found = self._fresh_match(consumer)
            if found is not _FULL:
                return found
        entry = self._scan(consumer)
        consumer.seen = len(self._fresh) if entry is None else None
        return entry

    def _fresh_match(self, consumer: Consumer) -> Entry | None:
        """For a selector consumer that found nothing the last time it looked: the entry
        among those that became available since (:attr:`_fresh`) that its selector selects,
        out of its level; None if none does; ``_FULL`` where only a look at every entry can
        tell (several are selected, and which comes first in delivery order is not known
        here; or one is swapped out). Without this, a consumer whose selector matches
        nothing made every arriving message cost a walk of the whole queue: one such
        consumer on a queue of 100,000 stalled the router for a second per message."""
        selector, excluded, fresh, now = consumer.selector, self.excluded, self._fresh, now_ms()
        assert selector is not None and consumer.seen is not None
        found = None
        for entry in islice(fresh, consumer.seen, None):
            if entry.state != AVAILABLE or (entry.expires is not None and entry.expires <= now):
                continue  # (taken meanwhile, or left for the cleanup)
            if excluded and consumer.serial in excluded.get(entry.id, ()):
                continue
            try:
                selected = selector.matches(message_identifiers(entry.message, entry.delivery_count))
            except (ValueError, TypeError) as exc:
                selected = self._unselectable_entry(selector, entry, exc)
            if selected:
                if found is not None or entry.swapped:  # (a swapped-out one may be packed: see .level)
                    return _FULL
                found = entry
        consumer.seen = len(fresh)
        if found is not None:
            self._levels[found.priority].remove(found)
            self.available -= 1
        return found

    def _scan(self, consumer: Consumer) -> Entry | None:
        """:meth:`_take` by a look along every level."""
        selector, now, excluded = consumer.selector, 0, self.excluded
        for level in self._highest_first:
            if not level.count:  # (an attribute: this runs for each level per delivery)
                continue
            if selector is None:
                while level.count:
                    entry = level.popleft()
                    if entry.expires is not None and entry.expires <= (now or (now := now_ms())):
                        self.available -= 1
                        self.manager.expire(self, entry)  # type: ignore[arg-type]  # (self is a Queue)
                        continue
                    if excluded and consumer.serial in excluded.get(entry.id, ()):
                        level.appendleft(entry)
                        break  # not for this consumer: look along the level (below)
                    if entry.swapped:
                        level.appendleft(entry)
                        self._read_ahead()
                        return _WAIT
                    self.available -= 1
                    return entry
                else:
                    continue
            for entry in level:
                if entry.expires is not None and entry.expires <= (now or (now := now_ms())):
                    continue  # left for the cleanup
                if excluded and consumer.serial in excluded.get(entry.id, ()):
                    continue
                try:
                    selected = selector is None or selector.matches(
                        message_identifiers(entry.message, entry.delivery_count)
                    )
                except (ValueError, TypeError) as exc:  # a section no one could read: not selected
                    assert selector is not None  # (only its matching raises)
                    selected = self._unselectable_entry(selector, entry, exc)
                if selected:
                    if entry.swapped:
                        self._read_ahead(entry, selector)
                        return _WAIT
                    level.remove(entry)
                    self.available -= 1
                    return entry
        return None

    def _unselectable_entry(self, selector: Selector, entry: Entry, error: Exception) -> bool:
        """A selector could not be evaluated on ``entry``: it is not selected (False); the
        first time for this selector on this queue, that is logged."""
        if selector.text not in self._unselectable:
            self._unselectable.add(selector.text)
            log.warning(
                "queue %s: selector %r cannot be evaluated on message %d (%s); such messages are not "
                "selected by it and stay for other consumers (logged once per queue and selector)",
                self.name,
                selector.text,
                entry.id,
                error,
            )
        return False

    def _ready_up(self, consumer: Consumer) -> None:
        if consumer in self._ready or consumer in self._parked or consumer.closed:
            return
        if self.settings.consumer_mode == "activestandby" and self.consumers[0] is not consumer:
            return  # a standby consumer receives nothing until it becomes the active one
        self._ready.append(consumer)
        self._dispatch()

    def consumer(self, selector: Selector | None = None, *, owner: Any = None) -> Consumer:
        """Attach a consumer (no credit yet: call :meth:`Consumer.flow`).

        Raises:
            ConsumerRefused: exclusive mode and a consumer is attached already.
            QueueError: the queue was deleted.
        """
        if self.deleted:
            raise QueueError(f"queue {self.name} has been deleted")
        if self.settings.consumer_mode == "exclusive" and self.consumers:
            raise ConsumerRefused(f"queue {self.name} is exclusive and has a consumer already")
        consumer = Consumer(self, selector, owner)  # type: ignore[arg-type]  # (self is a Queue)
        self.consumers.append(consumer)
        self._selective += selector is not None
        return consumer

    def _detach(self, consumer: Consumer) -> None:
        was_active = bool(self.consumers) and self.consumers[0] is consumer
        self.consumers.remove(consumer)
        self._selective -= consumer.selector is not None
        if not self._selective:
            self._fresh.clear()
        if consumer in self._ready:
            self._ready.remove(consumer)
        if consumer in self._parked:
            self._parked.remove(consumer)
        if was_active and self.consumers and self.settings.consumer_mode == "activestandby":
            standby = self.consumers[0]
            if standby.credit > 0:
                self._ready_up(standby)
