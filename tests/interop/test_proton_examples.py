"""The python-qpid-proton examples shipped by Debian (libqpid-proton11-dev-examples),
run unmodified against a live router, their output checked as their own test_examples.py
checks it. Three of them connect to localhost:5672 only, so the router listens there.

CI installs the package (.ci/run); on a machine without it this module is skipped unless
CI is set, in which case a missing package is a failure.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio

from martinet.kernel import Router

from tests.harness.polling import wait_until

EXAMPLES = Path("/usr/share/proton/examples/python")
if not (EXAMPLES / "helloworld.py").exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{EXAMPLES} is missing: .ci/run installs libqpid-proton11-dev-examples")
    pytest.skip(
        f"{EXAMPLES} is missing: `sudo apt-get install libqpid-proton11-dev-examples` to run Debian's proton examples",
        allow_module_level=True,
    )

CONFIG = """<router name="examples" startorder="sys$store sys$queuemanager sys$topicmanager sys$jms">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="5672" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""


async def example(*args: str, timeout: float = 60) -> list[str]:
    with trio.fail_after(timeout):
        done = await trio.run_process(
            [sys.executable, *args], cwd=EXAMPLES, capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr.decode()[-2000:]}"
    return done.stdout.decode().splitlines()


def consumers(router: Router, queue: str) -> int:
    """How many consumers ``queue`` has (0 while it does not exist)."""
    found = router.swiftlet("sys$queuemanager").queues.get(queue)
    return len(found.consumers) if found is not None else 0


@pytest.fixture
async def router(nursery, tmp_path):
    path = tmp_path / "router.xml"
    path.write_text(CONFIG.format(store=tmp_path / "store"))
    running = Router.from_file(path)
    try:
        await nursery.start(running.run)
    except Exception as exc:  # most likely: port 5672 is taken
        pytest.fail(f"the router cannot listen on 127.0.0.1:5672: {exc}")
    yield running
    running.request_stop()


async def test_helloworld_variants(router):
    assert await example("helloworld.py") == ["Hello World!"]
    assert await example("helloworld_blocking.py") == ["Hello World!"]


async def test_simple_send_and_recv(router):
    assert await example("simple_send.py") == ["all messages confirmed"]
    assert await example("simple_recv.py") == [f"{{'sequence': {i + 1}}}" for i in range(100)]


async def test_client_server_and_sync_client(router):
    inputs = [
        "Twas brillig, and the slithy toves",
        "Did gire and gymble in the wabe.",
        "All mimsy were the borogroves,",
        "And the mome raths outgrabe.",
    ]
    expected = [f"{line} => {line.upper()}" for line in inputs]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(example, "server.py")  # runs until cancelled
        await wait_until(lambda: consumers(router, "examples"), 30)  # the server is attached to its queue
        assert await example("client.py") == expected
        assert await example("sync_client.py") == expected
        nursery.cancel_scope.cancel()


async def test_selectors_and_browsing(router):
    assert await example("colour_send.py") == ["all messages confirmed"]
    # queue_browser.py means to stop when "event.receiver.queued == 0 and
    # event.receiver.drained", but drained is a method in proton (a bound method is always
    # true): it stops as soon as it has no delivery queued, after proton's first credit
    # window (MessagingHandler's prefetch, 10) whatever the broker. It printed 19: the
    # router still sent 9 transfers after answering its close. That a
    # browser gets the whole queue, and drained credit only at its end, is
    # tests/swiftlets/jms/test_amqp.py::test_a_browser_gets_the_whole_queue_and_drained_credit_only_at_its_end.
    browsed = await example("queue_browser.py")
    colours = ["green" if n % 2 else "red" for n in range(1, 11)]
    assert len(browsed) == 10 and all(
        re.fullmatch(
            rf"Message\(priority=4, id={n}, "
            rf"annotations=AnnotationDict\(\{{symbol\('x-opt-martinet-cid'\): '[0-9a-f-]+'\}}\), "
            rf"properties=\{{'colour': '{colour}'\}}, body='{colour} {n}'\)",
            line,
        )
        for n, colour, line in zip(range(1, 11), colours, browsed, strict=True)
    ), browsed
    # browsing consumed nothing: the selective receivers below still get all 100
    assert await example("selected_recv.py", "-m", "50") == [f"green {i + 1}" for i in range(0, 100, 2)]
    assert await example("simple_recv.py", "-m", "50") == [f"red {i + 1}" for i in range(1, 100, 2)]
    assert router.swiftlet("sys$queuemanager").queue("examples").size == 0


async def test_transactions(router):
    assert await example("tx_send.py") == ["all messages committed"]
    assert await example("tx_recv.py") == [f"{{'sequence': {i + 1}}}" for i in range(100)]
    inputs = [
        "Twas brillig, and the slithy toves",
        "Did gire and gymble in the wabe.",
        "All mimsy were the borogroves,",
        "And the mome raths outgrabe.",
    ]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(example, "server_tx.py")  # replies and accepts in one transaction each
        await wait_until(lambda: consumers(router, "examples"), 30)
        assert await example("client.py") == [f"{line} => {line.upper()}" for line in inputs]
        nursery.cancel_scope.cancel()
    # nothing is left over: every request was consumed within a committed transaction
    assert router.swiftlet("sys$queuemanager").queue("examples").size == 0
