"""``/metrics`` scraped by a real Prometheus server (Debian's ``prometheus``): the sample
network (conf/network: paris, lyon, tokyo, each with ``sys$web``) as ``martinet run``
processes on free ports, one Prometheus scraping the three, and its HTTP API asked for a
queue's backlog and a link's state — the values a dashboard or an alert would read."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import trio

from martinet.messaging.client import DeliveryMode, Queue, TextMessage, connect

from tests.harness.processes import RouterProcess, free_port
from tests.swiftlets.mgmt.test_admin import admin, sample_network

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None:
    if os.environ.get("CI"):
        raise RuntimeError("prometheus is missing: .ci/run installs Debian's prometheus")
    pytest.skip(
        "prometheus is missing: `apt-get install prometheus` to scrape /metrics with a real Prometheus",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow

SCRAPE = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: martinet
    static_configs:
      - targets: [{targets}]
"""


def web_port(folder: Path) -> int:
    """The port of a router's ``sys$web`` (its /metrics) in ``folder/router.xml``."""
    return int(
        re.search(r'<swiftlet name="sys\$web" enabled="true" port="(\d+)"', (folder / "router.xml").read_text())[1]
    )


def query(api: str, expression: str) -> list[dict]:
    """An instant query's result vector (``/api/v1/query``); [] while Prometheus is not ready."""
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
    except (urllib.error.URLError, ConnectionError):
        return []
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def until(look, what: str, timeout: float = 60):
    """Poll ``look()`` every 0.5 s until it returns something true (bounded); its last answer
    in the error."""
    deadline = time.monotonic() + timeout
    while not (answer := look()):
        assert time.monotonic() < deadline, f"{what} not within {timeout} s; last: {answer!r}"
        time.sleep(0.5)
    return answer


async def send(url: str, queue: str, count: int) -> None:
    async with connect(url) as connection, connection.session() as session:
        async with session.producer(Queue(queue), delivery_mode=DeliveryMode.PERSISTENT) as producer:
            for n in range(count):
                await producer.send(TextMessage(f"order {n}"))


def test_prometheus_scrapes_the_three_routers_and_answers_backlog_and_link_state(tmp_path):
    urls = sample_network(tmp_path / "routers")
    webs = {name: web_port(tmp_path / "routers" / name) for name in urls}
    targets = {name: f"127.0.0.1:{port}" for name, port in webs.items()}
    (tmp_path / "prometheus.yml").write_text(SCRAPE.format(targets=", ".join(f'"{t}"' for t in targets.values())))
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    routers = [RouterProcess(["router.xml"], tmp_path / "routers" / name, name=name) for name in urls]
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{api_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for router in routers:
            router.wait_started()

        def links_up() -> bool:
            result = admin(urls["tokyo"], "--json", "map")
            states = [link["state"] for link in json.loads(result.stdout)["links"]] if result.returncode == 0 else []
            return states == ["operational"] * 3

        until(links_up, "the three links operational")
        assert admin(urls["tokyo"], "-r", "paris", "new", "/sys$queuemanager/queues", "orders").returncode == 0
        trio.run(send, urls["tokyo"], "orders@paris", 7)  # across the network, nobody consumes

        def all_up() -> list[dict] | None:
            result = query(api, "up")
            return result if sorted((s["metric"]["instance"], s["value"][1]) for s in result) == expected else None

        expected = sorted((target, "1") for target in targets.values())
        until(all_up, "the three routers scraped")

        def backlog() -> list[dict] | None:
            result = query(api, 'martinet_queuemanager_queues_messages{queue="orders"}')
            return result if result and result[0]["value"][1] == "7" else None

        result = until(backlog, "the backlog of orders on paris")
        assert [(s["metric"], s["value"][1]) for s in result] == [
            (
                {
                    "__name__": "martinet_queuemanager_queues_messages",
                    "instance": targets["paris"],
                    "job": "martinet",
                    "router": "paris",
                    "queue": "orders",
                },
                "7",
            )
        ]
        links = query(api, 'martinet_routing_connectors_state{router="tokyo"}')
        assert [(s["metric"], s["value"][1]) for s in links] == [
            (
                {
                    "__name__": "martinet_routing_connectors_state",
                    "instance": targets["tokyo"],
                    "job": "martinet",
                    "router": "tokyo",
                    "connector": "paris",
                    "state": "operational",
                },
                "1",
            )
        ]
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()
        log.close()
        for router in routers:
            router.close()
