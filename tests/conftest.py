"""Shared test helpers: config files in temp dirs, routers with the probe plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from martinet.kernel import Router, SwiftletFailed, load_swiftlet_specs

import probe_plugin
from network import Network
from processes import RouterProcesses
from sparkcluster import spark_cluster, spark_connect  # noqa: F401  (fixtures for every module)

ROOT = Path(__file__).resolve().parent.parent
ECHO_PLUGIN = ROOT / "examples" / "plugins" / "martinet-echo"


def drain(subscription) -> list:
    """Every event buffered in a bus subscription, without waiting."""
    got = []
    while True:
        try:
            got.append(subscription.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return got


async def wait_until(predicate: Callable[[], object], timeout: float = 10, what: str = "") -> None:
    """Poll ``predicate`` every 10 ms until it holds, for what the code under test reaches in
    the background (a settlement, a cleanup); fail the test after ``timeout`` seconds."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"not within {timeout} s: {what or predicate.__doc__ or predicate}")


@pytest.fixture
def write_config(tmp_path):
    """Write XML text to a file in the test's temp dir and return its path."""

    def write(text: str, name: str = "router.xml") -> Path:
        path = tmp_path / name
        path.write_text(text.strip() + "\n")
        return path

    return write


@pytest.fixture
def make_router(write_config):
    """A Router from XML text, with the probe swiftlets test$a … test$e available."""

    def make(text: str) -> Router:
        return Router.from_file(write_config(text), plugins=[probe_plugin])

    return make


@pytest.fixture
def probe_specs():
    return load_swiftlet_specs([probe_plugin])


@pytest.fixture(scope="session")
def echo_site(tmp_path_factory) -> Path:
    """The example plugin pip-installed (for real, from its own pyproject) into a folder.

    Putting the folder on sys.path (or PYTHONPATH) makes its entry point visible; without
    it the plugin is not installed, so each test decides which world it runs in.
    """
    target = tmp_path_factory.mktemp("echo-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(ECHO_PLUGIN),
        ],
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
        timeout=300,
    )
    return target


QUEUE_ROUTER = """
<router name="r1" startorder="sys$store sys$queuemanager" shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="{sync}"/>
  <swiftlet name="sys$queuemanager" {manager}>
    {queues}
  </swiftlet>
</router>
"""


class RunningRouter:
    """A router on a store in the test's temp dir, restartable on the same store."""

    def __init__(self, nursery, tmp_path: Path, manager: str = "", queues: str = "", sync: str = "normal"):
        self.nursery = nursery
        self.path = tmp_path / "router.xml"
        self.path.write_text(
            QUEUE_ROUTER.format(
                store=tmp_path / "store",
                sync=sync,
                manager=manager,
                queues=f"<queues>{queues}</queues>" if queues else "",
            )
        )
        self.router: Router | None = None
        self._done: trio.Event | None = None
        self.failure: SwiftletFailed | None = None

    async def start(self) -> Router:
        self.router = Router.from_file(self.path)
        self._done = trio.Event()
        await self.nursery.start(self._run, self.router, self._done)
        return self.router

    async def _run(self, router, done, *, task_status):
        try:
            await router.run(task_status=task_status)
        except SwiftletFailed as failure:  # after start: kept for the test to look at
            self.failure = failure
        finally:
            done.set()

    async def stop(self) -> None:
        self.router.request_stop()
        await self._done.wait()

    async def restart(self) -> Router:
        await self.stop()
        return await self.start()

    @property
    def queue_manager(self):
        return self.router.swiftlet("sys$queuemanager")

    @property
    def store(self):
        return self.router.swiftlet("sys$store")


@pytest.fixture
async def broker(nursery, tmp_path):
    """A started router with sys$store and sys$queuemanager (stopped after the test)."""
    running = RunningRouter(nursery, tmp_path)
    await running.start()
    yield running
    if not running._done.is_set():
        await running.stop()


@pytest.fixture
def make_broker(nursery, tmp_path):
    """Build (not start) a RunningRouter with extra manager attributes and queue elements."""
    return lambda manager="", queues="", sync="normal": RunningRouter(nursery, tmp_path, manager, queues, sync)


AMQP_ROUTER = """
<router name="r1" startorder="sys$store sys$authentication sys$queuemanager sys$topicmanager sys$jms"
        shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$authentication" authentication-enabled="{auth}" allow-anonymous="{anonymous}">
    <groups>
      <group name="public"/>
      <group name="apps">
        <queue-grants><queue-grant name="%"/><queue-grant name="secret" receive-grant="false"/></queue-grants>
      </group>
    </groups>
    <users><user name="app" password="s3cret" group="apps"/></users>
  </swiftlet>
  <swiftlet name="sys$queuemanager" auto-create-queues="{autocreate}">{queues}</swiftlet>
  <swiftlet name="sys$jms" collect-interval="{collect}">
    <listeners><listener name="amqp" port="0" bind-address="127.0.0.1" max-connections="{maxconn}" {listener}>{hosts}
    </listener>
    </listeners>
  </swiftlet>
</router>
"""


def amqp_router_xml(tmp_path, **options) -> str:
    """:data:`AMQP_ROUTER` with its defaults, overridden by ``options`` (its placeholders)."""
    settings = {
        "auth": "false",
        "anonymous": "false",
        "autocreate": "true",
        "maxconn": "-1",
        "collect": "10000",
        "hosts": "",
        "queues": "",
        "listener": "",
    } | options
    return AMQP_ROUTER.format(store=tmp_path / "store", **settings)


class AmqpBroker:
    """A router with sys$jms on a free loopback port, store in the test's temp dir."""

    def __init__(self, nursery, tmp_path, **options):
        self.path = tmp_path / "router.xml"
        self.path.write_text(amqp_router_xml(tmp_path, **options))
        self.nursery = nursery

    async def start(self) -> AmqpBroker:
        self.router = Router.from_file(self.path)
        await self.nursery.start(self.router.run)
        self.port = self.router.management.get("/sys$jms/usage/listeners/amqp", "port")
        self.url = f"amqp://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        self.router.request_stop()
        with trio.fail_after(10):
            while self.router.management.get("/usage", "state") != "stopping" or any(
                self.router.management.get(f"/usage/swiftlets/{n}", "state") != "stopped"
                for n in ("sys$jms", "sys$store")
            ):
                await trio.sleep(0.02)

    def usage(self, queue: str) -> dict:
        return self.router.management.resolve(f"/sys$queuemanager/usage/queues/{queue}").properties()

    def connections(self) -> int:
        """Client connections of the listener; one is counted until its cleanup (rolling back
        its transactions, releasing what it held) is done."""
        return self.router.management.get("/sys$jms/usage/listeners/amqp", "connections")


@pytest.fixture
def amqp_broker(nursery, tmp_path):
    """``await amqp_broker(auth="true", ...)``: a started :class:`AmqpBroker`."""
    return lambda **options: AmqpBroker(nursery, tmp_path, **options).start()


@pytest.fixture
async def network(nursery, tmp_path):
    """A :class:`network.Network`: routers built from RouterConfig objects, in this process."""
    routers = Network(nursery, tmp_path)
    yield routers
    await routers.stop_all()


@pytest.fixture
def router_processes(tmp_path):
    """A :class:`processes.RouterProcesses` in the test's temp dir: real ``martinet run``
    processes, ``router_processes.start(xml)``; every one still running is killed at teardown."""
    routers = RouterProcesses(tmp_path / "routers")
    yield routers
    routers.close()
