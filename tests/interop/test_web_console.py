"""``sys$web`` as a console, in a real browser (Debian's chromium through Selenium, as in
tests/interop/test_web_browser.py): each action clicked, confirmed with the count it states, done
through ``sys$mgmt`` (its audit line checked), and seen done; a read-only user sees no
buttons; forged posts are refused with 403 (plain HTTP).
"""

from __future__ import annotations

import html
import logging
import urllib.error
import urllib.parse
import urllib.request

import pytest
import trio

from martinet.kernel import SwiftletFailed
from martinet.messaging.client import DeliveryMode, Queue, TextMessage, Topic, connect
from martinet.messaging.message import build
from martinet.swiftlets.authentication.config import AuthenticationConfig, GroupConfig, UserConfig
from martinet.swiftlets.mgmt.api import AUDIT_LOGGER
from martinet.swiftlets.mgmt.config import AdminGroup, MgmtConfig
from martinet.swiftlets.web.auth import Viewer
from martinet.swiftlets.web.config import WebConfig

from tests.harness.network import ROUTING_STACK, routing_config
from tests.harness.polling import wait_until
from tests.interop.test_web_browser import browser, eventually, open_browser  # noqa: F401 - browser: the fixture
from tests.swiftlets.mgmt.test_admin import prepare_xa
from tests.swiftlets.web.test_web import basic, fetch

from selenium.common.exceptions import StaleElementReferenceException  # isort: skip
from selenium.webdriver.common.by import By  # isort: skip - after test_web_browser's skip without a browser

WEB_STACK = (*ROUTING_STACK, "sys$mgmt", "sys$web")
MGMT_STACK = (*ROUTING_STACK, "sys$mgmt")


async def start_console(network, name: str, **swiftlets):
    config = network.config(
        name,
        startorder=WEB_STACK,
        swiftlets={"sys$routing": routing_config(), "sys$web": WebConfig(enabled=True, port=0), **swiftlets},
    )
    router = await network.start(config)
    return config, router


def _gone(element) -> bool:
    """Whether ``element`` is no longer in the page (a new page replaced it)."""
    try:
        return not element.tag_name
    except StaleElementReferenceException:
        return True


class Page:
    """The browser, driven from trio (every Selenium call in a worker thread)."""

    def __init__(self, driver, url: str):
        self.driver = driver
        self.url = url

    async def open(self, path: str) -> None:
        await trio.to_thread.run_sync(self.driver.get, self.url + path)

    async def follow(self, text: str) -> None:
        """Click the link ``text`` and wait for the next page (its nav bar has the same links)."""
        old = await trio.to_thread.run_sync(lambda: self.driver.find_element(By.TAG_NAME, "html"))
        await trio.to_thread.run_sync(lambda: self.driver.find_element(By.LINK_TEXT, text).click())
        await eventually(lambda: _gone(old), f"the page behind {text}")

    async def text(self, css: str) -> str:
        return await trio.to_thread.run_sync(lambda: self.driver.find_element(By.CSS_SELECTOR, css).text)

    async def count(self, css: str) -> int:
        return await trio.to_thread.run_sync(lambda: len(self.driver.find_elements(By.CSS_SELECTOR, css)))

    async def click(self, css: str) -> None:
        await trio.to_thread.run_sync(lambda: self.driver.find_element(By.CSS_SELECTOR, css).click())

    async def type(self, css: str, text: str) -> None:
        await trio.to_thread.run_sync(lambda: self.driver.find_element(By.CSS_SELECTOR, css).send_keys(text))

    async def first_cells(self, table: str) -> list[str]:
        return await trio.to_thread.run_sync(
            lambda: self.driver.execute_script(
                f'return Array.from(document.querySelectorAll("#{table} tbody tr"), row => row.cells[0].innerText)'
            )
        )

    async def act(self, action: str, name: str) -> str:
        """Click the button of ``action`` on ``name``; the confirmation's text, confirmed then.
        The outcome page's text."""
        await self.click(f'button[data-action="{action}"][data-name="{name}"]')
        await eventually(lambda: self.driver.find_elements(By.ID, "confirm"), f"the confirmation of {action} {name}")
        said = await self.text("#confirm-text")
        await self.click("#confirm")
        await eventually(lambda: self.driver.find_elements(By.CSS_SELECTOR, "p.done, p.refused"), f"{action} done")
        return said + "\n" + await self.text("p.done")


async def test_a_queue_is_browsed_moved_purged_and_deleted(network, browser, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    _, a = await start_console(network, "a")
    b = await network.start(network.config("b", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    b.management.add("/sys$queuemanager/queues", "archive")
    a.management.add("/sys$queuemanager/queues", "orders")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    async with connect(network.url("a")) as connection, connection.session() as session:
        async with session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT) as producer:
            for n in range(25):
                await producer.send(TextMessage(f"order {n}", properties={"n": n}))
    web = a.swiftlet("sys$web")
    for _ in range(2):  # two points now (orders came after the first, at the start), not in 10 s each
        web.history.sample()
    page = Page(browser, web.url)

    await page.open("/routers/a/queues")
    assert "orders" in await page.first_cells("queues") and "sys$mgmt" not in await page.first_cells("queues")
    spark = await trio.to_thread.run_sync(
        lambda: browser.find_element(By.CSS_SELECTOR, "#queues tbody tr:first-child svg.spark")
    )
    assert (spark.get_attribute("data-points"), spark.get_attribute("data-last")) == ("2", "25")
    await page.follow("system")
    system = await page.first_cells("queues")
    assert "sys$mgmt" in system and "rt$b" in system and "orders" not in system

    await page.open("/routers/a/queues/orders")
    assert await page.text("h2:last-of-type") == "Messages 1–20 of 25"
    assert await page.count("#messages tbody tr") == 20
    first_row = await page.text("#messages tbody tr")
    assert "order 0" in first_row and '{"n": 0}' in first_row
    await page.follow("next")
    assert await page.text("h2:last-of-type") == "Messages 21–25 of 25"
    assert "order 24" in await page.text("#messages")

    await page.type('form[action$="/act"] input[name="target"]', "archive@b")
    await page.type('form[action$="/act"] input[name="selector"]', "n < 5")
    outcome = await page.act("move", "orders")
    assert outcome == (
        "Move those of its 25 available message(s) that match n < 5 of queue orders to archive@b.\n"
        "5 messages moved from orders to archive@b"
    )
    await wait_until(lambda: b.management.get("/sys$queuemanager/usage/queues/archive", "messages") == 5)

    await page.open("/routers/a/queues/orders")
    outcome = await page.act("purge", "orders")
    assert outcome == (
        "Purge queue orders: its 20 available message(s) are removed for good.\n20 messages purged from orders"
    )
    assert a.management.get("/sys$queuemanager/usage/queues/orders", "messages") == 0

    await page.open("/routers/a/queues/orders")
    outcome = await page.act("delete-queue", "orders")
    assert outcome.startswith("Delete queue orders from the configuration, and its 0 message(s) with it.")
    await page.open("/routers/a/queues")
    assert "orders" not in await page.first_cells("queues")

    audit = [r.getMessage() for r in caplog.records if r.getMessage().startswith("management: (no user)@127.0.0.1")]
    assert any("invoked /sys$queuemanager/usage/queues/orders move" in line for line in audit)
    assert any("invoked /sys$queuemanager/usage/queues/orders purge" in line for line in audit)
    assert any("removed /sys$queuemanager/queues/orders" in line for line in audit)


async def test_connections_connectors_durables_and_in_doubt_transactions(network, browser, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    config, a = await start_console(network, "a")
    async with connect(network.url("a"), client_id="app") as connection, connection.session() as session:
        subscriber = await session.durable_subscriber(Topic("news"), "sub")
        await subscriber.close()
        publisher = await session.producer(Topic("news"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(2):
            await publisher.send(TextMessage(f"news {n}"))
    await prepare_xa(a.swiftlet("sys$queuemanager"))  # client-9: two sends to the queue out
    committed = a.swiftlet("sys$queuemanager").transaction()
    committed.send("out", build(b"c", message_id="c-0", durable=True))
    await committed.prepare("client-8")
    await network.stop("a")
    a = await network.start(config)  # the prepared transaction is in doubt after a restart
    await network.start_routers("b")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    durables = "/sys$topicmanager/usage/durable-subscribers"
    await wait_until(lambda: a.management.get(f"{durables}/app$sub", "messages") == 2, what="the durable back")
    page = Page(browser, a.swiftlet("sys$web").url)

    await page.open("/routers/a/transactions")
    outcome = await page.act("rollback", "client-9")
    assert outcome.startswith("Roll back in-doubt transaction client-9: its 2 prepared message(s) are discarded")
    assert "client-9" not in a.management.resolve("/sys$xa/usage/in-doubt").children
    await page.open("/routers/a/transactions")
    outcome = await page.act("commit", "client-8")
    assert outcome.startswith("Commit in-doubt transaction client-8: its 1 prepared message(s) become visible")
    assert not a.management.resolve("/sys$xa/usage/in-doubt").children
    assert a.management.get("/sys$queuemanager/usage/queues/out", "messages") == 1

    await page.open("/routers/a/topics")
    assert await page.first_cells("durables") == ["app$sub"]
    outcome = await page.act("delete-durable", "app$sub")
    assert outcome.startswith("Delete durable subscription app$sub and the 2 message(s) it holds.")
    assert "app$sub" not in a.management.resolve(durables).children

    connectors = "/sys$routing/usage/connectors"
    await page.open("/routers/a/routing")
    outcome = await page.act("disable-connector", "b")
    assert outcome.endswith("connector b disabled")
    await wait_until(lambda: a.management.get(f"{connectors}/b", "state") == "disabled", what="disabled")
    await page.open("/routers/a/routing")
    assert "disabled" in await page.text("#connectors tbody tr")
    outcome = await page.act("enable-connector", "b")
    assert outcome.endswith("connector b enabled")
    await network.settle({"a": {"b": 1}})

    async with connect(network.url("a"), client_id="watcher") as client:
        live = "/sys$jms/usage/connections"
        (name,) = a.management.resolve(live).children
        await page.open("/routers/a/connections")
        assert await page.first_cells("connections") == [name]
        outcome = await page.act("close-connection", name)
        assert outcome.startswith(f"Close client connection {name}: its temporary queues go")
        await wait_until(lambda: not a.management.resolve(live).children, what="the connection closed")
        del client

    audit = [r.getMessage() for r in caplog.records if r.getMessage().startswith("management: (no user)@127.0.0.1")]
    for done in (
        "in-doubt/client-9 rollback",
        "in-doubt/client-8 commit",
        "app$sub delete",
        "connectors/b disable",
        "connectors/b enable",
    ):
        assert any(done in line for line in audit), done
    assert any(f"connections/{name} delete" in line for line in audit)


def auth_config() -> dict:
    """root (group admin: read-write in sys$mgmt) and viewer (group watchers: read-only)."""
    return {
        "sys$authentication": AuthenticationConfig(
            authentication_enabled=True,
            groups=[GroupConfig(name="admin"), GroupConfig(name="watchers")],
            users=[
                UserConfig(name="root", password="top", group="admin"),
                UserConfig(name="viewer", password="pw", group="watchers"),
            ],
        ),
        "sys$mgmt": MgmtConfig(groups=[AdminGroup(name="admin", role="read-write"), AdminGroup(name="watchers")]),
    }


async def test_a_read_only_user_sees_no_buttons_and_cannot_browse_messages(network, browser):  # noqa: F811
    _, a = await start_console(network, "a", **auth_config())
    a.management.add("/sys$queuemanager/queues", "orders")
    a.swiftlet("sys$queuemanager").send_nowait("orders", build("secret"))
    host = a.swiftlet("sys$web").url.removeprefix("http://")
    viewer, root = Page(browser, f"http://viewer:pw@{host}"), Page(browser, f"http://root:top@{host}")

    await viewer.open("/routers/a/queues/orders")
    assert await viewer.count("button") == 0
    refusal = await viewer.text("#messages")
    assert refusal.startswith("not shown: 'invoke' changes router a, and the role of group watchers is read-only")
    for area in ("connections", "routing", "topics", "transactions"):
        await viewer.open(f"/routers/a/{area}")
        assert await viewer.count("button") == 0, area

    await root.open("/routers/a/queues/orders")
    assert await root.count("button[data-action]") == 3
    assert "secret" in await root.text("#messages")


async def post(url: str, fields: dict, authorization: str, origin: str | None = None) -> tuple[int, str]:
    """POST ``fields`` as a form (urllib, in a worker thread): the status and the page's text."""
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Authorization", authorization)
    request.add_header("Content-Type", "application/x-www-form-urlencoded")
    if origin is not None:
        request.add_header("Origin", origin)

    def send() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, html.unescape(response.read().decode())
        except urllib.error.HTTPError as error:
            with error:
                return error.code, html.unescape(error.read().decode())

    return await trio.to_thread.run_sync(send)


async def test_forged_posts_are_refused_with_403_and_change_nothing(network, caplog):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    _, a = await start_console(network, "a", **auth_config())
    a.management.add("/sys$queuemanager/queues", "orders")
    a.swiftlet("sys$queuemanager").send_nowait("orders", build("keep me"))
    web = a.swiftlet("sys$web")
    act = web.url + "/routers/a/act"
    root, viewer = basic("root", "top"), basic("viewer", "pw")
    status, _, page = await fetch(web.url + "/routers/a/queues/orders", root)
    assert status == 200
    token = page.split('name="token" value="', 1)[1].split('"', 1)[0]
    purge = {"action": "purge", "name": "orders", "confirmed": "yes"}

    cases = [  # (fields, credentials, origin) -> the refusal's text
        ({**purge, "token": token}, root, "http://evil.example", "origin http://evil.example is not this web view"),
        (purge, root, None, "the form's token is missing or not this session's"),
        ({**purge, "token": token}, viewer, None, "the form's token is missing or not this session's"),
        ({**purge, "token": "0" * 64}, root, None, "the form's token is missing or not this session's"),
    ]
    for fields, credentials, origin, reason in cases:
        status, page = await post(act, fields, credentials, origin)
        assert status == 403 and reason in page, (fields, origin, page)
    # the read-only user with a valid token of its own: its role refuses, here and in sys$mgmt
    own = web.console.token(Viewer("viewer", "watchers", True, "127.0.0.1"))
    status, page = await post(act, {**purge, "token": own, "confirmed": ""}, viewer)
    assert status == 403 and "viewer may not change router a" in page
    status, page = await post(act, {**purge, "token": own}, viewer)
    assert status == 403 and "'invoke' changes router a, and the role of group watchers is read-only" in page
    assert a.management.get("/sys$queuemanager/usage/queues/orders", "messages") == 1
    assert any("management invoke from viewer@127.0.0.1 via a refused" in r.getMessage() for r in caplog.records)

    status, page = await post(act, {**purge, "token": token}, root)  # the real thing goes through
    assert status == 200 and "1 messages purged from orders" in page


async def self_signed(folder) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (openssl), as PEM files in ``folder``."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject]
    await trio.run_process([*command, "-keyout", str(key), "-out", str(cert)], capture_stdout=True, capture_stderr=True)
    return str(cert), str(key)


@pytest.fixture
async def tls_browser():
    """A browser that accepts the tests' self-signed certificates."""
    driver = await trio.to_thread.run_sync(open_browser, "--ignore-certificate-errors")
    try:
        yield driver
    finally:
        await trio.to_thread.run_sync(driver.quit)


async def test_tls_serves_the_console_beyond_loopback(network, tls_browser, tmp_path):
    cert, key = await self_signed(tmp_path)
    web = WebConfig(enabled=True, bind_address="0.0.0.0", port=0, tls_certificate=cert, tls_key=key)
    config = network.config(
        "a", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": web, **auth_config()}
    )
    a = await network.start(config)
    a.management.add("/sys$queuemanager/queues", "orders")
    a.swiftlet("sys$queuemanager").send_nowait("orders", build("over TLS"))
    url = a.swiftlet("sys$web").url
    assert url.startswith("https://0.0.0.0:")
    page = Page(tls_browser, "https://root:top@127.0.0.1:" + url.rsplit(":", 1)[1])

    await page.open("/routers/a/queues/orders")
    assert "over TLS" in await page.text("#messages")
    outcome = await page.act("purge", "orders")
    assert outcome.endswith("1 messages purged from orders")


async def test_beyond_loopback_plain_http_needs_plain_http_auth_and_a_bad_certificate_fails(network, tmp_path):
    plain = WebConfig(enabled=True, bind_address="0.0.0.0", port=0)
    config = network.config(
        "a", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": plain, **auth_config()}
    )
    with pytest.raises(SwiftletFailed, match="no tls-certificate: HTTP basic auth would send passwords .* in clear"):
        await network.start(config)
    (tmp_path / "bad.pem").write_text("not a certificate")
    broken = WebConfig(enabled=True, port=0, tls_certificate=str(tmp_path / "bad.pem"))
    config = network.config("b", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": broken})
    with pytest.raises(SwiftletFailed, match="cannot load tls-certificate '.*bad.pem' / tls-key ''"):
        await network.start(config)


async def test_a_remote_routers_queue_is_browsed_and_purged_through_this_one(network, browser, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    _, a = await start_console(network, "a")
    b = await network.start(network.config("b", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    b.management.add("/sys$queuemanager/queues", "orders-at-b")
    for n in range(3):
        b.swiftlet("sys$queuemanager").send_nowait("orders-at-b", build(f"b{n}"))
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    page = Page(browser, a.swiftlet("sys$web").url)

    await page.open("/routers/b/queues")
    assert await page.first_cells("queues") == ["orders-at-b", "routerdlq", "unroutable"]
    await page.follow("orders-at-b")
    assert "b2" in await page.text("#messages")
    outcome = await page.act("purge", "orders-at-b")
    assert outcome == (
        "Purge queue orders-at-b: its 3 available message(s) are removed for good.\n3 messages purged from orders-at-b"
    )
    assert b.management.get("/sys$queuemanager/usage/queues/orders-at-b", "messages") == 0
    audit = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith(
            "management: (no user)@127.0.0.1 via a invoked /sys$queuemanager/usage/queues/orders-at-b purge"
        )
        for line in audit
    ), audit


async def test_the_map_labels_links_with_rates_and_routers_with_backlogs(network, browser):  # noqa: F811
    web_config = WebConfig(enabled=True, port=0, map_refresh_interval=0.5)
    a = await network.start(
        network.config("a", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": web_config})
    )
    b = await network.start(network.config("b", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    a.management.add("/sys$queuemanager/queues", "here")
    b.management.add("/sys$queuemanager/queues", "there")
    for n in range(5):
        a.swiftlet("sys$queuemanager").send_nowait("here", build(f"a{n}"))
    for n in range(3):
        b.swiftlet("sys$queuemanager").send_nowait("there", build(f"b{n}"))
    web = a.swiftlet("sys$web")
    web.sample()  # this router's backlog and links now (else within 10 s); b's come with the next crawl
    page = Page(browser, web.url)
    await page.open("/")

    def labels() -> dict:
        return browser.execute_script(
            "const found = {};"
            'for (const t of document.querySelectorAll("#map text[data-backlog]"))'
            "  found[t.dataset.backlog] = t.textContent;"
            'for (const t of document.querySelectorAll("#map text[data-rate]"))'
            "  found[t.dataset.rate] = [t.textContent, getComputedStyle(t).fill];"
            "return found;"
        )

    # b's backlog is the messages of all its queues, sys$mgmt's own reply traffic included: at least 3
    shown = await eventually(lambda: (found := labels()).get("a") == "5 msgs" and "b" in found and found, "labels")
    assert int(shown["b"].split()[0]) >= 3
    text, fill = shown["a|b"]
    assert text.endswith(" msg/s") and float(text.split()[0]) >= 0 and fill == "rgb(42, 157, 58)"  # operational

    # and each with its last hour, below the map: a point a sample (b's backlog since the crawl)
    web.sample()

    def hours() -> dict:
        return browser.execute_script(
            "const found = {};"
            'for (const row of document.querySelectorAll("#routers tbody tr, #links tbody tr")) {'
            '  const spark = row.querySelector("svg.spark");'
            "  found[row.dataset.router || row.dataset.edge] = spark && [row.cells[2].textContent,"
            "    spark.dataset.points, spark.dataset.last];"
            "}"
            "return found;"
        )

    found = await eventually(lambda: (found := hours()).get("b") and found, "the routers' last hour")
    # (one more point each time the 10 s sampler runs meanwhile, and one from a's start)
    assert found["a"][0] == found["a"][2] == "5" and int(found["a"][1]) >= 2  # the tests' two samples at least
    assert found["b"][0] == found["b"][2] and int(found["b"][1]) >= 1  # b's backlog as crawled
    assert int(found["a|b"][1]) >= 2  # the link's rate


async def test_the_topics_page_shows_its_hierarchy_and_remote_routers_interest(network, browser):  # noqa: F811
    """a's page shows b's interest in ``news``; b's page (through a) shows its root topic and
    every subscription under it, subtopics after their parent, durable or not."""
    _, a = await start_console(network, "a")
    await network.start(network.config("b", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    async with connect(network.url("b"), client_id="reader") as connection, connection.session() as session:
        async with (
            session.consumer(Topic("news.eu")),
            session.consumer(Topic("news.*"), selector="urgent = TRUE"),
            session.durable_subscriber(Topic("news"), "all"),
        ):
            interest = "/sys$topicmanager/usage/remote-router-subscriptions"
            await wait_until(lambda: "b" in a.management.resolve(interest).children, timeout=20, what="b's interest")
            page = Page(browser, a.swiftlet("sys$web").url)
            await page.open("/routers/a/topics")
            row = await page.text("#interest tbody tr")
            assert row.split()[:2] == ["b", "news"]
            await page.open("/routers/b/topics")  # b's own page, through a: its root topic with a subscriber
            assert await page.first_cells("topics") == ["news"]
            assert [cell.strip() for cell in await page.first_cells("subscriptions")] == ["news", "news.*", "news.eu"]
            rows = await page.text("#subscriptions tbody")
            lines = rows.splitlines()
            assert lines[0].split()[:5] == ["news", "True", "reader", "all", "False"]  # durable, named
            assert "urgent = TRUE" in lines[1] and lines[2].split()[1:3] == ["False", "reader"]
    listed = network.routers["b"].management.resolve("/sys$topicmanager/usage/topics/news/subscriptions")

    def topics() -> list[str]:
        return [node.properties()["topic"] for node in listed.children.values()]

    await wait_until(lambda: topics() == ["news"], what="only the durable subscription left once its connection closed")
