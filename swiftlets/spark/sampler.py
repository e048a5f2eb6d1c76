"""Turning a router's management tree and bus events into rows: generic, pure, synchronous.

The sampler walks every swiftlet's ``usage`` part (and the router's own ``/usage``) the
same way, whatever the swiftlet: each usage entity's properties become one row each, so a
counter a swiftlet adds tomorrow is exported without a change here. Entries of usage lists
that appear or go between two samples become ``UsageAdded``/``UsageRemoved`` events (an
in-doubt transaction of ``sys$xa``, a connection, a queue). Bus events become event rows
with their fields as JSON; the swiftlet of an event is derived from the module that defines
its class (``martinet.swiftlets.routing.api`` → ``sys$routing``).

Runs in the router's trio thread (the tree is not thread-safe); a sample of 1,000 queues
(about 20,000 values) takes some milliseconds.
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
            verdict = any(p.fullmatch(name) for p in self._include) and not any(
                p.fullmatch(name) for p in self._exclude)
            if len(self._cache) < 100_000:
                self._cache[name] = verdict
        return verdict


def _usage_roots(tree: Tree) -> Iterator[tuple[str, Usage]]:
    for name, node in tree.root.children.items():
        if isinstance(node, Usage):
            yield ROUTER_SWIFTLET, node
        elif isinstance(node, Entity) and isinstance(node.children.get("usage"), Usage):
            yield name, node.children["usage"]


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
    usage-list entries between samples."""

    def __init__(self, tree: Tree, swiftlets: Filter, entities: Filter):
        self.tree = tree
        self.swiftlets = swiftlets
        self.entities = entities
        self._entries: set[tuple[str, str]] | None = None  # (swiftlet, entity) of the last sample

    def sample(self) -> tuple[list[tuple], list[tuple[str, str, str]]]:
        """The rows now, and the usage entries that appeared or went since the last sample as
        ``(kind, swiftlet, entity)`` (none on the first sample)."""
        rows: list[tuple] = []
        entries: set[tuple[str, str]] = set()
        for swiftlet, usage in _usage_roots(self.tree):
            if not self.swiftlets(swiftlet):
                continue
            for entity, node in _walk(usage, ""):
                if not self.entities(entity):
                    continue
                entries.add((swiftlet, entity))
                for metric, value in node.properties().items():
                    kind = type(value)  # exact types: the hot loop of a sample (20,000 values at 1,000 queues)
                    if kind is int or kind is float or kind is bool:
                        rows.append((swiftlet, entity, metric, float(value), None))
                    elif kind is str:
                        rows.append((swiftlet, entity, metric, None, value[:1000]))
        changes: list[tuple[str, str, str]] = []
        if self._entries is not None:
            changes = [("UsageAdded", *key) for key in sorted(entries - self._entries)]
            changes += [("UsageRemoved", *key) for key in sorted(self._entries - entries)]
        self._entries = entries
        return rows, changes


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
    swiftlet = f"sys${found.group(1)}" if found else module.split(".")[1] if module.startswith("martinet.") \
        else module.split(".")[0]
    fields = {field.name: _plain(getattr(event, field.name)) for field in attrs.fields(type(event))}
    entity = next((str(v) for v in fields.values()), "")
    return swiftlet, type(event).__name__, entity, json.dumps(fields, separators=(",", ":"))
