"""Topics across real ``martinet run`` processes: a triangle, durable subscribers on every
router, two publishers, one router killed with SIGKILL while they publish and started again.
Every durable subscriber gets every message exactly once.

Each router has static routes to the other two, so that while one is down its routing queue
keeps what is forwarded to it (without one, a router that is gone is unknown: nothing can be
addressed to it). Routers tell what they learn in their log (``interest of router R: ROOTS``).
"""

from __future__ import annotations

import pytest
import trio

from martinet.messaging.client import DeliveryMode, TextMessage, Topic, connect

from netharness import router_config
from processes import free_port

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
        xml = router_config(
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
