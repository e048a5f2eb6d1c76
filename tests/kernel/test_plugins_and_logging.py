"""Plugin loading errors, packaging of the built-ins, and router-tagged log files."""

from __future__ import annotations

import logging
import tomllib

import attrs
import pytest
import trio

from martinet.kernel import PluginError, Router, SwiftletSpec, config_class, hookimpl, load_swiftlet_specs, prop

from tests.harness import probe_plugin
from tests.harness.paths import ROOT


@config_class
@attrs.frozen(kw_only=True)
class Empty:
    pass


@config_class
@attrs.frozen(kw_only=True)
class Clashing:
    pools: str = prop("", description="reserved by the kernel")


def plugin(*specs):
    class Plugin:
        @hookimpl
        def martinet_swiftlets(self):
            return list(specs)

    return Plugin()


def spec(name: str, config=Empty, **kwargs) -> SwiftletSpec:
    return SwiftletSpec(name=name, description="", config=config, factory=lambda c: None, **kwargs)


def test_builtin_swiftlets_come_from_the_entry_point_group():
    specs = load_swiftlet_specs()
    assert specs["sys$log"].factory.__module__ == "martinet.swiftlets.log.handler"


def test_two_plugins_claiming_one_name_is_an_error():
    with pytest.raises(PluginError, match="swiftlet 'sys\\$log' is provided by both .* and "):
        load_swiftlet_specs([plugin(spec("sys$log"))])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (spec("a b"), "a swiftlet name must be non-empty"),
        (spec("x$y", config=dict), "config must be a @config_class"),
        (spec("x$y", config=Clashing), "config may not declare \\['pools'\\]"),
        ("not a spec", "not a SwiftletSpec"),
    ],
)
def test_bad_declarations_are_errors(bad, message):
    with pytest.raises(PluginError, match=message):
        load_swiftlet_specs([plugin(bad)])


def test_a_hook_with_a_typo_fails_loudly():
    class Typo:
        @hookimpl
        def martinet_swiftletz(self):
            return []

    with pytest.raises(Exception, match="unknown hook 'martinet_swiftletz'"):
        load_swiftlet_specs([Typo()])


def test_every_package_folder_is_packaged_and_every_swiftlet_registered():
    """A folder missing from pyproject would work in a checkout and vanish from the wheel."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = set(pyproject["tool"]["setuptools"]["packages"])
    entry_points = set(pyproject["project"]["entry-points"]["martinet.swiftlets"].values())
    for top in ("kernel", "messaging", "swiftlets"):
        for init in (ROOT / top).rglob("__init__.py"):
            assert ".".join(("martinet", *init.parent.relative_to(ROOT).parts)) in packages, init
    for folder in (ROOT / "swiftlets").iterdir():
        if "def martinet_swiftlets" in ((folder / "__init__.py").read_text() if folder.is_dir() else ""):
            assert f"martinet.swiftlets.{folder.name}" in entry_points
    assert (ROOT / "conf" / "router.xml").exists() and "martinet.kernel.conf" in packages


async def test_each_router_logs_to_its_own_file(write_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative log file paths resolve against the start directory
    routers = [
        Router.from_file(
            write_config(
                f'<router name="{name}" startorder="sys$log test$a">'
                f'<swiftlet name="sys$log" logfile="{name}.log" level="DEBUG"/></router>',
                f"{name}.xml",
            ),
            plugins=[probe_plugin],
        )
        for name in ("paris", "tokyo")
    ]
    root_level = logging.getLogger().level
    async with trio.open_nursery() as nursery:
        for router in routers:
            await nursery.start(router.run)
        assert logging.getLogger().level == logging.DEBUG  # what the files want comes through
        logging.getLogger("app").warning("hello from %s", "outside")  # no router: in no file
        paris, tokyo = routers
        paris.management.set("/sys$log", "level", "ERROR")  # live change
        logging.getLogger("swiftlet.test$a").warning("not written: below ERROR")
        for router in routers:
            router.request_stop()
    assert logging.getLogger().level == root_level  # the process's other routers log as before
    for name in ("paris", "tokyo"):
        lines = (tmp_path / f"{name}.log").read_text().splitlines()
        assert lines and all(f"[{name}]" in line for line in lines)
        assert any("swiftlet test$a started" in line for line in lines)
        assert not any("hello from outside" in line for line in lines)
    paris_log = (tmp_path / "paris.log").read_text()
    # test$a stops before sys$log (reverse order), so its INFO line reaches the file
    # unless the level was raised, as it was for paris.
    assert "swiftlet test$a stopped" not in paris_log
    assert "swiftlet test$a stopped" in (tmp_path / "tokyo.log").read_text()
    info_lines = [line for line in paris_log.splitlines() if line.split()[2] == "INFO"]
    assert len(info_lines) >= 3 and paris.management.get("/sys$log/usage", "info-records") == len(info_lines)
