"""The pages of one router (this one or any other, :mod:`.console`): an overview, and one
page per area that shows its entities with the actions a read-write viewer may take
(:mod:`.actions`). Queues have their own module (:mod:`.queues`).

A page with buttons does not reload itself (a half-typed move target would be lost); the
overview, which has none, reloads every 5 s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import Response

from martinet.kernel import ManagementError, Usage
from martinet.swiftlets.mgmt.api import RequestFailed

from .auth import viewer_of
from .console import Console
from .history import LISTED, PER_MINUTE, POINTS, TRACKED, sparkline
from .render import Markup, action_form, esc, link, page, table

__all__ = ["section", "router_page", "AREA_PAGES"]

#: Buttons of one entity: (entity name, its values) -> the cell with its forms.
Buttons = Callable[[str, Mapping[str, Any]], Markup]

REFRESH = 5  # seconds between reloads of the overview


async def together(*parts: Awaitable[str]) -> str:
    """The sections ``parts``, asked at once (another router's each take one request, and
    one that does not answer costs one timeout, not one per section), in their order."""
    done = [""] * len(parts)

    async def one(index: int, part: Awaitable[str]) -> None:
        done[index] = await part

    async with trio.open_nursery() as nursery:
        for index, part in enumerate(parts):
            nursery.start_soon(one, index, part)
    return "".join(done)


async def section(
    console: Console,
    router: str,
    title: str,
    table_id: str,
    path: str,
    columns: Sequence[str],
    empty: str,
    *,
    buttons: Buttons | None = None,
    name_link: Callable[[str], str] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> str:
    """A titled table of the usage list at ``path`` of ``router``: name and ``columns``, and
    the ``buttons`` column when given; ``keep``: which entries are shown (by name)."""
    try:
        entries = await console.entries(router, path)
    except RequestFailed as exc:
        return f'<h2>{esc(title)}</h2><p id="{esc(table_id)}">not available: {esc(exc.reason)}</p>'
    tracked = [column for column in TRACKED.get(path, ()) if column in columns]
    series, span = await _hour(console, router, path) if tracked else (None, POINTS)
    if series is None:
        tracked = []
    rows = []
    for name, values in entries.items():
        if keep is not None and not keep(name):
            continue
        first: Any = Markup(link(name_link(name), name)) if name_link is not None else name
        row = [first, *(values.get(column, "") for column in columns)]
        row.extend(Markup(sparkline(series(name, column), span)) for column in tracked if series)
        if buttons is not None:
            row.append(buttons(name, values))
        rows.append(row)
    head = ["name", *columns, *(f"{column}, last hour" for column in tracked)]
    head += ["actions"] if buttons is not None else []
    return f"<h2>{esc(title)}</h2>" + table(table_id, head, rows, empty)


async def _hour(console: Console, router: str, path: str) -> tuple[Callable[[str, str], Sequence[float]] | None, int]:
    """The last hour of the rates and backlogs of the usage list at ``path`` of ``router``:
    ``(series(entry, value), intervals drawn)``. This router's are kept here; another's are
    asked of its own web view (a point a minute): None if it runs no sys$web or does not answer."""
    if router == console.local:
        history = console.web.history
        return (lambda name, column: history.series(path, name, column)), POINTS
    try:
        minutes = await console.entries(router, "/sys$web/usage/" + LISTED[path])
    except RequestFailed:
        return None, POINTS
    return (lambda name, column: minutes.get(name, {}).get(column, ())), POINTS // PER_MINUTE


def buttons_for(console: Console, request: Request, router: str, *offered: tuple[str, str]) -> Buttons | None:
    """Buttons posting ``offered`` ((action, label) pairs) for each entity, for a viewer who
    may change this router; None (no column) for any other."""
    viewer = viewer_of(request)
    if not console.may_change(viewer):
        return None
    token = console.token(viewer)
    return lambda name, _: Markup("".join(action_form(router, action, name, token, label) for action, label in offered))


async def router_page(console: Console, request: Request) -> Response:
    """``/routers/{name}``: what this router knows of it, its queues, connections and routing."""
    router = request.path_params["name"]
    local, web = console.local, console.web
    if router != local and web.network_map().router(router) is None:
        return page(local, f"Router {router}", f"<p>{esc(local)} knows no router {esc(router)}.</p>")
    queues = "/sys$queuemanager/usage/queues"
    columns = ["messages", "consumers", "enqueued", "dequeued", "send-rate", "receive-rate"]
    parts = [
        section(console, router, "Queues", "queues", queues, columns, "no queues"),
        section(console, router, "Client connections", "connections", *CONNECTIONS),
    ]
    if router == local:  # (another router's routing: its routing page)
        parts.append(section(console, router, "Routing connectors", "connectors", *CONNECTORS))
        parts.append(section(console, router, "Routing links", "links", *LINKS))
        parts.append(section(console, router, "Routing table", "routing-table", *TABLE))
    body = (_known(console, router) if router != local else "") + await together(*parts)
    return page(local, f"Router {router}", body, router=router, refresh=REFRESH)


CONNECTIONS = (
    "/sys$jms/usage/connections",
    ["listener", "host", "user", "client-id", "messages-received", "messages-sent", "receive-rate", "send-rate"],
    "no client connections",
)
CONNECTORS = (
    "/sys$routing/usage/connectors",
    ["state", "hostname", "port", "routername", "last-error", "next-attempt"],
    "no connectors",
)
LINKS = (
    "/sys$routing/usage/connections",
    [
        "routername",
        "state",
        "messages-out-rate",
        "messages-in-rate",
        "window",
        "transactions-in-flight",
        "round-trip-ms",
    ],
    "no routing links",
)
TABLE = ("/sys$routing/usage/routing-table", ["active", "next-hop", "routes", "static", "backlog"], "no known routers")


def _known(console: Console, router: str) -> str:
    """What this router knows of another one: its routes and its links on the map."""
    known = console.web.network_map().router(router)
    assert known is not None
    row: Mapping[str, Any] = {}
    try:
        entry = console.context.management.resolve(f"/sys$routing/usage/routing-table/{router}")
        assert isinstance(entry, Usage)  # an entry of sys$routing's routing table
        row = entry.properties()
    except ManagementError:
        pass
    facts: list[list[Any]] = [
        ["state", known.state],
        ["hops", known.hops if known.hops is not None else ""],
        *([key, value] for key, value in row.items()),
    ]
    edges = [[f"{e.a} – {e.b}", e.state, e.error] for e in console.web.network_map().edges if router in e.key]
    asked = (
        "Its pages are asked of it through sys$mgmt."
        if console.web.management is not None
        else "Its queues and connections are shown by its own web view (sys$mgmt does not run here)."
    )
    return (
        f"<p>What {esc(console.local)} knows of {esc(router)}. {asked}</p>"
        + table("facts", ["property", "value"], facts, "")
        + "<h2>Links</h2>"
        + table("links-known", ["link", "state", "error"], edges, "no links known")
    )


async def connections_page(console: Console, request: Request) -> Response:
    router = request.path_params["name"]
    buttons = buttons_for(console, request, router, ("close-connection", "close"))
    body = await section(console, router, "Client connections", "connections", *CONNECTIONS, buttons=buttons)
    return page(console.local, f"Connections of {router}", body, router=router)


async def routing_page(console: Console, request: Request) -> Response:
    router = request.path_params["name"]
    switch = buttons_for(console, request, router, ("enable-connector", "enable"), ("disable-connector", "disable"))
    body = await together(
        section(console, router, "Routing connectors", "connectors", *CONNECTORS, buttons=switch),
        section(console, router, "Routing links", "links", *LINKS),
        section(console, router, "Routing table", "routing-table", *TABLE),
    )
    return page(console.local, f"Routing of {router}", body, router=router)


async def topics_page(console: Console, request: Request) -> Response:
    router = request.path_params["name"]
    delete = buttons_for(console, request, router, ("delete-durable", "delete"))
    topics = "/sys$topicmanager/usage/"
    body = await together(
        section(
            console,
            router,
            "Root topics",
            "topics",
            topics + "topics",
            ["subscriptions", "durable-subscriptions", "published", "remote-published", "deliveries", "dropped"],
            "no topics in use",
        ),
        section(
            console,
            router,
            "Durable subscriptions",
            "durables",
            topics + "durable-subscribers",
            ["client-id", "name", "topic", "selector", "no-local", "messages", "consumers"],
            "no durable subscriptions",
            buttons=delete,
        ),
        _subscriptions(console, router),
        _interest(console, router),
    )
    return page(console.local, f"Topics of {router}", body, router=router)


async def _subscriptions(console: Console, router: str) -> str:
    """The topic hierarchy in use: every subscription (durable or not) under each root,
    sorted by topic name so that a topic's subtopics and wildcards follow it, indented by
    their depth."""
    title = "<h2>Subscriptions by topic</h2>"
    topics = "/sys$topicmanager/usage/topics"
    try:
        roots = await console.entries(router, topics)
    except RequestFailed as exc:
        return f'{title}<p id="subscriptions">not available: {esc(exc.reason)}</p>'
    found: list[dict[str, Any]] = []

    async def under(root: str) -> None:
        try:
            found.extend((await console.entries(router, f"{topics}/{root}/subscriptions")).values())
        except RequestFailed:  # gone meanwhile
            pass

    async with trio.open_nursery() as nursery:
        for root in roots:
            nursery.start_soon(under, root)
    columns = ["durable", "client-id", "name", "selector", "no-local", "queue", "messages", "consumers"]
    rows = [
        [Markup("&#160;&#160;" * str(values["topic"]).count(".") + esc(values["topic"]))]
        + [values.get(column, "") for column in columns]
        for values in sorted(found, key=lambda values: str(values.get("topic", "")).split("."))
    ]
    return title + table("subscriptions", ["topic", *columns], rows, "no subscriptions")


INTEREST = "/sys$topicmanager/usage/remote-router-subscriptions"


async def _interest(console: Console, router: str) -> str:
    """Remote routers' interest: a row per router and root topic it has subscribers under,
    with what was forwarded there."""
    title = "<h2>Remote routers' interest</h2>"
    try:
        routers = await console.entries(router, INTEREST)
    except RequestFailed as exc:
        return f'{title}<p id="interest">not available: {esc(exc.reason)}</p>'
    found: dict[str, dict[str, dict[str, Any]]] = {}

    async def roots_of(remote: str) -> None:
        try:
            found[remote] = await console.entries(router, f"{INTEREST}/{remote}/topics")
        except RequestFailed:  # gone meanwhile
            pass

    async with trio.open_nursery() as nursery:
        for remote in routers:
            nursery.start_soon(roots_of, remote)
    columns = ["forwarded", "unroutable", "static", "keep-on-unsubscribe"]
    rows = [
        [remote, root, *(values.get(column, "") for column in columns)]
        for remote, roots in sorted(found.items())
        for root, values in roots.items()
    ]
    return title + table("interest", ["router", "root topic", *columns], rows, "no remote router has subscribers here")


async def transactions_page(console: Console, request: Request) -> Response:
    router = request.path_params["name"]
    resolve = buttons_for(console, request, router, ("commit", "commit"), ("rollback", "roll back"))
    columns = ["state", "owner", "peer", "prepared-at", "age", "queues", "messages", "acknowledgements"]
    body = await section(
        console,
        router,
        "In-doubt XA transactions",
        "in-doubt",
        "/sys$xa/usage/in-doubt",
        columns,
        "no in-doubt transactions",
        buttons=resolve,
    )
    return page(console.local, f"Transactions of {router}", body, router=router)


#: The area pages: path below ``/routers/{name}`` -> handler.
AREA_PAGES = {
    "/connections": connections_page,
    "/routing": routing_page,
    "/topics": topics_page,
    "/transactions": transactions_page,
}
