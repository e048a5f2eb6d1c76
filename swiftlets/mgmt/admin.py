"""``martinet admin``: manage every router of a network from one connection.

    martinet admin -u amqp://127.0.0.1:5672                 # the interactive shell
    martinet admin -u amqp://127.0.0.1:5672 map --dot       # one command, for scripts
    martinet admin -r paris --json show '/sys$queuemanager/usage/queues'

Theory of operation
-------------------
The tool connects to one router with our client (:class:`.client.AdminClient`); every
command becomes requests to ``sys$mgmt`` of the router in context (``sr ROUTER`` or ``-r``),
which the connected router routes there. Commands (SwiftMQ's CLI in a Python way, plus
``qpid-route``'s views of the network) are coroutines of :class:`Commands` that return an
:class:`Output`: the data ``--json`` prints, and rich renderables (tables) for people.

The shell is the standard library's :mod:`cmd` with :mod:`readline`: history kept in
``~/.martinet_admin_history``, tab completion of commands and of tree paths (asked from the
router). It runs in a worker thread of the trio program and hands each command to the trio
thread with ``trio.from_thread.run``, so the connection and its reply dispatcher keep running
while the shell waits for input. (prompt_toolkit would give more, at the price of a
dependency; readline's line editing, history and completion are what SwiftMQ's shell has.)

Exit status of a one-shot command: 0 done, 1 the router refused or failed it (the reason
is printed), 2 bad usage or no connection.
"""

from __future__ import annotations

import argparse
import cmd
import json
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from martinet.kernel import Command
from martinet.messaging.client import JMSError
from martinet.messaging.like import LikePatternError, like_pattern

from .api import NetworkMap, Status
from .api import crawl as api_crawl
from .client import DEFAULT_TIMEOUT, AdminClient, AdminError

__all__ = ["ADMIN_COMMAND", "Commands", "Output", "crawl", "NetworkMap", "to_dot"]

HISTORY = Path("~/.martinet_admin_history").expanduser()
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
NO_WRAP_WIDTH = 100_000  # columns given to output that is not a terminal: a table is never folded

#: Columns shown for well-known usage lists (others show every property).
COLUMNS = {
    "/sys$queuemanager/usage/queues": (
        "messages",
        "available",
        "consumers",
        "enqueued",
        "dequeued",
        "send-rate",
        "receive-rate",
        "bytes",
    ),
    "/sys$jms/usage/connections": (
        "listener",
        "host",
        "user",
        "client-id",
        "connected-since",
        "links",
        "messages-received",
        "messages-sent",
        "receive-rate",
        "send-rate",
    ),
    "/sys$routing/usage/routing-table": ("active", "next-hop", "static", "backlog"),
}
SHORTCUTS = {
    "queues": "/sys$queuemanager/usage/queues",
    "connections": "/sys$jms/usage/connections",
    "xa": "/sys$xa/usage/in-doubt",
}


class UsageError(Exception):
    """A command was given wrong arguments; the message says how to call it."""


@attrs.frozen
class Output:
    """What a command produced: ``data`` for ``--json``, ``views`` (rich renderables or
    text) for people."""

    data: Any
    views: tuple[Any, ...] = ()


def _table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):  # names whole, values folded when the terminal is narrow
        table.add_column(column, overflow="fold", no_wrap=index == 0)
    for row in rows:  # Text: a value is shown as it is, never read as rich markup ("[repeat <n>]")
        table.add_row(*(Text("" if value is None else str(value)) for value in row))
    return table


def join(base: str, path: str) -> str:
    """``path`` resolved against the context ``base`` (``..`` goes up)."""
    parts = [] if path.startswith("/") else [p for p in base.split("/") if p]
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def _assignments(words: Sequence[str]) -> dict[str, str]:
    found = {}
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or not name:
            raise UsageError(f"expected name=value, found {word!r}")
        found[name] = value
    return found


# -- the network map --------------------------------------------------------------------------------


async def crawl(admin: AdminClient, start: str | None = None) -> NetworkMap:
    """:func:`.api.crawl` over ``admin``'s connection, from ``start`` (default: the router
    connected to)."""
    return await api_crawl(admin.call, start or admin.router)


_DOT_COLOURS = {
    "operational": "darkgreen",
    "connecting": "orange",
    "waiting": "orange",
    "failed": "red",
    "closed": "grey",
    "disabled": "grey",
}


def _quote(text: str) -> str:
    """A DOT quoted string (a router name may hold any character but '/')."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(network: NetworkMap) -> str:
    """The map as a Graphviz digraph: routers (the start one doubled), links from the dialing
    router labelled and coloured by state, routers that did not answer dashed."""
    lines = ["digraph martinet {", "  rankdir=LR;", "  node [shape=box, style=rounded];"]
    for router, hops in network.routers.items():
        where = "start" if router == network.start else "no route" if not hops else f"{hops} hop{'s' * (hops > 1)}"
        style = ", peripheries=2" if router == network.start else ""
        style += ", style=dashed" if router in network.unreachable else ""
        lines.append(f'  {_quote(router)} [label="{_quote(router)[1:-1]}\\n{where}"{style}];')
    for link in network.links:
        colour = _DOT_COLOURS.get(link.state, "black")
        lines.append(
            f"  {_quote(link.source)} -> {_quote(link.target)} "
            f"[label={_quote(link.state)}, color={colour}, fontcolor={colour}];"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- commands ---------------------------------------------------------------------------------------


class Commands:
    """The commands, on one :class:`AdminClient`, with the context (router and path) the
    shell keeps. Each ``cmd_<name>(args)`` returns an :class:`Output` or raises
    :class:`UsageError` or :class:`AdminError`."""

    def __init__(self, admin: AdminClient, router: str | None = None):
        self.admin = admin
        self.router = router or admin.router
        self.path = "/"
        self.watch_limit: int | None = None  # stop a watch after so many notifications (scripts)
        self.json = False  # watch prints each notification as JSON
        self.force = False  # destructive commands go ahead without asking (one-shot --force)
        # asks the operator to confirm what a destructive command would destroy (the shell);
        # None: such a command is refused, with what it would destroy (one-shot without --force)
        self.ask: Callable[[str], Awaitable[bool]] | None = None
        self._forced = False  # this command's: --force among its words, or self.force
        self._network = NetworkViews(self)

    @property
    def names(self) -> list[str]:
        return sorted(name[4:] for part in (self, self._network) for name in dir(part) if name.startswith("cmd_"))

    def handler(self, name: str) -> Callable[[list[str]], Awaitable[Output]] | None:
        """The command ``name`` (its docstring is its help), or None."""
        return getattr(self, f"cmd_{name}", None) or getattr(self._network, f"cmd_{name}", None)

    async def run(self, line: Sequence[str]) -> Output:
        if not line:
            raise UsageError("no command")
        name, *args = line
        handler = self.handler(name)
        if handler is None:
            raise UsageError(f"unknown command {name!r}; commands: {', '.join(self.names)}")
        self._forced = self.force or "--force" in args
        try:
            return await handler([arg for arg in args if arg != "--force"])
        except BaseExceptionGroup as group:  # a command's tasks (a watch) fail as a group: one line
            raise _first_leaf(group) from None

    def _path(self, args: Sequence[str], index: int = 0) -> str:
        return join(self.path, args[index]) if len(args) > index else self.path

    async def call(self, verb: str, **args: Any) -> Any:
        """``verb`` with ``args`` on the current router; its result."""
        return await self.admin.call(self.router, verb, **args)

    async def _destructive(self, verb: str, **args: Any) -> tuple[bool, Any]:
        """A request that may destroy messages or stop the router: the router refuses it
        (CONFLICT, saying what would go) unless forced; the shell then asks the operator and
        repeats it forced. (done, result): not done when the operator declined.

        Raises:
            AdminError: refused (one-shot without --force: the router's reason and how to force).
        """
        if self._forced:
            return True, await self.call(verb, force=True, **args)
        try:
            return True, await self.call(verb, **args)
        except AdminError as exc:
            if exc.status != Status.CONFLICT:
                raise
            if self.ask is None:
                raise AdminError(exc.status, f"{exc.reason}; add --force to do it", exc.router) from None
            if not await self.ask(
                f"{exc.router}: {exc.reason.partition(': not done without force')[0]}. Do it? [y/N] "
            ):
                return False, None
        return True, await self.call(verb, force=True, **args)

    async def children(self, path: str) -> list[str]:
        """The names below ``path`` (for completion); empty when it does not exist."""
        try:
            node = await self.call("get", path=path)
        except AdminError:
            return []
        return sorted(node.get("children") or node.get("entries") or {})

    async def cmd_ar(self, args: list[str]) -> Output:
        """ar: the available routers (this one and every router in its routing table)."""
        rows = await self.call("routers")
        return Output(
            rows,
            (
                _table(
                    f"routers available from {self.router}",
                    ["router", "hops", "next hop", "active"],
                    [[r["name"], r["hops"], r["next-hop"], r["active"]] for r in rows],
                ),
            ),
        )

    async def cmd_sr(self, args: list[str]) -> Output:
        """sr ROUTER: the router the next commands go to."""
        if len(args) != 1:
            raise UsageError("usage: sr ROUTER")
        await self.admin.call(args[0], "get", path="/usage")  # it must answer
        self.router, self.path = args[0], "/"
        return Output({"router": self.router}, (f"router {self.router}",))

    async def cmd_cc(self, args: list[str]) -> Output:
        """cc PATH: change the context (absolute, relative, or ..)."""
        if len(args) != 1:
            raise UsageError("usage: cc PATH")
        path = self._path(args)
        await self.call("get", path=path)  # it must exist
        self.path = path
        return Output({"path": path}, ())

    async def cmd_lc(self, args: list[str]) -> Output:
        """lc [PATH]: list the context's children, or a list's entries."""
        node = await self.call("get", path=self._path(args))
        names = node.get("children") or node.get("entries") or {}
        rows = [[name, kind if isinstance(kind, str) else "entry"] for name, kind in names.items()]
        return Output(node, (_table(node["path"], ["name", "kind"], rows),))

    async def cmd_show(self, args: list[str]) -> Output:
        """show [PATH]: the properties of an entity, or a list's entries as a table."""
        path = self._path(args)
        node = await self.call("get", path=path)
        return Output(node, _views(node))

    async def cmd_describe(self, args: list[str]) -> Output:
        """describe [PATH]: property declarations (of a list: of its entries) or operations."""
        node = await self.call("describe", path=self._path(args))
        views: list[Any] = []
        declared = node.get("properties") or node.get("item")
        if declared:
            views.append(
                _table(
                    node["path"],
                    ["property", "type", "default", "bounds", "description"],
                    [[name, d["type"], d.get("default"), _bounds(d), d["description"]] for name, d in declared.items()],
                )
            )
        for op in node.get("operations", ()):
            params = ", ".join(f"{p['name']}:{p['type']}" + ("" if p["required"] else "?") for p in op["parameters"])
            views.append(f"{op['name']}({params}): {op['description']}")
        return Output(node, tuple(views))

    async def cmd_set(self, args: list[str]) -> Output:
        """set [PATH] PROPERTY VALUE: change a property (of the context without PATH)."""
        if len(args) not in (2, 3):
            raise UsageError("usage: set [PATH] PROPERTY VALUE")
        path = self._path(args) if len(args) == 3 else self.path
        name, value = args[-2:]
        result = await self.call("set", path=path, name=name, value=value)
        note = " (takes effect at the next start: save and reboot)" if result["reboot-required"] else ""
        return Output(result, (f"{path} {name}: {result['old']} -> {result['new']}{note}",))

    async def cmd_new(self, args: list[str]) -> Output:
        """new LIST NAME [property=value ...]: add an entry to an entity list."""
        if len(args) < 2:
            raise UsageError("usage: new LIST NAME [property=value ...]")
        path = self._path(args)
        result = await self.call("add", path=path, name=args[1], values=_assignments(args[2:]))
        return Output(result, (f"{result['path']} added",))

    async def cmd_delete(self, args: list[str]) -> Output:
        """delete LIST NAME|LIKE: remove the entries whose names match (SQL LIKE: % any, _ one);
        on a usage list (connections, remote subscriptions), invoke their delete operation."""
        if len(args) != 2:
            raise UsageError("usage: delete LIST NAME|LIKE-PREDICATE")
        path = self._path(args)
        try:
            pattern = like_pattern(args[1])
        except LikePatternError as exc:
            raise UsageError(f"bad predicate {args[1]!r}: {exc}") from None
        node = await self.call("get", path=path)
        if node["kind"] not in ("entity-list", "usage-list"):
            raise UsageError(f"{path} is {node['kind']}; delete works on lists")
        names = []
        for name in [name for name in node["entries"] if pattern.matches(name)]:
            if node["kind"] == "entity-list":
                done, _ = await self._destructive("remove", path=path, name=name)
            else:
                done, _ = await self._destructive("invoke", path=f"{path.rstrip('/')}/{name}", operation="delete")
            if done:
                names.append(name)
        return Output(
            {"path": path, "deleted": names},
            (f"{path}: {len(names)} deleted" + (f": {', '.join(names)}" if names else ""),),
        )

    async def cmd_invoke(self, args: list[str]) -> Output:
        """invoke PATH OPERATION [argument=value ...]: run an operation of a usage entity
        (purge, move, view of a queue; delete of a connection; commit/rollback of an xid …)."""
        if len(args) < 2:
            raise UsageError("usage: invoke PATH OPERATION [argument=value ...]")
        done, result = await self._destructive(
            "invoke", path=self._path(args), operation=args[1], args=_assignments(args[2:])
        )
        if not done:
            return Output({"done": False}, ("not done",))
        return Output(result, (json.dumps(result, indent=2) if not isinstance(result, str) else result,))

    async def cmd_save(self, args: list[str]) -> Output:
        """save: write the router's live config to its file."""
        result = await self.call("save")
        return Output(result, (f"{self.router}: saved to {result['file']}",))

    async def cmd_reboot(self, args: list[str]) -> Output:
        """reboot: restart the router on its config file (save first to keep changes)."""
        result = await self.call("reboot")
        return Output(result, (f"{self.router}: rebooting",))

    async def cmd_halt(self, args: list[str]) -> Output:
        """halt: stop the router."""
        done, result = await self._destructive("halt")
        if not done:
            return Output({"done": False}, ("not done",))
        return Output(result, (f"{self.router}: halting",))

    async def _shortcut(self, path: str) -> Output:
        node = await self.call("get", path=path)
        return Output(node, _views(node))

    async def cmd_queues(self, args: list[str]) -> Output:
        """queues: the router's queues with backlog and rates."""
        return await self._shortcut(SHORTCUTS["queues"])

    async def cmd_connections(self, args: list[str]) -> Output:
        """connections: the router's client connections."""
        return await self._shortcut(SHORTCUTS["connections"])

    async def cmd_xa(self, args: list[str]) -> Output:
        """xa: the router's in-doubt transactions (invoke PATH commit|rollback to resolve one)."""
        return await self._shortcut(SHORTCUTS["xa"])

    async def cmd_watch(self, args: list[str]) -> Output:
        """watch [PATH] [--count N]: print the changes below PATH as they happen, until Ctrl-C
        (or N of them)."""
        path, count = _watch_arguments(args)
        path = join(self.path, path) if path is not None else self.path
        limit = count if count is not None else self.watch_limit
        seen: list[dict[str, Any]] = []
        # the watch is opened before any task starts, so a refusal (a bad path) is one plain error
        async with self.admin.watch(self.router, path) as notices:
            print(f"watching {self.router}:{path} (Ctrl-C ends)", flush=True)
            with trio.open_signal_receiver(signal.SIGINT) as interrupts:  # Ctrl-C ends the watch, not the shell
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._print_notices, notices, seen, limit, nursery.cancel_scope)
                    async for _ in interrupts:
                        break
                    nursery.cancel_scope.cancel()
        return Output(seen, ())

    async def _print_notices(
        self, notices: trio.MemoryReceiveChannel, seen: list[dict[str, Any]], limit: int | None, done: trio.CancelScope
    ) -> None:
        async for notice in notices:
            seen.append(notice)
            event = notice.get("event")
            if event is None:
                print(f"watch ended: {notice.get('ended')}", flush=True)
                break
            print(json.dumps(event) if self.json else _event_text(event), flush=True)
            if limit is not None and len(seen) >= limit:
                break
        done.cancel()


class NetworkViews:
    """The commands that show the network around the router of ``commands``: the routing
    tables, the links and the map (a crawl over the available routers)."""

    def __init__(self, commands: Commands):
        self._commands = commands

    async def cmd_routes(self, args: list[str]) -> Output:
        """routes: the routing table of every available router."""
        tables: dict[str, Any] = {}
        rows = []
        await self._need_routing()
        for router in [r["name"] for r in await self._commands.call("routers")]:
            try:
                table = (await self._commands.admin.call(router, "get", path="/sys$routing/usage/routing-table"))[
                    "entries"
                ]
            except AdminError as exc:  # a remote router that did not answer: the others are still shown
                table = {"error": exc.reason}
                rows.append([router, "", "", "", exc.reason])
            else:
                rows.extend(
                    [router, dest, row.get("next-hop"), row.get("active"), row.get("backlog", "")]
                    for dest, row in sorted(table.items())
                )
            tables[router] = table
        return Output(
            tables, (_table("routing tables", ["router", "destination", "next hop", "active", "backlog"], rows),)
        )

    async def _need_routing(self) -> None:
        """Refuse the routing views on a router without ``sys$routing``: it has nothing to
        show, and an error inside a table would look like an answer (and exit 0).

        Raises:
            AdminError: no ``sys$routing`` there.
        """
        root = await self._commands.call("get", path="/")
        if "sys$routing" not in root.get("children", {}):
            raise AdminError(
                400,
                f"router {self._commands.router} runs no sys$routing: it has no links or routes",
                self._commands.router,
            )

    async def cmd_links(self, args: list[str]) -> Output:
        """links: every link of every reachable router, with its state, since when, last error."""
        await self._need_routing()
        network = await crawl(self._commands.admin, self._commands.router)
        rows = [
            [link.source, link.target, link.connector, link.state, link.listener_state, link.since, link.error]
            for link in network.links
        ]
        rows += [[router, "", "", "no answer", "", "", reason] for router, reason in network.unreachable.items()]
        return Output(
            [attrs.asdict(link) for link in network.links],
            (
                _table(
                    "links (from the dialing router)",
                    ["router", "to", "connector", "state", "listener side", "since", "last error"],
                    rows,
                ),
            ),
        )

    async def cmd_map(self, args: list[str]) -> Output:
        """map [--dot]: the network from this router: routers with hop counts, links with state;
        --dot: as a Graphviz digraph (martinet admin map --dot | dot -Tsvg > map.svg)."""
        if args not in ([], ["--dot"]):
            raise UsageError("usage: map [--dot]")
        await self._need_routing()
        network = await crawl(self._commands.admin, self._commands.router)
        if args:
            dot = to_dot(network)
            return Output({**network.data(), "dot": dot}, (dot,))
        routers = _table(
            f"network seen from {network.start}",
            ["router", "hops", "links"],
            [
                [
                    router,
                    "start" if router == network.start else "no route" if hops is None else hops,
                    ", ".join(
                        f"{link.target if link.source == router else link.source} ({link.state})"
                        for link in network.links
                        if router in (link.source, link.target)
                    ),
                ]
                for router, hops in network.routers.items()
            ],
        )
        views: list[Any] = [routers]
        views += [f"{router}: no answer: {reason}" for router, reason in network.unreachable.items()]
        return Output(network.data(), tuple(views))


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    """The error to report of a group that trio's nurseries made of one command's failure:
    its first usage or admin error, else its first leaf (nested groups flattened)."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = exc.exceptions
        else:
            leaves.append(exc)
    return next((leaf for leaf in leaves if isinstance(leaf, (UsageError, AdminError))), leaves[0])


def _watch_arguments(args: Sequence[str]) -> tuple[str | None, int | None]:
    """``watch``'s path and ``--count`` (before or after the path: the one-shot command line
    hands everything after the command to the command).

    Raises:
        UsageError: anything else.
    """
    usage = "usage: watch [PATH] [--count N]"
    path: str | None = None
    count: int | None = None
    words = list(args)
    while words:
        word = words.pop(0)
        if word == "--count" or word.startswith("--count="):
            value = word.partition("=")[2] if "=" in word else (words.pop(0) if words else "")
            try:
                count = int(value)
            except ValueError:
                raise UsageError(usage) from None
            if count < 1:
                raise UsageError(f"{usage}: N must be 1 or more")
        elif path is None and not word.startswith("--"):
            path = word
        else:
            raise UsageError(usage)
    return path, count


def _event_text(event: dict[str, Any]) -> str:
    if event["type"] == "property-changed":
        return f"{event['path']} {event['name']}: {event['old']} -> {event['new']}"
    return f"{event['path']}/{event['name']} {event['type'].split('-')[1]}"


def _bounds(declared: dict[str, Any]) -> str:
    if "choices" in declared:
        return "|".join(declared["choices"])
    low, high = declared.get("min"), declared.get("max")
    return "" if low is None and high is None else f"{'' if low is None else low}..{'' if high is None else high}"


def _views(node: dict[str, Any]) -> tuple[Any, ...]:
    if "entries" in node:
        entries = node["entries"]
        columns = COLUMNS.get(node["path"].rstrip("/")) or sorted({key for entry in entries.values() for key in entry})
        return (
            _table(
                node["path"],
                ["name", *columns],
                [[name, *(entry.get(column) for column in columns)] for name, entry in entries.items()],
            ),
        )
    views: list[Any] = [_table(node["path"], ["property", "value"], list(node["properties"].items()))]
    if node.get("children"):
        views.append("children: " + ", ".join(node["children"]))
    if node.get("operations"):
        views.append("operations: " + ", ".join(node["operations"]))
    return tuple(views)


# -- the command line and the shell -----------------------------------------------------------------


def _print(output: Output, as_json: bool) -> None:
    from rich.console import Console

    try:
        if as_json:
            print(json.dumps(output.data, indent=2), flush=True)
            return
        # a terminal's width folds long values to fit; a pipe or a file has no width, and a
        # value folded over lines there breaks every grep and script reading it
        console = Console() if sys.stdout.isatty() else Console(width=NO_WRAP_WIDTH, soft_wrap=True)
        for view in output.views:
            console.print(view, highlight=False, markup=False) if isinstance(view, str) else console.print(view)
        sys.stdout.flush()
    except BrokenPipeError:  # `martinet admin … | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class Shell(cmd.Cmd):
    """The interactive shell; runs in a worker thread, each command in the trio thread."""

    def __init__(self, commands: Commands, as_json: bool):
        super().__init__()
        self.commands = commands
        self.as_json = as_json
        commands.ask = self._ask
        self._refresh_prompt()

    async def _ask(self, question: str) -> bool:
        """The operator's yes or no (asked from a worker thread: the shell's own thread waits
        for the command in the trio thread)."""
        return await trio.to_thread.run_sync(_yes, question)

    def _refresh_prompt(self) -> None:
        self.prompt = f"{self.commands.router}:{self.commands.path}> "

    def onecmd(self, line: str) -> bool:
        try:
            words = shlex.split(line)
        except ValueError as exc:
            print(f"error: {exc}")
            return False
        if not words:
            return False
        if words[0] in ("exit", "quit", "EOF"):
            return True
        if words[0] in ("help", "?"):
            self._help(words[1:])
            return False
        try:
            output = trio.from_thread.run(self.commands.run, words)
        except (UsageError, AdminError) as exc:
            print(f"error: {exc}")
        except Exception as exc:  # (a lost connection …): one line, and the shell goes on
            print(f"error: {_describe(exc)}")
        else:
            _print(output, self.as_json)
        self._refresh_prompt()
        return False

    def _help(self, names: list[str]) -> None:
        for name in names or self.commands.names:
            command = self.commands.handler(name)
            print(command.__doc__.split("\n")[0] if command is not None and command.__doc__ else f"no command {name!r}")
        if not names:
            print("exit: leave the shell")

    def completenames(self, text: str, *ignored: Any) -> list[str]:
        return [name + " " for name in [*self.commands.names, "help", "exit"] if name.startswith(text)]

    def completedefault(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        """Complete a tree path from the names the router reports below its parent."""
        if line.split()[0] == "sr":
            rows = trio.from_thread.run(self.commands.call, "routers")
            return [r["name"] for r in rows if r["name"].startswith(text)]
        head, _, stem = text.rpartition("/")
        base = join(self.commands.path, head or ("/" if text.startswith("/") else "."))
        names = trio.from_thread.run(self.commands.children, base)
        prefix = f"{head}/" if head or text.startswith("/") else ""
        return [f"{prefix}{name}/" for name in names if name.startswith(stem)]


def _yes(question: str) -> bool:
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:  # no answer is no
        return False


def _setup_readline() -> Any:
    try:
        import readline
    except ImportError:  # no readline on this Python: the shell works, without history
        return None
    readline.set_completer_delims(" \t\n")
    try:
        readline.read_history_file(HISTORY)
    except OSError:
        pass
    readline.set_history_length(1000)
    return readline


async def _main(args: argparse.Namespace) -> int:
    try:
        return await _session(args)
    except BaseExceptionGroup as group:  # the connection's own tasks failed under the command
        leaf = _first_leaf(group)
        if isinstance(leaf, (KeyboardInterrupt, trio.Cancelled)):
            raise
        print(f"error: {leaf}" if isinstance(leaf, AdminError) else f"error: {_describe(leaf)}", file=sys.stderr)
        return EXIT_FAILED


def _describe(exc: BaseException) -> str:
    """An unexpected error in one line: what failed, never a traceback."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _session(args: argparse.Namespace) -> int:
    try:
        async with AdminClient.open(args.url, user=args.user, password=args.password, timeout=args.timeout) as admin:
            commands = Commands(admin, args.router)
            commands.json = args.json
            commands.watch_limit = args.count
            commands.force = args.force
            if args.words:
                try:
                    output = await commands.run(args.words)
                except UsageError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return EXIT_USAGE
                except AdminError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return EXIT_FAILED
                _print(output, args.json)
                return EXIT_OK
            readline = _setup_readline()
            shell = Shell(commands, args.json)
            try:
                await trio.to_thread.run_sync(
                    shell.cmdloop, "martinet admin: 'help' lists the commands", abandon_on_cancel=True
                )
            finally:
                if readline is not None:
                    try:
                        readline.write_history_file(HISTORY)
                    except OSError:
                        pass
            return EXIT_OK
    except (JMSError, OSError) as exc:
        print(
            f"error: cannot connect to {args.url}: {_describe(exc) if isinstance(exc, OSError) else exc}",
            file=sys.stderr,
        )
        return EXIT_USAGE


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-u",
        "--url",
        default=os.environ.get("MARTINET_URL", "amqp://127.0.0.1:5672"),
        help="the router to connect to (default: $MARTINET_URL or amqp://127.0.0.1:5672)",
    )
    parser.add_argument("--user", default=os.environ.get("MARTINET_USER"), help="user name (default: $MARTINET_USER)")
    parser.add_argument(
        "--password", default=os.environ.get("MARTINET_PASSWORD"), help="password (default: $MARTINET_PASSWORD)"
    )
    parser.add_argument("-r", "--router", help="the router to manage (default: the one connected to)")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for each reply")
    parser.add_argument("--count", type=int, default=None, help="watch: stop after this many notifications")
    parser.add_argument(
        "--force",
        action="store_true",
        help="do a destructive command (delete of a queue holding messages, purge, halt, durable "
        "subscription delete, XA rollback) without asking; without it, the command is refused "
        "with what it would destroy",
    )
    parser.add_argument(
        "words",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="a command and its arguments (none: the interactive shell); 'help' in the shell "
        "lists them: ar sr lc cc show describe set new delete invoke save reboot halt queues "
        "connections xa routes links map watch",
    )


def _run(args: argparse.Namespace) -> int:
    try:
        return trio.run(_main, args)
    except KeyboardInterrupt:
        return EXIT_OK


ADMIN_COMMAND = Command(
    name="admin",
    help="manage the routers of a network over one connection (shell or one-shot commands)",
    configure=_configure,
    run=_run,
)
