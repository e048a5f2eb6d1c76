"""The router the benchmarks run: a config text, its store in a temporary folder."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from martinet.kernel import Router


async def accept_all(consumer: Any, count: int) -> None:
    """Take and accept ``count`` deliveries from a queue-manager consumer, waiting only when none is ready."""
    for _ in range(count):
        try:
            entry = consumer.receive_nowait()
        except trio.WouldBlock:
            entry = await consumer.receive()
        consumer.accept(entry)


@asynccontextmanager
async def running_router(config: str, **values: str) -> AsyncIterator[Router]:
    """Start a router from ``config`` (``{path}`` becomes a temporary folder); stop it after."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "router.xml"
        path.write_text(config.format(path=folder, **values))
        router = Router.from_file(path)
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            try:
                yield router
            finally:
                router.request_stop()
