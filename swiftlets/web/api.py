"""``sys$web``'s public interface: where it listens, the network map it shows, and the map's
pure builder (:mod:`.netmap`), which a management crawl can feed with other routers' views.

Get the running swiftlet with ``context.lookup("sys$web", Web)``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .netmap import DOWN, OPERATIONAL, LinkView, MapEdge, MapRouter, NetworkMap, build_map

__all__ = ["Web", "LinkView", "MapEdge", "MapRouter", "NetworkMap", "build_map", "DOWN", "OPERATIONAL"]


@runtime_checkable
class Web(Protocol):
    """What ``sys$web`` offers."""

    @property
    def url(self) -> str:
        """``http://host:port`` (``https://`` with TLS) of the listener as bound; empty while it is disabled."""

    def network_map(self) -> NetworkMap:
        """The network map as this router sees it now."""
