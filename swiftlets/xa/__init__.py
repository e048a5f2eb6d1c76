"""``sys$xa``: the XA resource manager — prepared transactions that are in doubt.

At boot it reports how many prepared transactions the queue manager rebuilt from the store
(SwiftMQ's ``+++ WARNING! 10 prepared transactions found!``), lists those no owner is
resolving in ``/sys$xa/usage/in-doubt/<xid>`` (xid, owner, age, queues, messages,
acknowledgements) with the operations ``commit`` and ``rollback``, and lets owners such as
routing claim their xids (:mod:`.api`: the interface and the xid convention;
:mod:`.manager`: the running swiftlet). Start it after ``sys$queuemanager``.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import XAConfig
    from .manager import ResourceManager

    return [
        SwiftletSpec(
            name="sys$xa",
            description="XA resource manager: in-doubt prepared transactions, their owners and their resolution.",
            config=XAConfig,
            factory=ResourceManager,
        )
    ]
