"""The router's memory budget as a whole (sys$queuemanager's memory-limit-kb): what it counts,
the alarm past its high-water mark, and what the alarm holds back.

Real routers in this process, on stores in the test's temp dir; our AMQP client over
sockets on port 0 (numbered producers, verifying consumers); routing links between two
routers. Publishers are shown held by their link credit (counted: it is 0 and none is
granted while the alarm is on), never by a time; the accounted bytes are checked to the
byte against the queue's own entries, in usage and in /metrics.
"""

from __future__ import annotations

import logging

import pytest
import trio

from martinet.kernel import Router
from martinet.messaging.client import DeliveryMode, JMSError, Queue, TextMessage, connect
from martinet.messaging.message import build, head_length
from martinet.swiftlets.mgmt.client import AdminClient
from martinet.swiftlets.queuemanager.config import QueueManagerConfig
from martinet.swiftlets.queuemanager.memory import ENTRY_COST
from martinet.swiftlets.web.metrics import UsageCollector

from tests.harness.polling import wait_until
from tests.swiftlets.jms.test_hostile_limits import ATTACH, FLOW, RawClient, attach, begin, transfer
from tests.swiftlets.queuemanager.test_queue_budget import MGMT_STACK, PASSWORDS, users
from tests.swiftlets.routing.test_limits import _waiting_for_room
from tests.swiftlets.routing.test_transfer_network import consume, produce, start, verify

ROUTER = """
<router name="r1" startorder="sys$store sys$authentication sys$queuemanager sys$topicmanager sys$jms"
        shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$authentication" authentication-enabled="false"/>
  <swiftlet name="sys$queuemanager" memory-limit-kb="64" memory-low-watermark-percent="50"
             memory-alarm-non-persistent="{policy}">
    <queues><queue name="q" flowcontrol-start-queuesize="-1"/></queues>
  </swiftlet>
  <swiftlet name="sys$jms">
    <listeners>
      <listener name="amqp" port="0" bind-address="127.0.0.1" incoming-credit="10" max-frame-size="16384"/>
    </listeners>
  </swiftlet>
</router>
"""
MEMORY = "/sys$queuemanager/usage"
PAD = "x" * 900  # about 1 KiB a message: some 45 of them fill the 64 KiB budget


def _memory_of(queue) -> int:
    """What ``queue``'s available entries count against the budget: the message bytes each
    keeps in memory (only the leading sections of one swapped out) plus the fixed cost of each."""
    return sum((len(e.message.raw) if e.swapped else e.bytes) + ENTRY_COST for e in queue.browse())


def _metric(router: Router, name: str) -> float:
    """The value of the /metrics sample ``name`` (the collector the web swiftlet serves)."""
    for family in UsageCollector(router.name, router.management).collect():
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no metric {name}")


async def _drain(url: str, count: int) -> list[str]:
    """The texts of ``count`` messages received from queue q, and then no more."""
    received: list[str] = []
    async with connect(url) as connection, connection.session() as session:
        async with session.consumer(Queue("q")) as consumer:
            with trio.fail_after(60):
                while len(received) < count:
                    received.append((await consumer.receive(30)).text)
            assert await consumer.receive(0.2) is None  # nothing more: no duplicate
    return received


def _verify(received: list[str], publishers: int, total: int) -> None:
    """Each publisher's ``total`` numbered messages, once each and in its order."""
    for number in range(publishers):
        mine = [text.split(":")[1] for text in received if text.startswith(f"{number}:")]
        assert mine == [f"{n:04d}" for n in range(total)]


async def _router(tmp_path, nursery, policy: str = "accept") -> tuple[Router, int]:
    """The router of :data:`ROUTER` (``policy``: its memory-alarm-non-persistent), started;
    its AMQP port."""
    path = tmp_path / "router.xml"
    path.write_text(ROUTER.format(store=tmp_path / "store", policy=policy))
    router = Router.from_file(path)
    await nursery.start(router.run)
    return router, router.management.get("/sys$jms/usage/listeners/amqp", "port")


async def test_publishers_get_no_credit_above_the_budget_and_every_message_arrives_once(tmp_path, nursery, caplog):
    """Three publishers of persistent messages into a queue nobody reads yet (flow control
    off). Past 64 KiB accounted the alarm goes on: each publisher uses up the credit it has
    and gets no more — its link stays attached and its sends wait. A consumer drains the
    queue; under the low-water mark (32 KiB) the publishers get credit again. A fourth
    publisher that attaches while the alarm is on gets no credit at all (a new link is no
    way around it) until then. Every message arrives once, in each publisher's order, and
    the budget ends empty."""
    caplog.set_level(logging.INFO, logger="martinet.swiftlets.queuemanager.memory")
    router, port = await _router(tmp_path, nursery)
    url = f"amqp://127.0.0.1:{port}"
    manager = router.swiftlet("sys$queuemanager")
    queue = manager.queues["q"]
    publishers, total = 3, 150
    sent = [0] * (publishers + 1)
    links = []

    async def publish(number: int) -> None:
        async with connect(url) as connection, connection.session() as session:
            async with session.producer(Queue("q"), delivery_mode=DeliveryMode.PERSISTENT) as producer:
                links.append(producer._link.link)  # the client's end: the credit it holds
                for n in range(total):
                    await producer.send(TextMessage(f"{number}:{n:04d}:{PAD}"))  # returns once accepted
                    sent[number] += 1

    async with trio.open_nursery() as publishing:
        for number in range(publishers):
            publishing.start_soon(publish, number)
        await wait_until(
            lambda: (
                len(links) == publishers
                and manager.memory.on
                and all(link.credit == 0 for link in links)  # none has credit left
                and queue.size == sum(sent)
            ),  # and each send made was accepted
            what="every publisher out of credit under the alarm",
        )
        # Held by credit: a publisher with none cannot send, and the router grants none.
        assert sum(sent) < publishers * total
        per_message = queue.memory // queue.size
        # the alarm went on past 64 KiB; after it, each link had at most its window of 10 left
        assert 64 * 1024 < queue.memory <= 64 * 1024 + publishers * 10 * per_message + per_message
        usage = router.management.resolve(MEMORY).properties()
        expected = _memory_of(queue)
        assert (usage["memory-used"], usage["memory-messages"], usage["memory-buffers"]) == (expected, expected, 0)
        assert (usage["memory-limit"], usage["memory-low-watermark"]) == (64 * 1024, 32 * 1024)
        assert (usage["memory-alarm"], usage["memory-alarms"]) == (True, 1)
        assert usage["memory-waiting"] == publishers  # one wait per held link
        assert router.management.get("/sys$queuemanager/usage/queues/q", "memory") == expected
        assert _metric(router, "martinet_queuemanager_memory_used") == expected
        assert _metric(router, "martinet_queuemanager_memory_alarm") == 1
        assert _metric(router, "martinet_queuemanager_memory_alarms_total") == 1
        connections = router.management.resolve("/sys$jms/usage/connections").children

        def memory_waits() -> list[int]:
            return sorted(c.properties()["memory-waits"] for c in connections.values())

        assert memory_waits() == [1] * publishers
        publishing.start_soon(publish, publishers)  # attaches under the alarm
        await wait_until(lambda: len(links) == publishers + 1 and memory_waits() == [1] * (publishers + 1))
        assert (links[-1].credit, sent[publishers]) == (0, 0)  # held from its attach: never granted any

        received = await _drain(url, (publishers + 1) * total)
    _verify(received, publishers + 1, total)
    await wait_until(lambda: queue.size == 0 and manager.memory.used == 0, what="the accepts settled")
    usage = router.management.resolve(MEMORY).properties()
    assert (usage["memory-used"], usage["memory-alarm"], usage["memory-waiting"]) == (0, False, 0)
    # one line each time it went on and off (publishers resumed, it may have gone on again)
    on = [r for r in caplog.records if "memory alarm on" in r.getMessage()]
    off = [r for r in caplog.records if "memory alarm off" in r.getMessage()]
    assert len(on) == len(off) == usage["memory-alarms"] >= 1
    router.request_stop()


@pytest.mark.parametrize("policy", ["accept", "refuse"])
async def test_non_persistent_messages_past_the_budget_are_taken_or_refused_by_policy(tmp_path, nursery, policy):
    """Three publishers of non-persistent messages (no store copy: nothing swaps them out)
    into a queue nobody reads yet. With ``accept`` the alarm stops their credit, but what
    each link was granted before still comes in and is taken, past the budget. With
    ``refuse`` every message from the one after the alarm went on is refused
    (amqp:resource-limit-exceeded) and counted, so the queue holds at most one message past
    the budget; the publisher knows which it was and sends it again once it has credit. A
    consumer drains the queue: every message once, in each publisher's order.

    Each send waits for its outcome through the producer's link: the JMS-shaped ``send`` does
    not wait for a non-persistent message's and raises a refusal at a later send, without
    saying which message it was."""
    router, port = await _router(tmp_path, nursery, policy)
    url = f"amqp://127.0.0.1:{port}"
    manager = router.swiftlet("sys$queuemanager")
    queue = manager.queues["q"]
    publishers, total = 3, 150
    sent, refused = [0] * publishers, [0] * publishers
    links = []

    async def publish(number: int) -> None:
        async with connect(url) as connection, connection.session() as session:
            async with session.producer(Queue("q"), delivery_mode=DeliveryMode.NON_PERSISTENT) as producer:
                links.append(producer._link.link)
                while sent[number] < total:
                    text = f"{number}:{sent[number]:04d}:{PAD}"
                    try:
                        await (await producer._link.send(build(text, message_id=text[:6]).raw)).wait()
                    except JMSError as exc:  # refused: the same message again, when there is credit
                        assert exc.condition == "amqp:resource-limit-exceeded", exc
                        refused[number] += 1
                    else:
                        sent[number] += 1

    async with trio.open_nursery() as publishing:
        for number in range(publishers):
            publishing.start_soon(publish, number)
        await wait_until(
            lambda: (
                len(links) == publishers
                and manager.memory.on
                and all(link.credit == 0 for link in links)
                and queue.size == sum(sent)  # each accepted send is in the queue,
                and manager.memory.refused == sum(refused)  # and each refusal reached its publisher
            ),
            what="every publisher out of credit under the alarm",
        )
        per_message = queue.memory // queue.size  # (every message is as long as the others)
        usage = router.management.resolve(MEMORY).properties()
        assert usage["memory-refused"] == _metric(router, "martinet_queuemanager_memory_refused_total") == sum(refused)
        if policy == "refuse":
            assert 64 * 1024 < queue.memory <= 64 * 1024 + per_message  # only the one that turned it on
            assert sum(refused) > 0
        else:  # each link had at least half its window of 10 left when the alarm went on
            assert queue.memory > 64 * 1024 + publishers * 4 * per_message
            assert sum(refused) == 0
        received = await _drain(url, publishers * total)
    _verify(received, publishers, total)
    assert router.management.get(MEMORY, "memory-refused") == sum(refused)
    router.management.set("/sys$queuemanager", "memory-alarm-non-persistent", "refuse")  # at runtime too
    assert manager.memory.refuse_non_persistent
    router.request_stop()


async def test_the_budget_counts_swapped_out_messages_by_what_stays_and_follows_its_settings(make_broker):
    """A persistent message beyond the cache counts only its leading sections (its body is
    in the store); a deleted queue gives back all it counted. A lowered limit turns the
    alarm on at once, a raised one off; -1 with memory-limit-percent 0: no budget."""
    broker = make_broker(manager='memory-limit-kb="1024"', queues='<queue name="big" cache-size="2"/>')
    router = await broker.start()
    manager = router.swiftlet("sys$queuemanager")
    messages = [build(b"x" * 1000, durable=True, message_id=f"m{n}", properties={"n": n}) for n in range(10)]
    for message in messages:
        await manager.send("big", message)  # durable on return: swapped out past the cache
    big = manager.queues["big"]
    assert (big.size, big.swapped) == (10, 8)
    head = head_length(messages[0].raw)
    expected = 2 * (len(messages[0].raw) + ENTRY_COST) + 8 * (head + ENTRY_COST)
    assert (big.memory, manager.memory.used, manager.memory.on) == (expected, expected, False)

    management = router.management
    management.set("/sys$queuemanager", "memory-limit-kb", 1)  # 1 KiB: far below
    assert management.get(MEMORY, "memory-alarm") is True and management.get(MEMORY, "memory-limit") == 1024
    management.set("/sys$queuemanager", "memory-limit-kb", 64)
    assert management.get(MEMORY, "memory-alarm") is False and management.get(MEMORY, "memory-alarms") == 1
    management.set("/sys$queuemanager", "memory-limit-percent", 0)
    management.set("/sys$queuemanager", "memory-limit-kb", -1)
    assert management.get(MEMORY, "memory-limit") == -1

    consumer = big.consumer()
    consumer.flow(3)
    await wait_until(lambda: consumer.buffered == 3)
    for _ in range(3):
        consumer.accept(consumer.receive_nowait())  # read back, then consumed
    assert manager.memory.used == big.memory == _memory_of(big)
    manager.delete_queue("big")
    assert manager.memory.used == 0


async def test_incomplete_messages_of_connections_count_against_the_budget(tmp_path, nursery):
    """Connections holding multi-frame messages they never finish (each below its own
    max-incoming-buffer) count towards the budget, byte for byte, and turn the alarm on
    together; the bytes go when the connections end."""
    router, port = await _router(tmp_path, nursery)
    manager = router.swiftlet("sys$queuemanager")
    clients = []
    for _ in range(3):
        client = await RawClient.connect(port)
        await client.send(begin(0) + attach("l0", 0) + attach("l1", 1))
        await client.until(lambda got: sum(code == FLOW for _, code, _ in got) == 2)  # credit on both
        clients.append(client)
    chunk = b"x" * 12_000
    for client in clients[:2]:
        await client.send(transfer(0, 0, chunk, more=True) + transfer(1, 1, chunk, more=True) + attach("l2", 2))
        await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 3)  # all read
    assert router.management.get(MEMORY, "memory-buffers") == manager.memory.used == 4 * 12_000
    assert not manager.memory.on  # 48,000 bytes: under 64 KiB
    await clients[2].send(transfer(0, 0, chunk, more=True) + transfer(0, None, chunk, more=True) + attach("l2", 2))
    await clients[2].until(lambda got: sum(code == ATTACH for _, code, _ in got) == 3)
    assert (manager.memory.buffers, manager.memory.on) == (6 * 12_000, True)
    for client in clients:
        await client.aclose()
    await wait_until(lambda: manager.memory.used == 0, what="the connections' bytes given back")
    assert not manager.memory.on
    router.request_stop()


@pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
async def test_routing_links_hold_their_transfers_while_the_receivers_alarm_is_on(network, xa):
    """Router b is over its budget: its routing link's batches wait for the alarm to go off
    as they wait for room in a full queue (the link stays up); the rest waits in a's rt$b.
    A consumer on b drains, b's alarm goes off, and every message arrives once, in order."""
    await start(network, "a", "b", listener={"use_xa": xa})
    b_management = network.routers["b"].management
    b_management.add("/sys$queuemanager/queues", "orders", {"flowcontrol-start-queuesize": "-1"})
    b_management.set("/sys$queuemanager", "memory-limit-kb", 16)
    network.connect("a", "b", **{"use-xa": str(xa).lower()})
    await network.settle({"a": {"b": 1}})
    a = network.routers["a"].swiftlet("sys$queuemanager")
    b = network.routers["b"].swiftlet("sys$queuemanager")
    count = 300
    await produce(network.url("a"), "orders@b", count)  # returns once a holds them all
    await wait_until(lambda: b.memory.on and _waiting_for_room(network, "b"), what="b's link holding a batch")
    assert a.queues["rt$b"].size + b.queues["orders"].size == count
    assert b.queues["orders"].size < count  # the rest waits at a
    assert b_management.get(MEMORY, "memory-used") == _memory_of(b.queues["orders"])
    verify(await consume(network.url("b"), "orders", count), count)
    assert a.queues["rt$b"].size == 0
    await wait_until(lambda: b.memory.used == 0 and not b.memory.on, what="b's budget empty")
    usage = network.routers["a"].management.resolve("/sys$routing/usage/connections/connector:b").properties()
    assert usage["messages-out"] == count  # one link all along


async def test_management_users_are_not_held_by_the_alarm(network):
    """While the alarm is on, a plain user's new producer gets no credit, but a user of one
    of sys$mgmt's groups still manages the router (its requests are not held): it reads the
    alarm in usage and purges the queue that fills the router, and the plain user's
    producer gets its credit and sends."""
    router = await network.start(
        network.config(
            "a",
            startorder=MGMT_STACK,
            swiftlets={"sys$authentication": users(), "sys$queuemanager": QueueManagerConfig(memory_limit_kb=16)},
        )
    )
    manager = router.swiftlet("sys$queuemanager")
    for n in range(40):  # 40 × about 1,300 bytes: past 16 KiB
        await manager.send("full", build(b"x" * 1000, message_id=f"f{n}"))
    assert manager.memory.on
    url = network.url("a")
    async with connect(url, user="bob", password=PASSWORDS["bob"]) as connection, connection.session() as session:
        async with session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT) as producer:
            connections = router.management.resolve("/sys$jms/usage/connections").children
            await wait_until(lambda: [c.properties()["memory-waits"] for c in connections.values()] == [1])
            assert producer._link.link.credit == 0
            async with AdminClient.open(url, user="root", password=PASSWORDS["root"]) as admin:
                usage = await admin.call(None, "get", path=MEMORY)
                assert usage["properties"]["memory-alarm"] is True
                await admin.call(
                    None, "invoke", path="/sys$queuemanager/usage/queues/full", operation="purge", force=True
                )
            assert not manager.memory.on
            await producer.send(TextMessage("after"))  # credit again: accepted
    assert manager.queues["orders"].size == 1
