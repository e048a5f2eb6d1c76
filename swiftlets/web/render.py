"""HTML of ``sys$web``'s pages: the frame, tables, and the forms of management actions.

Everything is built as text with every value escaped here, so a queue, user or router name
with markup in it is shown, never run. Pages carry no script but the map's, no external
stylesheet, font or script (a page must work with no network beyond the router).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from starlette.responses import HTMLResponse

__all__ = ["STYLE", "Markup", "page", "table", "cell", "link", "action_form", "esc", "router_url"]

STYLE = """
body { font-family: sans-serif; margin: 1em 2em; color: #222; }
nav a { margin-right: 1em; }
nav.router { margin: 0.5em 0 1em; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; }
form.action { display: inline; margin: 0 0.2em; }
p.refused { color: #d00000; }
p.done { color: #2a7a30; }
pre { white-space: pre-wrap; max-width: 60em; margin: 0; }
svg .edge { stroke-width: 4; }
svg text.rate { font-size: 12px; fill: currentColor; stroke: #fff; }
svg text.backlog { font-size: 12px; fill: #555; }
svg text { font-size: 14px; text-anchor: middle; paint-order: stroke; stroke: #fff; stroke-width: 4px; }
.state-operational { stroke: #2a9d3a; color: #2a9d3a; }
.state-connecting, .state-waiting { stroke: #e0a000; color: #b08000; }
.state-failed, .state-down { stroke: #d00000; color: #d00000; }
.state-closed, .state-disabled { stroke: #888888; color: #666666; }
circle.router { stroke: #333; stroke-width: 2; }
circle.state-local { fill: #4a78c8; }
circle.state-reachable { fill: #2a9d3a; }
circle.state-unreachable { fill: #d00000; }
"""

#: The pages of every router, as its navigation bar links them: (path below the router, title).
ROUTER_PAGES = (
    ("", "overview"),
    ("/queues", "queues"),
    ("/connections", "connections"),
    ("/routing", "routing"),
    ("/topics", "topics"),
    ("/transactions", "transactions"),
)


def esc(value: Any) -> str:
    return html.escape(str(value))


def router_url(router: str, rest: str = "") -> str:
    return "/routers/" + quote(router, safe="") + rest


def page(
    local: str, title: str, body: str, *, router: str | None = None, refresh: int = 0, status: int = 200
) -> HTMLResponse:
    """A whole page of router ``local``'s web view; ``router``: the router it is about (its
    pages' links are shown); ``refresh``: seconds between reloads (0: none)."""
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    pages = ""
    if router is not None:
        pages = '<nav class="router">' + "".join(link(router_url(router, rest), name) for rest, name in ROUTER_PAGES)
        pages += "</nav>"
    return HTMLResponse(
        f'<!doctype html><html><head><meta charset="utf-8">{meta}<title>{esc(title)}</title>'
        f'<style>{STYLE}</style></head><body><nav><a href="/">network map</a>'
        f'<a href="{router_url(local)}">router {esc(local)}</a><a href="/metrics">metrics</a>'
        f"</nav><h1>{esc(title)}</h1>{pages}{body}</body></html>",
        status_code=status,
    )


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


class Markup(str):
    """Text that is HTML already (a link, a form): :func:`cell` puts it in as it is."""


def cell(value: Any) -> str:
    if isinstance(value, Markup):
        return f"<td>{value}</td>"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    return f"<td>{esc(value)}</td>"


def table(table_id: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> str:
    rows = list(rows)
    if not rows:
        return f'<p id="{esc(table_id)}">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(value) for value in row) + "</tr>" for row in rows)
    return f'<table id="{esc(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def action_form(
    router: str, action: str, name: str, token: str, label: str, fields: Mapping[str, str] | None = None
) -> Markup:
    """A button posting management ``action`` on entity ``name`` of ``router``: the post
    asks for a confirmation first (:mod:`.actions`). ``fields``: text inputs (name ->
    placeholder), e.g. a move's target."""
    inputs = "".join(
        f'<input name="{esc(field)}" placeholder="{esc(hint)}" size="14">' for field, hint in (fields or {}).items()
    )
    return Markup(
        f'<form class="action" method="post" action="{esc(router_url(router, "/act"))}">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        f'<input type="hidden" name="action" value="{esc(action)}">'
        f'<input type="hidden" name="name" value="{esc(name)}">'
        f'{inputs}<button type="submit" data-action="{esc(action)}" data-name="{esc(name)}">'
        f"{esc(label)}</button></form>"
    )
