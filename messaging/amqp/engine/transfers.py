"""The peer's transfers that the fast path does not take (:class:`.FrameReader`): the
frames of multi-frame messages joined, the limits on their size checked, and the bytes
held for incomplete ones counted for the whole connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wire import MASK, RemoteProtocolError
from .frames import INCOMING_WINDOW
from .states import LinkState

if TYPE_CHECKING:
    from .connection import Connection
    from .link import Link
    from .session import Session


class IncomingTransfers:
    """A connection's incoming transfers off the fast path, each counted by its session and
    handed to its link's handler once the message is complete. :attr:`buffered`: the bytes
    of incomplete multi-frame messages held now, all links together (a link that stops
    gives its part back: :meth:`.Link._stop`). One per connection, which it is given on
    each call (it keeps no reference to it)."""

    __slots__ = ("buffered",)

    def __init__(self) -> None:
        self.buffered = 0

    def deliver(
        self,
        connection: Connection,
        session: Session,
        link: Link,
        delivery_id: int | None,
        payload: bytes,
        settled: bool,
        more: bool,
        state: Any,
        aborted: bool,
    ) -> None:
        """One transfer frame on ``link``: counted by the session in any case (its ids and
        window do not depend on the link), then checked against the link and handed over
        once the message is complete.

        Raises:
            RemoteProtocolError: a breach on the link (scope link).
        """
        session._next_incoming_id = (session._next_incoming_id + 1) & MASK
        session._incoming_window -= 1
        if session._incoming_window < INCOMING_WINDOW // 2:
            session._incoming_window = INCOMING_WINDOW
            session._write_flow()
        if link._state is LinkState.DISCARDING:
            return  # sent before the peer saw our detach [2.6.5]
        if link.is_sender:
            raise RemoteProtocolError(
                "amqp:not-allowed", f"transfer on {link.name!r}, on which the peer receives", "link", link
            )
        if link._partial is None:
            if delivery_id is None:
                raise RemoteProtocolError(
                    "amqp:decode-error", "the first transfer of a delivery needs a delivery-id", "link", link
                )
            if link.credit <= 0:
                raise RemoteProtocolError(
                    "amqp:link:transfer-limit-exceeded", f"transfer on {link.name!r} beyond credit", "link", link
                )
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & MASK
            if link.max_message_size and len(payload) > link.max_message_size:
                raise _message_too_large(link)
            if more:
                link._partial, link._partial_id, link._partial_settled, link._partial_state = (
                    [payload],
                    delivery_id,
                    settled,
                    state,
                )
                link._partial_size = len(payload)
                self._buffer(connection, len(payload))
                return
        else:
            if delivery_id is not None and delivery_id != link._partial_id:  # [2.7.5 delivery-id]
                raise RemoteProtocolError(
                    "amqp:not-allowed",
                    f"transfer on {link.name!r} names delivery {delivery_id} amid delivery {link._partial_id}",
                    "link",
                    link,
                )
            link._partial.append(payload)
            link._partial_size += len(payload)
            self.buffered += len(payload)  # (counted before the checks: Link._stop takes it back)
            if link.max_message_size and link._partial_size > link.max_message_size:
                raise _message_too_large(link)  # at once: the rest of the message is not collected
            if link._partial_size > connection.max_message_size:
                raise RemoteProtocolError(
                    "amqp:link:message-size-exceeded",
                    f"a message on {link.name!r} above {connection.max_message_size} bytes",
                    "link",
                    link,
                )
            self._buffer(connection, 0)
            settled = settled or link._partial_settled
            state = state if state is not None else link._partial_state
            if more and not aborted:
                link._partial_settled, link._partial_state = settled, state
                return
            self.buffered -= link._partial_size
            delivery_id, payload, link._partial = link._partial_id, b"".join(link._partial), None
        if aborted:
            return
        assert link.handler is not None  # set before the credit was granted (LinkHandler)
        link.handler.on_transfer(delivery_id, payload, settled, state)

    def _buffer(self, connection: Connection, size: int) -> None:
        """Count ``size`` more bytes of incomplete messages.

        Raises:
            RemoteProtocolError: the connection holds more than :attr:`.Connection.max_incoming_buffer`
                of them (connection scope: amqp:resource-limit-exceeded).
        """
        self.buffered += size
        if self.buffered > connection.max_incoming_buffer:
            raise RemoteProtocolError(
                "amqp:resource-limit-exceeded",
                f"incomplete incoming messages above {connection.max_incoming_buffer} bytes "
                "on one connection (max-incoming-buffer)",
            )


def _message_too_large(link: Link) -> RemoteProtocolError:
    """ "Any attempt to deliver a message larger than this results in a message-size-exceeded
    link-error" [2.7.3]: the link ends, the rest of the connection goes on."""
    return RemoteProtocolError(
        "amqp:link:message-size-exceeded",
        f"a message on link {link.name!r} exceeds its max-message-size of {link.max_message_size} bytes",
        "link",
        link,
    )
