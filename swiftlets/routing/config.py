"""``sys$routing`` configuration, after SwiftMQ's Routing Swiftlet.

Names, defaults and bounds are SwiftMQ's, so that its operators find them. Where SwiftMQ names a Java class
(``socketfactory-class``, ``crfactory-class``) we have settings instead: a listener does TLS
when it has ``tls-certificate``, a connector when ``use-tls`` is on; the challenge/response
is always HMAC-SHA256 (``docs/routing-protocol.md``) — nothing is ever instantiated by a
name from the config or the peer. Additions, each marked in its description: connector
``retry-policy`` (Qpid's exponential backoff) and the connector's TLS trust settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import attrs

from martinet.kernel import config_class, entity_list, prop
from martinet.swiftlets.queuemanager.api import QueueError, check_queue_name

from .exchange import FilterType
from .stages import valid_router_name


class RetryPolicy(StrEnum):
    FIXED = "fixed"
    EXPONENTIAL = "exponential"


@config_class
@attrs.frozen(kw_only=True)
class StaticRoute:
    name: str = prop(
        description="Name of the router this static route makes addressable before any "
        "route to it is learned (never announced to other routers)."
    )


@config_class
@attrs.frozen(kw_only=True)
class FilterRouter:
    name: str = prop(description="Name of this router to filter.")


@config_class
@attrs.frozen(kw_only=True)
class RouteFilter:
    name: str = prop(description="Name of the neighbour router whose announcements this filter applies to.")
    type: FilterType = prop(
        choices=FilterType,
        description="Filter type: announce to that neighbour only "
        "(include) or never (exclude) the routes whose next hop (by_hop: the router we "
        "learned the route from, and with it the subnet behind it) or whose destination "
        "(by_destination) is one of the routers listed.",
    )
    routers: Mapping[str, FilterRouter] = entity_list(FilterRouter, item="router", description="Routers to filter.")


@config_class
@attrs.frozen(kw_only=True)
class HostAccessEntry:
    name: str = prop(description="SQL-LIKE pattern of addresses allowed to connect (e.g. 10.1.%).")


@config_class
@attrs.frozen(kw_only=True)
class LinkConfig:
    """What listeners and connectors both configure about their links (SwiftMQ's shared
    attributes); "inbound" values are what this side accepts and announces to the sender."""

    inbound_transaction_size: int = prop(
        100,
        min=1,
        max=100_000,
        description="Number of messages per transaction this side accepts inbound (announced to the sending side, "
        "which sends what its queue holds up to it). The default goes beyond SwiftMQ's 20: a routed message then "
        "pays a hundredth of a transaction's frames, prepare and commit.",
    )
    inbound_window_size: int = prop(
        10,
        min=1,
        max=10_000,
        description="Number of transactions awaiting their prepare a sender to this side starts with (announced "
        "to it); its window then grows to the link's round trip, up to inbound-window-bytes.",
    )
    inbound_window_bytes: int = prop(
        8_388_608,
        min=65_536,
        max=1_073_741_824,
        description="Bytes of transactions awaiting their prepare this side accepts from one link (announced to "
        "the sending side, which sizes its window up to it); a transaction counts its messages plus 1024. The "
        "default carries 320 Mbit/s at a 200 ms round trip.",
    )
    router_input_buffer_size: int = prop(
        0,
        min=0,
        description="Router network input buffer size: the socket's receive buffer (SO_RCVBUF); 0: the kernel's "
        "own, which grows with the link (a fixed size turns that off and caps a link at size / round trip).",
    )
    router_input_extend_size: int = prop(
        65_536,
        min=65_536,
        description="Router network input extend size "
        "(SwiftMQ's buffer growth step; our buffers grow as needed, so it has "
        "no effect).",
    )
    router_output_buffer_size: int = prop(
        0,
        min=0,
        description="Router network output buffer size: the socket's send buffer (SO_SNDBUF); 0: the kernel's "
        "own, which grows with the link.",
    )
    router_output_extend_size: int = prop(
        65_536, min=65_536, description="Router network output extend size (no effect, as router-input-extend-size)."
    )
    use_compression: bool = prop(
        False,
        description="Uses wire-level compression if enabled: batches of "
        "messages travel zlib-compressed when both sides enable it.",
    )
    use_xa: bool = prop(
        True, description="Uses 2 phase commit protocol (XA) if enabled; XA is used when either side asks for it."
    )
    use_tcp_no_delay: bool = prop(True, description="Use TCP no delay (no Nagle).")


@config_class
@attrs.frozen(kw_only=True)
class ListenerConfig(LinkConfig):
    name: str = prop(description="Name of this listener.")
    bindaddress: str = prop("0.0.0.0", reboot_required=True, description="Listener bind IP address.")
    port: int = prop(
        4100,
        min=0,
        max=65535,
        reboot_required=True,
        description="Listener port; 0 takes any free port (shown under usage/listeners).",
    )
    password: str = prop(
        "",
        secret=True,
        description="Password both sides prove with HMAC-SHA256 "
        "challenge/response (never sent); empty: no authentication. Connectors to this "
        "listener must have the same one. Stored as written (the HMAC needs the secret itself).",
    )
    keepalive_interval: int = prop(
        60_000,
        min=0,
        description="Interval (ms) for sending keepalive messages "
        "on this listener's links, handed to the connector; a link with 5 intervals "
        "of silence is closed. 0: no keepalive.",
    )
    tls_certificate: str = prop(
        "",
        reboot_required=True,
        description="PEM certificate chain: with it the "
        "listener speaks TLS (SwiftMQ's JSSESocketFactory); empty: plain TCP.",
    )
    tls_key: str = prop("", reboot_required=True, description="PEM private key of tls-certificate.")
    host_access_list: Mapping[str, HostAccessEntry] = entity_list(
        HostAccessEntry,
        item="host-access-entry",
        description="Host access list: SQL-LIKE patterns of peer addresses allowed to connect; empty: any.",
    )


@config_class
@attrs.frozen(kw_only=True)
class ConnectorConfig(LinkConfig):
    name: str = prop(description="Name of this connector.")
    hostname: str = prop(description="Remote hostname (of the other router's routing listener).")
    port: int = prop(min=1, max=65535, description="Remote port.")
    enabled: bool = prop(
        True,
        description="Enables/disables this connector: a disabled connector closes "
        "its link and does not connect (the scheduler's Routing Connector job drives it).",
    )
    password: str = prop(
        "",
        secret=True,
        description="Password of the remote listener (see the listener's "
        "password); empty: the listener must not require one.",
    )
    retry_time: int = prop(
        60_000,
        min=1000,
        description="Retry time (ms) between connection attempts; with retry-policy exponential, the longest delay.",
    )
    retry_policy: RetryPolicy = prop(
        RetryPolicy.FIXED,
        choices=RetryPolicy,
        description="(Martinet) fixed: "
        "retry every retry-time (SwiftMQ); exponential: 2 s, doubling after each "
        "failed attempt up to retry-time (Qpid: 2 s to 64 s), back to 2 s after a "
        "link became operational.",
    )
    use_tls: bool = prop(False, description="(Martinet) Connect with TLS (the listener has a tls-certificate).")
    tls_ca: str = prop(
        "",
        description="(Martinet) PEM file of the certificates trusted to sign the "
        "listener's; empty: the system's trust store.",
    )
    tls_check_hostname: bool = prop(True, description="(Martinet) The listener's certificate must name hostname.")


@config_class
@attrs.frozen(kw_only=True)
class QueueBridgeConfig:
    """A queue bridge (Qpid's queue route): everything arriving in a local queue is moved to
    a queue of any router, with the transfer's guarantees (see docs/routing.md)."""

    name: str = prop(description="Name of this queue bridge.")
    source_queue: str = prop(
        description="Local queue whose messages are moved (created if missing; not a "
        "system queue, whose name has a '$')."
    )
    destination: str = prop(
        description="Where they go: queue@router (router may be this one, or any router "
        "known by a route or a static route; while it is not known they wait in the source)."
    )
    enabled: bool = prop(True, description="Enables/disables this bridge: disabled, messages stay in the source queue.")
    transaction_size: int = prop(
        100,
        min=1,
        max=10_000,
        description="Most messages moved in one local transaction (acknowledged from the source and sent on together).",
    )

    # (errors from these checks come with the file and line, and name the attribute themselves)
    @source_queue.validator
    def _check_source(self, _attribute: Any, value: str) -> None:
        _check_queue("source-queue", value)
        if "$" in value:
            raise ValueError(
                f"source-queue: {value!r} is a system queue (its name has a '$'): it is the router's to consume"
            )

    @destination.validator
    def _check_destination(self, _attribute: Any, value: str) -> None:
        queue, at, router = value.rpartition("@")
        if not at:
            raise ValueError(f"destination: expected queue@router, found {value!r}")
        _check_queue("destination", queue)
        if not valid_router_name(router):
            raise ValueError(
                f"destination: invalid router name {router!r} in {value!r}: letters, digits, '_' "
                "and '-', starting with a letter"
            )


def _check_queue(attribute: str, name: str) -> None:
    try:
        check_queue_name(name)
    except QueueError as exc:
        raise ValueError(f"{attribute}: {exc}") from None


@config_class
@attrs.frozen(kw_only=True)
class RoutingConfig:
    reject_disconnect_delay: int = prop(
        5000,
        min=1000,
        description="Time (ms) after which a rejected connection is closed (so that the peer reads the reason first).",
    )
    stage_valid_timeout: int = prop(
        15_000,
        min=1000,
        description="Time (ms) after which a protocol stage in a wait state becomes invalid (the link is closed).",
    )
    roundrobin_enabled: bool = prop(
        False,
        reboot_required=True,
        description="Enables/disables round robin scheduling over every link with a route (else the shortest route).",
    )
    inbound_flow_control_enabled: bool = prop(
        False,
        reboot_required=True,
        description="Enables/disables "
        "inbound flow control: an inbound transaction is answered only "
        "after the largest flow-control delay of its target queues, so a "
        "slow consumer here slows the sending router's producers.",
    )
    max_routes_per_link: int = prop(
        10_000,
        min=1,
        description="(Martinet) Most routes one neighbour may "
        "announce; a link whose peer announces more is closed with that reason (one "
        "peer cannot fill every router's table).",
    )
    unknown_router_grace: int = prop(
        60_000,
        min=-1,
        max=86_400_000,
        description="(Martinet) Milliseconds an empty routing queue rt$R stays after router R became "
        "unknown (its last route gone, no static route); then it is deleted with its dispatcher, so "
        "that destinations a peer announced and withdrew leave nothing behind. A queue holding messages "
        "stays; R coming back makes it anew. A minute rides out a link flap or a neighbour's restart "
        "without churn. -1: kept for ever.",
    )
    route_log: str = prop(
        "batch",
        choices=("batch", "each"),
        description="(Martinet) batch: route changes are logged one INFO line per batch, with counts "
        "per neighbour (a peer's thousands of routes do not flood the log; each route at DEBUG); "
        "each: also one INFO line per route added or removed, which tools replay to follow a "
        "router's table (the test and bench harnesses). Keep batch where peers are not trusted.",
    )
    max_route_hops: int = prop(
        16,
        min=1,
        max=64,
        description="(Martinet) Longest route (hops, the path's routers) stored; an announced "
        "route longer than this is ignored and counted (routes-refused), the link stays, and a "
        "route this long is not passed on. Why 16: with route-announce-hop-limit at its "
        "default 3 no correct router sends more than 3; with it raised, routes are simple "
        "paths, so no longer than the routers on them less one, and a message crosses a route "
        "with a store and a two-phase commit per hop, so a route of more than 16 is one no "
        "network would choose; a peer's 64-hop paths cost every change 64 times the work. "
        "64 (the transfer's loop guard) is the most.",
    )
    route_announce_hop_limit: int = prop(
        3,
        min=-1,
        description="Maximum hop count for route announce "
        "(-1 = unlimited, as is 0): a route of this many hops or more is not "
        "passed on.",
    )
    static_routes: Mapping[str, StaticRoute] = entity_list(
        StaticRoute, item="static-route", description="Static route definitions."
    )
    filters: Mapping[str, RouteFilter] = entity_list(
        RouteFilter, item="filter", description="Route filter definitions."
    )
    listeners: Mapping[str, ListenerConfig] = entity_list(
        ListenerConfig, item="listener", description="Listener definitions."
    )
    connectors: Mapping[str, ConnectorConfig] = entity_list(
        ConnectorConfig, item="connector", description="Connector definitions."
    )
    queue_bridges: Mapping[str, QueueBridgeConfig] = entity_list(
        QueueBridgeConfig,
        item="queue-bridge",
        description="(Martinet) Queue bridge definitions: local "
        "queues whose messages are moved to a queue of another router.",
    )
