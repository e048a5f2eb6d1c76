"""Declaring configuration: frozen attrs classes whose fields carry their own metadata.

Theory of operation
-------------------
Every swiftlet declares its configuration as classes decorated with :func:`config_class`
(frozen, keyword-only attrs classes). Each field is declared with one of three helpers, and
the helper's metadata is all that the rest of the kernel needs to read, check, manage and
save that field:

- :func:`prop` — a scalar property (``int``, ``float``, ``str`` or ``bool``) with its default,
  bounds, choices, description and whether changing it at runtime needs a reboot. A
  property without a default is mandatory.
- :func:`entity` — a fixed child element, itself a config class.
- :func:`entity_list` — a keyed collection of config-class items, written in XML as a
  container element holding one item element per entry, each with a ``name`` attribute
  (``<listeners><listener name="…"/></listeners>``). Items are kept in an immutable
  mapping keyed by name.

XML names are field names with ``_`` replaced by ``-``. Values are checked in one place,
:func:`parse_value`, used both when a file is read and when a property is set at runtime,
and the attrs validators call the same check, so a config object that exists is valid.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs

__all__ = [
    "Prop",
    "Child",
    "ListOf",
    "config_class",
    "prop",
    "entity",
    "entity_list",
    "fields_of",
    "meta_of",
    "xml_name",
    "parse_value",
    "format_value",
]

_META = "martinet"
_C = TypeVar("_C")
SCALAR_TYPES = (bool, int, float, str)
_INTEGER = re.compile(r"[+-]?\d+\Z")


@attrs.frozen
class Prop:
    """Metadata of a scalar property."""

    description: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    reboot_required: bool = False
    read_only: bool = False


@attrs.frozen
class Child:
    """Metadata of a fixed child entity."""

    description: str


@attrs.frozen
class ListOf:
    """Metadata of an entity list: the item class and the XML tag of one item."""

    item_type: type
    item_tag: str
    description: str


def xml_name(field_name: str) -> str:
    """The XML attribute or element name of a field: ``max_connections`` → ``max-connections``."""
    return field_name.replace("_", "-")


def meta_of(field: attrs.Attribute) -> Prop | Child | ListOf | None:
    """The declaration of a config field; ``None`` for a field not declared by this module."""
    return field.metadata.get(_META)


def fields_of(cls: type) -> tuple[tuple[attrs.Attribute, Prop | Child | ListOf], ...]:
    """The fields of a config class with their metadata, in declaration order."""
    return tuple((f, f.metadata[_META]) for f in attrs.fields(cls))


def _type_name(kind: type) -> str:
    return {bool: "'true' or 'false'", int: "an integer", float: "a number", str: "text"}[kind]


def parse_value(kind: type, meta: Prop, raw: Any) -> Any:
    """Turn ``raw`` (XML text, or an already typed value) into a checked value of ``kind``.

    Booleans are strictly ``true``/``false``; integers are plain decimal digits with an
    optional sign; bounds and choices are enforced.

    Raises:
        ValueError: with a message saying what was expected and what was found.
    """
    if isinstance(raw, str) and kind is not str:
        text = raw.strip()
        if kind is bool:
            if text not in ("true", "false"):
                raise ValueError(f"expected 'true' or 'false', found {raw!r}")
            value: Any = text == "true"
        elif kind is int:
            if not _INTEGER.match(text):
                raise ValueError(f"expected an integer, found {raw!r}")
            value = int(text)
        else:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"expected a number, found {raw!r}") from None
    else:
        value = raw
        # bool is a subclass of int: refuse True where a number is meant, and vice versa.
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ValueError(f"expected {_type_name(kind)}, found {raw!r}")
    check_value(meta, value)
    return value


def check_value(meta: Prop, value: Any) -> None:
    """Enforce the bounds and choices of ``meta`` on an already typed value.

    Raises:
        ValueError: naming the allowed range or choices and the value found.
    """
    if meta.choices is not None and value not in meta.choices:
        allowed = ", ".join(repr(c) for c in meta.choices)
        raise ValueError(f"expected one of {allowed}, found {value!r}")
    low, high = meta.min, meta.max
    if (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            bound = f"between {_num(low)} and {_num(high)}"
        elif low is not None:
            bound = f">= {_num(low)}"
        else:
            bound = f"<= {_num(high)}"
        raise ValueError(f"expected a value {bound}, found {value!r}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def format_value(value: Any) -> str:
    """The XML text of a scalar value (the inverse of :func:`parse_value`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def prop(
    default: Any = attrs.NOTHING,
    *,
    description: str,
    min: float | None = None,  # noqa: A002 - the seeds' own names
    max: float | None = None,  # noqa: A002
    choices: Iterable[str] | None = None,
    reboot_required: bool = False,
    read_only: bool = False,
) -> Any:
    """Declare a scalar property. Without ``default`` the property is mandatory."""
    meta = Prop(
        description=description,
        min=min,
        max=max,
        choices=tuple(choices) if choices is not None else None,
        reboot_required=reboot_required,
        read_only=read_only,
    )

    def validate(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
        check_value(meta, value)

    return attrs.field(default=default, validator=validate, metadata={_META: meta})


def entity(cls: type[_C], *, description: str) -> Any:
    """Declare a fixed child entity; its default is the class built from its own defaults."""
    return attrs.field(factory=cls, metadata={_META: Child(description=description)})


def _freeze(items: Any) -> Mapping[str, Any]:
    if isinstance(items, types.MappingProxyType):
        return items
    if isinstance(items, Mapping):
        return types.MappingProxyType(dict(items))
    return types.MappingProxyType({item.name: item for item in items})


def entity_list(
    item_type: type, *, item: str, description: str, default: Iterable[Any] = ()
) -> Any:
    """Declare an entity list of ``item_type`` entries, each an XML element named ``item``.

    ``default`` holds the entries present when the config names none; the item class
    must have a mandatory ``name`` property.
    """
    defaults = tuple(default)
    return attrs.field(
        factory=lambda: _freeze(defaults),
        converter=_freeze,
        metadata={_META: ListOf(item_type=item_type, item_tag=item, description=description)},
    )


def config_class(cls: type[_C]) -> type[_C]:
    """Make ``cls`` a frozen, keyword-only attrs config class and check its declarations.

    Raises:
        TypeError: when a field was not declared with prop/entity/entity_list, a property
            has an unsupported type, or an entity-list item has no ``name`` property.
    """
    cls = attrs.frozen(kw_only=True)(cls)
    attrs.resolve_types(cls)
    for f in attrs.fields(cls):
        meta = meta_of(f)
        where = f"{cls.__qualname__}.{f.name}"
        if meta is None:
            raise TypeError(f"{where}: declare config fields with prop(), entity() or entity_list()")
        if isinstance(meta, Prop) and f.type not in SCALAR_TYPES:
            raise TypeError(f"{where}: a property must be bool, int, float or str, not {f.type!r}")
        if isinstance(meta, ListOf):
            names = {a.name: a for a in attrs.fields(meta.item_type)}
            if "name" not in names or names["name"].default is not attrs.NOTHING:
                raise TypeError(f"{where}: entity-list items need a mandatory 'name' property")
    return cls
