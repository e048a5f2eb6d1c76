"""The client's AMQP 1.0 engine façade: proton's C engine, sans-IO, for one connection.

The router's listener runs on our own engine (:mod:`.amqp`); the client still runs on
proton's behind this module until it moves onto that one too.

Theory of operation
-------------------
proton's protocol engine (``pn_transport`` + ``pn_connection`` + ``pn_collector``, no
reactor) does the framing and the AMQP state machines; this module is the only place that
calls it (``shared/reference/amqp-engine.md``). Bytes go in with :meth:`Engine.receive_data`,
bytes come out of :meth:`Engine.data_to_send`, events are read with
:meth:`Engine.next_event` / :meth:`Engine.pop_event`; time moves with :meth:`Engine.tick`.

Per-message work (reading a transfer, sending one, settling) calls the C API through
cffi (``cproton_ffi.lib``): proton's Python classes cost ~25 µs per message, the C API
~2.5 µs. The rare events (open, attach, detach, close) use proton's Python classes, which
are convenient and fine at that rate. python-qpid-proton is pinned exactly, since
``cproton_ffi`` is its private module (exposing proton's public, stable C API).
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import proton
from cproton_ffi import ffi, lib

__all__ = ["Engine", "EngineClosed", "Tags", "lib", "ffi", "receive_transfer"]


class EngineClosed(Exception):
    """The engine's transport has closed (the connection is over)."""


class Engine:
    """One AMQP connection's protocol engine."""

    def __init__(self, *, server: bool = True, container_id: str = "", idle_timeout: float = 0.0,
                 max_frame_size: int = 0, hostname: str = "", user: str | None = None, password: str | None = None):
        """A server engine (SASL is done in front of it, see :mod:`.sasl`) or a client engine,
        which does SASL itself: PLAIN with ``user``/``password``, else ANONYMOUS."""
        self.transport = proton.Transport(proton.Transport.SERVER if server else proton.Transport.CLIENT)
        if max_frame_size:
            self.transport.max_frame_size = max_frame_size
        if idle_timeout:
            self.transport.idle_timeout = idle_timeout
        self.connection = proton.Connection()
        if container_id:
            self.connection.container = container_id
        if not server:
            sasl = self.transport.sasl()
            sasl.allow_insecure_mechs = True  # PLAIN over plain TCP, as the user asked for it
            sasl.allowed_mechs("PLAIN" if user else "ANONYMOUS")
            if hostname:
                self.connection.hostname = hostname
            if user:
                self.connection.user = user
                self.connection.password = password or ""
        self.collector = proton.Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self._transport = self.transport._impl
        self._out = ffi.new("char[]", 65536)  # reused for output

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed its side.

        Raises:
            EngineClosed: the transport accepts no more input.
        """
        transport = self._transport
        if not data:
            lib.pn_transport_close_tail(transport)
            return
        if type(data) is bytes and len(data) <= lib.pn_transport_capacity(transport):  # usually all at once
            lib.pn_transport_push(transport, data, len(data))
            return
        view = memoryview(data)
        while view:
            capacity = lib.pn_transport_capacity(transport)
            if capacity < 0:
                raise EngineClosed("the connection is closed for input")
            if capacity == 0:
                raise EngineClosed("the engine cannot take more input")  # never with a consuming reader
            chunk = view[:capacity]
            lib.pn_transport_push(transport, ffi.from_buffer(chunk), len(chunk))
            view = view[len(chunk):]

    def data_to_send(self) -> bytes | None:
        """Bytes to write now (``b""``: nothing); ``None`` once the output side is closed."""
        transport = self._transport
        pending = lib.pn_transport_pending(transport)
        if pending < 0:
            return None
        if pending == 0:
            return b""
        if pending > len(self._out):
            self._out = ffi.new("char[]", max(pending, 2 * len(self._out)))
        lib.pn_transport_peek(transport, self._out, pending)
        lib.pn_transport_pop(transport, pending)
        return ffi.unpack(self._out, pending)

    def tick(self, now: float) -> float:
        """Let the engine act on time (idle timeouts, heartbeats); the next deadline, 0 for none."""
        return self.transport.tick(now)

    def next_event(self) -> Any:
        """The next event pointer, or ``ffi.NULL``."""
        return lib.pn_collector_peek(self.collector._impl)

    def pop_event(self) -> None:
        lib.pn_collector_pop(self.collector._impl)

    @property
    def closed(self) -> bool:
        return lib.pn_transport_closed(self._transport)

    @property
    def sasl_refused(self) -> bool:
        """Client side: the server's SASL outcome refused our credentials."""
        outcome = lib.pn_sasl_outcome(lib.pn_sasl(self._transport))
        return outcome not in (lib.PN_SASL_NONE, lib.PN_SASL_OK)

    def error_text(self) -> str:
        condition = self.transport.condition
        return f"{condition.name}: {condition.description}" if condition else ""


# The per-message C functions, bound once: a ``lib.`` attribute lookup adds ~40 ns to each call.
pn_delivery_readable, pn_delivery_partial, pn_delivery_pending = (
    lib.pn_delivery_readable, lib.pn_delivery_partial, lib.pn_delivery_pending)
pn_link_recv, pn_link_advance = lib.pn_link_recv, lib.pn_link_advance
_unpack = ffi.unpack

_receive_buffers = threading.local()  # one reusable buffer per thread (routers may run in several)


def receive_transfer(link: Any, delivery: Any) -> bytes | None:
    """The complete bytes of an incoming transfer, or None while it is still partial."""
    if not pn_delivery_readable(delivery) or pn_delivery_partial(delivery):
        return None
    size = pn_delivery_pending(delivery)
    buffer = getattr(_receive_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _receive_buffers.buffer = ffi.new("char[]", max(size, 65536))
    received = pn_link_recv(link, buffer, size)
    data = _unpack(buffer, max(received, 0))
    pn_link_advance(link)
    return data


class Tags:
    """Delivery tags for one sender link: an 8-byte counter written into one reused C
    struct (proton copies the tag), so a send makes no Python bytes for it."""

    def __init__(self) -> None:
        self._bytes = ffi.new("char[8]")
        self._struct = ffi.new("pn_delivery_tag_t*", (8, self._bytes))  # owns the memory tag refers to
        self.tag = self._struct[0]
        self.view = ffi.buffer(self._bytes)
        self.count = 0

    def next(self) -> Any:
        self.count += 1
        _pack_tag(self.view, 0, self.count)
        return self.tag


_pack_tag = struct.Struct(">Q").pack_into
