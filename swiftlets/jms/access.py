"""Who may use which address over AMQP: the listener's access policy, as pure functions.

Theory of operation
-------------------
:func:`queue_access` and :func:`topic_access` decide from what they are given — the
principal's grants (``None``: no ``sys$authentication``), the address, the operation, and
for a ``$`` queue name the facts the connection looked up — and look up, create or change
nothing. Their answer is an :class:`Access` (what the connection still has to do: create
the queue on first use, look it up, resolve its router) or the :class:`Refused` to raise,
with the AMQP condition and the text the client gets.

Queue access is decided before a queue is looked up or created, so a refused attach
leaves nothing behind. Names containing ``$`` are the router's: a temporary queue
(``tmp$…``) takes sends from anyone (a reply-to) and receivers only from the connection
that created it; a durable subscription's queue is used only as the durable subscription
(its topic, the client id that created it); any other ``$`` name needs a grant naming it
explicitly (:meth:`Principal.check_queue`), with authentication on or off, and must
exist: a client never creates a ``$`` queue.
"""

from __future__ import annotations

import enum

from martinet.swiftlets.authentication.api import AccessDenied, Principal
from martinet.swiftlets.mgmt.api import MANAGEMENT_QUEUE
from martinet.swiftlets.queuemanager.api import TEMPORARY_PREFIX
from martinet.swiftlets.topicmanager.api import TopicNameError, from_wildcards, parse_topic

__all__ = ["Access", "Refused", "Temporary", "queue_access", "topic_access"]


class Refused(Exception):
    """A refusal, with the AMQP error condition the client gets it under."""

    def __init__(self, condition: str, description: str):
        super().__init__(description)
        self.condition = condition


class Access(enum.Enum):
    """Allowed; what the connection still does with the queue (its errors refuse too)."""

    CREATE = "create"  # look it up, created on first use where auto-create allows (counted)
    EXISTING = "existing"  # look it up without creating (QueueManager.queue(create=False))
    RESOLVE = "resolve"  # resolve its router: routing takes the message there (QueueManager.resolve)
    GRANTED = "granted"  # nothing left to look up


class Temporary(enum.Enum):
    """A temporary queue of this router, as the connection found it."""

    MISSING = "missing"
    MINE = "mine"  # created by the asking connection
    OTHERS = "others"  # created by another connection


# (the members as module globals: an enum member looked up through its class costs as much
# as the rest of a plain queue's check, which an anonymous relay makes per message)
CREATE, EXISTING, RESOLVE, GRANTED = Access.CREATE, Access.EXISTING, Access.RESOLVE, Access.GRANTED
MISSING, MINE, OTHERS = Temporary.MISSING, Temporary.MINE, Temporary.OTHERS


def queue_access(
    address: str,
    action: str,
    router: str,
    grants: Principal | None,
    create: bool = True,
    *,
    temporary: Temporary = MISSING,
    durable: bool = False,
) -> Access | Refused:
    """Whether a connection with ``grants`` may ``action`` (send, receive, browse) queue
    ``address`` on router ``router``; if so, what is left to do (``create``: the queue may
    be created on first use; a management reply-to is checked without, as it must exist
    already). ``temporary`` is how the connection found a temporary queue of this router
    of that name, ``durable`` whether the name is a durable subscription's queue here;
    both matter only for ``$`` names.

    Names containing ``$`` are the router's, with these rules whether authentication is
    on or off:

    - a temporary queue (``tmp$…``): anyone may send to it while it exists (it is a
      reply-to address); only the connection that created it may receive from or
      browse it;
    - ``sys$mgmt`` (here or ``@router``): anyone may send to it (each request is stamped
      with the sender's identity, and ``sys$mgmt`` decides whom it answers); nobody
      receives from it;
    - a durable subscription's queue: never as a queue; attach to its topic as a durable
      subscriber, with the client id that created it;
    - any other ``$`` name: only with a grant that names it explicitly
      (:meth:`Principal.check_queue`; without ``sys$authentication`` there are no grants,
      so never), and only if it exists: a client never creates a ``$`` queue.

    Receiving from or browsing a queue on another router (``q@other``) is refused.
    """
    if not address:
        return Refused("amqp:invalid-field", "an address is required")
    name, at, where = address.rpartition("@")
    if not at:
        name = address
    remote = bool(at) and where != router
    if remote and action != "send":
        return Refused(
            "amqp:not-found",
            f"cannot {action} queue {address!r}: it is on router {where}, "
            f"and only queues of this router ({router}) can be read here",
        )
    try:
        if "$" not in name:
            if grants is not None:
                grants.check_queue(address, action)
            if create:
                return CREATE
            return RESOLVE if remote else EXISTING
        if name == MANAGEMENT_QUEUE and not create:  # a reply sent there would be served as a request
            return _denied(f"{address!r} is a management queue, not a reply-to")
        if name == MANAGEMENT_QUEUE and action == "send":  # sys$mgmt decides whom it answers
            return RESOLVE if remote else EXISTING
        if name.startswith(TEMPORARY_PREFIX):
            if remote:  # a reply-to on another router: routing takes it there, if it knows the router
                return RESOLVE
            if temporary is MISSING:
                return Refused("amqp:not-found", f"temporary queue {name!r} does not exist on router {router}")
            if action != "send" and temporary is not MINE:
                return _denied(
                    f"cannot {action} temporary queue {name!r}: only the connection that created it may receive from it"
                )
            return GRANTED
        if not remote and durable:
            return _denied(
                f"cannot {action} queue {name!r} as a queue: it is a durable subscription's; attach "
                "to its topic as a durable subscriber, with the client id that created it"
            )
        if grants is None:
            return _denied(
                f"cannot {action} queue {address!r}: a name with '$' is the router's, and without "
                "sys$authentication no grant can name it"
            )
        grants.check_queue(address, action)
    except AccessDenied as exc:
        return _denied(str(exc))
    return EXISTING  # a client never creates a '$' queue


def topic_access(
    address: str | None, action: str, *, available: bool, wildcards: bool, grants: Principal | None
) -> str | Refused:
    """The topic ``address`` names, in the topic manager's syntax (``wildcards``: the
    listener's ``topic-wildcards``, ``*`` and ``#`` levels translated), if a connection
    with ``grants`` may ``action`` (publish, subscribe, durable) it; ``available``: a topic
    manager runs."""
    if not address:
        return Refused("amqp:invalid-field", "an address is required")
    if not available:
        return Refused("amqp:not-found", "topics are not available: sys$topicmanager is not running")
    try:
        if wildcards:
            address = from_wildcards(address)
        parse_topic(address)
        if grants is not None:
            grants.check_topic(address, action)
    except TopicNameError as exc:
        return Refused("amqp:invalid-field", str(exc))
    except AccessDenied as exc:
        return _denied(str(exc))
    return address


def _denied(description: str) -> Refused:
    return Refused("amqp:unauthorized-access", description)
