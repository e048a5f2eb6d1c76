"""Reading config classes from XML and writing them back.

Theory of operation
-------------------
Reading is two passes over one element:

1. :func:`_to_node` walks the element guided by the config class and produces a plain dict
   (a :class:`_Node`, which remembers its element): attributes become string values, fixed
   child entities become nested nodes, entity lists become ``{name: node}`` mappings.
   Structural errors are found here — unknown or repeated child elements, a foreign item
   in an entity list, an item without a name, two items with the same name, stray text.
2. A private cattrs converter structures the dict into the frozen class. Every property
   goes through :func:`kernel.schema.parse_value`; ``forbid_extra_keys`` catches unknown
   attributes; detailed validation collects every failure at once. The failure tree is
   then walked together with the node tree, so each message names the file, the line of
   the element, the element's path and the attribute.

Writing is sparse: only values that differ from their default are written, an entity list
only when it differs from its default content, so a saved file stays small and readable
and picks up new defaults of a later release.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.gen import make_dict_structure_fn, override
from lxml import etree

from .schema import Child, ListOf, Prop, fields_of, format_value, meta_of, parse_value, xml_name

__all__ = ["ConfigError", "ConfigErrors", "ConfigProblem", "ElementReader", "element_path", "write_element"]


@attrs.frozen
class ConfigError:
    """One problem in a config file, located precisely."""

    file: str
    line: int | None
    path: str
    message: str
    attribute: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        attr = f" attribute '{self.attribute}':" if self.attribute else ""
        return f"{where}: {self.path}:{attr} {self.message}"


@attrs.frozen
class ConfigProblem:
    """A problem a swiftlet's cross-swiftlet check found (``SwiftletSpec.check``), located
    below its ``<swiftlet>`` element by ``path``: child tags and item names alternating, e.g.
    ``("static-remote-router-subscriptions", "b")`` is item ``b`` of that entity list.
    Reported at the deepest element of the path that the file has."""

    path: tuple[str, ...]
    message: str
    attribute: str | None = None

    def locate(self, el: etree._Element) -> etree._Element:
        """The element of ``path`` below ``el`` (the swiftlet's), or the deepest one found."""
        for index, step in enumerate(self.path):
            found = (
                next((c for c in el.iterchildren() if c.get("name") == step), None)
                if index % 2
                else next(el.iterchildren(step), None)
            )
            if found is None:
                break
            el = found
        return el


class ConfigErrors(Exception):
    """Every problem found in a config file, reported together (one per line)."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def element_path(el: etree._Element) -> str:
    """An XPath-like path naming each element by its ``name`` attribute where it has one."""
    parts = []
    while el is not None:
        name = el.get("name")
        parts.append(f"{el.tag}[@name='{name}']" if name is not None else str(el.tag))
        el = el.getparent()
    return "/" + "/".join(reversed(parts))


class _Node(dict[str, Any]):
    """A dict of one element's content that remembers the element it came from."""

    def __init__(self, element: etree._Element):
        super().__init__()
        self.element = element


def suggest(word: str, candidates: list[str]) -> str:
    """ "; did you mean 'x'?" for the candidate closest to a misspelled ``word`` (else the
    candidates), as ``martinet check`` and management say it."""
    close = difflib.get_close_matches(word, candidates, n=1)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; expected one of: {', '.join(sorted(candidates))}" if candidates else ""


class ElementReader:
    """Reads config classes from elements of one file, collecting errors as it goes.

    ``errors`` accumulates every problem found; :meth:`read` returns ``None`` for an
    element that had errors.
    """

    def __init__(self, file: str):
        self.file = file
        self.errors: list[ConfigError] = []
        self._converter = cattrs.Converter(forbid_extra_keys=True)
        self._converter.register_structure_hook_factory(
            lambda t: attrs.has(t) and all(meta_of(f) for f in attrs.fields(t)),
            self._make_structure_fn,
        )

    def error(self, el: etree._Element, message: str, attribute: str | None = None) -> None:
        """Record a problem found at ``el`` (and optionally one of its attributes)."""
        line = el.sourceline if el is not None else None
        path = element_path(el) if el is not None else "/"
        self.errors.append(ConfigError(self.file, line, path, message, attribute))

    def read(
        self,
        el: etree._Element,
        cls: type,
        *,
        skip: tuple[str, ...] = (),
    ) -> Any:
        """Structure ``el`` into ``cls``; ``None`` (with errors recorded) when it is invalid.

        ``skip`` names attributes and child elements that the caller handles itself.
        """
        before = len(self.errors)
        node = self._to_node(el, cls, skip)
        try:
            value: Any = self._converter.structure(node, cls)
        except ClassValidationError as exc:
            self._report(exc, node, cls)
            return None
        return value if len(self.errors) == before else None

    def read_list(self, container: etree._Element, item_type: type, item_tag: str) -> dict[str, Any] | None:
        """Structure an entity-list container element into ``{name: item}``; ``None`` if invalid."""
        before = len(self.errors)
        node = self._list_node(container, ListOf(item_type, item_tag, ""))
        items: dict[str, Any] = {}
        for name, item_node in node.items():
            try:
                items[name] = self._converter.structure(item_node, item_type)
            except ClassValidationError as exc:
                self._report(exc, item_node, item_type)
        return items if len(self.errors) == before else None

    def structure(self, values: Mapping[str, Any], cls: type) -> Any:
        """Structure a flat mapping of XML names to values (no element) into ``cls``.

        Raises:
            ValueError: listing every problem, as ``attribute: message`` pairs.
        """
        try:
            return self._converter.structure(dict(values), cls)
        except ClassValidationError as exc:
            messages = []
            for path, message in _flatten(exc, cls):
                messages.append(f"{path}: {message}" if path else message)
            raise ValueError("; ".join(messages)) from None

    # -- pass 1: element -> node ------------------------------------------------------

    def _to_node(self, el: etree._Element, cls: type, skip: tuple[str, ...] = ()) -> _Node:
        node = _Node(el)
        for key, value in el.attrib.items():
            if key not in skip:
                node[key] = value
        if el.text and el.text.strip():
            self.error(el, f"unexpected text {el.text.strip()[:40]!r}")
        children = {xml_name(f.name): (f, meta) for f, meta in fields_of(cls)}
        structural = [n for n, (_, m) in children.items() if not isinstance(m, Prop)]
        for child in el:
            if not isinstance(child.tag, str):  # comments and processing instructions
                continue
            if child.tail and child.tail.strip():
                self.error(el, f"unexpected text {child.tail.strip()[:40]!r}")
            if child.tag in skip:
                continue
            field, meta = children.get(child.tag, (None, None))
            if field is None or meta is None or isinstance(meta, Prop):  # (no such field: both None)
                hint = suggest(child.tag, structural)
                self.error(child, f"unknown element <{child.tag}>{hint}")
                continue
            if child.tag in node:
                self.error(child, f"<{child.tag}> may appear only once here")
                continue
            if isinstance(meta, Child):
                assert field.type is not None  # config_class resolved every field's type
                node[child.tag] = self._to_node(child, field.type)
            else:
                node[child.tag] = self._list_node(child, meta)
        return node

    def _list_node(self, container: etree._Element, meta: ListOf) -> _Node:
        items = _Node(container)
        first_line: dict[str, int | None] = {}
        if container.attrib:
            for key in container.attrib:
                self.error(container, "an entity list takes no attributes", key)
        if container.text and container.text.strip():
            self.error(container, f"unexpected text {container.text.strip()[:40]!r}")
        for item in container:
            if not isinstance(item.tag, str):
                continue
            if item.tag != meta.item_tag:
                self.error(item, f"unknown element <{item.tag}>; expected <{meta.item_tag}>")
                continue
            name = item.get("name")
            if name is None or not name.strip():
                self.error(item, f"<{meta.item_tag}> needs a non-empty 'name' attribute")
                continue
            if name in items:
                self.error(
                    item,
                    f"duplicate {meta.item_tag} name {name!r} (first defined at line {first_line[name]})",
                )
                continue
            first_line[name] = item.sourceline
            items[name] = self._to_node(item, meta.item_type)
        return items

    # -- pass 2: cattrs --------------------------------------------------------------

    def _make_structure_fn(self, cls: type) -> Callable[[Any, Any], Any]:
        # (values typed Any: mypy would match the ** against make_dict_structure_fn's own
        # boolean options as well as against its **kwargs of overrides)
        overrides: dict[str, Any] = {}
        for field, meta in fields_of(cls):
            hook = None
            if isinstance(meta, Prop):
                assert field.type is not None  # config_class resolved every field's type
                hook = _prop_hook(field.type, meta)
            overrides[field.name] = override(rename=xml_name(field.name), struct_hook=hook)
        return make_dict_structure_fn(cls, self._converter, _cattrs_forbid_extra_keys=True, **overrides)

    def _report(self, exc: BaseException, node: _Node, cls: type) -> None:
        """Walk a cattrs failure tree alongside the node tree and record located errors."""
        el = node.element
        if isinstance(exc, ForbiddenExtraKeysError):
            known = [xml_name(f.name) for f, m in fields_of(cls) if isinstance(m, Prop)]
            for key in sorted(exc.extra_fields):
                self.error(el, f"unknown attribute{suggest(key, known)}", key)
            return
        if not isinstance(exc, ClassValidationError):
            self.error(el, str(exc))
            return
        for sub in exc.exceptions:
            field_name = _attribute_note(sub)
            if field_name is None:
                self._report(sub, node, cls)
                continue
            field = attrs.fields_dict(cls)[field_name]
            meta = meta_of(field)
            key = xml_name(field_name)
            if isinstance(meta, Child) and isinstance(sub, ClassValidationError):
                assert field.type is not None  # config_class resolved every field's type
                self._report(sub, node[key], field.type)
            elif isinstance(meta, ListOf) and isinstance(sub, IterableValidationError):
                for item_exc in sub.exceptions:
                    item_key = _index_note(item_exc)
                    self._report(item_exc, node[key][item_key], meta.item_type)
            elif isinstance(sub, KeyError):
                self.error(el, "missing mandatory attribute", key)
            else:
                self.error(el, str(sub), key)


def _prop_hook(kind: type, meta: Prop) -> Callable[[Any, Any], Any]:
    return lambda value, _type: parse_value(kind, meta, value)


def _attribute_note(exc: BaseException) -> str | None:
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, cattrs.AttributeValidationNote):
            return note.name
    return None


def _index_note(exc: BaseException) -> Any:
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, cattrs.IterableValidationNote):
            return note.index
    raise exc  # a failure cattrs did not annotate is a bug: let it surface


def _flatten(exc: BaseException, cls: type, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(attribute path, message) pairs of a failure from :meth:`ElementReader.structure`."""
    if isinstance(exc, ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            yield (prefix + key, "unknown attribute")
        return
    if not isinstance(exc, ClassValidationError):
        yield (prefix.rstrip("/"), str(exc))
        return
    for sub in exc.exceptions:
        name = _attribute_note(sub)
        key = prefix + xml_name(name) if name else prefix.rstrip("/")
        if isinstance(sub, KeyError):
            yield (key, "missing mandatory attribute")
        elif isinstance(sub, ClassValidationError) and name:
            child_type = attrs.fields_dict(cls)[name].type
            assert child_type is not None  # config_class resolved every field's type
            yield from _flatten(sub, child_type, key + "/")
        elif isinstance(sub, (ClassValidationError, ForbiddenExtraKeysError)):
            yield from _flatten(sub, cls, prefix)
        else:
            yield (key, str(sub))


# -- writing ------------------------------------------------------------------------------


def write_element(value: Any, tag: str, *, defaults: Any | None = None) -> etree._Element | None:
    """The sparse element of config object ``value``; ``None`` if it holds only defaults.

    ``defaults`` is the object to compare against (the class's own field defaults when
    omitted). Mandatory properties (an entity-list item's name) are always written.
    """
    cls = type(value)
    el = etree.Element(tag)
    has_content = False
    for field, meta in fields_of(cls):
        current = getattr(value, field.name)
        name = xml_name(field.name)
        if defaults is not None:
            default = getattr(defaults, field.name)
        elif field.default is attrs.NOTHING:
            default = attrs.NOTHING
        # attrs' stubs declare Factory a function (it is a class): the isinstance needs an
        # ignore and narrows nothing
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            default = field.default.factory()  # type: ignore[union-attr]
        else:
            default = field.default
        if isinstance(meta, Prop):
            if current != default:
                el.set(name, format_value(current))
                has_content = True
        elif isinstance(meta, Child):
            child = write_element(current, name, defaults=default)
            if child is not None:
                el.append(child)
                has_content = True
        elif current != default:
            container = etree.SubElement(el, name)
            for item in current.values():
                container.append(write_element(item, meta.item_tag))  # has a name: never None
            has_content = True
    return el if has_content else None
