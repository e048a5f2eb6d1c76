"""The AMQP engine alone, per message: µs per incoming transfer, outgoing transfer, and settle.

    .venv/bin/python bench/engine_bench.py [--messages N] [--rounds R]

No socket and no router: one :class:`~martinet.messaging.amqp.Connection` (server side)
is fed bytes and asked for bytes, so the figures are the engine's own per-message cost.

- *incoming*: N transfers as python-qpid-proton writes them (captured once from a proton
  client transport; 100-byte payloads, unsettled, handle and delivery id in proton's
  encodings), fed to a fresh engine in 64 KiB reads; the link's handler only counts. This
  is the frame loop's transfer fast path.
- *outgoing*: ``Link.send`` of N 100-byte messages within the peer's credit, then one
  ``data_to_send``.
- *settle*: ``Link.settle(id, ACCEPTED)`` of the N incoming deliveries in order (batched into
  ranged dispositions), then one ``data_to_send``.
- *outcome*: the peer's ranged disposition accepting all N outgoing deliveries (one frame:
  the engine walks the range and calls ``on_outcome`` N times).

Each figure is the best of ``--rounds`` rounds (a fresh engine per round; set-up not timed),
divided by N.
"""

from __future__ import annotations

import argparse
import gc
import struct
import time

import proton

from martinet.messaging import amqp
from martinet.messaging.codec import Described, UInt, ULong, encode

PAYLOAD = b"\x00\x53\x77\xa1\x64" + b"x" * 100  # an amqp-value string of 100 characters
READ = 65536


class Counter:
    """A link handler that only counts (the cheapest possible owner)."""

    def __init__(self) -> None:
        self.transfers = self.outcomes = 0

    def on_transfer(self, delivery_id: int, payload: bytes, settled: bool, state: object) -> None:
        self.transfers += 1

    def on_outcome(self, delivery_id: int, state: object, settled: bool) -> None:
        self.outcomes += 1


def frame(code: int, fields: list, channel: int = 0) -> bytes:
    body = b"\x00\x53" + bytes([code]) + encode(fields)
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def capture_proton_transfers(count: int) -> tuple[bytes, bytes]:
    """What a proton client writes: (header, open, begin and attach; then ``count`` transfers)."""
    engine = amqp.Connection(container_id="bench")
    transport = proton.Transport(proton.Transport.CLIENT)
    client = proton.Connection()
    client.container = "client"
    transport.bind(client)
    client.open()
    session = client.session()
    session.open()
    sender = session.sender("in")
    sender.target.address = "q"
    sender.open()
    written: list[bytes] = []

    def pump() -> None:
        while True:
            moved = False
            pending = transport.pending()
            if pending > 0:
                data = transport.peek(pending)
                transport.pop(pending)
                written.append(data)
                engine.receive_data(data)
                moved = True
            answer(engine, count)
            data = engine.data_to_send()
            if data:
                transport.push(data)
                moved = True
            if not moved:
                return

    pump()
    assert sender.credit == count, sender.credit
    prefix = b"".join(written)
    written.clear()
    for n in range(count):
        sender.delivery(str(n))
        sender.send(PAYLOAD)
        sender.advance()
    while (pending := transport.pending()) > 0:
        written.append(transport.peek(pending))
        transport.pop(pending)
    return prefix, b"".join(written)


def answer(engine: amqp.Connection, credit: int) -> amqp.Link | None:
    """The server's side: open, answer attaches, grant ``credit`` to a receiving link."""
    attached = None
    events, engine.events = engine.events, []
    for event in events:
        if isinstance(event, amqp.ConnectionOpened):
            engine.open()
        elif isinstance(event, amqp.LinkAttached):
            link = attached = event.link
            link.source, link.target = link.remote_source, link.remote_target
            link.handler = Counter()
            link.attach()
            if not link.is_sender:
                link.flow(credit)
    return attached


def receiving_engine(prefix: bytes, count: int) -> tuple[amqp.Connection, amqp.Link]:
    engine = amqp.Connection(container_id="bench")
    engine.receive_data(prefix)
    link = None
    while engine.events:  # the open first: the begin and attach after it wait for ours
        link = answer(engine, count) or link
    assert link is not None
    engine.data_to_send()
    return engine, link


def sending_engine(count: int) -> tuple[amqp.Connection, amqp.Link]:
    engine = amqp.Connection(container_id="bench")
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["peer"]))
    answer(engine, 0)
    source = amqp.Terminus(kind=amqp.SOURCE, address="q").described()
    engine.receive_data(
        frame(0x11, [None, UInt(0), UInt(0x7FFFFFFF), UInt(0xFFFFFFFF)])
        + frame(0x12, ["out", UInt(0), True, None, None, source, None])
    )
    link = answer(engine, 0)
    assert link is not None
    engine.receive_data(
        frame(0x13, [UInt(0), UInt(0x7FFFFFFF), UInt(0), UInt(0x7FFFFFFF), UInt(0), UInt(0), UInt(count)])
    )
    engine.data_to_send()
    assert link.credit == count
    return engine, link


def best(rounds: int, setup, timed) -> float:
    times = []
    for _ in range(rounds):
        state = setup()
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            timed(*state)
            times.append(time.perf_counter() - start)
        finally:
            gc.enable()
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args()
    count = options.messages
    prefix, transfers = capture_proton_transfers(count)
    chunks = [transfers[at : at + READ] for at in range(0, len(transfers), READ)]

    def receive(engine: amqp.Connection, link: amqp.Link) -> None:
        for chunk in chunks:
            engine.receive_data(chunk)
        assert link.handler.transfers == count and not engine.events

    def send(engine: amqp.Connection, link: amqp.Link) -> None:
        for _ in range(count):
            link.send(PAYLOAD)
        engine.data_to_send()

    def settle_setup() -> tuple[amqp.Connection, amqp.Link]:
        engine, link = receiving_engine(prefix, count)
        receive(engine, link)
        return engine, link

    def settle(engine: amqp.Connection, link: amqp.Link) -> None:
        for delivery_id in range(count):
            link.settle(delivery_id, amqp.ACCEPTED)
        engine.data_to_send()

    accepted = frame(0x15, [True, UInt(0), UInt(count - 1), True, Described(ULong(amqp.ACCEPTED_CODE), [])])

    def outcome_setup() -> tuple[amqp.Connection, amqp.Link]:
        engine, link = sending_engine(count)
        send(engine, link)
        return engine, link

    def outcome(engine: amqp.Connection, link: amqp.Link) -> None:
        engine.receive_data(accepted)
        assert link.handler.outcomes == count

    figures = {
        "incoming transfer": best(options.rounds, lambda: receiving_engine(prefix, count), receive),
        "outgoing transfer": best(options.rounds, lambda: sending_engine(count), send),
        "settle (ranged disposition out)": best(options.rounds, settle_setup, settle),
        "outcome (ranged disposition in)": best(options.rounds, outcome_setup, outcome),
    }
    print(f"{count} messages of {len(PAYLOAD)} bytes, best of {options.rounds} rounds:")
    for name, seconds in figures.items():
        print(f"  {name:34} {seconds / count * 1e6:6.3f} µs")


if __name__ == "__main__":
    main()
