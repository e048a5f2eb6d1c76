"""The events: the rare things (open, begin, attach, detach, end, close, a link's credit
changing), queued in :attr:`.Connection.events` for the owner (:meth:`.Connection.dispatch`).
The per-message things go to the link's :class:`.LinkHandler` instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ..wire import Error

if TYPE_CHECKING:
    from .link import Link
    from .session import Session

__all__ = [
    "ConnectionOpened",
    "ConnectionClosed",
    "SessionBegun",
    "SessionEnded",
    "LinkAttached",
    "LinkDetached",
    "LinkFlow",
]


@attrs.frozen
class ConnectionOpened:
    """The peer's ``open`` arrived (its fields are on the connection); answer with
    :meth:`Connection.open` (a server) — or :meth:`Connection.close` to refuse."""


@attrs.frozen
class ConnectionClosed:
    """The connection is over: the peer closed it (``by_peer``) or broke the protocol, or
    went silent (our ``close`` carried ``error``)."""

    error: Error | None
    by_peer: bool


@attrs.frozen
class SessionBegun:
    """The peer began a session (already answered), or answered our begin."""

    session: Session


@attrs.frozen
class SessionEnded:
    """The session is over: the peer's ``end`` arrived (``by_peer``; ``error`` is its), or
    the engine ended it because the peer broke the protocol on it (``error`` is ours). Its
    links got :class:`LinkDetached` first."""

    session: Session
    error: Error | None
    by_peer: bool = True


@attrs.frozen
class LinkAttached:
    """The peer attached: a new link to answer (:meth:`Link.attach`, or refuse by attaching
    with a null terminus and detaching), or the answer to our own attach. By the time the
    owner handles it the engine may have detached the link already (a :class:`LinkDetached`
    with ``by_peer`` false follows); answering it then does nothing."""

    link: Link


@attrs.frozen
class LinkDetached:
    """The link's peer end is gone: the peer's detach arrived (``by_peer``; ``closed``: for
    good; ``error``: the peer's), or its session ended (``closed`` false; ``error``: the
    end's), or the engine detached it because the peer broke the protocol on it
    (``by_peer`` false, ``closed`` true, ``error`` ours; the peer's answering detach then
    brings a second event). Answer a peer's detach with :meth:`Link.detach`; it does
    nothing where no answer is due."""

    link: Link
    closed: bool
    error: Error | None
    by_peer: bool = True


@attrs.frozen
class LinkFlow:
    """The peer's flow changed a link's credit or drain (or echoed a drain back)."""

    link: Link
