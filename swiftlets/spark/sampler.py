"""Turning a router's management tree and bus events into rows: generic, pure, synchronous.

The sampler walks every swiftlet's ``usage`` part (and the router's own ``/usage``) the
same way, whatever the swiftlet: each usage entity's properties become one row each, so a
counter a swiftlet adds tomorrow is exported without a change here. Entries of usage lists
that appear or go between two samples become ``UsageAdded``/``UsageRemoved`` events (an
in-doubt transaction of ``sys$xa``, a connection, a queue). Bus events become event rows
with their fields as JSON; the swiftlet of an event is derived from the module that defines
its class (``martinet.swiftlets.routing.api`` → ``sys$routing``).

To keep the export cheap, a sample holds only the numbers that changed since the previous
sample, plus every text; every ``full-sample-interval``-th sample holds every value, so that a
reader can rebuild the whole state from the last full sample and the changes after it.

Runs in the router's trio thread (the tree is not thread-safe); a sample of 1,000 idle queues
(about 20,000 values) takes a few milliseconds, most of it in the swiftlets' usage callables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import attrs

from martinet.kernel import Entity, Tree, Usage, UsageList
from martinet.messaging.like import like_pattern

__all__ = ["Filter", "Sampler", "event_row_parts"]

ROUTER_SWIFTLET = "router"  # the swiftlet name of the router's own /usage


class Filter:
    """Include/exclude LIKE predicates (separated by spaces) on one name."""

    def __init__(self, include: str, exclude: str):
        self._include = [like_pattern(p) for p in include.split()]
        self._exclude = [like_pattern(p) for p in exclude.split()]
        self._cache: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        verdict = self._cache.get(name)
        if verdict is None:
            verdict = any(p.matches(name) for p in self._include) and not any(p.matches(name) for p in self._exclude)
            if len(self._cache) < 100_000:
                self._cache[name] = verdict
        return verdict


def _usage_roots(tree: Tree) -> Iterator[tuple[str, Usage]]:
    for name, node in tree.root.children.items():
        if isinstance(node, Usage):
            yield ROUTER_SWIFTLET, node
        elif isinstance(node, Entity):
            usage = node.children.get("usage")
            if isinstance(usage, Usage):
                yield name, usage


def _walk(node: Usage, prefix: str) -> Iterator[tuple[str, Usage]]:
    yield prefix, node
    for name, child in list(node.children.items()):
        path = f"{prefix}/{name}" if prefix else name
        if isinstance(child, Usage):
            yield from _walk(child, path)
        elif isinstance(child, UsageList):
            for entry_name, entry in list(child.children.items()):
                yield from _walk(entry, f"{path}/{entry_name}")


class Sampler:
    """Samples a tree into row parts ``(swiftlet, entity, metric, value, text)`` and tracks
    usage-list entries between samples.

    Every ``full_every``-th sample (the first one included) is full: every value. In between, a
    sample holds the numbers that changed since the previous sample (a new entity's all) and
    every text (states, names: few, and readers count samples of a state). An entity's values
    are compared as a whole first (one dict comparison, in C): most are idle."""

    def __init__(self, tree: Tree, swiftlets: Filter, entities: Filter, full_every: int = 1):
        self.tree = tree
        self.swiftlets = swiftlets
        self.entities = entities
        self.full_every = full_every
        self._taken = 0
        # (swiftlet, entity) -> (its values, its text rows) at the last sample; None before the first
        self._last: dict[tuple[str, str], tuple[dict[str, Any], list[tuple]]] | None = None

    def sample(self) -> tuple[list[tuple], list[tuple[str, str, str]]]:
        """The rows now (all of them or the changes, see the class), and the usage entries that
        appeared or went since the last sample as ``(kind, swiftlet, entity)`` (none on the first
        sample)."""
        full = self._taken % self.full_every == 0
        self._taken += 1
        last = self._last or {}
        rows: list[tuple] = []
        now: dict[tuple[str, str], tuple[dict[str, Any], list[tuple]]] = {}
        for swiftlet, usage in _usage_roots(self.tree):
            if not self.swiftlets(swiftlet):
                continue
            for entity, node in _walk(usage, ""):
                if not self.entities(entity):
                    continue
                key = (swiftlet, entity)
                values = node.properties()
                before = last.get(key)
                if before is not None and before[0] == values:  # unchanged: its texts, or all if full
                    now[key] = before
                    if not full:
                        rows.extend(before[1])
                        continue
                previous = {} if full or before is None else before[0]
                texts: list[tuple] = []
                for metric, value in values.items():
                    kind = type(value)  # exact types: the hot loop of a sample (20,000 values at 1,000 queues)
                    if kind is str:
                        texts.append((swiftlet, entity, metric, None, value[:1000]))
                    elif (kind is int or kind is float or kind is bool) and previous.get(metric, _NONE) != value:
                        rows.append((swiftlet, entity, metric, float(value), None))
                rows.extend(texts)
                now[key] = (values, texts)
        changes: list[tuple[str, str, str]] = []
        if self._last is not None:
            changes = [("UsageAdded", *key) for key in sorted(now.keys() - last.keys())]
            changes += [("UsageRemoved", *key) for key in sorted(last.keys() - now.keys())]
        self._last = now
        return rows, changes


_NONE = object()  # no value before: a number is new


_SWIFTLET_MODULE = re.compile(r"martinet\.swiftlets\.(\w+)\b")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (tuple, list, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return _plain(value.value) if hasattr(value, "value") else str(value)  # enums by value


def event_row_parts(event: Any) -> tuple[str, str, str, str]:
    """``(swiftlet, kind, entity, fields)`` of a bus event (an attrs class)."""
    module = type(event).__module__
    found = _SWIFTLET_MODULE.match(module)
    swiftlet = (
        f"sys${found.group(1)}"
        if found
        else module.split(".")[1]
        if module.startswith("martinet.")
        else module.split(".")[0]
    )
    fields = {field.name: _plain(getattr(event, field.name)) for field in attrs.fields(type(event))}
    entity = next((str(v) for v in fields.values()), "")
    return swiftlet, type(event).__name__, entity, json.dumps(fields, separators=(",", ":"))
