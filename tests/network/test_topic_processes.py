"""Topics across real ``martinet run`` processes: a triangle, durable subscribers on every
router, two publishers, one router killed with SIGKILL while they publish and started again.
Every durable subscriber gets every message exactly once.

Each router has static routes to the other two, so that while one is down its routing queue
keeps what is forwarded to it (without one, a router that is gone is unknown: nothing can be
addressed to it). Routers tell what they learn in their log (``interest of router R: ROOTS``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from martinet.messaging.client import DeliveryMode, TextMessage, Topic, connect
from martinet.swiftlets.store.dbprocess import COMMIT_GATE_ENV, COMMIT_GATE_QUEUE_ENV
from martinet.swiftlets.topicmanager.api import durable_queue_name

from tests.harness.netharness import network_router_xml, store_engine_pid
from tests.harness.processes import free_port

pytestmark = pytest.mark.slow

NAMES = ("paris", "lyon", "tokyo")
TRIANGLE = {"paris": "lyon", "lyon": "tokyo", "tokyo": "paris"}  # who dials whom
PASSWORD = "topics-secret"
COUNT = 400  # per publisher


async def wait_for(router, needle: str, timeout: float = 30) -> None:
    await trio.to_thread.run_sync(lambda: router.wait_for(needle, timeout))


async def publish(url: str, prefix: str, count: int, progress: list[int]) -> None:
    async with connect(url) as connection, connection.session() as session:
        producer = await session.producer(Topic("iit.orders"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(count):
            await producer.send(TextMessage(f"{prefix}{n}"))
            progress.append(n)


async def receive_all(url: str, client_id: str, expected: set[str]) -> list[str]:
    received: list[str] = []
    async with connect(url, client_id=client_id) as connection, connection.session() as session:
        subscriber = await session.durable_subscriber(Topic("iit"), "all")
        with trio.fail_after(60):
            while len(received) < len(expected):
                message = await subscriber.receive(60)
                assert message is not None
                received.append(message.text)
        assert await subscriber.receive(1) is None
    return received


async def test_durable_subscribers_on_every_router_lose_nothing_when_one_is_killed_mid_publish(router_processes):
    routing = {name: free_port() for name in NAMES}
    amqp = {name: free_port() for name in NAMES}
    urls = {name: f"amqp://127.0.0.1:{amqp[name]}" for name in NAMES}
    routers = {}
    for name in NAMES:
        xml = network_router_xml(
            name,
            amqp=amqp[name],
            routing=routing[name],
            password=PASSWORD,
            connectors=[(TRIANGLE[name], routing[TRIANGLE[name]], PASSWORD)],
            static_routes=[other for other in NAMES if other != name],
        )
        routers[name] = await trio.to_thread.run_sync(router_processes.start, xml)
    for name in NAMES:  # a durable subscription on every router, no subscriber connected
        async with connect(urls[name], client_id=f"sub-{name}") as connection, connection.session() as session:
            await (await session.durable_subscriber(Topic("iit"), "all")).close()
    for name in NAMES:
        for other in NAMES:
            if other != name:
                await wait_for(routers[name], f"interest of router {other}: iit")

    progress: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish, urls["paris"], "p", COUNT, progress)
        nursery.start_soon(publish, urls["tokyo"], "t", COUNT, [])
        with trio.fail_after(60):
            while len(progress) < COUNT // 3:
                await trio.sleep(0.01)
        assert await trio.to_thread.run_sync(routers["lyon"].kill) == -9
        assert len(progress) < COUNT, "publishing ended before the kill: make COUNT larger"
    await trio.to_thread.run_sync(routers["lyon"].restart)

    expected = {f"{p}{n}" for p in "pt" for n in range(COUNT)}
    logs = router_processes.logs
    for name in NAMES:
        received = await receive_all(urls[name], f"sub-{name}", expected)
        duplicates = sorted({m for m in received if received.count(m) > 1})
        assert set(received) == expected and not duplicates, (
            f"{name}: lost {sorted(expected - set(received))[:10]}, duplicated {duplicates[:10]}\n{logs()}"
        )
    for name in NAMES:
        assert "Traceback" not in routers[name].text(), logs()


@pytest.mark.parametrize("store", ["applies-it", "killed-too"])
async def test_a_router_killed_while_its_delivery_of_a_forwarded_publication_waits_for_its_store(
    router_processes, tmp_path, store
):
    """lyon has a durable subscriber; paris publishes. The publication reaches lyon's
    ``tpc$iit`` (one commit), and the transaction that delivers it to the subscription's queue
    and takes it out of ``tpc$iit`` (the next) is held by lyon's store process (the commit gate,
    for commits that store into that queue) when lyon is SIGKILLed. Its store process then
    either applies the commit already in its pipe (as after any ``kill -9``), or is SIGKILLed
    too before it does (a crash of the machine): either way the restarted lyon's subscriber
    gets the publication exactly once."""
    routing = {name: free_port() for name in ("paris", "lyon")}
    amqp = {name: free_port() for name in ("paris", "lyon")}
    urls = {name: f"amqp://127.0.0.1:{amqp[name]}" for name in ("paris", "lyon")}
    gate = tmp_path / "commit-gate"
    queue = durable_queue_name("sub-lyon", "all")
    routers = {}
    for name, other in (("paris", "lyon"), ("lyon", "paris")):
        xml = network_router_xml(
            name,
            amqp=amqp[name],
            routing=routing[name],
            password=PASSWORD,
            connectors=[(other, routing[other], PASSWORD)] if name == "paris" else [],
            static_routes=[other],
        )
        env = {COMMIT_GATE_ENV: str(gate), COMMIT_GATE_QUEUE_ENV: queue} if name == "lyon" else None
        routers[name] = await trio.to_thread.run_sync(lambda xml=xml, env=env: router_processes.start(xml, env=env))
    async with connect(urls["lyon"], client_id="sub-lyon") as connection, connection.session() as session:
        await (await session.durable_subscriber(Topic("iit"), "all")).close()
    await wait_for(routers["paris"], "interest of router lyon: iit")

    gate.touch()
    store_process = store_engine_pid(routers["lyon"].proc.pid)
    await publish(urls["paris"], "held-", 1, [])
    with trio.fail_after(30):
        while not Path(f"{gate}.held").exists():  # the delivery's commit waits at the gate
            await trio.sleep(0.01)
    assert await trio.to_thread.run_sync(routers["lyon"].kill) == -9
    if store == "killed-too":
        os.kill(store_process, signal.SIGKILL)
    gate.unlink()
    await trio.to_thread.run_sync(routers["lyon"].restart)
    assert await receive_all(urls["lyon"], "sub-lyon", {"held-0"}) == ["held-0"], router_processes.logs()
