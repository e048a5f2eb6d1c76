"""Shared test helpers: config files in temp dirs, routers with the probe plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from kernel import Router, load_swiftlet_specs

import probe_plugin

ROOT = Path(__file__).resolve().parent.parent
ECHO_PLUGIN = ROOT / "examples" / "plugins" / "martinet-echo"


def drain(subscription) -> list:
    """Every event buffered in a bus subscription, without waiting."""
    got = []
    while True:
        try:
            got.append(subscription.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return got


@pytest.fixture
def write_config(tmp_path):
    """Write XML text to a file in the test's temp dir and return its path."""

    def write(text: str, name: str = "router.xml") -> Path:
        path = tmp_path / name
        path.write_text(text.strip() + "\n")
        return path

    return write


@pytest.fixture
def make_router(write_config):
    """A Router from XML text, with the probe swiftlets test$a … test$e available."""

    def make(text: str) -> Router:
        return Router.from_file(write_config(text), plugins=[probe_plugin])

    return make


@pytest.fixture
def probe_specs():
    return load_swiftlet_specs([probe_plugin])


@pytest.fixture(scope="session")
def echo_site(tmp_path_factory) -> Path:
    """The example plugin pip-installed (for real, from its own pyproject) into a folder.

    Putting the folder on sys.path (or PYTHONPATH) makes its entry point visible; without
    it the plugin is not installed, so each test decides which world it runs in.
    """
    target = tmp_path_factory.mktemp("echo-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--disable-pip-version-check", "--target", str(target), str(ECHO_PLUGIN)],
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
        timeout=300,
    )
    return target
