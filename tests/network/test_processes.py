"""The real-process helpers (tests/harness/processes.py) on the default stack: two routers, a SIGKILL."""

from __future__ import annotations

import signal
import socket

import pytest

from martinet.messaging.client import ConnectionLost, Queue, TextMessage
from martinet.messaging.client.blocking import BlockingConnection

from tests.harness.processes import RouterProcesses, free_port, router_xml

pytestmark = pytest.mark.slow


def send(port: int, queue: str, text: str) -> None:
    """Send one persistent message; returns once the router has accepted (stored) it."""
    with BlockingConnection(f"amqp://127.0.0.1:{port}", connect_timeout=10) as connection:
        connection.session().producer(Queue(queue)).send(TextMessage(text))


def receive(port: int, queue: str) -> str | None:
    """Consume one message (auto-acknowledged), or None after 5 s."""
    with BlockingConnection(f"amqp://127.0.0.1:{port}", connect_timeout=10) as connection:
        message = connection.session().consumer(Queue(queue)).receive(timeout=5)
        return None if message is None else message.text


def test_free_port_is_bindable_on_loopback():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert sock.getsockname() == ("127.0.0.1", port)


def test_two_routers_serve_and_one_comes_back_from_sigkill_with_its_messages(router_processes, tmp_path):
    ports = {"alpha": free_port(), "beta": free_port()}
    while ports["beta"] == ports["alpha"]:
        ports["beta"] = free_port()
    alpha, beta = (
        router_processes.start(router_xml(name, amqp_port=port, store=tmp_path / "stores" / name))
        for name, port in ports.items()
    )
    for name, port in ports.items():
        send(port, "orders", f"for {name}")
    assert (tmp_path / "stores" / "alpha" / "alpha.sqlite").exists(), router_processes.logs()

    assert alpha.kill() == -signal.SIGKILL
    with pytest.raises(ConnectionLost):
        send(ports["alpha"], "orders", "nobody listens")
    assert receive(ports["beta"], "orders") == "for beta"  # the other one serves on

    alpha.restart()  # same config, same store, same port
    assert receive(ports["alpha"], "orders") == "for alpha", router_processes.logs()
    assert receive(ports["alpha"], "orders") is None  # exactly the one message
    assert alpha.text().count("router alpha started") == 2
    assert alpha.current().count("router alpha started") == 1  # the log of this run only

    assert beta.stop() == 0 and alpha.stop(signal.SIGINT) == 0
    assert alpha.current().rstrip().endswith("router alpha stopped")


def test_a_router_that_does_not_start_fails_the_wait_with_its_log(router_processes):
    xml = router_xml("gamma", amqp_port=free_port()).replace('sys$jms"', 'sys$nope"', 1)
    with pytest.raises(AssertionError, match=r"(?s)'router gamma started' not logged; exit 2; .*unknown swiftlet"):
        router_processes.start(xml)


def test_close_kills_every_process_still_running(tmp_path):
    routers = RouterProcesses(tmp_path)
    delta = routers.start(router_xml("delta", amqp_port=free_port()), wait=False)
    routers.close()
    assert delta.proc.returncode == -signal.SIGKILL
    assert (tmp_path / "delta" / "router.xml").read_text().startswith('<router name="delta"')
