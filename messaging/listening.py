"""Listening sockets for a server: bound at once, so that an operator's mistake (a port in
use, a certificate that does not load) is refused when the listener is configured, with
the reason and the listener named, not later in a background task.

Pure socket set-up, no serving: the caller hands the listeners to ``trio.serve_listeners``.
"""

from __future__ import annotations

import socket
import ssl
from typing import TypeAlias

import trio

__all__ = ["Accepted", "listen", "port_of"]

Accepted: TypeAlias = "trio.SocketStream | trio.SSLStream[trio.SocketStream]"


def listen(
    where: str, host: str, port: int, *, certificate: str = "", key: str = ""
) -> list[trio.abc.Listener[Accepted]]:
    """A listening socket on ``host:port`` (port 0: a free one), TLS on top with a
    ``certificate`` (and its ``key``); ``where`` names the listener in errors.

    Raises: OSError (e.g. the port is in use) or ssl.SSLError, with ``where`` and the reason.
    """
    tls = None
    if certificate:
        try:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(certificate, key or None)
        except (OSError, ssl.SSLError) as exc:
            raise type(exc)(f"{where}: cannot load the TLS certificate {certificate!r} / key {key!r}: {exc}") from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
    except OSError as exc:
        sock.close()
        raise OSError(f"{where}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    return [trio.SSLListener(listener, tls) if tls else listener]


def port_of(listeners: list[trio.abc.Listener[Accepted]]) -> int:
    """The port the first of ``listeners`` (from :func:`listen`) is bound to."""
    first = listeners[0]
    plain = first.transport_listener if isinstance(first, trio.SSLListener) else first
    assert isinstance(plain, trio.SocketListener)  # listen() listens on a socket, TLS on top or not
    return int(plain.socket.getsockname()[1])
