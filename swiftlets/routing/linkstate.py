"""The routing link's states and the transitions between them, as data.

Theory of operation
-------------------
Transitions are data: :data:`TRANSITIONS` maps (role, state, input) to the states the
input may lead to; the handler for the input picks one of them (a refusal or a breach may
always end the link instead). An input without an entry is a protocol error. Inputs are
the frame types received and the owner's decisions (:class:`~.window.Decision`). The one
reader of the table is :class:`~.linkcore.LinkCore`, the one place the state changes.
"""

from __future__ import annotations

import enum
import re

import attrs

from .window import Decision
from .wire import (
    DEFAULT_TRANSACTION_SIZE,
    DEFAULT_WINDOW_BYTES,
    HANDSHAKE_MAX_FRAME_SIZE,
    MAX_XID_LENGTH,
    MIN_WINDOW_BYTES,
    FrameType,
)

MAX_NAME_LENGTH = 64
MAX_REASON = 500  # characters of a reason we send (at most 2000 bytes: a CLOSE fits the handshake limit)
MAX_UNREAD = 2 * HANDSHAKE_MAX_FRAME_SIZE  # input held unread while the owner decides on admission

# The router-name rule of kernel/config.py (``_ROUTER_NAME``), with a bound on the length.
_ROUTER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")


def valid_router_name(name: str) -> bool:
    """A router name as the kernel accepts it (letters, digits, ``_``, ``-``, starting with
    a letter), at most :data:`MAX_NAME_LENGTH` characters."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _ROUTER_NAME.match(name) is not None


def printable(text: str, limit: int = 200) -> str:
    """A peer's text made fit for one log line: control characters escaped, length bounded."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return text if len(text) <= limit else text[:limit] + "…"


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
    inbound_transaction_size: int = DEFAULT_TRANSACTION_SIZE
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


def xid_problem(xid: object) -> str | None:
    """What is wrong with an xid a peer or the owner names (None: nothing)."""
    if type(xid) is not str or not 0 < len(xid) <= MAX_XID_LENGTH:
        return f"an xid is a string of 1 to {MAX_XID_LENGTH} characters, got {printable(repr(xid), 80)}"
    return None


def xids_problem(xids: tuple[str, ...]) -> str | None:
    """What is wrong with a list of xids (None: nothing): a bad xid, or one listed twice."""
    for xid in xids:
        if problem := xid_problem(xid):
            return problem
    if len(set(xids)) != len(xids):
        return "an xid is listed twice"
    return None
