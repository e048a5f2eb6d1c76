"""``/metrics``: every usage value of the management tree as Prometheus metrics.

Theory of operation
-------------------
:class:`UsageCollector` is a ``prometheus_client`` custom collector: at each scrape it walks
the router's management tree (the router's ``/usage`` and every swiftlet's ``usage``) and
turns each usage value into a sample; ``prometheus_client``'s exposition writes the text.
Nothing is registered globally: the swiftlet has its own ``CollectorRegistry``, so several
routers in one process each serve their own.

Threads. :meth:`UsageCollector.snapshot` reads the usage values (in the router's thread,
where the tree lives: a few ms for a thousand queues); :meth:`Snapshot.collect` makes the
metric families of that plain data, and the exposition the text, in a worker thread.

Names. A value ``messages`` of ``/sys$queuemanager/usage/queues/orders`` becomes
``martinet_queuemanager_queues_messages{router="paris",queue="orders"}``: ``martinet_``, the
swiftlet's name without ``sys$``, the usage lists on the way, the property, with every
character outside ``[a-zA-Z0-9_]`` as ``_``. Each list's entry name is a label named after
the list (:data:`LABELS`, else the list name without a plural ``s``; ``_`` appended while
that label is taken by an outer list). The kernel's pool lists
are one family for all swiftlets: ``martinet_pool_running{swiftlet="sys$routing",pool=…}``;
the router's own ``/usage`` is ``martinet_router_…``.

Values. Numbers are samples; booleans are 0/1. A text value named ``state`` becomes a
sample of value 1 with the state as label ``state`` (``martinet_routing_connections_state
{connection="connector:paris",state="operational"} 1``), so link, swiftlet and listener
states can be graphed and alerted on. Other texts are left out. Properties known to only
grow while the router runs (:data:`COUNTERS`) are counters (exposed with ``_total``); every
other value is a gauge.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import attrs
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from martinet.kernel import Entity, Tree, Usage, UsageList

__all__ = ["UsageCollector", "Snapshot", "COUNTERS", "LABELS"]

#: Usage properties that only grow while the router runs.
COUNTERS = frozenset(
    {
        "enqueued",
        "dequeued",
        "expired",
        "dead-lettered",
        "duplicates-dropped",
        "swapped-out",
        "read-back",
        "reads",
        "messages-received",
        "messages-sent",
        "transactions",
        "fsyncs",
        "operations",
        "cancelled-pairs",
        "completed",
        "failed",
        "rejected",
        "accepted",
        "refused",
        "attempts",
        "committed",
        "rolled-back",
        "announcements-sent",
        "announcements-received",
        "routes-sent",
        "routes-received",
        "unroutable",
        "dropped",
        "expired-in-transit",
        "runs",
        "logins",
        "refused-logins",
        "access-denials",
        "memory-alarms",
        "memory-waits",
        "memory-refused",
    }
)

#: Label names of usage lists whose plural is not simply the name with an ``s``.
LABELS = {
    "routing-table": "destination",
    "dynamic-routes": "route",
    "in-doubt": "xid",
    "swiftlets": "swiftlet",
    "remote-router-subscriptions": "router_name",
    "durable-subscribers": "durable_subscriber",
}

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _name(*parts: str) -> str:
    return _INVALID.sub("_", "_".join(parts))


def _label(list_name: str) -> str:
    label = LABELS.get(list_name) or (list_name[:-1] if list_name.endswith("s") else list_name)
    return "list_router" if label == "router" else _INVALID.sub("_", label)


class UsageCollector(Collector):
    """Collects a router's usage tree; see the module header. Call :meth:`snapshot` (or
    :meth:`collect`) in the router's trio thread, at each scrape: the tree is not
    thread-safe. The :class:`Snapshot` is plain data, which the exposition may turn into
    text in another thread."""

    def __init__(self, router: str, tree: Tree):
        self._router = router
        self._tree = tree
        self._names: dict[tuple[tuple[str, ...], str], str] = {}  # bounded: prefixes hold no entry names

    def snapshot(self) -> Snapshot:
        """Every usage entity's values now, with its metric name prefix and labels."""
        return Snapshot([(prefix, labels, usage.properties()) for prefix, labels, usage in self._usages()], self._names)

    def collect(self) -> Iterator[Metric]:
        return self.snapshot().collect()

    def _usages(self) -> Iterator[tuple[tuple[str, ...], dict[str, str], Usage]]:
        """Every usage entity with its metric name prefix and its labels."""
        root = self._tree.root
        router_usage = root.children["usage"]
        assert isinstance(router_usage, Usage)  # the kernel put it there
        yield from self._walk(("router",), {"router": self._router}, router_usage)
        for name, child in root.children.items():
            if not isinstance(child, Entity):
                continue
            swiftlet = name.removeprefix("sys$")
            usage = child.children["usage"]
            assert isinstance(usage, Usage)  # the kernel put it there
            for node_name, node in usage.children.items():
                if node_name == "pools" and isinstance(node, UsageList):  # the kernel's: one family for all
                    for pool, entry in node.children.items():
                        yield ("pool",), {"router": self._router, "swiftlet": name, "pool": pool}, entry
            yield from self._walk((swiftlet,), {"router": self._router}, usage, skip="pools")

    def _walk(
        self, prefix: tuple[str, ...], labels: dict[str, str], usage: Usage, skip: str = ""
    ) -> Iterator[tuple[tuple[str, ...], dict[str, str], Usage]]:
        yield prefix, labels, usage
        for name, node in usage.children.items():
            if name == skip:
                continue
            if isinstance(node, UsageList):
                label = _label(name)
                while label in labels:  # a list nested in a list of the same name
                    label += "_"
                for entry_name, entry in node.children.items():
                    yield from self._walk((*prefix, name), {**labels, label: entry_name}, entry)
            else:
                yield from self._walk((*prefix, name), labels, node)


@attrs.frozen
class Snapshot(Collector):
    """Usage values read at one scrape; :meth:`collect` makes the metric families of them
    (in any thread: it touches no router state)."""

    entries: list[tuple[tuple[str, ...], dict[str, str], dict[str, Any]]]
    names: dict[tuple[tuple[str, ...], str], str]  # the collector's cache of metric names

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for prefix, labels, properties in self.entries:
            names, values = tuple(labels), list(labels.values())
            for prop, value in properties.items():
                if isinstance(value, bool):
                    value = int(value)
                elif prop == "state" and isinstance(value, str) and value:
                    self._add(families, prefix, prop, (*names, "state"), [*values, value], 1)
                    continue
                if isinstance(value, int | float):
                    self._add(families, prefix, prop, names, values, value)
        yield from families.values()

    def _add(
        self,
        families: dict[str, CounterMetricFamily | GaugeMetricFamily],
        prefix: tuple[str, ...],
        prop: str,
        names: tuple[str, ...],
        values: list[str],
        value: float,
    ) -> None:
        name = self.names.get((prefix, prop))
        if name is None:  # (a concurrent scrape may store the same name: harmless)
            name = self.names[prefix, prop] = _name("martinet", *prefix, prop)
        family = families.get(name)
        if family is None:
            kind = CounterMetricFamily if prop in COUNTERS else GaugeMetricFamily
            family = families[name] = kind(name, f"usage {prop} of {'/'.join(prefix)}", labels=names)
        if names == family._labelnames:  # one family, one label set: a stray entry is left out
            family.add_metric(values, value)
