"""``sys$web``'s pages in a real browser: Debian's chromium, headless, driven by Selenium
through chromium-driver. Three routers in this process, ``a`` (with the web view) – ``b`` –
``c``, the link b–c through a fault proxy: the map shows every router, a cut of b–c turns
that link red, and the router page lists a queue with its backlog.

Selenium blocks, so every browser call runs in a worker thread; waits poll the page, bounded.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import trio

from martinet.messaging.client import DeliveryMode, Queue, TextMessage, connect
from martinet.swiftlets.web.config import WebConfig

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import ROUTING_STACK, routing_config

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    if os.environ.get("CI"):
        raise RuntimeError(
            "chromium or chromedriver is missing: .ci/run installs Debian's chromium and chromium-driver"
        )
    pytest.skip(
        "chromium or chromedriver is missing: `apt-get install chromium chromium-driver` to run the "
        "web view in a real browser",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402 - only with a browser to drive
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

RED = "rgb(208, 0, 0)"  # the page's colour of failed and down links


def open_browser(*arguments: str) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *arguments):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))


@pytest.fixture
async def browser():
    driver = await trio.to_thread.run_sync(open_browser)
    try:
        yield driver
    finally:
        await trio.to_thread.run_sync(driver.quit)


async def eventually(look: Callable[[], Any], what: str, timeout: float = 15) -> Any:
    """Poll ``look`` (in a thread) until it returns something true; its last answer in the error."""
    answer = None
    with trio.move_on_after(timeout):
        while not (answer := await trio.to_thread.run_sync(look)):
            await trio.sleep(0.1)
        return answer
    raise AssertionError(f"{what} not within {timeout} s; last seen: {answer!r}")


# The map as the page shows it, read in one script: the page redraws at each event, so
# elements found one call earlier may be gone (stale) by the next call.
SNAPSHOT = """
const map = {routers: {}, edges: {}, rows: {}};
for (const node of document.querySelectorAll("#map circle[data-router]"))
  map.routers[node.dataset.router] = node.dataset.state;
for (const line of document.querySelectorAll("#map line[data-edge]"))
  map.edges[line.dataset.edge] = [line.dataset.state, getComputedStyle(line).stroke];
for (const row of document.querySelectorAll("#links tr[data-edge]"))
  map.rows[row.dataset.edge] = row.innerText;
return map;
"""


def shown(driver) -> dict[str, dict]:
    return driver.execute_script(SNAPSHOT)


def routers_shown(driver) -> dict[str, str]:
    return shown(driver)["routers"]


def edge(driver, key: str) -> tuple[str, str] | None:
    found = shown(driver)["edges"].get(key)
    return tuple(found) if found else None


async def test_the_map_shows_every_router_and_a_cut_link_turns_red(network, nursery, browser):
    web_config = {"sys$routing": routing_config(), "sys$web": WebConfig(enabled=True, port=0)}
    router = await network.start(network.config("a", startorder=(*ROUTING_STACK, "sys$web"), swiftlets=web_config))
    await network.start_routers("b", "c")
    proxy = FaultProxy("127.0.0.1", network.routing_port("c"))
    await nursery.start(proxy.run)
    network.connect("a", "b")
    network.routers["b"].management.add(
        "/sys$routing/connectors", "c", {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000"}
    )
    await network.settle({"a": {"b": 1, "c": 2}})
    url = router.swiftlet("sys$web").url

    await trio.to_thread.run_sync(browser.get, url + "/")
    every = {"a": "local", "b": "reachable", "c": "reachable"}
    await eventually(lambda: routers_shown(browser) == every, "every router on the map")
    state, stroke = await eventually(lambda: edge(browser, "b|c"), "the link b–c")
    assert state == "operational" and stroke != RED
    assert (await trio.to_thread.run_sync(edge, browser, "a|b"))[0] == "operational"

    proxy.refuse(True)
    proxy.cut()
    await eventually(lambda: edge(browser, "b|c") == ("down", RED), "the cut link b–c shown red")
    assert (await trio.to_thread.run_sync(routers_shown, browser))["c"] == "unreachable"
    assert (await trio.to_thread.run_sync(edge, browser, "a|b"))[0] == "operational"
    row = (await trio.to_thread.run_sync(shown, browser))["rows"]["b|c"]
    assert "down" in row and "in no route of a" in row

    proxy.heal()
    await eventually(lambda: (e := edge(browser, "b|c")) and e[0] == "operational", "the healed link b–c")


async def test_the_router_page_lists_a_queue_with_its_backlog(network, browser):
    web_config = {"sys$routing": routing_config(), "sys$web": WebConfig(enabled=True, port=0)}
    router = await network.start(network.config("a", startorder=(*ROUTING_STACK, "sys$web"), swiftlets=web_config))
    async with connect(network.url("a")) as connection, connection.session() as session:
        async with session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT) as producer:
            for n in range(4):
                await producer.send(TextMessage(f"m{n}"))
    url = router.swiftlet("sys$web").url
    await trio.to_thread.run_sync(browser.get, url + "/routers/a")

    def queues() -> dict[str, dict[str, str]]:  # one script: the page reloads itself every 5 s
        header, *rows = browser.execute_script(
            'return Array.from(document.querySelectorAll("#queues tr"), '
            "row => Array.from(row.cells, cell => cell.innerText))"
        )
        return {row[0]: dict(zip(header, row, strict=True)) for row in rows}

    orders = await eventually(lambda: queues().get("orders"), "the queue orders on the router page")
    assert orders["messages"] == "4" and orders["consumers"] == "0" and orders["enqueued"] == "4"
    await trio.to_thread.run_sync(lambda: browser.find_element(By.LINK_TEXT, "network map").click())
    await eventually(lambda: routers_shown(browser) == {"a": "local"}, "the map of a router alone")
