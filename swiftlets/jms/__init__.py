"""``sys$jms``: the AMQP 1.0 listener with JMS semantics.

Listeners (port, bind address, max connections, host access list, keepalive → AMQP idle
timeout, frame size, incoming credit, TLS, connection-factory defaults announced in the
open frame), SASL ANONYMOUS and PLAIN checked by ``sys$authentication``
(:mod:`messaging.amqp.sasl`), our AMQP 1.0 engine (:mod:`messaging.amqp`), the links and
their JMS semantics (:mod:`.listener`), per-connection usage sampled every
``collect-interval``. Nobody calls it, so it publishes no ``api``.

Layout: :mod:`.config` (listeners), :mod:`.swiftlet` (the running swiftlet: listeners and
what connections share), :mod:`.listener` (one client connection and its links).
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl

from .config import JmsConfig
from .swiftlet import JmsSwiftlet


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name="sys$jms",
            description="AMQP 1.0 listener with JMS semantics.",
            config=JmsConfig,
            factory=JmsSwiftlet,
        )
    ]
