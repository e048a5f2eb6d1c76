"""Room for queues made on demand: ``max-queues``, the clients' share of it, and the
allowances per user and per address.

The counts live here, with the queue manager, not with a connection: a client that opens
ten connections, or closes one and opens the next, meets the same numbers, and a queue
counts for the user and the address it was made for until it is deleted. Queues made
before a restart count for nobody after it (the store does not keep who made them); they
still count in ``max-queues``.
"""

from __future__ import annotations

from collections import Counter

import attrs

from .api import ROUTING_PREFIX, Creator, TooManyQueues
from .config import QueueManagerConfig


@attrs.define
class QueueBudget:
    """The limits of :class:`QueueManagerConfig` and what each creator has made."""

    max_queues: int
    reserved_percent: int
    per_user: int
    per_address: int
    routing: int = 0  # rt$ queues held: not counted in max-queues
    _made_for: dict[str, Creator] = attrs.Factory(dict)  # a client's queue → its creator
    _users: Counter[str] = attrs.Factory(Counter)
    _hosts: Counter[str] = attrs.Factory(Counter)

    @classmethod
    def of(cls, config: QueueManagerConfig) -> QueueBudget:
        return cls(
            config.max_queues,
            config.reserved_queues_percent,
            config.max_queues_per_user,
            config.max_queues_per_address,
        )

    def set(self, field: str, value: int) -> bool:
        """Apply a changed setting of the queue manager; False if it is none of these."""
        names = {
            "max_queues": "max_queues",
            "reserved_queues_percent": "reserved_percent",
            "max_queues_per_user": "per_user",
            "max_queues_per_address": "per_address",
        }
        if field not in names:
            return False
        setattr(self, names[field], value)
        return True

    @property
    def clients_share(self) -> int:
        """Queues held (routing's left out) beyond which no client's queue is made; -1: none."""
        if self.max_queues < 0:
            return -1
        return self.max_queues - self.max_queues * self.reserved_percent // 100

    def clients_queues(self) -> int:
        return len(self._made_for)

    def check(self, name: str, creator: Creator, held: int, router: str) -> None:
        """Raises TooManyQueues unless one more queue ``name`` for ``creator`` fits, the
        router holding ``held`` queues (all of them: this counts routing's out).

        Raises:
            TooManyQueues: the message names the limit reached.
        """
        held -= self.routing
        what = f"queue {name!r} not created"
        if 0 <= self.max_queues <= held:
            raise TooManyQueues(f"{what}: router {router} holds max-queues {self.max_queues} queues already")
        if creator.reserved:
            return
        if 0 <= self.clients_share <= held:
            raise TooManyQueues(
                f"{what}: router {router} holds {held} queues; the rest of max-queues {self.max_queues} is "
                f"reserved for the router's own (reserved-queues-percent {self.reserved_percent})"
            )
        if creator.user and 0 <= self.per_user <= self._users[creator.user]:
            raise TooManyQueues(f"{what}: user {creator.user!r} has max-queues-per-user {self.per_user} queues already")
        if creator.host and 0 <= self.per_address <= self._hosts[creator.host]:
            raise TooManyQueues(
                f"{what}: clients from {creator.host} have max-queues-per-address {self.per_address} queues already"
            )

    def created(self, name: str, creator: Creator | None) -> None:
        """Count queue ``name``, just made (for ``creator``; None: not made on demand)."""
        if name.startswith(ROUTING_PREFIX):
            self.routing += 1
        if creator is None or creator.reserved:
            return
        self._made_for[name] = creator
        if creator.user:
            self._users[creator.user] += 1
        if creator.host:
            self._hosts[creator.host] += 1

    def deleted(self, name: str) -> None:
        """Queue ``name`` is gone: it counts no more."""
        if name.startswith(ROUTING_PREFIX):
            self.routing -= 1
        creator = self._made_for.pop(name, None)
        if creator is None:
            return
        for counts, key in ((self._users, creator.user), (self._hosts, creator.host)):
            if key:
                counts[key] -= 1
                if counts[key] <= 0:
                    del counts[key]
