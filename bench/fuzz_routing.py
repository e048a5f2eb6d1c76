"""Structure-aware fuzzing of the routing listener with mutated recordings of real router links.

    .venv/bin/python bench/fuzz_routing.py [--cases N] [--seed S] [--concurrency C] [--case K | --first K]

1. **Record.** Routers in this process: ``hub``, the one attacked (its routing listener
   without a password, so that a recorded link replays past the handshake: with one, the
   proof answers the hub's fresh nonce and a replay stops at AUTH, the part that
   ``tests/swiftlets/routing/test_hostile.py`` covers), ``friend``, a healthy neighbour
   linked to it, and ``fz00``, whose connector to the hub goes through a recording proxy.
   Twice, once with an XA link and once without: ``fz00`` connects, announces its route to
   its neighbour ``fzfar``, sends 10 persistent and 10 non-persistent messages to
   ``fzq@hub`` in routing transactions, and withdraws the route; the proxy keeps what
   ``fz00`` wrote, write by write, and whether the hub answered before the next write.
2. **Mutate.** Each case takes one recording, split into the magic and the frames (4-byte
   length and a msgpack ``[type, fields]``), and applies one to three mutations: a value in
   the decoded frame replaced by one of another type or a hostile one (huge and negative
   integers, long strings, deep nesting, floats, maps, the wrong frame type code); a length
   field changed; a frame truncated, dropped, repeated or spliced in from the other
   recording; bytes flipped.
3. **Replay** each case against the hub's routing listener as
   ``bench/fuzz_sessions.py`` does (waiting, bounded, where the hub answered; then
   half-close and read until the hub closes). Cases played at once use the peer names
   ``fz01``, ``fz02``, … (the recorded ``fz00`` replaced in the bytes: same length, so no
   length field changes) and source addresses ``127.0.0.2``, ``127.0.0.3``, … of their
   own: one peer name is one link at a time, and the listener allows 4 handshakes under way
   per address. A replay never commits what the hub lists in its XA recovery, and the hub
   closes a link that leaves transactions in doubt: before a peer name's next case, what it
   left in doubt beyond 3 is rolled back, as an operator would.

Checked: no log record carries a traceback and none is at ERROR or above; a consumer on the
hub (our client) drains ``fzq`` all along (the replayed transactions deliver messages there)
and must not fail on any message the hub let in; every 25
cases and at the end friend's link to the hub is still up and a message from a client of
``friend`` to ``fz-check@hub`` arrives through it; the process's RSS before and after is
printed. A case that freezes the event loop for 30 s aborts the run (a watchdog thread prints
the case and exits). The CI slice is ``tests/swiftlets/routing/test_fuzz_slice.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import random
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness, bench

from bench._fuzz import Chunk, Watch, leaf, mutated_case, play, record_through_proxy, report, rss_mb, tidy  # noqa: E402
from martinet.messaging.client import DeliveryMode, Queue, TextMessage, connect  # noqa: E402
from martinet.swiftlets.xa.api import XAError  # noqa: E402

from tests.harness.network import Network  # noqa: E402
from tests.harness.polling import wait_until  # noqa: E402

RECORDED = "fz00"  # the recorded peer's name; a case's own name has the same length
MAGIC = b"MARTINET"


# -- recording -----------------------------------------------------------------------------------


async def _send(url: str, address: str, count: int, mode: DeliveryMode, prefix: str) -> None:
    async with connect(url) as connection, connection.session() as session:
        async with session.producer(Queue(address), delivery_mode=mode) as producer:
            for n in range(count):
                message = TextMessage(f"{prefix}{n}")
                message.properties["n"] = n
                await producer.send(message)


async def record(network: Network, drained: list[int]) -> list[list[Chunk]]:
    """The two recorded links (XA, then non-XA) of ``fz00`` to the hub. ``fz00`` has a
    neighbour ``fzfar`` while it is linked, so it announces a route and withdraws it."""
    sessions = []
    fz = network.routers[RECORDED].management
    for xa in (True, False):
        before = drained[0]
        network.connect(RECORDED, "fzfar")
        await wait_until(lambda: network.table(RECORDED).get("fzfar") == 1, 30, "the link to fzfar")

        async def link(proxy_port: int, xa: bool = xa, before: int = before) -> None:
            attributes = {"hostname": "127.0.0.1", "port": str(proxy_port), "use-xa": str(xa).lower()}
            fz.add("/sys$routing/connectors", "hub", attributes)
            await wait_until(lambda: network.table("hub").get("fzfar") == 2, 30, "the hub's route to fzfar")
            url = network.url(RECORDED)
            await _send(url, "fzq@hub", 10, DeliveryMode.PERSISTENT, "p")
            await _send(url, "fzq@hub", 10, DeliveryMode.NON_PERSISTENT, "n")
            await wait_until(lambda: drained[0] >= before + 20, 30, "the 20 messages at the hub")
            fz.remove("/sys$routing/connectors", "fzfar")
            await wait_until(lambda: "fzfar" not in network.table("hub"), 30, "the route's withdrawal")
            fz.remove("/sys$routing/connectors", "hub")
            await wait_until(lambda: RECORDED not in network.table("hub"), 30, "the hub forgetting fz00")

        sessions.append(await record_through_proxy(network.routing_port("hub"), link))
    return sessions


# -- frames and mutations ------------------------------------------------------------------------


def units(data: bytes) -> list[bytes]:
    """``data`` split into the magic and frames (a cut remainder is one unit)."""
    found, offset = [], 0
    while offset < len(data):
        if data[offset : offset + len(MAGIC)] == MAGIC:
            size = len(MAGIC)
        else:
            size = 4 + int.from_bytes(data[offset : offset + 4], "big") if offset + 4 <= len(data) else 0
            size = size if 4 < size <= len(data) - offset else len(data) - offset
        found.append(data[offset : offset + size])
        offset += size
    return found


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


HOSTILE_INTS = [0, -1, 1, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, 255, 65536]


def hostile_value(rng: random.Random) -> Any:
    """A msgpack value of a random type, often a nasty one."""
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice(HOSTILE_INTS)
    if kind == 1:
        return rng.choice(["", "x" * rng.choice([1, 300, 70_000]), "\u0000", "rt$hub", "%@hub", "fz00", "hub"])
    if kind == 2:
        return rng.choice([b"", b"\x00" * rng.choice([1, 40, 70_000]), os.urandom(16)])
    if kind == 3:
        return rng.choice([None, True, False, 1.5, float("nan"), float("inf")])
    if kind == 4:
        return [rng.choice(["hub", "fz00", 1, None])] * rng.choice([0, 1, 3, 65, 5000])
    if kind == 5:
        return {rng.choice(["add", "path", "x", "", 1]): rng.choice([None, [], {}, "hub"])}
    if kind == 6:
        value: Any = "deep"
        for _ in range(rng.choice([2, 50, 200, 2000])):
            value = [value] if rng.random() < 0.5 else {"k": value}
        return value
    if kind == 7:
        return msgpack.ExtType(rng.randrange(-128, 128), os.urandom(rng.choice([0, 1, 8])))
    if kind == 8:
        return rng.randrange(-1000, 1000)
    return ["hub", RECORDED, "friend"][rng.randrange(3)]


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, list):
        for i, item in enumerate(value[:50]):
            found += _paths(item, (*path, i))
    elif isinstance(value, dict):
        for key in list(value)[:50]:
            found += _paths(value[key], (*path, key))
    return found


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [_replace(item, rest, new) if i == head else item for i, item in enumerate(value)]
    return {key: _replace(item, rest, new) if key == head else item for key, item in value.items()}


def mutate_tree(frame: bytes, rng: random.Random) -> bytes | None:
    """A value in the decoded ``[type, fields]`` replaced (the type code included)."""
    try:
        tree = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
    except Exception:
        return None
    path = rng.choice(_paths(tree))
    try:
        body = msgpack.packb(_replace(tree, path, hostile_value(rng)), use_bin_type=True)
    except (ValueError, OverflowError):  # (nesting beyond msgpack's own limit)
        return None
    return framed(body)


def mutate_length(frame: bytes, rng: random.Random) -> bytes | None:
    if len(frame) < 5:  # (a unit an earlier mutation cut short)
        return None
    size = len(frame) - 4
    return struct.pack(">I", rng.choice([0, 1, size - 1, size + 1, 2**31, 2**32 - 1, 65536])) + frame[4:]


def mutate_truncate(frame: bytes, rng: random.Random) -> bytes | None:
    short = frame[: rng.randrange(4, max(len(frame), 5))]
    return framed(short[4:]) if rng.random() < 0.7 else short


def mutate_bytes(frame: bytes, rng: random.Random) -> bytes | None:
    if len(frame) <= 4:
        return None
    data = bytearray(frame)
    for _ in range(rng.choice([1, 2, 4])):
        data[rng.randrange(4, len(data))] = rng.randrange(256)
    return bytes(data)


FRAME_MUTATIONS = [mutate_tree, mutate_tree, mutate_tree, mutate_length, mutate_truncate, mutate_bytes]


def make_case(sessions: list[list[Chunk]], rng: random.Random) -> tuple[list[Chunk], list[str]]:
    """A mutated copy of one recorded link, and what was done to it."""
    return mutated_case(
        sessions,
        rng,
        units=units,
        is_frame=lambda unit: unit != MAGIC,
        mutations=FRAME_MUTATIONS,
        labels=("XA link", "non-XA link"),
    )


IN_DOUBT_KEPT = 3  # a peer's transactions the hub may hold in doubt before its next case


async def resolve_in_doubt(manager: Any, xa: Any, peer: str) -> None:
    """Roll back what ``peer``'s cases left in doubt at the hub once there are more than
    :data:`IN_DOUBT_KEPT`, as an operator would. A replayed link never commits what the
    hub lists in recovery, and the hub closes a link that leaves any in doubt: without this,
    each peer name would soon replay nothing past the recovery. Below the bound, cases still
    meet a recovery that lists xids."""
    in_doubt = [xid for xid in manager.prepared_transactions() if xid.startswith(f"routing:{peer}:hub:")]
    if len(in_doubt) > IN_DOUBT_KEPT:
        for xid in in_doubt:
            with contextlib.suppress(XAError):  # resolved meanwhile
                await xa.rollback(xid)


def peer_name(slot: int) -> str:
    return f"fz{slot + 1:02d}"


def as_peer(chunks: list[Chunk], slot: int) -> list[Chunk]:
    """A case under the peer name of ``slot`` (``fz01``…: the length of the recorded one)."""
    name = peer_name(slot).encode()
    return [(data.replace(RECORDED.encode(), name), answered) for data, answered in chunks]


# -- running -------------------------------------------------------------------------------------


async def drain(
    url: str, count: list[int], failures: list[str], *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Consume ``fzq`` for as long as the run lasts, counting in ``count[0]``. Our client
    failing on a message the hub let in is a finding (in ``failures``): it connects again,
    up to 20 times."""
    started = False
    while True:
        try:
            async with connect(url) as connection, connection.session() as session:
                async with session.consumer(Queue("fzq")) as consumer:
                    if not started:
                        task_status.started()
                        started = True
                    while True:
                        if await consumer.receive(1) is not None:
                            count[0] += 1
        except Exception as exc:
            failures.append(f"the consumer of fzq failed: {leaf(exc)}")
            if len(failures) > 20:
                raise


async def friend_check(network: Network, number: int) -> None:
    """friend's link to the hub is up, and a message from friend's client arrives at the hub."""
    with trio.fail_after(30):
        await wait_until(lambda: network.table("friend").get("hub") == 1, 30, "friend's link to the hub")
        await _send(network.url("friend"), "fz-check@hub", 1, DeliveryMode.PERSISTENT, f"check {number}-")
        async with connect(network.url("hub")) as connection, connection.session() as session:
            async with session.consumer(Queue("fz-check")) as consumer:
                got = await consumer.receive(20)
    assert got is not None and got.text == f"check {number}-0", got


async def fuzz(
    cases: int,
    seed: int,
    *,
    concurrency: int = 1,
    only: int | None = None,
    first: int = 0,
    out: Any = print,
) -> dict[str, Any]:
    """Run ``cases`` seeded cases against a hub started here, ``concurrency`` at a time (a case
    is the same whatever the concurrency: they are made one after the other from the seed);
    with ``only``, case ``only`` alone; with ``first``, the cases from ``first`` on (those
    before are made, not played). The findings."""
    rng = random.Random(seed)
    drained = [0]
    client_failures: list[str] = []
    with Watch() as watch, tempfile.TemporaryDirectory() as folder:
        async with trio.open_nursery() as nursery:
            network = Network(nursery, Path(folder))
            # the hub's listener leaves XA to the connector (either side asking makes an XA link)
            await network.start_routers("hub", reject_disconnect_delay=1000, listener={"use_xa": False})
            await network.start_routers("friend", RECORDED, "fzfar")
            network.connect("friend", "hub")
            await network.settle({"friend": {"hub": 1}, "hub": {"friend": 1}})
            await nursery.start(drain, network.url("hub"), drained, client_failures)
            sessions = await record(network, drained)
            await network.stop(RECORDED)
            await network.stop("fzfar")
            await friend_check(network, -1)
            watch.problems.found.clear()
            port = network.routing_port("hub")
            manager = network.routers["hub"].swiftlet("sys$queuemanager")
            baseline = set(manager.queues)
            before, began = rss_mb(), time.monotonic()
            slots_send, slots = trio.open_memory_channel[int](concurrency)
            for slot in range(concurrency):
                slots_send.send_nowait(slot)

            xa = network.routers["hub"].swiftlet("sys$xa")

            async def one(number: int, slot: int, chunks: list[Chunk]) -> None:
                watch.problems.playing.add(number)
                try:
                    await resolve_in_doubt(manager, xa, peer_name(slot))
                    await play(port, as_peer(chunks, slot), local_address=f"127.0.0.{2 + slot}")
                finally:
                    watch.problems.playing.discard(number)
                    slots_send.send_nowait(slot)

            async with trio.open_nursery() as playing:
                for number in range(cases if only is None else only + 1):
                    chunks, done = make_case(sessions, rng)
                    if only is not None and number != only or number < first:
                        if number % 1000 == 0:  # (made, not played: the router and clients go on meanwhile)
                            watch.beat(f"making case {number}")
                            await trio.sleep(0)
                        continue
                    slot = await slots.receive()
                    watch.playing(number, done, concurrency)
                    playing.start_soon(one, number, slot, chunks)
                    if number % 25 == 24:
                        watch.beat()
                        await friend_check(network, number)
                    if number % 10_000 == 9_999:  # a long run shows it is alive, its RSS and findings
                        deleted = await tidy(network.routers["hub"], baseline)
                        held = f"{len(manager.queues)} queues, {len(manager.prepared_transactions())} prepared"
                        watch.progress(out, number + 1, began, client_failures, f"{deleted}, {held}")
            watch.beat()
            await friend_check(network, cases)
            after = rss_mb()
            crashes = watch.findings() + [([], [], line) for line in client_failures]
            nursery.cancel_scope.cancel()
    run = 1 if only is not None else cases - first
    report(out, run, seed, concurrency, crashes, (before, after))
    out(f"messages the replayed transactions delivered to fzq: {drained[0] - 40}")
    return {"cases": run, "crashes": crashes, "rss_before": before, "rss_after": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8, help="cases played at once (1 to 99)")
    parser.add_argument("--case", type=int, help="play only this case of the seed (to replay a finding)")
    parser.add_argument(
        "--first", type=int, default=0, help="play the cases from this one on (made, not played, before)"
    )
    args = parser.parse_args()
    if not 1 <= args.concurrency <= 99:
        parser.error("--concurrency must be 1 to 99 (each case at once has a loopback address and a 2-digit peer name)")
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
