"""Random and mutated byte streams thrown at a live AMQP listener; afterwards a normal client
must still be served. Each stream is sent and the socket half-closed; the router answers what
it read (everything it owes is written before it closes: a half-close loses nothing) and
then closes within bounded time (the listener's SASL timeout bounds a peer that stops
mid-frame)."""

from __future__ import annotations

import socket
import threading

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Message
from proton.utils import BlockingConnection

from martinet.kernel import Router
from martinet.messaging.amqp.wire import AMQP_HEADER, SASL_HEADER
from martinet.messaging.codec import Described, Symbol, ULong, decode, encode

CONFIG = """<router name="fuzz" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{store}" sync="off"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="0" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""


def frame(performative: int, fields: list, kind: int = 0) -> bytes:
    body = encode(Described(ULong(performative), fields))
    return (8 + len(body)).to_bytes(4, "big") + bytes([2, kind, 0, 0]) + body


# A valid client stream, unit by unit, with the number of pieces (headers and frames) of the
# router's reply that answer each unit: SASL header -> SASL header, sasl-mechanisms;
# sasl-init -> sasl-outcome, AMQP header; AMQP header -> nothing more; open -> open;
# begin -> begin; attach (a sender without target: the anonymous relay) -> attach, flow.
UNITS = [
    (SASL_HEADER, 2),
    (frame(0x41, [Symbol("ANONYMOUS"), b"x", None], kind=1), 2),
    (AMQP_HEADER, 0),
    (frame(0x10, ["fuzzer"]), 1),
    (frame(0x11, [None, 0, 100, 100]), 1),
    (frame(0x12, ["l", 0, False]), 2),
]
VALID = b"".join(unit for unit, _ in UNITS)
VALID_REPLY = ["SASL", 0x40, 0x44, "AMQP", 0x10, 0x11, 0x12, 0x13]  # what each piece of the reply is


def pieces(reply: bytes) -> list[tuple[object, bytes, list]]:
    """The router's reply split into protocol headers and whole frames, each as (the header's
    name or the frame's performative code, its bytes, its fields); a cut frame fails."""
    got, offset = [], 0
    while offset < len(reply):
        if reply[offset : offset + 4] == b"AMQP":
            header = reply[offset : offset + 8]
            assert header in (SASL_HEADER, AMQP_HEADER), f"unknown header {header!r}"
            got.append(("SASL" if header == SASL_HEADER else "AMQP", header, []))
            offset += 8
            continue
        size = int.from_bytes(reply[offset : offset + 4], "big")
        assert 8 <= size <= len(reply) - offset, f"a cut frame at offset {offset}: {reply[offset:]!r}"
        raw = reply[offset : offset + size]
        body = raw[raw[4] * 4 :]
        if body:
            performative, _ = decode(body)
            got.append((int(performative.descriptor), raw, performative.value))
        else:
            got.append(("empty", raw, []))
        offset += size
    return got


def answered(valid_reply: list, length: int) -> bytes:
    """The part of the reply to VALID that answers its first ``length`` bytes: the answers to
    the units wholly inside them."""
    count = end = 0
    for unit, answers in UNITS:
        end += len(unit)
        if end > length:
            break
        count += answers
    return b"".join(raw for _, raw, _ in valid_reply[:count])


LEAD_IN = len(SASL_HEADER) + len(UNITS[1][0]) + len(AMQP_HEADER)  # SASL, then the AMQP header


def expected(data: bytes, valid_reply: list) -> tuple[bytes | None, bytes]:
    """(the exact reply to ``data`` when it is determined, else None; what the reply starts with).

    A stream that leaves VALID in its AMQP frames is answered in part by the listener's
    handling of the events before the break, which the break can pre-empt when it arrives in
    the same read (a connection closed for a framing error does not answer an attach before
    it): only the answers to the lead-in are certain then."""
    first_difference = next(
        (n for n, (a, b) in enumerate(zip(data, VALID, strict=False)) if a != b), min(len(data), len(VALID))
    )
    head = data[:8]
    if not SASL_HEADER.startswith(head) and not AMQP_HEADER.startswith(head):
        return SASL_HEADER, SASL_HEADER  # not a protocol header: ours, then the socket closes
    if len(data) < 8:
        return b"", b""  # a header cut short: nothing to answer yet
    if head == AMQP_HEADER:
        return None, AMQP_HEADER  # no SASL: straight to the AMQP engine
    if first_difference == len(data):  # a prefix of VALID: exactly the answers to its whole units
        return answered(valid_reply, len(data)), answered(valid_reply, len(data))
    return None, answered(valid_reply, min(first_difference, LEAD_IN))


def well_formed(reply: bytes) -> None:
    """Whole frames; after the AMQP header an open comes first, and a close is the last
    thing written [2.4.1, 2.4.3]."""
    kinds = [kind for kind, _, _ in pieces(reply)]
    if "AMQP" in kinds:
        frames = [kind for kind in kinds[kinds.index("AMQP") + 1 :] if kind != "empty"]
        assert frames[:1] in ([], [0x10]), f"the first frame is not an open: {kinds}"
        assert 0x18 not in frames[:-1], f"frames after the close: {kinds}"


class LiveRouter:
    """A router running in its own thread (Hypothesis drives synchronous tests)."""

    def __init__(self, tmp_path):
        path = tmp_path / "router.xml"
        path.write_text(CONFIG.format(store=tmp_path / "store"))
        self.router = Router.from_file(path)
        self.started = threading.Event()
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.thread.start()
        assert self.started.wait(30), "the router did not start"
        self.port = self.router.management.get("/sys$jms/usage/listeners/amqp", "port")

    async def _main(self):
        self.token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.router.run)
            self.started.set()

    def stop(self):
        self.token.run_sync_soon(self.router.request_stop)
        self.thread.join(30)


@pytest.fixture
def live(tmp_path):
    router = LiveRouter(tmp_path)
    yield router
    router.stop()


def throw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.settimeout(45)  # longer than the listener's 30 s SASL timeout
        try:
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := raw.recv(65536):
                reply += chunk
        except (ConnectionResetError, BrokenPipeError):
            return b""
    return reply


streams = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda cut, junk: VALID[:cut] + junk, st.integers(0, len(VALID)), st.binary(max_size=40)),
    st.builds(
        lambda at, byte: VALID[:at] + bytes([byte]) + VALID[at + 1 :],
        st.integers(0, len(VALID) - 1),
        st.integers(0, 255),
    ),
)


def valid_reply(port: int) -> list:
    """The reply to VALID, checked piece by piece."""
    reply = pieces(throw(port, VALID))
    assert [kind for kind, _, _ in reply] == VALID_REPLY
    outcome, opened, attached = reply[2][2], reply[4][2], reply[6][2]
    assert outcome[0] == 0 and opened[0] == "martinet:fuzz" and attached[:3] == ["l", 0, True]
    return reply


def test_every_cut_of_a_valid_stream_gets_the_answers_to_its_whole_units(live):
    full = valid_reply(live.port)
    for length in range(len(VALID) + 1):
        assert throw(live.port, VALID[:length]) == answered(full, length), f"cut after {length} bytes"


def test_a_broken_frame_after_each_valid_frame_is_answered_by_a_close_written_last(live):
    full = valid_reply(live.port)
    ends = [LEAD_IN + sum(len(unit) for unit, _ in UNITS[3:n]) for n in range(3, len(UNITS) + 1)]
    for end in ends:
        reply = throw(live.port, VALID[:end] + b"\x00" * 8)  # a frame of size 0
        assert reply.startswith(answered(full, LEAD_IN)), f"after {end} bytes"
        well_formed(reply)
        kind, _, fields = pieces(reply)[-1]
        assert kind == 0x18 and fields[0].value[0] == "amqp:connection:framing-error", f"after {end} bytes"


def test_random_and_mutated_streams_then_a_normal_client(live):
    full = valid_reply(live.port)

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(streams)
    def fuzz(data):
        reply = throw(live.port, data)
        exact, start = expected(data, full)
        if exact is not None:
            assert reply == exact
        assert reply.startswith(start)
        well_formed(reply)

    fuzz()
    connection = BlockingConnection(f"amqp://127.0.0.1:{live.port}", timeout=10)
    connection.create_sender("after-fuzz").send(Message(body="still serving"))
    assert connection.create_receiver("after-fuzz").receive(timeout=10).body == "still serving"
    connection.close()
