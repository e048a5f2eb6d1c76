"""The verbs of ``sys$mgmt`` on the router's management tree (:mod:`kernel.mgmt`): ``get`` and
``describe`` read a node, ``set``, ``add``, ``remove`` and ``invoke`` change the router, each
change logged with who made it and the old and new value. The tree's vetoes and validation
errors (:class:`~martinet.kernel.ManagementError`) reach the requester as status 400 with
their reason; a change that would drop messages needs ``force`` (:func:`.requests.confirm`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from martinet.kernel.mgmt import Entity, EntityList, Node, Tree, Usage, UsageList
from martinet.kernel.schema import Prop, fields_of, xml_name

from .api import AUDIT_LOGGER, Identity
from .requests import confirm, plain, request_mapping, request_path, request_scalar, request_text

__all__ = ["TreeVerbs", "describe_node", "explain"]

audit = logging.getLogger(AUDIT_LOGGER)


def _kind(node: Node) -> str:
    return {Entity: "entity", EntityList: "entity-list", Usage: "usage", UsageList: "usage-list"}[type(node)]


def describe_node(node: Node) -> dict[str, Any]:
    """``get``'s result: the node's kind and path, and its properties, children and
    operations (an entity or usage entity) or its entries with their properties (a list)."""
    result: dict[str, Any] = {"kind": _kind(node), "path": node.path}
    if isinstance(node, (Entity, Usage)):
        result["properties"] = plain(node.properties())
        result["children"] = {name: _kind(child) for name, child in node.children.items()}
        if isinstance(node, Usage):
            result["operations"] = sorted(node.operations)
    else:
        entries = node.entities if isinstance(node, EntityList) else node.children
        result["entries"] = {name: plain(entry.properties()) for name, entry in entries.items()}
    return result


def declarations(config_type: type) -> dict[str, Any]:
    """The properties a config class declares, as data: description, type, default, bounds,
    choices and flags, by XML name."""
    found = {}
    for field, meta in fields_of(config_type):
        if not isinstance(meta, Prop):  # a child entity or list
            continue
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
        entry: dict[str, Any] = {
            "description": meta.description,
            "type": kind,
            "read-only": meta.read_only,
            "reboot-required": meta.reboot_required,
        }
        # attrs' stubs declare Factory a function (it is a class), hence the ignore
        if field.default is not attrs.NOTHING and not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            entry["default"] = plain(field.default) if not meta.secret else "***"
        for bound in ("min", "max", "choices"):
            if getattr(meta, bound) is not None:
                entry[bound] = plain(getattr(meta, bound))
        found[xml_name(field.name)] = entry
    return found


def explain(node: Node) -> dict[str, Any]:
    """``describe``'s result: the property declarations of an entity (of an entity list's
    items, for ``add``) or the operations of a usage entity."""
    result: dict[str, Any] = {"kind": _kind(node), "path": node.path}
    if isinstance(node, Entity):
        result["properties"] = declarations(node.config_type)
    elif isinstance(node, EntityList):
        result["item"] = declarations(node.meta.item_type)
        result["description"] = node.meta.description
    elif isinstance(node, Usage):
        result["operations"] = [op.describe() for op in node.operations.values()]
    return result


class TreeVerbs:
    """The tree verbs, each ``verb(request, identity, …)`` -> its result (plain data)."""

    def __init__(self, tree: Tree):
        self.tree = tree

    async def get(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        return describe_node(self.tree.resolve(request_path(request)))

    async def describe(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        return explain(self.tree.resolve(request_path(request)))

    async def set(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, name = request_text(request, "path"), request_text(request, "name")
        value = request_scalar(request.get("value"), "argument 'value'")
        entity = self.tree.entity(path)
        old = entity.get(name)
        change = entity.set(name, value)
        new = entity.get(name)
        audit.info(
            "management: %s set %s %s: %r -> %r%s",
            identity,
            path,
            name,
            old,
            new,
            " (takes effect at the next start)" if change.reboot_required else "",
        )
        return {"path": path, "name": name, "old": old, "new": new, "reboot-required": change.reboot_required}

    async def add(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, name = request_text(request, "path"), request_text(request, "name")
        values = {
            key: request_scalar(value, f"value of {key!r}") for key, value in request_mapping(request, "values").items()
        }
        entity = self.tree.add(path, name, values)
        audit.info("management: %s added %s/%s: %s", identity, path.rstrip("/"), name, plain(entity.properties()))
        return describe_node(entity)

    async def remove(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, name = request_text(request, "path"), request_text(request, "name")
        tree = self.tree
        entries = tree.entity_list(path)
        old = entries.entities.get(name)
        lost = entries.destroys(name)
        confirm(request, f"removing {path.rstrip('/')}/{name} drops the {lost} message(s) it holds", lost)
        tree.remove(path, name)
        audit.info(
            "management: %s removed %s/%s (was %s)",
            identity,
            path.rstrip("/"),
            name,
            plain(old.properties()) if old is not None else {},
        )
        return {"path": path, "name": name}

    async def invoke(self, request: Mapping[str, Any], identity: Identity, *_: Any) -> Any:
        path, operation = request_text(request, "path"), request_text(request, "operation")
        args = {
            key: request_scalar(value, f"argument {key!r}") for key, value in request_mapping(request, "args").items()
        }
        offered = self.tree.operations(path).get(operation)
        if offered is not None and offered.destroys is not None:
            lost = offered.destroys()
            confirm(request, f"{operation} of {path} drops {lost} message(s)", lost)
        result = await self.tree.invoke(path, operation, **args)
        audit.info("management: %s invoked %s %s %s: %s", identity, path, operation, args, str(result)[:200])
        return result
