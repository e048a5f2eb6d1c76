"""Addressing other routers (and the ``unroutable`` queue): real
routers in one process (the ``network`` fixture), real AMQP clients (ours, and proton's).

While a router ``R`` is known — a static route or a learned route — a send to ``q@R`` is
accepted into the persistent routing queue ``rt$R`` (and moved on while a link leads to R:
with only a static route the messages wait there); an unknown ``R`` is refused with
``amqp:not-found`` saying so; when ``R`` is removed the redirection goes and ``rt$R`` keeps
its messages. Temporary queues are given to
clients as ``tmp$…@<router>``.
"""

from __future__ import annotations

import pytest
import trio
from proton import Message as ProtonMessage
from proton.utils import BlockingConnection, LinkDetached, SendException

from martinet.kernel import ManagementError
from martinet.messaging.client import InvalidDestination, Queue, TemporaryQueue, TextMessage, connect
from martinet.messaging.like import like_pattern
from martinet.swiftlets.queuemanager.api import QueueNotFound
from martinet.swiftlets.routing.api import DestinationAdded, redirection_predicate, routing_queue

from tests.harness.network import ROUTING_STACK, Network, routing_config

UNKNOWN = "router 'nowhere' is not known to router 'a' (no route and no static route)"


def queue_manager(network, router: str):
    return network.routers[router].swiftlet("sys$queuemanager")


def waiting(network, router: str, destination: str) -> list[tuple[str | None, str]]:
    """(to, body) of the messages waiting in ``rt$<destination>`` on ``router``."""
    queue = queue_manager(network, router).queues[routing_queue(destination)]
    return [(entry.message.properties.to, entry.message.body()) for entry in queue.browse()]


def table_usage(network, router: str, destination: str) -> dict:
    return network.routers[router].management.resolve(f"/sys$routing/usage/routing-table/{destination}").properties()


async def send(url: str, address: str, *bodies: str, anonymous: bool = False) -> None:
    """Send text messages with our client: over a producer for ``address``, or an anonymous one."""
    async with connect(url) as connection, connection.session() as session:
        async with session.producer(None if anonymous else Queue(address)) as producer:
            for body in bodies:
                await producer.send(TextMessage(body), Queue(address) if anonymous else None)


def proton_send(url: str, address: str, body: str, *, anonymous: bool = False) -> None:
    connection = BlockingConnection(url, timeout=10)
    try:
        sender = connection.create_sender(None if anonymous else address)
        sender.send(ProtonMessage(body=body, address=address, durable=True))
    finally:
        connection.close()


def in_thread(function, *args, **kwargs):
    return trio.to_thread.run_sync(lambda: function(*args, **kwargs))


def test_the_redirection_pattern_is_escaped():
    assert redirection_predicate("paris") == "%@paris"
    assert redirection_predicate("a_b") == "%@a\\_b"
    pattern = like_pattern(redirection_predicate("a_b"))
    assert pattern.matches("q@a_b") and not pattern.matches("q@axb") and not pattern.matches("q@a_bc")
    assert routing_queue("a_b") == "rt$a_b"


async def test_a_static_route_makes_a_router_addressable_and_its_removal_keeps_the_messages(network):
    await network.start_routers("a")
    url, management = network.url("a"), network.routers["a"].management
    manager = queue_manager(network, "a")
    assert "unroutable" in manager.queues  # every router with routing has it
    assert "rt$z" not in manager.queues

    management.add("/sys$routing/static-routes", "z")
    assert "rt$z" in manager.queues and manager.resolve("orders@z") == "rt$z"
    await send(url, "orders@z", "one", "two")
    await send(url, "orders@z", "three", anonymous=True)
    await in_thread(proton_send, url, "orders@z", "four")
    await in_thread(proton_send, url, "invoices@z", "five", anonymous=True)
    assert waiting(network, "a", "z") == [
        ("orders@z", "one"),
        ("orders@z", "two"),
        ("orders@z", "three"),
        ("orders@z", "four"),
        ("invoices@z", "five"),
    ]  # unchanged, in order
    usage = table_usage(network, "a", "z")
    assert usage["queue"] == "rt$z" and usage["backlog"] == 5 and usage["static"] is True
    assert management.get("/sys$queuemanager/usage/queues/rt$z", "messages") == 5
    assert manager.queues["rt$z"].settings.persistence_mode == "as_message"  # not a temporary queue's

    management.remove("/sys$routing/static-routes", "z")
    with pytest.raises(QueueNotFound, match="router 'z' is not known"):
        manager.resolve("orders@z")
    with pytest.raises(InvalidDestination, match="router 'z' is not known to router 'a'"):
        await send(url, "orders@z", "refused")
    assert len(waiting(network, "a", "z")) == 5  # the queue stays, with its messages

    management.add("/sys$routing/static-routes", "z")  # back: the same queue, still holding them
    await send(url, "orders@z", "six")
    assert [body for _, body in waiting(network, "a", "z")] == ["one", "two", "three", "four", "five", "six"]


async def arrived(network, router: str, queue: str, count: int) -> list[tuple[str | None, str]]:
    """(to, body) of the messages in ``queue`` on ``router`` once it holds ``count`` (bounded wait)."""
    with trio.fail_after(20):
        while (q := queue_manager(network, router).queues.get(queue)) is None or q.size < count:
            await trio.sleep(0.02)
    return [(entry.message.properties.to, entry.message.body()) for entry in q.browse()]


async def test_a_learned_route_makes_a_router_addressable(network):
    await network.start_routers("a", "b")
    added = network.routers["a"].bus.subscribe(DestinationAdded)
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    assert (await added.receive()).router == "b"
    url = network.url("a")
    await send(url, "orders@b", "ours")
    await in_thread(proton_send, url, "orders@b", "proton's")
    assert await arrived(network, "b", "orders", 2) == [("orders@b", "ours"), ("orders@b", "proton's")]
    usage = table_usage(network, "a", "b")
    assert usage["queue"] == "rt$b" and usage["active"] is True
    assert "rt$a" in queue_manager(network, "b").queues  # and the other way round

    network.routers["a"].management.remove("/sys$routing/connectors", "b")
    await network.settle({"a": {}, "b": {}})
    with pytest.raises(InvalidDestination, match="router 'b' is not known to router 'a'"):
        await send(url, "orders@b", "refused", anonymous=True)

    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    await send(url, "orders@b", "again")
    assert [body for _, body in await arrived(network, "b", "orders", 3)] == ["ours", "proton's", "again"]


async def test_a_router_two_hops_away_is_addressable_too(network):
    await network.start_routers("a", "b", "c")
    network.connect("a", "b")
    network.connect("b", "c")
    await network.settle({"a": {"b": 1, "c": 2}})
    await send(network.url("a"), "orders@c", "far")
    assert await arrived(network, "c", "orders", 1) == [("orders@c", "far")]


async def test_an_unknown_router_is_refused_for_an_attach_and_on_the_anonymous_relay(network):
    await network.start_routers("a")
    url = network.url("a")
    with pytest.raises(InvalidDestination) as refused:  # the attach of a producer for q@nowhere
        await send(url, "orders@nowhere", "x")
    assert refused.value.condition == "amqp:not-found" and UNKNOWN in refused.value.description
    with pytest.raises(InvalidDestination) as refused:  # an anonymous producer: the delivery is rejected
        await send(url, "orders@nowhere", "x", anonymous=True)
    assert refused.value.condition == "amqp:not-found" and UNKNOWN in refused.value.description
    with pytest.raises(InvalidDestination) as refused:  # a reply-to on an unknown router, too
        await send(url, "tmp$1@nowhere", "x")
    assert refused.value.condition == "amqp:not-found" and UNKNOWN in refused.value.description

    with pytest.raises(LinkDetached) as detached:
        await in_thread(proton_send, url, "orders@nowhere", "x")
    assert "amqp:not-found" in str(detached.value) and UNKNOWN in str(detached.value)
    with pytest.raises(SendException):
        await in_thread(proton_send, url, "orders@nowhere", "x", anonymous=True)
    assert not any(name.startswith("rt$") for name in queue_manager(network, "a").queues)


async def test_an_underscore_in_a_router_name_matches_only_itself(network):
    await network.start_routers("a")
    management, url = network.routers["a"].management, network.url("a")
    management.add("/sys$routing/static-routes", "a_b")
    with pytest.raises(InvalidDestination, match="router 'axb' is not known"):
        await send(url, "orders@axb", "x")
    await send(url, "orders@a_b", "y")
    assert waiting(network, "a", "a_b") == [("orders@a_b", "y")]
    management.add("/sys$routing/static-routes", "axb")  # its own queue, its own redirection
    await send(url, "orders@axb", "z")
    assert waiting(network, "a", "axb") == [("orders@axb", "z")]
    management.remove("/sys$routing/static-routes", "a_b")  # removes a_b's redirection, not axb's
    await send(url, "orders@axb", "w")
    with pytest.raises(InvalidDestination, match="router 'a_b' is not known"):
        await send(url, "orders@a_b", "v")
    assert len(waiting(network, "a", "axb")) == 2 and len(waiting(network, "a", "a_b")) == 1
    for bad in ("x y", "x@y", "%", "9lives"):  # no router has such a name: no queue, no pattern for it
        with pytest.raises(ManagementError, match="invalid router name"):
            management.add("/sys$routing/static-routes", bad)


async def test_routing_queues_are_kept_over_a_restart(network):
    config = network.config("a", startorder=ROUTING_STACK, swiftlets={"sys$routing": routing_config()})
    await network.start(config)
    network.routers["a"].management.add("/sys$routing/static-routes", "z")  # (not saved in config)
    await send(network.url("a"), "orders@z", "kept")
    await network.stop("a")
    await network.start(config)
    assert waiting(network, "a", "z") == [("orders@z", "kept")]  # recovered, and left alone
    with pytest.raises(InvalidDestination, match="router 'z' is not known"):  # z is not known now
        await send(network.url("a"), "orders@z", "refused")
    network.routers["a"].management.add("/sys$routing/static-routes", "z")
    await send(network.url("a"), "orders@z", "more")
    assert [body for _, body in waiting(network, "a", "z")] == ["kept", "more"]
    assert table_usage(network, "a", "z")["backlog"] == 2


async def test_temporary_queues_carry_their_router(network):
    await network.start_routers("a")
    url = network.url("a")
    async with connect(url) as connection, connection.session() as session:
        temporary = await session.create_temporary_queue()
        assert isinstance(temporary, TemporaryQueue) and temporary.name.endswith("@a")
        name = temporary.name.removesuffix("@a")
        assert name.startswith("tmp$") and name in queue_manager(network, "a").queues
        async with session.consumer(temporary) as consumer:
            await send(url, temporary.name, "reply")  # from another connection, as a reply-to
            await send(url, temporary.name, "relayed", anonymous=True)
            assert [(await consumer.receive(timeout=5)).text for _ in range(2)] == ["reply", "relayed"]

    def proton_dynamic() -> tuple[str, str]:
        proton = BlockingConnection(url, timeout=10)
        try:
            receiver = proton.create_receiver(None, dynamic=True)
            address = receiver.remote_source.address
            proton.create_sender(address).send(ProtonMessage(body="to myself"))
            return address, receiver.receive(timeout=10).body
        finally:
            proton.close()

    address, body = await in_thread(proton_dynamic)
    assert address.startswith("tmp$") and address.endswith("@a") and body == "to myself"


async def test_a_routing_only_router_has_no_queues_to_manage(nursery, tmp_path):
    network = Network(nursery, tmp_path)
    await network.start(
        network.config("solo", startorder=("sys$routing",), swiftlets={"sys$routing": routing_config()})
    )
    network.routers["solo"].management.add("/sys$routing/static-routes", "z")
    usage = table_usage(network, "solo", "z")
    assert usage["static"] is True and "queue" not in usage and "backlog" not in usage
    network.routers["solo"].management.remove("/sys$routing/static-routes", "z")
    await network.stop_all()
