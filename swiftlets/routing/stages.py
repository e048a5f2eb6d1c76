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

:class:`LinkMachine` is the owner's face of the parts that do the work, one job each
(composition: each part acts on the link through the core, none knows the owner):

- :mod:`.linkstate`: the states and :data:`TRANSITIONS`, the transitions as data (role,
  state, input) → the states the input may lead to; an input without an entry is a
  protocol error;
- :mod:`.linkcore`: the core, the one place the state changes: frames in and out, the
  events, the transitions, refusals (the reject-disconnect-delay) and breaches;
- :mod:`.handshake`: protocol select, connect, the owner's admission, authentication
  (:data:`AUTH_MATRIX`, :func:`proof`);
- :mod:`.xarecovery`: the XA recovery stage;
- :mod:`.delivery`: the delivery stage: the peer's limits, routes, transactions of
  both modes and the window (:data:`OUTBOUND_PHASES`, :data:`INBOUND_PHASES`);
- :mod:`.linktimers`: the stage deadlines and the keepalive;
- :mod:`.linkevents`: the events the owner drains.

Misuse by the owner (``admit()`` outside admission, ``send_route`` before delivery, a
transaction beyond the window, an xid in the wrong phase) raises
:class:`~.wire.LocalProtocolError` and changes nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence

from .delivery import Delivery
from .handshake import AUTH_FAILED, AUTH_MATRIX, LABEL_CONNECTOR, LABEL_LISTENER, NONCE_SIZE, VERSIONS, Handshake, proof
from .linkcore import LinkCore
from .linkevents import (
    Closed,
    CommitDone,
    CommitReceived,
    Event,
    NonXaCommitted,
    NonXaTransactionReceived,
    Operational,
    PeerIdentified,
    PrepareReceived,
    RecoveryReceived,
    RecoveryRequested,
    RouteReceived,
    TransactionReceived,
    TransactionRefused,
)
from .linkstate import (
    ENDED,
    STAGE_OF,
    TRANSITIONS,
    WAITING,
    LinkSettings,
    Role,
    Stage,
    State,
    valid_router_name,
)
from .linktimers import KEEPALIVE_COUNT, LinkTimers
from .window import INBOUND_PHASES, OPEN_FACTOR, OUTBOUND_PHASES, Decision, Phase
from .xarecovery import XaRecovery

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
    "Event",
    "VERSIONS",
    "KEEPALIVE_COUNT",
    "AUTH_FAILED",
    "AUTH_MATRIX",
    "LABEL_CONNECTOR",
    "LABEL_LISTENER",
    "TRANSITIONS",
    "STAGE_OF",
    "WAITING",
    "ENDED",
    "OUTBOUND_PHASES",
    "INBOUND_PHASES",
    "OPEN_FACTOR",
    "proof",
    "valid_router_name",
]


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
        nonce = nonce_source(NONCE_SIZE)
        if type(nonce) is not bytes or len(nonce) != NONCE_SIZE:
            raise ValueError("the nonce source must return 32 bytes")
        self._core = core = LinkCore(role, name, settings, now=now)
        self._recovery = XaRecovery(core)
        self._delivery = Delivery(core, self._recovery)
        self._timers = LinkTimers(core)
        self._handshake = Handshake(core, self._recovery, password.encode() if password else None, nonce)
        for part in (self._handshake, self._recovery, self._delivery, self._timers):
            core.handlers.update(part.handlers())

    # -- what the owner reads ---------------------------------------------------------------

    @property
    def peer(self) -> str | None:
        """The remote router's name, once the peer said it."""
        return self._core.peer

    @property
    def version(self) -> str | None:
        """The protocol version, once chosen."""
        return self._core.version

    @property
    def state(self) -> State:
        return self._core.state

    @property
    def stage(self) -> Stage:
        """The current stage; once ended, the stage the link ended in."""
        return self._core.stage

    @property
    def keepalive_counter(self) -> int:
        """The keepalive counter (5 while keepalives arrive; the link closes at 0)."""
        return self._timers.keepalive_counter

    @property
    def use_xa(self) -> bool:
        """XA transfer on this link (either side asked; known once the peer is identified)."""
        return self._core.use_xa

    @property
    def compression(self) -> bool:
        """Our batches are compressed (both sides asked; known in the delivery stage)."""
        return self._delivery.compression

    @property
    def open_transactions(self) -> int:
        """Outbound transactions open, in any phase."""
        return len(self._core.sent)

    @property
    def window_available(self) -> int:
        """How many more transactions :meth:`send_transaction` / :meth:`send_nonxa` take now:
        the send window (:meth:`set_send_window`) less those awaiting their prepare (non-XA:
        their commit); 0 while the cost awaiting has reached the peer's ``window_bytes`` or
        the cost open in all phases :data:`~.window.OPEN_FACTOR` × that, and before the
        delivery stage. Each transaction sent is checked again."""
        return self._delivery.window_available

    @property
    def send_window(self) -> int:
        """Transactions that may await their answer at once (the peer's ``window_size`` at first)."""
        return self._delivery.send_window

    def set_send_window(self, transactions: int) -> None:
        """Let ``transactions`` (at least 1) await their answer at once: the owner sizes the
        window to the link (:class:`~.window.WindowController`); the peer's byte bounds hold
        whatever it is."""
        self._delivery.set_send_window(transactions)

    @property
    def bytes_in_flight(self) -> int:
        """The cost of our transactions awaiting their answer (:func:`~.window.transaction_cost`)."""
        return self._core.sent.awaiting_bytes

    @property
    def awaiting(self) -> int:
        """Our transactions awaiting their answer."""
        return self._core.sent.awaiting

    @property
    def peer_max_frame_size(self) -> int:
        """The largest frame the peer accepts (from its ADJUST; 0 before): a batch must fit."""
        return self._delivery.peer_max_frame_size

    @property
    def outbound(self) -> dict[str | int, Phase]:
        """The open outbound transactions and their phases (a copy), oldest first."""
        return dict(self._core.sent.phases)

    @property
    def inbound(self) -> dict[str | int, Phase]:
        """The open inbound transactions and their phases (a copy), oldest first."""
        return dict(self._core.received.phases)

    def events(self) -> list[Event]:
        """The events since the last call, oldest first (taking them empties the list)."""
        core = self._core
        events, core.events = core.events, []
        return events

    # -- SansIO -----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The link is over and everything was taken from :meth:`data_to_send`."""
        return self._core.ended and not self._core.out

    def data_to_send(self) -> bytes | None:
        """Bytes to write now (``b""``: nothing); None once the link is over and all was taken."""
        out = self._core.out
        if out:
            data = b"".join(out)
            out.clear()
            return data
        return None if self._core.ended else b""

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed what the peer sent; ``b""``: it closed its side. Frames are handled at once,
        up to the admission (the rest waits for :meth:`admit`). A breach of the protocol is
        answered (CLOSE, :class:`Closed`), never raised. Does nothing once the link ended
        (during the reject-disconnect-delay, input is dropped; end of input ends the wait).
        """
        self._core.receive_data(data)

    def tick(self, now: float) -> float:
        """Act on the time ``now``: a waiting state's stage-valid-timeout, the end of the
        reject-disconnect-delay, the keepalive (:mod:`.linktimers`). The next deadline, 0 for none."""
        return self._timers.tick(now)

    # -- the owner's calls: the handshake and the end (:mod:`.handshake`) ---------------------

    def admit(self) -> None:
        """Let the identified peer in (:meth:`.Handshake.admit`)."""
        self._handshake.admit()

    def refuse(self, reason: str) -> None:
        """Refuse the identified peer with ``reason`` (:meth:`.Handshake.refuse`)."""
        self._handshake.refuse(reason)

    def close(self, reason: str) -> None:
        """End the link now: a CLOSE with ``reason``, :class:`Closed` (``by_peer`` false).
        During the reject-disconnect-delay, end it now (no further frame or event, e.g.
        when the router stops); once the link is over, do nothing."""
        self._core.close(reason)

    # -- the owner's calls: XA recovery (:mod:`.xarecovery`) ----------------------------------

    def recovery_list(self, xids: Iterable[str]) -> None:
        """Answer :class:`RecoveryRequested` (:meth:`.XaRecovery.recovery_list`)."""
        self._recovery.recovery_list(xids)

    def recovery_done(self, commit: Iterable[str] = ()) -> None:
        """Answer :class:`RecoveryReceived` (:meth:`.XaRecovery.recovery_done`)."""
        self._recovery.recovery_done(commit)

    # -- the owner's calls: delivery (:mod:`.delivery`) -----------------------------------
    # Each raises LocalProtocolError (nothing changed) outside the delivery stage, on a link
    # of the other mode (XA or not), for a transaction in the wrong phase; each does nothing
    # once the link ended (the sends then return False: nothing was sent).

    def send_route(self, *, add: bool, destination: str, path: Sequence[str]) -> bool:
        """Announce (``add``) or withdraw a route: ``path`` starts with our name and ends
        with ``destination`` (the peer will hold it as its route over us). True when it is
        queued; False when the link already ended (the route is dropped with the link).
        Raises LocalProtocolError for an invalid route."""
        return self._delivery.send_route(add=add, destination=destination, path=path)

    def send_transaction(self, xid: str, messages: Sequence[bytes]) -> bool:
        """XA, sender: send ``messages`` (1 to the peer's transaction size) under ``xid``
        (a new one: the owner never reuses an xid). Raises LocalProtocolError when no window
        is available (:attr:`window_available`), for too many or no messages, an invalid or
        open xid, a frame above the peer's maximum frame size (send fewer messages)."""
        return self._delivery.send_transaction(xid, messages)

    def prepared(self, xid: str) -> None:
        """XA, receiver: ``xid`` is prepared durably: PREPARE_REPLY. Call it as late as
        inbound flow control wants; the sender's window waits."""
        self._delivery.prepared(xid)

    def refuse_transaction(self, xid: str, reason: str) -> None:
        """XA, receiver: ``xid`` cannot be prepared at all (e.g. a target refuses it for a
        lasting reason) and nothing of it is held: REFUSE with ``reason``; the sender rolls
        it back."""
        self._delivery.refuse_transaction(xid, reason)

    def commit(self, xid: str) -> None:
        """XA, sender: ``xid`` (prepared by the peer) is committed here, durably: COMMIT."""
        self._delivery.commit(xid)

    def committed(self, xid: str) -> None:
        """XA, receiver (also in recovery): ``xid`` is committed here, durably: COMMIT_REPLY."""
        self._delivery.committed(xid)

    def send_nonxa(self, seq: int, messages: Sequence[bytes]) -> bool:
        """Non-XA, sender: send ``messages`` as the batch ``seq`` (greater than every
        earlier one on this link, below 2³²). Raises LocalProtocolError when no window is
        available, for too many or no messages, ``seq`` not increasing, a frame above the
        peer's maximum."""
        return self._delivery.send_nonxa(seq, messages)

    def nonxa_committed(self, seq: int) -> None:
        """Non-XA, receiver: the batch ``seq`` is committed here: NONXA_COMMIT (as late as
        inbound flow control wants)."""
        self._delivery.nonxa_committed(seq)
