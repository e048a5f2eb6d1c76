"""The link: one end of a link (:class:`Link`) and what its owner gives it to hear of the
per-message things (:class:`LinkHandler`): ``on_transfer`` for each complete incoming
message, ``on_outcome`` for each delivery a peer's disposition names. No object is made
per message: an outgoing transfer is one ``struct.pack``, and settlements of consecutive
deliveries join one ranged disposition (:meth:`.Session._dispose`)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Protocol

from ...codec import Described, UByte, UInt, ULong
from ..wire import ATTACH, DETACH, MASK, Error, LocalProtocolError, Terminus
from .states import (
    _NEVER_ATTACHED_BY_US,
    _OURS_ATTACHED,
    _PEERS_ATTACHED,
    LINK_TRANSITIONS,
    LinkInput,
    LinkState,
    _move,
)

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Link", "LinkHandler"]

# A transfer as we send it: frame header, descriptor, list8 of handle, delivery-id, delivery-tag
# (the 4-byte delivery-id), message-format 0 and settled; the payload follows. Defined here, not
# imported: CPython 3.11 compiles a method call on a name bound by an import (``_TRANSFER.pack``)
# as an attribute load, which makes a bound method per message.
_TRANSFER = struct.Struct(">I16sI2sI2s")  # size, the link's head (see Link.send), id, tag header, tag, the rest


class LinkHandler(Protocol):
    """What the owner puts in :attr:`Link.handler`: the engine's per-message calls for one link.

    The engine calls :meth:`on_transfer` only on a link it receives on and :meth:`on_outcome`
    only on one it sends on, so a handler serving one role needs only that method. Both
    are called from inside :meth:`Connection.receive_data`, while it walks the frames of
    one read, and never from anywhere else. Set the handler before the link can carry a
    message: before granting credit (:meth:`Link.flow`) on a receiving link, before the
    first :meth:`Link.send` on a sending one.

    From inside a call a handler may use the engine like the owner does between reads:

    - :meth:`Link.settle` (any link: settlements join the ranged disposition being built),
      :meth:`Link.send` and :meth:`Link.drained` (any link; read :attr:`Link.credit` and
      :attr:`Session.blocked` first), :meth:`Link.flow`;
    - read :attr:`Link.credit`, :attr:`Link.delivery_count` and :attr:`Link.drain`: for the
      delivery being handed over they already count it;
    - :meth:`Link.attach`, :meth:`Link.detach`, :meth:`Session.link`, :meth:`Session.end`,
      :meth:`Connection.session`. After a detach or end *with an error* nothing more of
      that link or session reaches a handler; after a plain one, what the peer sent
      before it saw ours still does, until its detach (end) arrives;
    - :meth:`Connection.close`: nothing more of that read reaches a handler;
    - :meth:`Connection.data_to_send` (it only takes what is queued).

    It must not call :meth:`Connection.receive_data` (the frames still to be handled in
    the current read would come after the new ones, and the buffered remainder would be
    overwritten), and should not call :meth:`Connection.dispatch` or :meth:`Connection.tick`,
    which belong to the owner's loop after ``receive_data`` returns.

    It must not raise. An exception propagates out of ``receive_data`` with the rest of
    that read unhandled and the engine's input buffer stale: drop the connection. (A
    :class:`~.wire.RemoteProtocolError` or a codec ``DecodeError`` raised by a handler
    cannot be told from the peer's and closes the connection with that error.)
    """

    def on_transfer(self, delivery_id: int, payload: bytes, settled: bool, state: Any) -> None:
        """A complete incoming message (all frames of a multi-frame one joined): its
        delivery id, the message bytes as sent, whether the peer sent it settled (then
        do not settle it), and the transfer's delivery ``state`` (None, or e.g. a
        transactional state [4.5.5]). The link's credit is already one less."""

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        """The peer's disposition names one of our unsettled deliveries on this link: its
        ``state`` (an outcome such as accepted, or a non-terminal one) and whether the peer
        settled it. Not settled: settle it (:meth:`Link.settle`) once the state is final."""


class Link:
    """One end of a link, made by :meth:`Session.link` (ours) or by the peer's attach
    (:class:`LinkAttached`). ``is_sender``: we send on it. ``handle``/``remote_handle``:
    ours and the peer's. The owner sets :attr:`source`, :attr:`target` (and may set
    :attr:`snd_settle_mode`, :attr:`rcv_settle_mode`) before :meth:`attach`, and
    :attr:`handler` before the link can carry a message. ``remote_*``: what the peer's
    attach said. Read-only for the owner: :attr:`credit`, :attr:`drain`,
    :attr:`delivery_count`, :attr:`state`."""

    def __init__(self, session: Session, name: str, is_sender: bool, handle: int):
        self.session = session
        self.name = name
        self.is_sender = is_sender
        self.handle = handle  # ours
        self.remote_handle: int | None = None
        self.handler: LinkHandler | None = None
        self.source: Terminus | None = None  # ours, sent in our attach
        self.target: Terminus | None = None
        self.remote_source: Terminus | None = None
        self.remote_target: Terminus | None = None
        self.snd_settle_mode = 2  # 0 unsettled, 1 settled, 2 mixed
        self.rcv_settle_mode = 0  # 0 first, 1 second
        self.remote_properties: dict[Any, Any] | None = None
        self.delivery_count = 0
        self.credit = 0  # as a sender: what the peer granted; as a receiver: what we granted
        self.drain = False
        # As a receiver: the largest message we take, announced in our attach (0: no limit).
        # A bigger one detaches the link with amqp:link:message-size-exceeded [2.7.3]; the
        # fast path takes single-frame messages up to _fast_limit only.
        self.max_message_size = 0
        self._fast_limit = MASK
        self._state = LinkState.UNATTACHED
        # what every single-frame transfer on this link starts with after the frame size:
        # doff 2, type 0, channel; transfer descriptor; list8 of 19 bytes, 5 fields; the
        # handle as uint; the delivery-id's constructor (see send)
        self._head = struct.pack(
            ">BBH3sBBBBIB", 2, 0, session.channel, b"\x00\x53\x14", 0xC0, 19, 5, 0x70, handle, 0x70
        )
        self._partial: list[bytes] | None = None  # an incoming multi-frame transfer
        self._partial_id = self._partial_size = 0
        self._partial_settled = False
        self._partial_state: Any = None

    def __repr__(self) -> str:
        return f"<Link {self.name!r} {'sender' if self.is_sender else 'receiver'} handle {self.handle}>"

    # -- state ----------------------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        """Where the attach and detach exchanges are (:data:`LINK_TRANSITIONS`)."""
        return self._state

    @property
    def attached(self) -> bool:
        """Our attach is sent and our detach is not."""
        return self._state in _OURS_ATTACHED

    @property
    def remote_attached(self) -> bool:
        """The peer's attach arrived and its detach has not."""
        return self._state in _PEERS_ATTACHED

    @property
    def presettled(self) -> bool:
        """The peer's attach asked for settled deliveries (snd-settle-mode settled)."""
        return self.snd_settle_mode == 1

    def _move(self, event: LinkInput) -> bool:
        """Take ``event`` (see :func:`_move`; a peer's breach has scope session, the owner's link)."""
        return _move(self, LINK_TRANSITIONS, event)

    def _stop(self) -> None:
        """Nothing more goes to the handler or out: no credit (so the fast path passes
        the peer's transfers to the slow one, which drops them), no partial message, our
        unsettled deliveries and waiting frames forgotten."""
        session = self.session
        if self._partial is not None:
            session.connection._transfers.buffered -= self._partial_size
        self.credit, self.drain, self._partial = 0, False, None
        session._drop_blocked(self.handle)
        if self.is_sender and session._unsettled_out:
            for delivery_id in [key for key, owner in session._unsettled_out.items() if owner is self]:
                del session._unsettled_out[delivery_id]

    # -- both ends ---------------------------------------------------------------------------

    def attach(self) -> None:
        """Send our attach, with :attr:`source` and :attr:`target`: a new link of ours, or
        the answer to the peer's (:class:`LinkAttached`). Does nothing once ours is sent,
        or once the link is detached (the engine may have detached it before the owner
        answered). Never raises: the table takes it in every state."""
        if not self._move(LinkInput.ATTACH_OUT):
            return
        if self._state is LinkState.ATTACH_SENT:  # ours first: the peer's attach answers it
            self.session._awaiting.setdefault((self.name, self.is_sender), self)
        fields = [
            self.name,
            UInt(self.handle),
            not self.is_sender,
            UByte(self.snd_settle_mode),
            UByte(self.rcv_settle_mode),
            self.source.described() if self.source else None,
            self.target.described() if self.target else None,
            None,
            None,
            UInt(self.delivery_count) if self.is_sender else None,
            ULong(self.max_message_size) if self.max_message_size else None,
        ]
        if self.max_message_size:
            self._fast_limit = self.max_message_size
        self.session._write(ATTACH, fields)

    def detach(self, *, closed: bool = True, error: Error | None = None) -> None:
        """Detach our end (``closed``: for good, else the terminus may be resumed) — ours
        first, or the answer to the peer's (:class:`LinkDetached`). With an ``error``, what
        the peer sends on the link until its detach arrives is dropped; without, it still
        reaches the handler. The link is forgotten once both ends are detached. Does
        nothing once ours is sent or the link is detached.

        Raises:
            LocalProtocolError: we never attached it (answer a peer's attach before
                detaching [2.6.3]: attach, then detach).
        """
        self._detach(closed, error)

    def _detach(self, closed: bool, error: Error | None) -> bool:
        """:meth:`detach`; whether our detach went out."""
        if not self._move(LinkInput.DETACH_OUT if error is None else LinkInput.DETACH_ERROR_OUT):
            return False
        session = self.session
        if self._state is LinkState.DETACH_SENT:  # the peer's transfers may still come; ours may not go
            session._drop_blocked(self.handle)
            if self.is_sender:
                self.credit = 0
        else:
            self._stop()
        session._write(DETACH, [UInt(self.handle), closed, error.described() if error else None])
        session._forget(self)
        return True

    # -- sending ------------------------------------------------------------------------------

    def send(self, payload: bytes, settled: bool = False, state: Described | None = None) -> int:
        """Send one message (uses one credit), with a delivery ``state`` if given (e.g. a
        transactional one), on a link whose attach we sent; its delivery id. The caller
        checks :attr:`credit` (zero once the link can no longer send) and, to keep frames
        from queueing here, :attr:`Session.blocked`; nothing else is checked: this is the
        per-message path. Frames beyond the peer's session window wait for it to open."""
        session = self.session
        delivery_id = session._next_delivery_id
        session._next_delivery_id = (delivery_id + 1) & MASK
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & MASK
        if not settled:
            session._unsettled_out[delivery_id] = self
        connection = session.connection
        if session._disposition is not None:
            session._flush_disposition()  # frames go out in the order they were made
        if (
            state is None
            and len(payload) + 64 <= connection.remote_max_frame_size
            and session.remote_incoming_window > 0
        ):
            session.remote_incoming_window -= 1
            session._next_outgoing_id = (session._next_outgoing_id + 1) & MASK
            out = connection._out
            out.append(
                _TRANSFER.pack(
                    len(payload) + 32,
                    self._head,
                    delivery_id,
                    b"\xa0\x04",
                    delivery_id,
                    b"\x43\x41" if settled else b"\x43\x42",
                )
            )
            out.append(payload)
        else:
            session._send_frames(self, delivery_id, payload, settled, state)
        return delivery_id

    def drained(self) -> None:
        """As a sender with nothing (more) to send: if the peer asked to drain, use the rest
        of the credit up and tell it [2.6.7]. Does nothing once the link is detached.

        Raises:
            LocalProtocolError: our attach is not sent yet.
        """
        if self.drain and self.credit > 0 and self._may_flow():
            self.delivery_count = (self.delivery_count + self.credit) & MASK
            self.credit = 0
            self.session._write_flow(self)

    def settle(self, delivery_id: int, state: Described | None = None) -> None:
        """Settle a delivery: an incoming one with its outcome (``ACCEPTED``,
        ``outcome(…)``), or one of ours the peer left unsettled (``state`` as it left it, or
        None). Settlements of consecutive ids with the same state join one ranged
        disposition, written by :meth:`Connection.data_to_send` or before the next frame.
        Nothing goes out once the session is ending. No state is checked: this is the
        per-message path."""
        session = self.session
        if self.is_sender:
            if session._unsettled_out.pop(delivery_id, None) is not None:
                session._dispose(False, delivery_id, state)
        else:
            session._dispose(True, delivery_id, state)

    # -- receiving ----------------------------------------------------------------------------

    def flow(self, credit: int, *, drain: bool = False) -> None:
        """As a receiver: grant ``credit`` in all (not in addition), asking the sender to
        use it up or say it has nothing (``drain``). Does nothing once the link is
        detached (the owner may learn of that after the fact).

        Raises:
            LocalProtocolError: our attach is not sent yet.
        """
        if self._may_flow():
            self.credit = credit
            self.drain = drain
            self.session._write_flow(self)

    def _may_flow(self) -> bool:
        """A flow naming this link may go out now; raises if it never could have."""
        if self._state in _OURS_ATTACHED:
            return True
        if self._state in _NEVER_ATTACHED_BY_US:
            raise LocalProtocolError("amqp:not-allowed", f"a flow on {self.name!r} before our attach", "link", self)
        return False
