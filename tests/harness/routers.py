"""Single routers in this process for the tests: :class:`RunningRouter` (sys$store and
sys$queuemanager, restartable on the same store) and :class:`AmqpBroker` (the stack behind
sys$jms on a free loopback port, from :func:`amqp_router_xml`)."""

from __future__ import annotations

from pathlib import Path

import trio

from martinet.kernel import Router, SwiftletFailed

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
