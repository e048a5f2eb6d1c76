"""The AMQP 1.0 connection engine (OASIS AMQP 1.0 part 2), in Python, sans-IO.

Theory of operation
-------------------
One :class:`Connection` per socket, after SASL: bytes in with :meth:`Connection.receive_data`,
bytes out with :meth:`Connection.data_to_send` (``None`` once the connection is over), time
with :meth:`Connection.tick`. It keeps the connection, session and link state of part 2:
the open/close handshake and idle timeout [2.4], sessions with their transfer windows
[2.5.6], links with credit, drain and delivery counts [2.6.7], deliveries and their
settlement [2.6.12], multi-frame transfers and the peer's max frame size.

What happens arrives two ways:

- the rare things (open, begin, attach, detach, end, close, a link's credit changing) as
  event objects in :attr:`Connection.events`, which the owner empties
  (:meth:`Connection.dispatch`) after each :meth:`Connection.receive_data`;
- the per-message things straight to the link's :attr:`Link.handler` (a
  :class:`LinkHandler`, set by the owner before the link can carry a message):
  ``on_transfer`` for each complete incoming message, ``on_outcome`` for each delivery a
  peer's disposition names. No object is made per message.

Three state machines, one each for the connection, a session and a link, are tables kept
as data (:mod:`.states`, which says how they are consulted); a peer that breaks the
protocol is answered at the narrowest scope that contains the breach — a link, a session,
or the connection (:mod:`.peer` says which breach is which).

The parts, one module each:

- :mod:`.states`: the three state machines, their states and inputs;
- :mod:`.events`: the events of the rare things;
- :mod:`.frames`: the checks of the peer's frames (headers, the performatives' fields) and
  :class:`~.frames.FrameReader`, which reads them with the transfer fast path;
- :mod:`.peer`: :class:`~.peer.PeerFrames`, the peer's other performatives, each handed
  to what it concerns;
- :mod:`.transfers`: :class:`~.transfers.IncomingTransfers`, transfers off the fast path
  (multi-frame messages and the bytes they hold);
- :mod:`.link`: :class:`Link` and :class:`LinkHandler`; :mod:`.session`: :class:`Session`;
- :mod:`.numbering`: our channel and handle numbers; :mod:`.heartbeat`: the idle timeouts;
- :mod:`.connection`: :class:`Connection`, which owns one of each of the connection's
  parts and the owner's calls.

Why Python and not proton's C engine: driving proton through cffi costs some twenty
C crossings and two collector events per message, while a 64 KiB read here is one loop
over ~400 frames, an outgoing transfer is one ``struct.pack`` and a consumer's ranged
disposition settles a whole range in one go. proton stays the test oracle: every real
client in the tests is one. ``bench/engine_bench.py`` measures the per-message paths.
"""

from .connection import Connection
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionBegun,
    SessionEnded,
)
from .link import Link, LinkHandler
from .session import Session
from .states import (
    CONNECTION_TRANSITIONS,
    LINK_TRANSITIONS,
    SESSION_TRANSITIONS,
    ConnectionInput,
    ConnectionState,
    LinkInput,
    LinkState,
    SessionInput,
    SessionState,
)

__all__ = [
    "Connection",
    "Session",
    "Link",
    "LinkHandler",
    "ConnectionOpened",
    "ConnectionClosed",
    "SessionBegun",
    "SessionEnded",
    "LinkAttached",
    "LinkDetached",
    "LinkFlow",
    "ConnectionState",
    "ConnectionInput",
    "SessionState",
    "SessionInput",
    "LinkState",
    "LinkInput",
    "CONNECTION_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "LINK_TRANSITIONS",
]
