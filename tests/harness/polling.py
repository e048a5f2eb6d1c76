"""Waiting for what the code under test reaches in the background."""

from __future__ import annotations

from collections.abc import Callable

import trio


def drain(subscription) -> list:
    """Every event buffered in a bus subscription, without waiting."""
    got = []
    while True:
        try:
            got.append(subscription.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return got


async def wait_until(
    predicate: Callable[[], object], timeout: float = 10, what: str = "", *, step: float = 0.01
) -> None:
    """Poll ``predicate`` every ``step`` seconds (of trio's clock: virtual under
    ``autojump_clock``, where a coarser step spares iterations over hours) until it holds, for
    what the code under test reaches in the background (a settlement, a cleanup); fail the
    test after ``timeout`` seconds."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(step)
        return
    raise AssertionError(f"not within {timeout} s: {what or predicate.__doc__ or predicate}")
