"""The route exchanger and routing table (swiftlets/routing/exchange.py), without sockets.

Table-driven cases for each output rule (SwiftMQ's route filters and
hop limit), static routes, link down, runtime reconfiguration, hostile
announcements and the event order; then Hypothesis on random networks (tests/harness/routesim.py):
whatever the delivery order and the link failures, a quiet network holds exactly the routes
an independent reference computes, and each link carries exactly the differences.
"""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from martinet.swiftlets.routing.api import (
    Destination,
    DestinationActivated,
    DestinationAdded,
    DestinationDeactivated,
    DestinationRemoved,
    RouteAdded,
    RouteRemoved,
)
from martinet.swiftlets.routing.exchange import (
    MAX_PATH,
    Announcement,
    BadAnnouncement,
    FilterType,
    Output,
    RouteExchanger,
    RouteFilter,
    refusal,
)

from tests.harness.routesim import Network, mesh, reference_announced, reference_routes, ring, shortest

ADD, REMOVE = True, False


def add(*path: str) -> Announcement:
    return Announcement(add=True, destination=path[-1], path=path)


def remove(*path: str) -> Announcement:
    return Announcement(add=False, destination=path[-1], path=path)


def sent_to(output: Output, neighbour: str) -> list[tuple[bool, tuple[str, ...]]]:
    return [(a.add, a.path) for n, a in output.sends if n == neighbour]


# -- the output rules, one at a time -----------------------------------------------------------

F = RouteFilter
INC_HOP, EXC_HOP = FilterType.INCLUDE_BY_HOP, FilterType.EXCLUDE_BY_HOP
INC_DEST, EXC_DEST = FilterType.INCLUDE_BY_DESTINATION, FilterType.EXCLUDE_BY_DESTINATION

# Router r has neighbours a and n; a announces `path` (its own route), so r holds ("a", *path).
# Is it announced on to n?  (hop limit of r, r's filter for n, what a announces, expected)
RULES = [
    ("limit 3, 2 hops", 3, None, ("x",), True),
    ("limit 3, 3 hops", 3, None, ("x", "y"), False),
    ("limit 4, 3 hops", 4, None, ("x", "y"), True),
    ("limit -1, 6 hops", -1, None, ("x", "y", "z", "v", "w"), True),
    ("limit 0 is unlimited too", 0, None, ("x", "y", "z"), True),
    ("limit 1, 2 hops", 1, None, ("x",), False),
    ("limit 2, 2 hops", 2, None, ("x",), False),
    ("n on the path", -1, None, ("n", "x"), False),
    ("n is the destination", -1, None, ("x", "n"), False),
    ("include_by_hop, next hop in", 3, F(INC_HOP, {"a"}), ("x",), True),
    ("include_by_hop, next hop out", 3, F(INC_HOP, {"x"}), ("x",), False),
    ("exclude_by_hop, next hop in", 3, F(EXC_HOP, {"a"}), ("x",), False),
    ("exclude_by_hop, next hop out", 3, F(EXC_HOP, {"x"}), ("x",), True),
    ("include_by_destination, in", 3, F(INC_DEST, {"x"}), ("x",), True),
    ("include_by_destination, out", 3, F(INC_DEST, {"a"}), ("x",), False),
    ("exclude_by_destination, in", 3, F(EXC_DEST, {"x"}), ("x",), False),
    ("exclude_by_destination, out", 3, F(EXC_DEST, {"a", "y"}), ("x",), True),
]


@pytest.mark.parametrize(
    ("limit", "route_filter", "path", "expected"), [case[1:] for case in RULES], ids=[case[0] for case in RULES]
)
def test_output_rule(limit, route_filter, path, expected):
    r = RouteExchanger("r", hop_limit=limit, filters={"n": route_filter} if route_filter else {})
    r.link_up("a")
    r.link_up("n")
    out = r.receive("a", add(*path))
    assert sent_to(out, "n") == ([(ADD, ("a", *path))] if expected else [])
    assert sent_to(out, "a") == []  # never back over the link it came from
    assert ("a", *path) not in r.announced_to("a")
    # the same decision when n comes up after the route was learned
    r.link_down("n")
    out = r.link_up("n")
    assert ((ADD, ("a", *path)) in sent_to(out, "n")) is expected


# The direct routes at link-up: r links to a, then to n: what does n get?
DIRECT = [
    ("limit 1 announces nothing", 1, None, []),
    ("limit 2 announces direct routes", 2, None, [("a",)]),
    ("limit -1", -1, None, [("a",)]),
    ("include_by_destination of itself only", 3, F(INC_DEST, {"r"}), []),
    ("include_by_hop a", 3, F(INC_HOP, {"a"}), [("a",)]),
    ("exclude_by_destination a", 3, F(EXC_DEST, {"a"}), []),
]


@pytest.mark.parametrize(
    ("limit", "route_filter", "expected"), [case[1:] for case in DIRECT], ids=[case[0] for case in DIRECT]
)
def test_direct_routes(limit, route_filter, expected):
    r = RouteExchanger("r", hop_limit=limit, filters={"n": route_filter} if route_filter else {})
    assert r.link_up("a").sends == []  # nothing to tell a: its own direct route is not sent back
    out = r.link_up("n")
    assert sent_to(out, "n") == [(ADD, path) for path in expected]
    direct_to_a = [] if limit == 1 else [(ADD, ("n",))]  # n's direct route, to a (no filter for a)
    assert sent_to(out, "a") == direct_to_a
    assert sent_to(r.link_down("n"), "a") == [(REMOVE, path) for _, path in direct_to_a]


def test_a_new_route_goes_to_every_other_neighbour_and_the_direct_route_too():
    r = RouteExchanger("r", hop_limit=-1)
    r.link_up("a")
    out = r.link_up("b")
    assert out.sends == [("a", add("b")), ("b", add("a"))]
    out = r.link_up("c")
    assert out.sends == [("a", add("c")), ("b", add("c")), ("c", add("a")), ("c", add("b"))]


def test_refusal_names_the_rule():
    assert refusal("n", ("a", "x", "y"), 3, None) == "hop limit"
    assert refusal("a", ("a", "x"), 3, None) == "its next hop"
    assert refusal("x", ("a", "x"), 3, None) == "on its path"
    assert refusal("n", ("a", "x"), 3, F(INC_DEST, {"y"})) == "filter include_by_destination"
    assert refusal("n", ("a", "x"), 3, F("exclude_by_hop", ["b"])) is None


def test_five_chain_with_the_default_limit_ends_do_not_learn_each_other():
    names = ["a", "b", "c", "d", "e"]
    net = Network(names)
    for left, right in zip(names, names[1:], strict=False):
        net.link_up(left, right)
    net.settle()
    assert net.routers["a"].destination("e") is None
    assert net.routers["e"].destination("a") is None
    assert net.routers["a"].destination("d").routes == (("b", "c", "d"),)
    assert {row.name for row in net.routers["c"].destinations()} == {"a", "b", "d", "e"}


# -- the table ------------------------------------------------------------------------------


def test_routes_are_ordered_shortest_first_newest_first_among_equals():
    r = RouteExchanger("r")
    for n in ("a", "b", "c"):
        r.link_up(n)
    r.receive("c", add("b", "x"))  # (c, b, x)
    r.receive("a", add("x"))  # (a, x)
    r.receive("b", add("x"))  # (b, x), newer than (a, x)
    row = r.destination("x")
    assert row == Destination(
        name="x", routes=(("b", "x"), ("a", "x"), ("c", "b", "x")), static=False, next_hop="b", rotation=("b",)
    )
    r.link_down("b")
    assert r.destination("x").routes == (("a", "x"), ("c", "b", "x"))  # (c, b, x) was learned over c
    assert r.destination("x").next_hop == "a"


def test_round_robin_rotates_over_every_neighbour_with_a_route_sorted_by_name():
    r = RouteExchanger("r", round_robin=True)
    for n in ("c", "a", "b"):
        r.link_up(n)
    r.receive("c", add("x"))
    r.receive("a", add("b", "x"))
    row = r.destination("x")
    assert row.next_hop == "c" and row.rotation == ("a", "c")
    r.receive("b", add("x"))
    assert r.destination("x").rotation == ("a", "b", "c")
    assert r.destination("x").next_hop == "b"


def test_destinations_sorted_and_rows_follow_changes():
    r = RouteExchanger("r")
    r.link_up("m")
    r.link_up("b")
    r.add_static("z")
    assert [row.name for row in r.destinations()] == ["b", "m", "z"]
    first = r.destination("b")
    assert r.destination("b") is first  # cached while nothing changes
    r.receive("m", add("b"))
    assert r.destination("b").routes == (("b",), ("m", "b"))
    assert r.destination("nowhere") is None


# -- events ---------------------------------------------------------------------------------


def test_event_order_for_a_first_and_a_last_route():
    r = RouteExchanger("r")
    assert r.link_up("a").events == [
        DestinationAdded(router="a"),
        RouteAdded(router="a", path=("a",)),
        DestinationActivated(router="a"),
    ]
    assert r.receive("a", add("x")).events == [
        DestinationAdded(router="x"),
        RouteAdded(router="x", path=("a", "x")),
        DestinationActivated(router="x"),
    ]
    r.link_up("b")
    assert r.receive("b", add("x")).events == [RouteAdded(router="x", path=("b", "x"))]
    assert r.receive("a", remove("x")).events == [RouteRemoved(router="x", path=("a", "x"))]
    assert r.link_down("b").events == [
        RouteRemoved(router="x", path=("b", "x")),
        DestinationDeactivated(router="x"),
        DestinationRemoved(router="x"),
        RouteRemoved(router="b", path=("b",)),
        DestinationDeactivated(router="b"),
        DestinationRemoved(router="b"),
    ]


def test_link_down_withdraws_what_was_learned_over_it_where_it_was_announced():
    r = RouteExchanger("r", hop_limit=-1)
    r.link_up("a")
    r.link_up("b")
    r.link_up("c")
    r.receive("a", add("x"))
    r.receive("a", add("y", "z"))
    r.receive("b", add("x"))
    out = r.link_down("a")
    # longest first, the direct route last; not to a (gone); each only where it was announced
    assert out.sends == [
        ("b", remove("a", "y", "z")),
        ("c", remove("a", "y", "z")),
        ("b", remove("a", "x")),
        ("c", remove("a", "x")),
        ("b", remove("a")),
        ("c", remove("a")),
    ]
    assert r.destination("x").routes == (("b", "x"),)
    assert r.destination("z") is None and r.neighbours == ("b", "c")


# -- static routes --------------------------------------------------------------------------


def test_static_route_is_known_inactive_and_never_announced():
    r = RouteExchanger("r", hop_limit=-1)
    r.link_up("a")
    out = r.add_static("far")
    assert out == Output(sends=[], events=[DestinationAdded(router="far")])
    assert r.destination("far") == Destination(name="far", routes=(), static=True, next_hop=None, rotation=())
    assert r.link_up("b").sends == [("a", add("b")), ("b", add("a"))]  # "far" is not announced
    # a route arrives and goes: activation only, the destination stays known
    assert r.receive("a", add("far")).events == [
        RouteAdded(router="far", path=("a", "far")),
        DestinationActivated(router="far"),
    ]
    assert r.destination("far").next_hop == "a" and r.destination("far").static
    assert r.link_down("a").events == [
        RouteRemoved(router="far", path=("a", "far")),
        DestinationDeactivated(router="far"),  # far stays known
        RouteRemoved(router="a", path=("a",)),
        DestinationDeactivated(router="a"),
        DestinationRemoved(router="a"),
    ]
    assert r.destination("far").static and not r.destination("far").active
    assert r.remove_static("far").events == [DestinationRemoved(router="far")]
    assert r.destination("far") is None


def test_removing_a_static_route_keeps_a_destination_with_routes():
    r = RouteExchanger("r")
    r.link_up("a")
    assert r.add_static("a").events == []
    assert r.remove_static("a").events == []
    assert r.destination("a").routes == (("a",),) and not r.destination("a").static


# -- runtime changes ------------------------------------------------------------------------


def chain_router() -> RouteExchanger:
    """r between a and n; a told r of x (2 hops at r) and y (3 hops at r)."""
    r = RouteExchanger("r", hop_limit=-1)
    r.link_up("a")
    r.link_up("n")
    r.receive("a", add("x"))
    r.receive("a", add("x", "y"))
    assert r.announced_to("n") == {("a",), ("a", "x"), ("a", "x", "y")}
    return r


def test_set_hop_limit_sends_the_differences_only():
    r = chain_router()
    out = r.set_hop_limit(2)
    assert out.sends == [("n", remove("a", "x")), ("n", remove("a", "x", "y"))]
    assert r.set_hop_limit(2).sends == []
    out = r.set_hop_limit(3)
    assert out.sends == [("n", add("a", "x"))]
    assert r.set_hop_limit(-1).sends == [("n", add("a", "x", "y"))]
    assert r.hop_limit == -1 and out.events == []


def test_set_filters_sends_the_differences_to_the_neighbours_it_concerns():
    r = chain_router()
    out = r.set_filters({"n": F(INC_DEST, {"y"})})
    assert out.sends == [("n", remove("a")), ("n", remove("a", "x"))]
    out = r.set_filters({"n": F(EXC_HOP, {"b"}), "a": F(INC_DEST, {"nothing"})})
    assert out.sends == [("a", remove("n")), ("n", add("a")), ("n", add("a", "x"))]
    assert r.set_filters({"n": F(EXC_HOP, {"b"})}).sends == [("a", add("n"))]
    assert r.set_filters({"n": F(EXC_HOP, {"b"})}).sends == []
    assert r.filters == {"n": F(EXC_HOP, {"b"})}


# -- what a peer may send -------------------------------------------------------------------

BAD = [
    ("not an announcement", ("x",)),
    ("empty path", Announcement(add=True, destination="x", path=())),
    ("destination is not the end", Announcement(add=True, destination="y", path=("x",))),
    ("empty name", Announcement(add=True, destination="x", path=("", "x"))),
    ("non-str name", Announcement(add=True, destination="x", path=(3, "x"))),
    ("path not a sequence", Announcement(add=True, destination="x", path="x")),
    ("add not a bool", Announcement(add=1, destination="x", path=("x",))),
    ("a repeat", Announcement(add=True, destination="x", path=("x", "y", "x"))),
    ("the sender in its own path", Announcement(add=True, destination="x", path=("a", "x"))),
    ("the receiver in the path", Announcement(add=True, destination="x", path=("r", "x"))),
    ("the receiver as destination", Announcement(add=True, destination="r", path=("r",))),
    ("too long", Announcement(add=True, destination="h254", path=tuple(f"h{i}" for i in range(MAX_PATH)))),
    ("a bad remove", Announcement(add=False, destination="x", path=("x", "r"))),
]


@pytest.mark.parametrize("announcement", [case[1] for case in BAD], ids=[case[0] for case in BAD])
def test_a_bad_announcement_raises_and_changes_nothing(announcement):
    r = RouteExchanger("r")
    r.link_up("a")
    before = r.destinations()
    with pytest.raises(BadAnnouncement):
        r.receive("a", announcement)
    assert r.destinations() == before and r.announced_to("a") == frozenset()


def test_the_longest_route_allowed_is_stored():
    r = RouteExchanger("r", hop_limit=-1)
    r.link_up("a")
    path = tuple(f"h{i}" for i in range(MAX_PATH - 1))
    r.receive("a", add(*path))
    assert r.destination(path[-1]).routes == (("a", *path),)


def test_a_path_decoded_as_a_list_is_accepted_and_stored_as_a_tuple():
    r = RouteExchanger("r")
    r.link_up("a")
    r.receive("a", Announcement(add=True, destination="x", path=["x"]))
    assert r.destination("x").routes == (("a", "x"),)
    r.receive("a", Announcement(add=False, destination="x", path=["x"]))
    assert r.destination("x") is None


def test_repeated_add_and_unknown_remove_are_ignored():
    r = RouteExchanger("r")
    r.link_up("a")
    r.link_up("b")
    assert r.receive("a", add("x")).sends == [("b", add("a", "x"))]
    assert r.receive("a", add("x")) == Output()
    assert r.receive("a", remove("y")) == Output()
    assert r.receive("b", remove("x")) == Output()  # learned over a, not over b
    assert r.receive("a", remove("x")).sends == [("b", remove("a", "x"))]
    assert r.receive("a", remove("x")) == Output()


def test_local_errors():
    r = RouteExchanger("r")
    r.link_up("a")
    with pytest.raises(ValueError, match="up already"):
        r.link_up("a")
    with pytest.raises(ValueError, match="itself"):
        r.link_up("r")
    with pytest.raises(ValueError, match="not up"):
        r.link_down("b")
    with pytest.raises(ValueError, match="not up"):
        r.receive("b", add("x"))
    with pytest.raises(ValueError):
        r.link_up("")
    with pytest.raises(ValueError):
        r.set_hop_limit(-2)
    with pytest.raises(ValueError):
        RouteExchanger("r", hop_limit=True)
    with pytest.raises(TypeError):
        RouteExchanger("r", filters={"a": "include_by_hop"})
    with pytest.raises(TypeError):
        RouteFilter(INC_HOP, "abc")
    with pytest.raises(ValueError):
        RouteFilter("include_everything", {"a"})
    r.add_static("s")
    with pytest.raises(ValueError, match="exists already"):
        r.add_static("s")
    with pytest.raises(ValueError, match="no static route"):
        r.remove_static("t")
    with pytest.raises(ValueError, match="local"):
        r.add_static("r")
    with pytest.raises(ValueError, match="not a neighbour"):
        r.announced_to("zz")
    # a failed call left the exchanger as it was
    assert [row.name for row in r.destinations()] == ["a", "s"]


def test_logging_route_changes_and_decisions_at_debug_none_at_info(caplog):
    # One INFO line per route made a peer's thousands of routes megabytes of log; the
    # swiftlet sums them up per batch (routelog), the exchanger says each at DEBUG only.
    caplog.set_level(logging.DEBUG, logger="martinet.swiftlets.routing.exchange")
    r = RouteExchanger("r")
    r.link_up("lyon")
    r.link_up("nice")
    caplog.clear()
    r.receive("lyon", add("paris"))
    assert [(rec.levelname, rec.getMessage()) for rec in caplog.records] == [
        ("DEBUG", "route to paris via lyon (2 hops: lyon paris) added"),
        ("DEBUG", "do not announce lyon paris to lyon: its next hop"),
        ("DEBUG", "announce lyon paris to nice"),
    ]
    caplog.clear()
    r.link_down("lyon")
    assert [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("route")] == [
        "route to paris via lyon (2 hops: lyon paris) removed",
        "route to lyon via lyon (1 hop: lyon) removed",
    ]
    assert not [rec for rec in caplog.records if rec.levelno >= logging.INFO]


def test_a_route_longer_than_max_hops_is_not_stored_and_one_that_long_not_passed_on():
    r = RouteExchanger("r", max_hops=3, hop_limit=-1)
    r.link_up("lyon")
    r.link_up("nice")
    output = r.receive("lyon", Announcement(add=True, destination="c", path=("a", "b", "c")))
    assert output.refused == 1 and output.events == [] and output.sends == []
    assert r.destination("c") is None
    output = r.receive("lyon", Announcement(add=True, destination="b", path=("a", "b")))
    assert output.refused == 0 and r.destination("b").routes == (("lyon", "a", "b"),)
    assert ("lyon", "a", "b") not in r.announced_to("nice")  # 3 hops: 4 at nice
    assert r.set_max_hops(4).sends == [("nice", Announcement(add=True, destination="b", path=("lyon", "a", "b")))]


# -- whole networks ---------------------------------------------------------------------------


def check_settled(net: Network, limits: dict[str, int], filters: dict) -> None:
    """The quiet network against the reference: routes, shortest hops, what each link carried."""
    assert net.pending == 0
    expected = reference_routes(net.routers, net.links, limits, filters)
    for name in net.routers:
        assert net.routes(name) == expected[name], name
        rows = net.routers[name].destinations()
        assert {row.name: len(row.routes[0]) for row in rows if row.active} == shortest(expected[name])
        assert all(row.next_hop == row.routes[0][0] for row in rows if row.active)
    announced = reference_announced(expected, net.links, limits, filters)
    for (holder, receiver), paths in announced.items():
        assert net.routers[holder].announced_to(receiver) == paths, (holder, receiver)
        assert net.wire[holder, receiver] == paths
    net.check_events()
    for name, router in net.routers.items():  # quiet: re-evaluating finds nothing to send
        assert router.set_hop_limit(router.hop_limit) == Output(), name
        assert router.set_filters(router.filters) == Output(), name


def phase_cost(net: Network, limits: dict[str, int], filters: dict, event) -> None:
    """From a quiet network, one link event costs exactly the changes of the announced sets."""
    before = reference_announced(reference_routes(net.routers, net.links, limits, filters), net.links, limits, filters)
    sent = net.sent
    event()
    net.settle()
    after = reference_announced(reference_routes(net.routers, net.links, limits, filters), net.links, limits, filters)
    expected = sum(len(paths ^ before.get(pair, frozenset())) for pair, paths in after.items())
    assert net.sent - sent == expected
    check_settled(net, limits, filters)


@pytest.mark.parametrize(("shape", "limit"), [(ring, 3), (ring, -1), (mesh, 3), (mesh, 2)])
def test_ring_and_mesh_converge_fail_and_recover(shape, limit):
    names, links = shape(6)
    limits = dict.fromkeys(names, limit)
    net = Network(names, hop_limits=limit, rng=random.Random(7))

    def all_up():
        for a, b in links:
            net.link_up(a, b)

    phase_cost(net, limits, {}, all_up)
    assert net.removes == 0  # links only coming up: nothing is ever withdrawn
    a, b = links[2]
    phase_cost(net, limits, {}, lambda: net.link_down(a, b))
    phase_cost(net, limits, {}, lambda: net.link_up(a, b))


# -- Hypothesis: random networks, random failures, any delivery order ----------------------------


@st.composite
def route_filters(draw, names: list[str]) -> RouteFilter:
    return RouteFilter(draw(st.sampled_from(FilterType)), draw(st.frozensets(st.sampled_from(names), max_size=3)))


@st.composite
def networks(draw):
    """Routers, hop limits, filters, the links up at first, and what happens next."""
    count = draw(st.integers(2, 7))
    names = [f"r{i}" for i in range(count)]
    # unlimited hop limits only in small networks: dense graphs have factorially many simple paths
    choices = [-1, 1, 2, 3, 4] if count <= 5 else [1, 2, 3, 4]
    limits = {name: draw(st.sampled_from(choices)) for name in names}
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]

    def filters_of(name: str):
        others = [n for n in names if n != name]
        return st.one_of(st.just({}), st.dictionaries(st.sampled_from(others), route_filters(names), max_size=2))

    filters = {name: draw(filters_of(name)) for name in names}
    links = draw(st.lists(st.sampled_from(pairs), unique=True, min_size=1))
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("toggle"), st.sampled_from(pairs), st.sampled_from(["both", "first", "second"])),
                st.tuples(st.just("deliver"), st.integers(1, 12)),
                # failures and recoveries of the first links, both ends learning at once or one first
                st.tuples(st.just("toggle"), st.sampled_from(links), st.sampled_from(["both", "first", "second"])),
                st.tuples(st.just("limit"), st.sampled_from(names), st.sampled_from(choices)),
                st.tuples(
                    st.just("static"), st.permutations(names).map(lambda order: order[:2])
                ),  # toggled at order[0]
                st.sampled_from(names).flatmap(
                    lambda name: st.tuples(st.just("filters"), st.just(name), filters_of(name))
                ),
            ),
            max_size=25,
        )
    )
    return names, limits, filters, links, steps


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(networks(), st.randoms(use_true_random=False))
def test_random_networks_settle_on_the_reference(network, rng):
    names, limits, filters, links, steps = network
    limits, filters = dict(limits), dict(filters)
    net = Network(names, hop_limits=limits, filters=filters, rng=rng)
    statics = {name: set() for name in names}
    for a, b in links:
        net.link_up(a, b)
    for step in steps:
        match step:
            case ("toggle", (a, b), how):
                if net.pending:
                    event("a link changed with messages in flight")
                key = frozenset((a, b))
                if key in net.closing:
                    net.link_down(a, b)  # the other end learns
                elif key in net.links:
                    if how != "both":
                        event("a link closed at one end first")
                    net.link_down(*((b, a) if how == "second" else (a, b)), half=how != "both")
                else:
                    net.link_up(a, b)
            case ("deliver", count):
                net.deliver(count)
            case ("limit", name, limit):
                limits[name] = limit
                net.apply(name, net.routers[name].set_hop_limit(limit))
            case ("static", (name, far)):
                if far in statics[name]:
                    statics[name].remove(far)
                    net.apply(name, net.routers[name].remove_static(far))
                else:
                    statics[name].add(far)
                    net.apply(name, net.routers[name].add_static(far))
            case ("filters", name, new):
                filters[name] = new
                net.apply(name, net.routers[name].set_filters(new))
    for a, b in list(net.closing):
        net.link_down(a, b)
    net.settle()
    total = sum(len(net.routes(name)) for name in names)
    event(f"routes held at the end: {'0' if not total else '<10' if total < 10 else '<100' if total < 100 else '100+'}")
    event(f"withdrawals sent: {'yes' if net.removes else 'no'}")
    check_settled(net, limits, filters)
    for name, router in net.routers.items():
        assert {row.name for row in router.destinations() if row.static} == statics[name]
        assert {row.name for row in router.destinations()} == statics[name] | shortest(net.routes(name)).keys()
    if links:  # from quiet: one failure and its recovery cost exactly the differences
        a, b = rng.choice(links)
        if frozenset((a, b)) in net.links:
            phase_cost(net, limits, filters, lambda: net.link_down(a, b))
        phase_cost(net, limits, filters, lambda: net.link_up(a, b))


def test_a_neighbour_announcing_more_routes_than_allowed_breaks_the_protocol():
    exchanger = RouteExchanger("a", max_routes_per_link=3)
    exchanger.link_up("b")  # the direct route is the first of b's three
    for router in ("c", "d"):
        exchanger.receive("b", Announcement(True, router, (router,)))
    with pytest.raises(BadAnnouncement, match="b announced more than max-routes-per-link 3 routes"):
        exchanger.receive("b", Announcement(True, "e", ("e",)))
    assert exchanger.destination("e") is None
    exchanger.receive("b", Announcement(True, "c", ("c",)))  # one it has: still fine
