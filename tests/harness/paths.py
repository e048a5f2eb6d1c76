"""The repository's folders that tests read: examples, sample configs, bench scripts."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/harness/paths.py: the repository's top folder
ECHO_PLUGIN = ROOT / "examples" / "plugins" / "martinet-echo"
HARNESS = Path(__file__).resolve().parent  # crash_writer.py and sparkfaults/ run in child processes from here
