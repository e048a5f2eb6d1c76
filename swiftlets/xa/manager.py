"""The running ``sys$xa``: the boot report, the in-doubt list in usage with its operations,
resolution and claims.

Theory of operation
-------------------
**Who keeps what.** The queue manager keeps the prepared transactions — in the store, each
as its tagged sends plus a prepare record (kind ``xa``) with the acknowledged message ids
and the prepare time, all written in one commit, and rebuilt at its start. That record has
to be written together with the sends, so it stays the queue manager's; ``sys$xa`` keeps no
records of its own and reads the prepared transactions through the queue manager's
published interface (``prepared_transactions()``, ``resolve_prepared()``). What ``sys$xa``
owns is everything around them: the report at boot, the in-doubt list, the owners' claims
and the operator's resolution. An owner is derived from the xid alone
(:func:`.api.owner_of`), so nothing about it needs storing either.

**Boot.** ``sys$xa`` starts after ``sys$queuemanager`` (which has rebuilt the prepared
transactions by then) and before routing, so every prepared transaction it finds is in
doubt; it logs SwiftMQ's warning with the count, how many are routing's (recovered
automatically at reconnect) and where the operator resolves the rest.

**The list.** ``/sys$xa/usage/in-doubt/<xid>`` has one entry per prepared transaction that
no claim covers, each with the operations ``commit`` and ``rollback``; an entry stays,
``state`` ``committing`` or ``rolling-back``, while its resolution waits for the store, so
that a second resolution is refused with that reason. Transactions are
prepared and resolved through the queue manager as well (routing prepares there), so the
list is brought up to date every second, and at once after a claim, a release or a
resolution made here. An xid holding ``/`` or ``%`` is shown with those escaped as ``%2F``
and ``%25`` (a path segment holds no ``/``); the ``xid`` value is the real one.

**Resolution.** :meth:`ResourceManager.commit` / :meth:`~ResourceManager.rollback` (for
owners) and the management operations (for the operator) both end in the queue manager's
``resolve_prepared``; the operations also refuse an xid that a claim has covered since
the list was read, and log the operator's decision as a WARNING (a heuristic outcome the
other side may not know about).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from martinet.kernel import ManagementError, SwiftletContext, Usage, UsageList, Veto
from martinet.swiftlets.queuemanager.api import QueueManager, Transaction, TransactionError

from .api import ROUTING, PreparedTransaction, UnknownXid, XAError, owner_of, parse_routing_xid

__all__ = ["ResourceManager"]

log = logging.getLogger(__name__)

#: How often the in-doubt list is compared with the queue manager's prepared transactions.
REFRESH_INTERVAL = 1.0


def entry_name(xid: str) -> str:
    """The usage-list name of ``xid``: ``%`` and ``/`` escaped (``%25``, ``%2F``)."""
    return xid.replace("%", "%25").replace("/", "%2F")


def _timestamp(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds)) if seconds is not None else ""


class _Claim:
    """A claim (:class:`.api.Claim`)."""

    def __init__(self, manager: ResourceManager, owner: str, prefixes: tuple[str, ...]):
        self._manager = manager
        self.owner = owner
        self.prefixes = prefixes
        self.released = False

    def covers(self, xid: str) -> bool:
        return not self.released and xid.startswith(self.prefixes)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._manager._released(self)

    def __enter__(self) -> _Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<Claim {self.owner} {' '.join(self.prefixes)}{' released' if self.released else ''}>"


class ResourceManager:
    """``sys$xa``: implements :class:`.api.XAResourceManager`."""

    def __init__(self, context: SwiftletContext):
        self.context = context
        self._queue_manager: QueueManager | None = None
        self._claims: list[_Claim] = []
        self._list: UsageList | None = None
        self._listed: dict[str, str] = {}  # entry name -> xid
        self._committed = 0
        self._rolled_back = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._queue_manager = self.context.lookup("sys$queuemanager", QueueManager)
        self._list = self.context.usage.add_list("in-doubt")
        self.context.usage.provide(self._usage)
        self._report()
        self.refresh()
        task_status.started()
        try:
            while True:
                await trio.sleep(REFRESH_INTERVAL)
                self.refresh()
        finally:
            for name in list(self._listed):  # no operations on a stopped swiftlet
                self._list.remove(name)
            self._listed.clear()

    def _report(self) -> None:
        found = self.prepared()
        if not found:
            log.info("no prepared transactions found")
            return
        routing = sum(1 for p in found if p.owner == ROUTING)
        others = len(found) - routing
        log.warning("+++ WARNING! %d prepared transaction%s found!", len(found), "" if len(found) == 1 else "s")
        if routing:
            log.warning(
                "+++          %d of them routing's (xids routing:…): recovered automatically when "
                "their peer router connects again.",
                routing,
            )
        log.warning(
            "+++          %s: commit or rollback on /sys$xa/usage/in-doubt/<xid> in the management tree%s.",
            f"Resolve the other {others}" if routing and others else "Resolve them",
            " (a routing one only if its peer is not coming back)" if routing else "",
        )

    # -- the interface ---------------------------------------------------------------------------

    def _transactions(self) -> dict[str, Transaction]:
        assert self._queue_manager is not None
        return {xid: t for xid, t in self._queue_manager.prepared_transactions().items() if t.state == "prepared"}

    def _claimed_by(self, xid: str) -> str | None:
        for claim in self._claims:
            if claim.covers(xid):
                return claim.owner
        return None

    def _view(self, xid: str, transaction: Transaction) -> PreparedTransaction:
        routing = parse_routing_xid(xid)
        peer = None
        if routing is not None:
            peer = routing.destination if routing.source == self.context.router_name else routing.source
        return PreparedTransaction(
            xid=xid,
            owner=owner_of(xid),
            peer=peer,
            prepared_at=transaction.prepared_at,
            sends=dict(transaction.sends),
            acknowledgements=dict(transaction.acknowledgements),
            claimed_by=self._claimed_by(xid),
        )

    def prepared(self, prefix: str = "") -> list[PreparedTransaction]:
        """Every prepared transaction under ``prefix``, claimed or not, oldest first."""
        views = [self._view(xid, t) for xid, t in self._transactions().items() if xid.startswith(prefix)]
        return sorted(views, key=lambda p: (p.prepared_at is None, p.prepared_at or 0.0, p.xid))

    def in_doubt(self) -> list[PreparedTransaction]:
        """The prepared transactions no claim covers, oldest first."""
        return [p for p in self.prepared() if p.claimed_by is None]

    def claim(self, owner: str, *prefixes: str) -> _Claim:
        """Claim the xids under ``prefixes`` for ``owner``.

        Raises:
            XAError: no prefix, or one overlaps a claimed prefix.
        """
        if not prefixes or not all(prefixes):
            raise XAError(f"a claim of {owner} needs non-empty prefixes")
        for claim in self._claims:
            for mine in prefixes:
                for theirs in claim.prefixes:
                    if mine.startswith(theirs) or theirs.startswith(mine):
                        raise XAError(f"{owner} cannot claim the xids {mine}…: {claim.owner} claims {theirs}… already")
        claim = _Claim(self, owner, tuple(prefixes))
        self._claims.append(claim)
        log.debug("%s claims the xids %s", owner, " ".join(f"{p}…" for p in prefixes))
        self.refresh()
        return claim

    def _released(self, claim: _Claim) -> None:
        self._claims.remove(claim)
        self.refresh()

    async def commit(self, xid: str) -> None:
        """Commit prepared transaction ``xid``."""
        await self._resolve(xid, commit=True)

    async def rollback(self, xid: str) -> None:
        """Roll back prepared transaction ``xid``."""
        await self._resolve(xid, commit=False)

    async def _resolve(self, xid: str, *, commit: bool) -> None:
        assert self._queue_manager is not None
        transaction = self._queue_manager.prepared_transactions().get(xid)
        if transaction is None:
            raise UnknownXid(f"no prepared transaction {xid!r} on router {self.context.router_name}")
        if transaction.state != "prepared":
            raise XAError(f"transaction {xid!r} is {transaction.state} already")
        try:
            await self._queue_manager.resolve_prepared(xid, commit=commit)
        except TransactionError as exc:  # resolved meanwhile
            raise XAError(str(exc)) from None
        finally:
            self.refresh()
        if commit:
            self._committed += 1
        else:
            self._rolled_back += 1

    # -- the operator's operations ------------------------------------------------------------------

    async def _operate(self, xid: str, *, commit: bool) -> None:
        owner = self._claimed_by(xid)
        if owner is not None:
            raise Veto(f"transaction {xid!r} is being resolved by {owner}")
        verb = "commit" if commit else "rollback"
        try:
            await self._resolve(xid, commit=commit)
        except XAError as exc:
            raise Veto(str(exc)) from None
        except Exception as exc:  # the store failed: it stays prepared
            raise ManagementError(f"{verb} of {xid!r} failed: {type(exc).__name__}: {exc}") from exc
        log.warning("in-doubt transaction %s %s by the operator", xid, "committed" if commit else "rolled back")

    # -- usage ----------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Bring ``/sys$xa/usage/in-doubt`` up to date: an entry per unclaimed prepared
        transaction."""
        if self._list is None:
            return
        assert self._queue_manager is not None
        wanted = {
            entry_name(xid): (xid, t)
            for xid, t in self._queue_manager.prepared_transactions().items()
            if self._claimed_by(xid) is None
        }
        for name in [n for n in self._listed if n not in wanted]:
            self._list.remove(name)
            del self._listed[name]
        for name, (xid, transaction) in wanted.items():
            if name not in self._listed:
                self._add_entry(name, xid, transaction)

    def _add_entry(self, name: str, xid: str, transaction: Transaction) -> None:
        assert self._list is not None
        view = self._view(xid, transaction)

        def values() -> dict[str, Any]:
            age = view.age()
            return {
                "xid": xid,
                "state": transaction.state,
                "owner": view.owner,
                "peer": view.peer or "",
                "prepared-at": _timestamp(view.prepared_at),
                "age": int(age) if age is not None else -1,
                "queues": ", ".join(view.queues),
                "messages": view.messages,
                "acknowledgements": sum(view.acknowledgements.values()),
            }

        async def commit() -> None:
            await self._operate(xid, commit=True)

        async def rollback() -> None:
            await self._operate(xid, commit=False)

        entry: Usage = self._list.add(name, values)
        entry.add_operation(
            "commit",
            commit,
            "Commit: the prepared sends become visible in their queues and the acknowledged messages are removed.",
        )
        entry.add_operation(
            "rollback",
            rollback,
            "Roll back: the prepared sends are discarded and the acknowledged messages are available again.",
            destroys=lambda: view.messages,
        )
        self._listed[name] = xid

    def _usage(self) -> dict[str, Any]:
        prepared = self.prepared()
        in_doubt = [p for p in prepared if p.claimed_by is None]
        return {
            "prepared": len(prepared),
            "in-doubt": len(in_doubt),
            "in-doubt-routing": sum(1 for p in in_doubt if p.owner == ROUTING),
            "claims": len(self._claims),
            "committed": self._committed,
            "rolled-back": self._rolled_back,
        }
