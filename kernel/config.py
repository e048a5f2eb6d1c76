"""The router config file: ``<router name="…" startorder="…">`` with one ``<swiftlet>`` each.

Theory of operation
-------------------
The file follows SwiftMQ's ``routerconfig.xml``::

    <router name="router1" startorder="sys$log xt$echo">
      <swiftlet name="sys$log" level="INFO"/>
      <swiftlet name="xt$echo">
        <pools><pool name="echo.worker" max-concurrency="2"/></pools>
      </swiftlet>
    </router>

:func:`load_config` parses it safely (no entities, no DTD, no network), reads the router's
own settings (:class:`RouterSettings`) and each ``<swiftlet>`` element with the config
class its plugin declared, plus the kernel-owned ``<pools>`` list, and raises
:class:`ConfigErrors` holding *every* problem found, each with file:line. A swiftlet in
``startorder`` without an element gets its defaults; a pool without an entry gets the
defaults its swiftlet declared.

:func:`save_config` writes a :class:`RouterConfig` back sparsely and atomically, keeping
numbered backups of the previous files (``router.xml.1`` is the newest).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
from lxml import etree

from .plugins import SwiftletSpec
from .pools import PoolConfig
from .schema import config_class, prop
from .xmlconfig import ConfigError, ConfigErrors, ConfigProblem, ElementReader, write_element

__all__ = [
    "RouterSettings",
    "SwiftletSection",
    "RouterConfig",
    "ConfigError",
    "ConfigErrors",
    "ConfigProblem",
    "load_config",
    "save_config",
    "to_xml",
    "parse_startorder",
]

_ROUTER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")


@config_class
@attrs.frozen(kw_only=True)
class RouterSettings:
    """The attributes of the root ``<router>`` element."""

    name: str = prop(
        reboot_required=True,
        description="Router name; unqualified queue names q mean q@name. "
        "Letters, digits, '_' and '-', starting with a letter.",
    )
    startorder: str = prop(
        "",
        reboot_required=True,
        description="Swiftlets to start, in order, separated by spaces, commas or colons; they stop in reverse order.",
    )
    shutdown_timeout: int = prop(
        10_000,
        min=0,
        max=3_600_000,
        description="Milliseconds each swiftlet may spend cleaning up when it is stopped.",
    )
    config_backups: int = prop(15, min=0, max=1000, description="Backups of the config file kept by 'save'.")


# The converters of the mappings below: read-only views (typed functions, as the attrs
# plugin cannot bind the type variables of the generic MappingProxyType).
def _pool_view(pools: Mapping[str, PoolConfig]) -> Mapping[str, PoolConfig]:
    return MappingProxyType(pools)


def _section_view(sections: Mapping[str, SwiftletSection]) -> Mapping[str, SwiftletSection]:
    return MappingProxyType(sections)


@attrs.frozen
class SwiftletSection:
    """One swiftlet's part of the config: its own config object and its pools."""

    config: Any
    pools: Mapping[str, PoolConfig] = attrs.field(converter=_pool_view)


@attrs.frozen
class RouterConfig:
    """A whole router config. ``swiftlets`` holds every started or configured swiftlet."""

    settings: RouterSettings
    swiftlets: Mapping[str, SwiftletSection] = attrs.field(converter=_section_view)

    @property
    def startorder(self) -> list[str]:
        return parse_startorder(self.settings.startorder)


def parse_startorder(text: str) -> list[str]:
    """The swiftlet names of a ``startorder`` (separated by spaces, commas or colons)."""
    return [name for name in re.split(r"[\s,:]+", text) if name]


def default_section(spec: SwiftletSpec) -> SwiftletSection:
    """A swiftlet's section when the file says nothing about it."""
    return SwiftletSection(spec.config(), {p.name: p.default_config() for p in spec.pools})


def load_config(
    source: str | os.PathLike[str],
    specs: Mapping[str, SwiftletSpec],
    *,
    text: bytes | None = None,
    hook: Any = None,
) -> RouterConfig:
    """Read and check a router config file (or ``text``, labelled with ``source``).

    ``hook``: the plugins' hooks, given to each swiftlet's ``check`` (``None``: the checks
    that need them are skipped).

    Raises:
        ConfigErrors: every problem found, each with file:line, element path and attribute.
        OSError: the file cannot be read.
    """
    label = str(source)
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        if text is None:
            text = Path(source).read_bytes()
        root = etree.fromstring(text, parser)
    except etree.XMLSyntaxError as exc:
        error = ConfigError(label, exc.lineno, "/", f"malformed XML: {exc.msg}")
        raise ConfigErrors([error]) from None
    if root.tag != "router":
        raise ConfigErrors([ConfigError(label, root.sourceline, f"/{root.tag}", "the root element must be <router>")])
    reader = ElementReader(label)
    settings = reader.read(root, RouterSettings, skip=("swiftlet",))
    if settings is not None and not _ROUTER_NAME.match(settings.name):
        reader.error(
            root,
            f"invalid router name {settings.name!r}: use letters, digits, '_' and '-', starting with a letter",
            "name",
        )
    startorder = parse_startorder(root.get("startorder", ""))
    installed = ", ".join(specs) or "none"
    seen: set[str] = set()
    for name in startorder:
        if name in seen:
            reader.error(root, f"swiftlet {name!r} is listed twice", "startorder")
        elif name not in specs:
            reader.error(root, f"unknown swiftlet {name!r}; installed: {installed}", "startorder")
        seen.add(name)
    sections: dict[str, SwiftletSection] = {}
    first_line: dict[str, int] = {}
    elements: dict[str, etree._Element] = {}
    for el in root.iterchildren("swiftlet"):
        name = el.get("name")
        if not name:
            reader.error(el, "<swiftlet> needs a 'name' attribute")
        elif name in first_line:
            reader.error(el, f"swiftlet {name!r} is configured twice (first at line {first_line[name]})")
        elif name not in specs:
            reader.error(el, f"unknown swiftlet {name!r}; installed: {installed}", "name")
        else:
            first_line[name] = el.sourceline
            elements[name] = el
            section = _read_section(reader, el, specs[name])
            if section is not None:
                sections[name] = section
    if reader.errors:
        raise ConfigErrors(sorted(reader.errors, key=lambda e: e.line or 0))
    for name in startorder:
        sections.setdefault(name, default_section(specs[name]))
    config = RouterConfig(settings, sections)
    for name in startorder:
        check = specs[name].check
        for problem in check(config, hook) if check else ():
            el = elements.get(name)
            reader.error(root if el is None else problem.locate(el), problem.message, problem.attribute)
    if reader.errors:
        raise ConfigErrors(sorted(reader.errors, key=lambda e: e.line or 0))
    return config


def _read_section(reader: ElementReader, el: etree._Element, spec: SwiftletSpec) -> SwiftletSection | None:
    pools = {p.name: p.default_config() for p in spec.pools}
    containers = list(el.iterchildren("pools"))
    for extra in containers[1:]:
        reader.error(extra, "<pools> may appear only once here")
    if containers:
        declared = {p.name: p for p in spec.pools}
        for item in list(containers[0].iterchildren("pool")):
            pool = declared.get(item.get("name", ""))
            if pool is not None:
                for key, value in (("max-concurrency", pool.max_concurrency), ("queue-size", pool.queue_size)):
                    if item.get(key) is None:
                        item.set(key, str(value))
            elif item.get("name"):
                names = ", ".join(declared) or "none"
                reader.error(item, f"swiftlet {spec.name} has no pool {item.get('name')!r}; its pools: {names}", "name")
                containers[0].remove(item)  # reported; the list reader need not see it
        configured = reader.read_list(containers[0], PoolConfig, "pool")
        pools.update(configured or {})
    else:
        configured = {}
    config = reader.read(el, spec.config, skip=("name", "pools"))
    return None if config is None or configured is None else SwiftletSection(config, pools)


def to_xml(config: RouterConfig, specs: Mapping[str, SwiftletSpec]) -> bytes:
    """The sparse XML text of ``config``: only values that differ from their defaults."""
    root = write_element(config.settings, "router")
    assert root is not None  # the router name is mandatory, so always written
    startorder = set(config.startorder)
    for name, section in config.swiftlets.items():
        el = _named("swiftlet", name, write_element(section.config, "swiftlet"))
        changed = [
            _named("pool", default.name, write_element(pool, "pool", defaults=default))
            for default in (p.default_config() for p in specs[name].pools)
            if (pool := section.pools[default.name]) != default
        ]
        if changed:
            etree.SubElement(el, "pools").extend(changed)
        if len(el) or len(el.attrib) > 1 or name not in startorder:
            root.append(el)  # else only defaults: the start order alone brings it back
    etree.indent(root, space="  ")
    text: bytes = etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True)
    return text


def _named(tag: str, name: str, body: etree._Element | None) -> etree._Element:
    """Element ``tag`` with ``name`` as its first attribute, then the content of ``body``."""
    el = etree.Element(tag, name=name)
    if body is not None:
        for key, value in body.attrib.items():
            if key != "name":
                el.set(key, value)
        el.extend(list(body))
    return el


def save_config(config: RouterConfig, specs: Mapping[str, SwiftletSpec], path: str | os.PathLike[str]) -> Path:
    """Write ``config`` to ``path`` atomically, rotating up to ``config-backups`` backups.

    The new text goes to a temporary file in the same folder, is fsynced, and replaces the
    file in one rename, so a crash leaves either the old or the new file, never half of one.

    Raises:
        OSError: the folder is not writable.
    """
    target = Path(path)
    text = to_xml(config, specs)
    temporary = target.with_name(f".{target.name}.saving")
    with open(temporary, "wb") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    keep = config.settings.config_backups
    if target.exists() and keep > 0:
        for n in range(keep - 1, 0, -1):
            older = target.with_name(f"{target.name}.{n}")
            if older.exists():
                os.replace(older, target.with_name(f"{target.name}.{n + 1}"))
        os.replace(target, target.with_name(f"{target.name}.1"))
    os.replace(temporary, target)
    return target
