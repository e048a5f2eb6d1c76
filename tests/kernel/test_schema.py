"""Config declarations and values: strict parsing, bounds, and write → read round trips."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.kernel import config_class, entity, entity_list, load_config, prop
from martinet.kernel.config import RouterConfig, RouterSettings, SwiftletSection, to_xml
from martinet.kernel.schema import Prop, parse_value

INT = Prop(description="", min=-1, max=100)


@pytest.mark.parametrize(
    ("kind", "raw", "expected"),
    [
        (int, "42", 42),
        (int, " -1 ", -1),
        (int, "+7", 7),
        (int, 100, 100),
        (float, "2.5", 2.5),
        (float, "1e3", 1000.0),
        (float, 3, 3.0),
        (bool, "true", True),
        (bool, "false", False),
        (bool, False, False),
        (str, " spaced ", " spaced "),
    ],
)
def test_values_parse(kind, raw, expected):
    meta = INT if kind is int else Prop(description="")
    value = parse_value(kind, meta, raw)
    assert value == expected and type(value) is kind


@pytest.mark.parametrize(
    ("kind", "raw", "message"),
    [
        (int, "1_000", "expected an integer, found '1_000'"),
        (int, "0x10", "expected an integer"),
        (int, "", "expected an integer"),
        (int, True, "expected an integer, found True"),
        (int, "101", "expected a value between -1 and 100, found 101"),
        (int, -2, "between -1 and 100, found -2"),
        (bool, "True", "expected 'true' or 'false', found 'True'"),
        (bool, "1", "expected 'true' or 'false'"),
        (float, "fast", "expected a number, found 'fast'"),
        (str, 5, "expected text, found 5"),
    ],
)
def test_bad_values_are_refused(kind, raw, message):
    meta = INT if kind is int else Prop(description="")
    with pytest.raises(ValueError, match=message):
        parse_value(kind, meta, raw)


def test_config_objects_validate_on_construction():
    @config_class
    @attrs.frozen(kw_only=True)
    class C:
        port: int = prop(1, min=1, max=10, description="p")

    with pytest.raises(ValueError, match="between 1 and 10"):
        C(port=11)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        C().port = 2  # type: ignore[misc]


@config_class
@attrs.frozen(kw_only=True)
class Nameless:
    port: int = prop(1, description="p")


def test_declarations_are_checked_at_import():
    with pytest.raises(TypeError, match="declare config fields with prop"):

        @config_class
        @attrs.frozen(kw_only=True)
        class Bare:
            x: int = 1

    with pytest.raises(TypeError, match="must be bool, int, float or str"):

        @config_class
        @attrs.frozen(kw_only=True)
        class Listy:
            x: list = prop(description="no")

    with pytest.raises(TypeError, match="need a mandatory 'name' property"):

        @config_class
        @attrs.frozen(kw_only=True)
        class Holder:
            items: Mapping[str, Nameless] = entity_list(Nameless, item="i", description="d")


# -- round trip: any valid config survives write → read unchanged ---------------------------


@config_class
@attrs.frozen(kw_only=True)
class Item:
    name: str = prop(description="n")
    weight: float = prop(1.0, min=0, max=1e9, description="w")
    label: str = prop("", description="l")


@config_class
@attrs.frozen(kw_only=True)
class Inner:
    depth: int = prop(3, min=0, max=9, description="d")
    on: bool = prop(False, description="o")


@config_class
@attrs.frozen(kw_only=True)
class Outer:
    count: int = prop(10, min=-1, max=2**40, description="c")
    mode: str = prop("a", choices=("a", "b", "c"), description="m")
    text: str = prop("", description="t")
    inner: Inner = entity(Inner, description="i")
    items: Mapping[str, Item] = entity_list(Item, item="item", description="i", default=[Item(name="x")])


from martinet.kernel import SwiftletSpec  # noqa: E402

SPECS = {"t$outer": SwiftletSpec(name="t$outer", description="", config=Outer, factory=lambda c: None)}
# Characters XML 1.0 can carry (no controls but tab/newline, no surrogates).
xml_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff")
    | st.sampled_from("\t\n&<>\"'"),
    max_size=20,
)
names = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="$._-"), min_size=1, max_size=10)
items = st.builds(Item, name=names, weight=st.floats(0, 1e9, allow_nan=False), label=xml_text)
outers = st.builds(
    Outer,
    count=st.integers(-1, 2**40),
    mode=st.sampled_from("abc"),
    text=xml_text,
    inner=st.builds(Inner, depth=st.integers(0, 9), on=st.booleans()),
    items=st.lists(items, max_size=4, unique_by=lambda i: i.name),
)


@settings(max_examples=200, deadline=None)
@given(outers)
def test_any_valid_config_round_trips_through_xml(outer):
    config = RouterConfig(RouterSettings(name="r1", startorder="t$outer"), {"t$outer": SwiftletSection(outer, {})})
    text = to_xml(config, SPECS)
    assert load_config("<memory>", SPECS, text=text) == config
