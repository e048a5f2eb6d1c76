"""The XA resource manager's public interface (``sys$xa``): in-doubt transactions, their
resolution, the claims of their owners, and the xid convention of routing.

A swiftlet gets it with ``context.lookup("sys$xa", XAResourceManager)`` (``sys$xa`` starts
after ``sys$queuemanager`` and before the swiftlets that prepare transactions).

Theory of operation, for callers
--------------------------------
**What it manages.** Prepared transactions are the queue manager's
(:meth:`~swiftlets.queuemanager.api.Transaction.prepare` makes them durable together with
their sends, in one store commit, and the queue manager rebuilds them at start).
``sys$xa`` is their operator-facing log: it reports at boot how many there are, lists the
*in-doubt* ones — prepared, and not claimed by a running owner — in its usage, and
resolves them, for their owners and for the operator.

**Xids and owners.** An xid is free text; its form says who owns it:

- ``routing:<source>:<destination>:<transaction>`` (:func:`routing_xid`) belongs to
  routing: a hop of messages from router ``<source>`` (the owner of ``rt$<destination>``)
  to router ``<destination>``, the *same* xid on both routers; ``<transaction>`` is unique
  per source (e.g. ``<startup-ms>-<counter>``, as SwiftMQ does). Router names hold no
  ``:``. The routing swiftlet resolves its xids itself when the link to the peer is up
  again (the recovery table, docs/routing-protocol.md §7.2); the operator resolves them only when that
  peer is not coming back.
- any other xid belongs to a client's transaction manager (``owner == "client"``): only
  the operator (or that client, once XA clients exist) resolves it.

**Claims.** An owner that is resolving xids itself — routing, for the xids of a link while
the link is connected (normal XA delivery and recovery at reconnect) — :meth:`claims
<XAResourceManager.claim>` them by prefix (:func:`routing_prefixes` gives a link's two).
Claimed xids are not in doubt: they are not listed in ``/sys$xa/usage/in-doubt`` and the
operator's ``commit`` / ``rollback`` refuses them. Releasing the claim (the link dropped)
makes those still prepared in doubt again. The owner resolves through
:meth:`XAResourceManager.commit` / :meth:`~XAResourceManager.rollback`, which do not check
claims.

**Threads and cancellation.** Everything runs in the router's trio thread. ``claim`` and
``release`` do not wait. ``commit`` and ``rollback`` wait for the store: cancelled before the
store has the resolution, the transaction stays prepared (and in doubt unless claimed);
once the store has it, they finish as if uncancelled and the cancellation takes effect at
the caller's next checkpoint, so a resolution is never half done. While one resolution
waits, a second one of the same xid raises :class:`XAError`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import NamedTuple, Protocol, runtime_checkable

import attrs

__all__ = [
    "ROUTING_PREFIX",
    "ROUTING",
    "CLIENT",
    "RoutingXid",
    "routing_xid",
    "routing_prefixes",
    "parse_routing_xid",
    "owner_of",
    "PreparedTransaction",
    "Claim",
    "XAResourceManager",
    "XAError",
    "UnknownXid",
]


# -- errors ---------------------------------------------------------------------------------


class XAError(Exception):
    """A request of the resource manager was refused; the message says why."""


class UnknownXid(XAError):
    """No prepared transaction has that xid (never prepared, or resolved already)."""


# -- the xid convention ------------------------------------------------------------------------

#: What every routing xid starts with.
ROUTING_PREFIX = "routing:"
#: :attr:`PreparedTransaction.owner` of a routing xid.
ROUTING = "routing"
#: :attr:`PreparedTransaction.owner` of any other xid.
CLIENT = "client"


class RoutingXid(NamedTuple):
    """The parts of a routing xid: the hop from ``source`` to ``destination``, and the
    source's ``transaction`` id."""

    source: str
    destination: str
    transaction: str


def routing_xid(source: str, destination: str, transaction: str) -> str:
    """``routing:<source>:<destination>:<transaction>``, the xid of one routing transaction
    from router ``source`` to router ``destination``.

    Raises:
        ValueError: a router name is empty or holds ``:`` or ``/``, or ``transaction`` is
            empty or holds ``/``.
    """
    for name in (source, destination):
        if not name or ":" in name or "/" in name:
            raise ValueError(f"invalid router name {name!r} in a routing xid")
    if not transaction or "/" in transaction:
        raise ValueError(f"invalid transaction id {transaction!r} in a routing xid")
    return f"{ROUTING_PREFIX}{source}:{destination}:{transaction}"


def parse_routing_xid(xid: str) -> RoutingXid | None:
    """The parts of a routing xid; None for any other xid."""
    if not xid.startswith(ROUTING_PREFIX):
        return None
    parts = xid[len(ROUTING_PREFIX) :].split(":", 2)
    if len(parts) != 3 or not all(parts):
        return None
    return RoutingXid(*parts)


def routing_prefixes(local: str, peer: str) -> tuple[str, str]:
    """The prefixes of every xid of the link between ``local`` and ``peer``: the hops out
    (``routing:<local>:<peer>:``) and in (``routing:<peer>:<local>:``); what routing claims
    for that link."""
    return f"{ROUTING_PREFIX}{local}:{peer}:", f"{ROUTING_PREFIX}{peer}:{local}:"


def owner_of(xid: str) -> str:
    """:data:`ROUTING` for a routing xid, else :data:`CLIENT`."""
    return ROUTING if parse_routing_xid(xid) is not None else CLIENT


# -- values ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class PreparedTransaction:
    """One prepared transaction, as the resource manager shows it (a snapshot)."""

    #: The xid it was prepared under.
    xid: str
    #: :data:`ROUTING` or :data:`CLIENT` (:func:`owner_of`).
    owner: str
    #: For a routing xid, the other router of the hop; else None.
    peer: str | None
    #: When it was prepared (epoch seconds); None if the store's record predates the time.
    prepared_at: float | None
    #: Prepared sends, by queue (local name).
    sends: Mapping[str, int]
    #: Acknowledged (held) messages, by queue.
    acknowledgements: Mapping[str, int]
    #: The owner of the claim that covers it (e.g. ``sys$routing``); None: in doubt.
    claimed_by: str | None = None

    @property
    def queues(self) -> list[str]:
        """Every queue it sends to or acknowledges in, sorted."""
        return sorted({*self.sends, *self.acknowledgements})

    @property
    def messages(self) -> int:
        """How many messages it sends."""
        return sum(self.sends.values())

    def age(self, now: float | None = None) -> float | None:
        """Seconds since it was prepared (to ``now``, default the current time); None if
        unknown."""
        if self.prepared_at is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.prepared_at)


# -- the running objects -------------------------------------------------------------------------


class Claim(Protocol):
    """An owner's claim on the xids under some prefixes (:meth:`XAResourceManager.claim`);
    a context manager that releases it on exit."""

    @property
    def owner(self) -> str:
        """Who claims, e.g. ``sys$routing``."""

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The xid prefixes claimed."""

    @property
    def released(self) -> bool:
        """:meth:`release` was called."""

    def release(self) -> None:
        """Give the xids back (idempotent): those still prepared are in doubt again."""

    def __enter__(self) -> Claim: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class XAResourceManager(Protocol):
    """What ``context.lookup("sys$xa", XAResourceManager)`` returns."""

    def prepared(self, prefix: str = "") -> list[PreparedTransaction]:
        """Every prepared transaction whose xid starts with ``prefix``, claimed or not,
        oldest first (unknown times last): what routing compares with its peer at
        reconnect. Transactions being committed or rolled back are not included."""

    def in_doubt(self) -> list[PreparedTransaction]:
        """The prepared transactions no claim covers, oldest first: the operator's work
        (also listed in ``/sys$xa/usage/in-doubt``)."""

    def claim(self, owner: str, *prefixes: str) -> Claim:
        """Claim the xids under ``prefixes`` for ``owner`` until the claim is released.

        Raises:
            XAError: no prefix given, or one overlaps a prefix claimed already (one
                prefix starts with the other).
        """

    async def commit(self, xid: str) -> None:
        """Commit prepared transaction ``xid``: its sends become visible in their queues and
        the messages it acknowledged are removed (see the module header for cancellation).

        Raises:
            UnknownXid: no prepared transaction ``xid``.
            XAError: it is being committed or rolled back already.
            StoreError: the store failed (it stays prepared).
        """

    async def rollback(self, xid: str) -> None:
        """Roll back prepared transaction ``xid``: its sends are discarded and the messages
        it acknowledged are available again (counted as a failed delivery).

        Raises:
            UnknownXid: no prepared transaction ``xid``.
            XAError: it is being committed or rolled back already.
            StoreError: the store failed (it stays prepared).
        """
