"""A seeded slice of ``bench/fuzz_routing.py``: mutated recordings of a real XA and non-XA
router link replayed against a hub's routing listener, 8 at a time."""

from __future__ import annotations

import importlib.util

from tests.harness.paths import ROOT


def _fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_routing", ROOT / "bench" / "fuzz_routing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_a_seeded_slice_of_the_routing_frame_fuzzer():
    """300 cases of seed 1 (the first 30 used to find malformed routed messages logged as the
    router's own ERROR, not as the peer's bad input): none logs a traceback or an ERROR,
    friend's link to the hub carries a message every 25 cases, RSS grows by less than 50 MB."""
    lines: list[str] = []
    result = await _fuzzer().fuzz(300, seed=1, concurrency=8, out=lines.append)
    assert result["cases"] == 300
    assert not result["crashes"], "\n".join(lines)
    assert result["rss_after"] - result["rss_before"] < 50, lines
