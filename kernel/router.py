"""The router: boots the swiftlets of one config, in order, and stops them in reverse.

Theory of operation
-------------------
A :class:`Router` owns everything of one router — config, management tree, event bus,
swiftlets and their pools — and nothing is global, so several routers run in one trio
process (each tags its log records with its name, see :mod:`kernel.logs`).

:meth:`Router.run` starts the swiftlets named in ``startorder`` one after the other. Each
swiftlet is hosted by a :class:`_Host` task with its own cancel scope and nursery, in
which the kernel first starts the swiftlet's pools and then awaits
``nursery.start(swiftlet.run)``; the next swiftlet starts only when the previous one has
called ``task_status.started()``.

Stopping is the reverse, one swiftlet at a time: its scope is cancelled and the kernel
waits until its host task has finished. Cancellation *is* the stop signal; a swiftlet that
must await during cleanup does so under :meth:`SwiftletContext.shutdown_scope`, a shielded
scope that expires after the router's ``shutdown-timeout``, so every stop is bounded.

Failures:

- a swiftlet that raises before ``started()`` fails the start: the swiftlets already
  started are stopped in reverse order and :meth:`Router.run` raises :class:`SwiftletFailed`
  naming the swiftlet and the cause; nothing is left half started.
- a swiftlet that raises (or returns) after ``started()`` requests a stop of the whole
  router; the others are stopped in reverse order and ``run`` raises :class:`SwiftletFailed`.

:meth:`Router.request_stop` (signals, later the ``halt`` command) starts an orderly stop;
``run`` then returns normally.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar, cast

import trio

from .bus import EventBus, RouterStarted, RouterStopping, SwiftletStarted, SwiftletStopped
from .config import ConfigErrors, RouterConfig, SwiftletSection, load_config, save_config
from .logs import current_router, install_record_factory
from .mgmt import Change, Entity, EntityList, Tree, Usage, Veto
from .plugins import PluginError, SwiftletSpec, load_plugins
from .pools import Pool, PoolConfig
from .schema import ListOf

__all__ = ["Router", "SwiftletContext", "SwiftletFailed"]

log = logging.getLogger(__name__)

_POOLS = ListOf(PoolConfig, "pool", "The swiftlet's task pools and their sizes.")

T = TypeVar("T")


@functools.cache  # read by every usage sample: parsing the package's metadata costs about 1 ms
def _release() -> str:
    try:
        return version("martinet")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


class ExplainedError(Exception):
    """A failure whose message says all there is to say (a store refusing to start on a
    damaged database, a full disk): when it ends a swiftlet, the log gets the message and no
    traceback, which would only show where it was raised. Swiftlets derive their operator-facing
    errors from it; anything else is a bug and is logged with its traceback."""


def _traceback(exc: BaseException) -> BaseException | None:
    """What to log as ``exc_info`` for a swiftlet's failure ``exc``."""
    return None if isinstance(exc, ExplainedError) else exc


class SwiftletFailed(Exception):
    """A swiftlet failed to start, or failed while running; the router has stopped."""

    def __init__(self, swiftlet: str, what: str, cause: BaseException):
        self.swiftlet = swiftlet
        self.cause = _leaf(cause)
        super().__init__(f"swiftlet {swiftlet} {what}: {describe(cause)}")


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups (trio wraps nursery errors)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception; of each member for an exception group."""
    exc = _leaf(exc)
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(member) for member in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class SwiftletContext:
    """What the kernel gives a swiftlet's factory: its config, tree, pools, bus and peers.

    Attributes:
        name: the swiftlet's name, e.g. ``sys$log``.
        entity: the swiftlet's entity in the management tree (to set change listeners).
        usage: the swiftlet's read-only ``usage`` part (to publish runtime state).
        pools: the swiftlet's running pools, by name.
        bus: the router's event bus.
        log: a logger named after the swiftlet.
    """

    def __init__(self, router: Router, name: str, entity: Entity, pools: Mapping[str, Pool]):
        self._router = router
        self.name = name
        self.entity = entity
        self.usage = _usage(entity)
        self.pools = pools
        self.bus = router.bus
        self.log = logging.getLogger(f"swiftlet.{name}")

    @property
    def config(self) -> Any:
        """The swiftlet's current config: a frozen object of its config class.

        It follows runtime changes made through the management tree — read it when you
        use a value (it is cached until the next change, so this is cheap) rather than
        keeping the object. Reboot-required properties keep the values the swiftlet
        started with. Inside a change listener it still holds the old value; the new one
        is ``change.new``. Same as ``context.entity.config``.
        """
        return self.entity.config

    @property
    def router_name(self) -> str:
        return self._router.name

    @property
    def management(self) -> Tree:
        return self._router.management

    @property
    def hook(self) -> Any:
        """The router's plugin hooks (a pluggy ``HookRelay``): ``context.hook.<name>(...)``
        calls hook ``name`` on every plugin and returns their answers as a list. A swiftlet
        calls the hooks it declared itself (``SwiftletSpec.hookspecs``)."""
        return self._router.hook

    def before_stop(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Have ``await hook()`` run when the router stops orderly: after RouterStopping is
        published and before any swiftlet is stopped, the hooks one after the other in the
        order they were given (so in start order), all within the router's
        ``shutdown-timeout``. For what must still leave while every swiftlet runs: a
        stopping router's last interest record, then the routing links' last transfers."""
        self._router._before_stop.append(hook)

    def lookup(self, name: str, kind: Callable[..., T]) -> T:
        """The running swiftlet ``name`` (a swiftlet started earlier), as the interface ``kind``.

        ``kind`` is what the caller is going to use of it: the ``@runtime_checkable``
        protocol the other swiftlet publishes in its ``api`` module (e.g.
        ``context.lookup("sys$queuemanager", QueueManager)``), or a class. The object is
        checked once, here, with ``isinstance`` — for a protocol, whether it has every
        member — so a swiftlet replaced by one that does not provide the interface stops the
        start with a clear message instead of failing later with an ``AttributeError``.
        ``kind`` is typed as a callable that makes a ``T``: mypy refuses a Protocol where
        ``type[T]`` is expected (it could not be instantiated), and takes it as such a callable.

        Raises:
            LookupError: no swiftlet ``name`` is running.
            TypeError: it runs but does not provide ``kind`` (the message names the
                swiftlet, the interface and the members missing); or ``kind`` is a protocol
                without ``@runtime_checkable``.
        """
        swiftlet = self._router.swiftlet(name)
        if not isinstance(kind, type):
            raise TypeError(
                f"lookup of swiftlet {name}: the interface {kind!r} must be a class or a @runtime_checkable Protocol"
            )
        try:
            provided = isinstance(swiftlet, kind)
        except TypeError:  # a Protocol that is not runtime checkable: a bug of the caller
            raise TypeError(
                f"lookup of swiftlet {name}: the interface {_qualified(kind)} must be a class or a "
                "@runtime_checkable Protocol"
            ) from None
        if not provided:
            missing = _missing_members(swiftlet, kind)
            raise TypeError(
                f"swiftlet {name} on router {self.router_name} ({_qualified(type(swiftlet))}) does not provide "
                f"the interface {_qualified(kind)}" + (f": it lacks {', '.join(missing)}" if missing else "")
            )
        return cast(T, swiftlet)

    def request_stop(self, reason: str, *, delay: float = 0.0) -> None:
        """Begin an orderly stop of the whole router (``halt``); see :meth:`Router.request_stop`."""
        self._router.request_stop(reason, delay=delay)

    def request_reboot(self, reason: str, *, delay: float = 0.0) -> None:
        """Stop the router in order and have it started again on its config file (``reboot``);
        see :meth:`Router.request_reboot`."""
        self._router.request_reboot(reason, delay=delay)

    def save(self) -> Path:
        """Write the live config to the file it came from; see :meth:`Router.save`."""
        return self._router.save()

    def shutdown_scope(self) -> trio.CancelScope:
        """A shielded scope for awaiting cleanup, expiring after ``shutdown-timeout``."""
        grace = self._router.config.settings.shutdown_timeout / 1000
        return trio.CancelScope(shield=True, deadline=trio.current_time() + grace)


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _missing_members(obj: Any, kind: type) -> list[str]:
    """The public members ``kind`` declares (methods, properties, annotated attributes,
    through its bases) that ``obj`` lacks; for the error message of a failed lookup."""
    names: set[str] = set()
    for klass in kind.__mro__:
        if klass.__module__ in ("builtins", "typing"):  # object, Protocol, Generic
            continue
        names.update(vars(klass))
        names.update(getattr(klass, "__annotations__", {}))
    return sorted(n for n in names if not n.startswith("_") and not hasattr(obj, n))


class _Host:
    """Runs one swiftlet with its pools in its own cancel scope and nursery."""

    def __init__(self, router: Router, spec: SwiftletSpec):
        self.router = router
        self.spec = spec
        self.name = spec.name
        self.state = "stopped"
        self.started_at: float | None = None
        self.error: BaseException | None = None
        self.swiftlet: Any = None
        self.scope = trio.CancelScope()
        self.done = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        entity = self.router.management.entity(self.name)
        entity.settle()  # changes committed so far, reboot-required ones too, take effect now
        pools = {name: Pool.from_config(e.config) for name, e in _pool_list(entity).entities.items()}
        self.state = "starting"
        started = False
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    for pool in pools.values():
                        await nursery.start(pool.run)
                    self._attach_pools(entity, pools)
                    context = SwiftletContext(self.router, self.name, entity, pools)
                    self.swiftlet = self.spec.factory(context)
                    await nursery.start(self._run_swiftlet)
                    started = True
                    self.state, self.started_at = "running", time.time()
                    log.info("swiftlet %s started", self.name)
                    self.router.bus.publish(SwiftletStarted(name=self.name))
                    task_status.started()
        except Exception as exc:
            self.state, self.error = "failed", _leaf(exc)
            if not started:
                raise
            log.error("swiftlet %s failed: %s", self.name, describe(exc), exc_info=_traceback(self.error))
            self.router.request_stop(f"swiftlet {self.name} failed")
        finally:
            entity.clear_listeners()  # the swiftlet is gone: changes now just commit
            if self.state != "failed":
                self.state = "stopped"
            if started:
                error = describe(self.error) if self.error else None
                self.router.bus.publish(SwiftletStopped(name=self.name, error=error))
                log.info("swiftlet %s stopped", self.name)
            self.done.set()

    async def _run_swiftlet(self, *, task_status: trio.TaskStatus[None]) -> None:
        await self.swiftlet.run(task_status=task_status)
        if not self.scope.cancel_called:
            raise RuntimeError("run() returned while the router was running")

    def _attach_pools(self, entity: Entity, pools: Mapping[str, Pool]) -> None:
        """Publish pool usage and apply runtime changes of ``max-concurrency``."""
        usage = _usage(entity).add_list("pools")

        def resize(pool: Pool, change: Change) -> None:
            if change.field == "max_concurrency":
                pool.resize(change.new)

        def on_add(pool_entity: Entity) -> None:
            pool = pools.get(pool_entity.name)
            if pool is None:
                raise Veto(f"swiftlet {self.name} declares no pool {pool_entity.name!r}")
            pool_entity.on_change(lambda change: resize(pool, change))
            usage.add(pool.name, pool.usage)

        def on_remove(pool_entity: Entity) -> None:
            raise Veto(f"pools are declared by swiftlet {self.name} and cannot be removed")

        _pool_list(entity).bind(on_add, on_remove)

    async def stop(self, grace: float) -> None:
        """Cancel the swiftlet and wait until it has finished."""
        if self.state == "running":
            self.state = "stopping"
        self.scope.cancel()
        with trio.move_on_after(grace + 1):
            await self.done.wait()
            return
        log.warning("swiftlet %s still stopping after %.1f s", self.name, grace + 1)
        await self.done.wait()

    def usage(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "started-at": _timestamp(self.started_at),
            "error": describe(self.error) if self.error else "",
        }


def _timestamp(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds)) if seconds else ""


def _pool_list(entity: Entity) -> EntityList:
    return entity.entity_list("pools")


def _usage(entity: Entity) -> Usage:
    usage = entity.children["usage"]
    assert isinstance(usage, Usage)  # the kernel put it there
    return usage


class Router:
    """One router: its config, management tree, event bus and swiftlets.

    Build it with :meth:`from_file`, or from a loaded :class:`RouterConfig` (``hook``: the
    plugins' hooks from :func:`kernel.plugins.load_plugins`, when the router should see
    plugins registered in-process; else the installed plugins' are loaded when first asked).
    """

    def __init__(
        self,
        config: RouterConfig,
        specs: Mapping[str, SwiftletSpec],
        *,
        config_path: str | os.PathLike[str] | None = None,
        hook: Any = None,
    ):
        self.config = config
        self._hook = hook
        self.specs = specs
        self.config_path = Path(config_path) if config_path is not None else None
        self.bus = EventBus()
        self.management = Tree(self.bus, config.settings)
        root = self.management.root
        for name, section in config.swiftlets.items():
            root.children[name] = _swiftlet_entity(self.management, name, section)
        self._hosts = [_Host(self, specs[name]) for name in config.startorder]
        self._stop_requested = trio.Event()
        self._stop_reason = ""
        self._stop_delay = 0.0
        self._before_stop: list[Callable[[], Awaitable[None]]] = []  # SwiftletContext.before_stop
        self.successor: Router | None = None  # built by request_reboot, run by whoever ran this one
        router_usage = root.children["usage"] = Usage("/usage", self._usage)
        swiftlets = router_usage.add_list("swiftlets")
        for host in self._hosts:
            swiftlets.add(host.name, host.usage)
        self._started_at: float | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, plugins: Iterable[Any] = ()) -> Router:
        """Load the swiftlets installed (plus ``plugins``) and the config at ``path``.

        Raises:
            ConfigErrors: the config is invalid (every problem, with file:line).
            PluginError: an installed plugin is broken.
            OSError: the file cannot be read.
        """
        found = load_plugins(plugins)
        return cls(load_config(path, found.specs, hook=found.hook), found.specs, config_path=path, hook=found.hook)

    @property
    def name(self) -> str:
        return self.config.settings.name

    @property
    def hook(self) -> Any:
        """The plugin hooks (see :attr:`SwiftletContext.hook`): those given when the router
        was built, else the installed plugins', loaded on first use."""
        if self._hook is None:
            self._hook = load_plugins().hook
        return self._hook

    def swiftlet(self, name: str) -> Any:
        """The running swiftlet object ``name``.

        Raises:
            LookupError: no swiftlet of that name is running.
        """
        for host in self._hosts:
            if host.name == name and host.state == "running":
                return host.swiftlet
        raise LookupError(f"swiftlet {name} is not running on router {self.name}")

    def request_stop(self, reason: str = "stop requested", *, delay: float = 0.0) -> None:
        """Begin an orderly stop (idempotent) in ``delay`` seconds (management's ``halt``
        lets its reply leave first); :meth:`run` returns once all have stopped."""
        if not self._stop_requested.is_set():
            self._stop_reason, self._stop_delay = reason, delay
            self._stop_requested.set()

    def request_reboot(self, reason: str = "reboot requested", *, delay: float = 0.0) -> None:
        """Read the config file again and, only if it is valid, begin an orderly stop after
        which :attr:`successor` (a new router on that config) is to be run: ``martinet run``
        does so, as after SIGHUP.

        Raises:
            ValueError: the router was not loaded from a file, or the file is invalid now (the
                message has every problem); the router keeps running.
        """
        if self.config_path is None:
            raise ValueError("this router was not loaded from a file: it cannot reboot")
        try:
            successor = Router.from_file(self.config_path)
        except (ConfigErrors, PluginError, OSError) as exc:
            raise ValueError(f"the config file is not valid; still running on the old one: {exc}") from None
        self.successor = successor
        self.request_stop(reason, delay=delay)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every swiftlet in ``startorder``, run until stopped, stop them in reverse.

        A router runs once; build a new one to start again.

        Raises:
            SwiftletFailed: a swiftlet failed to start or failed while running; every other
                swiftlet has been stopped by then.
            RuntimeError: the router has run before.
        """
        if self._started_at is not None:
            raise RuntimeError(f"router {self.name} has run already; build a new Router")
        install_record_factory()
        token = current_router.set(self.name)
        try:
            await self._run(task_status)
        finally:
            current_router.reset(token)

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        log.info("router %s starting: %s", self.name, " ".join(self.config.startorder) or "no swiftlets")
        self._started_at = time.time()
        failure: SwiftletFailed | None = None
        started: list[_Host] = []
        async with trio.open_nursery() as nursery:
            for host in self._hosts:
                if self._stop_requested.is_set():
                    break
                try:
                    await nursery.start(host.run)
                except Exception as exc:
                    failure = SwiftletFailed(host.name, "failed to start", exc)
                    log.error("%s", failure, exc_info=_traceback(failure.cause))
                    self.request_stop(str(failure))
                    break
                started.append(host)
            if not self._stop_requested.is_set():
                log.info("router %s started", self.name)
                self.bus.publish(RouterStarted(router=self.name))
                task_status.started()
                await self._stop_requested.wait()
                await trio.sleep(self._stop_delay)
            log.info("router %s stopping: %s", self.name, self._stop_reason)
            self.bus.publish(RouterStopping(router=self.name, reason=self._stop_reason))
            grace = self.config.settings.shutdown_timeout / 1000
            with trio.move_on_after(grace):
                for hook in self._before_stop:
                    await hook()
            for host in reversed(started):
                await host.stop(grace)
        crashed = next((h for h in started if h.error is not None), None)
        if failure is None and crashed is not None:
            failure = SwiftletFailed(crashed.name, "failed", crashed.error)  # type: ignore[arg-type]
        log.info("router %s stopped", self.name)
        if failure is not None:
            raise failure

    def snapshot(self) -> RouterConfig:
        """The live config (with every runtime change) as a frozen :class:`RouterConfig`."""
        root = self.management.root
        sections = {}
        for name in self.config.swiftlets:
            entity: Entity = root.children[name]  # type: ignore[assignment]
            sections[name] = SwiftletSection(entity.snapshot(), _pool_list(entity).snapshot())
        return RouterConfig(root.snapshot(), sections)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the live config sparsely to ``path`` (default: the file it came from).

        Raises:
            ValueError: no path given and the router was not loaded from a file.
            OSError: the file cannot be written.
        """
        target = path if path is not None else self.config_path
        if target is None:
            raise ValueError("this router was not loaded from a file: give a path to save to")
        saved = save_config(self.snapshot(), self.specs, target)
        log.info("config saved to %s", saved)
        return saved

    def _usage(self) -> dict[str, Any]:
        started = self._started_at
        return {
            "name": self.name,
            "hostname": socket.gethostname(),
            "release": _release(),
            "config-file": str(self.config_path or ""),
            "started-at": _timestamp(started),
            "state": "stopping" if self._stop_requested.is_set() else "running" if started else "new",
        }


def _swiftlet_entity(tree: Tree, name: str, section: SwiftletSection) -> Entity:
    entity = Entity(tree, f"/{name}", section.config)
    entity.children["pools"] = EntityList(tree, f"/{name}/pools", _POOLS, section.pools)
    entity.children["usage"] = Usage(f"/{name}/usage")
    return entity
