"""Foreign AMQP clients at both ends of a router network: a python-qpid-proton client on
router ``a`` sends to ``q@c`` through ``b`` and a rhea client on ``c`` receives it with the
body, properties and application properties the producer set; request/reply across two
routers, proton asking through a temporary (dynamic) queue on ``a``, rhea answering on ``b``
to the reply-to it was given (``tmp$…@a``).

rhea runs as a Node.js process (``tests/interop/rhea_routed.js``); proton's blocking API
runs in a worker thread.
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import uuid
from collections.abc import Callable

import trio
from proton import Message
from proton.utils import BlockingConnection

from tests.harness.network import Network
from tests.interop.test_rhea import INTEROP, install_rhea  # skips this module where node is missing


async def start_chain(network: Network, *names: str) -> None:
    await network.start_routers(*names)
    for near, far in itertools.pairwise(names):
        network.connect(near, far)
    await network.settle({names[0]: {name: hops for hops, name in enumerate(names[1:], 1)}})


def proton_address(network: Network, router: str) -> str:
    return network.url(router).removeprefix("amqp://")


async def run_rhea(
    network: Network,
    mode: str,
    router: str,
    queue: str,
    count: int,
    nursery: trio.Nursery,
    on_ready: Callable[[], object],
) -> list[dict]:
    """Run ``rhea_routed.js`` against ``router``; ``on_ready`` runs in a thread once rhea's
    receiver is attached. Returns rhea's events once both rhea and ``on_ready`` are done (a
    requester gets its last reply after the server has sent it and left)."""
    events, pending = [], b""
    async with trio.open_nursery() as clients:
        process = await nursery.start(
            functools.partial(
                trio.run_process,
                ["node", "rhea_routed.js", mode, network.url(router).rsplit(":", 1)[1], queue, str(count)],
                cwd=INTEROP,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
        )
        async for chunk in process.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                event = json.loads(line) if line.startswith(b"{") else {"event": "output", "text": line.decode()}
                events.append(event)
                if event["event"] == "ready":
                    clients.start_soon(trio.to_thread.run_sync, on_ready)
        assert await process.wait() == 0, f"rhea_routed.js {mode} failed: {events}"
    return events


async def test_proton_sends_through_a_middle_router_and_rhea_receives_it_unchanged(nursery, tmp_path):
    await trio.to_thread.run_sync(install_rhea)
    network = Network(nursery, tmp_path)
    await start_chain(network, "a", "b", "c")
    sent = [
        Message(
            body=f"order {n}",
            subject="orders",
            id=f"id-{n}",
            correlation_id=f"corr-{n}",
            content_type="text/plain",
            durable=True,
            priority=7,
            properties={"n": n, "customer": "ACME", "rate": 1.5, "urgent": n % 2 == 0},
        )
        for n in range(5)
    ]

    def proton_sends() -> None:
        connection = BlockingConnection(proton_address(network, "a"), timeout=30)
        try:
            sender = connection.create_sender("orders@c")
            for message in sent:
                sender.send(message)  # waits for the outcome; raises unless accepted
        finally:
            connection.close()

    with trio.fail_after(120):
        events = await run_rhea(network, "receive", "c", "orders", len(sent), nursery, proton_sends)
    received = [event for event in events if event["event"] == "message"]
    assert [
        (
            m["body"],
            m["subject"],
            m["message_id"],
            m["correlation_id"],
            m["content_type"],
            m["durable"],
            m["priority"],
            m["properties"],
        )
        for m in received
    ] == [(m.body, m.subject, m.id, m.correlation_id, m.content_type, True, 7, m.properties) for m in sent]
    annotations = received[0]["annotations"]
    assert (
        annotations["x-opt-martinet-src"],
        annotations["x-opt-martinet-dest"],
        annotations["x-opt-martinet-queue"],
        annotations["x-opt-martinet-hops"],
    ) == ("a", "c", "orders", 2)


async def test_request_reply_across_two_routers_through_a_temporary_queue(nursery, tmp_path):
    await trio.to_thread.run_sync(install_rhea)
    network = Network(nursery, tmp_path)
    await start_chain(network, "a", "b")
    replies: list[tuple[str, object, str]] = []

    def proton_asks() -> None:
        connection = BlockingConnection(proton_address(network, "a"), timeout=30)
        try:
            inbox = connection.create_receiver(None, dynamic=True)
            reply_to = inbox.link.remote_source.address
            requests = connection.create_sender("service@b")
            for n in range(3):
                requests.send(Message(body=f"ping {n}", reply_to=reply_to, id=f"req-{n}-{uuid.uuid4()}"))
                answer = inbox.receive(timeout=30)
                inbox.accept()
                replies.append((answer.body, answer.correlation_id, reply_to))
        finally:
            connection.close()

    with trio.fail_after(120):
        events = await run_rhea(network, "serve", "b", "service", 3, nursery, proton_asks)
    assert [(body, corr.split("-")[1]) for body, corr, _ in replies] == [(f"PING {n}", str(n)) for n in range(3)]
    reply_to = replies[0][2]
    assert reply_to.startswith("tmp$") and reply_to.endswith("@a")
    assert [event["reply_to"] for event in events if event["event"] == "served"] == [reply_to] * 3
