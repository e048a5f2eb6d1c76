"""Queues clients make, counted across connections: per user, per address, and a share of
``max-queues`` that clients cannot take (kept for management's replies and the temporary
queues of users in sys$mgmt's groups).

Real routers in this process (tests/harness/network.py), real logins, our AMQP client and raw
frames over sockets on port 0. Counts only: queues made, attaches refused, requests
answered.
"""

from __future__ import annotations

import trio

from martinet.messaging import amqp
from martinet.messaging.client import JMSError, Queue, connect
from martinet.swiftlets.authentication.config import AuthenticationConfig, GroupConfig, QueueGrant, UserConfig
from martinet.swiftlets.mgmt.client import AdminClient
from martinet.swiftlets.queuemanager.config import QueueManagerConfig

from tests.harness.network import STACK
from tests.swiftlets.jms.test_hostile_limits import ATTACH, DETACH, OPEN, RawClient, attach, begin, frame

MGMT_STACK = (*STACK, "sys$mgmt")
PASSWORDS = {"mallory": "m-pw", "eve": "e-pw", "bob": "b-pw", "root": "r-pw"}


def users() -> AuthenticationConfig:
    groups = [GroupConfig(name="public", queue_grants=[QueueGrant(name="%")]), GroupConfig(name="admin")]
    return AuthenticationConfig(
        authentication_enabled=True,
        groups=groups,
        users=[
            UserConfig(name=name, password=password, group="admin" if name == "root" else "public")
            for name, password in PASSWORDS.items()
        ],
    )


async def make_queues(url: str, user: str, names: list[str]) -> tuple[int, list[str]]:
    """Attach a producer to each new queue name on one connection (closed again at once: the
    auto-created queue stays); how many were made and the refusals' descriptions."""
    made, refused = 0, []
    async with connect(url, user=user, password=PASSWORDS[user]) as connection:
        session = await connection.session()
        for name in names:
            try:
                producer = await session.producer(Queue(name))
            except JMSError as exc:
                assert exc.condition == "amqp:resource-limit-exceeded", exc
                refused.append(exc.description)
            else:
                await producer.close()
                made += 1
    return made, refused


async def temporary_queue(url: str, user: str) -> str:
    """Make a temporary queue as ``user``: "ok" or the refusal."""
    async with connect(url, user=user, password=PASSWORDS[user]) as connection:
        session = await connection.session()
        try:
            await session.create_temporary_queue()
        except JMSError as exc:
            return exc.description
    return "ok"


async def test_one_user_on_ten_connections_cannot_take_every_queue_and_the_router_can_still_be_managed(network):
    # Ten connections of one user, 150 new queues each: the per-connection limit (1,000)
    # never bites, so only a count per user stops it. Defaults of the new settings
    # (max-queues-per-user 1000, reserved-queues-percent 10); max-queues 1300 is the old
    # bound the attack used to exhaust for everyone.
    queues = QueueManagerConfig(max_queues=1300)
    router = await network.start(
        network.config(
            "a",
            startorder=MGMT_STACK,
            swiftlets={"sys$authentication": users(), "sys$queuemanager": queues},
        )
    )
    manager = router.swiftlet("sys$queuemanager")
    url = network.url("a")
    attempts = [[f"m{c}-{n}" for n in range(150)] for c in range(10)]
    results = [await make_queues(url, "mallory", names) for names in attempts]
    assert sum(made for made, _ in results) == 1000
    refusals = [text for _, refused in results for text in refused]
    assert len(refusals) == 500
    assert all("user 'mallory' has max-queues-per-user 1000 queues already" in text for text in refusals)
    assert sum(name.startswith("m") for name in manager.queues) == 1000

    # another user still has its own allowance
    assert await temporary_queue(url, "bob") == "ok"

    # eve takes the rest of the clients' share (1300 less 10 %): then no client gets a queue ...
    held = len(manager.queues)
    made, refused = await make_queues(url, "eve", [f"e{n}" for n in range(200)])
    assert made == 1170 - held and len(refused) == 200 - made
    assert "reserved for the router's own (reserved-queues-percent 10)" in refused[0]
    assert "reserved for the router's own" in await temporary_queue(url, "bob")

    # ... but management still answers its own users, their reply queues from the reserve
    async with AdminClient.open(url, user="root", password=PASSWORDS["root"]) as admin:
        usage = await admin.call(None, "get", path="/sys$queuemanager/usage")
        assert usage["properties"]["clients-queues"] == 1170 - 4  # unroutable, routerdlq, sys$mgmt, its replies
        assert usage["properties"]["queues"] == 1171  # and the admin's own reply queue

    # deleting queues gives the room back to whom they counted for
    for name in [q for q in manager.queues if q.startswith("m0-")]:
        manager.delete_queue(name)
    made, refused = await make_queues(url, "mallory", [f"again{n}" for n in range(200)])
    assert made == 150 and len(refused) == 50


async def raw_queues(port: int, source: str, prefix: str, count: int) -> list[str]:
    """``count`` new queues attached over raw frames from local address ``source`` on one
    connection (authentication off); the descriptions of the refusals."""
    client = RawClient(await trio.open_tcp_stream("127.0.0.1", port, local_address=source))
    names = [f"{prefix}{n}" for n in range(count)] + ["unroutable"]  # last: answered after every refusal
    await client.send(
        amqp.AMQP_HEADER
        + frame(OPEN, [prefix])
        + begin(0)
        + b"".join(attach(f"l{n}", n, address=name) for n, name in enumerate(names))
    )
    await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == len(names))
    await client.aclose()
    return [amqp.Error.from_value(fields[2]).description for _, code, fields in client.received if code == DETACH]


async def test_queues_are_counted_per_address_across_connections(amqp_broker):
    # Authentication off: every client is anonymous, and the address it connects from is
    # what its queues count for, whichever connection made them.
    broker = await amqp_broker(
        autocreate='true" max-queues="100" max-queues-per-address="6',
        listener='max-auto-created-queues-per-connection="4"',
    )
    manager = broker.router.swiftlet("sys$queuemanager")
    assert await raw_queues(broker.port, "127.0.0.1", "one", 4) == []
    refused = await raw_queues(broker.port, "127.0.0.1", "two", 4)
    assert refused == [
        "queue 'two2' not created: clients from 127.0.0.1 have max-queues-per-address 6 queues already"
    ] + ["queue 'two3' not created: clients from 127.0.0.1 have max-queues-per-address 6 queues already"]
    assert await raw_queues(broker.port, "127.0.0.2", "other", 4) == []  # another address: its own room
    assert sorted(name for name in manager.queues if name[0] in "ot") == sorted(
        [f"one{n}" for n in range(4)] + ["two0", "two1"] + [f"other{n}" for n in range(4)]
    )
    manager.delete_queue("one0")
    assert await raw_queues(broker.port, "127.0.0.1", "three", 2) == [
        "queue 'three1' not created: clients from 127.0.0.1 have max-queues-per-address 6 queues already"
    ]
    broker.router.management.set("/sys$queuemanager", "max-queues-per-address", "8")  # at runtime
    assert await raw_queues(broker.port, "127.0.0.1", "four", 3) == [
        "queue 'four2' not created: clients from 127.0.0.1 have max-queues-per-address 8 queues already"
    ]
