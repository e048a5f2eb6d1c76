"""A hostile server against our client: the codec's nesting bound
(``MAX_DEPTH``) protects the client's decoding as it protects the router's. A raw socket
server speaks just enough SASL and AMQP by hand and then sends described values nested
thousands deep where the client decodes: the SASL mechanisms, the open, an attach, and a
transfer's message sections. Each case must end in a clean error (``ConnectionLost`` with
``amqp:decode-error`` and our close carrying that condition, or the one message rejected
while the consumer goes on), never a ``RecursionError``."""

from __future__ import annotations

import contextlib

import pytest
import trio

from martinet.messaging import client
from martinet.messaging.amqp.wire import AMQP_HEADER, SASL_HEADER
from martinet.messaging.codec import MAX_DEPTH, Described, Symbol, UInt, ULong, encode

from tests.swiftlets.jms.test_hostile_decoding import frame, raw_frame, split

DEEP = 3000  # far beyond MAX_DEPTH and beyond what recursion survives without the bound
SASL_MECHANISMS, SASL_OUTCOME = 0x40, 0x44
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
AMQP_VALUE, MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES = 0x77, 0x72, 0x74
ACCEPTED, REJECTED = 0x24, 0x25


def nested(depth: int) -> bytes:
    """A value described ``depth`` times over (``0x00 0x53 0x77`` … null), as raw bytes."""
    return b"\x00\x53\x77" * depth + b"\x40"


def list32(code: int, fields: list[bytes]) -> bytes:
    """A described list32 of already encoded fields (the codec cannot encode the hostile ones)."""
    inner = b"".join(fields)
    return (
        b"\x00\x53"
        + bytes([code])
        + b"\xd0"
        + (len(inner) + 4).to_bytes(4, "big")
        + len(fields).to_bytes(4, "big")
        + inner
    )


def map32(code: int, key: bytes, value: bytes) -> bytes:
    inner = key + value
    return b"\x00\x53" + bytes([code]) + b"\xd1" + (len(inner) + 4).to_bytes(4, "big") + (2).to_bytes(4, "big") + inner


def section(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + bytes([code]) + value


class HostileServer:
    """Accepts one client at a time; ``plan`` says where the deep value goes. Records the
    performatives the client sent (code, fields) in ``received``."""

    def __init__(self, plan: str, payloads: list[bytes] = ()):
        self.plan, self.payloads, self.received = plan, list(payloads), []
        self.done = trio.Event()  # the client closed the socket

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            await self.converse(stream)
        finally:
            self.done.set()

    async def converse(self, stream: trio.SocketStream) -> None:
        await stream.receive_some(8)
        if self.plan == "sasl":  # below the SASL frame limit, still far beyond MAX_DEPTH
            await stream.send_all(SASL_HEADER + raw_frame(list32(SASL_MECHANISMS, [nested(100)]), kind=1))
            await self.collect(stream)
            return
        await stream.send_all(SASL_HEADER + frame(SASL_MECHANISMS, [Symbol("ANONYMOUS")], kind=1))
        await stream.receive_some(4096)  # sasl-init
        await stream.send_all(frame(SASL_OUTCOME, [0], kind=1) + AMQP_HEADER)
        if self.plan == "open":
            await stream.send_all(raw_frame(list32(OPEN, [encode("evil"), nested(DEEP)])))
        else:
            await stream.send_all(frame(OPEN, ["evil"]))
        await self.collect(stream)

    async def collect(self, stream: trio.SocketStream) -> None:
        """Read the client's frames until it closes the socket (or resets it after its
        close), answering each as a router would."""
        with contextlib.suppress(trio.BrokenResourceError):
            while data := await stream.receive_some(65536):
                for code, fields in split(data):  # (the client's frames are small: whole in each read)
                    self.received.append((code, fields))
                    await self.answer(stream, code, fields)

    async def answer(self, stream: trio.SocketStream, code: object, fields: list) -> None:
        if code == BEGIN:
            await stream.send_all(frame(BEGIN, [UInt(0), UInt(0), UInt(100), UInt(100)]))
        elif code == ATTACH:
            name, handle, _role, _snd, _rcv, source, target = fields[:7]
            if self.plan == "attach":  # the source the client must read is the deep value
                await stream.send_all(
                    raw_frame(
                        list32(
                            ATTACH,
                            [
                                encode(name),
                                encode(handle),
                                encode(False),
                                encode(None),
                                encode(None),
                                nested(DEEP),
                                encode(target),
                            ],
                        )
                    )
                )
            else:
                await stream.send_all(
                    frame(ATTACH, [name, handle, False, None, None, source, target, None, None, UInt(0)])
                )
        elif code in (DETACH, END, CLOSE):  # the client's goodbyes, answered in kind
            await stream.send_all(frame(code, fields[:2] if code == DETACH else []))
        elif code == FLOW and self.payloads:
            for number, payload in enumerate(self.payloads):
                transfer = encode(Described(ULong(TRANSFER), [UInt(0), UInt(number), b"%d" % number, UInt(0)]))
                await stream.send_all(raw_frame(transfer + payload))
            self.payloads = []


async def run_client(server: HostileServer, work) -> BaseException | None:
    """Connect our client to ``server`` and run ``work(connection)``; what it raised."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, server.handle, 0)
        port = listeners[0].socket.getsockname()[1]
        raised = None
        with trio.fail_after(20):
            try:
                async with client.connect(f"amqp://127.0.0.1:{port}", connect_timeout=10) as connection:
                    await work(connection)
            except Exception as exc:  # noqa: BLE001 - what the client raised is the result
                raised = exc
            await server.done.wait()  # the server read the client's last frames
        nursery.cancel_scope.cancel()
    return raised


def closed_with_decode_error(server: HostileServer) -> bool:
    closes = [fields for code, fields in server.received if code == CLOSE]
    return bool(closes) and str(closes[-1][0].value[0]) == "amqp:decode-error"


async def consume(connection: client.Connection) -> None:
    session = await connection.session()
    async with session.consumer(client.Queue("q")) as consumer:
        raise AssertionError(f"attached and received {await consumer.receive(5)!r}")


async def test_deep_nesting_in_sasl_mechanisms_is_a_clean_refusal():
    raised = await run_client(HostileServer("sasl"), consume)
    assert isinstance(raised, client.ConnectionLost), repr(raised)
    assert "nested deeper than" in str(raised)


@pytest.mark.parametrize("plan", ["open", "attach"])
async def test_deep_nesting_in_a_performative_closes_with_decode_error(plan):
    server = HostileServer(plan)
    raised = await run_client(server, consume)
    assert isinstance(raised, client.ConnectionLost), repr(raised)
    assert raised.condition == "amqp:decode-error" and f"nested deeper than {MAX_DEPTH}" in str(raised)
    assert closed_with_decode_error(server), server.received


GOOD = section(AMQP_VALUE, encode("good"))


@pytest.mark.parametrize(
    "hostile",
    [
        section(AMQP_VALUE, nested(DEEP)),
        map32(MESSAGE_ANNOTATIONS, encode(Symbol("k")), nested(DEEP)) + GOOD,
        map32(APPLICATION_PROPERTIES, encode("k"), nested(DEEP)) + GOOD,
    ],
    ids=["body", "message-annotations", "application-properties"],
)
async def test_a_message_nested_too_deep_is_rejected_and_the_consumer_goes_on(hostile):
    server = HostileServer("transfer", [hostile, GOOD])
    received = []

    async def take(connection: client.Connection) -> None:
        session = await connection.session()
        async with session.consumer(client.Queue("q")) as consumer:
            received.append(await consumer.receive(10))

    assert await run_client(server, take) is None
    assert [message.body for message in received] == ["good"]
    outcomes = [(fields[1], fields[4]) for code, fields in server.received if code == DISPOSITION]
    assert [(first, int(state.descriptor)) for first, state in outcomes] == [(0, REJECTED), (1, ACCEPTED)]
    error = outcomes[0][1].value[0]  # the rejection says why
    assert str(error.value[0]) == "amqp:decode-error" and "nested deeper than" in error.value[1]
