"""The queue pages: a router's queues, application and system ones apart, and one queue
with its messages.

System queues are those whose name has a ``$`` (every name the router makes has one:
``tmp$`` temporary, ``rt$`` routing, ``sys$`` the router's own, ``tpc$`` topic brokers,
``clientid$name`` durable subscriptions); a user's queue name cannot have one. The
router's ``unroutable`` and ``routerdlq`` hold applications' messages, and show with theirs.

A queue's messages are browsed with its ``view`` operation through ``sys$mgmt`` as the
viewer (nothing is consumed), :data:`PAGE` at a time. ``view`` is invoked, so ``sys$mgmt``
lets only a read-write role see message contents, as in ``martinet admin``: a read-only
viewer gets the refusal in place of the messages.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from martinet.swiftlets.mgmt.api import RequestFailed, Status

from .auth import viewer_of
from .console import Console
from .pages import section
from .render import Markup, action_form, esc, link, page, router_url, table

__all__ = ["kind", "queues_page", "queue_page", "PAGE"]

PAGE = 20  # messages per page of a queue
QUEUES = "/sys$queuemanager/usage/queues"

#: Name prefixes of system queues and what they are.
PREFIXES = {"tmp$": "temporary", "rt$": "routing", "sys$": "system", "tpc$": "topic"}
#: The filters of the queue list: ?show=…
SHOWN = ("application", "system", "all")


def kind(name: str) -> str:
    """``application`` for a user's queue, else what kind of system queue it is."""
    for prefix, what in PREFIXES.items():
        if name.startswith(prefix):
            return what
    return "subscription" if "$" in name else "application"


async def queues_page(console: Console, request: Request) -> Response:
    """``/routers/{name}/queues?show=application|system|all``."""
    router = request.path_params["name"]
    shown = request.query_params.get("show", "application")
    if shown not in SHOWN:
        shown = "application"
    filters = " ".join(
        esc(name) if name == shown else link(router_url(router, f"/queues?show={name}"), name) for name in SHOWN
    )

    def keep(name: str) -> bool:
        return shown == "all" or (kind(name) == "application") == (shown == "application")

    body = f'<p id="filter">show: {filters}</p>' + await section(
        console,
        router,
        f"Queues ({shown})",
        "queues",
        QUEUES,
        ["messages", "consumers", "enqueued", "dequeued", "send-rate", "receive-rate"],
        f"no {shown} queues" if shown != "all" else "no queues",
        name_link=lambda name: router_url(router, "/queues/" + quote(name, safe="")),
        keep=keep,
    )
    return page(console.local, f"Queues of {router}", body, router=router)


async def queue_page(console: Console, request: Request) -> Response:
    """``/routers/{name}/queues/{queue}?start=N``: the queue's figures, its actions, and its
    messages from the N-th on."""
    router, queue = request.path_params["name"], request.path_params["queue"]
    title = f"Queue {queue} on {router}"
    try:
        values = await console.values(router, f"{QUEUES}/{queue}")
    except RequestFailed as exc:
        return page(console.local, title, f'<p class="refused">{esc(exc.reason)}</p>', router=router, status=404)
    try:
        start = max(0, int(request.query_params.get("start", "0")))
    except ValueError:
        start = 0
    facts = [[key, value] for key, value in values.items()]
    body = f"<p>kind: {esc(kind(queue))}</p>" + table("figures", ["property", "value"], facts, "")
    viewer = viewer_of(request)
    if console.may_change(viewer):
        token = console.token(viewer)
        body += (
            '<h2>Actions</h2><p id="actions">'
            + action_form(router, "purge", queue, token, "purge")
            + action_form(router, "move", queue, token, "move", {"target": "queue or q@router", "selector": "selector"})
            + (action_form(router, "delete-queue", queue, token, "delete") if kind(queue) == "application" else "")
            + "</p>"
        )
    body += await _messages(console, request, router, queue, start, int(values.get("available", 0) or 0))
    return page(console.local, title, body, router=router)


async def _messages(console: Console, request: Request, router: str, queue: str, start: int, available: int) -> str:
    reply = await console.request(
        viewer_of(request),
        router,
        {"verb": "invoke", "path": f"{QUEUES}/{queue}", "operation": "view", "args": {"start": start, "count": PAGE}},
    )
    if reply.get("status") != Status.OK:
        return f'<h2>Messages</h2><p id="messages" class="refused">not shown: {esc(reply.get("error", ""))}</p>'
    rows: list[list[Any]] = []
    for message in reply["result"]:
        rows.append(
            [
                message["id"],
                message["priority"],
                message["delivery-count"],
                message["size"],
                message["message-id"],
                message["correlation-id"],
                Markup(f"<pre>{esc(_json(message['properties']))}</pre>"),
                Markup(f"<pre>{esc(_json(message['body']))}</pre>"),
            ]
        )
    here = router_url(router, "/queues/" + quote(queue, safe=""))
    pages = []
    if start > 0:
        pages.append(link(f"{here}?start={max(0, start - PAGE)}", "previous"))
    if start + PAGE < available:
        pages.append(link(f"{here}?start={start + PAGE}", "next"))
    shown = f"{start + 1}–{start + len(rows)} of {available}" if rows else ""
    columns = ["id", "priority", "delivery-count", "size", "message-id", "correlation-id", "properties", "body"]
    return (
        f"<h2>Messages {esc(shown)}</h2>"
        + table("messages", columns, rows, "no messages")
        + f'<p id="pages">{" ".join(pages)}</p>'
    )


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
