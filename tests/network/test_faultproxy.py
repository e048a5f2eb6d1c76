"""The fault proxy (tests/harness/faultproxy.py) on real loopback sockets, in front of an echo server."""

from __future__ import annotations

import functools
import random

import msgpack
import pytest
import trio

from tests.harness.faultproxy import MAGIC, FaultProxy, FrameScanner, Held
from tests.harness.polling import wait_until
from tests.harness.processes import free_port


class EchoServer:
    """Sends back what it receives; half-closes when the client does. Counts what it sees."""

    def __init__(self) -> None:
        self.accepted = self.open = self.received = 0
        self.port: int | None = None

    async def handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        self.open += 1
        try:
            async with stream:
                async for data in stream:
                    self.received += len(data)
                    await stream.send_all(data)
                await stream.send_eof()
        except trio.BrokenResourceError:
            pass
        finally:
            self.open -= 1


@pytest.fixture
async def echo(nursery) -> EchoServer:
    server = EchoServer()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]
    return server


@pytest.fixture
async def proxy(nursery, echo) -> FaultProxy:
    proxy = FaultProxy("127.0.0.1", echo.port)
    await nursery.start(proxy.run)
    return proxy


@pytest.fixture
def clock(autojump_clock):
    """``autojump_clock`` that jumps only after 20 ms of real idleness: these tests do real
    socket I/O, which a threshold of 0 could skip past (trio's MockClock documentation)."""
    autojump_clock.autojump_threshold = 0.02
    return autojump_clock


async def connect(proxy: FaultProxy) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", proxy.port)


async def receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        assert chunk, f"EOF after {len(data)} of {size} bytes"
        data += chunk
    return bytes(data)


async def receive_until_eof(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    async for chunk in stream:
        data += chunk
    return bytes(data)


async def is_closed(stream: trio.SocketStream) -> bool:
    """True when the peer has closed: EOF or a reset (fails the test after 5 s)."""
    with trio.fail_after(5):
        try:
            return await stream.receive_some() == b""
        except trio.BrokenResourceError:
            return True


async def round_trip(stream: trio.SocketStream, data: bytes) -> bytes:
    with trio.fail_after(5):
        await stream.send_all(data)
        return await receive_exactly(stream, len(data))


async def test_bytes_arrive_intact_both_ways_and_eof_is_passed_on(proxy, echo):
    payload = random.Random(1).randbytes(100_000)
    async with await connect(proxy) as client:
        with trio.fail_after(10):
            await client.send_all(payload)
            await client.send_eof()  # a half-close: the echo answers, then half-closes too
            assert await receive_until_eof(client) == payload
    assert (proxy.accepted, proxy.refused) == (1, 0)
    assert proxy.received_from_client == proxy.forwarded_to_target == len(payload) == echo.received
    assert proxy.received_from_target == proxy.forwarded_to_client == len(payload)
    await wait_until(lambda: proxy.live == 0 and echo.open == 0, 5, "connection closed on both sides")


async def test_a_large_transfer_both_ways_at_once(proxy, echo):
    payload = random.Random(2).randbytes(8 * 1024 * 1024)
    got = bytearray()

    async def receive() -> None:
        while len(got) < len(payload):
            chunk = await client.receive_some()
            assert chunk
            got.extend(chunk)

    async with await connect(proxy) as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                await client.send_all(payload)
    assert got == payload
    assert proxy.forwarded_to_target == len(payload)
    await wait_until(lambda: proxy.forwarded_to_client == len(payload), 5, "the last chunk counted")


async def test_counters_of_several_connections(proxy, echo):
    async with await connect(proxy) as first, await connect(proxy) as second:
        assert await round_trip(first, b"a" * 10) == b"a" * 10
        assert await round_trip(second, b"b" * 32) == b"b" * 32
        assert (proxy.accepted, proxy.live, echo.open) == (2, 2, 2)
        assert proxy.forwarded_to_target == 42  # the echo has answered: all went through
        # A counter moves once send_all has returned: the peer may have the bytes first.
        await wait_until(lambda: proxy.forwarded_to_client == 42, 5, "forwarded_to_client counted")
    await wait_until(lambda: proxy.live == 0, 5, "both connections closed")
    assert (proxy.accepted, proxy.refused, proxy.swallowed) == (2, 0, 0)


async def test_delay_holds_every_chunk_in_order_each_way(proxy, clock):
    proxy.delay(0.5)
    async with await connect(proxy) as client:
        with trio.fail_after(10):
            start = trio.current_time()
            await client.send_all(b"a")
            await trio.sleep(0.2)
            await client.send_all(b"b")
            assert await receive_exactly(client, 1) == b"a"
            assert trio.current_time() - start == pytest.approx(1.0)  # 0.5 there, 0.5 back
            assert await receive_exactly(client, 1) == b"b"
            assert trio.current_time() - start == pytest.approx(1.2)
    with pytest.raises(ValueError):
        proxy.delay(-1)


async def test_a_changed_delay_applies_to_chunks_already_waiting(proxy, echo, clock):
    proxy.delay(30)
    async with await connect(proxy) as client:
        start = trio.current_time()
        await client.send_all(b"held")
        with trio.move_on_after(1):
            await client.receive_some()
            pytest.fail("a chunk arrived before its delay")
        assert echo.received == 0
        proxy.heal()
        with trio.fail_after(1):
            assert await receive_exactly(client, 4) == b"held"
        assert trio.current_time() - start < 2


async def test_a_delayed_direction_pushes_back_instead_of_buffering(proxy, echo, clock):
    proxy.delay(60)
    async with await connect(proxy) as client:
        with trio.move_on_after(5) as sending:
            await client.send_all(bytes(64 * 1024 * 1024))  # far more than socket buffers hold
        assert sending.cancelled_caught, "the sender was never blocked"
        held = proxy.received_from_client - proxy.forwarded_to_target
        assert 0 < held <= (proxy.buffer + 2) * proxy.chunk_size
        assert proxy.forwarded_to_target == echo.received == 0


async def test_cut_closes_live_connections_and_new_ones_work(proxy, echo):
    async with await connect(proxy) as first, await connect(proxy) as second:
        assert await round_trip(first, b"one") == b"one"
        assert await round_trip(second, b"two") == b"two"
        proxy.cut()
        assert await is_closed(first)
        assert await is_closed(second)
        await wait_until(lambda: proxy.live == 0 and echo.open == 0, 5, "both sides closed")
    async with await connect(proxy) as third:
        assert await round_trip(third, b"three") == b"three"
        assert (proxy.accepted, proxy.live, echo.accepted) == (3, 1, 3)


async def test_refuse_closes_new_connections_only(proxy, echo):
    async with await connect(proxy) as before:
        assert await round_trip(before, b"up") == b"up"
        proxy.refuse(True)
        async with await connect(proxy) as refused:
            assert await is_closed(refused)
        assert await round_trip(before, b"still") == b"still"  # a live connection goes on
        assert (proxy.accepted, proxy.refused, echo.accepted) == (2, 1, 1)
        proxy.refuse(False)
        async with await connect(proxy) as after:
            assert await round_trip(after, b"back") == b"back"
        assert echo.accepted == 2


async def test_blackhole_swallows_bytes_keeps_connections_open_and_heals(proxy, echo, clock):
    async with await connect(proxy) as client:
        assert await round_trip(client, b"ping") == b"ping"
        proxy.blackhole(True)
        await client.send_all(b"lost")
        with trio.move_on_after(10):
            await client.receive_some()
            pytest.fail("a byte came out of the blackhole")
        # Nothing arrived either side, nothing errored: both connections are still open.
        assert echo.received == 4 and (proxy.live, echo.open) == (1, 1)
        await client.send_all(b"also lost")
        await client.send_eof()  # held, not swallowed
        await trio.sleep(10)
        assert echo.received == 4 and echo.open == 1
        assert proxy.swallowed == len(b"lost") + len(b"also lost")

        proxy.heal()  # the held EOF goes on; the echo half-closes back
        with trio.fail_after(5):
            assert await receive_until_eof(client) == b""
        await wait_until(lambda: echo.open == 0 and proxy.live == 0, 5, "closed after the EOFs")


async def test_blackhole_swallows_chunks_already_on_their_way_back(proxy, echo, clock):
    proxy.delay(1)
    async with await connect(proxy) as client:
        await client.send_all(b"x")  # reaches the echo at t=1; its answer is due at t=2
        await trio.sleep(1.5)
        assert echo.received == 1
        proxy.blackhole(True)
        with trio.move_on_after(10):
            await client.receive_some()
            pytest.fail("a chunk came out of the blackhole")
        assert proxy.swallowed == 1 and proxy.forwarded_to_client == 0
        proxy.heal()
        assert await round_trip(client, b"new") == b"new"  # the swallowed byte stays lost


async def test_a_one_way_blackhole_swallows_that_direction_only(proxy, echo, clock):
    async with await connect(proxy) as client:
        proxy.blackhole(True, direction="to_client")  # the echo hears the client, not back
        await client.send_all(b"heard")
        await wait_until(lambda: echo.received == 5, 5, "the client's bytes reach the echo")
        with trio.move_on_after(10):
            await client.receive_some()
            pytest.fail("a byte came back through the one-way blackhole")
        assert proxy.swallowed == 5 and proxy.forwarded_to_target == 5
        proxy.blackhole(True, direction="to_target")  # now the other way only
        await client.send_all(b"lost")
        await trio.sleep(10)
        assert echo.received == 5 and proxy.swallowed == 9
        with pytest.raises(ValueError, match="direction"):
            proxy.blackhole(True, direction="both")
        proxy.heal()
        assert await round_trip(client, b"new") == b"new"


async def test_cancelling_run_closes_the_listener_and_every_connection(nursery, echo):
    proxy = FaultProxy("127.0.0.1", echo.port)
    async with trio.open_nursery() as inner:
        await inner.start(proxy.run)
        client = await connect(proxy)
        assert await round_trip(client, b"hi") == b"hi"
        inner.cancel_scope.cancel()
    async with client:
        assert await is_closed(client)
    assert proxy.live == 0
    await wait_until(lambda: echo.open == 0, 5, "the echo side closed")
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", proxy.port)


async def test_an_unreachable_target_closes_the_client(nursery):
    proxy = FaultProxy("127.0.0.1", free_port())  # nobody listens there
    await nursery.start(proxy.run)
    async with await connect(proxy) as client:
        assert await is_closed(client)
    assert (proxy.accepted, proxy.refused, proxy.live) == (1, 1, 0)


def routing_stream(*frames: tuple[int, dict]) -> tuple[bytes, list[int]]:
    """The magic and ``frames`` as the routing protocol writes them; the frames' offsets."""
    stream, offsets = bytearray(MAGIC), []
    for code, fields in frames:
        body = msgpack.packb([code, fields])
        offsets.append(len(stream))
        stream += len(body).to_bytes(4, "big") + body
    return bytes(stream), offsets


@pytest.mark.parametrize("chunk", [1, 2, 5, 7, 64])
def test_the_frame_scanner_passes_everything_or_holds_from_the_chosen_frame(chunk):
    stream, offsets = routing_stream(
        (42, {}),
        (50, {"xid": "x1", "messages": [b"m" * 300]}),
        (51, {"xid": "x1"}),
        (50, {"xid": "x2", "messages": []}),
    )
    for code, held_at in ((None, None), (51, offsets[2]), (50, offsets[1]), (99, None)):
        scanner, passed, held = FrameScanner(), bytearray(), None
        for start in range(0, len(stream), chunk):
            data = stream[start : start + chunk]
            if held is not None:
                held += data
                continue
            out, rest = scanner.feed(data, code)
            passed += out
            if rest is not None:
                held = bytearray(rest)
        if held_at is None:
            assert held is None and bytes(passed) == stream
        else:
            assert bytes(passed) == stream[:held_at] and bytes(held) == stream[held_at:]


@pytest.mark.parametrize("chunk", [1, 2, 5, 7, 64])
def test_the_scanner_holds_the_nth_frame_of_a_type_or_drops_it_alone(chunk):
    frames = [
        (42, {}),
        (50, {"xid": "x1", "messages": [b"m" * 300]}),
        (51, {"xid": "x1"}),
        (50, {"xid": "x2", "messages": [b"n" * 20]}),
        (51, {"xid": "x2"}),
    ]
    stream, offsets = routing_stream(*frames)
    ends = [*offsets[1:], len(stream)]
    for rule, passed_expected, held_expected, taken in (
        (Held("to_target", 50, nth=2), stream[: offsets[3]], stream[offsets[3] :], 3),
        (Held("to_target", 51, nth=2), stream[: offsets[4]], stream[offsets[4] :], 4),
        (Held("to_target", 51, nth=1, drop=True), stream[: offsets[2]] + stream[ends[2] :], None, 2),
        (Held("to_target", 50, nth=2, drop=True), stream[: offsets[3]] + stream[ends[3] :], None, 3),
        (Held("to_target", 50, nth=3), stream, None, None),  # there is no third
        # chosen by their fields too: looked at once whole, only those accepted counted
        (
            Held("to_target", 50, where=lambda fields: fields["xid"] == "x2"),
            stream[: offsets[3]],
            stream[offsets[3] :],
            3,
        ),
        (Held("to_target", 51, nth=2, where=lambda fields: True), stream[: offsets[4]], stream[offsets[4] :], 4),
        (
            Held("to_target", 50, drop=True, where=lambda fields: len(fields["messages"][0]) == 20),
            stream[: offsets[3]] + stream[ends[3] :],
            None,
            3,
        ),
        (Held("to_target", 51, where=lambda fields: fields["xid"] == "x9"), stream, None, None),
    ):
        scanner, passed, held = FrameScanner(), bytearray(), None

        def choose(code: int, rule: Held = rule) -> Held | None:
            return rule if rule.match(code) else None  # (a rule matches once)

        for start in range(0, len(stream), chunk):
            data = stream[start : start + chunk]
            if held is not None:
                held += data
                rule.add(data)  # as the proxy keeps what follows a held frame
                continue
            out, rest = scanner.feed(data, choose)
            passed += out
            if rest is not None:
                held = bytearray(rest)
                rule.add(rest)
        assert bytes(passed) == passed_expected
        assert (bytes(held) if held is not None else None) == held_expected
        if taken is not None:  # the frame chosen, whole, with its fields
            assert bytes(rule.data[: ends[taken] - offsets[taken]]) == stream[offsets[taken] : ends[taken]]
            assert rule.seen.is_set() and rule.fields == frames[taken][1]


async def test_hold_keeps_the_chosen_frame_and_what_follows_and_reads_its_fields(nursery):
    server = EchoServer()
    port = (await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")))[
        0
    ].socket.getsockname()[1]
    proxy = FaultProxy("127.0.0.1", port)
    await nursery.start(proxy.run)
    held = proxy.hold("to_target", 52)
    stream, offsets = routing_stream((42, {}), (52, {"xid": "routing:a:b:1-1"}), (42, {}))
    client = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    await client.send_all(stream)
    with trio.fail_after(5):
        await held.seen.wait()
        echoed = b""
        while len(echoed) < offsets[1]:
            echoed += await client.receive_some()
    assert echoed == stream[: offsets[1]] and held.fields == {"xid": "routing:a:b:1-1"}
    assert bytes(held.data) == stream[offsets[1] :]
    proxy.cut()
    await client.aclose()
