"""Real routers under faults for N rounds, then a results table.

Starts the routers of a topology as ``martinet run`` processes with a fault proxy on every
link (tests/harness/netharness.py), runs numbered producers and a verifying consumer, injects one
fault per round from a seeded schedule (SIGKILL of a router or of its store engine, link
cut, half-open link, delay, a store's disk filled to the last byte: that one needs root, to
mount a tmpfs per router), drains and prints what was sent, received, lost, duplicated
and in doubt. Exit status 1 if anything was lost, or (with XA) duplicated.

``--mode topics``: the producers publish to a topic instead, and every router has a durable
and a non-durable subscriber; the table has a row per subscriber. Exit status 1 if a durable
subscriber lost anything, or (with XA) any subscriber got a duplicate.

    .venv/bin/python bench/network_chaos.py --rounds 20 --topology triangle --xa
    .venv/bin/python bench/network_chaos.py --rounds 30 --topology chain --faults kill kill-store
    .venv/bin/python bench/network_chaos.py --rounds 10 --no-xa
    .venv/bin/python bench/network_chaos.py --rounds 20 --mode topics --faults kill kill-store cut
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the top folder: tests.harness

from tests.harness.netharness import FAULTS, TOPOLOGIES, Schedule, chaos, open_network  # noqa: E402


async def main(args: argparse.Namespace) -> int:
    schedule = Schedule(
        rounds=args.rounds,
        faults=tuple(args.faults),
        down=args.down,
        gap=args.gap,
        seed=args.seed,
        producers=args.producers,
        rate=args.rate,
        drain_timeout=args.drain_timeout,
        spare=tuple(args.spare),
        mode=args.mode,
    )
    with tempfile.TemporaryDirectory(prefix="network-chaos-") as scratch:
        folder = args.folder or scratch
        started = time.monotonic()
        results = None
        try:
            disks = "disk-full" in args.faults  # (each router's store on a tmpfs of its own: root)
            async with open_network(Path(folder), TOPOLOGIES[args.topology], xa=args.xa, disks=disks) as network:
                async with trio.open_nursery() as nursery:
                    # SIGTERM would end the process at once: the routers would run on, orphans,
                    # and the tmpfs disks stay mounted; a signal ends the run like its end does
                    nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
                    results = await chaos(network, schedule, lambda line: print(line, flush=True))
                    nursery.cancel_scope.cancel()
        finally:
            if args.keep_logs:
                Path(args.keep_logs).write_text(network.logs())
        if results is None:
            print("stopped by a signal: the routers are stopped and their disks unmounted; no results")
            return 130
        title = (
            f"{args.mode}, {args.topology}, {'XA' if args.xa else 'non-XA'}, seed {args.seed}, "
            f"{time.monotonic() - started:.0f} s"
        )
        print(results.table(title))
    return 1 if results.lost or (args.xa and results.duplicated) else 0


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="triangle")
    parser.add_argument(
        "--mode",
        choices=("queues", "topics"),
        default="queues",
        help="queues: producers send to a queue on the destination router; topics: they publish "
        "to a topic with a durable and a non-durable subscriber on every router",
    )
    parser.add_argument(
        "--xa",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="XA links (default); --no-xa sets use-xa=false on both ends of every link",
    )
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--spare", nargs="*", default=[], help="routers never killed")
    parser.add_argument("--down", type=float, default=1.0, help="seconds a fault lasts")
    parser.add_argument("--gap", type=float, default=2.0, help="seconds of traffic after each fault")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--producers", type=int, default=2, help="per source router")
    parser.add_argument("--rate", type=float, default=100.0, help="messages a second per producer (0: unlimited)")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--keep-logs", metavar="FILE", help="write every router's log here")
    parser.add_argument("--folder", help="run the routers in this (new) folder and keep it: stores and logs")
    sys.exit(trio.run(main, parser.parse_args()))
