"""The configuration reference (``docs/configuration.md``) is generated from the config
classes' declarations (:mod:`kernel.reference`): it must be what the code declares now."""

from __future__ import annotations

from martinet.kernel.reference import builtin_specs, config_reference

from tests.harness.paths import ROOT

PAGE = ROOT / "docs" / "configuration.md"


def test_the_committed_configuration_reference_is_what_the_declarations_say():
    assert PAGE.read_text() == config_reference(builtin_specs()), (
        "docs/configuration.md is stale: run .venv/bin/python -m martinet.kernel.reference docs/configuration.md"
    )


def test_the_reference_names_every_builtin_swiftlet_and_a_known_attribute_with_its_bounds():
    page = config_reference(builtin_specs())
    for name in ("sys$routing", "sys$jms", "sys$queuemanager", "sys$store", "sys$topicmanager", "sys$mgmt", "sys$web"):
        assert f"## `{name}`" in page
    assert "| `max-route-hops` | integer, 1 to 64 | `16` |" in page
    assert "### `sys$routing/connectors/connector`" in page
