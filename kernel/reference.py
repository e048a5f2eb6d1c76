"""The configuration reference, generated from the config classes' own declarations.

Every attribute a router's XML file may hold is declared once, with its default, bounds,
choices and description (:mod:`kernel.schema`); this module writes those declarations out
as a Markdown page, so the reference cannot disagree with the code that reads the file. A
test compares the committed page with a fresh one: a declaration changed without the page
regenerated fails it.

    .venv/bin/python -m martinet.kernel.reference docs/configuration.md

The page lists the ``<router>`` element's attributes, then each installed swiftlet (by
name) with its attributes, its fixed child elements and its lists (``<listeners><listener
name="…"/></listeners>``, one table per item element, nested as deep as they go) and the
pools it declares. An attribute whose change applies only after a restart says so.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import attrs

from .config import RouterSettings
from .plugins import SwiftletSpec, load_swiftlet_specs
from .pools import PoolConfig
from .schema import Child, ListOf, Prop, fields_of, format_value, is_enum, xml_name

__all__ = ["builtin_specs", "config_reference", "main"]

HEADER = """# Configuration reference

Generated from the config classes' declarations by `python -m martinet.kernel.reference
docs/configuration.md`; do not edit by hand (a test fails when this page and the code
disagree). Every attribute is an XML attribute of the element named in its section's
heading; a list is a container element of item elements, each with a `name` attribute.
"Restart" marks an attribute whose change through management applies at the next start.
"""


def _kind(kind: Any, meta: Prop) -> str:
    if is_enum(kind) or meta.choices:
        return "one of " + ", ".join(f"`{choice}`" for choice in meta.choices or ())
    return {bool: "boolean", int: "integer", float: "number", str: "text"}.get(kind, getattr(kind, "__name__", "?"))


def _bounds(meta: Prop) -> str:
    if meta.min is not None and meta.max is not None:
        return f"{format_value(meta.min)} to {format_value(meta.max)}"
    if meta.min is not None:
        return f"at least {format_value(meta.min)}"
    if meta.max is not None:
        return f"at most {format_value(meta.max)}"
    return ""


def _default(field: attrs.Attribute[Any]) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "(required)"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return ""
    text = format_value(default)
    return f"`{text}`" if text else '`""`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(cls: type, *, item: bool) -> list[str]:
    # a list item's name is its key (the heading says so), not one of its settings
    rows = [
        (field, meta)
        for field, meta in fields_of(cls)
        if isinstance(meta, Prop) and not (item and field.name == "name")
    ]
    if not rows:
        return []
    lines = ["| attribute | value | default | description |", "|---|---|---|---|"]
    for field, meta in rows:
        value = ", ".join(part for part in (_kind(field.type, meta), _bounds(meta)) if part)
        notes = (
            meta.description + (" Restart." if meta.reboot_required else "") + (" Read-only." if meta.read_only else "")
        )
        lines.append(f"| `{xml_name(field.name)}` | {_cell(value)} | {_default(field)} | {_cell(notes)} |")
    return lines


def _element(cls: type, path: str, level: int, *, item: bool = False) -> Iterator[str]:
    """``cls``'s attributes, then each child element and list below ``path``."""
    table = _table(cls, item=item)
    if table:
        yield ""
        yield from table
    for field, meta in fields_of(cls):
        if isinstance(meta, Child):
            child = f"{path}/{xml_name(field.name)}"
            yield ""
            yield f"{'#' * level} `{child}`"
            yield ""
            yield meta.description
            yield from _element(cast(type, field.type), child, min(level + 1, 6))
        elif isinstance(meta, ListOf):
            container = xml_name(field.name)
            item_path = f"{path}/{container}/{meta.item_tag}"
            yield ""
            yield f"{'#' * level} `{item_path}`"
            yield ""
            yield f'{meta.description} (a list: `<{container}><{meta.item_tag} name="…"/></{container}>`)'
            yield from _element(meta.item_type, item_path, min(level + 1, 6), item=True)


def _swiftlet(spec: SwiftletSpec) -> Iterator[str]:
    yield ""
    yield f"## `{spec.name}`"
    yield ""
    yield spec.description
    yield from _element(spec.config, spec.name, 3)
    if spec.pools:
        yield ""
        yield 'Pools (`<pools><pool name="…"/></pools>`; their attributes below):'
        yield ""
        yield "| pool | max-concurrency | queue-size | what runs there |"
        yield "|---|---|---|---|"
        for pool in spec.pools:
            yield f"| `{pool.name}` | {pool.max_concurrency} | {pool.queue_size} | {_cell(pool.description)} |"


def builtin_specs() -> dict[str, SwiftletSpec]:
    """The swiftlets that ship with Martinet (a third-party plugin installed beside them
    documents itself)."""
    return {
        name: spec for name, spec in load_swiftlet_specs().items() if spec.config.__module__.startswith("martinet.")
    }


def config_reference(specs: Mapping[str, SwiftletSpec]) -> str:
    """The reference page for the swiftlets ``specs``."""
    lines = [HEADER.rstrip("\n"), "", "## `<router>`"]
    lines += _element(RouterSettings, "router", 3)
    lines += ["", "## `<pool>`", "", "A pool of a swiftlet, in its `<pools>` list."]
    lines += _element(PoolConfig, "pool", 3, item=True)
    for name in sorted(specs):
        lines += _swiftlet(specs[name])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m martinet.kernel.reference OUTPUT.md", file=sys.stderr)
        return 2
    Path(args[0]).write_text(config_reference(builtin_specs()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
