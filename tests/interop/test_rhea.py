"""rhea, the Node.js AMQP 1.0 library, against a live router and our client: sends and
accepts, a JMS selector, a topic by capability, request/reply over a dynamic queue
(``tests/interop/rhea_client.js``, installed from npm at the pinned version on first use);
and rhea where it first broke the router (``tests/interop/rhea_cases.js``)."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from martinet.messaging.client import Queue, TextMessage, Topic, connect

INTEROP = Path(__file__).resolve().parent
if shutil.which("node") is None or shutil.which("npm") is None:
    if os.environ.get("CI"):
        raise RuntimeError("node and npm are missing: .ci/run installs Debian's nodejs and npm")
    pytest.skip(
        "node or npm is missing: `sudo apt-get install nodejs npm` to run the rhea interop test "
        "(it installs rhea from npm on first use)",
        allow_module_level=True,
    )


def install_rhea() -> None:
    if not (INTEROP / "node_modules" / "rhea").exists():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent"],
            cwd=INTEROP,
            check=True,
            timeout=600,
            capture_output=True,
        )


async def test_rhea_and_our_client_through_the_router(amqp_broker):
    await trio.to_thread.run_sync(install_rhea)
    broker = await amqp_broker()
    events: dict[str, dict] = {}
    async with connect(broker.url, client_id="python-side") as connection:
        session = await connection.session()
        await (await session.producer(Queue("to-rhea"))).send(TextMessage("from python", properties={"k": 7}))
        picked = await session.producer(Queue("picked"))
        for colour, body in (("red", "r1"), ("blue", "b1"), ("red", "r2")):
            await picked.send(TextMessage(body, properties={"colour": colour}))
        service = await session.consumer(Queue("service"))
        news = await session.producer(Topic("news"))
        replies = await session.producer()  # anonymous: to each request's reply-to

        async def serve_one_request():
            request = await service.receive(60)
            await replies.send(TextMessage(request.text.upper(), correlation_id=request.message_id), request.reply_to)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_one_request)
                process = await nursery.start(
                    functools.partial(
                        trio.run_process,
                        ["node", "rhea_client.js", str(broker.port)],
                        cwd=INTEROP,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        check=False,
                    )
                )
                pending = b""
                async for chunk in process.stdout:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        event = json.loads(line) if line.startswith(b"{") else {"event": "output", "text": line}
                        events[event.pop("event")] = event
                        if "subscribed" in events and "published" not in events:
                            await news.send(TextMessage("extra!"))
                assert await process.wait() == 0, f"rhea_client.js failed: {events}"
        assert events["sent"] == {"outcomes": ["accepted"] * 3}
        received = events["received"]
        assert received["body"] == "from python" and received["properties"] == {"k": 7}
        assert received["annotations"]["x-opt-martinet-cid"] == "python-side"  # the producer's client id
        assert events["selected"] == {"bodies": ["r1", "r2"]}
        assert events["published"] == {"body": "extra!"}
        assert events["replied"]["body"] == "PING" and events["replied"]["correlation_id"] == "req-1"
        assert events["replied"]["reply_to"].startswith("tmp$")
        assert "closed" in events

        consumer = await session.consumer(Queue("from-rhea"))
        from_rhea = [await consumer.receive(10) for _ in range(3)]
        assert [(m.text, m.properties) for m in from_rhea] == [(f"rhea {n}", {"n": n}) for n in range(3)]
        async with session.browser(Queue("picked")) as browser:  # what was not selected is still there, alone
            assert [m.text async for m in browser] == ["b1"]


async def rhea_case(port: int, case: str, *args: str, timeout: float = 120) -> dict[str, dict]:
    """Run one case of ``tests/interop/rhea_cases.js``: its JSON lines by event name (each
    event's last line; ``round`` events are collected in a list under ``rounds``)."""
    await trio.to_thread.run_sync(install_rhea)
    with trio.fail_after(timeout):
        done = await trio.run_process(
            ["node", "rhea_cases.js", case, str(port), *args],
            cwd=INTEROP,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    events: dict = {"rounds": []}
    for line in done.stdout.decode().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            name = event.pop("event")
            if name == "round":
                events["rounds"].append(event)
            else:
                events[name] = event
    assert done.returncode == 0, f"rhea_cases.js {case} failed: {events}\n{done.stderr.decode()[-2000:]}"
    return events


async def test_durable_subscribers_attached_in_the_first_write(amqp_broker, caplog):
    """Without a user name rhea skips SASL and sends the AMQP header, open,
    begin and a durable subscriber's attach in one go; that attach waits for the store, and
    the connection used to be lost when the bytes after the header were handled before the
    connection's tasks existed (an AssertionError in the listener, 11-25 rounds in 30)."""
    broker = await amqp_broker()
    events = await rhea_case(broker.port, "durable-pipelined", "30")
    assert events["rounds"] == [{"n": n, "bodies": [f"round {n}"]} for n in range(30)]
    assert sorted(broker.router.swiftlet("sys$topicmanager").durable_subscriptions()) == sorted(
        f"pipelined-{n}$subscription" for n in range(30)
    )
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_one_container_two_connections(amqp_broker):
    """Rhea opens every connection of a container with the container's id;
    the second used to be refused ("client id … is in use"). Now both work; only a durable
    subscription held by one is refused to the other (amqp:resource-locked), until the
    first detaches from it."""
    broker = await amqp_broker()
    events = await rhea_case(broker.port, "one-container")
    assert events["both-open"] == {"container_ids": ["one-container", "one-container"], "bodies": ["across"]}
    assert events["refused"] == {"condition": "amqp:resource-locked", "second_still_open": True}
    assert events["taken-over"] == {"bodies": ["after"]}
    assert list(broker.router.swiftlet("sys$topicmanager").durable_subscriptions()) == ["one-container$held"]


@pytest.mark.parametrize("wildcards", [True, False])
async def test_topic_wildcards_from_rheas_durable_subscription_example(amqp_broker, wildcards):
    """Rhea's durable-subscription example subscribes to
    topic://PRICE.STOCK.NYSE.* and, against a router that takes * literally, silently
    receives nothing. With the listener's topic-wildcards on, * is one level and a last #
    any number of levels (a # elsewhere is refused); off, both are plain characters, as
    before. Either way a publication to the root PRICE reaches every subscriber below it."""
    broker = await amqp_broker(listener=f'topic-wildcards="{str(wildcards).lower()}"')
    events = await rhea_case(broker.port, "wildcards")
    if wildcards:
        assert events["received"] == {
            "star": ["RHT", "IBM", "literal-star", "end"],
            "hash": ["RHT", "MSFT", "IBM", "literal-star", "end"],
            "middle": "amqp:invalid-field",
        }
        assert (
            broker.router.swiftlet("sys$topicmanager").durable_subscriptions()["my-client$my-subscription"].topic.text
            == "PRICE.STOCK.NYSE.%"
        )
    else:
        assert events["received"] == {"star": ["literal-star", "end"], "hash": ["end"], "middle": "opened"}
