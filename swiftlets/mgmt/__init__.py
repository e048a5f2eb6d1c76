"""``sys$mgmt``: management over messaging, and the ``martinet admin`` command.

Each router serves management requests that arrive as AMQP messages on its queue
``sys$mgmt`` (:mod:`.api`, format in ``docs/management.md``): from a client connected to
it, or routed from anywhere in the network (``sys$mgmt@paris``). Layout: :mod:`.api` (the
queue, the format's constants, the identity, the :class:`~.api.Management` protocol),
:mod:`.config` (who may manage, watch bounds), :mod:`.service` (the swiftlet),
:mod:`.client` (requests from a program over our client) and :mod:`.admin` (the
``martinet admin`` shell and one-shot commands). Start it after the queue manager, the
AMQP listener and ``sys$routing`` (when present).
"""

from __future__ import annotations

from martinet.kernel import Command, SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import MgmtConfig
    from .service import MgmtSwiftlet

    return [
        SwiftletSpec(
            name="sys$mgmt",
            description="Serves management requests arriving as messages on the queue sys$mgmt.",
            config=MgmtConfig,
            factory=MgmtSwiftlet,
        )
    ]


@hookimpl
def martinet_commands() -> list[Command]:
    from .admin import ADMIN_COMMAND

    return [ADMIN_COMMAND]
