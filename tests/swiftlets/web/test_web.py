"""``sys$web`` over real sockets: /metrics under known load, the map's event stream, the bind
rules, basic auth, and stopping with a stream open. (The pages in a real browser:
tests/interop/test_web_browser.py.)"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from email.message import Message

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from martinet.kernel import SwiftletFailed
from martinet.messaging.client import DeliveryMode, Queue, TextMessage, Topic, connect
from martinet.messaging.message import build
from martinet.swiftlets.authentication.config import AuthenticationConfig, GroupConfig, UserConfig
from martinet.swiftlets.store.config import StoreConfig
from martinet.swiftlets.web.config import WebConfig

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import ROUTING_STACK, routing_config
from tests.harness.processes import free_port

WEB_STACK = (*ROUTING_STACK, "sys$web")


async def start_web(network, name: str, web: WebConfig | None = None, **swiftlets):
    """Router ``name`` with routing and ``sys$web`` (enabled on a free loopback port unless ``web``)."""
    configs = {"sys$routing": routing_config(), "sys$web": web or WebConfig(enabled=True, port=0), **swiftlets}
    router = await network.start(network.config(name, startorder=WEB_STACK, swiftlets=configs))
    return router, router.swiftlet("sys$web")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def fetch(url: str, authorization: str | None = None) -> tuple[int, Message, str]:
    """GET ``url`` over a real socket (urllib, in a worker thread): status, headers, body."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)

    def get() -> tuple[int, Message, str]:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers, response.read().decode()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.headers, error.read().decode()

    return await trio.to_thread.run_sync(get)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a Prometheus text exposition, by name and labels (parsed by prometheus-client)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(parsed: dict, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in parsed, f"no sample {name}{labels}; samples of that name: " + str(
        [dict(k[1]) for k in parsed if k[0] == name]
    )
    return parsed[key]


async def produce(url: str, queue: str, count: int) -> None:
    async with connect(url) as connection, connection.session() as session:
        async with session.producer(Queue(queue), delivery_mode=DeliveryMode.PERSISTENT) as producer:
            for n in range(count):
                await producer.send(TextMessage(f"m{n}"))


async def consume(url: str, queue: str, count: int) -> None:
    async with connect(url) as connection, connection.session() as session:
        async with session.consumer(Queue(queue)) as consumer:
            with trio.fail_after(20):
                for _ in range(count):
                    assert await consumer.receive(10) is not None


async def test_disabled_by_default_it_serves_nothing(network):
    router, web = await start_web(network, "a", WebConfig())
    assert web.url == "" and router.management.get("/sys$web/usage", "url") == ""


async def test_metrics_carry_the_usage_with_router_and_entity_labels(network, tmp_path):
    store = StoreConfig(path=str(tmp_path / "a-store"), sync="full")
    router, web = await start_web(network, "a", **{"sys$store": store})
    await network.start_routers("b")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    await produce(network.url("a"), "orders", 7)
    await consume(network.url("a"), "orders", 2)

    status, headers, text = await fetch(web.url + "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    parsed = samples(text)
    queue = {"router": "a", "queue": "orders"}
    assert value(parsed, "martinet_queuemanager_queues_messages", **queue) == 5
    assert value(parsed, "martinet_queuemanager_queues_enqueued_total", **queue) == 7
    assert value(parsed, "martinet_queuemanager_queues_dequeued_total", **queue) == 2
    assert value(parsed, "martinet_routing_connectors_state", router="a", connector="b", state="operational") == 1
    assert (
        value(parsed, "martinet_routing_connections_state", router="a", connection="connector:b", state="operational")
        == 1
    )
    assert value(parsed, "martinet_routing_routing_table_routes", router="a", destination="b") == 1
    assert value(parsed, "martinet_routing_routing_table_active", router="a", destination="b") == 1
    assert value(parsed, "martinet_routing_destinations", router="a") == 1
    assert value(parsed, "martinet_xa_in_doubt", router="a") == 0
    transactions = value(parsed, "martinet_store_transactions_total", router="a")
    assert transactions >= 7 and value(parsed, "martinet_store_fsyncs_total", router="a") == transactions
    assert (
        value(parsed, "martinet_pool_max_concurrency", router="a", swiftlet="sys$routing", pool="routing.scheduler")
        == 3
    )
    assert value(parsed, "martinet_router_swiftlets_state", router="a", swiftlet="sys$web", state="running") == 1
    families = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert families["martinet_queuemanager_queues_enqueued"] == "counter"
    assert families["martinet_queuemanager_queues_messages"] == "gauge"


class EventStream:
    """``/events`` read over a raw trio socket: HTTP/1.1, chunked Server-Sent Events."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.buffer = b""

    @classmethod
    async def open(cls, url: str) -> EventStream:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(f"GET /events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode())
        events = cls(stream)
        head = await events._until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
        return events

    async def _until(self, mark: bytes) -> bytes:
        while mark not in self.buffer:
            data = await self.stream.receive_some()
            assert data, "the server closed the event stream"
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(mark)
        return head

    async def next_map(self) -> dict:
        """The next ``map`` event's data (chunk framing and keepalive comments skipped)."""
        while True:
            size = int(await self._until(b"\r\n"), 16)
            while len(self.buffer) < size + 2:
                self.buffer += await self.stream.receive_some()
            chunk, self.buffer = self.buffer[:size], self.buffer[size + 2 :]
            if chunk.startswith(b"event: map\n"):
                return json.loads(chunk.split(b"data: ", 1)[1])


async def test_the_event_stream_sends_the_map_and_each_change_and_a_stop_ends_it(network):
    router, web = await start_web(network, "a")
    await network.start_routers("b", "c")
    network.connect("a", "b")
    network.connect("b", "c")
    await network.settle({"a": {"b": 1, "c": 2}})
    events = await EventStream.open(web.url)
    with trio.fail_after(20):
        while len((first := await events.next_map())["edges"]) < 2:  # the map may lag the table by a rebuild
            pass
        assert {r["name"]: r["state"] for r in first["routers"]} == {"a": "local", "b": "reachable", "c": "reachable"}
        assert {(e["a"], e["b"]): e["state"] for e in first["edges"]} == {
            ("a", "b"): "operational",
            ("b", "c"): "operational",
        }
        network.routers["b"].management.remove("/sys$routing/connectors", "c")
        while (latest := await events.next_map())["edges"][-1]["state"] != "down":
            pass
    assert latest["edges"][-1]["a"] == "b" and {r["name"]: r["state"] for r in latest["routers"]}["c"] == "unreachable"
    assert (await fetch(web.url + "/map.json"))[2] == json.dumps(latest, separators=(",", ":"))
    await network.stop("a")  # bounded (15 s) although the stream is still open
    await events.stream.aclose()


async def test_a_non_loopback_bind_needs_authentication(network):
    with pytest.raises(
        SwiftletFailed, match="bind-address '0.0.0.0' is not a loopback address.*needs authentication-enabled"
    ):
        await start_web(network, "a", WebConfig(enabled=True, bind_address="0.0.0.0", port=0))


async def test_a_taken_port_fails_the_start_with_the_address(network):
    port = free_port()
    with trio.socket.socket() as taken:
        await taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(
            SwiftletFailed, match=f"cannot listen on 127.0.0.1:{port} \\(bind-address, port\\): Address already in use"
        ):
            await start_web(network, "a", WebConfig(enabled=True, port=port))


async def test_with_authentication_only_the_admin_group_gets_in(network):
    authentication = AuthenticationConfig(
        authentication_enabled=True,
        groups=[GroupConfig(name="admin"), GroupConfig(name="apps")],
        users=[
            UserConfig(name="root", password="top", group="admin"),
            UserConfig(name="app", password="pw", group="apps"),
        ],
    )
    router, web = await start_web(
        network,
        "a",
        WebConfig(enabled=True, bind_address="0.0.0.0", port=0, plain_http_auth=True),
        **{"sys$authentication": authentication},
    )
    url = "http://127.0.0.1:" + web.url.rsplit(":", 1)[1]
    status, headers, _ = await fetch(url + "/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert (await fetch(url + "/", basic("root", "wrong")))[0] == 401
    for malformed in ("Basic !!!", "Basic " + base64.b64encode(b"root").decode(), "Bearer x", "Basic /w=="):
        status, _, body = await fetch(url + "/", malformed)
        assert status == 401 and ("malformed" in body or "log in" in body), (malformed, body)
    status, _, body = await fetch(url + "/routers/a", basic("app", "pw"))
    assert status == 403 and "not in the admin group" in body
    status, _, body = await fetch(url + "/metrics", basic("root", "top"))
    assert status == 200 and 'martinet_router_state{router="a",state="running"} 1.0' in body
    assert (await fetch(url + "/routers/a", basic("root", "top")))[0] == 200
    router.management.set("/sys$authentication", "authentication-enabled", "false")  # not on loopback: closed
    status, _, body = await fetch(url + "/metrics", basic("root", "top"))
    assert status == 403 and "serves nothing until authentication is on again" in body
    router.management.set("/sys$authentication", "authentication-enabled", "true")
    assert (await fetch(url + "/metrics"))[0] == 401
    assert (await fetch(url + "/metrics", basic("root", "top")))[0] == 200


async def test_on_loopback_authentication_switched_on_at_runtime_applies_at_once(network):
    authentication = AuthenticationConfig(
        groups=[GroupConfig(name="admin")], users=[UserConfig(name="root", password="top", group="admin")]
    )
    router, web = await start_web(network, "a", **{"sys$authentication": authentication})
    assert (await fetch(web.url + "/metrics"))[0] == 200
    router.management.set("/sys$authentication", "authentication-enabled", "true")
    assert (await fetch(web.url + "/metrics"))[0] == 401
    assert (await fetch(web.url + "/metrics", basic("root", "top")))[0] == 200


async def test_bad_http_input_gets_400_without_a_traceback_and_the_router_serves_on(network, caplog):
    router, web = await start_web(network, "a")
    host, port = web.url.removeprefix("http://").rsplit(":", 1)
    for garbage in (
        b"GARBAGE\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n",
    ):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(garbage)
        with trio.fail_after(10):
            assert (await stream.receive_some()).startswith(b"HTTP/1.1 400 ")
        await stream.aclose()
    status, _, body = await fetch(web.url + "/routers/%3Cscript%3E")
    assert status == 200 and "a knows no router &lt;script&gt;." in body
    assert (await fetch(web.url + "/nothing"))[0] == 404
    assert (await fetch(web.url + "/metrics"))[0] == 200
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]


async def test_nested_usage_lists_get_a_label_each_and_odd_names_are_escaped(network):
    router, web = await start_web(network, "a")
    outer = router.management.resolve("/sys$web/usage").add_list("topics")
    outer.add('x"y\\z').add_list("topics").add("b", lambda: {"messages": 2, "note": "text is left out"})
    parsed = samples((await fetch(web.url + "/metrics"))[2])
    assert value(parsed, "martinet_web_topics_topics_messages", router="a", topic='x"y\\z', topic_="b") == 2
    assert not [key for key in parsed if "note" in key[0]]


async def test_a_local_link_shows_its_connector_failing_and_coming_back(network, nursery):
    router, web = await start_web(network, "a")
    await network.start_routers("b")
    proxy = FaultProxy("127.0.0.1", network.routing_port("b"))
    await nursery.start(proxy.run)
    router.management.add(
        "/sys$routing/connectors", "b", {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000"}
    )
    await network.settle({"a": {"b": 1}})
    with trio.fail_after(20):  # the map follows the table's events (rebuilt once per burst)
        while (edge := web.network_map().edge("a", "b")) is None or edge.state != "operational":
            await web.changed()
    proxy.refuse(True)
    proxy.cut()
    seen = set()
    with trio.fail_after(20):  # failed, then connecting again (the attempts name no peer: still a's link to b)
        while not {"failed", "connecting"} <= seen:
            await web.changed()
            edge = web.network_map().edge("a", "b")
            seen.add(edge.state)
    assert edge.local and edge.error and web.network_map().router("b").state == "unreachable"
    proxy.heal()
    with trio.fail_after(20):
        while web.network_map().edge("a", "b").state != "operational":
            await web.changed()


async def test_hypercorns_ctrl_c_hint_stays_out_of_the_routers_log(network, caplog):
    # the router, not hypercorn, owns the process and its signals: the hint would be wrong
    caplog.set_level(logging.INFO)
    router, web = await start_web(network, "a")
    assert (await fetch(web.url + "/metrics"))[0] == 200
    assert [r.getMessage() for r in caplog.records if "web view and /metrics on" in r.getMessage()]
    assert not [r.getMessage() for r in caplog.records if "CTRL + C" in r.getMessage()]


async def test_the_history_keeps_an_hour_of_points_per_value_and_forgets_what_is_gone(network):
    from martinet.swiftlets.web.history import History, sparkline

    router, _ = await start_web(network, "a")
    router.management.add("/sys$queuemanager/queues", "orders")
    history = History(router.management, points=3)
    queues = "/sys$queuemanager/usage/queues"
    for n in range(5):
        router.swiftlet("sys$queuemanager").send_nowait("orders", build(f"m{n}"))
        history.sample()
    assert list(history.series(queues, "orders", "messages")) == [3.0, 4.0, 5.0]  # the last 3 only
    assert list(history.series(queues, "orders", "send-rate"))  # rates are followed too
    drawn = sparkline(history.series(queues, "orders", "messages"), span=3)
    assert 'data-points="3" data-last="5"' in drawn and "now 5, highest 5" in drawn
    router.management.remove("/sys$queuemanager/queues", "orders")
    history.sample()
    assert history.series(queues, "orders", "messages") == ()
    assert sparkline(()) == ""


async def test_the_queues_page_lists_every_kind_of_system_queue_apart_from_the_applications(network):
    """A temporary queue, a non-durable and a durable subscription's queues, a routing queue
    and the router's own are system queues; a user's queue is an application queue."""
    router, web = await start_web(network, "a")
    await network.start(network.config("b", startorder=ROUTING_STACK, swiftlets={"sys$routing": routing_config()}))
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    router.management.add("/sys$queuemanager/queues", "orders")
    async with connect(network.url("a"), client_id="reader") as connection, connection.session() as session:
        temporary = await session.create_temporary_queue()
        async with session.consumer(Topic("news")), session.durable_subscriber(Topic("news"), "all"):
            names = set(router.management.resolve("/sys$queuemanager/usage/queues").children)
            kinds = {
                "temporary": temporary.name.split("@")[0],  # (its address names the router)
                "topic": next(name for name in names if name.startswith("tpc$")),
                "subscription": "reader$all",
                "routing": "rt$b",
                "system": "sys$mgmt" if "sys$mgmt" in names else next(n for n in names if n.startswith("sys$")),
            }
            assert all(name in names for name in kinds.values()), (kinds, names)
            pages = {}
            for show in ("application", "system"):
                status, _, pages[show] = await fetch(f"{web.url}/routers/a/queues?show={show}")
                assert status == 200
            assert ">orders</a></td>" in pages["application"] and ">orders</a></td>" not in pages["system"]
            for what, name in kinds.items():
                assert f">{name}</a></td>" in pages["system"], what
                assert f">{name}</a></td>" not in pages["application"], what
