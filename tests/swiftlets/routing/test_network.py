"""Whole router networks in one trio process: links, route exchange and routing tables.

Each test starts real routers (the ``network`` fixture) whose routing listeners sit on free
loopback ports and adds connectors through the management tree while they run, as an
operator would; ``network.settle`` waits (bounded) until every table is the expected one.
"""

from __future__ import annotations

import itertools

import pytest
import trio

from martinet.kernel import ManagementError
from martinet.swiftlets.routing.api import (
    DestinationActivated,
    DestinationAdded,
    DestinationDeactivated,
    DestinationRemoved,
    LinkState,
    LinkStateChanged,
)
from martinet.swiftlets.routing.config import HostAccessEntry

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import Network, routing_config


def connector_usage(network, router: str, connector: str) -> dict:
    return network.routers[router].management.resolve(f"/sys$routing/usage/connectors/{connector}").properties()


async def wait_for_state(network, router: str, connector: str, state: LinkState, timeout: float = 20) -> dict:
    with trio.fail_after(timeout):
        while (usage := connector_usage(network, router, connector))["state"] != state.value:
            await trio.sleep(0.02)
    return usage


def chain(network, names):
    for a, b in itertools.pairwise(names):
        network.connect(a, b)


async def test_a_chain_of_five_learns_up_to_the_default_hop_limit(network):
    names = [f"r{i}" for i in range(1, 6)]
    await network.start_routers(*names)
    chain(network, names)
    # hop limit 3: a route of 3 hops is not passed on, so the ends never learn each other
    await network.settle(
        {
            "r1": {"r2": 1, "r3": 2, "r4": 3},
            "r2": {"r1": 1, "r3": 1, "r4": 2, "r5": 3},
            "r3": {"r1": 2, "r2": 1, "r4": 1, "r5": 2},
            "r4": {"r1": 3, "r2": 2, "r3": 1, "r5": 1},
            "r5": {"r2": 3, "r3": 2, "r4": 1},
        }
    )
    row = network.routers["r1"].swiftlet("sys$routing").destination("r4")
    assert row.routes == (("r2", "r3", "r4"),) and row.next_hop == "r2"
    usage = network.routers["r1"].management.resolve("/sys$routing/usage/routing-table/r4").properties()
    assert usage["next-hop"] == "r2" and usage["active"] is True
    routes = network.routers["r1"].management.resolve("/sys$routing/usage/routing-table/r4/dynamic-routes")
    assert list(routes.children) == ["r2;r3;r4"]


async def test_an_unlimited_hop_limit_lets_the_ends_of_the_chain_meet(network):
    names = [f"r{i}" for i in range(1, 6)]
    await network.start_routers(*names, route_announce_hop_limit=-1)
    chain(network, names)
    await network.settle({"r1": {"r2": 1, "r3": 2, "r4": 3, "r5": 4}, "r5": {"r1": 4, "r2": 3, "r3": 2, "r4": 1}})


async def test_a_ring_of_six_takes_the_shortest_way_round(network):
    names = [f"r{i}" for i in range(6)]
    await network.start_routers(*names)
    for i, name in enumerate(names):
        network.connect(name, names[(i + 1) % 6])
    expected = {
        name: {other: min((j - i) % 6, (i - j) % 6) for j, other in enumerate(names) if other != name}
        for i, name in enumerate(names)
    }
    await network.settle(expected)
    routing = network.routers["r0"].swiftlet("sys$routing")
    assert routing.destination("r1").next_hop == "r1"
    assert routing.destination("r5").next_hop == "r5"
    # 3 hops either way: both routes are kept. The hop counts settle with the first of them;
    # the other may still be on its way round the ring.
    with trio.fail_after(20):
        while len(routing.destination("r3").routes) < 2:
            await trio.sleep(0.02)
    assert sorted(routing.destination("r3").routes) == [("r1", "r2", "r3"), ("r5", "r4", "r3")]


async def test_a_full_mesh_and_a_star(network):
    mesh = [f"m{i}" for i in range(5)]
    await network.start_routers(*mesh)
    for i, a in enumerate(mesh):
        for b in mesh[i + 1 :]:
            network.connect(a, b)
    await network.settle({a: {b: 1 for b in mesh if b != a} for a in mesh})
    m0 = network.routers["m0"].swiftlet("sys$routing")
    assert m0.destination("m1").next_hop == "m1"
    with trio.fail_after(20):  # the detours over the others are known too (they may come after the shortest)
        while len(m0.destination("m1").routes) <= 1:
            await trio.sleep(0.02)

    leaves = [f"leaf{i}" for i in range(4)]
    await network.start_routers("hub", *leaves)
    for leaf in leaves:
        network.connect(leaf, "hub")
    await network.settle(
        {
            "hub": {leaf: 1 for leaf in leaves},
            **{leaf: {"hub": 1, **{o: 2 for o in leaves if o != leaf}} for leaf in leaves},
        }
    )


@pytest.mark.parametrize(
    ("kind", "routers", "leaf0_learns"),
    [
        ("include_by_destination", "leaf1", {"hub": 1, "leaf1": 2}),
        ("exclude_by_destination", "leaf1", {"hub": 1, "leaf2": 2, "far": 3}),
        ("include_by_hop", "leaf2", {"hub": 1, "leaf2": 2, "far": 3}),
        ("exclude_by_hop", "leaf2", {"hub": 1, "leaf1": 2}),
    ],
)
async def test_route_filters_at_the_hub(network, kind, routers, leaf0_learns):
    await network.start_routers("hub", "leaf0", "leaf1", "leaf2", "far")
    hub = network.routers["hub"].management
    hub.add("/sys$routing/filters", "leaf0", {"type": kind})  # what hub announces to leaf0
    hub.add("/sys$routing/filters/leaf0/routers", routers)
    for leaf in ("leaf0", "leaf1", "leaf2"):
        network.connect(leaf, "hub")
    network.connect("far", "leaf2")
    await network.settle({"leaf0": leaf0_learns, "hub": {"leaf0": 1, "leaf1": 1, "leaf2": 1, "far": 2}})
    hub.remove("/sys$routing/filters", "leaf0")  # at runtime: leaf0 gets the difference
    await network.settle({"leaf0": {"hub": 1, "leaf1": 2, "leaf2": 2, "far": 3}})


async def test_static_routes_make_a_router_known_but_are_not_announced(network):
    await network.start_routers("a", "b")
    events = network.routers["a"].bus.subscribe(DestinationAdded)
    network.routers["a"].management.add("/sys$routing/static-routes", "z")
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    row = network.routers["a"].swiftlet("sys$routing").destination("z")
    assert row.static and not row.active and row.next_hop is None
    assert network.routers["b"].swiftlet("sys$routing").destination("z") is None  # never announced
    assert (await events.receive()).router == "z"
    network.routers["a"].management.remove("/sys$routing/static-routes", "z")
    assert network.routers["a"].swiftlet("sys$routing").destination("z") is None


async def test_a_link_drop_withdraws_routes_and_recovery_brings_them_back(network, nursery):
    await network.start_routers("a", "b", "c")
    proxy = FaultProxy("127.0.0.1", network.routing_port("b"))
    await nursery.start(proxy.run)
    network.routers["a"].management.add(
        "/sys$routing/connectors", "b", {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000"}
    )
    network.connect("b", "c")
    await network.settle({"a": {"b": 1, "c": 2}, "c": {"a": 2, "b": 1}})
    events = network.routers["c"].bus.subscribe(DestinationDeactivated)
    added = network.routers["c"].bus.subscribe(DestinationActivated)

    proxy.refuse(True)
    proxy.cut()
    await network.settle({"a": {}, "c": {"b": 1}})
    assert (await events.receive()).router == "a"
    assert network.routers["c"].swiftlet("sys$routing").destination("a") is None  # removed, not only inactive
    usage = await wait_for_state(network, "a", "b", LinkState.FAILED)
    assert "the peer closed the connection" in usage["last-error"]
    proxy.heal()
    await network.settle({"a": {"b": 1, "c": 2}, "c": {"a": 2, "b": 1}})
    assert (await added.receive()).router == "a"


async def test_events_come_in_causal_order(network):
    await network.start_routers("a", "b")
    events = network.routers["a"].bus.subscribe(DestinationAdded)  # and every subclass of it: none
    every = network.routers["a"].bus.subscribe()
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    network.routers["a"].management.remove("/sys$routing/connectors", "b")
    await network.settle({"a": {}, "b": {}})
    assert (await events.receive()).router == "b"
    seen = []
    with trio.move_on_after(1):
        while len(seen) < 4:
            event = await every.receive()
            if isinstance(event, (DestinationAdded, DestinationActivated, DestinationDeactivated, DestinationRemoved)):
                seen.append(type(event))
    assert seen == [DestinationAdded, DestinationActivated, DestinationDeactivated, DestinationRemoved]


async def test_a_router_is_connected_once(network):
    await network.start_routers("a", "b")
    network.connect("a", "b")
    await wait_for_state(network, "a", "b", LinkState.OPERATIONAL)
    network.connect("a", "b", name="again", **{"retry-time": "1000"})
    usage = await wait_for_state(network, "a", "again", LinkState.FAILED)
    assert "already connected" in usage["last-error"]  # refused by b (or by a itself)
    assert connector_usage(network, "a", "b")["state"] == "operational"  # the first link is untouched

    network.connect("a", "a", name="myself")  # the own name is refused too
    usage = await wait_for_state(network, "a", "myself", LinkState.FAILED)
    assert "both routers are named 'a'" in usage["last-error"]


async def test_two_routers_dialling_each_other_keep_one_link(network):
    for attempt in range(3):
        a, b = f"a{attempt}", f"b{attempt}"
        await network.start_routers(a, b)
        network.connect(a, b, **{"retry-time": "1000"})
        network.connect(b, a, **{"retry-time": "1000"})
        await network.settle({a: {b: 1}, b: {a: 1}})
        # The loser settles as refused, the winner stays: one link, the same at both ends (a's
        # connector is b's listener link, or the other way round). On the way there one end may
        # count a link operational a moment before the other does, so the whole picture is awaited.
        with trio.fail_after(20):
            while True:
                a_dialled = connector_usage(network, a, b)["state"] == "operational"
                b_dialled = connector_usage(network, b, a)["state"] == "operational"
                links_a = list(network.routers[a].management.resolve("/sys$routing/usage/connections").children)
                links_b = list(network.routers[b].management.resolve("/sys$routing/usage/connections").children)
                if (
                    a_dialled != b_dialled
                    and len(links_a) == len(links_b) == 1
                    and a_dialled == links_b[0].startswith("listener")
                    and b_dialled == links_a[0].startswith("listener")
                ):
                    break
                await trio.sleep(0.05)


async def test_a_wrong_password_is_refused_at_both_ends_with_the_reason(network):
    await network.start_routers("a", "b", listener={"password": "right"})
    refused = network.routers["b"].bus.subscribe(LinkStateChanged)
    network.connect("a", "b", password="wrong")
    usage = await wait_for_state(network, "a", "b", LinkState.FAILED)
    assert "authentication failed" in usage["last-error"]
    with trio.fail_after(10):
        while True:
            event = await refused.receive()
            if event.state is LinkState.FAILED:
                break
    assert "authentication failed" in event.error and event.link.startswith("listener:links:")
    assert network.table("a") == {} and network.table("b") == {}
    network.routers["a"].management.set("/sys$routing/connectors/b", "password", "right")  # reconnects now
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})


async def test_the_password_never_shows_in_management(network):
    await network.start_routers("a", listener={"password": "secret"})
    assert network.routers["a"].management.get("/sys$routing/listeners/links", "password") != "secret"


async def test_a_connector_can_be_disabled_enabled_and_removed_at_runtime(network):
    await network.start_routers("a", "b")
    network.connect("a", "b", **{"retry-time": "1000"})
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    management = network.routers["a"].management
    management.set("/sys$routing/connectors/b", "enabled", "false")
    await wait_for_state(network, "a", "b", LinkState.DISABLED)
    await network.settle({"a": {}, "b": {}})
    management.set("/sys$routing/connectors/b", "enabled", "true")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    closed = network.routers["b"].bus.subscribe(LinkStateChanged)
    management.remove("/sys$routing/connectors", "b")
    await network.settle({"a": {}, "b": {}})
    with trio.fail_after(5):  # b read why
        while not (event := await closed.receive()).error:
            pass
    assert event.error == "closed by a: connector b removed"
    with pytest.raises(ManagementError):
        management.resolve("/sys$routing/usage/connectors/b")


async def test_connectors_and_routes_added_at_runtime_are_saved(network, tmp_path):
    await network.start_routers("a", "b")
    network.connect("a", "b")
    network.routers["a"].management.add("/sys$routing/static-routes", "faraway")
    saved = network.routers["a"].save(tmp_path / "saved.xml").read_text()
    assert '<connector name="b" hostname="127.0.0.1"' in saved
    assert '<static-route name="faraway"/>' in saved


async def test_tls_links(network, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    await trio.run_process(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_stdout=True,
        capture_stderr=True,
    )
    await network.start_routers(
        "a", "b", listener={"tls_certificate": str(cert), "tls_key": str(key), "password": "over-tls"}
    )
    network.connect("a", "b", password="over-tls", **{"use-tls": "true", "tls-ca": str(cert)})
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    network.connect("b", "a", name="plain", password="over-tls")  # plain bytes to a TLS listener fail
    usage = await wait_for_state(network, "b", "plain", LinkState.FAILED)
    assert usage["last-error"]
    network.connect("b", "a", name="untrusted", password="over-tls", **{"use-tls": "true"})
    usage = await wait_for_state(network, "b", "untrusted", LinkState.FAILED)
    assert "CERTIFICATE_VERIFY_FAILED" in usage["last-error"]


async def test_keepalive_closes_a_half_open_link_and_the_connector_comes_back(network, nursery):
    await network.start_routers("a", "b", stage_valid_timeout=1000, listener={"keepalive_interval": 200})
    proxy = FaultProxy("127.0.0.1", network.routing_port("b"))
    await nursery.start(proxy.run)
    network.routers["a"].management.add(
        "/sys$routing/connectors", "b", {"hostname": "127.0.0.1", "port": str(proxy.port), "retry-time": "1000"}
    )
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    listener_side = network.routers["b"].bus.subscribe(LinkStateChanged)

    proxy.blackhole(True)  # both TCP connections stay up, nothing arrives any more
    start = trio.current_time()
    await network.settle({"a": {}, "b": {}}, timeout=10)
    detected = trio.current_time() - start
    assert 0.8 <= detected <= 5, detected  # 5 intervals of 0.2 s, give or take the scheduling
    usage = await wait_for_state(network, "a", "b", LinkState.FAILED)
    assert (
        "no keepalive from b for 5 intervals" in usage["last-error"] or "stage-valid-timeout" in usage["last-error"]
    ), usage
    with trio.fail_after(5):
        while (event := await listener_side.receive()).error is None:
            pass
    assert "no keepalive from a for 5 intervals" in event.error
    proxy.heal()
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})


async def test_the_host_access_list_is_checked_and_can_change_at_runtime(network):
    await network.start_routers("a", "b", listener={"host_access_list": [HostAccessEntry(name="10.%")]})
    network.connect("a", "b", **{"retry-time": "1000"})
    usage = await wait_for_state(network, "a", "b", LinkState.FAILED)
    assert "127.0.0.1 is not in the host access list of routing listener links of b" in usage["last-error"]
    assert network.routers["b"].management.get("/sys$routing/usage/listeners/links", "refused") >= 1
    network.routers["b"].management.add("/sys$routing/listeners/links/host-access-list", "127.0.0.%")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})


async def test_listeners_can_be_added_and_removed_at_runtime(network):
    await network.start_routers("a", "b")
    b = network.routers["b"].management
    b.add("/sys$routing/listeners", "extra", {"port": "0", "bindaddress": "127.0.0.1"})
    network.connect("a", "b", listener="extra")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    port = network.routing_port("b", "extra")
    b.remove("/sys$routing/listeners", "extra")  # its links go with it, and the port is closed
    await network.settle({"a": {}, "b": {}})
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


async def test_an_exponential_retry_policy_backs_off_and_a_wrong_password_never_hammers(
    nursery, tmp_path, autojump_clock
):
    network = Network(nursery, tmp_path)
    for name in ("a", "b"):  # routing alone: no store process, so the clock can jump
        await network.start(
            network.config(
                name,
                startorder=("sys$routing",),
                swiftlets={"sys$routing": routing_config(listener={"password": "right"})},
            )
        )
    failures = network.routers["a"].bus.subscribe(LinkStateChanged)
    network.connect("a", "b", password="wrong", **{"retry-policy": "exponential", "retry-time": "16000"})
    times = []
    with trio.fail_after(120):
        while len(times) < 6:
            event = await failures.receive()
            if event.state is LinkState.FAILED:
                assert "authentication failed" in event.error
                times.append(trio.current_time())
    gaps = [round(later - earlier, 1) for earlier, later in itertools.pairwise(times)]
    # the connector's waits, 2 s doubling up to retry-time, and before each handshake b's
    # own wait for an address that guessed wrong (0.1 s doubling)
    assert gaps == [2 + 0.1, 4 + 0.2, 8 + 0.4, 16 + 0.8, 16 + 1.6]
    network.routers["a"].management.set("/sys$routing/connectors/b", "password", "right")
    await network.settle({"a": {"b": 1}, "b": {"a": 1}})
    await network.stop_all()


async def test_filters_and_the_hop_limit_change_at_runtime(network):
    await network.start_routers("hub", "leaf0", "leaf1", "leaf2", "far")
    hub = network.routers["hub"].management
    hub.add("/sys$routing/filters", "leaf0", {"type": "include_by_destination"})
    hub.add("/sys$routing/filters/leaf0/routers", "leaf1")
    for leaf in ("leaf0", "leaf1", "leaf2"):
        network.connect(leaf, "hub")
    network.connect("far", "leaf2")
    await network.settle({"leaf0": {"hub": 1, "leaf1": 2}})
    hub.set("/sys$routing/filters/leaf0", "type", "exclude_by_destination")
    await network.settle({"leaf0": {"hub": 1, "leaf2": 2, "far": 3}})
    hub.add("/sys$routing/filters/leaf0/routers", "leaf2")
    await network.settle({"leaf0": {"hub": 1, "far": 3}})
    hub.remove("/sys$routing/filters/leaf0/routers", "leaf1")
    await network.settle({"leaf0": {"hub": 1, "leaf1": 2, "far": 3}})

    # far is 3 hops from leaf0: with hop limit 2 on hub, routes of 2 hops (leaf2→far) are not passed on
    hub.set("/sys$routing", "route-announce-hop-limit", "2")
    await network.settle({"leaf0": {"hub": 1, "leaf1": 2}})
    hub.set("/sys$routing", "route-announce-hop-limit", "-1")
    await network.settle({"leaf0": {"hub": 1, "leaf1": 2, "far": 3}})
