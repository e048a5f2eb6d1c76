"""Resource limits against a hostile client: each test does what a
client that wants to stall or exhaust the router does, against a live listener over real
sockets (raw AMQP frames, or python-qpid-proton), and checks that it is refused at the
configured limit with the error the spec names — and that what the router kept for a
connection is gone when the connection is.

- sessions and links per connection: channel-max and handle-max announced and enforced
  [2.7.1, 2.7.2], and the engine's channel and handle allocation linear in their number;
- incomplete multi-frame messages: a link's message above max-message-size [2.7.3], and
  all the connection's incomplete messages above max-incoming-buffer;
- closed connections: no reference cycles left (freed without the collector), and a
  router process with ``martinet run``'s collector settings back near its start RSS after
  thousands of connections;
- queues a client makes: max-auto-created-queues-per-connection and max-queues.

No timings are asserted: limits are checked by what happens at them, costs by counting
operations, memory by RSS.
"""

from __future__ import annotations

import gc
import os
import runpy
import struct
import sys

import pytest
import trio
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from martinet.messaging import amqp
from martinet.messaging.codec import Described, UInt, ULong, decode, encode
from martinet.swiftlets.jms import listener

from tests.harness.paths import ROOT
from tests.harness.polling import wait_until

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DETACH, END, CLOSE = 0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x18


# -- a raw AMQP client ------------------------------------------------------------------------


def frame(code: int, fields: list, payload: bytes = b"", channel: int = 0) -> bytes:
    body = b"\x00\x53" + bytes([code]) + encode(fields) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def begin(channel: int = 0) -> bytes:
    return frame(BEGIN, [None, UInt(0), UInt(1000), UInt(1000)], channel=channel)


def attach(
    name: str, handle: int, *, address: str = "q", peer_receives: bool = False, channel: int = 0, dynamic: bool = False
) -> bytes:
    """An attach from the client: a sender (to ``address``) unless ``peer_receives``."""
    fields = [None, None, None, None, dynamic] if dynamic else [address]
    terminus = Described(ULong(0x28 if peer_receives else 0x29), fields)
    source, target = (terminus, None) if peer_receives else (None, terminus)
    return frame(
        ATTACH,
        [name, UInt(handle), peer_receives, None, None, source, target, None, None, None if peer_receives else UInt(0)],
        channel=channel,
    )


def transfer(handle: int, delivery_id: int | None, payload: bytes, *, more: bool, channel: int = 0) -> bytes:
    return frame(
        TRANSFER,
        [UInt(handle), None if delivery_id is None else UInt(delivery_id), b"t", UInt(0), False, more],
        payload,
        channel=channel,
    )


class RawClient:
    """A client that writes frames as given (no SASL: the listener takes AMQP's own header
    as anonymous) and reads the router's performatives."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.received: list[tuple[int, int, list]] = []  # (channel, code, fields)
        self.closed = False  # the router closed the socket
        self._buffer = b""

    @classmethod
    async def connect(cls, port: int, container: str = "hostile") -> RawClient:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await client.send(amqp.AMQP_HEADER + frame(OPEN, [container]))
        await client.until(lambda got: any(code == OPEN for _, code, _ in got))
        return client

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def until(self, done, timeout: float = 30) -> list[tuple[int, int, list]]:
        """Read until ``done(received)`` holds or the router closes the socket (then
        ``done`` must hold); what was received so far."""
        with trio.fail_after(timeout):
            while not done(self.received):
                if self.closed:
                    raise AssertionError(f"the router closed the socket; received {self.codes()}")
                try:
                    chunk = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    chunk = b""
                if not chunk:
                    self.closed = True
                    continue
                self._buffer += chunk
                self._parse()
        return self.received

    def _parse(self) -> None:
        if self._buffer.startswith(b"AMQP"):
            self._buffer = self._buffer[8:]
        while len(self._buffer) >= 8:
            size, _, _, channel = struct.unpack_from(">IBBH", self._buffer)
            if len(self._buffer) < size:
                return
            if size > 8:
                value, _ = decode(self._buffer, 8)
                self.received.append((channel, int(value.descriptor), value.value + [None] * 12))
            self._buffer = self._buffer[size:]

    def codes(self) -> list[int]:
        return [code for _, code, _ in self.received]

    def first(self, code: int) -> tuple[int, list]:
        return next((channel, fields) for channel, got, fields in self.received if got == code)

    def error(self, code: int, channel: int | None = None) -> amqp.Error:
        """The error of the last ``code`` frame (close, end or detach)."""
        fields = [fields for ch, got, fields in self.received if got == code and channel in (None, ch)][-1]
        return amqp.Error.from_value(fields[{CLOSE: 0, END: 0, DETACH: 2}[code]])

    async def aclose(self) -> None:
        await self.stream.aclose()


def closed_with(condition: str):
    return lambda got: any(code == CLOSE for _, code, _ in got)


# -- item 6: sessions and links ---------------------------------------------------------------


async def test_a_client_beginning_300_sessions_is_refused_at_max_sessions(amqp_broker):
    """[2.7.1] channel-max "is the highest channel number that can be used on the
    connection" and "a peer that receives a channel number outside the supported range
    MUST close the connection with the framing-error error-code". The listener's default
    max-sessions is 256: channel-max 255, and a client's handle-max 1023 on each session."""
    broker = await amqp_broker()
    client = await RawClient.connect(broker.port)
    _, opened = client.first(OPEN)
    assert opened[3] == 255  # channel-max
    await client.send(b"".join(begin(channel) for channel in range(300)))
    await client.until(lambda got: any(code == CLOSE for _, code, _ in got))
    begun = [channel for channel, code, fields in client.received if code == BEGIN]
    assert begun == list(range(256))  # each answered on its own channel, up to the limit
    assert {fields[4] for channel, code, fields in client.received if code == BEGIN} == {1023}  # handle-max
    assert {fields[0] for channel, code, fields in client.received if code == BEGIN} == set(range(256))
    error = client.error(CLOSE)
    assert error.condition == "amqp:connection:framing-error" and "channel 256 above channel-max" in error.description
    await client.until(lambda got: client.closed or False)
    await wait_until(lambda: broker.connections() == 0)
    await client.aclose()


async def test_a_client_attaching_beyond_max_links_per_session_is_refused(amqp_broker):
    """[2.7.2] handle-max: "A peer that receives a handle outside the supported range MUST
    close the connection with the framing-error error-code"; our begin announces it."""
    broker = await amqp_broker(listener='max-sessions="2" max-links-per-session="8"')
    client = await RawClient.connect(broker.port)
    assert client.first(OPEN)[1][3] == 1
    await client.send(begin(0) + b"".join(attach(f"l{handle}", handle) for handle in range(8)))
    await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 8)
    assert client.first(BEGIN)[1][4] == 7
    assert CLOSE not in client.codes()
    await client.send(attach("l8", 8))
    await client.until(closed_with("amqp:connection:framing-error"))
    error = client.error(CLOSE)
    assert error.condition == "amqp:connection:framing-error" and "handle 8 above handle-max" in error.description
    await client.aclose()


def operations_in_engine(work, budget: int) -> int:
    """Run ``work()`` counting the lines executed in the engine's modules; stops it (raising)
    once more than ``budget`` ran. The count."""
    engine_dir = os.path.dirname(amqp.engine.__file__) + os.sep  # the package: every module of the engine
    count = 0

    class OverBudget(Exception):
        pass

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise OverBudget
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(engine_dir) else None

    sys.settrace(calls)
    try:
        work()
    except OverBudget:
        raise AssertionError(f"more than {budget} engine lines ran") from None
    finally:
        sys.settrace(None)
    return count


def test_taking_channels_and_handles_costs_the_same_for_the_thousandth_as_for_the_first():
    """20,000 links attached on one session and 5,000 sessions begun on one connection, in
    the engine alone: the lines the engine runs grow linearly (a scan for the lowest free
    handle from 0 made them grow with the square: 200 million lines for 20,000 links)."""
    engine = amqp.Connection(container_id="router")
    engine.receive_data(amqp.AMQP_HEADER + frame(OPEN, ["peer"]))
    engine.open()
    engine.receive_data(begin(0))
    links, sessions = 20_000, 5_000
    attaches = b"".join(attach(f"l{handle}", handle) for handle in range(links))
    begins = b"".join(begin(channel) for channel in range(1, sessions + 1))
    engine.events.clear()

    def handle_events():
        for event in engine.events:
            if isinstance(event, amqp.LinkAttached):
                event.link.attach()
        engine.events.clear()

    def attach_all():
        for start in range(0, len(attaches), 65536):
            engine.receive_data(attaches[start : start + 65536])
            handle_events()

    per_link = operations_in_engine(attach_all, budget=400 * links) / links
    assert sorted(link.handle for link in engine._channels[0]._handles.values()) == list(range(links))
    per_session = operations_in_engine(lambda: engine.receive_data(begins), budget=400 * sessions) / sessions
    assert sorted(engine._channels) == list(range(sessions + 1))
    assert per_link < 400 and per_session < 400 and engine.opened, (per_link, per_session)


# -- item 7a: incomplete multi-frame messages -------------------------------------------------


def send_one(url: str, address: str, body: bytes) -> None:
    connection = BlockingConnection(url, timeout=30)
    try:
        connection.create_sender(address).send(Message(body=body))
    finally:
        connection.close()


async def test_a_multi_frame_message_above_max_message_size_detaches_its_link(amqp_broker):
    """[2.7.3] max-message-size: "Any attempt to deliver a message larger than this results
    in a message-size-exceeded link-error". The listener gives the engine the queue
    manager's max-message-size, so a message in 16 KiB frames is refused once its frames
    pass it — not collected whole first (the engine's own default was 256 MiB)."""
    broker = await amqp_broker(autocreate='true" max-message-size="100000', listener='max-frame-size="16384"')
    with pytest.raises(LinkDetached, match="amqp:link:message-size-exceeded"):
        await trio.to_thread.run_sync(send_one, broker.url, "big", b"x" * 200_000)
    await trio.to_thread.run_sync(send_one, broker.url, "big", b"x" * 90_000)  # below it: taken
    await wait_until(lambda: broker.connections() == 0)
    assert broker.usage("big")["messages"] == 1


async def test_incomplete_messages_of_all_links_beyond_max_incoming_buffer_close_the_connection(amqp_broker):
    """Each link's incomplete message is below max-message-size, but together they pass
    the connection's max-incoming-buffer: the connection is closed with
    amqp:resource-limit-exceeded [2.8.15] (a client opening many links, each sending most
    of a message and never its end, held them all)."""
    broker = await amqp_broker(listener='max-frame-size="16384" max-incoming-buffer="65536"')
    client = await RawClient.connect(broker.port)
    await client.send(begin(0) + b"".join(attach(f"l{handle}", handle) for handle in range(3)))
    await client.until(lambda got: sum(code == FLOW for _, code, _ in got) == 3)  # credit on each
    chunk = b"x" * 16_000
    await client.send(
        transfer(0, 0, chunk, more=True)
        + transfer(1, 1, chunk, more=True)
        + transfer(2, 2, chunk, more=True)
        + transfer(0, None, chunk, more=True)  # 64,000 bytes
        + attach("l3", 3)
    )
    await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 4)  # all read, still open
    assert CLOSE not in client.codes() and DETACH not in client.codes()
    await client.send(transfer(1, None, chunk, more=True))  # 80,000 bytes
    await client.until(lambda got: CLOSE in [code for _, code, _ in got])
    error = client.error(CLOSE)
    assert error.condition == "amqp:resource-limit-exceeded" and "max-incoming-buffer" in error.description
    await wait_until(lambda: broker.connections() == 0)
    await client.aclose()


# -- item 7b: closed connections are freed at once ---------------------------------------------

ROUTER_SIDE = ("AmqpConnection", "Driver", "IncomingLink", "OutgoingLink", "Connection", "Session", "Link")


def router_side_objects() -> dict[str, int]:
    """The listener's and the engine's objects alive (tracked by the collector), by class."""
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        kind = type(obj)
        if kind.__name__ in ROUTER_SIDE and kind.__module__.startswith(
            ("martinet.swiftlets.jms", "martinet.messaging")
        ):
            counts[kind.__name__] = counts.get(kind.__name__, 0) + 1
    return counts


def proton_client(url: str, number: int) -> None:
    """A sender, a receiver and a dynamic (temporary) queue, one message through; closed."""
    connection = BlockingConnection(url, timeout=30)
    try:
        connection.create_sender("cycles").send(Message(body="x"))
        receiver = connection.create_receiver("cycles")
        receiver.receive(timeout=30)
        receiver.accept()
        connection.create_receiver(None, dynamic=True)
    finally:
        connection.close()


async def test_a_closed_connection_is_freed_without_the_cyclic_collector(amqp_broker):
    """With the collector off, what the listener and the engine made for a connection is
    gone once it closed — cleanly, or cut off amid a multi-frame message — : nothing of it
    was held in a reference cycle (the running router collects the oldest generation
    rarely: a router once held 237 MB of closed connections, 39 MB after one gc.collect())."""
    broker = await amqp_broker()
    await trio.to_thread.run_sync(proton_client, broker.url, 0)  # imports, caches: in place
    await wait_until(lambda: broker.connections() == 0)
    gc.collect()
    gc.disable()
    try:
        before = router_side_objects()
        for number in range(1, 4):
            await trio.to_thread.run_sync(proton_client, broker.url, number)
        cut = await RawClient.connect(broker.port)
        await cut.send(begin(0) + attach("l0", 0))
        await cut.until(lambda got: FLOW in [code for _, code, _ in got])
        await cut.send(transfer(0, 0, b"x" * 1000, more=True))
        await cut.aclose()  # amid the message
        await wait_until(lambda: broker.connections() == 0)
        await wait_until(lambda: router_side_objects() == before, what="the closed connections' objects freed")
    finally:
        gc.enable()


SOAK = ROOT / "bench" / "connection_soak.py"


def test_a_martinet_run_router_returns_near_its_start_rss_after_5000_connections():
    """bench/connection_soak.py: a ``martinet run`` process (gc.freeze and its rare full
    collections), 5,000 connections in waves of 500 open at once (sender, receiver, one
    message, close). Its RSS after them stays within 6 MiB of where it was after a warm-up
    wave (with the cycles it kept: +18 MiB)."""
    start, end = runpy.run_path(str(SOAK))["soak"](5000, warmup=500, wave=500)
    assert end - start < 6 * 1024, f"RSS {start} KiB after the warm-up, {end} KiB after 5000 connections"


# -- item 7d: queues a client makes ------------------------------------------------------------


async def test_auto_created_queues_are_limited_per_connection_and_in_all(amqp_broker):
    """A client attaching to ever new queue names: refused with amqp:resource-limit-exceeded
    past max-auto-created-queues-per-connection (temporary queues alive count too), and,
    over all connections, past the queue manager's max-queues — each naming its limit."""
    broker = await amqp_broker(autocreate='true" max-queues="9', listener='max-auto-created-queues-per-connection="4"')
    assert len(broker.router.swiftlet("sys$queuemanager").queues) == 2  # unroutable, routerdlq
    client = await RawClient.connect(broker.port, "first")
    await client.send(
        begin(0)
        + attach("t", 0, dynamic=True, peer_receives=True)  # a temporary queue
        + b"".join(attach(f"l{n}", n, address=f"auto{n}") for n in range(1, 5))
    )
    await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 5)
    await client.until(lambda got: DETACH in [code for _, code, _ in got])
    detached = [fields for _, code, fields in client.received if code == DETACH]
    assert [fields[0] for fields in detached] == [4]  # the fifth queue
    error = client.error(DETACH)
    assert error.condition == "amqp:resource-limit-exceeded"
    assert "max-auto-created-queues-per-connection 4" in error.description and "auto4" in error.description
    await client.send(attach("again", 5, address="auto1"))  # an existing queue: fine
    await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 6)
    assert [fields[0] for _, code, fields in client.received if code == DETACH] == [4]
    await client.send(frame(DETACH, [UInt(0), True]))  # the temporary queue goes: room for one more
    await client.until(lambda got: len([code for _, code, _ in got if code == DETACH]) == 2)
    await client.send(attach("l6", 6, address="auto6"))
    await client.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 7)
    assert len([code for _, code, _ in client.received if code == DETACH]) == 2
    queues = broker.router.swiftlet("sys$queuemanager").queues
    assert sorted(name for name in queues if name.startswith("auto")) == ["auto1", "auto2", "auto3", "auto6"]

    second = await RawClient.connect(broker.port, "second")  # 6 queues now; max-queues 9
    await second.send(begin(0) + b"".join(attach(f"m{n}", n, address=f"more{n}") for n in range(4)))
    await second.until(lambda got: sum(code == ATTACH for _, code, _ in got) == 4)
    await second.until(lambda got: DETACH in [code for _, code, _ in got])
    assert [fields[0] for _, code, fields in second.received if code == DETACH] == [3]  # its fourth new queue
    error = second.error(DETACH)
    assert error.condition == "amqp:resource-limit-exceeded" and "max-queues 9" in error.description
    assert len(queues) == 9
    await client.aclose()
    await second.aclose()


def attach_durable(url: str, client_id: str, names: list[str]) -> list[str]:
    """Attach the durable subscriptions ``names`` of ``client_id`` on one connection (each
    detached, kept, after its attach); per name "ok" or the refusal's text."""
    from proton.reactor import Container, DurableSubscription

    container = Container()
    container.container_id = client_id
    connection = BlockingConnection(url, timeout=10, container=container)
    outcomes = []
    try:
        for name in names:
            try:
                receiver = connection.create_receiver("topic://audit", name=name, options=DurableSubscription())
            except LinkDetached as exc:
                outcomes.append(str(exc))
            else:
                receiver.link.detach()
                outcomes.append("ok")
    finally:
        connection.close()
    return outcomes


async def test_durable_subscriptions_count_towards_the_queue_limits(amqp_broker):
    """Item 7d: a new durable subscription's queue counts towards the connection's
    max-auto-created-queues-per-connection and the router's max-queues; past either the
    attach is refused with amqp:resource-limit-exceeded naming the limit, and nothing of it
    is stored. Resuming an existing subscription is not a new queue."""
    from martinet.swiftlets.queuemanager.api import TooManyQueues

    broker = await amqp_broker(autocreate='true" max-queues="5', listener='max-auto-created-queues-per-connection="2"')
    queue_manager = broker.router.swiftlet("sys$queuemanager")
    topic_manager = broker.router.swiftlet("sys$topicmanager")
    assert len(queue_manager.queues) == 2  # unroutable, routerdlq
    first = await trio.to_thread.run_sync(attach_durable, broker.url, "c1", ["s1", "s2", "s3", "s1"])
    assert first[:2] == ["ok", "ok"] and first[3] == "ok"  # s1 again: resumed, not a new queue
    assert "amqp:resource-limit-exceeded" in first[2] and "max-auto-created-queues-per-connection 2" in first[2]
    second = await trio.to_thread.run_sync(attach_durable, broker.url, "c2", ["t1", "t2"])
    assert second[0] == "ok"
    assert "amqp:resource-limit-exceeded" in second[1] and "max-queues 5" in second[1]
    assert sorted(queue_manager.queues) == ["c1$s1", "c1$s2", "c2$t1", "routerdlq", "unroutable"]
    assert sorted(topic_manager.durable_subscriptions()) == ["c1$s1", "c1$s2", "c2$t1"]
    with pytest.raises(TooManyQueues, match="max-queues 5"):  # the administrative create too
        await topic_manager.durable_subscribe("admin", "x", "audit")
    await broker.stop()
    await broker.start()  # nothing of the refused ones was stored
    assert sorted(broker.router.swiftlet("sys$topicmanager").durable_subscriptions()) == ["c1$s1", "c1$s2", "c2$t1"]


async def test_a_connection_that_never_opens_is_closed_even_if_it_sends_empty_frames(amqp_broker, monkeypatch):
    # Without authentication the AMQP header alone starts a connection; empty frames reset
    # the idle timeout, so only a deadline counted once from the start ends it.
    monkeypatch.setattr(listener, "OPEN_TIMEOUT", 1.0)
    running = await amqp_broker()
    client = RawClient(await trio.open_tcp_stream("127.0.0.1", running.port))
    await client.send(amqp.AMQP_HEADER)
    with trio.fail_after(10):
        while not client.closed:
            try:
                await client.send(struct.pack(">IBBH", 8, 2, 0, 0))  # an empty frame: a heartbeat
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            with trio.move_on_after(0.2):
                await client.until(lambda got: CLOSE in [code for _, code, _ in got])
    assert client.codes() == [OPEN, CLOSE]  # our open, then the close saying why
    assert client.error(CLOSE) == amqp.Error("amqp:resource-limit-exceeded", "no open within 1 s")
    await client.aclose()
    opened = await RawClient.connect(running.port, "patient")  # one that opens is served
    await trio.sleep(1.5)
    assert opened.codes() == [OPEN] and not opened.closed
    await opened.aclose()
