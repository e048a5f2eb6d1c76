"""What the pages read and change, on this router or any other.

Reading. This router's usage is read from its management tree directly (the web view works
without ``sys$mgmt``); another router's is asked of it through ``sys$mgmt`` under this
router's own read-only identity (:meth:`.swiftlet.WebSwiftlet.ask`), as ``martinet admin``'s
``sr`` reaches any router through the one it is connected to. So one page serves every
router.

Changing. Every change, on this router as on another, is a ``sys$mgmt`` request under the
viewer's identity (:meth:`.auth.Viewer.identity`): ``sys$mgmt`` authorizes it by the
viewer's role and writes the audit line, exactly as for ``martinet admin``. Without
``sys$mgmt`` here nothing can be changed from the web view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from martinet.kernel import ManagementError, SwiftletContext, Usage, UsageList
from martinet.swiftlets.mgmt.api import RequestFailed, Role, Status

from .auth import Guard, Viewer

if TYPE_CHECKING:
    from .swiftlet import WebSwiftlet

__all__ = ["Console"]


class Console:
    """Reads and changes of one web view's pages (see the module header)."""

    def __init__(self, web: WebSwiftlet, context: SwiftletContext):
        self.web = web
        self.context = context
        self.local = context.router_name
        self.guard = Guard()

    async def entries(self, router: str, path: str) -> dict[str, dict[str, Any]]:
        """The entries of the usage list at ``path`` of ``router``, by name, with their values.

        Raises:
            RequestFailed: no such list there (400), or the router did not answer.
        """
        if router == self.local:
            node = self._resolve(path)
            if not isinstance(node, UsageList):
                raise RequestFailed(int(Status.BAD_REQUEST), f"{path} is not a usage list", router)
            return {name: dict(entry.properties()) for name, entry in sorted(node.children.items())}
        return dict(sorted((await self.web.ask(router, "get", path=path))["entries"].items()))

    async def values(self, router: str, path: str) -> dict[str, Any]:
        """The values of the usage entity at ``path`` of ``router`` (raises as :meth:`entries`)."""
        if router == self.local:
            node = self._resolve(path)
            if not isinstance(node, Usage):
                raise RequestFailed(int(Status.BAD_REQUEST), f"{path} is not a usage entity", router)
            return dict(node.properties())
        return dict((await self.web.ask(router, "get", path=path))["properties"])

    def _resolve(self, path: str) -> Any:
        try:
            return self.context.management.resolve(path)
        except ManagementError as exc:
            raise RequestFailed(int(Status.BAD_REQUEST), str(exc), self.local) from None

    def role(self, viewer: Viewer) -> Role | None:
        """The viewer's role on this router (None: no ``sys$mgmt`` here, or not a manager)."""
        management = self.web.management
        return management.role(viewer.identity(self.local)) if management is not None else None

    def may_change(self, viewer: Viewer) -> bool:
        """Whether the pages offer changes to the viewer (the router asked still decides)."""
        return self.role(viewer) is Role.READ_WRITE

    def token(self, viewer: Viewer) -> str:
        return self.guard.token(viewer)

    async def request(
        self, viewer: Viewer, router: str, request: Mapping[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """``request`` served by ``router``'s ``sys$mgmt`` as the viewer: the reply
        (``status`` and ``result`` or ``error``); another router has ``timeout`` seconds to
        answer (default ``map-request-timeout``; this one serves it at once)."""
        management = self.web.management
        if management is None:
            return {"status": int(Status.UNAVAILABLE), "error": "sys$mgmt does not run on this router"}
        wait = self.context.config.map_request_timeout if timeout is None else timeout
        return await management.request(router, request, viewer.identity(self.local), timeout=wait)
