"""Who is using ``sys$web``, and whether a change request really comes from its own pages.

:class:`BasicAuth` (ASGI middleware) logs every request in while ``sys$authentication`` has
authentication on, and leaves the :class:`Viewer` in the request's scope. Who may come in:
users of ``admin-group`` (the web view's own setting) and users of any of ``sys$mgmt``'s
groups, so that a read-only manager can watch. What they may *change* is not decided here:
every change is a request to ``sys$mgmt`` under the viewer's :meth:`Viewer.identity`, which
authorizes and logs it as for ``martinet admin`` (the pages only hide the buttons a role
may not use, from :meth:`~martinet.swiftlets.mgmt.api.Management.role`).

Cross-site requests. A browser sends basic-auth credentials (and a loopback listener needs
none) with a form another site makes it post, so a change must prove it comes from a page
of this web view: :class:`Guard` checks a token bound to the user and to this run of the
swiftlet (an HMAC of the user name under a random key made at start; every form carries it,
another site cannot read it), and an ``Origin`` header, when the browser sends one, must be
this listener's own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING

import attrs
import trio
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from martinet.swiftlets.authentication.api import Authentication, AuthenticationFailed
from martinet.swiftlets.mgmt.api import Identity

if TYPE_CHECKING:
    from .swiftlet import WebSwiftlet

__all__ = ["BasicAuth", "Viewer", "Guard", "viewer_of"]

VIEWER = "martinet.viewer"  # the scope key of the request's Viewer


@attrs.frozen
class Viewer:
    """A user of the web view: who (empty without authentication), and from where."""

    user: str
    group: str
    authenticated: bool
    host: str

    def identity(self, router: str) -> Identity:
        """The identity the viewer's management requests carry: as an AMQP listener of
        ``router`` would stamp a client's, so ``sys$mgmt`` applies the same rules."""
        return Identity(
            user=self.user, group=self.group, authenticated=self.authenticated, host=self.host, router=router
        )


def viewer_of(connection: HTTPConnection) -> Viewer:
    viewer = connection.scope.get(VIEWER)
    assert isinstance(viewer, Viewer)  # BasicAuth puts one in every HTTP request's scope
    return viewer


class Guard:
    """The cross-site request check of change requests (see the module header)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def token(self, viewer: Viewer) -> str:
        return hmac.new(self._key, viewer.user.encode(), hashlib.sha256).hexdigest()

    def refusal(self, request: Request, token: str) -> str | None:
        """Why a change request may not go on (None: it may)."""
        origin = request.headers.get("origin")
        if origin is not None:
            host = request.headers.get("host", "")
            if origin.partition("://")[2] != host:
                return f"cross-site request refused: origin {origin} is not this web view ({host})"
        if not hmac.compare_digest(token, self.token(viewer_of(request))):
            return "cross-site request refused: the form's token is missing or not this session's"
        return None


class BasicAuth:
    """ASGI middleware: HTTP basic auth against ``sys$authentication`` while authentication
    is on; every HTTP request that goes on carries its :class:`Viewer`.

    A request without credentials, or with wrong ones, gets 401 (after the authentication
    swiftlet's refusal delay for its host); a user who may not come in gets 403. With
    authentication off, a loopback listener lets every request through (as a viewer with no
    user: ``sys$mgmt`` decides by the address) and any other refuses every request (403).
    """

    def __init__(self, app: ASGIApp, web: WebSwiftlet, admin_group: str):
        self.app = app
        self.web = web
        self.admin_group = admin_group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        host = connection.client.host if connection.client else ""
        if not self.web.protected:
            if self.web.loopback:
                scope[VIEWER] = Viewer("", "", False, host)
                await self.app(scope, receive, send)
                return
            await PlainTextResponse(
                "authentication-enabled is off in sys$authentication: this listener is not on "
                "loopback, so it serves nothing until authentication is on again",
                status_code=403,
            )(scope, receive, send)
            return
        authentication = self.web.authentication
        assert authentication is not None
        outcome = await self._login(authentication, connection.headers.get("authorization", ""), host)
        if isinstance(outcome, Viewer):
            scope[VIEWER] = outcome
            await self.app(scope, receive, send)
            return
        status, text = outcome
        if status == 401:
            await trio.sleep(authentication.refusal_delay(host))
        headers = {"WWW-Authenticate": 'Basic realm="martinet", charset="UTF-8"'} if status == 401 else None
        await PlainTextResponse(text, status_code=status, headers=headers)(scope, receive, send)

    async def _login(self, authentication: Authentication, header: str, host: str) -> Viewer | tuple[int, str]:
        """The viewer, or the status and the text of the refusal."""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return 401, "log in: HTTP basic auth with a user of the admin group or of one of sys$mgmt's groups"
        try:
            user, colon, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return 401, "malformed basic auth credentials"
        if not colon:
            return 401, "malformed basic auth credentials"
        try:
            principal = await authentication.login(user, password, host)
        except AuthenticationFailed as exc:
            return 401, exc.reason
        management = self.web.management
        if principal.group != self.admin_group and not (management is not None and management.manages(principal.group)):
            self.web.context.log.warning(
                "web: user %s from %s refused: group %s is neither the admin group %s nor one of sys$mgmt's",
                user,
                host,
                principal.group,
                self.admin_group,
            )
            return 403, f"user {user} is not in the admin group (nor in one of sys$mgmt's groups)"
        return Viewer(principal.user, principal.group, True, host)
