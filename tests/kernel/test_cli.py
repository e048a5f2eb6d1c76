"""``martinet run`` and ``martinet check`` as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.paths import ECHO_PLUGIN
from tests.harness.processes import RouterProcess


@pytest.fixture
def run_router(tmp_path):
    started = []

    def start(*args: str, env: dict | None = None) -> RouterProcess:
        process = RouterProcess(list(args), tmp_path, env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_default_router_starts_and_stops_cleanly_on_signal(run_router, signum):
    router = run_router()
    router.wait_for("router router1 started")
    assert router.stop(signum) == 0
    text = router.text()
    assert f"router router1 stopping: {signal.Signals(signum).name} received" in text
    assert "INFO    [router1] kernel.router: swiftlet sys$log stopped" in text
    assert text.rstrip().endswith("router router1 stopped")
    # the default's management is open to loopback clients, and the log says so
    assert (
        "WARNING [router1] swiftlets.mgmt.service: management requests served on sys$mgmt without authentication: "
        "any client connected from a loopback address may manage this router, halt included"
    ) in text


def test_log_level_option(run_router, tmp_path):
    config = tmp_path / "r.xml"
    config.write_text(
        '<router name="edge" startorder="sys$log"><swiftlet name="sys$log" logfile="no/such/dir/edge.log"/></router>'
    )
    router = run_router(str(config), "--log-level", "warning")
    assert router.proc.wait(30) == 1
    text = router.text()
    assert "ERROR   [edge] kernel.router: swiftlet sys$log failed to start" in text
    assert "INFO" not in text


def test_a_swiftlet_failing_to_start_exits_1(run_router, tmp_path):
    config = tmp_path / "r.xml"
    config.write_text(
        '<router name="edge" startorder="sys$log"><swiftlet name="sys$log" logfile="no/such/dir/edge.log"/></router>'
    )
    router = run_router(str(config))
    assert router.proc.wait(30) == 1
    text = router.text()
    assert "swiftlet sys$log failed to start: FileNotFoundError" in text
    assert "router edge stopped: swiftlet sys$log failed to start" in text


def test_an_invalid_config_exits_2_before_starting(run_router, tmp_path):
    config = tmp_path / "r.xml"
    config.write_text('<router name="edge" startorder="sys$log sys$warp"/>')
    router = run_router(str(config))
    assert router.proc.wait(30) == 2
    [line] = router.text().strip().splitlines()
    assert line.startswith(
        f"{config}:1: /router[@name='edge']: attribute 'startorder': unknown swiftlet 'sys$warp'; installed: "
    )
    # the installed ones, sorted
    assert (
        "sys$log, sys$mgmt, sys$queuemanager, sys$routing, sys$scheduler, sys$spark, sys$store, "
        "sys$topicmanager, sys$web, sys$xa" in line
    )


def test_example_plugin_in_a_real_process(run_router, echo_site):
    router = run_router(str(ECHO_PLUGIN / "echo-router.xml"), env={"PYTHONPATH": str(echo_site)})
    router.wait_for("router echo1 started")
    router.wait_for("swiftlet.xt$echo: echo: RouterStarted(router='echo1')")
    assert router.stop(signal.SIGTERM) == 0


def test_log_file_holds_this_routers_records(run_router, tmp_path):
    config = tmp_path / "r.xml"
    config.write_text('<router name="edge" startorder="sys$log"><swiftlet name="sys$log" logfile="edge.log"/></router>')
    router = run_router(str(config))
    router.wait_for("router edge started")
    assert router.stop(signal.SIGTERM) == 0
    lines = (tmp_path / "edge.log").read_text().splitlines()
    assert lines and all("[edge]" in line for line in lines)
    assert any(line.endswith("kernel.router: router edge started") for line in lines)


def test_sighup_reboots_on_the_new_config_only_if_it_is_valid(run_router, tmp_path):
    config = tmp_path / "r.xml"
    config.write_text('<router name="edge" startorder="sys$log"/>')
    router = run_router(str(config))
    router.wait_for("router edge started")

    config.write_text('<router name="edge" startorder="sys$log sys$nope"/>')
    router.proc.send_signal(signal.SIGHUP)
    router.wait_for("SIGHUP received, but the config is not valid; still running on the old one")
    assert "unknown swiftlet 'sys$nope'" in router.text()

    # A reboot-required change (the log file) takes effect through the reboot.
    config.write_text(
        '<router name="edge" startorder="sys$log"><swiftlet name="sys$log" logfile="after-reboot.log"/></router>'
    )
    router.proc.send_signal(signal.SIGHUP)
    router.wait_for("router edge rebooting")
    deadline = time.monotonic() + 30
    while router.text().count("router edge started") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert router.text().count("router edge started") == 2
    assert router.stop(signal.SIGTERM) == 0
    assert "router edge started" in (tmp_path / "after-reboot.log").read_text()


def test_ctrl_c_to_the_process_group_stops_cleanly(tmp_path):
    """A terminal's Ctrl-C reaches the router and its store engine; the stop stays orderly."""
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:
        router = subprocess.Popen(
            [sys.executable, "-m", "martinet.kernel", "run"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while "router router1 started" not in log.read_text():
            assert router.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        os.killpg(router.pid, signal.SIGINT)
        assert router.wait(30) == 0, log.read_text()
        assert "swiftlet sys$store stopped" in log.read_text() and "failed" not in log.read_text()
    finally:
        if router.poll() is None:
            os.killpg(router.pid, signal.SIGKILL)


def test_version_option_prints_the_installed_version():
    from importlib.metadata import version

    result = subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, f"martinet {version('martinet')}\n", "")


def test_what_a_run_leaves_in_its_folder_is_ignored_by_git():
    # `martinet run` (store/), sys$spark (metrics/) and martinet-pipeline (analysis/) write
    # into the folder they run in: a clone's `git status` must stay clean after the tour
    from tests.harness.paths import ROOT

    paths = ["store/router1.sqlite", "metrics/router1/x.json", "analysis/report.html", "swiftlets/store/api.py"]
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == paths[:3]
