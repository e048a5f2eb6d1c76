"""``sys$web`` with ``sys$mgmt``: the map shows the real state of links between other routers
(crawled through management), and a remote router's page its queues, over real sockets."""

from __future__ import annotations

import json

import trio

from martinet.messaging.message import build
from martinet.swiftlets.web.config import WebConfig
from martinet.swiftlets.web.history import PER_MINUTE

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import ROUTING_STACK, routing_config
from tests.swiftlets.web.test_web import fetch

MGMT_STACK = (*ROUTING_STACK, "sys$mgmt")
WEB_STACK = (*MGMT_STACK, "sys$web")


async def edge_of(url: str, a: str, b: str) -> dict:
    """The edge a–b of ``/map.json`` as served at ``url``."""
    status, _, body = await fetch(url + "/map.json")
    assert status == 200
    return next((edge for edge in json.loads(body)["edges"] if (edge["a"], edge["b"]) == (a, b)), {})


async def test_a_cut_link_between_two_remote_routers_shows_its_real_state(network, nursery):
    # a ring: a dials b, b dials c through the proxy, c dials a; the map is a's
    web_config = WebConfig(enabled=True, port=0, map_refresh_interval=0.5, map_request_timeout=2.0)
    a = await network.start(
        network.config("a", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": web_config})
    )
    for name in ("b", "c"):
        await network.start(network.config(name, startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    proxy = FaultProxy("127.0.0.1", network.routing_port("c"))
    await nursery.start(proxy.run)
    network.connect("a", "b")
    network.connect("b", "c", port=str(proxy.port), **{"retry-time": "1000"})
    network.connect("c", "a")
    await network.settle({"a": {"b": 1, "c": 1}, "b": {"a": 1, "c": 1}})
    url = a.swiftlet("sys$web").url
    with trio.fail_after(20):  # b's own report of its connector, crawled (since: its connect time)
        while (edge := await edge_of(url, "b", "c")).get("state") != "operational" or edge["since"] <= 0:
            await trio.sleep(0.1)
    assert not edge["local"]

    proxy.refuse(True)
    proxy.cut()
    # Without the crawl, a would only see the route c via b go: "down". b reports its connector.
    with trio.fail_after(20):
        while (edge := await edge_of(url, "b", "c")).get("state") not in ("failed", "connecting", "waiting"):
            assert edge.get("state") in ("operational", "down")
            await trio.sleep(0.1)
    assert not edge["local"]
    states = {edge["state"]}
    with trio.fail_after(20):  # the connector's retries are crawled too: failed between them
        while edge["state"] != "failed":  # (the crawl may first see it connecting, before its error)
            edge = await edge_of(url, "b", "c")
            states.add(edge["state"])
            await trio.sleep(0.1)
    assert edge["error"]  # a failed link says why
    assert states <= {"failed", "connecting", "waiting"}
    assert (await edge_of(url, "a", "c"))["state"] == "operational"

    proxy.heal()
    with trio.fail_after(20):
        while (await edge_of(url, "b", "c")).get("state") != "operational":
            await trio.sleep(0.1)


async def test_a_remote_routers_page_shows_its_queues_through_sys_mgmt(network):
    web_config = WebConfig(enabled=True, port=0, map_refresh_interval=0.5)
    a = await network.start(
        network.config("a", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": web_config})
    )
    b = await network.start(network.config("b", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    c = await network.start(network.config("c", startorder=ROUTING_STACK, swiftlets={"sys$routing": routing_config()}))
    b.management.add("/sys$queuemanager/queues", "orders-at-b")
    network.connect("a", "b")
    network.connect("b", "c")
    await network.settle({"a": {"b": 1, "c": 2}})
    url = a.swiftlet("sys$web").url
    status, _, page = await fetch(url + "/routers/b")
    assert status == 200 and "orders-at-b" in page and "asked of it through sys$mgmt" in page
    assert '<table id="connections">' in page or '<p id="connections">no client connections' in page
    assert c.management is not None
    status, _, page = await fetch(url + "/routers/c")  # no sys$mgmt there: the request is not served
    assert status == 200 and '<p id="queues">not available: ' in page


async def test_admin_map_and_web_map_agree_when_a_router_is_down(network):
    # a ring: a dials b, b dials c, c dials a; a serves the web map; then c stops
    from martinet.swiftlets.mgmt.admin import crawl
    from martinet.swiftlets.mgmt.client import AdminClient

    web_config = WebConfig(enabled=True, port=0, map_refresh_interval=0.5, map_request_timeout=2.0)
    a = await network.start(
        network.config("a", startorder=WEB_STACK, swiftlets={"sys$routing": routing_config(), "sys$web": web_config})
    )
    for name in ("b", "c"):
        await network.start(network.config(name, startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    network.connect("a", "b")
    network.connect("b", "c", **{"retry-time": "1000"})
    network.connect("c", "a", **{"retry-time": "1000"})
    await network.settle({"a": {"b": 1, "c": 1}, "b": {"a": 1, "c": 1}})
    url = a.swiftlet("sys$web").url

    async def web_view() -> tuple[dict, dict]:
        status, _, body = await fetch(url + "/map.json")
        assert status == 200
        shown = json.loads(body)
        routers = {r["name"]: r["state"] != "unreachable" for r in shown["routers"]}
        return routers, {(e["a"], e["b"]): e["state"] == "operational" for e in shown["edges"]}

    def admin_view(found) -> tuple[dict, dict]:
        routers = {name: name not in found.unreachable for name in found.routers}
        return routers, {
            (min(link.source, link.target), max(link.source, link.target)): link.state == "operational"
            for link in found.links
        }

    everyone = {"a": True, "b": True, "c": True}
    up = {("a", "b"): True, ("b", "c"): True, ("a", "c"): True}
    async with AdminClient.open(network.url("a")) as admin:
        with trio.fail_after(20):
            while (await web_view()) != (everyone, up):
                await trio.sleep(0.1)
        assert admin_view(await crawl(admin)) == (everyone, up)

        await network.stop("c")
        await network.settle({"a": {"b": 1}, "b": {"a": 1}})
        down = ({"a": True, "b": True, "c": False}, {("a", "b"): True, ("b", "c"): False, ("a", "c"): False})
        with trio.fail_after(20):  # one crawl, one answer: c and both its links are shown, down
            while (await web_view()) != down:
                await trio.sleep(0.1)
        assert admin_view(await crawl(admin)) == down


async def test_a_remote_routers_pages_show_the_last_hour_its_own_web_view_kept(network):
    """b's web view keeps b's history, and shows it in its management tree a point a minute;
    a's pages of b draw it from there (a queue's backlog over two minutes: 3, then 6
    messages). A router without sys$web has no history to show: its pages have no
    sparklines, and say nothing is wrong."""
    web_config = WebConfig(enabled=True, port=0, map_refresh_interval=0.5)
    routers = {}
    for name, stack in (("a", WEB_STACK), ("b", WEB_STACK), ("c", MGMT_STACK)):
        swiftlets = {"sys$routing": routing_config()} | ({"sys$web": web_config} if stack is WEB_STACK else {})
        routers[name] = await network.start(network.config(name, startorder=stack, swiftlets=swiftlets))
    network.connect("a", "b")
    network.connect("a", "c")
    # b's own view too: its history follows b's link once b's side of it is operational
    await network.settle({"a": {"b": 1, "c": 1}, "b": {"a": 1, "c": 2}})
    b = routers["b"]
    b.management.add("/sys$queuemanager/queues", "orders-at-b")
    web = b.swiftlet("sys$web")
    for minute in range(2):  # two minutes of points, six each, without waiting for them
        for n in range(3):
            b.swiftlet("sys$queuemanager").send_nowait("orders-at-b", build(f"{minute}:{n}"))
        for _ in range(PER_MINUTE):
            web.sample()
    minutes = b.management.resolve("/sys$web/usage/history-queues/orders-at-b").properties()
    assert minutes["messages"] == [3.0, 6.0]
    url = routers["a"].swiftlet("sys$web").url
    status, _, page = await fetch(url + "/routers/b/queues")
    assert status == 200
    row = page[page.index(">orders-at-b</a></td>") :].split("</tr>")[0]
    assert 'data-points="2" data-last="6"' in row and "messages, last hour" in page
    status, _, page = await fetch(url + "/routers/b/routing")  # b's link with a: rates, window, their hour
    links = page[page.index('<table id="links">') :].split("</table>")[0]
    head = ["routername", "state", "messages-out-rate", "messages-in-rate", "window"]
    assert "".join(f"<th>{name}</th>" for name in head) in links and "messages-out-rate, last hour" in links
    assert "<td>a</td><td>operational</td>" in links and links.count('data-points="2"') == 2
    routers["c"].management.add("/sys$queuemanager/queues", "orders-at-c")
    status, _, page = await fetch(url + "/routers/c/queues")
    assert status == 200 and ">orders-at-c</a></td>" in page
    assert "last hour" not in page and "not available" not in page
