"""A router whose store's disk runs low, or full: producers of persistent messages get an
error, nothing acknowledged is lost, everyone else is served, and it takes persistent messages
again when space returns. The store lives on a small tmpfs that the test mounts (as root) and
fills with a ballast file."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import trio

from martinet.messaging.client import ConnectionLost, DeliveryMode, JMSError, Queue, TextMessage, connect
from martinet.swiftlets.store.api import PutMessage
from martinet.swiftlets.store.config import StoreConfig

from tests.harness.network import ROUTING_STACK, routing_config
from tests.harness.polling import wait_until
from tests.harness.routers import AmqpBroker, RunningRouter
from tests.swiftlets.routing.test_limits import _waiting_for_room
from tests.swiftlets.routing.test_transfer_network import consume, produce, verify

MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs at ``tmp_path/disk``, unmounted after the test."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True).returncode
        == 0
    )
    if not mounted:
        message = "mounting a tmpfs for the store needs root (and a system that lets it mount)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder, leave: int) -> None:
    """Write ``folder/ballast`` until the file system has about ``leave`` bytes free (0: full)."""
    stat = os.statvfs(folder)
    size = max(stat.f_bavail * stat.f_frsize - leave, 0)
    chunk = b"\0" * MiB
    with open(folder / "ballast", "ab") as file:
        try:
            while size > 0 or leave == 0:
                file.write(chunk[: min(size, MiB)] if leave else chunk)
                file.flush()
                size -= MiB
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


async def start(nursery, tmp_path, disk, limit_kb: int) -> AmqpBroker:
    broker = AmqpBroker(nursery, tmp_path)
    text = broker.path.read_text()
    store = f'path="{tmp_path / "store"}" sync="normal"'
    assert store in text
    broker.path.write_text(
        text.replace(store, f'path="{disk}" sync="normal" disk-free-limit-kb="{limit_kb}" disk-check-interval="100"')
    )
    return await broker.start()


def space(broker) -> dict:
    usage = broker.router.management.resolve("/sys$store/usage").properties()
    return {key: usage[key] for key in ("disk-alarm", "disk-full")}


async def drain(broker, queue: str) -> list[str]:
    async with connect(broker.url) as connection:
        session = await connection.session()
        consumer = await session.consumer(Queue(queue))
        texts = []
        while (message := await consumer.receive(1)) is not None:
            texts.append(message.text)
        return texts


async def test_a_disk_that_runs_low_refuses_persistent_messages_until_space_returns(nursery, tmp_path, small_disk):
    broker = await start(nursery, tmp_path, small_disk, limit_kb=4096)
    fill(small_disk, leave=8 * MiB)
    # the alarm counts from its last reading, taken before the ballast: fast producers could
    # fill the disk before the next one (the commit then waits for space, as the next test shows)
    usage = broker.router.management.resolve("/sys$store/usage")
    await wait_until(lambda: usage.properties()["disk-free"] <= 8 * MiB, what="a reading of the ballast")
    accepted, refused = [], []
    async with connect(broker.url) as connection:
        session = await connection.session()
        producer = await session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(400):  # 64 KiB each: the 4 MiB above the limit hold a few dozen
            try:
                await producer.send(TextMessage(f"{n:04}" + "x" * 65_536))
            except JMSError as exc:
                refused.append((n, exc.condition, str(exc)))
                break
            accepted.append(f"{n:04}")
        assert len(refused) == 1 and 0 < len(accepted) < 400
        n, condition, text = refused[0]
        assert condition == "amqp:resource-limit-exceeded"
        assert "router r1 refuses persistent messages: the disk of its store" in text
        assert "under disk-free-limit-kb (4.0 MiB)" in text
        assert space(broker) == {"disk-alarm": True, "disk-full": False}

        # everyone else is served: a non-persistent message goes through and comes back
        transient = await session.producer(Queue("chat"), delivery_mode=DeliveryMode.NON_PERSISTENT)
        await transient.send(TextMessage("hello"))
        assert await drain(broker, "chat") == ["hello"]

        (small_disk / "ballast").unlink()
        await wait_until(lambda: not space(broker)["disk-alarm"], what="the disk alarm off")
        for m in range(n, n + 5):  # the refused one again, and more
            await producer.send(TextMessage(f"{m:04}" + "x" * 65_536))
            accepted.append(f"{m:04}")
    assert [text[:4] for text in await drain(broker, "orders")] == accepted


async def test_a_commit_that_meets_a_full_disk_waits_for_space_and_loses_nothing(nursery, tmp_path, small_disk):
    """With no early alarm (a limit of 0) the disk fills under a commit: SQLite rolls it back,
    the store tries it again until space returns, and its producer waits for its answer
    meanwhile. The alarm is on while it waits: another producer is refused."""
    broker = await start(nursery, tmp_path, small_disk, limit_kb=0)
    body = "x" * (256 * 1024)  # more than a WAL that held one small commit can hold again
    async with connect(broker.url) as connection:
        session = await connection.session()
        producer = await session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT)
        await producer.send(TextMessage("0000"))
        accepted = ["0000"]
        fill(small_disk, leave=0)

        async def produce() -> None:
            for n in range(1, 4):
                await producer.send(TextMessage(f"{n:04}" + body))
                accepted.append(f"{n:04}")

        async with trio.open_nursery() as sending:
            sending.start_soon(produce)
            await wait_until(lambda: space(broker)["disk-full"], what="a commit that met the full disk")
            assert accepted == ["0000"]  # its producer has no answer

            other = await session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT)
            with pytest.raises(JMSError) as refusal:
                await other.send(TextMessage("refused"))
            assert refusal.value.condition == "amqp:resource-limit-exceeded"
            assert f"the disk of its store ({small_disk}) is full" in str(refusal.value)
            transient = await session.producer(Queue("chat"), delivery_mode=DeliveryMode.NON_PERSISTENT)
            await transient.send(TextMessage("hello"))
            assert await drain(broker, "chat") == ["hello"]

            (small_disk / "ballast").unlink()
        assert space(broker) == {"disk-alarm": False, "disk-full": False}
    assert [text[:4] for text in await drain(broker, "orders")] == ["0000", "0001", "0002", "0003"]
    assert broker.router.management.get("/sys$store/usage", "disk-alarms") == 1


async def test_the_store_tells_the_real_cause_of_a_full_disk_and_goes_on_when_it_grows(nursery, small_disk):
    """SQLite has rolled the batch back itself after SQLITE_FULL: the store's own rollback
    then fails ("cannot rollback - no transaction is active"), which must not hide the cause.
    The batch is tried again and goes through once the file system is made larger."""
    running = RunningRouter(nursery, small_disk)
    await running.start()
    store = running.store
    fill(small_disk, leave=0)
    async with trio.open_nursery() as committing:
        committing.start_soon(store.commit, [PutMessage(n, "q", os.urandom(1000)) for n in range(1, 101)])
        await wait_until(lambda: store.space.full is not None, what="a commit that met the full disk")
        assert "database or disk is full" in store.space.full and "cannot rollback" not in store.space.full
        subprocess.run(["mount", "-o", "remount,size=32m", str(small_disk)], check=True)
    assert store.space.full is None and running.failure is None
    await running.stop()
    await running.start()
    assert running.store.recovered.message_count == 100


async def test_a_router_stopped_while_its_disk_is_full_keeps_what_it_acknowledged(nursery, tmp_path, small_disk):
    """The commit that waits for space does not hold the stop; it was never answered, so its
    producer learns nothing was kept, and the restarted router has exactly what it acknowledged."""
    broker = await start(nursery, tmp_path, small_disk, limit_kb=0)
    async with connect(broker.url) as connection:
        session = await connection.session()
        producer = await session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(3):
            await producer.send(TextMessage(f"{n:04}"))
        fill(small_disk, leave=0)
        outcome: list[BaseException] = []

        async def blocked() -> None:
            try:
                await producer.send(TextMessage("0003" + "x" * (256 * 1024)))
            except (JMSError, ConnectionLost) as exc:
                outcome.append(exc)

        async with trio.open_nursery() as sending:
            sending.start_soon(blocked)
            await wait_until(lambda: space(broker)["disk-full"], what="a commit that met the full disk")
            await broker.stop()
        assert len(outcome) == 1  # not acknowledged
    (small_disk / "ballast").unlink()
    again = await start(nursery, tmp_path, small_disk, limit_kb=0)  # on the same store
    assert await drain(again, "orders") == ["0000", "0001", "0002"]


@pytest.mark.parametrize("xa", [True, False], ids=["xa", "non-xa"])
async def test_routing_links_hold_their_transfers_while_the_receivers_disk_is_low(network, small_disk, xa):
    """Router b's disk is under its limit: what a routes to b waits in a's rt$b (b's link
    holds its batches, as for a full queue; nothing is refused, nothing is dropped). Space
    returns on b, and every message arrives once, in order."""
    await start_routers(network, "a", xa=xa)
    store = StoreConfig(path=str(small_disk), sync="normal", disk_free_limit_kb=4096, disk_check_interval=100)
    await start_routers(network, "b", xa=xa, store=store)
    b_management = network.routers["b"].management
    fill(small_disk, leave=2 * MiB)
    await wait_until(lambda: b_management.get("/sys$store/usage", "disk-alarm"), what="b's disk alarm on")
    network.connect("a", "b", **{"use-xa": str(xa).lower()})
    await network.settle({"a": {"b": 1}})
    a = network.routers["a"].swiftlet("sys$queuemanager")
    count = 300
    await produce(network.url("a"), "orders@b", count)  # returns once a holds them all
    await wait_until(lambda: _waiting_for_room(network, "b") > 0, what="b's link holding a batch")
    assert a.queues["rt$b"].size == count
    assert network.routers["b"].swiftlet("sys$queuemanager").queues["orders"].size == 0  # (made by the first try)
    (small_disk / "ballast").unlink()
    verify(await consume(network.url("b"), "orders", count), count)
    assert a.queues["rt$b"].size == 0
    usage = network.routers["a"].management.resolve("/sys$routing/usage/connections/connector:b").properties()
    assert usage["messages-out"] == count  # one link all along


async def start_routers(network, name: str, *, xa: bool, store: StoreConfig | None = None) -> None:
    swiftlets = {"sys$routing": routing_config(listener={"use_xa": xa})}
    if store is not None:
        swiftlets["sys$store"] = store
    await network.start(network.config(name, startorder=ROUTING_STACK, swiftlets=swiftlets))
