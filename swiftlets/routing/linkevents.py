"""The events of the routing link machine: what it tells its owner, one class each.

The owner drains them with :meth:`~.stages.LinkMachine.events` after each call; the
docstring of each says what the owner does on it (most ask for an answer by one of the
machine's methods).
"""

from __future__ import annotations

import attrs

from .linkstate import Stage
from .window import Phase
from .wire import DEFAULT_WINDOW_BYTES


@attrs.frozen(kw_only=True)
class PeerIdentified:
    """The peer said who it is; the machine waits for :meth:`LinkMachine.admit` or
    :meth:`LinkMachine.refuse` (e.g. refuse a router that is already connected).

    Attributes:
        peer: the remote router's name (valid, not ours).
        version: the protocol version chosen.
        authentication: the authentication stage follows admission.
    """

    peer: str
    version: str
    authentication: bool


@attrs.frozen(kw_only=True)
class RecoveryRequested:
    """The XA recovery stage begins: the owner answers with
    :meth:`LinkMachine.recovery_list` (the routing xids it holds prepared as a receiver of
    transactions from ``peer``), once no preparation from an earlier link to ``peer`` is
    still under way."""

    peer: str


@attrs.frozen(kw_only=True)
class RecoveryReceived:
    """The peer's RECOVERY: ``xids`` it holds prepared as a receiver from us. The owner
    resolves its outbound prepared xids for the peer (listed and held: commit locally;
    held, not listed: roll back locally; listed, not held: committed already), makes that
    durable, and calls :meth:`LinkMachine.recovery_done` with the xids the peer must commit."""

    peer: str
    xids: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Operational:
    """Both sides are in the delivery stage: routes and transactions may flow.

    Attributes:
        peer: the remote router.
        version: the protocol version.
        peer_transaction_size: the peer's inbound-transaction-size (our send limit).
        peer_window_size: the peer's inbound-window-size: the window we start with.
        peer_window_bytes: the peer's inbound-window-bytes: the bound on what awaits its answer.
        keepalive_interval: seconds between keepalives (the listener's; 0: off).
        use_xa: XA transfer (either side asked for it).
        compression: batches may be compressed (both sides asked for it).
        unresolved: xids we listed in recovery that the peer did not commit: still
            prepared here, in doubt (the operator's, or a later recovery's).
    """

    peer: str
    version: str
    peer_transaction_size: int
    peer_window_size: int
    keepalive_interval: float
    peer_window_bytes: int = DEFAULT_WINDOW_BYTES
    use_xa: bool
    compression: bool = False
    unresolved: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RouteReceived:
    """The peer announced (``add``) or withdrew a route to ``destination``; ``path``
    starts with the peer (our next hop) and ends with ``destination``."""

    add: bool
    destination: str
    path: tuple[str, ...]


@attrs.frozen(kw_only=True)
class TransactionReceived:
    """XA, receiver: prepare ``messages`` durably under ``xid``, then call
    :meth:`LinkMachine.prepared` (or :meth:`LinkMachine.refuse_transaction`)."""

    xid: str
    messages: tuple[bytes, ...]


@attrs.frozen(kw_only=True)
class PrepareReceived:
    """XA, sender: the peer prepared ``xid`` (its window slot is free again); commit
    locally, durably, then call :meth:`LinkMachine.commit`."""

    xid: str


@attrs.frozen(kw_only=True)
class CommitReceived:
    """XA, receiver: the sender committed ``xid``; commit it, durably, then call
    :meth:`LinkMachine.committed`. ``recovery``: a commit of the recovery stage (an xid
    prepared in an earlier connection)."""

    xid: str
    recovery: bool = False


@attrs.frozen(kw_only=True)
class CommitDone:
    """XA, sender: the peer committed ``xid``; the transaction is over on both sides."""

    xid: str
    recovery: bool = False


@attrs.frozen(kw_only=True)
class TransactionRefused:
    """XA, sender: the peer refused ``xid`` and holds nothing of it; roll it back locally
    (then send the messages again, elsewhere, or to unroutable: the owner's business)."""

    xid: str
    reason: str


@attrs.frozen(kw_only=True)
class NonXaTransactionReceived:
    """Non-XA, receiver: commit ``messages`` at once, then call :meth:`LinkMachine.nonxa_committed`."""

    seq: int
    messages: tuple[bytes, ...]


@attrs.frozen(kw_only=True)
class NonXaCommitted:
    """Non-XA, sender: the peer committed the batch ``seq``; commit (remove) it locally."""

    seq: int


@attrs.frozen(kw_only=True)
class Closed:
    """The link ended (or is refused and ends after the reject-disconnect-delay).

    Attributes:
        reason: why, fit for one log line (a peer's reason is escaped and bounded).
        by_peer: the peer ended it (its CLOSE or refusal, or it closed the socket);
            False when we did (a refusal, a breach by the peer, a timeout, :meth:`LinkMachine.close`).
        peer: the remote router's name if known.
        stage: the stage the link was in.
        outbound: the transactions we sent that were still open, (xid or seq, phase),
            oldest first: SENT (the peer may or may not have prepared: recovery tells),
            PREPARED (the owner had not committed), COMMITTING (the owner committed; the
            peer commits in recovery).
        inbound: the same for the transactions we received: RECEIVED (the owner was
            preparing), PREPARED (awaiting the peer's commit), COMMITTING (the owner was
            committing), IN_DOUBT (listed in recovery, not resolved).
    """

    reason: str
    by_peer: bool
    peer: str | None
    stage: Stage
    outbound: tuple[tuple[str | int, Phase], ...] = ()
    inbound: tuple[tuple[str | int, Phase], ...] = ()


Event = (
    PeerIdentified
    | RecoveryRequested
    | RecoveryReceived
    | Operational
    | RouteReceived
    | TransactionReceived
    | PrepareReceived
    | CommitReceived
    | CommitDone
    | TransactionRefused
    | NonXaTransactionReceived
    | NonXaCommitted
    | Closed
)
