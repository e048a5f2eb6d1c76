"""Networks of routers in one trio process, each built from a RouterConfig object.

Routing tests need many routers with small differences between them; writing each as an
XML template does not scale. :func:`router_config` builds the standard stack (store,
authentication, queue manager, topic manager, AMQP listener on a free loopback port) from
the swiftlets' own config classes, and a test replaces whole sections with config objects
of its own (``attrs.evolve`` of a default, or a new one). :class:`Network` starts and stops
the routers in the test's nursery.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from martinet.kernel import Router, RouterConfig, load_swiftlet_specs
from martinet.kernel.config import RouterSettings, SwiftletSection
from martinet.swiftlets.jms.config import JmsConfig
from martinet.swiftlets.jms.config import ListenerConfig as AmqpListenerConfig
from martinet.swiftlets.routing.config import ListenerConfig, RoutingConfig
from martinet.swiftlets.store.config import StoreConfig

from tests.harness.faultproxy import FaultProxy

STACK = ("sys$store", "sys$authentication", "sys$queuemanager", "sys$xa", "sys$topicmanager", "sys$jms")
ROUTING_STACK = (*STACK, "sys$routing")


def routing_config(**options: Any) -> RoutingConfig:
    """``sys$routing`` with one listener ``links`` on a free loopback port (``listener``: its
    attributes) and the swiftlet attributes in ``options``."""
    listener = ListenerConfig(name="links", port=0, bindaddress="127.0.0.1", **options.pop("listener", {}))
    return RoutingConfig(listeners=[listener], **options)


def router_config(
    name: str, folder: Path, *, swiftlets: Mapping[str, Any] | None = None, startorder: tuple[str, ...] = STACK
) -> RouterConfig:
    """The config of router ``name``: every swiftlet of ``startorder`` with its defaults, except
    a store in ``folder/name`` (``sync="normal"``) and one AMQP listener ``amqp`` on a free
    loopback port; ``swiftlets`` maps swiftlet names to config objects that replace those."""
    specs = load_swiftlet_specs()
    configs: dict[str, Any] = {
        "sys$store": StoreConfig(path=str(folder / name / "store"), sync="normal"),
        "sys$jms": JmsConfig(listeners=[AmqpListenerConfig(name="amqp", port=0, bind_address="127.0.0.1")]),
    }
    configs.update(swiftlets or {})
    sections = {}
    for swiftlet in startorder:
        spec = specs[swiftlet]
        config = configs.get(swiftlet) or spec.config()
        sections[swiftlet] = SwiftletSection(config, {pool.name: pool.default_config() for pool in spec.pools})
    settings = RouterSettings(name=name, startorder=" ".join(startorder), shutdown_timeout=5000)
    return RouterConfig(settings, sections)


class Network:
    """Routers started in ``nursery``, by name; each stops when the test ends."""

    def __init__(self, nursery: trio.Nursery, folder: Path):
        self.nursery = nursery
        self.folder = folder
        self.routers: dict[str, Router] = {}
        self._stopped: dict[str, trio.Event] = {}

    def config(self, name: str, **options: Any) -> RouterConfig:
        """:func:`router_config` in this network's folder."""
        return router_config(name, self.folder, **options)

    async def start(self, config: RouterConfig) -> Router:
        """Build and start a router; returns once every swiftlet has started.

        Raises: ValueError if a router of that name runs here already; SwiftletFailed.
        """
        name = config.settings.name
        if name in self.routers and not self._stopped[name].is_set():
            raise ValueError(f"router {name} is running already")
        router = Router(config, load_swiftlet_specs())
        stopped = trio.Event()

        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            try:
                await router.run(task_status=task_status)
            finally:
                stopped.set()

        await self.nursery.start(run)
        self.routers[name], self._stopped[name] = router, stopped
        return router

    def url(self, name: str, listener: str = "amqp") -> str:
        """The AMQP URL of a router's listener."""
        port = self.routers[name].management.get(f"/sys$jms/usage/listeners/{listener}", "port")
        return f"amqp://127.0.0.1:{port}"

    async def start_routers(self, *names: str, **routing: Any) -> None:
        """Start routers with the routing swiftlet (``routing``: :func:`routing_config`'s options)."""
        for name in names:
            await self.start(
                self.config(name, startorder=ROUTING_STACK, swiftlets={"sys$routing": routing_config(**routing)})
            )

    def routing_port(self, name: str, listener: str = "links") -> int:
        return self.routers[name].management.get(f"/sys$routing/usage/listeners/{listener}", "port")

    def connect(
        self, source: str, target: str, *, name: str | None = None, listener: str = "links", **attributes: Any
    ) -> str:
        """Add a connector (named after ``target`` unless ``name``) on ``source`` to ``target``'s
        routing listener, at runtime; ``attributes``: more connector attributes (XML names)."""
        name = name or target
        self.routers[source].management.add(
            "/sys$routing/connectors",
            name,
            {"hostname": "127.0.0.1", "port": str(self.routing_port(target, listener)), **attributes},
        )
        return name

    async def connect_through_proxy(
        self, nursery: trio.Nursery, source: str, target: str, *, xa: bool = True
    ) -> FaultProxy:
        """Connect ``source`` to ``target`` (as :meth:`connect`, retrying every second) through
        a fault proxy started in ``nursery``; the proxy (tests/harness/faultproxy.py)."""
        proxy = FaultProxy("127.0.0.1", self.routing_port(target))
        await nursery.start(proxy.run)
        self.routers[source].management.add(
            "/sys$routing/connectors",
            target,
            {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000", "use-xa": str(xa).lower()},
        )
        return proxy

    def table(self, name: str) -> dict[str, int]:
        """Router ``name``'s active destinations with their shortest hop counts."""
        routing = self.routers[name].swiftlet("sys$routing")
        return {row.name: len(row.routes[0]) for row in routing.destinations() if row.active}

    async def settle(self, expected: Mapping[str, Mapping[str, int]], timeout: float = 20) -> None:
        """Wait (bounded) until every router named in ``expected`` has exactly that table.

        Raises: AssertionError with the tables as they are when the time is up."""
        with trio.move_on_after(timeout):
            while any(self.table(name) != table for name, table in expected.items()):
                await trio.sleep(0.02)
            return
        actual = {name: self.table(name) for name in expected}
        raise AssertionError(f"routing tables did not settle in {timeout} s: {actual} != {dict(expected)}")

    async def stop(self, name: str) -> None:
        """Stop a router and wait until it has stopped (bounded)."""
        self.routers[name].request_stop()
        with trio.fail_after(15):
            await self._stopped[name].wait()

    async def stop_all(self) -> None:
        for name, stopped in self._stopped.items():
            if not stopped.is_set():
                await self.stop(name)
