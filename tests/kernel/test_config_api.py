"""What a plugin author sees of config: the live frozen config (``context.config``,
``Entity.config``), changes named by field, declarations checked at class creation, and
Enum choices."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, StrEnum
from typing import Any

import attrs
import pytest
import trio

from martinet.kernel import (
    Change,
    EventBus,
    ManagementError,
    PropertyChanged,
    Router,
    SwiftletContext,
    SwiftletSpec,
    Tree,
    config_class,
    entity_list,
    hookimpl,
    prop,
)
from martinet.kernel.schema import format_value, parse_value
from martinet.kernel.xmlconfig import ElementReader, write_element
from martinet.swiftlets.queuemanager.config import ConsumerMode, PersistenceMode, QueueConfig, QueueSettings

from tests.harness.polling import drain

# -- a swiftlet that reads its config per use -----------------------------------------------


@config_class
@attrs.frozen(kw_only=True)
class RouteConfig:
    name: str = prop(description="Route name.")
    max_hops: int = prop(3, min=1, max=64, description="Hops before a message is dropped.")


@config_class
@attrs.frozen(kw_only=True)
class LiveConfig:
    greeting: str = prop("hello", description="Changes apply at once.")
    listen_port: int = prop(5000, min=1, max=65535, reboot_required=True, description="At the next start.")
    routes: Mapping[str, RouteConfig] = entity_list(
        RouteConfig, item="route", description="Routes.", default=[RouteConfig(name="r1"), RouteConfig(name="r2")]
    )


class LiveSwiftlet:
    def __init__(self, context: SwiftletContext):
        self.context = context
        self.seen: list[tuple[str, str, str, Any, Any]] = []  # listener calls, with what config said then

    def _route_changed(self, name: str, change: Change) -> None:
        before = self.context.config.routes[name].max_hops  # not committed yet: the old value
        self.seen.append((change.path, change.field, change.xml_name, change.new, before))

    def _route_added(self, entity: Any) -> None:
        entity.on_change(lambda change: self._route_changed(entity.name, change))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.context.entity.on_change(
            lambda change: self.seen.append(
                (change.path, change.field, change.xml_name, change.new, self.context.config.greeting)
            )
        )
        self.context.entity.entity_list("routes").bind(self._route_added)
        task_status.started()
        await trio.sleep_forever()


class LivePlugin:
    @hookimpl
    def martinet_swiftlets(self) -> list[SwiftletSpec]:
        return [SwiftletSpec(name="t$live", description="live config", config=LiveConfig, factory=LiveSwiftlet)]


@pytest.fixture
def live_router(write_config):
    path = write_config('<router name="r1" startorder="t$live"/>')
    return Router.from_file(path, plugins=[LivePlugin()])


async def test_context_config_follows_runtime_changes(live_router):
    router, tree = live_router, live_router.management
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        swiftlet = router.swiftlet("t$live")
        context = swiftlet.context
        assert context.config.greeting == "hello" and context.config is context.entity.config
        assert context.config is context.config  # cached while nothing changes

        # A top-level property.
        tree.set("/t$live", "greeting", "bonjour")
        assert context.config.greeting == "bonjour"
        assert tree.entity("/t$live").config.greeting == "bonjour"

        # A property of an entity-list entry: the entry's and the swiftlet's config follow.
        r2_before = context.config.routes["r2"]
        tree.set("/t$live/routes/r1", "max-hops", "7")
        assert context.config.routes["r1"].max_hops == 7
        assert tree.entity("/t$live/routes/r1").config.max_hops == 7
        assert context.config.routes["r2"] is r2_before  # only the changed branch is rebuilt

        # Entries added and removed at runtime.
        tree.add("/t$live/routes", "r3", {"max-hops": "9"})
        assert context.config.routes["r3"] == RouteConfig(name="r3", max_hops=9)
        tree.remove("/t$live/routes", "r3")
        assert list(context.config.routes) == ["r1", "r2"]
        router.request_stop()

    # Listeners got the field name and the XML name, and were called before the commit.
    assert swiftlet.seen == [
        ("/t$live", "greeting", "greeting", "bonjour", "hello"),
        ("/t$live/routes/r1", "max_hops", "max-hops", 7, 3),
    ]


async def test_reboot_required_values_take_effect_at_the_next_start(live_router):
    router, tree = live_router, live_router.management
    tree.set("/t$live", "listen-port", "5001")  # before the start: in effect at this start
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        context = router.swiftlet("t$live").context
        assert context.config.listen_port == 5001
        tree.set("/t$live", "listen-port", "6000")
        assert tree.get("/t$live", "listen-port") == 6000  # committed, shown
        assert context.config.listen_port == 5001  # but not in effect before a reboot
        assert tree.entity("/t$live").snapshot().listen_port == 6000  # and saved
        assert router.snapshot().swiftlets["t$live"].config.listen_port == 6000
        router.request_stop()


# -- Change names the field --------------------------------------------------------------------


@config_class
@attrs.frozen(kw_only=True)
class LimitsConfig:
    max_connections: int = prop(-1, min=-1, description="-1: unlimited.")


def test_a_change_carries_the_field_name_and_the_xml_name():
    tree = Tree(EventBus(), LimitsConfig())
    offered: list[Change] = []
    tree.root.on_change(offered.append)
    watcher = tree.bus.subscribe(PropertyChanged)
    change = tree.set("/", "max-connections", "10")
    assert offered == [change]
    assert (change.path, change.field, change.xml_name, change.old, change.new) == (
        "/",
        "max_connections",
        "max-connections",
        -1,
        10,
    )
    assert attrs.evolve(LimitsConfig(), **{change.field: change.new}) == tree.root.config
    # Operators' names stay XML names: paths, get/set, bus events.
    assert [e.name for e in drain(watcher)] == ["max-connections"]


# -- declarations are checked when the class is declared -------------------------------------


class Colour(StrEnum):
    RED = "red"
    GREEN = "green"


class Numbered(Enum):
    ONE = 1


class Other(StrEnum):
    X = "x"


@config_class
@attrs.frozen(kw_only=True)
class Named:
    name: str = prop(description="n")


@config_class
@attrs.frozen(kw_only=True)
class AlsoNamed:
    name: str = prop(description="n")


def declare(kind: Any, field: Any, cls_name: str = "QueueSettings") -> type:
    """A config class named ``cls_name`` with one field ``max_messages`` of type ``kind``."""
    namespace = {"__annotations__": {"max_messages": kind}, "max_messages": field}
    return config_class(type(cls_name, (), namespace))


@pytest.mark.parametrize(
    ("kind", "field", "error", "message"),
    [
        # the default's type
        (int, lambda: prop("5", description="d"), TypeError, "default '5' has type str, expected int"),
        (int, lambda: prop(True, description="d"), TypeError, "default True has type bool, expected int"),
        (float, lambda: prop(1, description="d"), TypeError, "default 1 has type int, expected float; write 1.0"),
        (bool, lambda: prop(1, description="d"), TypeError, "default 1 has type int, expected bool"),
        (str, lambda: prop(5, description="d"), TypeError, "default 5 has type int, expected str"),
        (
            Colour,
            lambda: prop("red", choices=Colour, description="d"),
            TypeError,
            "default 'red' is not a Colour member; write Colour.RED",
        ),
        # bounds
        (int, lambda: prop(-5, min=0, description="d"), ValueError, "default -5 is below the minimum 0"),
        (
            int,
            lambda: prop(70_000, min=1, max=65_535, description="d"),
            ValueError,
            "default 70000 is above the maximum 65535",
        ),
        (float, lambda: prop(0.5, min=1.5, description="d"), ValueError, "default 0.5 is below the minimum 1.5"),
        # choices
        (
            str,
            lambda: prop("loud", choices=("quiet", "normal"), description="d"),
            ValueError,
            "default 'loud' is not one of 'quiet', 'normal'",
        ),
        # the declaration itself
        (int, lambda: prop(1, min=0.5, description="d"), TypeError, "min=0.5 must be an int: the field is int"),
        (int, lambda: prop(1, max=10.0, description="d"), TypeError, "max=10.0 must be an int: the field is int"),
        (int, lambda: prop(1, min=5, max=2, description="d"), ValueError, "min 5 is above max 2"),
        (str, lambda: prop("a", min=1, description="d"), TypeError, "min is for int or float properties, not str"),
        (
            int,
            lambda: prop(1, choices=("1", "2"), description="d"),
            TypeError,
            "choices are for str or Enum properties, not int",
        ),
        (
            str,
            lambda: prop("red", choices=Colour, description="d"),
            TypeError,
            "choices=Colour needs the field typed Colour, not str",
        ),
        (Colour, lambda: prop(Colour.RED, description="d"), TypeError, "a property typed Colour needs choices=Colour"),
        (
            Colour,
            lambda: prop(Colour.RED, choices=Other, description="d"),
            TypeError,
            "a property typed Colour needs choices=Colour",
        ),
        (
            Numbered,
            lambda: prop(Numbered.ONE, choices=Numbered, description="d"),
            TypeError,
            "the values of Numbered must be strings",
        ),
    ],
)
def test_declarations_are_checked_when_the_class_is_declared(kind, field, error, message):
    with pytest.raises(error, match=f"^QueueSettings\\.max_messages: {_escape(message)}"):
        declare(kind, field())


def _escape(text: str) -> str:
    return "".join("\\" + c if c in ".()[]*+?^$|{}\\" else c for c in text)


def test_float_bounds_are_fine_on_float_fields_and_int_bounds_too():
    declare(float, prop(0.5, min=0, max=1.5, description="d"))
    declare(int, prop(5, min=0, max=10, description="d"))
    declare(int, prop(description="mandatory: no default to check"))


def test_entity_list_defaults_must_be_entries_of_the_item_class():
    namespace = {
        "__annotations__": {"items": Mapping[str, Named]},
        "items": entity_list(Named, item="item", description="d", default=[AlsoNamed(name="x")]),
    }
    with pytest.raises(TypeError, match=r"^Holder\.items: default entry AlsoNamed\(name='x'\) is not a Named"):
        config_class(type("Holder", (), namespace))


def test_the_shipped_config_classes_pass_their_own_checks():
    from martinet.kernel import load_swiftlet_specs

    assert load_swiftlet_specs()  # importing every installed swiftlet declares its classes


# -- Enum choices ----------------------------------------------------------------------------


def test_enum_properties_read_write_and_manage_as_members():
    reader = ElementReader("<test>")
    queue = reader.structure({"name": "q", "persistence-mode": "persistent"}, QueueConfig)
    assert queue.persistence_mode is PersistenceMode.PERSISTENT
    assert queue.consumer_mode is ConsumerMode.SHARED  # the default is a member too
    assert queue.persistence_mode == "persistent"  # a StrEnum member equals its XML text
    assert write_element(queue, "queue").attrib == {"name": "q", "persistence-mode": "persistent"}
    assert format_value(PersistenceMode.NON_PERSISTENT) == "non_persistent"

    with pytest.raises(
        ValueError,
        match="persistence-mode: expected one of 'as_message', 'persistent', 'non_persistent', found 'PERSISTENT'",
    ):
        reader.structure({"name": "q", "persistence-mode": "PERSISTENT"}, QueueConfig)

    # Constructing with the value string converts to the member; anything else is refused.
    assert QueueSettings(consumer_mode="exclusive").consumer_mode is ConsumerMode.EXCLUSIVE  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected one of 'shared', 'exclusive', 'activestandby', found 3"):
        QueueSettings(consumer_mode=3)  # type: ignore[arg-type]

    # The management tree parses text and accepts members; values and changes are members.
    tree = Tree(EventBus(), QueueSettings())
    change = tree.set("/", "consumer-mode", "activestandby")
    assert change.new is ConsumerMode.ACTIVESTANDBY and change.old is ConsumerMode.SHARED
    tree.set("/", "persistence-mode", PersistenceMode.NON_PERSISTENT)
    assert tree.root.config.persistence_mode is PersistenceMode.NON_PERSISTENT
    assert tree.root.describe("consumer-mode").choices == ("shared", "exclusive", "activestandby")
    with pytest.raises(ManagementError, match="expected one of 'shared', 'exclusive', 'activestandby', found 'both'"):
        tree.set("/", "consumer-mode", "both")


def test_a_plain_enum_with_string_values_works_too():
    class Plain(Enum):
        A = "a"
        B = "b"

    holder = declare(Plain, prop(Plain.A, choices=Plain, description="d"), "Holder")
    meta = attrs.fields(holder)[0].metadata["martinet"]
    assert parse_value(Plain, meta, "b") is Plain.B
    assert holder(max_messages="b").max_messages is Plain.B
    assert write_element(holder(max_messages=Plain.B), "holder").attrib == {"max-messages": "b"}
