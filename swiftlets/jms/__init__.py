"""``sys$jms``: the AMQP 1.0 listener with JMS semantics.

Listeners (port, bind address, max connections, host access list, keepalive → AMQP idle
timeout, frame size, incoming credit, TLS, connection-factory defaults announced in the
open frame), SASL ANONYMOUS and PLAIN checked by ``sys$authentication``
(:mod:`messaging.amqp.sasl`), our AMQP 1.0 engine (:mod:`messaging.amqp`), the links and
their JMS semantics (:mod:`.links`), per-connection usage sampled every
``collect-interval``. Nobody calls it, so it publishes no ``api``.

Layout: :mod:`.config` (listeners), :mod:`.swiftlet` (the running swiftlet: listeners and
what connections share), :mod:`.listener` (one client connection), and the connection's
parts, one job each: :mod:`.login` (SASL and the login decision), :mod:`.attach`
(attaches and detaches), :mod:`.links` (the links: the per-message work), :mod:`.access`
(the access policy, pure functions), :mod:`.addresses` (the policy applied; auto-created
queues), :mod:`.temporary` (temporary queues and topics), :mod:`.durable` (durable
subscriptions), :mod:`.transactions` (the transaction coordinator), :mod:`.flow`
(producer flow control), :mod:`.usage` (what management shows of a connection).
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import JmsConfig
    from .swiftlet import JmsSwiftlet

    return [
        SwiftletSpec(
            name="sys$jms",
            description="AMQP 1.0 listener with JMS semantics.",
            config=JmsConfig,
            factory=JmsSwiftlet,
        )
    ]
