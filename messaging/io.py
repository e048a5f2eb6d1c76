"""The trio side of an AMQP connection, shared by the listener and the client.

:mod:`.amqp` is sans-IO; the owner of a socket runs :func:`read_into` as its reader and a
writer of its own (which decides what to pump before it writes).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from .amqp import Connection


async def read_into(engine: Connection, stream: trio.abc.ReceiveStream, after_input: Callable[[], None]) -> None:
    """Feed ``engine`` what ``stream`` receives, ticking its timers at their deadlines, and
    call ``after_input`` after each read or tick; returns once the peer closed its side
    (the owner's writer ends the connection when the engine's output is over).

    Raises: what ``stream.receive_some`` raises (a broken or closed socket).
    """
    while True:
        data = None
        deadline = engine.tick(trio.current_time())
        with trio.move_on_at(deadline if deadline else math.inf):
            data = await stream.receive_some(65536)
            engine.receive_data(data)
        after_input()
        if data == b"":
            return
