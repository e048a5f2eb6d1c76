"""The transfer as the swiftlet drives it when the table changes: only the dispatchers of
the destinations a change touched are woken, and the dispatcher of a router gone for good
can be retired.

:meth:`.transfer.Transfer.changed` wakes every dispatcher, which a link's window or a
link's end calls for. A route change concerns one destination: waking all of them for
each of a peer's thousands of announcements made a batch cost the table times the batch.
And a dispatcher lives as long as the swiftlet: a peer announcing and withdrawing
thousands of destinations left a task per destination behind. Kept apart from
:mod:`.transfer`, the data path, which this only adds to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import trio

from .transfer import Transfer

__all__ = ["RoutedTransfer"]


class RoutedTransfer(Transfer):
    """:class:`Transfer` with per-destination wake-ups and retirement (and their counts)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.wakeups = 0
        self.retired = 0
        self._scopes: dict[str, trio.CancelScope] = {}  # router → its running dispatcher's scope
        self._retiring: set[str] = set()  # cancelled, not ended yet
        self._revive: set[str] = set()  # known again before its old dispatcher ended

    @property
    def dispatchers(self) -> int:
        return len(self._scopes)

    def has_dispatcher(self, router: str) -> bool:
        """Whether ``router`` has a dispatcher that is not being retired, running or started
        and about to run: one about to run would make ``rt$R`` again if it were deleted now
        (:meth:`retire` refuses it until it waits)."""
        return router in self.wakeups_of and router not in self._retiring

    def wake(self, routers: Iterable[str]) -> None:
        """Have the dispatchers of ``routers`` (those that have one) look at their routes again."""
        for router in routers:
            wakeup = self.wakeups_of.get(router)
            if wakeup is not None:
                wakeup.set()
                self.wakeups += 1

    def destination_added(self, router: str) -> None:
        if router in self._retiring:  # started anew once the old one has ended
            self._revive.add(router)
            return
        super().destination_added(router)

    def retire(self, router: str) -> bool:
        """End the dispatcher of ``router`` while it waits with nothing to do (the caller
        checked that ``rt$R`` is empty and ``R`` unknown); False if it is busy now (woken,
        about to run), has not run yet, or has none. It holds nothing while it waits: no route, no entries."""
        scope = self._scopes.get(router)
        wakeup = self.wakeups_of.get(router)
        if scope is None or wakeup is None or wakeup.is_set() or router in self._retiring:
            return False
        self._retiring.add(router)
        scope.cancel()
        self.retired += 1
        return True

    async def _dispatch(self, router: str) -> None:
        with trio.CancelScope() as scope:
            self._scopes[router] = scope
            await super()._dispatch(router)
        if self._scopes.get(router) is scope:
            del self._scopes[router]
        if router in self._retiring:
            self._retiring.discard(router)
            self.wakeups_of.pop(router, None)
            if router in self._revive:
                self._revive.discard(router)
                super().destination_added(router)
