"""Routing between real ``martinet run`` processes: a triangle that loses a router and gets it back.

Each router's routing table is read from its log: the route exchanger logs one INFO line per
route added or removed (``route to DEST via HOP (N hops: PATH) added``), so replaying a
router's log in order gives its table. Every wait is a poll with a deadline; a failed wait
shows every router's log.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.harness.netharness import network_router_xml, table
from tests.harness.paths import ROOT
from tests.harness.processes import RouterProcess, free_port

pytestmark = pytest.mark.slow

CONF = ROOT / "conf" / "network"
PASSWORD = "triangle-secret"
NAMES = ("paris", "lyon", "tokyo")
TRIANGLE = {"paris": "lyon", "lyon": "tokyo", "tokyo": "paris"}  # who dials whom


def wait_for_log(what: str, predicate: Callable[[], bool], logs: Callable[[], str], timeout: float = 30) -> None:
    """Block until ``predicate`` (which reads the routers' logs) holds; fail after ``timeout``
    seconds with ``what`` and the logs. Synchronous: the processes are polled by reading files."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}\n{logs()}")
        time.sleep(0.1)


FULL_TRIANGLE = {  # every router reaches the other two directly and over the third
    "paris": {"lyon": {("lyon",), ("tokyo", "lyon")}, "tokyo": {("tokyo",), ("lyon", "tokyo")}},
    "lyon": {"paris": {("paris",), ("tokyo", "paris")}, "tokyo": {("tokyo",), ("paris", "tokyo")}},
    "tokyo": {"paris": {("paris",), ("lyon", "paris")}, "lyon": {("lyon",), ("paris", "lyon")}},
}


def test_a_triangle_of_processes_survives_a_sigkilled_router_and_takes_it_back(router_processes):
    routing = {name: free_port() for name in NAMES}
    xml = {
        name: network_router_xml(
            name,
            amqp=free_port(),
            routing=routing[name],
            password=PASSWORD,
            connectors=[(TRIANGLE[name], routing[TRIANGLE[name]], PASSWORD)],
        )
        for name in NAMES
    }
    routers = {name: router_processes.start(xml[name]) for name in NAMES}
    logs = router_processes.logs

    def tables() -> dict[str, dict]:
        return {name: table(routers[name].current()) for name in NAMES}

    wait_for_log("the triangle learns every route", lambda: tables() == FULL_TRIANGLE, logs)
    for name in NAMES:
        assert routers[name].current().count(" operational: ") == 2, logs()

    lyon = routers["lyon"]
    assert lyon.kill() == -9
    survivors = {"paris": {"tokyo": {("tokyo",)}}, "tokyo": {"paris": {("paris",)}}}
    # SIGKILL leaves the kernel to close lyon's sockets: the peers read the end of the stream
    # (or, had the host gone, would miss 5 keepalives of 1 s); either way within a few seconds
    wait_for_log(
        "paris and tokyo drop every route via or to lyon and keep their own link",
        lambda: {name: table(routers[name].current()) for name in survivors} == survivors,
        logs,
        timeout=15,
    )
    for name in survivors:
        assert re.search(r"routing link \S+ \(127\.0\.0\.1:\d+, router lyon\) closed: ", routers[name].current()), (
            logs()
        )

    lyon.restart()
    wait_for_log(
        "after lyon's restart every router has routes to every other again", lambda: tables() == FULL_TRIANGLE, logs
    )
    for name in NAMES:  # nothing failed loudly on the way
        assert "Traceback" not in routers[name].text(), logs()


def test_every_sample_network_config_passes_martinet_check():
    files = sorted(CONF.glob("*.xml"))
    assert [f.stem for f in files] == ["lyon", "paris", "tokyo"]
    for file in files:
        result = subprocess.run(
            [sys.executable, "-m", "martinet.kernel", "check", str(file)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{file}: exit {result.returncode}\n{result.stdout}{result.stderr}"


SAMPLE_PORTS = (5681, 5682, 5683, 4101, 4102, 4103, 8081, 8082, 8083)  # AMQP, routing, web


def busy_ports(ports) -> list[int]:
    """The ports of ``ports`` a listener cannot bind (SO_REUSEADDR, as trio's listeners: a
    closed connection's TIME-WAIT does not count)."""
    busy = []
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def test_the_sample_network_runs_as_is_and_forms_routes(tmp_path):
    if busy := busy_ports(SAMPLE_PORTS):
        pytest.skip(f"the sample network's fixed ports are in use here: {busy}")
    routers: dict[str, RouterProcess] = {}
    try:
        for name in NAMES:
            folder = tmp_path / name
            folder.mkdir()
            routers[name] = RouterProcess([str(CONF / f"{name}.xml")], folder, name=name)

        def logs() -> str:
            return "\n".join(f"--- {name}:\n{router.text()}" for name, router in routers.items())

        for router in routers.values():
            router.wait_started()
        # connectors retry every 5 s there: a router dialled before its peer listened waits once
        wait_for_log(
            "the sample network learns every route",
            lambda: {name: table(router.current()) for name, router in routers.items()} == FULL_TRIANGLE,
            logs,
            timeout=45,
        )
        for name, router in routers.items():
            assert router.stop() == 0, logs()
            assert (tmp_path / name / "store" / f"{name}.sqlite").exists()
    finally:
        for router in routers.values():
            router.close()
