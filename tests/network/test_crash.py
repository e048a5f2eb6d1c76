"""Crash safety: a router killed with SIGKILL at random moments under load, then restarted.

Every commit it acknowledged must be there; no transaction may be there in part.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import trio

from martinet.kernel import Router

from tests.harness.paths import HARNESS

ROUNDS = int(os.environ.get("MARTINET_CRASH_ROUNDS", "6"))
CONFIG = """<router name="crash" startorder="sys$store sys$queuemanager">
  <swiftlet name="sys$store" path="{store}" sync="full"/>
</router>"""


def run_and_kill(config: Path, run: int, delay: float) -> list[str]:
    """Start the writer, kill -9 it ``delay`` seconds after it is ready; its output lines."""
    out = config.parent / "writer.out"
    with out.open("wb") as stdout:
        command = [sys.executable, str(HARNESS / "crash_writer.py"), str(config), str(run)]
        writer = subprocess.Popen(command, stdout=stdout, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while b"ready" not in out.read_bytes():
            assert writer.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.02)
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
    finally:
        if writer.poll() is None:
            writer.kill()
    lines = out.read_text().splitlines()
    return lines[:-1] if lines and not out.read_text().endswith("\n") else lines  # drop a torn last line


async def test_kill_9_at_random_points_loses_nothing_acknowledged(tmp_path):
    config = tmp_path / "router.xml"
    config.write_text(CONFIG.format(store=tmp_path / "store"))
    rng = random.Random(1234)
    acknowledged_txns: set[str] = set()
    acknowledged_sends: set[int] = set()
    for run in range(ROUNDS):
        lines = await trio.to_thread.run_sync(run_and_kill, config, run, rng.uniform(0.2, 1.2))
        acknowledged_txns |= {line.split()[1] for line in lines if line.startswith("txn ")}
        acknowledged_sends |= {int(line.split()[1]) for line in lines if line.startswith("send ")}
        router = Router.from_file(config)
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            queue_manager = router.swiftlet("sys$queuemanager")
            counts = {
                name: Counter(e.message.application_properties["txn"] for e in queue_manager.queue(name).browse())
                for name in ("a", "b")
            }
            for txn in set(counts["a"]) | set(counts["b"]):
                assert (counts["a"][txn], counts["b"][txn]) == (3, 2), f"transaction {txn} is there in part"
            missing = acknowledged_txns - set(counts["a"])
            assert not missing, f"acknowledged transactions lost: {sorted(missing)[:5]}"
            # Sends to c: the consumer accepted the odd ones, so only the even ones must stay.
            present = {e.message.application_properties["id"] for e in queue_manager.queue("c").browse()}
            lost = {n for n in acknowledged_sends if n % 2 == 0} - present
            assert not lost, f"acknowledged sends lost: {sorted(lost)[:5]}"
            router.request_stop()
    assert len(acknowledged_txns) > 10 * ROUNDS and acknowledged_sends  # the load was real
