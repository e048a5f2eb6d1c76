"""rhea, the Node.js AMQP 1.0 library, against a live router and our client: sends and
accepts, a JMS selector, a topic by capability, request/reply over a dynamic queue
(``tests/interop/rhea_client.js``, installed from npm at the pinned version on first use)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from martinet.messaging.client import Queue, TextMessage, Topic, connect

INTEROP = Path(__file__).parent / "interop"
if shutil.which("node") is None or shutil.which("npm") is None:
    if os.environ.get("CI"):
        raise RuntimeError("node and npm are missing: .ci/run installs Debian's nodejs and npm")
    pytest.skip("node or npm is missing: `sudo apt-get install nodejs npm` to run the rhea interop test "
                "(it installs rhea from npm on first use)", allow_module_level=True)


def install_rhea() -> None:
    if not (INTEROP / "node_modules" / "rhea").exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=INTEROP, check=True,
                       timeout=600, capture_output=True)


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
            await replies.send(TextMessage(request.text.upper(), correlation_id=request.message_id),
                               request.reply_to)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_one_request)
                process = await nursery.start(functools.partial(
                    trio.run_process, ["node", "rhea_client.js", str(broker.port)], cwd=INTEROP,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False))
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
