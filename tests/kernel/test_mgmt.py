"""The management tree: validate → offer (veto) → commit → notify; entity lists; usage; save."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import pytest
import trio

from martinet.kernel import (
    EntityAdded,
    EntityRemoved,
    EventBus,
    ManagementError,
    PropertyChanged,
    Tree,
    Usage,
    Veto,
    config_class,
    entity,
    entity_list,
    load_config,
    prop,
)
from martinet.kernel.config import to_xml

from tests.harness.polling import drain


@config_class
@attrs.frozen(kw_only=True)
class ListenerConfig:
    name: str = prop(description="Listener name.")
    port: int = prop(4001, min=1, max=65535, description="TCP port.")
    bind_address: str = prop("0.0.0.0", description="Interface.", reboot_required=True)


@config_class
@attrs.frozen(kw_only=True)
class LimitsConfig:
    max_connections: int = prop(-1, min=-1, description="-1: unlimited.")


@config_class
@attrs.frozen(kw_only=True)
class ServerConfig:
    enabled: bool = prop(True, description="On or off.")
    version: str = prop("1", read_only=True, description="Read only.")
    limits: LimitsConfig = entity(LimitsConfig, description="Limits.")
    listeners: Mapping[str, ListenerConfig] = entity_list(
        ListenerConfig,
        item="listener",
        description="Listeners.",
        default=[ListenerConfig(name="plain")],
    )


@pytest.fixture
def tree():
    return Tree(EventBus(), ServerConfig())


async def test_set_validates_offers_commits_and_notifies(tree):
    offered = []
    tree.root.on_change(offered.append)
    watcher = tree.bus.subscribe(PropertyChanged)
    change = tree.set("/", "enabled", "false")
    assert (change.old, change.new, change.reboot_required) == (True, False, False)
    assert offered == [change]
    assert tree.get("/", "enabled") is False
    assert drain(watcher) == [PropertyChanged(path="/", name="enabled", old=True, new=False)]
    tree.set("/limits", "max-connections", 10)  # typed values are accepted too
    assert tree.root.snapshot().limits.max_connections == 10


async def test_veto_keeps_the_old_value_and_notifies_nobody(tree):
    def refuse(change):
        if change.new > 100:
            raise Veto("at most 100 connections on this box")

    tree.entity("/limits").on_change(refuse)
    watcher = tree.bus.subscribe(PropertyChanged)
    with pytest.raises(
        ManagementError,
        match="/limits: property 'max-connections': change refused: at most 100 connections on this box",
    ):
        tree.set("/limits", "max-connections", "500")
    assert tree.get("/limits", "max-connections") == -1
    assert drain(watcher) == []


@pytest.mark.parametrize(
    ("path", "name", "value", "message"),
    [
        ("/listeners/plain", "port", "0", "expected a value between 1 and 65535, found 0"),
        ("/listeners/plain", "port", "http", "expected an integer, found 'http'"),
        ("/", "enabled", "yes", "expected 'true' or 'false', found 'yes'"),
        ("/", "enabled", 1, "expected 'true' or 'false', found 1"),
        ("/", "version", "2", "property 'version' is read-only"),
        ("/", "colour", "red", "no property 'colour'; expected one of: enabled, version"),
        ("/nowhere", "x", "1", "no 'nowhere' under /; there is: limits, listeners"),
        ("/listeners", "port", "1", "/listeners is an entity list, not a config entity"),
    ],
)
def test_bad_changes_are_refused_clearly(tree, path, name, value, message):
    with pytest.raises(ManagementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tree.set(path, name, value)


def test_reboot_required_changes_commit_without_asking_the_owner(tree):
    offered = []
    listener = tree.entity("/listeners/plain")
    listener.on_change(offered.append)
    change = tree.set("/listeners/plain", "bind-address", "127.0.0.1")
    assert change.reboot_required and offered == []
    assert listener.get("bind-address") == "127.0.0.1"


async def test_entity_lists_replay_then_add_and_remove_through_one_path(tree):
    seen = []

    def on_add(entity):
        if entity.get("port") == 25:
            raise Veto("port 25 is for mail")
        seen.append(("add", entity.name, entity.get("port")))

    def on_remove(entity):
        if entity.name == "plain":
            raise Veto("the plain listener stays")
        seen.append(("remove", entity.name))

    listeners = tree.entity_list("/listeners")
    listeners.bind(on_add, on_remove)
    assert seen == [("add", "plain", 4001)]  # the configured entry came through on_add
    watcher = tree.bus.subscribe()
    tree.add("/listeners", "tls", {"port": "5671"})
    with pytest.raises(ManagementError, match="cannot add 'smtp': refused: port 25 is for mail"):
        tree.add("/listeners", "smtp", {"port": "25"})
    with pytest.raises(ManagementError, match="cannot add 'tls': it exists already"):
        tree.add("/listeners", "tls")
    with pytest.raises(ManagementError, match="cannot add 'x': port: expected an integer"):
        tree.add("/listeners", "x", {"port": "many"})
    with pytest.raises(ManagementError, match="cannot add 'y': colour: unknown attribute"):
        tree.add("/listeners", "y", {"colour": "red"})
    with pytest.raises(ManagementError, match="cannot remove 'plain': refused: the plain listener stays"):
        tree.remove("/listeners", "plain")
    tree.remove("/listeners", "tls")
    with pytest.raises(ManagementError, match="no entry 'tls'"):
        tree.remove("/listeners", "tls")
    assert seen[1:] == [("add", "tls", 5671), ("remove", "tls")]
    assert drain(watcher) == [
        EntityAdded(path="/listeners", name="tls"),
        EntityRemoved(path="/listeners", name="tls"),
    ]
    assert list(tree.root.snapshot().listeners) == ["plain"]


def test_bind_fails_when_a_present_entry_is_vetoed(tree):
    def refuse(entity):
        raise Veto("no listeners allowed")

    with pytest.raises(ManagementError, match="/listeners/plain: refused: no listeners allowed"):
        tree.entity_list("/listeners").bind(refuse)


def test_usage_is_read_only_and_live(tree):
    counter = {"n": 0}
    usage = tree.root.children["usage"] = Usage("/usage", lambda: dict(counter))
    connections = usage.add_list("connections")
    connections.add("c1", lambda: {"peer": "paris"})
    counter["n"] = 5
    assert tree.get("/usage", "n") == 5
    assert tree.get("/usage/connections/c1", "peer") == "paris"
    with pytest.raises(ManagementError, match="/usage is usage \\(read-only\\), not a config entity"):
        tree.set("/usage", "n", 1)
    connections.remove("c1")
    with pytest.raises(ManagementError, match="no 'c1' under /usage/connections"):
        tree.resolve("/usage/connections/c1")


ROUTER_XML = """
<router name="r1" startorder="test$a test$b sys$log">
  <swiftlet name="test$a" note="configured">
    <pools><pool name="a.wide" max-concurrency="8"/></pools>
  </swiftlet>
  <swiftlet name="test$c" fail="start"/>
</router>
"""


def test_router_tree_has_settings_swiftlets_pools_and_usage(make_router):
    router = make_router(ROUTER_XML)
    tree = router.management
    assert tree.get("/", "name") == "r1"
    assert tree.get("/test$a", "note") == "configured"
    assert tree.get("/test$a/pools/a.wide", "max-concurrency") == 8
    assert tree.get("/test$a/pools/a.serial", "max-concurrency") == 1  # declared default
    assert tree.get("/test$c", "fail") == "start"  # configured, not started: kept for save
    assert tree.get("/usage", "name") == "r1"
    assert tree.get("/usage/swiftlets/test$a", "state") == "stopped"


async def test_set_veto_watch_save_reload_round_trip(make_router, probe_specs, tmp_path):
    router = make_router(ROUTER_XML)
    path = router.config_path
    original_text = path.read_text()
    watcher = router.bus.subscribe(PropertyChanged)
    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        tree = router.management
        tree.set("/test$b", "note", "changed at runtime")
        tree.set("/test$a/pools/a.serial", "max-concurrency", "3")  # resizes the live pool
        assert tree.get("/test$a/usage/pools/a.serial", "max-concurrency") == 3
        tree.set("/sys$log", "level", "DEBUG")
        tree.set("/", "shutdown-timeout", "2500")
        with pytest.raises(ManagementError, match="pools are declared by swiftlet test\\$a"):
            tree.remove("/test$a/pools", "a.wide")
        with pytest.raises(ManagementError, match="declares no pool 'a.extra'"):
            tree.add("/test$a/pools", "a.extra")
        live = router.snapshot()
        saved = router.save()
        router.request_stop()
    assert [(e.path, e.name) for e in drain(watcher)] == [
        ("/test$b", "note"),
        ("/test$a/pools/a.serial", "max-concurrency"),
        ("/sys$log", "level"),
        ("/", "shutdown-timeout"),
    ]
    assert saved == path
    assert (tmp_path / "router.xml.1").read_text() == original_text  # the backup
    reloaded = load_config(path, probe_specs)
    assert reloaded == live
    assert reloaded.swiftlets["test$b"].config.note == "changed at runtime"
    # Sparse: defaults are not written.
    text = path.read_text()
    assert "cleanup-ms" not in text and "a.wide" in text and "queue-size" not in text
    assert 'shutdown-timeout="2500"' in text and 'level="DEBUG"' in text


def test_save_keeps_rotated_backups(make_router, tmp_path):
    router = make_router('<router name="r1" config-backups="3"/>')
    for n in range(6):
        router.management.set("/", "shutdown-timeout", str(1000 + n))
        router.save()
    backups = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("router.xml."))
    assert backups == ["router.xml.1", "router.xml.2", "router.xml.3"]
    assert 'shutdown-timeout="1004"' in (tmp_path / "router.xml.1").read_text()
    assert 'shutdown-timeout="1002"' in (tmp_path / "router.xml.3").read_text()
    assert not list(tmp_path.glob(".*saving"))


def test_saved_text_is_sparse_and_readable(probe_specs, write_config):
    config = load_config(write_config('<router name="r1" startorder="test$a sys$log"/>'), probe_specs)
    assert to_xml(config, probe_specs).decode() == (
        "<?xml version='1.0' encoding='UTF-8'?>\n<router name=\"r1\" startorder=\"test$a sys$log\"/>\n"
    )


def test_save_needs_a_path_for_a_router_not_loaded_from_a_file(make_router):
    router = make_router('<router name="r1"/>')
    router.config_path = None
    with pytest.raises(ValueError, match="give a path"):
        router.save()


def test_declarations_are_visible_in_the_tree(tree):
    port = tree.entity("/listeners/plain").describe("port")
    assert (port.min, port.max, port.description, port.reboot_required) == (1, 65535, "TCP port.", False)
    assert tree.entity("/listeners/plain").describe("bind-address").reboot_required
    assert tree.root.entity_list("listeners") is tree.resolve("/listeners")
    with pytest.raises(ManagementError, match="/: no entity list 'limits'"):
        tree.root.entity_list("limits")


# -- operations on usage entities ----------------------------------------------------------------


@pytest.fixture
def with_operations(tree):
    """A usage list of jobs, each offering a sync ``reset`` and an async ``stop``."""
    from martinet.kernel import Parameter

    usage = tree.root.children["usage"] = Usage("/usage")
    jobs = usage.add_list("jobs")
    calls = []

    def add(name):
        entry = jobs.add(name, lambda: {"name": name})

        def reset():
            calls.append(("reset", name))
            return "done"

        async def stop(reason, force=False, grace=1):
            await trio.sleep(0)
            if reason == "no":
                raise Veto("not now")
            calls.append(("stop", name, reason, force, grace))
            jobs.remove(name)

        entry.add_operation("reset", reset, "Set the counters to zero.")
        entry.add_operation(
            "stop",
            stop,
            "Stop the job.",
            [
                Parameter(name="reason", description="Why, for the log."),
                Parameter(name="force", description="Do not wait.", type=bool, required=False, default=False),
                Parameter(name="grace", description="Seconds to wait.", type=int, required=False, default=1),
            ],
        )

    add("j1")
    add("j2")
    return calls


async def test_operations_are_data_invoked_through_the_tree(tree, with_operations):
    calls = with_operations
    ops = tree.operations("/usage/jobs/j1")
    assert list(ops) == ["reset", "stop"]
    assert ops["stop"].describe() == {
        "name": "stop",
        "description": "Stop the job.",
        "parameters": [
            {"name": "reason", "description": "Why, for the log.", "type": "str", "required": True, "default": None},
            {"name": "force", "description": "Do not wait.", "type": "bool", "required": False, "default": False},
            {"name": "grace", "description": "Seconds to wait.", "type": "int", "required": False, "default": 1},
        ],
    }
    assert tree.operations("/usage") == {}
    assert await tree.invoke("/usage/jobs/j1", "reset") == "done"  # a sync operation
    await tree.invoke("/usage/jobs/j1", "stop", reason="maintenance", force="true", grace="5")  # text parsed
    assert calls == [("reset", "j1"), ("stop", "j1", "maintenance", True, 5)]
    # the entry went away, and its operations with it
    with pytest.raises(ManagementError, match="no 'j1' under /usage/jobs; there is: j2"):
        await tree.invoke("/usage/jobs/j1", "reset")
    await tree.invoke("/usage/jobs/j2", "stop", reason="done")  # defaults
    assert calls[-1] == ("stop", "j2", "done", False, 1)


@pytest.mark.parametrize(
    ("path", "operation", "args", "message"),
    [
        ("/usage/jobs/j1", "restart", {}, "/usage/jobs/j1: no operation 'restart'; operations: reset, stop"),
        ("/usage", "reset", {}, "/usage: no operation 'reset'; operations: none"),
        (
            "/usage/jobs/j1",
            "stop",
            {},
            "/usage/jobs/j1: operation 'stop': argument 'reason' missing \\(Why, for the log.\\)",
        ),
        (
            "/usage/jobs/j1",
            "stop",
            {"reason": "x", "speed": 3},
            "operation 'stop': unknown argument\\(s\\) speed; parameters: reason, force, grace",
        ),
        ("/usage/jobs/j1", "stop", {"reason": "x", "grace": "soon"}, "argument 'grace': expected int, found 'soon'"),
        ("/usage/jobs/j1", "stop", {"reason": "x", "force": "yes"}, "argument 'force': expected 'true' or 'false'"),
        ("/usage/jobs/j1", "stop", {"reason": "no"}, "/usage/jobs/j1: operation 'stop' refused: not now"),
        ("/usage/jobs", "reset", {}, "/usage/jobs is a usage list; operations are on usage entities"),
        ("/listeners/plain", "reset", {}, "/listeners/plain is a config entity; operations are on usage entities"),
        ("/usage/nope", "reset", {}, "no 'nope' under /usage; there is: jobs"),
    ],
)
async def test_bad_invocations_are_refused_clearly(tree, with_operations, path, operation, args, message):
    with pytest.raises(ManagementError, match=message):
        await tree.invoke(path, operation, **args)
    assert with_operations == []  # nothing ran
