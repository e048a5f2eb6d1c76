"""How long sys$scheduler's next-start computation takes (pure, no router): prints µs per
call for typical plans and for the worst case, a calendar that allows one day in four years
(the search walks day by day up to eight years ahead).

    .venv/bin/python bench/scheduler_bench.py
"""

from __future__ import annotations

import time
from datetime import datetime

from martinet.swiftlets.scheduler.timing import Calendar, next_start, parse_time_expression

BUSINESS = Calendar(weekdays=frozenset(range(5)))
HOLIDAYS = Calendar(include=False, annual_days=frozenset({(12, 25), (12, 26), (1, 1)}), base=BUSINESS)
CASES = [
    ("at 22:00, every day", "at 22:00", None),
    ("window 1 s delay, every day", "start 00:00 stop 00:00 delay 1s", None),
    ("at 22:00, holidays on business days", "at 22:00", HOLIDAYS),
    ("at 08:00, only 29 February (worst case)", "at 08:00", Calendar(annual_days=frozenset({(2, 29)}))),
]


def main() -> None:
    after = datetime(2026, 3, 1, 12, 0, 0)
    for label, text, calendar in CASES:
        expression = parse_time_expression(text)
        allows = calendar.allows if calendar is not None else None
        calls, began = 0, time.perf_counter()
        while time.perf_counter() - began < 0.5:
            next_start(expression, after, allows=allows)
            calls += 1
        print(f"{label:45s} {1e6 * (time.perf_counter() - began) / calls:10.1f} µs per next start")


if __name__ == "__main__":
    main()
