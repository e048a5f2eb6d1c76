"""A client connection's login: SASL up to the credentials, the decision, the answer.

Theory of operation
-------------------
:class:`ClientLogin` runs SASL (:mod:`messaging.amqp.sasl`) as the lead-in stage of the
connection's socket (:class:`_Stage`) within :data:`SASL_TIMEOUT` seconds, asks the
swiftlet (``sys$authentication``, if it runs) for a principal, and writes the outcome. A
refusal is answered after the authentication swiftlet's throttling delay for the client's
address: a SASL outcome, or — a client that skipped SASL — an AMQP close [2.4.1].
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from martinet.messaging.amqp.sasl import Credentials, SaslServer
from martinet.messaging.amqp.wire import AMQP_HEADER, FRAME_HEADER
from martinet.messaging.codec import Described, Symbol, ULong, encode
from martinet.messaging.io import lead_in
from martinet.swiftlets.authentication.api import AuthenticationFailed
from martinet.swiftlets.queuemanager.api import Creator

if TYPE_CHECKING:
    from .listener import AmqpConnection

__all__ = ["SASL_TIMEOUT", "ClientLogin", "refusal"]

log = logging.getLogger(__name__)

SASL_TIMEOUT = 30.0


def refusal(container_id: str, condition: str, description: str) -> bytes:
    """What a server answers a client that sent the AMQP header but may not stay: our header,
    an ``open`` and a ``close`` with the error. "a peer that wishes to close the connection
    with an error … MUST first send an open frame" [2.4.1]; the close carries the condition
    [2.7.9], e.g. ``amqp:unauthorized-access`` or ``amqp:resource-limit-exceeded`` [2.8.15]."""
    frames = [
        Described(ULong(0x10), [container_id]),
        Described(ULong(0x18), [Described(ULong(0x1D), [Symbol(condition), description, None])]),
    ]
    out = bytearray(AMQP_HEADER)
    for performative in frames:
        body = encode(performative)
        out += FRAME_HEADER.pack(8 + len(body), 2, 0, 0) + body
    return bytes(out)


class _Stage:
    """The lead-in stage of a client connection: SASL up to the client's credentials
    (:class:`messaging.io.Stage`). The decision on them comes after the stage, as the
    authentication swiftlet may check a password hash in a worker thread meanwhile; then
    :meth:`accept` or :meth:`refuse` answers. A refusal is held back (:attr:`refusal`) so
    that the connection can answer it after the authentication swiftlet's throttling delay."""

    def __init__(self, sasl: SaslServer):
        self._sasl = sasl
        self.credentials: Credentials | None = None
        self.refusal = b""

    def receive_data(self, data: bytes) -> bool:
        """Raises: SaslError (a broken exchange)."""
        self.credentials = self._sasl.receive_data(data)
        return self.credentials is not None

    @property
    def data_to_send(self) -> bytes:
        return self._sasl.data_to_send

    @property
    def remaining(self) -> bytes:
        return b""  # (what the client sent after SASL is the answer of accept())

    @property
    def skipped_sasl(self) -> bool:
        return self.credentials is not None and self.credentials.mechanism is None

    def accept(self) -> tuple[bytes, bytes]:
        """The outcome to write, and what the client sent after SASL (AMQP's input)."""
        self._sasl.accept()
        return self._sasl.data_to_send, self._sasl.remaining

    def refuse(self) -> None:
        self._sasl.refuse()
        self.refusal = self._sasl.data_to_send  # empty when the client skipped SASL


class ClientLogin:
    """The login of one client connection."""

    def __init__(self, connection: AmqpConnection):
        self.connection = connection
        self._stage = _Stage(SaslServer())

    async def run(self) -> bytes | None:
        """Log the client in: what it sent after SASL (AMQP's input), or None if it did not
        finish SASL within :data:`SASL_TIMEOUT`.

        Raises: SaslError; AuthenticationFailed (answered by :meth:`answer_refusal`).
        """
        connection, stage = self.connection, self._stage
        with trio.move_on_after(SASL_TIMEOUT) as timer:
            await lead_in(connection.stream, stage)
            # lead_in returns once the SASL stage is over, i.e. once it has the credentials
            assert stage.credentials is not None
            try:
                connection.principal = await connection.swiftlet.login(stage.credentials, connection.host)
                # a user and password checked now (what a management request may rely on)
                connection.authenticated = (
                    connection.swiftlet.authentication_enabled and stage.credentials.mechanism == "PLAIN"
                )
                if connection.authenticated:  # without a checked login every client is one "anonymous"
                    user = getattr(connection.principal, "user", "") or ""
                    connection.creator = Creator(user=user, host=connection.host)
            except AuthenticationFailed:
                stage.refuse()
                raise
            outcome, remaining = stage.accept()
            if outcome:
                await connection.stream.send_all(outcome)
        if timer.cancelled_caught:
            log.info("connection from %s closed: no SASL exchange within %.0f s", connection.host, SASL_TIMEOUT)
            return None
        return remaining

    async def answer_refusal(self, failure: AuthenticationFailed) -> None:
        """Answer a refused login after the authentication swiftlet's delay for this address:
        a SASL outcome, or — a client that skipped SASL — an AMQP close [2.4.1]."""
        connection, stage = self.connection, self._stage
        answer = stage.refusal
        if stage.skipped_sasl:
            answer = refusal(f"martinet:{connection.swiftlet.router_name}", "amqp:unauthorized-access", failure.reason)
        try:
            with trio.move_on_after(SASL_TIMEOUT):
                await trio.sleep(connection.swiftlet.refusal_delay(connection.host))
                if answer:
                    await connection.stream.send_all(answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client left without waiting
