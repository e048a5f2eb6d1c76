"""Several routers in one process, built from RouterConfig objects (the ``network`` fixture):
each serves its own clients with its own config, and stopping one leaves the others alone."""

from __future__ import annotations

import pytest

from martinet.messaging.client import Queue, SecurityError, TextMessage, connect
from martinet.swiftlets.authentication.config import AuthenticationConfig, GroupConfig, QueueGrant, UserConfig
from martinet.swiftlets.queuemanager.config import QueueConfig, QueueManagerConfig


async def test_three_routers_from_config_objects_serve_their_own_clients(network):
    await network.start(network.config("paris"))
    await network.start(
        network.config(
            "tokyo",
            swiftlets={
                "sys$authentication": AuthenticationConfig(
                    authentication_enabled=True,
                    groups=[GroupConfig(name="apps", queue_grants=[QueueGrant(name="orders")])],
                    users=[UserConfig(name="app", password="s3cret", group="apps")],
                )
            },
        )
    )
    await network.start(
        network.config(
            "oslo",
            swiftlets={
                "sys$queuemanager": QueueManagerConfig(auto_create_queues=False, queues=[QueueConfig(name="orders")])
            },
        )
    )
    assert len({network.url(name) for name in ("paris", "tokyo", "oslo")}) == 3

    for name, user in (("paris", None), ("tokyo", "app:s3cret@"), ("oslo", None)):
        url = network.url(name).replace("//", f"//{user}") if user else network.url(name)
        async with connect(url) as connection:
            assert connection.router == name
            session = await connection.session()
            await (await session.producer(Queue("orders"))).send(TextMessage(f"for {name}"))
    for name in ("paris", "tokyo", "oslo"):  # each message stayed on its own router
        queue = network.routers[name].management.resolve("/sys$queuemanager/usage/queues/orders")
        assert queue.properties()["messages"] == 1

    with pytest.raises(SecurityError):  # tokyo's own authentication config is in force
        async with connect(network.url("tokyo")):
            pass
    await network.stop("paris")
    async with connect(network.url("oslo")) as connection:  # the others keep serving
        consumer = await (await connection.session()).consumer(Queue("orders"))
        assert (await consumer.receive(5)).text == "for oslo"
