"""``sys$mgmt`` configuration: which groups may manage the router, and the bounds of watches."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from martinet.kernel import config_class, entity_list, prop

from .api import LOCAL_ADDRESSES, Role, parse_local_addresses


@config_class
@attrs.frozen(kw_only=True)
class AdminGroup:
    name: str = prop(
        description="A group of sys$authentication (as the router where a request entered the "
        "network authenticated its user)."
    )
    role: Role = prop(
        Role.READ_ONLY,
        choices=Role,
        description="read-only: get, describe, routers and watch; "
        "read-write: also set, add, remove, invoke, save, reboot and halt.",
    )


@config_class
@attrs.frozen(kw_only=True)
class MgmtConfig:
    groups: Mapping[str, AdminGroup] = entity_list(
        AdminGroup,
        item="group",
        default=[AdminGroup(name="admin", role=Role.READ_WRITE)],
        description="With authentication enabled, the groups whose users may manage this router; with it "
        "disabled, requests are answered only for clients connected from local-addresses.",
    )
    local_addresses: str = prop(
        LOCAL_ADDRESSES,
        check=parse_local_addresses,
        description="(Martinet) With authentication disabled, the addresses whose clients may manage this "
        "router (read-write): loopback addresses or networks (127.0.0.1, 127.0.0.0/8, ::1) separated by "
        "spaces, as the router where a request entered saw its client; empty: nobody. The default is every "
        "loopback address. Only loopback networks are accepted, so this narrows who may manage without "
        "logging in (e.g. to 127.0.0.1 when other 127.x addresses serve something else), never widens it.",
    )
    max_watches: int = prop(
        100,
        min=0,
        max=10_000,
        description="Watches (change subscriptions) served at once; beyond it a watch request is refused.",
    )
    max_watches_per_user: int = prop(
        10,
        min=1,
        max=10_000,
        description="Watches one user (as the router where its requests enter names it, with the address "
        "it connects from) may have at once, so that one client cannot take every watch.",
    )
    watch_lease: int = prop(
        60,
        min=1,
        max=86_400,
        description="Seconds a watch lives unless renewed (a watch "
        "request naming it): a watcher that went away without unwatching is forgotten.",
    )
    max_watch_backlog: int = prop(
        1000,
        min=1,
        max=100_000,
        description="Changes a watch may fall behind "
        "by; beyond it the watch ends with a notice (the watcher must read the tree "
        "again).",
    )
