"""A TCP proxy with switchable faults, to put between two routers (or any client and server).

Theory of operation
-------------------

:class:`FaultProxy` listens on ``127.0.0.1`` (port 0: :attr:`FaultProxy.port` once started)
and forwards every accepted connection to one target, byte for byte, both directions. Each
connection is one task tree in the proxy's nursery::

    client ──reader──▶ [channel] ──writer──▶ target      (direction "to target")
    client ◀──writer── [channel] ◀──reader── target      (direction "to client")

A reader task takes a chunk (at most ``chunk_size`` bytes) from one socket, stamps it with
the time it was read, and puts it into a memory channel holding at most ``buffer`` chunks;
the writer task of that direction takes chunks in order and sends them to the other socket
once they are due. The bound is what makes the proxy *bounded*: a writer that waits (for a
delay, or for a slow peer) leaves the channel full, the reader then blocks in ``send``,
stops reading its socket, and TCP flow control pushes back on the sender. Per connection and
direction, at most ``buffer + 2`` chunks are held (the channel, one in the reader's hands,
one in the writer's). A consequence: a delayed direction carries at most that much per delay
period, as a real link with a bandwidth-delay product would.

End of stream and resets travel the same way, in order, behind the bytes read before them:
an EOF read from one side becomes ``send_eof()`` (a half-close) on the other; a reset (or a
write that fails) ends the connection, closing both sockets. A connection whose two
directions have both delivered their EOF is closed.

Faults are plain state on the proxy, switched by synchronous methods at any time; they apply
to live connections as well as new ones, at once. Every change sets a :class:`trio.Event`
(and replaces it), on which the writers wait, so a changed delay or a healed blackhole takes
effect for chunks already waiting:

- ``delay(s)``: a chunk read at time ``t`` is sent at ``t + s``, with ``s`` the delay *at
  sending time* (so :meth:`~FaultProxy.heal` releases waiting chunks at once). Order within a
  direction is kept; the delay is measured on :func:`trio.current_time`, so it follows a
  ``MockClock`` (``autojump_clock``) in tests.
- ``cut()``: every live connection is closed (cancelled and its sockets closed), so both
  peers see EOF, or a reset if unread data was left in a socket; new connections are
  accepted as usual.
- ``refuse(True)``: new connections are accepted and closed at once (a "down" peer; the TCP
  handshake itself succeeds, the proxy's listener stays open). Live connections go on.
- ``blackhole(True)``: every chunk is swallowed, in both directions, whether read while the
  blackhole is on or still waiting to be sent when it comes on, and the sockets stay open:
  nothing arrives, nothing errors (a dead peer behind a NAT). ``direction=`` swallows one
  direction only (a one-way partition: one peer hears the other, not the reverse). An EOF or a reset is held, not
  swallowed, and passed on when the blackhole is turned off. Turning it off forwards the
  bytes read from then on; **the swallowed bytes are lost for good**, so the byte stream the
  peers see has a hole in it: fine for keepalive and dead-peer detection tests, not for
  tests of a protocol that has to continue on that connection. Unlike a real dead peer, the
  sender is never blocked by a blackhole (its bytes are read and dropped, not left unacked).
- ``hold(direction, code, nth)`` and ``drop(direction, code, nth)``: the deterministic
  fault points of the routing protocol (``docs/routing-protocol.md`` §1–2: 8 bytes of
  magic, then frames of a 4-byte length and a msgpack ``[code, {fields}]`` body). Every
  direction of every connection is followed frame by frame (:class:`FrameScanner`, which
  reads only lengths and the type code); the ``nth`` frame of type ``code`` travelling in
  ``direction`` (``"to_target"``: connector → listener) from then on is *held* with
  everything after it in that direction, for good, or *dropped* alone (the stream goes on
  without it: an answer that never came). The :class:`Held` returned has the frame's
  fields once seen, and the test kills a router or cuts the link at exactly that point of
  the protocol, with the transactions before it answered and those after it not. Bytes
  before the frame are forwarded. One rule at a time, for one match. ``where(fields)``
  narrows the rule to frames of that type whose fields it accepts (say a TRANSACTION
  carrying a topic interest record): such a frame is looked at once it is all in the proxy
  (it waits there for its last bytes; the frames before it went on), and only the frames
  accepted are counted.

Everything runs in the nursery of :meth:`FaultProxy.run`; cancelling ``run`` closes the
listener and every connection. Nothing is detached. Not thread-safe: call the fault methods
from the trio thread that runs the proxy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgpack
import trio

_EOF = "eof"  # sentinels travelling in the channels after the bytes read before them
_RESET = "reset"
MAGIC = b"MARTINET"  # the routing protocol's stream header (docs/routing-protocol.md §1)
_ARRAY_OF_2 = 0x92  # msgpack fixarray of 2: every routing frame's body starts [code, {fields}]


class FrameScanner:
    """Follows one direction of a routing byte stream and finds where frames start.

    Only frame boundaries are tracked (the magic, then per frame its 4-byte length); bodies
    are passed over unread, except the type code, which is the second byte of every body
    (a msgpack fixarray of 2, then a positive fixint code).
    """

    def __init__(self) -> None:
        self._skip = len(MAGIC)  # bytes to pass (magic, or the rest of a frame) before a header
        self._pending = b""  # the start of a header that has not fully arrived
        self._pending_sent = False  # ... and was passed on already (nothing was looked for)
        self._dropping: Held | None = None  # the frame being dropped, while its bytes arrive
        self._drop_left = 0
        self._deciding: Held | None = None  # chosen by its type; its fields decide once all in
        self.held: Held | None = None  # the rule whose frame was held (once feed returned it)

    def feed(self, data: bytes, choose: Callable[[int], Held | None] | int | None) -> tuple[bytes, bytes | None]:
        """Take the next bytes of the stream; return the bytes that may go on, and, if a
        frame is held, that frame and everything after it (else None).

        ``choose(code)`` is asked for every frame that starts (None: look for nothing); it
        returns None to pass the frame on, or a :class:`Held` whose ``drop`` says whether
        this frame alone is taken out of the stream (the bytes after it go on) or held with
        everything after it. An int ``code`` holds the first frame of that type. While
        looking, a header cut by the chunk boundary waits for the next chunk (at most 5
        bytes); otherwise every byte goes on at once (a frame whose header went on before
        the rule was armed is not chosen)."""
        if isinstance(choose, int):
            code = choose
            choose = lambda found: Held("", code) if found == code else None  # noqa: E731
        buffer = self._pending + data
        sent = len(self._pending) if self._pending_sent else 0  # buffer[:sent] went on already
        self._pending, self._pending_sent = b"", False
        out: list[bytes] = []
        start = sent  # where the bytes that go on next begin
        position = 0
        while position < len(buffer):
            if self._drop_left:
                taken = min(self._drop_left, len(buffer) - position)
                assert self._dropping is not None
                self._dropping.add(buffer[position : position + taken])
                position += taken
                self._drop_left -= taken
                start = position
                continue
            if self._skip:
                passed = min(self._skip, len(buffer) - position)
                position += passed
                self._skip -= passed
                continue
            if len(buffer) - position < 6:  # the length and the first two body bytes
                self._pending = buffer[position:]
                if choose is None or sent > position:
                    self._pending_sent = True
                    out.append(buffer[start:])
                    return b"".join(out), None
                out.append(buffer[start:position])
                return b"".join(out), None
            length = 4 + int.from_bytes(buffer[position : position + 4], "big")
            chosen, self._deciding = self._deciding, None
            if chosen is None and choose is not None and position >= sent and buffer[position + 4] == _ARRAY_OF_2:
                chosen = choose(buffer[position + 5])
            if chosen is not None and chosen.where is not None:
                if len(buffer) - position < length:  # its fields decide: wait for all of it
                    self._deciding, self._pending = chosen, buffer[position:]
                    out.append(buffer[start:position])
                    return b"".join(out), None
                if not chosen.accepts(bytes(buffer[position : position + length])):
                    chosen = None
            if chosen is None:
                self._skip = length
            elif chosen.drop:
                out.append(buffer[start:position])
                self._dropping, self._drop_left = chosen, length
            else:
                out.append(buffer[start:position])
                self.held = chosen
                return b"".join(out), buffer[position:]
        out.append(buffer[start:])
        return b"".join(out), None


class Held:
    """A routing frame the proxy holds or drops (see :meth:`FaultProxy.hold` and
    :meth:`FaultProxy.drop`): the ``nth`` frame of type ``code`` going ``direction`` (of
    those whose fields ``where`` accepts, if given)."""

    def __init__(
        self,
        direction: str,
        code: int,
        nth: int = 1,
        *,
        drop: bool = False,
        where: Callable[[dict], bool] | None = None,
    ):
        if nth < 1:
            raise ValueError(f"nth counts from 1, not {nth}")
        self.direction = direction
        self.code = code
        self.nth = nth
        self.drop = drop
        self.where = where
        self.passed = 0  # frames of the type (and accepted by where) passed on before it
        self.matched = False  # one match per rule
        self.data = bytearray()  # the frame (held: and every byte after it in its direction)
        self.seen = trio.Event()  # set once the whole frame is in :attr:`data`

    def match(self, code: int) -> bool:
        """A frame of ``code`` starts: whether it is the one (counted); with ``where``,
        whether it may be (:meth:`accepts` decides on the whole frame)."""
        if self.matched or code != self.code:
            return False
        return True if self.where is not None else self._count()

    def accepts(self, frame: bytes) -> bool:
        """Whether the whole ``frame`` (length and body) of the type is the one (counted)."""
        assert self.where is not None
        _, fields = msgpack.unpackb(frame[4:], raw=False)
        return bool(self.where(fields)) and self._count()

    def _count(self) -> bool:
        if self.passed + 1 < self.nth:
            self.passed += 1
            return False
        self.matched = True
        return True

    def add(self, data: bytes) -> None:
        self.data += data
        if not self.seen.is_set() and len(self.data) >= 4 and len(self.data) >= 4 + self._length:
            self.seen.set()

    @property
    def _length(self) -> int:
        return int.from_bytes(self.data[:4], "big")

    @property
    def fields(self) -> dict:
        """The held frame's fields (after :attr:`seen`)."""
        code, fields = msgpack.unpackb(bytes(self.data[4 : 4 + self._length]), raw=False)
        assert code == self.code
        return fields


class FaultProxy:
    """A byte-exact TCP proxy to ``target_host:target_port`` with switchable faults.

    Start it with ``port = await nursery.start(proxy.run)``; then connect to
    ``127.0.0.1:proxy.port``. Counters (plain ints, read them at any time):

    - ``accepted``: connections accepted, refused ones included;
    - ``refused``: connections closed at once because :meth:`refuse` was on, or because the
      target could not be reached;
    - ``live``: connections open now (accepted, not refused, not yet closed);
    - ``forwarded_to_target`` / ``forwarded_to_client``: bytes sent on, each way (counted
      when ``send_all`` returns, so a peer may have the bytes a moment before the counter);
    - ``received_from_client`` / ``received_from_target``: bytes read, each way (swallowed
      ones included); what was received and neither forwarded nor swallowed is held in the
      proxy, at most ``(buffer + 2) * chunk_size`` bytes per live connection and direction;
    - ``swallowed``: bytes dropped by :meth:`blackhole`, both ways.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        buffer: int = 4,
        chunk_size: int = 65536,
        local_address: str | None = None,
    ):
        """``buffer`` chunks of at most ``chunk_size`` bytes queue per connection and direction;
        ``local_address``: the address the proxy connects to the target from (None: the one the
        system picks), so that the target sees its clients at that address (e.g. 127.0.0.2,
        where a connection to 127.0.0.1 would otherwise come from 127.0.0.1 too)."""
        if buffer < 0 or chunk_size < 1:
            raise ValueError("buffer must be >= 0 and chunk_size >= 1")
        self.target_host = target_host
        self.target_port = target_port
        self.local_address = local_address
        self.buffer = buffer
        self.chunk_size = chunk_size
        self.port: int | None = None
        self.accepted = self.refused = self.live = 0
        self.received_from_client = self.received_from_target = self.swallowed = 0
        self.forwarded_to_target = self.forwarded_to_client = 0
        self._delay = 0.0
        self._refusing = False
        self._blackholed: frozenset[str] = frozenset()  # the directions swallowed
        self._changed = trio.Event()
        self._connections: set[trio.CancelScope] = set()
        self._hold: Held | None = None  # armed, not matched yet

    # -- faults: synchronous, effective at once for live and new connections ----------------

    def delay(self, seconds: float) -> None:
        """Deliver every chunk ``seconds`` after it was read (0: no delay); chunks already
        waiting are held to the new delay. Raises ValueError for a negative or infinite value."""
        if not 0 <= seconds < math.inf:
            raise ValueError(f"delay must be finite and >= 0, not {seconds!r}")
        self._delay = float(seconds)
        self._notify()

    def cut(self) -> None:
        """Close every live connection (both peers see EOF or a reset); returns at once, the
        sockets are closed when the connection tasks next run. New connections are accepted."""
        for scope in self._connections:
            scope.cancel()

    def refuse(self, on: bool = True) -> None:
        """While on, close every new connection as soon as it is accepted; live ones go on."""
        self._refusing = on

    def blackhole(self, on: bool = True, *, direction: str | None = None) -> None:
        """While on, swallow every byte both ways (``direction``: only that way,
        ``"to_target"`` or ``"to_client"``) and keep the connections open; EOFs and resets
        are held until it is turned off. Swallowed bytes are lost (see the module doc)."""
        if direction not in (None, "to_target", "to_client"):
            raise ValueError(f"direction is to_target or to_client, not {direction!r}")
        both = frozenset(("to_target", "to_client"))
        self._blackholed = (both if direction is None else frozenset((direction,))) if on else frozenset()
        self._notify()

    def heal(self) -> None:
        """Clear every fault: no delay, no refusing, no blackhole (a cut is already over)."""
        self._delay = 0.0
        self._refusing = False
        self._blackholed = frozenset()
        self._notify()

    def hold(self, direction: str, code: int, nth: int = 1, *, where: Callable[[dict], bool] | None = None) -> Held:
        """Hold the ``nth`` routing frame of type ``code`` going ``direction`` from now on
        (``"to_target"`` or ``"to_client"``), on any connection, and everything after it in
        that direction; wait for :attr:`Held.seen`. ``where(fields)``: count only the frames
        it accepts. The connection stays open until :meth:`cut` (or its end). Replaces a
        rule armed before that has not matched."""
        return self._arm(Held(direction, code, nth, where=where))

    def drop(self, direction: str, code: int, nth: int = 1, *, where: Callable[[dict], bool] | None = None) -> Held:
        """Take the ``nth`` routing frame of type ``code`` going ``direction`` (of those
        ``where`` accepts) from now on out of its stream (the bytes after it go on, so the
        peers see a stream without it: an answer that never came); :attr:`Held.seen` once
        all of it was dropped."""
        return self._arm(Held(direction, code, nth, drop=True, where=where))

    def _arm(self, rule: Held) -> Held:
        if rule.direction not in ("to_target", "to_client"):
            raise ValueError(f"direction is to_target or to_client, not {rule.direction!r}")
        self._hold = rule
        return rule

    def _choose(self, direction: str) -> Callable[[int], Held | None] | None:
        """The scanner's choice for ``direction`` under the armed rule (None: no rule there)."""
        rule = self._hold
        if rule is None or rule.direction != direction:
            return None

        def choose(code: int) -> Held | None:
            if self._hold is not rule or not rule.match(code):
                return None
            return rule

        return choose

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- serving -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 (a free port), report the port to ``task_status``, and serve
        until cancelled; cancellation closes the listener and every connection.

        Raises: OSError if it cannot listen. Network errors of single connections end those
        connections only.
        """
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await trio.serve_listeners(self._serve, listeners, handler_nursery=nursery)

    async def _serve(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        if self._refusing:
            self.refused += 1
            await trio.aclose_forcefully(client)
            return
        scope = trio.CancelScope()
        self._connections.add(scope)
        self.live += 1
        try:
            with scope:
                async with client:
                    try:
                        target = await trio.open_tcp_stream(
                            self.target_host, self.target_port, local_address=self.local_address
                        )
                    except OSError:
                        self.refused += 1
                        return
                    async with target, trio.open_nursery() as nursery:
                        self._pump(nursery, client, target, "to_target")
                        self._pump(nursery, target, client, "to_client")
        finally:
            self._connections.discard(scope)
            self.live -= 1

    def _pump(self, nursery: trio.Nursery, source: trio.SocketStream, sink: trio.SocketStream, direction: str) -> None:
        """Start the reader and the writer of one direction (``to_target``, ``to_client``);
        a reset or a failed write cancels ``nursery``, which ends the connection."""
        send, receive = trio.open_memory_channel[tuple[float, object]](self.buffer)
        received = "received_from_client" if direction == "to_target" else "received_from_target"
        nursery.start_soon(self._read, source, send, received, direction)
        nursery.start_soon(self._write, receive, sink, f"forwarded_{direction}", nursery.cancel_scope, direction)

    async def _read(
        self, source: trio.SocketStream, channel: trio.MemorySendChannel, counter: str, direction: str
    ) -> None:
        scanner = FrameScanner()
        held: Held | None = None  # once set, this direction forwards nothing more
        async with channel:
            while True:
                try:
                    data = await source.receive_some(self.chunk_size)
                except trio.BrokenResourceError:
                    await channel.send((trio.current_time(), _RESET))
                    return
                if not data:
                    await channel.send((trio.current_time(), _EOF))
                    return
                setattr(self, counter, getattr(self, counter) + len(data))
                if held is not None:
                    held.add(data)
                    continue
                data, rest = scanner.feed(data, self._choose(direction))
                if rest is not None:
                    held = scanner.held
                    assert held is not None and not held.drop
                    held.add(rest)
                if not data:
                    continue
                if direction in self._blackholed:
                    self.swallowed += len(data)
                    continue
                await channel.send((trio.current_time(), data))

    async def _write(
        self,
        channel: trio.MemoryReceiveChannel,
        sink: trio.SocketStream,
        counter: str,
        connection: trio.CancelScope,
        direction: str,
    ) -> None:
        async with channel:
            async for read_at, item in channel:
                if isinstance(item, bytes):
                    if not await self._due(read_at, direction, hold=False):
                        self.swallowed += len(item)
                        continue
                    try:
                        await sink.send_all(item)
                    except trio.BrokenResourceError:
                        connection.cancel()
                        return
                    setattr(self, counter, getattr(self, counter) + len(item))
                    continue
                await self._due(read_at, direction, hold=True)
                if item is _RESET:
                    connection.cancel()
                    return
                try:
                    await sink.send_eof()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    connection.cancel()
                return

    async def _due(self, read_at: float, direction: str, *, hold: bool) -> bool:
        """Wait until what was read at ``read_at`` is due under the current delay. A chunk
        (``hold=False``) returns False as soon as the blackhole is on for ``direction``:
        swallow it. An EOF or a reset (``hold=True``) also waits for the blackhole to be off;
        returns True."""
        while True:
            changed = self._changed  # taken before the checks: no change can slip between
            blackholed = direction in self._blackholed
            if blackholed and not hold:
                return False
            due = read_at + self._delay
            if not blackholed and trio.current_time() >= due:
                return True
            with trio.move_on_at(due if not blackholed else math.inf):
                await changed.wait()
