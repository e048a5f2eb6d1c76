"""Addresses and the local queues they end up in.

Theory of operation
-------------------
``q`` and ``q@<this router>`` name the local queue ``q``
(:meth:`.manager.QueueManager.resolve` sees to that itself: it is asked per message);
``q@other`` is resolved through the redirections routing installs (``%@paris`` →
``rt$paris``), or is unknown. A redirection is a SQL-LIKE predicate on the full ``q@router`` name, a target queue and an
optional rewrite of the messages it redirects. ``%@R`` (every queue of router R, with no
wildcard in R: routing's) is kept by R and found without a scan, so that a table of
thousands of destinations costs each change and each new address O(1); any other
predicate is matched in the order added, and what an address resolved to is remembered
(:data:`REDIRECTIONS_KEPT` addresses) until the redirections change: every message to
``q@other`` asks.
"""

from __future__ import annotations

from martinet.messaging.like import LikePattern, like_pattern
from martinet.messaging.message import AnnotationPatch, Message, MessageError

from .api import MalformedMessage, QueueNotFound, Rewrite

__all__ = ["Names"]

REDIRECTIONS_KEPT = 4096  # addresses whose redirection is remembered (each message to q@R looks it up)


def _whole_router(predicate: str) -> str | None:
    """``R`` if ``predicate`` is ``%@R`` with no wildcard in ``R`` (``\\`` escapes one):
    every queue of router R; else None."""
    if not predicate.startswith("%@"):
        return None
    name, escaped = [], False
    for char in predicate[2:]:
        if escaped:
            name.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "%_":
            return None
        else:
            name.append(char)
    return None if escaped or not name else "".join(name)


class Names:
    """The queue manager's redirections: which local queue an address of another router
    ends up in, and how a redirected message is rewritten on its way."""

    def __init__(self, router_name: str):
        self.router_name = router_name
        # predicate → (its pattern, target queue, rewrite of the messages redirected or None), in the order added
        self._redirections: dict[str, tuple[LikePattern, str, Rewrite | None]] = {}
        # ``%@R`` (every queue of one router: routing's) by R, found without a scan
        self._router_redirections: dict[str, tuple[str, Rewrite | None]] = {}
        self._redirected: dict[str, tuple[str, Rewrite | None]] = {}  # address → its redirection, as found

    def redirection(self, address: str) -> tuple[str, Rewrite | None]:
        """The target queue and rewrite of the redirection covering ``q@other`` (remembered
        per address until the redirections change: every message to ``q@other`` asks).

        Raises:
            QueueNotFound: no redirection covers it.
        """
        router = address.rpartition("@")[2]
        found = self._router_redirections.get(router) or self._redirected.get(address)
        if found is not None:
            return found
        for pattern, target, rewrite in self._redirections.values():
            if pattern.matches(address):
                if len(self._redirected) >= REDIRECTIONS_KEPT:
                    self._redirected.clear()
                found = self._redirected[address] = target, rewrite
                return found
        raise QueueNotFound(
            f"router {router!r} is not known to router {self.router_name!r} (no route and no "
            f"static route), so {address!r} cannot be reached"
        )

    def add_redirection(self, predicate: str, target: str, rewrite: Rewrite | None = None) -> None:
        """Send everything addressed to names matching ``predicate`` (SQL-LIKE on the full
        ``q@router`` name) to local queue ``target``, each message first passed through
        ``rewrite(address, message, now)``; routing uses ``%@R`` → ``rt$R``."""
        self.remove_redirection(predicate)
        router = _whole_router(predicate)
        if router is not None:
            self._router_redirections[router] = target, rewrite
            return
        self._redirections[predicate] = like_pattern(predicate), target, rewrite
        self._redirected.clear()

    def redirected(
        self, address: str, message: Message, now: int, annotations: AnnotationPatch | None = None
    ) -> tuple[str, Message]:
        """The target queue of the redirection of ``address`` (``q@other``) and ``message``
        with ``annotations`` merged in and as it rewrites it (``now``: its arrival, ms since
        the epoch).

        Raises: QueueNotFound (no redirection covers it), MalformedMessage (the message could
        not be read to merge the annotations in, or by the rewrite)."""
        target, rewrite = self.redirection(address)
        try:
            if rewrite is None:
                return target, message if annotations is None else annotations.apply(message)
            return target, rewrite(address, message, now, annotations)
        except MessageError as exc:
            raise MalformedMessage(f"message for {address!r}: {exc}", exc.condition) from None

    def remove_redirection(self, predicate: str) -> None:
        router = _whole_router(predicate)
        if router is not None:
            self._router_redirections.pop(router, None)
        elif self._redirections.pop(predicate, None) is not None:
            self._redirected.clear()
