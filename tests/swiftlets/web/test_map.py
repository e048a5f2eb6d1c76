"""The network map's data (``sys$web``'s :func:`build_map`): pure, fed with hand-made views."""

from __future__ import annotations

from martinet.swiftlets.web.api import DOWN, OPERATIONAL, LinkView, build_map


def states(network_map) -> dict[tuple[str, str], str]:
    return {edge.key: edge.state for edge in network_map.edges}


def test_local_links_keep_their_exact_state_and_remote_links_come_from_the_paths():
    links = {
        "b": LinkView(peer="b", state="operational", since=10.0),
        "x": LinkView(peer="x", state="failed", since=12.0, error="connection refused"),
    }
    routes = {"b": [("b",)], "c": [("b", "c")], "d": [("b", "c", "d"), ("e", "d")], "e": [("e",)]}
    built = build_map("a", links, routes, None, now=20.0)
    assert states(built) == {
        ("a", "b"): "operational",
        ("a", "x"): "failed",
        ("b", "c"): OPERATIONAL,
        ("c", "d"): OPERATIONAL,
        ("a", "e"): OPERATIONAL,
        ("d", "e"): OPERATIONAL,
    }
    assert built.edge("x", "a").error == "connection refused" and built.edge("a", "x").since == 12.0
    assert built.edge("a", "b").local and not built.edge("c", "b").local
    assert built.edge("a", "e").local  # a route's first hop is a local link even before its event came
    assert {(r.name, r.state, r.hops) for r in built.routers} == {
        ("a", "local", 0),
        ("b", "reachable", 1),
        ("c", "reachable", 2),
        ("d", "reachable", 2),
        ("e", "reachable", 1),
        ("x", "unreachable", None),
    }


def test_a_link_gone_from_every_path_is_down_since_it_went_and_stays_so():
    links = {"b": LinkView(peer="b", state="operational", since=1.0)}
    first = build_map("a", links, {"b": [("b",)], "c": [("b", "c")], "d": [("b", "c", "d")]}, None, now=5.0)
    second = build_map("a", links, {"b": [("b",)]}, first, now=9.0)
    assert states(second) == {("a", "b"): "operational", ("b", "c"): DOWN, ("c", "d"): DOWN}
    assert second.edge("b", "c").since == 9.0 and "in no route of a" in second.edge("b", "c").error
    assert {r.name: r.state for r in second.routers} == {
        "a": "local",
        "b": "reachable",
        "c": "unreachable",
        "d": "unreachable",
    }
    third = build_map("a", links, {"b": [("b",)]}, second, now=30.0)
    assert third == second  # down since 9.0, not since each rebuild
    back = build_map("a", links, {"b": [("b",)], "c": [("b", "c")]}, third, now=40.0)
    assert back.edge("b", "c").state == OPERATIONAL and back.edge("b", "c").since == 40.0
    assert back.edge("c", "d").state == DOWN and back.router("c").state == "reachable"


def test_an_unchanged_inferred_link_keeps_its_since():
    routes = {"b": [("b",)], "c": [("b", "c")]}
    first = build_map("a", {}, routes, None, now=5.0)
    assert first.edge("b", "c").since == 5.0
    assert build_map("a", {}, routes, first, now=8.0) == first


def test_a_static_destination_without_routes_is_an_unreachable_router_without_links():
    built = build_map("a", {}, {"z": []}, None, now=1.0)
    assert built.edges == ()
    assert [(r.name, r.state) for r in built.routers] == [("a", "local"), ("z", "unreachable")]


def test_a_failed_local_link_replaces_its_operational_state_and_the_json_has_everything():
    up = build_map("a", {"b": LinkView(peer="b", state="operational", since=1.0)}, {"b": [("b",)]}, None, now=1.0)
    failed = build_map(
        "a", {"b": LinkView(peer="b", state="failed", since=3.0, error="the peer closed")}, {}, up, now=3.0
    )
    assert failed.edge("a", "b").state == "failed" and failed.router("b").state == "unreachable"
    assert failed.to_json() == {
        "local": "a",
        "routers": [{"name": "a", "state": "local", "hops": 0}, {"name": "b", "state": "unreachable", "hops": None}],
        "edges": [{"a": "a", "b": "b", "state": "failed", "since": 3.0, "local": True, "error": "the peer closed"}],
    }


def test_the_router_alone():
    alone = build_map("a", {}, {}, None, now=1.0)
    assert [r.name for r in alone.routers] == ["a"] and alone.edges == ()


def test_links_other_routers_report_replace_the_inferred_state_but_not_the_local_ones():
    links = {"b": LinkView(peer="b", state="operational", since=1.0)}
    routes = {"b": [("b",)], "c": [("b", "c")], "d": [("b", "c", "d")]}
    remote = {
        "b": [
            LinkView(peer="c", state="operational", since=2.0),
            LinkView(peer="a", state="failed", since=3.0, error="no"),
        ],  # a's own link: a knows better
        "c": [
            LinkView(peer="d", state="failed", since=4.0, error="refused"),
            LinkView(peer="b", state="connecting", since=5.0),
        ],  # c dials b too: the operational one counts
        "d": [LinkView(peer="c", state="connecting", since=6.0)],
    }  # d's report of c–d comes after c's
    built = build_map("a", links, routes, None, now=9.0, remote=remote)
    assert states(built) == {("a", "b"): "operational", ("b", "c"): "operational", ("c", "d"): "connecting"}
    assert built.edge("b", "c").since == 2.0 and not built.edge("c", "d").local
    assert (
        build_map(
            "a",
            links,
            routes,
            None,
            now=9.0,
            remote={"c": [LinkView(peer="d", state="failed", since=4.0, error="refused")]},
        )
        .edge("c", "d")
        .error
        == "refused"
    )
    gone = build_map("a", links, {"b": [("b",)]}, built, now=10.0, remote=remote)
    assert gone.edge("c", "d").state == "connecting" and gone.router("d").state == "unreachable"
