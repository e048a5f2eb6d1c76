"""The routing link machine: the stages of one router-to-router connection, both roles, sans-IO.

Theory of operation
-------------------
One :class:`LinkMachine` runs one TCP connection between two routers, as the side that
dialled (:attr:`Role.CONNECTOR`) or the side that accepted (:attr:`Role.LISTENER`). It
speaks the frames of :mod:`.wire` and walks the stages of ``docs/routing-protocol.md``::

    protocol select -> connect -> (admission by the owner) -> authentication
        -> [XA recovery, when the link uses XA] -> delivery (routes, transactions)

It is sans-IO (the :class:`martinet.messaging.io.SansIO` protocol): the owner feeds what
the socket delivers to :meth:`~LinkMachine.receive_data`, writes what
:meth:`~LinkMachine.data_to_send` returns, calls :meth:`~LinkMachine.tick` with the time at
the deadline it returned, and drains :meth:`~LinkMachine.events` after each of these.

Transitions are data: :data:`TRANSITIONS` maps (role, state, input) to the states the
input may lead to; the handler for the input picks one of them (a refusal or a breach may
always end the link instead). An input without an entry is a protocol error. Inputs are
the frame types received and the owner's decisions (:class:`Decision`).

- **Admission.** The machine does not know the router's other links, so it does not
  decide who may connect. When it learns the peer's name it emits :class:`PeerIdentified`
  and waits (state ``ADMISSION``, input read no further) until the owner calls
  :meth:`~LinkMachine.admit` or :meth:`~LinkMachine.refuse`. It refuses by itself a peer
  with an invalid name or with our own name.
- **Authentication** (mutual, HMAC-SHA256 over both nonces; see :func:`proof`): the
  matrix is in the module constant :data:`AUTH_MATRIX` and in the document.
- **Refusals** (version, name, admission, authentication) are written, the
  :class:`Closed` event is emitted at once, and the machine keeps the socket
  ``reject_disconnect_delay`` seconds (reading and dropping input) before
  :meth:`~LinkMachine.data_to_send` returns None, so the peer reads the reason before the
  socket goes; the peer closing its side ends the wait early.
- **Breaches** (a malformed, oversized, unknown or unexpected frame): a CLOSE with the
  reason is written, :class:`Closed` (``by_peer`` false) emitted, and the link ends once the
  CLOSE is taken. Nothing is raised out of :meth:`~LinkMachine.receive_data`.
- **Timers** (:meth:`~LinkMachine.tick`): each waiting state before delivery (both roles,
  owner admission included) is guarded by ``stage_valid_timeout`` counted from the first
  tick after the state began; in delivery SwiftMQ's keepalive: a KEEPALIVE every
  interval whatever else is sent, a counter reset to 5 by each KEEPALIVE received and
  decremented at each interval; at 0 the link is closed. Interval 0: no keepalive. (Reset
  on every KEEPALIVE received, however framed: SwiftMQ increments the counter instead for a
  KEEPALIVE that arrives inside a bulk frame, so a peer that had been sending bulk frames
  took longer to be found dead.)

- **XA recovery** (only when the link uses XA): the machine asks its owner for the xids it
  holds prepared as a receiver from this peer (:class:`RecoveryRequested` →
  :meth:`~LinkMachine.recovery_list`), hands it the peer's list (:class:`RecoveryReceived`),
  and sends the COMMITs the owner decided (:meth:`~LinkMachine.recovery_done`); the stage
  ends when both sides sent RECOVERY_DONE, which each sends once every COMMIT it sent was
  answered. Guarded by ``recovery_timeout``.
- **Transfer** (delivery): per transaction phases are data too (:data:`OUTBOUND_PHASES`,
  :data:`INBOUND_PHASES` in :mod:`.window`, one table and one :class:`~.window.Ledger`
  per direction). The machine checks every xid and sequence number the peer names, the
  window bounds and transaction size, the peer's and the owner's; it never delays
  anything (inbound flow control is the owner answering later). The window counts
  transactions awaiting their prepare (room is freed at the prepare, so the link stays
  busy while commits are in flight); its size is the owner's (:meth:`set_send_window`),
  within the receiver's ``window_bytes`` awaiting and three times that open.

Misuse by the owner (``admit()`` outside admission, ``send_route`` before delivery, a
transaction beyond the window, an xid in the wrong phase) raises
:class:`~.wire.LocalProtocolError` and changes nothing.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Iterable, Sequence

import attrs

from .exchange import MAX_PATH
from .window import (
    INBOUND_PHASES,
    OPEN_FACTOR,
    OUTBOUND_PHASES,
    Decision,
    Direction,
    Ledger,
    NoTransition,
    Phase,
    transaction_cost,
)
from .wire import (
    DEFAULT_WINDOW_BYTES,
    HANDSHAKE_MAX_FRAME_SIZE,
    MAGIC,
    MAX_XID_LENGTH,
    MIN_WINDOW_BYTES,
    Adjust,
    Auth,
    AuthReply,
    Close,
    Commit,
    CommitReply,
    Connect,
    ConnectReply,
    Frame,
    FrameReader,
    FrameType,
    Keepalive,
    LocalProtocolError,
    NonXaCommit,
    NonXaTransaction,
    PrepareReply,
    Protocol,
    ProtocolReply,
    Recovery,
    RecoveryDone,
    Refuse,
    RemoteProtocolError,
    Route,
    StartDelivery,
    Transaction,
    encode,
    pack_messages,
    unpack_messages,
)

__all__ = [
    "Role",
    "Stage",
    "State",
    "Decision",
    "Phase",
    "LinkSettings",
    "LinkMachine",
    "PeerIdentified",
    "RecoveryRequested",
    "RecoveryReceived",
    "Operational",
    "RouteReceived",
    "TransactionReceived",
    "PrepareReceived",
    "CommitReceived",
    "CommitDone",
    "TransactionRefused",
    "NonXaTransactionReceived",
    "NonXaCommitted",
    "Closed",
    "VERSIONS",
    "KEEPALIVE_COUNT",
    "AUTH_FAILED",
    "AUTH_MATRIX",
    "TRANSITIONS",
    "OUTBOUND_PHASES",
    "INBOUND_PHASES",
    "OPEN_FACTOR",
    "proof",
    "valid_router_name",
]

VERSIONS = ("1.1",)  # the versions this module implements; never offer more (SwiftMQ defect 6)
KEEPALIVE_COUNT = 5  # SwiftMQ's: the counter starts at 5
NONCE_SIZE = 32
MAX_NAME_LENGTH = 64
MAX_PATH_LENGTH = MAX_PATH  # what the exchanger stores: a route announced carries the sender first
MAX_VERSIONS = 16
MAX_REASON = 500  # characters of a reason we send (at most 2000 bytes: a CLOSE fits the handshake limit)
MAX_UNREAD = 2 * HANDSHAKE_MAX_FRAME_SIZE  # input held unread while the owner decides on admission
AUTH_FAILED = "authentication failed"
LABEL_CONNECTOR = b"martinet-routing connector proof"  # the proof the connector sends
LABEL_LISTENER = b"martinet-routing listener proof"  # the proof the listener sends

# The router-name rule of kernel/config.py (``_ROUTER_NAME``), with a bound on the length.
_ROUTER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_VERSION = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\Z")


def valid_router_name(name: str) -> bool:
    """A router name as the kernel accepts it (letters, digits, ``_``, ``-``, starting with
    a letter), at most :data:`MAX_NAME_LENGTH` characters."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _ROUTER_NAME.match(name) is not None


def _printable(text: str, limit: int = 200) -> str:
    """A peer's text made fit for one log line: control characters escaped, length bounded."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return text if len(text) <= limit else text[:limit] + "…"


def proof(
    password: bytes,
    label: bytes,
    connector_nonce: bytes,
    listener_nonce: bytes,
    connector_name: str,
    listener_name: str,
    version: str,
) -> bytes:
    """HMAC-SHA256 keyed with ``password`` over the label and the handshake's values.

    The message is ``label``, then each of connector nonce, listener nonce, connector
    name, listener name, version (names and version UTF-8) preceded by its length as a
    2-byte big-endian integer. The label differs per direction, so a proof one side sent
    is never valid as the other side's (no reflection).
    """
    message = bytearray(label)
    for part in (connector_nonce, listener_nonce, connector_name.encode(), listener_name.encode(), version.encode()):
        message += len(part).to_bytes(2, "big") + part
    return hmac.new(password, bytes(message), hashlib.sha256).digest()


class Role(enum.Enum):
    CONNECTOR = "connector"
    LISTENER = "listener"


class Stage(enum.Enum):
    """The protocol's stages (coarse; :class:`State` is the machine's exact state)."""

    PROTOCOL = "protocol select"
    CONNECT = "connect"
    AUTHENTICATION = "authentication"
    RECOVERY = "XA recovery"  # only when the link uses XA
    DELIVERY = "delivery"


class State(enum.Enum):
    """Where the machine is; the waiting states name what they wait for."""

    PROTOCOL_WAIT = "awaiting the protocol select"
    CONNECT_WAIT = "awaiting the connect"
    ADMISSION = "awaiting the owner's admission"
    AUTH_WAIT = "awaiting the authentication"
    RECOVERY_WAIT = "awaiting the XA recovery"
    ADJUST_WAIT = "awaiting the peer's adjust"
    START_WAIT = "awaiting the peer's start-delivery"
    OPERATIONAL = "operational"
    REJECTING = "refused, waiting for the reject-disconnect-delay"
    CLOSED = "closed"


STAGE_OF = {
    State.PROTOCOL_WAIT: Stage.PROTOCOL,
    State.CONNECT_WAIT: Stage.CONNECT,
    State.ADMISSION: Stage.CONNECT,
    State.AUTH_WAIT: Stage.AUTHENTICATION,
    State.RECOVERY_WAIT: Stage.RECOVERY,
    State.ADJUST_WAIT: Stage.DELIVERY,
    State.START_WAIT: Stage.DELIVERY,
    State.OPERATIONAL: Stage.DELIVERY,
}
WAITING = frozenset(STAGE_OF) - {State.OPERATIONAL}  # guarded by stage-valid-timeout
ENDED = frozenset({State.REJECTING, State.CLOSED})


C, L = Role.CONNECTOR, Role.LISTENER
S = State
# (role, state, input) -> the states the input may lead to (the first is the usual one).
# Not listed: a CLOSE frame (accepted in every state before the end: the peer ends the
# link), and the end of a link (refusal -> REJECTING, breach or timeout -> CLOSED), which
# any input may cause. Anything else missing is a protocol error.
TRANSITIONS: dict[tuple[Role, State, FrameType | Decision], tuple[State, ...]] = {
    # protocol select: the connector wrote the magic and PROTOCOL when it was created
    (L, S.PROTOCOL_WAIT, FrameType.PROTOCOL): (S.CONNECT_WAIT,),
    (C, S.PROTOCOL_WAIT, FrameType.PROTOCOL_REPLY): (S.CONNECT_WAIT,),
    # connect: each side learns the peer's name here and asks its owner
    (L, S.CONNECT_WAIT, FrameType.CONNECT): (S.ADMISSION,),
    (C, S.CONNECT_WAIT, FrameType.CONNECT_REPLY): (S.ADMISSION,),
    (L, S.ADMISSION, Decision.ADMIT): (S.AUTH_WAIT, S.ADJUST_WAIT, S.RECOVERY_WAIT),
    (C, S.ADMISSION, Decision.ADMIT): (S.AUTH_WAIT, S.ADJUST_WAIT, S.RECOVERY_WAIT),
    (L, S.ADMISSION, Decision.REFUSE): (S.REJECTING,),
    (C, S.ADMISSION, Decision.REFUSE): (S.REJECTING,),
    # authentication; then the XA recovery when the link uses XA, else the delivery
    (L, S.AUTH_WAIT, FrameType.AUTH): (S.ADJUST_WAIT, S.RECOVERY_WAIT),
    (C, S.AUTH_WAIT, FrameType.AUTH_REPLY): (S.ADJUST_WAIT, S.RECOVERY_WAIT),
    # delivery
    (L, S.ADJUST_WAIT, FrameType.ADJUST): (S.START_WAIT,),
    (C, S.ADJUST_WAIT, FrameType.ADJUST): (S.START_WAIT,),
    (L, S.START_WAIT, FrameType.START_DELIVERY): (S.OPERATIONAL,),
    (C, S.START_WAIT, FrameType.START_DELIVERY): (S.OPERATIONAL,),
    (L, S.OPERATIONAL, FrameType.KEEPALIVE): (S.OPERATIONAL,),
    (C, S.OPERATIONAL, FrameType.KEEPALIVE): (S.OPERATIONAL,),
    (L, S.OPERATIONAL, FrameType.ROUTE): (S.OPERATIONAL,),
    (C, S.OPERATIONAL, FrameType.ROUTE): (S.OPERATIONAL,),
}
# XA recovery, both roles alike. The stage ends (-> ADJUST_WAIT) when this side has sent
# its RECOVERY_DONE and received the peer's: only the inputs listed with ADJUST_WAIT can
# complete that (the peer's RECOVERY_DONE, our recovery_done, the last COMMIT_REPLY).
_RECOVERY: dict[FrameType | Decision, tuple[State, ...]] = {
    Decision.RECOVERY_LIST: (S.RECOVERY_WAIT,),
    FrameType.RECOVERY: (S.RECOVERY_WAIT,),
    Decision.RECOVERY_DONE: (S.RECOVERY_WAIT, S.ADJUST_WAIT),
    FrameType.COMMIT: (S.RECOVERY_WAIT,),
    Decision.COMMITTED: (S.RECOVERY_WAIT,),
    FrameType.COMMIT_REPLY: (S.RECOVERY_WAIT, S.ADJUST_WAIT),
    FrameType.RECOVERY_DONE: (S.RECOVERY_WAIT, S.ADJUST_WAIT),
}
# Transfer in the delivery stage, both roles alike (the mode, XA or not, is checked by the handlers).
_TRANSFER: tuple[FrameType | Decision, ...] = (
    Decision.SEND,
    FrameType.TRANSACTION,
    Decision.PREPARED,
    Decision.REFUSE_TRANSACTION,
    FrameType.PREPARE_REPLY,
    FrameType.REFUSE,
    Decision.COMMIT,
    FrameType.COMMIT,
    Decision.COMMITTED,
    FrameType.COMMIT_REPLY,
    Decision.SEND_NONXA,
    FrameType.NONXA_TRANSACTION,
    Decision.NONXA_COMMITTED,
    FrameType.NONXA_COMMIT,
)
for _role in Role:
    for _input, _states in _RECOVERY.items():
        TRANSITIONS[(_role, S.RECOVERY_WAIT, _input)] = _states
    for _input in _TRANSFER:
        TRANSITIONS[(_role, S.OPERATIONAL, _input)] = (S.OPERATIONAL,)
del C, L, S, _role, _input, _states

# Who must authenticate, by (listener has a password, connector has a password):
# True = the authentication stage runs; a string = the connector refuses, for that reason.
AUTH_MATRIX: dict[tuple[bool, bool], bool | str] = {
    (False, False): False,
    (True, True): True,
    (True, False): "the listener requires authentication and this connector has no password",
    (False, True): "the listener does not authenticate itself and this connector has a password",
}


# -- events ------------------------------------------------------------------------------------


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


@attrs.frozen(kw_only=True)
class LinkSettings:
    """What the owner configures (seconds for times).

    Attributes:
        keepalive_interval: the listener's keepalive-interval, sent to the connector (a
            connector's own value is not used); 0 turns keepalives off.
        inbound_transaction_size: messages per transaction we accept (sent in ADJUST).
        inbound_window_size: the window (transactions awaiting their prepare) a sender to
            us starts with (sent in ADJUST); it grows from there.
        inbound_window_bytes: the cost (:func:`~.window.transaction_cost`) of transactions
            awaiting our prepare we accept, bound of every sender's window (sent in ADJUST).
        use_xa: we ask for XA transfer.
        use_compression: we ask for compressed batches (used when both sides ask).
        stage_valid_timeout: how long each stage before delivery may wait (but recovery).
        recovery_timeout: how long the XA recovery stage may take in all.
        reject_disconnect_delay: how long a refused connection is kept open.
        max_frame_size: the largest frame accepted in the delivery stage (before it,
            :data:`~.wire.HANDSHAKE_MAX_FRAME_SIZE`, which is also the least allowed here).
    """

    keepalive_interval: float = 60.0
    inbound_transaction_size: int = 20
    inbound_window_size: int = 10
    inbound_window_bytes: int = DEFAULT_WINDOW_BYTES
    use_xa: bool = True
    use_compression: bool = False
    stage_valid_timeout: float = 15.0
    recovery_timeout: float = 60.0
    reject_disconnect_delay: float = 5.0
    max_frame_size: int = 1 << 20

    def __attrs_post_init__(self) -> None:
        if (
            not 0 <= self.keepalive_interval < (1 << 32) / 1000
            or self.max_frame_size < HANDSHAKE_MAX_FRAME_SIZE
            or not 1 <= self.inbound_transaction_size < 1 << 32
            or not 1 <= self.inbound_window_size < 1 << 32
            or not MIN_WINDOW_BYTES <= self.inbound_window_bytes < 1 << 32
            or self.stage_valid_timeout <= 0
            or self.reject_disconnect_delay < 0
            or self.recovery_timeout <= 0
        ):
            raise ValueError(f"invalid link settings: {self!r}")


# -- the machine -------------------------------------------------------------------------------


class LinkMachine:
    """One routing connection, either role (see the module docstring).

    Args:
        role: we dialled (connector) or accepted (listener).
        name: our router name.
        password: the link's shared secret (str, used as UTF-8), None or "" for none.
        settings: see :class:`LinkSettings`.
        now: the time (the same clock as :meth:`tick`'s).
        nonce_source: ``n -> n random bytes`` (tests inject a fixed one).
    """

    def __init__(
        self,
        role: Role,
        name: str,
        password: str | None = None,
        settings: LinkSettings | None = None,
        *,
        now: float,
        nonce_source: Callable[[int], bytes] = secrets.token_bytes,
    ):
        if not valid_router_name(name):
            raise ValueError(f"invalid router name {name!r}")
        self.role = role
        self.name = name
        self.settings = settings = settings or LinkSettings()
        self._password = password.encode() if password else None
        self._nonce = nonce_source(NONCE_SIZE)
        if type(self._nonce) is not bytes or len(self._nonce) != NONCE_SIZE:
            raise ValueError("the nonce source must return 32 bytes")
        self._state = State.PROTOCOL_WAIT
        self._stage = Stage.PROTOCOL
        self._reader = FrameReader(HANDSHAKE_MAX_FRAME_SIZE)
        self._out: list[bytes] = []
        self._events: list[Event] = []
        self._now = now
        self._deadline: float | None = now + settings.stage_valid_timeout  # None: set at the next tick
        self._ended = False  # data_to_send returns None once the output is taken
        self._close_sent = False
        # learned during the handshake
        self.peer: str | None = None
        self.version: str | None = None
        self._peer_nonce = b""
        self._peer_use_xa = False
        self._keepalive_interval = settings.keepalive_interval if role is Role.LISTENER else 0.0
        self._authenticate = False
        self._peer_adjust: Adjust | None = None
        # XA recovery
        self._recovery_list_sent = False
        self._peer_recovery: tuple[str, ...] | None = None
        self._recovery_done_called = False
        self._recovery_done_sent = False
        self._peer_recovery_done = False
        # transfer: open transactions per direction, oldest first, and how many per phase
        self._sent = Ledger(Direction.OUTBOUND)
        self._received = Ledger(Direction.INBOUND)
        self._send_window = 0  # transactions that may await their answer: the owner sizes it (set_send_window)
        self._last_seq_out = -1
        self._last_seq_in = -1
        # delivery
        self._keepalive_next: float | None = None
        self._keepalive_counter = KEEPALIVE_COUNT
        self._unresolved: tuple[str, ...] = ()
        self._magic_sent = False
        if role is Role.CONNECTOR:
            self._send(Protocol(versions=VERSIONS))

    # -- what the owner reads ---------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def stage(self) -> Stage:
        """The current stage; once ended, the stage the link ended in."""
        return self._stage

    @property
    def keepalive_counter(self) -> int:
        """The keepalive counter (5 while keepalives arrive; the link closes at 0)."""
        return self._keepalive_counter

    @property
    def use_xa(self) -> bool:
        """XA transfer on this link (either side asked; known once the peer is identified)."""
        return self.settings.use_xa or self._peer_use_xa

    @property
    def compression(self) -> bool:
        """Our batches are compressed (both sides asked; known in the delivery stage)."""
        return bool(self.settings.use_compression and self._peer_adjust and self._peer_adjust.compression)

    @property
    def open_transactions(self) -> int:
        """Outbound transactions open, in any phase."""
        return len(self._sent)

    @property
    def window_available(self) -> int:
        """How many more transactions :meth:`send_transaction` / :meth:`send_nonxa` take now:
        the send window (:meth:`set_send_window`) less those awaiting their prepare (non-XA:
        their commit); 0 while the cost awaiting has reached the peer's ``window_bytes`` or
        the cost open in all phases :data:`~.window.OPEN_FACTOR` × that, and before the
        delivery stage. Each transaction sent is checked again."""
        peer = self._peer_adjust
        if self._state is not State.OPERATIONAL or peer is None:
            return 0
        sent = self._sent
        if sent.awaiting_bytes >= peer.window_bytes or sent.open_bytes >= OPEN_FACTOR * peer.window_bytes:
            return 0
        return max(0, self._send_window - sent.awaiting)

    @property
    def send_window(self) -> int:
        """Transactions that may await their answer at once (the peer's ``window_size`` at first)."""
        return self._send_window

    def set_send_window(self, transactions: int) -> None:
        """Let ``transactions`` (at least 1) await their answer at once: the owner sizes the
        window to the link (:class:`~.window.WindowController`); the peer's byte bounds hold
        whatever it is."""
        self._send_window = max(1, transactions)

    @property
    def bytes_in_flight(self) -> int:
        """The cost of our transactions awaiting their answer (:func:`~.window.transaction_cost`)."""
        return self._sent.awaiting_bytes

    @property
    def awaiting(self) -> int:
        """Our transactions awaiting their answer."""
        return self._sent.awaiting

    @property
    def peer_max_frame_size(self) -> int:
        """The largest frame the peer accepts (from its ADJUST; 0 before): a batch must fit."""
        return self._peer_adjust.max_frame_size if self._peer_adjust else 0

    @property
    def outbound(self) -> dict[str | int, Phase]:
        """The open outbound transactions and their phases (a copy), oldest first."""
        return dict(self._sent.phases)

    @property
    def inbound(self) -> dict[str | int, Phase]:
        """The open inbound transactions and their phases (a copy), oldest first."""
        return dict(self._received.phases)

    def events(self) -> list[Event]:
        """The events since the last call, oldest first (taking them empties the list)."""
        events, self._events = self._events, []
        return events

    # -- SansIO -----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The link is over and everything was taken from :meth:`data_to_send`."""
        return self._ended and not self._out

    def data_to_send(self) -> bytes | None:
        """Bytes to write now (``b""``: nothing); None once the link is over and all was taken."""
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            return data
        return None if self._ended else b""

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed what the peer sent; ``b""``: it closed its side. Frames are handled at once,
        up to the admission (the rest waits for :meth:`admit`). A breach of the protocol is
        answered (CLOSE, :class:`Closed`), never raised. Does nothing once the link ended
        (during the reject-disconnect-delay, input is dropped; end of input ends the wait).
        """
        if self._state is State.CLOSED:
            return
        if not data:
            if self._state is State.REJECTING:
                self._state, self._ended = State.CLOSED, True
            else:
                self._end(f"the peer closed the connection ({self._state.value})", by_peer=True)
            return
        if self._state is State.REJECTING:
            return
        self._reader.feed(data)
        if self._state is State.ADMISSION and self._reader.buffered > MAX_UNREAD:
            # the owner has not decided yet and the peer keeps sending: a well-behaved peer
            # has sent at most a few small frames (ADJUST, START_DELIVERY) by now
            self._fail(
                f"{self._reader.buffered} bytes received while awaiting the owner's admission (at most {MAX_UNREAD})"
            )
            return
        self._process()

    def tick(self, now: float) -> float:
        """Act on the time ``now``: a waiting state's stage-valid-timeout, the end of the
        reject-disconnect-delay, the keepalive. The next deadline, 0 for none."""
        self._now = now
        state = self._state
        if state is State.CLOSED:
            return 0.0
        if state is State.REJECTING:
            if self._deadline is None:
                self._deadline = now + self.settings.reject_disconnect_delay
            if now >= self._deadline:
                self._state, self._ended = State.CLOSED, True
                return 0.0
            return self._deadline
        if state in WAITING:
            recovery = state is State.RECOVERY_WAIT
            timeout = self.settings.recovery_timeout if recovery else self.settings.stage_valid_timeout
            if self._deadline is None:
                self._deadline = now + timeout
            if now >= self._deadline:
                self._fail(
                    f"{'recovery-timeout' if recovery else 'stage-valid-timeout'} ({timeout:g} s) expired "
                    f"in the {self._stage.value} stage ({state.value})"
                )
                return 0.0
            return self._deadline
        # OPERATIONAL
        interval = self._keepalive_interval
        if not interval:
            return 0.0
        if self._keepalive_next is None:
            self._keepalive_next = now + interval
        elif now >= self._keepalive_next:
            self._keepalive_counter -= 1
            if self._keepalive_counter <= 0:
                self._fail(
                    f"no keepalive from {self.peer} for {KEEPALIVE_COUNT} intervals "
                    f"({KEEPALIVE_COUNT} × {interval:g} s)"
                )
                return 0.0
            self._send(Keepalive())
            self._keepalive_next += interval
            if self._keepalive_next <= now:  # ticked late: count from now, one decrement per tick
                self._keepalive_next = now + interval
        return self._keepalive_next

    # -- the owner's calls ------------------------------------------------------------------

    def admit(self) -> None:
        """Let the identified peer in: the handshake continues (authentication or delivery).
        Does nothing once the link ended (the :class:`Closed` event said so), so a decision
        that crosses the peer's close is harmless.

        Raises:
            LocalProtocolError: not awaiting admission (e.g. admitted already).
        """
        self._decide(Decision.ADMIT, self._on_admit)

    def refuse(self, reason: str) -> None:
        """Refuse the identified peer with ``reason`` (e.g. "router r2 is already connected"):
        it reads the reason, the socket ends after the reject-disconnect-delay. Does
        nothing once the link ended.

        Raises:
            LocalProtocolError: not awaiting admission.
        """
        reason = reason[:MAX_REASON]
        self._decide(
            Decision.REFUSE,
            lambda: self._refuse(
                reason, ConnectReply(accepted=False, reason=reason) if self.role is Role.LISTENER else None
            ),
        )

    def send_route(self, *, add: bool, destination: str, path: Sequence[str]) -> bool:
        """Announce (``add``) or withdraw a route: ``path`` starts with our name and ends
        with ``destination`` (the peer will hold it as its route over us). True when it is
        queued; False when the link already ended (the route is dropped with the link).

        Raises:
            LocalProtocolError: the delivery stage has not begun, or an invalid route.
        """
        if self._state in ENDED:
            return False
        if self._state is not State.OPERATIONAL:
            raise LocalProtocolError(f"send_route while {self._state.value}")
        route = Route(add=add, destination=destination, path=tuple(path))
        problem = self._route_problem(route, first=self.name)
        if problem:
            raise LocalProtocolError(problem)
        self._out.append(encode(route, self.settings.max_frame_size))
        return True

    # -- the owner's calls: XA recovery ------------------------------------------------------

    def recovery_list(self, xids: Iterable[str]) -> None:
        """Answer :class:`RecoveryRequested`: the routing xids we hold prepared as a receiver
        from this peer (sent in RECOVERY; the peer commits those it committed as a sender).
        Does nothing once the link ended.

        Raises:
            LocalProtocolError: not in the recovery stage, given already, or an invalid xid.
        """
        xids = tuple(xids)

        def handler() -> State | None:
            if self._recovery_list_sent:
                raise LocalProtocolError("recovery_list given twice")
            if problem := _xids_problem(xids):
                raise LocalProtocolError(problem)
            self._send(Recovery(xids=xids))  # raises (nothing changed) when it does not fit a frame
            self._recovery_list_sent = True
            for xid in xids:
                self._step(Direction.INBOUND, xid, Decision.RECOVERY_LIST, remote=False)
            return self._recovery_progress()

        self._decide(Decision.RECOVERY_LIST, handler)

    def recovery_done(self, commit: Iterable[str] = ()) -> None:
        """Answer :class:`RecoveryReceived` once the owner's local commits and rollbacks are
        durable: ``commit``, the xids of the peer's list that the peer must commit (by the
        recovery table: every xid it listed). A COMMIT goes for each; the stage ends when
        each was answered (:class:`CommitDone` with ``recovery``) and the peer is done too.
        Does nothing once the link ended.

        Raises:
            LocalProtocolError: not in the recovery stage, before the peer's RECOVERY,
                twice, or an xid the peer did not list (or listed twice here).
        """
        commit = tuple(commit)

        def handler() -> State | None:
            if self._peer_recovery is None:
                raise LocalProtocolError("recovery_done before the peer's RECOVERY")
            if self._recovery_done_called:
                raise LocalProtocolError("recovery_done given twice")
            listed = set(self._peer_recovery)
            if len(set(commit)) != len(commit) or not listed.issuperset(commit):
                raise LocalProtocolError(
                    "recovery_done may commit only xids the peer listed, each once; not "
                    f"{[x for x in commit if x not in listed][:3] or 'duplicates'}"[:300]
                )
            self._recovery_done_called = True
            for xid in commit:
                self._step(Direction.OUTBOUND, xid, Decision.RECOVERY_DONE, remote=False)
                self._send(Commit(xid=xid))
            return self._recovery_progress()

        self._decide(Decision.RECOVERY_DONE, handler)

    # -- the owner's calls: transfer -----------------------------------------------------------

    def send_transaction(self, xid: str, messages: Sequence[bytes]) -> bool:
        """XA, sender: send ``messages`` (1 to the peer's transaction size) under ``xid``
        (a new one: the owner never reuses an xid). True when queued; False when the link
        already ended (nothing was sent: the owner rolls back).

        Raises:
            LocalProtocolError: not in delivery, a non-XA link, no window available
                (:attr:`window_available`), too many or no messages, an invalid or open
                xid, a frame above the peer's maximum frame size (send fewer messages).
        """
        messages = tuple(messages)

        def handler() -> State | None:
            self._check_xa(True, local=True)
            if problem := _xid_problem(xid):
                raise LocalProtocolError(problem)
            packed, compressed = self._batch(messages)
            frame = Transaction(xid=xid, messages=packed, compressed=compressed)
            self._step(Direction.OUTBOUND, xid, Decision.SEND, remote=False, frame=frame, cost=transaction_cost(packed))
            return State.OPERATIONAL

        return self._transfer(Decision.SEND, handler)

    def prepared(self, xid: str) -> None:
        """XA, receiver: ``xid`` is prepared durably: PREPARE_REPLY. Call it as late as
        inbound flow control wants; the sender's window waits. Nothing once the link ended.

        Raises:
            LocalProtocolError: not in delivery, or ``xid`` not received and unprepared.
        """
        self._transfer(
            Decision.PREPARED, lambda: self._reply(Direction.INBOUND, xid, Decision.PREPARED, PrepareReply(xid=xid))
        )

    def refuse_transaction(self, xid: str, reason: str) -> None:
        """XA, receiver: ``xid`` cannot be prepared at all (e.g. a target refuses it for a
        lasting reason) and nothing of it is held: REFUSE with ``reason``; the sender rolls
        it back. Nothing once the link ended.

        Raises:
            LocalProtocolError: not in delivery, or ``xid`` not received and unprepared.
        """
        frame = Refuse(xid=xid, reason=reason[:MAX_REASON])
        self._transfer(
            Decision.REFUSE_TRANSACTION, lambda: self._reply(Direction.INBOUND, xid, Decision.REFUSE_TRANSACTION, frame)
        )

    def commit(self, xid: str) -> None:
        """XA, sender: ``xid`` (prepared by the peer) is committed here, durably: COMMIT.
        Nothing once the link ended.

        Raises:
            LocalProtocolError: not in delivery, or ``xid`` not prepared by the peer.
        """
        self._transfer(Decision.COMMIT, lambda: self._reply(Direction.OUTBOUND, xid, Decision.COMMIT, Commit(xid=xid)))

    def committed(self, xid: str) -> None:
        """XA, receiver (also in recovery): ``xid`` is committed here, durably:
        COMMIT_REPLY. Nothing once the link ended.

        Raises:
            LocalProtocolError: ``xid`` has no COMMIT awaiting its answer.
        """

        def handler() -> State | None:
            following = self._reply(Direction.INBOUND, xid, Decision.COMMITTED, CommitReply(xid=xid))
            return self._recovery_progress() if self._state is State.RECOVERY_WAIT else following

        self._transfer(Decision.COMMITTED, handler)

    def send_nonxa(self, seq: int, messages: Sequence[bytes]) -> bool:
        """Non-XA, sender: send ``messages`` as the batch ``seq`` (greater than every
        earlier one on this link, below 2³²). True when queued; False when the link ended.

        Raises:
            LocalProtocolError: not in delivery, an XA link, no window, too many or no
                messages, ``seq`` not increasing, a frame above the peer's maximum.
        """
        messages = tuple(messages)

        def handler() -> State | None:
            self._check_xa(False, local=True)
            if type(seq) is not int or not self._last_seq_out < seq < 1 << 32:
                raise LocalProtocolError(
                    f"send_nonxa: the sequence number must grow (last {self._last_seq_out}, got {seq!r})"[:300]
                )
            packed, compressed = self._batch(messages)
            frame = NonXaTransaction(seq=seq, messages=packed, compressed=compressed)
            cost = transaction_cost(packed)
            self._step(Direction.OUTBOUND, seq, Decision.SEND_NONXA, remote=False, frame=frame, cost=cost)
            self._last_seq_out = seq
            return State.OPERATIONAL

        return self._transfer(Decision.SEND_NONXA, handler)

    def nonxa_committed(self, seq: int) -> None:
        """Non-XA, receiver: the batch ``seq`` is committed here: NONXA_COMMIT (as late as
        inbound flow control wants). Nothing once the link ended.

        Raises:
            LocalProtocolError: not in delivery, or ``seq`` not received and uncommitted.
        """
        self._transfer(
            Decision.NONXA_COMMITTED,
            lambda: self._reply(Direction.INBOUND, seq, Decision.NONXA_COMMITTED, NonXaCommit(seq=seq)),
        )

    def close(self, reason: str) -> None:
        """End the link now: a CLOSE with ``reason``, :class:`Closed` (``by_peer`` false).
        During the reject-disconnect-delay, end it now (no further frame or event, e.g.
        when the router stops); once the link is over, do nothing."""
        if self._state is State.REJECTING:
            self._state, self._ended = State.CLOSED, True
        elif self._state is not State.CLOSED:
            self._fail(reason)

    # -- internals: transitions -------------------------------------------------------------

    def _decide(self, decision: Decision, handler: Callable[[], State | None]) -> None:
        if self._state in ENDED:
            return
        allowed = TRANSITIONS.get((self.role, self._state, decision))
        if allowed is None:
            raise LocalProtocolError(f"{decision.value} while {self._state.value}")
        self._move(handler(), allowed)
        self._process()  # what the peer sent after its identification

    def _transfer(self, decision: Decision, handler: Callable[[], State | None]) -> bool:
        """An owner's transfer call: False once the link ended (nothing done)."""
        if self._state in ENDED:
            return False
        self._decide(decision, handler)
        return True

    def _step(
        self,
        direction: Direction,
        key: str | int,
        step: FrameType | Decision,
        *,
        remote: bool,
        frame: Frame | None = None,
        cost: int = 0,
    ) -> Phase | None:
        """Move transaction ``key`` of one direction by its phase table (``cost``: of one
        being opened); ``frame`` is sent first (an encoding error then changes nothing). A
        step the table lacks raises."""
        ledger = self._sent if direction is Direction.OUTBOUND else self._received
        try:
            ledger.check(key, step)
        except NoTransition as missing:
            what = f"{step.name} frame" if remote else step.value
            held = f"is {missing.current.value}" if missing.current else "is not open"
            problem = f"{what} for {_key_text(key)}, which {held} ({direction.value})"
            raise (RemoteProtocolError if remote else LocalProtocolError)(problem) from None
        if frame is not None:
            self._send(
                frame,
                self.peer_max_frame_size
                if isinstance(frame, (Transaction, NonXaTransaction))
                else self.settings.max_frame_size,
            )
        return ledger.move(key, step, cost)

    def _reply(self, direction: Direction, key: str | int, decision: Decision, frame: Frame) -> State:
        self._check_xa(decision is not Decision.NONXA_COMMITTED, local=True)
        self._step(direction, key, decision, remote=False, frame=frame)
        return State.OPERATIONAL

    def _check_xa(self, xa: bool, *, local: bool, frame: FrameType | None = None) -> None:
        if xa != self.use_xa:
            what = f"{frame.name} frame" if frame else "this call"
            problem = f"{what} on a{' non-' if self.use_xa is False else 'n '}XA link"
            raise (LocalProtocolError if local else RemoteProtocolError)(problem)

    def _batch(self, messages: tuple[bytes, ...]) -> tuple[tuple[bytes, ...], bool]:
        """The ``messages`` and ``compressed`` fields of a TRANSACTION or NONXA_TRANSACTION
        of the owner's ``messages``, checked against the peer's limits (the window, the
        transaction size)."""
        assert self._peer_adjust is not None
        size = self._peer_adjust.transaction_size
        if not 1 <= len(messages) <= size or not all(type(m) is bytes for m in messages):
            raise LocalProtocolError(
                f"a transaction carries 1 to {size} messages (bytes; the peer's "
                f"inbound-transaction-size), got {len(messages)}"
            )
        if not self.window_available:
            raise LocalProtocolError(
                f"no window available: {self._sent.awaiting} transactions ({self._sent.awaiting_bytes} bytes) "
                f"await their {'prepare' if self.use_xa else 'commit'} and {len(self._sent)} "
                f"({self._sent.open_bytes} bytes) are open (the send window is {self._send_window}, the peer's "
                f"inbound-window-bytes {self._peer_adjust.window_bytes})"
            )
        return pack_messages(messages, self.compression, self.peer_max_frame_size)

    def _recovery_progress(self) -> State:
        """Send our RECOVERY_DONE when it is due; the delivery stage once both are done."""
        if self._recovery_done_called and not self._recovery_done_sent and not self._sent.counts[Phase.COMMITTING]:
            self._send(RecoveryDone())
            self._recovery_done_sent = True
        if not (self._recovery_done_sent and self._peer_recovery_done):
            return State.RECOVERY_WAIT
        self._unresolved = tuple(str(xid) for xid in self._received.phases)  # all IN_DOUBT: committing ones answered
        self._received.clear()
        return self._enter_delivery()

    def _move(self, following: State | None, allowed: tuple[State, ...]) -> None:
        """Enter the state a handler chose (None: it ended the link)."""
        if following is None or self._state in ENDED:
            return
        if following not in allowed:
            raise AssertionError(f"{following} is not a transition listed for {self._state}")  # a bug here
        if following is not self._state:
            self._state = following
            self._stage = STAGE_OF[following]
            self._deadline = None  # the new state's timer starts at the next tick

    def _process(self) -> None:
        """Handle the complete frames received, until admission or the end."""
        while self._state not in ENDED and self._state is not State.ADMISSION:
            try:
                frame = self._reader.next_frame()
                if frame is None:
                    return
                self._on_frame(frame)
            except RemoteProtocolError as exc:
                self._fail(str(exc))

    def _on_frame(self, frame: Frame) -> None:
        if frame.TYPE is FrameType.CLOSE:
            assert isinstance(frame, Close)
            self._end(_printable(frame.reason) or "closed by the peer (no reason given)", by_peer=True)
            return
        allowed = TRANSITIONS.get((self.role, self._state, frame.TYPE))
        if allowed is None:
            raise RemoteProtocolError(f"unexpected {frame.TYPE.name} frame while {self._state.value}")
        handler = getattr(self, f"_on_{frame.TYPE.name.lower()}")
        self._move(handler(frame), allowed)

    # -- internals: output and ending -------------------------------------------------------

    def _send(self, frame: Frame, max_frame_size: int | None = None) -> None:
        data = encode(frame, max_frame_size or self.settings.max_frame_size)
        if not self._magic_sent:
            self._out.append(MAGIC)
            self._magic_sent = True
        self._out.append(data)

    def _end(self, reason: str, *, by_peer: bool) -> None:
        """The link is over now (after what is queued is taken)."""
        self._state, self._ended = State.CLOSED, True
        self._events.append(
            Closed(
                reason=reason,
                by_peer=by_peer,
                peer=self.peer,
                stage=self._stage,
                outbound=tuple(self._sent.phases.items()),
                inbound=tuple(self._received.phases.items()),
            )
        )

    def _fail(self, reason: str) -> None:
        """We end the link (a breach, a timeout, the owner): CLOSE with the reason, then over."""
        self._send_close(reason)
        self._end(reason, by_peer=False)

    def _send_close(self, reason: str) -> None:
        if not self._close_sent:
            self._close_sent = True
            self._send(Close(reason=reason[:MAX_REASON]))

    def _refuse(self, reason: str, frame: Frame | None = None, local_reason: str | None = None) -> None:
        """We refuse the peer: ``frame`` (a refusing reply) or a CLOSE carries ``reason``;
        the socket stays for the reject-disconnect-delay. ``local_reason``: what our own
        event says when it may say more than the peer is told."""
        if frame is None:
            self._send_close(reason)
        else:
            self._send(frame)
        self._state, self._deadline = State.REJECTING, None
        self._events.append(
            Closed(
                reason=local_reason or reason,
                by_peer=False,
                peer=self.peer,
                stage=self._stage,
                outbound=tuple(self._sent.phases.items()),
                inbound=tuple(self._received.phases.items()),
            )
        )

    # -- internals: handlers (each returns the next state, or None when it ended the link) --

    def _on_protocol(self, frame: Protocol) -> State | None:
        if len(frame.versions) > MAX_VERSIONS:
            raise RemoteProtocolError(f"PROTOCOL offers {len(frame.versions)} versions (at most {MAX_VERSIONS})")
        shared = [v for v in frame.versions if v in VERSIONS]
        if not shared:
            offered = ", ".join(_printable(v, 20) for v in frame.versions) or "none"
            reason = f"no common protocol version (offered: {offered}; supported: {', '.join(VERSIONS)})"
            self._refuse(reason, ProtocolReply(accepted=False, versions=VERSIONS, reason=reason))
            return None
        self.version = max(shared, key=_version_key)
        self._send(ProtocolReply(accepted=True, version=self.version))
        return State.CONNECT_WAIT

    def _on_protocol_reply(self, frame: ProtocolReply) -> State | None:
        if not frame.accepted:
            self._end(_printable(frame.reason) or "the listener refused the protocol versions", by_peer=True)
            return None
        if frame.version not in VERSIONS:
            raise RemoteProtocolError(
                f"the listener chose the version {_printable(frame.version, 20)!r}, which was not offered"
            )
        self.version = frame.version
        self._send(Connect(name=self.name, nonce=self._nonce, use_xa=self.settings.use_xa))
        return State.CONNECT_WAIT

    def _check_nonce(self, nonce: bytes) -> None:
        if len(nonce) != NONCE_SIZE:
            raise RemoteProtocolError(f"the nonce must have {NONCE_SIZE} bytes, got {len(nonce)}")

    def _name_problem(self, name: str) -> str | None:
        if not valid_router_name(name):
            return (
                f"invalid router name {_printable(name, 80)!r}: use letters, digits, '_' and '-', "
                f"starting with a letter, at most {MAX_NAME_LENGTH} characters"
            )
        if name == self.name:
            return f"both routers are named {name!r}"
        return None

    def _identified(self, name: str) -> State:
        self.peer = name
        self._events.append(PeerIdentified(peer=name, version=self.version or "", authentication=self._authenticate))
        return State.ADMISSION

    def _on_connect(self, frame: Connect) -> State | None:
        self._check_nonce(frame.nonce)
        if problem := self._name_problem(frame.name):
            self._refuse(problem, ConnectReply(accepted=False, reason=problem))
            return None
        self._peer_nonce, self._peer_use_xa = frame.nonce, frame.use_xa
        self._authenticate = self._password is not None
        return self._identified(frame.name)

    def _on_connect_reply(self, frame: ConnectReply) -> State | None:
        if not frame.accepted:
            self._end(_printable(frame.reason) or "the listener refused the connection", by_peer=True)
            return None
        self._check_nonce(frame.nonce)
        if problem := self._name_problem(frame.name):
            self._refuse(problem)
            return None
        self.peer = frame.name
        authenticate = AUTH_MATRIX[(frame.auth_required, self._password is not None)]
        if isinstance(authenticate, str):  # the peer is told no more than "authentication failed"
            self._refuse(AUTH_FAILED, local_reason=f"{AUTH_FAILED}: {authenticate}")
            return None
        self._peer_nonce, self._peer_use_xa = frame.nonce, frame.use_xa
        self._keepalive_interval = frame.keepalive_ms / 1000
        self._authenticate = authenticate
        return self._identified(frame.name)

    def _on_admit(self) -> State | None:
        if self.role is Role.LISTENER:
            self._send(
                ConnectReply(
                    accepted=True,
                    name=self.name,
                    nonce=self._nonce,
                    keepalive_ms=round(self._keepalive_interval * 1000),
                    auth_required=self._authenticate,
                    use_xa=self.settings.use_xa,
                )
            )
            return State.AUTH_WAIT if self._authenticate else self._after_authentication()
        if self._authenticate:
            self._send(Auth(proof=self._proof(LABEL_CONNECTOR)))
            return State.AUTH_WAIT
        return self._after_authentication()

    def _proof(self, label: bytes) -> bytes:
        assert self._password is not None and self.peer is not None and self.version is not None
        if self.role is Role.CONNECTOR:
            return proof(self._password, label, self._nonce, self._peer_nonce, self.name, self.peer, self.version)
        return proof(self._password, label, self._peer_nonce, self._nonce, self.peer, self.name, self.version)

    def _on_auth(self, frame: Auth) -> State | None:
        if not hmac.compare_digest(frame.proof, self._proof(LABEL_CONNECTOR)):
            self._refuse(AUTH_FAILED, AuthReply(accepted=False, reason=AUTH_FAILED))
            return None
        self._send(AuthReply(accepted=True, proof=self._proof(LABEL_LISTENER)))
        return self._after_authentication()

    def _on_auth_reply(self, frame: AuthReply) -> State | None:
        if not frame.accepted:
            self._end(_printable(frame.reason) or AUTH_FAILED, by_peer=True)
            return None
        if not hmac.compare_digest(frame.proof, self._proof(LABEL_LISTENER)):
            self._refuse(AUTH_FAILED, local_reason=f"{AUTH_FAILED}: the listener's proof is wrong")
            return None
        return self._after_authentication()

    def _after_authentication(self) -> State:
        """With XA (either side asked), the XA recovery stage; else the delivery stage.
        Either way the peer is authenticated: frames up to the configured size from now."""
        self._reader.max_frame_size = self.settings.max_frame_size
        if not self.use_xa:
            return self._enter_delivery()
        assert self.peer is not None
        self._events.append(RecoveryRequested(peer=self.peer))
        return State.RECOVERY_WAIT

    def _enter_delivery(self) -> State:
        self._send(
            Adjust(
                transaction_size=self.settings.inbound_transaction_size,
                window_size=self.settings.inbound_window_size,
                window_bytes=self.settings.inbound_window_bytes,
                max_frame_size=self.settings.max_frame_size,
                compression=self.settings.use_compression,
            )
        )
        self._send(StartDelivery())
        return State.ADJUST_WAIT

    def _on_recovery(self, frame: Recovery) -> State | None:
        if self._peer_recovery is not None:
            raise RemoteProtocolError("RECOVERY received twice")
        if problem := _xids_problem(frame.xids):
            raise RemoteProtocolError(f"RECOVERY: {problem}")
        assert self.peer is not None
        self._peer_recovery = frame.xids
        self._events.append(RecoveryReceived(peer=self.peer, xids=frame.xids))
        return State.RECOVERY_WAIT

    def _on_recovery_done(self, frame: RecoveryDone) -> State | None:
        if self._peer_recovery_done:
            raise RemoteProtocolError("RECOVERY_DONE received twice")
        if not self._recovery_list_sent:
            raise RemoteProtocolError("RECOVERY_DONE before our RECOVERY was sent")
        if self._received.counts[Phase.COMMITTING]:
            raise RemoteProtocolError("RECOVERY_DONE while its COMMITs await our COMMIT_REPLY")
        self._peer_recovery_done = True
        return self._recovery_progress()

    def _on_adjust(self, frame: Adjust) -> State | None:
        if frame.transaction_size < 1 or frame.window_size < 1:
            raise RemoteProtocolError(
                f"ADJUST with a zero size (transaction size {frame.transaction_size}, window size {frame.window_size})"
            )
        if frame.window_bytes < MIN_WINDOW_BYTES:
            raise RemoteProtocolError(
                f"ADJUST with a window of {frame.window_bytes} bytes (at least {MIN_WINDOW_BYTES})"
            )
        if frame.max_frame_size < HANDSHAKE_MAX_FRAME_SIZE:
            raise RemoteProtocolError(
                f"ADJUST with a maximum frame size of {frame.max_frame_size} bytes "
                f"(at least {HANDSHAKE_MAX_FRAME_SIZE})"
            )
        self._peer_adjust = frame
        self._send_window = frame.window_size
        return State.START_WAIT

    def _on_start_delivery(self, frame: StartDelivery) -> State | None:
        assert self._peer_adjust is not None and self.peer is not None
        self._keepalive_next, self._keepalive_counter = None, KEEPALIVE_COUNT
        self._events.append(
            Operational(
                peer=self.peer,
                version=self.version or "",
                peer_transaction_size=self._peer_adjust.transaction_size,
                peer_window_size=self._peer_adjust.window_size,
                peer_window_bytes=self._peer_adjust.window_bytes,
                keepalive_interval=self._keepalive_interval,
                use_xa=self.use_xa,
                compression=self.compression,
                unresolved=self._unresolved,
            )
        )
        return State.OPERATIONAL

    def _on_keepalive(self, frame: Keepalive) -> State | None:
        self._keepalive_counter = KEEPALIVE_COUNT
        return State.OPERATIONAL

    def _route_problem(self, route: Route, *, first: str) -> str | None:
        path = route.path
        if not path or len(path) > MAX_PATH_LENGTH:
            return f"a route's path must have 1 to {MAX_PATH_LENGTH} routers, got {len(path)}"
        bad = [name for name in (route.destination, *path) if not valid_router_name(name)]
        if bad:
            return f"invalid router name {_printable(bad[0], 80)!r} in a route"
        if path[0] != first or path[-1] != route.destination:
            return (
                f"a route's path must run from {first} to its destination "
                f"{route.destination!r}, got {'/'.join(path)!r}"[:300]
            )
        if len(set(path)) != len(path):
            return f"a route's path has a loop: {'/'.join(path)!r}"[:300]
        return None

    def _on_route(self, frame: Route) -> State | None:
        assert self.peer is not None
        if problem := self._route_problem(frame, first=self.peer):
            raise RemoteProtocolError(problem)
        self._events.append(RouteReceived(add=frame.add, destination=frame.destination, path=frame.path))
        return State.OPERATIONAL

    # -- internals: transfer handlers -------------------------------------------------------

    def _received_batch(self, frame: Transaction | NonXaTransaction, key: str | int) -> tuple[bytes, ...]:
        """Check a received batch against our limits and open it; the transaction enters RECEIVED."""
        settings, received = self.settings, self._received
        label = f"{frame.TYPE.name} {_key_text(key, bare=True)}"
        if key in received.phases:
            raise RemoteProtocolError(f"{label}: duplicate, it is open already ({received.phases[key].value})")
        if received.awaiting_bytes >= settings.inbound_window_bytes:
            raise RemoteProtocolError(
                f"{label} overruns our inbound-window-bytes of {settings.inbound_window_bytes} "
                f"({received.awaiting} transactions of {received.awaiting_bytes} bytes await our "
                f"{'prepare' if self.use_xa else 'commit'})"
            )
        if received.open_bytes >= OPEN_FACTOR * settings.inbound_window_bytes:
            raise RemoteProtocolError(
                f"{label}: more than {OPEN_FACTOR} × our inbound-window-bytes of "
                f"{settings.inbound_window_bytes} open ({len(received)} transactions of {received.open_bytes} bytes)"
            )
        if frame.compressed and not self.compression:
            raise RemoteProtocolError(f"{label} is compressed; compression was not agreed")
        messages = unpack_messages(frame.messages, frame.compressed, settings.max_frame_size)
        if not 1 <= len(messages) <= settings.inbound_transaction_size:
            raise RemoteProtocolError(
                f"{label} carries {len(messages)} messages (1 to our inbound-transaction-size "
                f"of {settings.inbound_transaction_size})"
            )
        self._step(Direction.INBOUND, key, frame.TYPE, remote=True, cost=transaction_cost(frame.messages))
        return messages

    def _on_transaction(self, frame: Transaction) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        if problem := _xid_problem(frame.xid):
            raise RemoteProtocolError(f"TRANSACTION: {problem}")
        messages = self._received_batch(frame, frame.xid)
        self._events.append(TransactionReceived(xid=frame.xid, messages=messages))
        return State.OPERATIONAL

    def _on_prepare_reply(self, frame: PrepareReply) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._step(Direction.OUTBOUND, frame.xid, frame.TYPE, remote=True)
        self._events.append(PrepareReceived(xid=frame.xid))
        return State.OPERATIONAL

    def _on_refuse(self, frame: Refuse) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._step(Direction.OUTBOUND, frame.xid, frame.TYPE, remote=True)
        self._events.append(TransactionRefused(xid=frame.xid, reason=_printable(frame.reason) or "no reason given"))
        return State.OPERATIONAL

    def _on_commit(self, frame: Commit) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._step(Direction.INBOUND, frame.xid, frame.TYPE, remote=True)
        self._events.append(CommitReceived(xid=frame.xid, recovery=self._state is State.RECOVERY_WAIT))
        return self._state

    def _on_commit_reply(self, frame: CommitReply) -> State | None:
        self._check_xa(True, local=False, frame=frame.TYPE)
        self._step(Direction.OUTBOUND, frame.xid, frame.TYPE, remote=True)
        recovery = self._state is State.RECOVERY_WAIT
        self._events.append(CommitDone(xid=frame.xid, recovery=recovery))
        return self._recovery_progress() if recovery else State.OPERATIONAL

    def _on_nonxa_transaction(self, frame: NonXaTransaction) -> State | None:
        self._check_xa(False, local=False, frame=frame.TYPE)
        if frame.seq <= self._last_seq_in:
            raise RemoteProtocolError(
                f"NONXA_TRANSACTION {frame.seq} after {self._last_seq_in}: the sequence number must grow"
            )
        messages = self._received_batch(frame, frame.seq)
        self._last_seq_in = frame.seq
        self._events.append(NonXaTransactionReceived(seq=frame.seq, messages=messages))
        return State.OPERATIONAL

    def _on_nonxa_commit(self, frame: NonXaCommit) -> State | None:
        self._check_xa(False, local=False, frame=frame.TYPE)
        self._step(Direction.OUTBOUND, frame.seq, frame.TYPE, remote=True)
        self._events.append(NonXaCommitted(seq=frame.seq))
        return State.OPERATIONAL


def _key_text(key: str | int, *, bare: bool = False) -> str:
    """A transaction's key for a message: ``xid 'a'`` or ``seq 7`` (``bare``: ``'a'`` or ``7``)."""
    if isinstance(key, str):
        return f"{'' if bare else 'xid '}{_printable(key, 80)!r}"
    return f"{'' if bare else 'seq '}{key!r}"[:100]


def _xid_problem(xid: object) -> str | None:
    if type(xid) is not str or not 0 < len(xid) <= MAX_XID_LENGTH:
        return f"an xid is a string of 1 to {MAX_XID_LENGTH} characters, got {_printable(repr(xid), 80)}"
    return None


def _xids_problem(xids: tuple[str, ...]) -> str | None:
    for xid in xids:
        if problem := _xid_problem(xid):
            return problem
    if len(set(xids)) != len(xids):
        return "an xid is listed twice"
    return None


def _version_key(version: str) -> tuple[int, ...]:
    match = _VERSION.match(version)
    return (int(match[1]), int(match[2])) if match else (-1,)
