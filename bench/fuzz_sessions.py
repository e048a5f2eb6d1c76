"""Structure-aware fuzzing of the AMQP listener with mutated recordings of real client sessions.

    .venv/bin/python bench/fuzz_sessions.py [--cases N] [--seed S] [--concurrency C] [--case K | --first K]

1. **Record.** A router runs in this process; a small trio proxy in front of its listener
   records what clients send, write by write, and whether the router answered before the
   client's next write. Two sessions: a proton client (python-qpid-proton, BlockingConnection:
   SASL, open, begin, attach with a selector, transfers with header, properties, application
   properties and annotations, disposition, detach, close) and ours
   (:mod:`martinet.messaging.client`: a producer and a consumer on a queue, a topic
   subscriber).
2. **Mutate.** Each case takes one recording, split into protocol headers and frames, and
   applies one to three mutations: a count or size field changed (0, 1, the size ± 1,
   255, 2**31, 2**32 - 1, …); a constructor replaced (zero-width ones and arrays
   included); a value of the decoded performative or message section nested in described
   values, lists or arrays (2 … 20 000 deep) or replaced with a value of another type; the
   frame header changed; a frame truncated, duplicated, dropped or spliced in from the
   other session; bytes flipped.
3. **Replay** each case against the live listener: each write is sent as recorded, and
   where the router answered the client, the replay waits (bounded) for an answer too; then
   it half-closes and reads until the router closes (bounded).

Checked: no log record carries a traceback and none is at ERROR or above; every 25 cases
and at the end a normal client (ours) still sends and receives through the router; the
process's RSS before and after is printed (the CI slice in tests/swiftlets/jms/test_hostile_decoding.py
bounds its growth). A case that freezes the event loop for 30 s aborts the run (a watchdog
thread prints the case and exits). Prints: cases run, crashes found (each with its case
number, mutations and the log line), RSS before and after.
"""

from __future__ import annotations

import argparse
import functools
import logging
import random
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: bench

from bench._fuzz import Chunk, Watch, mutated_case, play, record_through_proxy, report, rss_mb, tidy  # noqa: E402
from martinet.kernel import Router  # noqa: E402
from martinet.messaging.codec import (  # noqa: E402
    Array,
    Decimal,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    decode,
    encode,
    skip,
)

ROUTER = """<router name="fuzz" startorder="sys$store sys$queuemanager sys$topicmanager sys$jms">
  <swiftlet name="sys$store" path="{path}/store" sync="off"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="0" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""

# -- recording -----------------------------------------------------------------------------------


def _proton_session(port: int) -> None:
    from proton import Message
    from proton.reactor import Selector
    from proton.utils import BlockingConnection

    connection = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
    try:
        sender = connection.create_sender("fz-proton")
        for number in range(2):
            sender.send(
                Message(
                    body=f"proton {number}",
                    durable=True,
                    priority=7,
                    ttl=60,
                    id=f"id-{number}",
                    correlation_id=number,
                    subject="fuzz",
                    properties={"colour": "red", "n": number},
                    annotations={Symbol("x-opt-fuzz"): number},
                )
            )
        receiver = connection.create_receiver("fz-proton", options=Selector("colour = 'red'"))
        for _ in range(2):
            receiver.receive(timeout=10)
            receiver.accept()
        receiver.close()
        sender.close()
    finally:
        connection.close()


async def _our_session(port: int) -> None:
    from martinet.messaging.client import Queue, TextMessage, Topic, connect

    async with connect(f"amqp://127.0.0.1:{port}", client_id="fuzz-client") as connection:
        async with connection.session() as session:
            subscriber = await session.consumer(Topic("fz-topic"))
            await (await session.producer(Topic("fz-topic"))).send(TextMessage("to the topic"))
            producer = await session.producer(Queue("fz-ours"))
            message = TextMessage("ours")
            message.properties["size"] = 3
            await producer.send(message)
            await (await session.consumer(Queue("fz-ours"))).receive(timeout=10)
            await subscriber.receive(timeout=10)


async def record(port: int) -> list[list[Chunk]]:
    """The recorded client sessions against the listener on ``port``."""
    proton = await record_through_proxy(port, lambda proxy: trio.to_thread.run_sync(_proton_session, proxy))
    ours = await record_through_proxy(port, _our_session)
    return [proton, ours]


# -- units and mutations -------------------------------------------------------------------------


def units(data: bytes) -> list[bytes]:
    """``data`` split into protocol headers and frames (a cut remainder is one unit)."""
    found, offset = [], 0
    while offset < len(data):
        if data[offset : offset + 4] == b"AMQP":
            size = 8
        else:
            size = int.from_bytes(data[offset : offset + 4], "big") if offset + 4 <= len(data) else 0
            size = size if 8 <= size <= len(data) - offset else len(data) - offset
        found.append(data[offset : offset + size])
        offset += size
    return found


def constructors(buf: bytes, start: int) -> list[tuple[int, int]]:
    """(offset, constructor) of the values from ``start`` on, walking into described values,
    lists and maps (arrays are stepped over whole)."""
    found, offset = [], start
    while offset < len(buf) and len(found) < 500:
        code = buf[offset]
        found.append((offset, code))
        if code == 0x00:
            offset += 1
        elif code in (0xC0, 0xC1):
            offset += 3
        elif code in (0xD0, 0xD1):
            offset += 9
        else:
            try:
                offset = skip(buf, offset)
            except DecodeError:
                break
    return found


def with_size(frame: bytes) -> bytes:
    return len(frame).to_bytes(4, "big") + frame[4:]


INTERESTING = [0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 2**31 - 1, 2**31, 2**32 - 1]
CONSTRUCTORS = [
    0x00,
    0x40,
    0x41,
    0x42,
    0x43,
    0x44,
    0x45,
    0x50,
    0x52,
    0x53,
    0x56,
    0x60,
    0x70,
    0x71,
    0x72,
    0x73,
    0x80,
    0x81,
    0x82,
    0x83,
    0x94,
    0x98,
    0xA0,
    0xA1,
    0xA3,
    0xB0,
    0xB1,
    0xB3,
    0xC0,
    0xC1,
    0xD0,
    0xD1,
    0xE0,
    0xF0,
    0x01,
    0xFF,
]


def hostile_value(rng: random.Random) -> Any:
    """A value of a random type, often a nasty one."""
    kind = rng.randrange(14)
    if kind == 0:
        return [rng.randrange(5)] * rng.choice([0, 1, 3])
    if kind == 1:
        return {Symbol("k"): [1, {"x": None}]}
    if kind == 2:
        return Array(rng.choice([0x40, 0x41, 0x42, 0x43, 0x44, 0x45]), ())
    if kind == 3:
        return Described([1, 2], ["list as descriptor"])
    if kind == 4:
        return Described({"a": 1}, None)
    if kind == 5:
        return "s" * rng.choice([0, 1, 300, 70000])
    if kind == 6:
        return rng.choice([-1, -(2**63), 2**64 - 1, 2**32, 3])
    if kind == 7:
        return rng.choice([3.5, float("nan"), float("inf")])
    if kind == 8:
        return Decimal(0x94, bytes(16))
    if kind == 9:
        return Array(0xA3, (Symbol("a"), Symbol("b")))
    if kind == 10:
        return Array(0x70, (UInt(1), UInt(2)), ULong(0x28))
    if kind == 11:
        return Timestamp(rng.choice([-1, 2**62]))
    if kind == 12:
        return rng.choice([True, False, None, b"\x00" * 40, UByte(255)])
    return Described(ULong(rng.choice([0x23, 0x24, 0x25, 0x28, 0x29, 0x70, 0x73, 0x99])), [hostile_value(rng)])


def nested(value: Any, rng: random.Random) -> Any:
    depth = rng.choice([2, 30, 63, 65, 70, 200, 1200, 5000, 20000])
    how = rng.randrange(3)
    for _ in range(depth):
        if how == 0:
            value = Described(ULong(0x01), value)
        elif how == 1:
            value = [value]
        else:
            value = Described(value, None)  # the descriptor nested
    return value


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths (indexes into lists, ``"d"``/``"v"`` into described) of every node, shallow first."""
    found = [path]
    if len(path) > 6:
        return found
    if isinstance(value, Described):
        found += _paths(value.descriptor, path + ("d",)) + _paths(value.value, path + ("v",))
    elif isinstance(value, list):
        for index, item in enumerate(value[:16]):
            found += _paths(item, path + (index,))
    return found


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    step, rest = path[0], path[1:]
    if step == "d":
        return Described(_replace(value.descriptor, rest, new), value.value)
    if step == "v":
        return Described(value.descriptor, _replace(value.value, rest, new))
    copy = list(value)
    copy[step] = _replace(copy[step], rest, new)
    return copy


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value.descriptor if step == "d" else value.value if step == "v" else value[step]
    return value


def mutate_tree(frame: bytes, rng: random.Random) -> bytes | None:
    """Decode the frame's performative (or, in a transfer, a message section), change one
    node (nest it, or replace it with another type), encode it again."""
    body = frame[8:] if len(frame) > 8 and frame[4] == 2 else b""
    try:
        performative, after = decode(body)
    except DecodeError:
        return None
    payload = body[after:]
    target, section_at = performative, None
    if payload and rng.random() < 0.5:  # a transfer's message: one of its sections
        sections, offset = [], 0
        try:
            while offset < len(payload):
                value, end = decode(payload, offset)
                sections.append((offset, end, value))
                offset = end
        except DecodeError:
            sections = []
        if sections:
            section_at = rng.randrange(len(sections))
            target = sections[section_at][2]
    paths = _paths(target)
    path = rng.choice(paths)
    old = _get(target, path)
    new = nested(old, rng) if rng.random() < 0.4 else hostile_value(rng)
    try:
        changed = encode(_replace(target, path, new))
    except (TypeError, ValueError, OverflowError, RecursionError, struct.error):
        return None
    if section_at is None:
        body = changed + payload
    else:
        start, end, _ = sections[section_at]
        body = encode(performative) + payload[:start] + changed + payload[end:]
    return with_size(frame[:8] + body)


def mutate_count(frame: bytes, rng: random.Random) -> bytes | None:
    found = [
        (at, code)
        for at, code in constructors(frame, 8)
        if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0)
    ]
    if not found:
        return None
    at, code = rng.choice(found)
    width = 4 if code & 0xF0 in (0xB0, 0xD0, 0xF0) else 1
    field = at + 1 + (width if code & 0xF0 in (0xC0, 0xD0, 0xE0, 0xF0) and rng.random() < 0.6 else 0)
    if field + width > len(frame):
        return None
    current = int.from_bytes(frame[field : field + width], "big")
    value = rng.choice(INTERESTING + [current + 1, max(current - 1, 0), current * 2 + 1]) % (256**width)
    return frame[:field] + value.to_bytes(width, "big") + frame[field + width :]


def mutate_constructor(frame: bytes, rng: random.Random) -> bytes | None:
    found = constructors(frame, 8)
    if not found:
        return None
    at, _ = rng.choice(found)
    return frame[:at] + bytes([rng.choice(CONSTRUCTORS)]) + frame[at + 1 :]


def mutate_header(frame: bytes, rng: random.Random) -> bytes | None:
    field = rng.randrange(4)
    if field == 0:
        return rng.choice([0, 7, 8, 9, len(frame) - 1, len(frame) + 1, 2**31]).to_bytes(4, "big") + frame[4:]
    if field == 1:
        return frame[:4] + bytes([rng.choice([0, 1, 3, 255])]) + frame[5:]
    if field == 2:
        return frame[:5] + bytes([rng.choice([1, 2, 255])]) + frame[6:]
    return frame[:6] + rng.choice([1, 255, 65535]).to_bytes(2, "big") + frame[8:]


def mutate_truncate(frame: bytes, rng: random.Random) -> bytes | None:
    cut = rng.randrange(8, max(len(frame), 9))
    short = frame[:cut]
    return with_size(short) if rng.random() < 0.7 else short


def mutate_bytes(frame: bytes, rng: random.Random) -> bytes | None:
    data = bytearray(frame)
    for _ in range(rng.choice([1, 2, 4])):
        at = rng.randrange(8 if len(data) > 8 else 0, len(data))
        data[at] = rng.randrange(256)
    return bytes(data)


FRAME_MUTATIONS = [
    mutate_tree,
    mutate_tree,
    mutate_count,
    mutate_count,
    mutate_constructor,
    mutate_header,
    mutate_truncate,
    mutate_bytes,
]


def make_case(sessions: list[list[Chunk]], rng: random.Random) -> tuple[list[Chunk], list[str]]:
    """A mutated copy of one recorded session, and what was done to it."""
    return mutated_case(
        sessions,
        rng,
        units=units,
        is_frame=lambda unit: unit[:4] != b"AMQP" and len(unit) >= 8,
        mutations=FRAME_MUTATIONS,
        labels=("session 0", "session 1"),
    )


# -- running -------------------------------------------------------------------------------------


async def normal_client(port: int, number: int) -> None:
    from martinet.messaging.client import Queue, TextMessage, connect

    with trio.fail_after(15):
        async with connect(f"amqp://127.0.0.1:{port}") as connection:
            async with connection.session() as session:
                await (await session.producer(Queue("fz-check"))).send(TextMessage(f"check {number}"))
                got = await (await session.consumer(Queue("fz-check"))).receive(timeout=10)
                assert got is not None and got.text == f"check {number}", got


async def checked(router: Router, watch: Watch, port: int, number: int) -> None:
    """:func:`normal_client`; if it fails, what the router held then and the cases playing
    are printed before the run ends."""
    try:
        await normal_client(port, number)
    except (AssertionError, trio.TooSlowError):
        queue = router.management.entity("/sys$queuemanager/usage/queues/fz-check").properties()
        memory = router.management.entity("/sys$queuemanager/usage").properties()
        playing = sorted(watch.problems.playing)
        print(
            f"the normal client failed after case {number}: fz-check {queue}; {memory}; playing {playing}", flush=True
        )
        raise


async def fuzz(
    cases: int,
    seed: int,
    *,
    concurrency: int = 1,
    only: int | None = None,
    first: int = 0,
    out: Any = print,
) -> dict[str, Any]:
    """Run ``cases`` seeded cases against a router started here, ``concurrency`` at a time
    (each on a connection of its own; a case is the same whatever the concurrency: they are
    made one after the other from the seed); with ``only``, case ``only`` alone; with
    ``first``, the cases from ``first`` on (those before are made, not played). The findings."""
    rng = random.Random(seed)
    with Watch() as watch, tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "router.xml"
        path.write_text(ROUTER.format(path=folder))
        router = Router.from_file(path)
        async with trio.open_nursery() as nursery:
            await nursery.start(router.run)
            port = router.management.get("/sys$jms/usage/listeners/amqp", "port")
            sessions = await record(port)
            await normal_client(port, -1)
            watch.problems.found.clear()
            manager = router.swiftlet("sys$queuemanager")
            baseline = set(manager.queues)
            before, began = rss_mb(), time.monotonic()
            slots = trio.Semaphore(concurrency)

            async def one(number: int, chunks: list[Chunk]) -> None:
                watch.problems.playing.add(number)
                try:
                    await play(port, chunks)
                finally:
                    watch.problems.playing.discard(number)
                    slots.release()

            async with trio.open_nursery() as playing:
                for number in range(cases if only is None else only + 1):
                    chunks, done = make_case(sessions, rng)
                    if only is not None and number != only or number < first:
                        if number % 1000 == 0:  # (made, not played: the router and clients go on meanwhile)
                            watch.beat(f"making case {number}")
                            await trio.sleep(0)
                        continue
                    await slots.acquire()
                    watch.playing(number, done, concurrency)
                    playing.start_soon(one, number, chunks)
                    if number % 25 == 24 or number == cases - 1:
                        watch.beat()
                        await checked(router, watch, port, number)
                    if number % 10_000 == 9_999:  # a long run shows it is alive, its RSS and findings
                        deleted = await tidy(router, baseline)
                        watch.progress(out, number + 1, began, state=f"{deleted}, {len(manager.queues)} queues")
            await normal_client(port, cases)
            after = rss_mb()
            crashes = watch.findings()
            router.request_stop()
    run = 1 if only is not None else cases - first
    report(out, run, seed, concurrency, crashes, (before, after))
    return {"cases": run, "crashes": crashes, "rss_before": before, "rss_after": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1, help="cases played at once, each on its own connection")
    parser.add_argument("--case", type=int, help="play only this case of the seed (to replay a finding)")
    parser.add_argument(
        "--first", type=int, default=0, help="play the cases from this one on (made, not played, before)"
    )
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.INFO)  # the Problems handler sees every record
    started = time.monotonic()
    out = functools.partial(print, flush=True)
    result = trio.run(
        functools.partial(
            fuzz, args.cases, args.seed, concurrency=args.concurrency, only=args.case, first=args.first, out=out
        )
    )
    print(f"{time.monotonic() - started:.0f} s")
    sys.exit(1 if result["crashes"] else 0)


if __name__ == "__main__":
    main()
