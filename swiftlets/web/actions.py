"""The changes the web view offers, and ``POST /routers/{router}/act``, which makes them.

Each action (:data:`ACTIONS`) is one ``sys$mgmt`` request (``invoke`` of a usage entity's
operation, or ``remove`` of a configured entity) on one named entity. A button posts the
action's name and the entity's; the answer is a page that says what the action will do,
with how many messages it touches where it touches any (read now from the router), and a
second button that posts it again confirmed. Only the confirmed post is sent to ``sys$mgmt``
as the viewer, with ``force`` (the confirmation ``martinet admin`` asks with ``--force``);
``sys$mgmt`` authorizes it, does it and writes the audit line, and its status is the HTTP
status of the page that shows the outcome (403 for a role that may not, 409, 400 …).

Every post must pass the cross-site check (:class:`.auth.Guard`); a viewer whose role here
is not read-write is refused before any confirmation on this router's own pages (another
router decides for itself, when the confirmed request reaches it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import attrs
from starlette.requests import Request
from starlette.responses import Response

from martinet.swiftlets.mgmt.api import RequestFailed, Status

from .auth import viewer_of
from .console import Console
from .render import esc, link, page, router_url

__all__ = ["Action", "ACTIONS", "act"]

#: Seconds another router has to answer a change: a purge or move of a long queue takes a
#: while, and a page that said "no answer" while it goes on would mislead.
ACTION_TIMEOUT = 120.0
FORM_MAX = 16_384  # bytes of a posted form (a few names, a selector)
Say = Callable[[str, Mapping[str, str], Any], str]  # (entity name, fields, messages) -> what it does


@attrs.frozen(kw_only=True)
class Action:
    """One change on one entity: the ``sys$mgmt`` request it is, and what it says first.

    Attributes:
        path: the usage entity it acts on (``{name}``: the entity's name); for a ``remove``,
            the usage entity whose ``messages`` are counted.
        operation: the operation invoked; "" for a ``remove`` of ``remove_from``'s entry.
        fields: the form's fields passed as the operation's arguments (all required but
            ``selector``).
        says: the confirmation's text.
        counts: the entity's value the confirmation reads first (how many messages it
            touches: ``available`` for a purge, which leaves those delivered and unsettled;
            ``messages`` for the others); "" for none.
        back: the router page shown again afterwards (``{name}`` as in ``path``).
    """

    path: str
    operation: str = ""
    remove_from: str = ""
    fields: tuple[str, ...] = ()
    says: Say
    counts: str = ""
    back: str


QUEUE = "/sys$queuemanager/usage/queues/{name}"


def _move(name: str, fields: Mapping[str, str], messages: Any) -> str:
    selector = fields["selector"]
    which = f"those of its {messages} available message(s) that match {selector}" if selector else None
    return f"Move {which or f'the {messages} available message(s)'} of queue {name} to {fields['target']}."


ACTIONS: dict[str, Action] = {
    "purge": Action(
        path=QUEUE,
        operation="purge",
        says=lambda name, _, n: f"Purge queue {name}: its {n} available message(s) are removed for good.",
        counts="available",
        back="/queues/{name}",
    ),
    "move": Action(
        path=QUEUE,
        operation="move",
        fields=("target", "selector"),
        says=_move,
        counts="messages",
        back="/queues/{name}",
    ),
    "delete-queue": Action(
        path=QUEUE,
        remove_from="/sys$queuemanager/queues",
        says=lambda name, _, n: f"Delete queue {name} from the configuration, and its {n} message(s) with it.",
        counts="messages",
        back="/queues",
    ),
    "close-connection": Action(
        path="/sys$jms/usage/connections/{name}",
        operation="delete",
        says=lambda name, _, n: (
            f"Close client connection {name}: its temporary queues go, its unsettled messages go back to their queues."
        ),
        back="/connections",
    ),
    "commit": Action(
        path="/sys$xa/usage/in-doubt/{name}",
        operation="commit",
        says=lambda name, _, n: (
            f"Commit in-doubt transaction {name}: its {n} prepared message(s) become "
            "visible and the messages it acknowledged are removed."
        ),
        counts="messages",
        back="/transactions",
    ),
    "rollback": Action(
        path="/sys$xa/usage/in-doubt/{name}",
        operation="rollback",
        says=lambda name, _, n: (
            f"Roll back in-doubt transaction {name}: its {n} prepared message(s) are "
            "discarded and the messages it acknowledged are available again."
        ),
        counts="messages",
        back="/transactions",
    ),
    "enable-connector": Action(
        path="/sys$routing/usage/connectors/{name}",
        operation="enable",
        says=lambda name, _, n: f"Enable routing connector {name}: it dials its router again.",
        back="/routing",
    ),
    "disable-connector": Action(
        path="/sys$routing/usage/connectors/{name}",
        operation="disable",
        says=lambda name, _, n: (
            f"Disable routing connector {name}: its link is closed and messages for the "
            "routers behind it wait in their routing queues (or take another route)."
        ),
        back="/routing",
    ),
    "delete-durable": Action(
        path="/sys$topicmanager/usage/durable-subscribers/{name}",
        operation="delete",
        says=lambda name, _, n: f"Delete durable subscription {name} and the {n} message(s) it holds.",
        counts="messages",
        back="/topics",
    ),
}


async def _form(request: Request) -> dict[str, str] | None:
    """The posted form's fields (the last of a repeated one); None when it is not a form or
    is longer than :data:`FORM_MAX` (read no further: the body is bounded)."""
    if request.headers.get("content-type", "").partition(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX:
            return None
    try:
        return dict(parse_qsl(body.decode(), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return None


def _request(action: Action, name: str, fields: Mapping[str, str]) -> dict[str, Any]:
    if action.remove_from:
        return {"verb": "remove", "path": action.remove_from, "name": name, "force": True}
    path = action.path.format(name=name)
    return {"verb": "invoke", "path": path, "operation": action.operation, "args": dict(fields), "force": True}


async def act(console: Console, request: Request) -> Response:
    """``POST /routers/{router}/act`` (see the module header)."""
    router = request.path_params["name"]
    local = console.local
    viewer = viewer_of(request)

    def refused(status: int, reason: str) -> Response:
        return page(local, "Refused", f'<p class="refused">{esc(reason)}</p>', router=router, status=status)

    given = await _form(request)
    if given is None:
        return refused(400, f"a form of at most {FORM_MAX} bytes, application/x-www-form-urlencoded, is expected")
    reason = console.guard.refusal(request, given.get("token", ""))
    if reason is not None:
        console.context.log.warning("web: %s from %s: %s", viewer.user or "(no user)", viewer.host, reason)
        return refused(403, reason)
    action = ACTIONS.get(given.get("action", ""))
    name = given.get("name", "")
    if action is None or not name or "/" in name:
        return refused(400, f"unknown action {given.get('action', '')!r}, or no entity (or one with a /) named")
    fields = {field: given.get(field, "").strip() for field in action.fields}
    missing = [field for field, value in fields.items() if not value and field != "selector"]
    if missing:
        return refused(400, f"{given['action']} needs {', '.join(missing)}")
    if given.get("confirmed") != "yes":
        if router == local and not console.may_change(viewer):
            return refused(403, f"{viewer.user or 'you'} may not change router {router} (role: not read-write)")
        return await _confirmation(console, router, action, name, fields, given)
    reply = await console.request(viewer, router, _request(action, name, fields), timeout=ACTION_TIMEOUT)
    status = int(reply.get("status", Status.ERROR))
    back = router_url(router, action.back.format(name=name))
    if status != Status.OK:
        return page(
            local,
            "Refused",
            f'<p class="refused">{esc(reply.get("error", ""))}</p><p>{link(back, "back")}</p>',
            router=router,
            status=status,
        )
    result = reply.get("result")
    shown = result if isinstance(result, str) else json.dumps(result, indent=1)
    return page(local, "Done", f'<p class="done">{esc(shown)}</p><p>{link(back, "back")}</p>', router=router)


async def _confirmation(
    console: Console, router: str, action: Action, name: str, fields: Mapping[str, str], given: Mapping[str, str]
) -> Response:
    messages: Any = "?"
    if action.counts:
        try:
            messages = (await console.values(router, action.path.format(name=name))).get(action.counts, "?")
        except RequestFailed as exc:
            return page(
                console.local, "Refused", f'<p class="refused">{esc(exc.reason)}</p>', router=router, status=exc.status
            )
    hidden = "".join(
        f'<input type="hidden" name="{esc(key)}" value="{esc(value)}">'
        for key, value in given.items()
        if key in ("token", "action", "name", *action.fields)
    )
    back = router_url(router, action.back.format(name=name))
    body = (
        f'<p id="confirm-text">{esc(action.says(name, fields, messages))}</p>'
        f'<form method="post" action="{esc(router_url(router, "/act"))}">{hidden}'
        '<input type="hidden" name="confirmed" value="yes">'
        f'<button type="submit" id="confirm">Yes, do it</button> {link(back, "cancel")}</form>'
    )
    return page(console.local, f"Confirm on router {router}", body, router=router)
