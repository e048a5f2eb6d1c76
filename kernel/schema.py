"""Declaring configuration: frozen attrs classes whose fields carry their own metadata.

Theory of operation
-------------------
Every swiftlet declares its configuration as classes decorated with :func:`config_class`
(frozen, keyword-only attrs classes). Each field is declared with one of three helpers, and
the helper's metadata is all that the rest of the kernel needs to read, check, manage and
save that field:

- :func:`prop` — a scalar property (``int``, ``float``, ``str``, ``bool`` or a string
  :class:`enum.Enum`) with its default, bounds, choices, description and whether changing
  it at runtime needs a reboot. A property without a default is mandatory.
- :func:`entity` — a fixed child element, itself a config class.
- :func:`entity_list` — a keyed collection of config-class items, written in XML as a
  container element holding one item element per entry, each with a ``name`` attribute
  (``<listeners><listener name="…"/></listeners>``). Items are kept in an immutable
  mapping keyed by name.

XML names are field names with ``_`` replaced by ``-``. Values are checked in one place,
:func:`parse_value`, used both when a file is read and when a property is set at runtime,
and the attrs validators call the same check, so a config object that exists is valid.

Declarations are checked once, when :func:`config_class` decorates the class, so a broken
declaration fails at import rather than when some file happens to omit the attribute:

- a property's type is ``bool``, ``int``, ``float``, ``str`` or an Enum whose values are
  all strings;
- ``min``/``max`` belong to number fields only, an ``int`` field's bounds are ``int``, and
  ``min <= max``; ``choices`` belong to ``str`` and Enum fields only;
- the default has the field's exact type (``1.0``, not ``1``, for a ``float``; a member,
  not its string, for an Enum) and lies within the bounds and choices.

Enums. ``choices=SomeEnum`` declares a property whose allowed XML strings are the enum's
*values*; such a field must be typed with that enum, and its value in a config object is
always a member (the XML text ``"persistent"`` becomes ``PersistenceMode.PERSISTENT``;
writing it back gives ``"persistent"`` again). A :class:`enum.StrEnum` is the natural
choice: its members compare equal to their strings, so code comparing with ``"persistent"``
keeps working. For convenience the constructor of a config class also accepts a value
string for an Enum field and converts it to the member.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any, TypeGuard, TypeVar

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
    "check_value",
    "format_value",
    "is_enum",
]

_META = "martinet"
_C = TypeVar("_C")
SCALAR_TYPES = (bool, int, float, str)
_INTEGER = re.compile(r"[+-]?\d+\Z")
SECRET_MASK = "********"  # how management shows a set secret property


def shown(meta: Prop, value: Any) -> Any:
    """``value`` as management may show it: masked when ``meta`` is secret and it is set."""
    return SECRET_MASK if meta.secret and value else value


@attrs.frozen
class Prop:
    """Metadata of a scalar property.

    ``choices`` are always the allowed XML strings; for a property declared with
    ``choices=SomeEnum`` they are the enum's values and ``enum`` is the enum class (the
    field's type), otherwise ``enum`` is ``None``.
    """

    description: str
    min: int | float | None = None
    max: int | float | None = None
    choices: tuple[str, ...] | None = None
    reboot_required: bool = False
    read_only: bool = False
    enum: type[Enum] | None = None
    secret: bool = False  # never shown by management (get, list, events); saved as it is
    check: Callable[[Any], object] | None = None  # a further check of the value (its result unused); raises ValueError


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


def meta_of(field: attrs.Attribute[Any]) -> Prop | Child | ListOf | None:
    """The declaration of a config field; ``None`` for a field not declared by this module."""
    return field.metadata.get(_META)


def fields_of(cls: type) -> tuple[tuple[attrs.Attribute[Any], Prop | Child | ListOf], ...]:
    """The fields of a config class with their metadata, in declaration order."""
    return tuple((f, f.metadata[_META]) for f in attrs.fields(cls))


def _type_name(kind: type) -> str:
    return {bool: "'true' or 'false'", int: "an integer", float: "a number", str: "text"}[kind]


def is_enum(kind: Any) -> TypeGuard[type[Enum]]:
    """Whether ``kind`` is an Enum class (a property type whose values are its members)."""
    return isinstance(kind, type) and issubclass(kind, Enum)


def _allowed(choices: Iterable[str]) -> str:
    return ", ".join(repr(c) for c in choices)


def parse_value(kind: type, meta: Prop, raw: Any) -> Any:
    """Turn ``raw`` (XML text, or an already typed value) into a checked value of ``kind``.

    Booleans are strictly ``true``/``false``; integers are plain decimal digits with an
    optional sign; an Enum ``kind`` takes one of its members or the exact value string of
    one (no stripping, case-sensitive) and returns the member; bounds and choices are
    enforced.

    Raises:
        ValueError: with a message saying what was expected and what was found.
    """
    if is_enum(kind):
        if isinstance(raw, kind):
            value: Any = raw
        else:
            try:
                value = kind(raw) if isinstance(raw, str) else None
            except ValueError:
                value = None
            if value is None:
                values = [member.value for member in kind]
                raise ValueError(f"expected one of {_allowed(values)}, found {raw!r}")
    elif isinstance(raw, str) and kind is not str:
        text = raw.strip()
        if kind is bool:
            if text not in ("true", "false"):
                raise ValueError(f"expected 'true' or 'false', found {raw!r}")
            value = text == "true"
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
    """Enforce the bounds, choices and ``check`` of ``meta`` on an already typed value.

    An Enum member is checked by its value against the choices.

    Raises:
        ValueError: naming the allowed range or choices and the value found.
    """
    text = value.value if isinstance(value, Enum) else value
    if meta.choices is not None and text not in meta.choices:
        raise ValueError(f"expected one of {_allowed(meta.choices)}, found {text!r}")
    low, high = meta.min, meta.max
    if (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            bound = f"between {_num(low)} and {_num(high)}"
        elif low is not None:
            bound = f">= {_num(low)}"
        else:
            assert high is not None  # out of bounds, and there is no lower bound
            bound = f"<= {_num(high)}"
        raise ValueError(f"expected a value {bound}, found {value!r}")
    if meta.check is not None:
        meta.check(value)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def format_value(value: Any) -> str:
    """The XML text of a scalar value (the inverse of :func:`parse_value`)."""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def prop(
    default: Any = attrs.NOTHING,
    *,
    description: str,
    min: int | float | None = None,  # noqa: A002 - the seeds' own names
    max: int | float | None = None,  # noqa: A002
    choices: Iterable[str] | type[Enum] | None = None,
    reboot_required: bool = False,
    read_only: bool = False,
    secret: bool = False,
    check: Callable[[Any], object] | None = None,
) -> Any:
    """Declare a scalar property. Without ``default`` the property is mandatory.

    ``secret`` (a password): management shows a set value as :data:`SECRET_MASK` — reading
    it, listing it, in change events — while the config object and ``save`` keep the real one.

    ``choices`` is either the allowed strings or an Enum class; with an Enum the field must
    be typed with it, and its values are members (see the module header). Everything is
    checked by :func:`config_class` when the class is declared.

    ``check(value)`` is a further check of a value's meaning (a time expression, a date),
    run after the type, bounds and choices, wherever those are: when a file is read (the
    error gets its file:line), when management sets or adds a value, when a config object
    is built. It raises ``ValueError`` with a message saying what was wrong.
    """
    enum_class = choices if is_enum(choices) else None
    if enum_class is not None:
        allowed: tuple[Any, ...] | None = tuple(m.value for m in enum_class)
    else:
        allowed = tuple(choices) if choices is not None else None
    meta = Prop(
        description=description,
        min=min,
        max=max,
        choices=allowed,
        reboot_required=reboot_required,
        read_only=read_only,
        enum=enum_class,
        secret=secret,
        check=check,
    )

    def validate(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
        check_value(meta, value)

    def to_member(value: Any) -> Any:  # an Enum field's value string becomes its member
        return parse_value(enum_class, meta, value)  # type: ignore[arg-type]

    return attrs.field(
        default=default,
        validator=validate,
        converter=to_member if enum_class is not None else None,
        metadata={_META: meta},
    )


def entity(cls: type[_C], *, description: str) -> Any:
    """Declare a fixed child entity; its default is the class built from its own defaults."""
    return attrs.field(factory=cls, metadata={_META: Child(description=description)})


def _freeze(items: Any) -> Mapping[str, Any]:
    if isinstance(items, types.MappingProxyType):
        return items
    if isinstance(items, Mapping):
        return types.MappingProxyType(dict(items))
    return types.MappingProxyType({item.name: item for item in items})


def entity_list(item_type: type, *, item: str, description: str, default: Iterable[Any] = ()) -> Any:
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

    Declare it ``@config_class`` over ``@attrs.frozen(kw_only=True)``: mypy's attrs plugin
    knows only attrs' own decorators, so with the inner one it checks every construction of
    the class (names, types) the way the runtime does; without it the class works the same.

    Every message starts with ``Class.field:``.

    Raises:
        TypeError: a field was not declared with prop/entity/entity_list; a property has
            an unsupported type, bounds or choices that do not fit its type, or a default
            of the wrong type; an entity-list default holds an entry of the wrong class;
            an entity-list item has no mandatory ``name`` property.
        ValueError: ``min > max``, or a default outside the bounds or choices.
    """
    # A class declared without the attrs decorator that type checkers read gets it here.
    # Typed as a plain type: attrs.has() would narrow cls to type[AttrsInstance], which is
    # no longer the caller's class to return.
    decorated: type[Any] = cls if attrs.has(cls) else attrs.frozen(kw_only=True)(cls)
    attrs.resolve_types(decorated)
    for f in attrs.fields(decorated):
        meta = meta_of(f)
        where = f"{decorated.__qualname__}.{f.name}"
        if meta is None:
            raise TypeError(f"{where}: declare config fields with prop(), entity() or entity_list()")
        if isinstance(meta, Prop):
            _check_prop(where, f.type, meta)
            if f.default is not attrs.NOTHING:
                _check_default(where, f.type, meta, f.default)
        if isinstance(meta, ListOf):
            names = {a.name: a for a in attrs.fields(meta.item_type)}
            if "name" not in names or names["name"].default is not attrs.NOTHING:
                raise TypeError(f"{where}: entity-list items need a mandatory 'name' property")
            for item in f.default.factory().values():
                if not isinstance(item, meta.item_type):
                    raise TypeError(f"{where}: default entry {item!r} is not a {meta.item_type.__qualname__}")
    return decorated


def _check_prop(where: str, kind: Any, meta: Prop) -> None:
    """The declaration of one property: its type, and bounds and choices that fit it."""
    if is_enum(kind):
        if meta.enum is not kind:
            raise TypeError(f"{where}: a property typed {kind.__qualname__} needs choices={kind.__qualname__}")
        bad = [m for m in kind if not isinstance(m.value, str)]
        if bad:
            raise TypeError(
                f"{where}: the values of {kind.__qualname__} must be strings (the XML text), found {bad[0].value!r}"
            )
    elif kind not in SCALAR_TYPES:
        raise TypeError(f"{where}: a property must be bool, int, float or str (or an Enum of strings), not {kind!r}")
    elif meta.enum is not None:
        raise TypeError(
            f"{where}: choices={meta.enum.__qualname__} needs the field typed "
            f"{meta.enum.__qualname__}, not {kind.__name__}"
        )
    if meta.choices is not None:
        if not (kind is str or is_enum(kind)):
            raise TypeError(f"{where}: choices are for str or Enum properties, not {kind.__name__}")
        if not meta.choices or not all(isinstance(c, str) for c in meta.choices):
            raise TypeError(f"{where}: choices must be a non-empty collection of strings, found {meta.choices!r}")
    for label, bound in (("min", meta.min), ("max", meta.max)):
        if bound is None:
            continue
        if kind not in (int, float):
            name = kind.__qualname__ if is_enum(kind) else kind.__name__
            raise TypeError(f"{where}: {label} is for int or float properties, not {name}")
        number = isinstance(bound, (int, float)) and not isinstance(bound, bool)
        if not number or (kind is int and not isinstance(bound, int)):
            expected = "an int" if kind is int else "a number"
            raise TypeError(f"{where}: {label}={bound!r} must be {expected}: the field is {kind.__name__}")
    if meta.min is not None and meta.max is not None and meta.min > meta.max:
        raise ValueError(f"{where}: min {meta.min!r} is above max {meta.max!r}")


def _check_default(where: str, kind: Any, meta: Prop, default: Any) -> None:
    """A property's default: of the field's exact type, within its bounds and choices."""
    if is_enum(kind):
        if not isinstance(default, kind):
            hint = ""
            if isinstance(default, str) and default in meta.choices:  # type: ignore[operator]
                hint = f"; write {kind.__qualname__}.{kind(default).name}"
            raise TypeError(f"{where}: default {default!r} is not a {kind.__qualname__} member{hint}")
        return  # a member is one of the choices by construction
    if type(default) is not kind:
        hint = f"; write {float(default)!r}" if kind is float and type(default) is int else ""
        raise TypeError(
            f"{where}: default {default!r} has type {type(default).__name__}, expected {kind.__name__}{hint}"
        )
    if meta.choices is not None and default not in meta.choices:
        raise ValueError(f"{where}: default {default!r} is not one of {_allowed(meta.choices)}")
    if meta.min is not None and default < meta.min:
        raise ValueError(f"{where}: default {default!r} is below the minimum {meta.min!r}")
    if meta.max is not None and default > meta.max:
        raise ValueError(f"{where}: default {default!r} is above the maximum {meta.max!r}")
    if meta.check is not None:
        try:
            meta.check(default)
        except ValueError as exc:
            raise ValueError(f"{where}: default {default!r}: {exc}") from None
