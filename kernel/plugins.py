"""Swiftlet plugins: how the kernel finds the swiftlets it can start.

Theory of operation
-------------------
A swiftlet is contributed by a plugin: a module (or any object) implementing the pluggy
hook :func:`HookSpecs.martinet_swiftlets`, which returns :class:`SwiftletSpec` declarations.
Plugins are found through the entry-point group ``martinet.swiftlets`` — the built-in
swiftlets register there exactly as third-party packages do, so there is one loading path.

pluggy is synchronous, so hooks only *declare*: a spec carries the swiftlet's config class,
its pools and a factory. The kernel calls the factory with a
:class:`kernel.router.SwiftletContext` and starts the returned object's
``async def run(self, *, task_status)`` in the swiftlet's own nursery.

Each :class:`kernel.router.Router` builds its own plugin manager: there is no process-wide
registry, so routers with different plugin sets can share a process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
import pluggy
import trio

from .pools import PoolSpec
from .schema import fields_of, xml_name

if TYPE_CHECKING:
    from .router import SwiftletContext

__all__ = [
    "ENTRY_POINT_GROUP",
    "hookimpl",
    "hookspec",
    "Swiftlet",
    "SwiftletSpec",
    "PluginError",
    "load_swiftlet_specs",
    "load_plugins",
    "Plugins",
    "Command",
]

ENTRY_POINT_GROUP = "martinet.swiftlets"
hookspec = pluggy.HookspecMarker("martinet")
hookimpl = pluggy.HookimplMarker("martinet")

#: Names a swiftlet's config class may not use: the kernel owns these children.
RESERVED = frozenset({"name", "pools", "usage"})


class Swiftlet(Protocol):
    """What a swiftlet factory returns."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start, call ``task_status.started()`` once ready to serve, then run until cancelled.

        Cancellation is the stop signal: release resources in ``finally``; cleanup that must
        await runs under ``context.shutdown_scope()``. Raising before ``started()`` fails the
        router's start; raising (or returning) afterwards stops the router.
        """


@attrs.frozen(kw_only=True)
class SwiftletSpec:
    """A swiftlet a plugin offers.

    Attributes:
        name: the name used in ``startorder`` and ``<swiftlet name=…>``, e.g. ``sys$log``.
        description: one line for listings.
        config: the swiftlet's config class (see :mod:`kernel.schema`).
        factory: ``factory(context) -> Swiftlet``.
        pools: the pools the swiftlet uses, with their default sizes.
        hookspecs: a class of ``@hookspec`` methods the swiftlet calls on every plugin
            (``context.hook.<name>(...)``), as pytest's ``pytest_addhooks`` lets a plugin add
            hooks: e.g. ``sys$scheduler`` asks each plugin for the jobs it offers. The specs
            belong to the swiftlet's ``api`` module, where implementers find them.
        check: ``check(config, hook) -> problems``, the swiftlet's rules across swiftlets
            (e.g. a static remote subscription needs ``sys$routing``'s static route), run by
            :func:`~kernel.config.load_config` on a config whose elements are each valid, when
            the swiftlet is in the start order: ``config`` is the whole
            :class:`~kernel.config.RouterConfig`, ``hook`` the plugins' hooks or ``None`` (e.g.
            ``sys$scheduler`` asks them for the jobs a schedule names), each problem a
            :class:`~kernel.xmlconfig.ConfigProblem`, reported with file:line like any other.

    Other swiftlets reach a running swiftlet through ``context.lookup(name, kind)``, which
    returns the object the factory built once it has checked that the object provides
    ``kind``: the protocol the swiftlet publishes in its ``api`` module, its interface.
    """

    name: str
    description: str
    config: type
    factory: Callable[[SwiftletContext], Swiftlet]
    pools: Sequence[PoolSpec] = ()
    hookspecs: type | None = None
    check: Callable[[Any, Any], Iterable[Any]] | None = None


@attrs.frozen
class Plugins:
    """What :func:`load_plugins` found: the swiftlets by name, and the hooks to call on
    every plugin (the kernel's and those the swiftlets declared)."""

    specs: Mapping[str, SwiftletSpec]
    hook: pluggy.HookRelay


@attrs.frozen(kw_only=True)
class Command:
    """A subcommand a plugin adds to the ``martinet`` command (``martinet NAME …``).

    Attributes:
        name: the subcommand's name, e.g. ``schedule``.
        help: one line for ``martinet --help``.
        configure: ``configure(parser)`` declares its arguments on its argparse parser.
        run: ``run(args) -> exit status`` (0 fine, 1 failed, 2 invalid input).
    """

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class PluginError(Exception):
    """A plugin is broken: a bad declaration, or two plugins claim the same swiftlet name."""


class HookSpecs:
    """The hooks a Martinet plugin may implement."""

    @hookspec
    def martinet_swiftlets(self) -> Sequence[SwiftletSpec]:  # type: ignore[empty-body]
        """Return the swiftlets this plugin provides."""

    @hookspec
    def martinet_commands(self) -> Sequence[Command]:  # type: ignore[empty-body]
        """Return the subcommands this plugin adds to the ``martinet`` command (tools that
        work on a config without starting a router, e.g. ``martinet schedule next``)."""


def load_swiftlet_specs(extra_plugins: Iterable[Any] = ()) -> Mapping[str, SwiftletSpec]:
    """Every swiftlet installed, by name: entry-point plugins plus ``extra_plugins``.

    Raises:
        PluginError: a declaration is invalid or a name is claimed twice.
    """
    return load_plugins(extra_plugins).specs


def load_plugins(extra_plugins: Iterable[Any] = ()) -> Plugins:
    """Every swiftlet installed (entry-point plugins plus ``extra_plugins``) and the hooks.

    Raises:
        PluginError: a declaration is invalid, a name is claimed twice, or a plugin
            implements a hook that nobody declares (a misspelt hook name).
    """
    manager = pluggy.PluginManager("martinet")
    manager.add_hookspecs(HookSpecs)
    manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for plugin in extra_plugins:
        manager.register(plugin)
    specs: dict[str, SwiftletSpec] = {}
    owners: dict[str, str] = {}
    for impl in manager.hook.martinet_swiftlets.get_hookimpls():
        owner = _owner_name(manager, impl.plugin)
        # what the hookspec declares (pluggy types a hook's answer as object); _check
        # verifies each entry, as a plugin may return anything
        for spec in cast("Sequence[SwiftletSpec]", impl.function()):
            _check(spec, owner)
            if spec.name in specs:
                raise PluginError(f"swiftlet {spec.name!r} is provided by both {owners[spec.name]} and {owner}")
            specs[spec.name] = spec
            owners[spec.name] = owner
            if spec.hookspecs is not None:
                manager.add_hookspecs(spec.hookspecs)
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(str(exc)) from None
    return Plugins(dict(sorted(specs.items())), manager.hook)


def _owner_name(manager: pluggy.PluginManager, plugin: Any) -> str:
    for dist_plugin, dist in manager.list_plugin_distinfo():
        if dist_plugin is plugin:
            return f"{dist.project_name} {dist.version}"
    return manager.get_name(plugin) or repr(plugin)


def _check(spec: SwiftletSpec, owner: str) -> None:
    if not isinstance(spec, SwiftletSpec):
        raise PluginError(f"{owner} returned {spec!r}, not a SwiftletSpec")
    where = f"swiftlet {spec.name!r} from {owner}"
    if not spec.name or any(c.isspace() or c in ",:" for c in spec.name):
        raise PluginError(f"{where}: a swiftlet name must be non-empty, without spaces , or :")
    try:
        names = {xml_name(f.name) for f, _ in fields_of(spec.config)}
    except (TypeError, KeyError, attrs.exceptions.NotAnAttrsClassError):
        raise PluginError(f"{where}: config must be a @config_class") from None
    if names & RESERVED:
        raise PluginError(f"{where}: config may not declare {sorted(names & RESERVED)}")
    pool_names = [p.name for p in spec.pools]
    if len(set(pool_names)) != len(pool_names):
        raise PluginError(f"{where}: pool names repeat: {pool_names}")
