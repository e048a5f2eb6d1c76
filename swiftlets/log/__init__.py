"""``sys$log``: the router's log file.

Writes the records of *this* router (by the ``router`` tag every record carries, see
:mod:`kernel.logs`) to a size-rotated file, so several routers in one process keep
separate files. Console output is the ``martinet run --log-level`` option's business; this
swiftlet adds the persistent file. ``level`` can change at runtime; the file settings
take effect at the next start. :mod:`.config` holds the settings, :mod:`.handler` the
running swiftlet; nobody calls it, so it publishes no ``api``.

Usage: ``/sys$log/usage`` counts the records written, by level.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import LogConfig
    from .handler import LogSwiftlet

    return [
        SwiftletSpec(
            name="sys$log",
            description="Writes this router's log records to a rotating log file.",
            config=LogConfig,
            factory=LogSwiftlet,
        )
    ]
