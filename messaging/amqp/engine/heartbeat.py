"""The connection's liveness on time: the peer's idle timeout and ours [2.4.5]. A peer
silent for longer than our idle timeout is dropped; an empty frame goes out when we would
otherwise be silent for half of the peer's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire import RemoteProtocolError
from .states import ConnectionState

if TYPE_CHECKING:
    from .connection import Connection

_SILENT = (ConnectionState.END, ConnectionState.CLOSE_SENT, ConnectionState.CLOSE_PIPE)


class Heartbeat:
    """A connection's silences, in the clock that :meth:`.Connection.tick` is given: when the
    peer last sent (:attr:`input`) and when we last wrote (:attr:`output`), as of the last
    tick (:attr:`last_tick`); None: since that tick. The connection sets them to None as it
    reads and writes (the only work per read or write); :meth:`tick` turns them into times."""

    __slots__ = ("input", "last_tick", "output")

    def __init__(self) -> None:
        self.input: float | None = None
        self.output: float | None = None
        self.last_tick: float | None = None

    def tick(self, connection: Connection, now: float) -> float:
        """:meth:`.Connection.tick` of ``connection``: the next deadline, 0 for none."""
        if self.input is None:  # the peer spoke just before this tick (the driver ticks after each read)
            self.input = now
        if self.output is None:
            # we wrote at some time since the last tick, which this tick may follow by up to half
            # the peer's idle timeout (it was our deadline): counting from now would leave the
            # peer without a frame from us for up to its whole idle timeout, and it drops us
            self.output = now if self.last_tick is None else self.last_tick
        self.last_tick = now
        if connection._state in _SILENT:
            return 0.0
        deadlines = []
        idle_timeout, remote_idle_timeout = connection.idle_timeout, connection.remote_idle_timeout
        if idle_timeout:
            if now >= self.input + idle_timeout:
                connection._fail(RemoteProtocolError("amqp:resource-limit-exceeded", "local-idle-timeout expired"))
                return 0.0
            deadlines.append(self.input + idle_timeout)
        if remote_idle_timeout and connection._state is not ConnectionState.START:
            if now >= self.output + remote_idle_timeout / 2:
                connection._out.append(b"\x00\x00\x00\x08\x02\x00\x00\x00")  # an empty frame keeps us alive
                self.output = now
            deadlines.append(self.output + remote_idle_timeout / 2)
        return min(deadlines) if deadlines else 0.0
