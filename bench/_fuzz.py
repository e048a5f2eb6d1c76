"""What the fuzzers share (``fuzz_sessions.py``, ``fuzz_routing.py``): recording what a client
writes through a proxy, replaying a case, and watching a run: log records with a traceback or
at ERROR and above, a watchdog for a frozen event loop, the report."""

from __future__ import annotations

import ctypes
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import trio

Chunk = tuple[bytes, bool]  # what the client wrote, and whether the router answered before its next write
FROZEN_AFTER = 30.0  # seconds without progress of the event loop that end a run


async def record_through_proxy(port: int, run_client: Any) -> list[Chunk]:
    """Run ``run_client(proxy_port)`` against a recording proxy in front of ``port``; the
    client's writes of its first connection."""
    chunks: list[list] = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy_port = listeners[0].socket.getsockname()[1]

    async def handle(client: trio.SocketStream) -> None:
        mine: list[list] = [] if chunks else chunks  # only the first connection is recorded
        async with client, await trio.open_tcp_stream("127.0.0.1", port) as server:

            async def upstream() -> None:
                while data := await client.receive_some(65536):
                    mine.append([data, False])
                    await server.send_all(data)
                await server.send_eof()

            async def downstream() -> None:
                while data := await server.receive_some(65536):
                    if mine:
                        mine[-1][1] = True
                    try:
                        await client.send_all(data)
                    except trio.BrokenResourceError:
                        return
                nursery.cancel_scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(upstream)
                nursery.start_soon(downstream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        await run_client(proxy_port)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    return [(bytes(data), answered) for data, answered in chunks]


async def play(port: int, chunks: list[Chunk], *, local_address: str | None = None) -> None:
    """Send a case as recorded (from ``local_address``, a loopback address), waiting
    (bounded) for an answer where the router answered the client; then half-close and read
    until the router closes (bounded)."""
    with trio.move_on_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local_address)
        async with stream:
            try:
                for data, answered in chunks:
                    if data:
                        await stream.send_all(data)
                    if answered:
                        with trio.move_on_after(0.5):
                            if not await stream.receive_some(65536):
                                return
                await stream.send_eof()
                while await stream.receive_some(65536):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


Mutation = Callable[[bytes, random.Random], "bytes | None"]


def mutated_case(
    sessions: list[list[Chunk]],
    rng: random.Random,
    *,
    units: Callable[[bytes], list[bytes]],
    is_frame: Callable[[bytes], bool],
    mutations: Sequence[Mutation],
    labels: Sequence[str],
) -> tuple[list[Chunk], list[str]]:
    """A mutated copy of one of two recorded ``sessions`` (``labels`` name them), and what
    was done to it: one to three times, a frame (a unit of ``units`` that ``is_frame``) is
    dropped, repeated, joined by one of the other session, or changed by one of
    ``mutations`` (None: it cannot change that one)."""
    session = rng.randrange(len(sessions))
    chunks = [(units(data), answered) for data, answered in sessions[session]]
    done = [labels[session]]
    frames = [(c, u) for c, (found, _) in enumerate(chunks) for u, unit in enumerate(found) if is_frame(unit)]
    for _ in range(rng.choice([1, 1, 2, 3])):
        if not frames:
            break
        c, u = rng.choice(frames)
        unit = chunks[c][0][u]
        if rng.random() < 0.12:  # whole frames: drop, repeat, splice from the other session
            action = rng.randrange(3)
            if action == 0:
                chunks[c][0][u] = b""
                done.append(f"drop {c}.{u}")
            elif action == 1:
                chunks[c][0][u] = unit * rng.choice([2, 50])
                done.append(f"repeat {c}.{u}")
            else:
                other = [x for data, _ in sessions[1 - session] for x in units(data) if is_frame(x)]
                chunks[c][0][u] = unit + rng.choice(other)
                done.append(f"splice into {c}.{u}")
            continue
        mutation = rng.choice(mutations)
        changed = mutation(unit, rng) if unit else None  # (a unit an earlier mutation emptied)
        if changed is not None:
            chunks[c][0][u] = changed
            done.append(f"{mutation.__name__.removeprefix('mutate_')} {c}.{u}")
    return [(b"".join(found), answered) for found, answered in chunks], done


class Problems(logging.Handler):
    """Log records with a traceback or at ERROR and above, each with the cases that were
    being played when it was written (log records are written in the router's thread, which
    is the one that plays the cases)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[tuple[logging.LogRecord, list[int]]] = []
        self.playing: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.found.append((record, sorted(self.playing)))


def leaf(exc: BaseException | None) -> str:
    """The first exception inside (nested) exception groups, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {str(exc)[:120]}" if exc is not None else "?"


def rss_mb() -> float:
    """The process's RSS in MB, once the C heap has handed back what it holds free
    (glibc's ``malloc_trim``: a freed buffer stays in the process otherwise, and RSS then
    rises with fragmentation, not with what the router keeps)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS as it is
        pass
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Watch:
    """One run's watch, as a ``with`` block: the :class:`Problems` handler on the root logger,
    and a watchdog thread that ends the process (exit status 3, the case named) when the
    event loop makes no progress for :data:`FROZEN_AFTER` seconds (a case that froze it).
    The cases that may still be playing keep their descriptions for the report."""

    def __init__(self) -> None:
        self.problems = Problems()
        self.descriptions: dict[int, list[str]] = {}
        self._heartbeat = (time.monotonic(), "recording")
        self._stop = threading.Event()
        self._told = 0  # findings printed by progress()

    def beat(self, what: str | None = None) -> None:
        self._heartbeat = (time.monotonic(), what or self._heartbeat[1])

    def playing(self, number: int, done: list[str], concurrency: int) -> None:
        """Case ``number`` (its mutations ``done``) starts."""
        self.descriptions[number] = done
        self.beat(f"case {number}: {', '.join(done)}")
        if len(self.descriptions) > 4 * concurrency:  # (only those that may still be playing)
            for old in [n for n in self.descriptions if n < number - 2 * concurrency]:
                del self.descriptions[old]

    def findings(self) -> list[tuple[list[int], list[str], str]]:
        """Each problem logged: the cases playing then, their mutations, the line."""
        found = []
        for record, numbers in self.problems.found:
            line = record.getMessage().splitlines()[0][:200]
            kind = leaf(record.exc_info[1]) if record.exc_info else record.levelname
            found.append((numbers, [d for n in numbers for d in self.descriptions.get(n, [])], f"{kind}: {line}"))
        return found

    def progress(self, out: Any, cases: int, began: float, more: Sequence[str] = (), state: str = "") -> None:
        """A long run's line every so many cases (cases, seconds since ``began``, findings,
        RSS, allocated blocks, and ``state``: what the router holds that could explain a
        growing RSS), and each finding new since the last line, so that a run stopped early
        still says what it found. ``more``: findings of the run's own (one line each)."""
        found = self.findings() + [([], [], line) for line in more]
        took = time.monotonic() - began
        # the interpreter's allocated blocks: what Python objects hold, apart from how the
        # heaps lay them out (RSS can creep with fragmentation while this stays flat)
        blocks = sys.getallocatedblocks()
        out(
            f"{cases} cases, {took:.0f} s, findings {len(found)}, RSS {rss_mb():.1f} MB, {blocks:,} blocks"
            f"{state and ', '}{state}"
        )
        for numbers, done, line in found[self._told :]:
            out(f"  case(s) {numbers} [{'; '.join(done)}]: {line}")
        self._told = len(found)

    def _watchdog(self) -> None:
        while not self._stop.wait(1):
            since, what = self._heartbeat
            if time.monotonic() - since > FROZEN_AFTER:
                print(
                    f"FROZEN: the event loop made no progress for {FROZEN_AFTER:.0f} s in {what}",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(3)

    def __enter__(self) -> Watch:
        logging.getLogger().addHandler(self.problems)
        threading.Thread(target=self._watchdog, daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        logging.getLogger().removeHandler(self.problems)


async def tidy(router: Any, keep: set[str]) -> str:
    """Delete the queues the cases made (all but ``keep``), and purge those in ``keep``, as
    an operator would: routing's ``rt$…`` queues aside (routing removes them itself). A
    hostile client may leave queues and messages behind as any client may: state the router
    must keep, not a leak. Done every so many cases, so that RSS at the progress lines shows
    what the router keeps by itself. What was done, in words."""
    manager = router.swiftlet("sys$queuemanager")
    names = [name for name in list(manager.queues) if not name.startswith("rt$")]
    deleted = held = 0
    for name in names:
        queue = manager.queues.get(name)
        if queue is None:
            continue
        if name in keep:
            said = await router.management.invoke(f"/sys$queuemanager/usage/queues/{name}", "purge")
            held += int(said.split()[0])  # "N messages purged from q"
        else:
            held += queue.size
            deleted += 1
            manager.delete_queue(name, quiet=True)
    return f"{deleted} queues deleted, {held} messages removed"


def report(out: Any, run: int, seed: int, concurrency: int, crashes: list, rss: tuple[float, float]) -> None:
    out(f"cases run: {run} (seed {seed}, {concurrency} at a time); crashes found: {len(crashes)}")
    for numbers, done, line in crashes[:20]:
        out(f"  case(s) {numbers} [{'; '.join(done)}]: {line} (replay one alone with --case)")
    before, after = rss
    out(f"RSS before {before:.1f} MB, after {after:.1f} MB ({after - before:+.1f} MB)")
