"""The AMQP engine (messaging/amqp/engine/) against proton's engine as the peer, in memory:
bytes are pumped between our sans-IO connection and a proton client transport, so every
frame we write is judged by proton and every frame proton writes is read by us. Then the
peer's breaches of a link, a session and the connection, from raw frames in memory and
against a live router over a socket: each is answered at its scope and nothing else is
disturbed. (The state tables themselves: tests/messaging/amqp/test_states.py.)"""

from __future__ import annotations

import struct

import proton
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging import amqp
from martinet.messaging.amqp.sasl import SaslClient
from martinet.messaging.codec import Described, Symbol, UInt, ULong, UShort, decode, encode


class Recorder:
    """A link handler that keeps what the engine hands it."""

    def __init__(self):
        self.transfers: list[tuple[int, bytes, bool]] = []
        self.outcomes: list[tuple[int, int | None, bool]] = []

    def on_transfer(self, delivery_id, payload, settled, state):
        self.transfers.append((delivery_id, payload, settled))

    def on_outcome(self, delivery_id, state, settled):
        self.outcomes.append((delivery_id, amqp.state_code(state), settled))


class Pair:
    """Our engine as the server, proton as the client, joined in memory."""

    def __init__(
        self, *, client_max_frame: int = 0, server_max_frame: int = 65536, credit: int = 1000, idle_timeout: float = 0.0
    ):
        self.engine = amqp.Connection(container_id="router", max_frame_size=server_max_frame, idle_timeout=idle_timeout)
        self.transport = proton.Transport(proton.Transport.CLIENT)
        if client_max_frame:
            self.transport.max_frame_size = client_max_frame
        self.client = proton.Connection()
        self.client.container = "client"
        self.transport.bind(self.client)
        self.credit = credit
        self.links: dict[str, amqp.Link] = {}
        self.events: list = []

    def handle(self) -> None:
        """The server side's decisions: open, answer attaches, grant credit."""
        events, self.engine.events = self.engine.events, []
        for event in events:
            self.events.append(event)
            if isinstance(event, amqp.ConnectionOpened):
                self.engine.open()
            elif isinstance(event, amqp.LinkAttached):
                link = event.link
                link.source, link.target = link.remote_source, link.remote_target
                link.handler = Recorder()
                self.links[link.name] = link
                link.attach()
                if not link.is_sender:
                    link.flow(self.credit)
            elif isinstance(event, amqp.LinkDetached) and event.link.attached:
                event.link.detach(closed=event.closed)

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            pending = self.transport.pending()
            if pending > 0:
                data = self.transport.peek(pending)
                self.transport.pop(pending)
                self.engine.receive_data(data)
                moved = True
            self.handle()
            data = self.engine.data_to_send()
            if data:
                self.transport.push(data)
                moved = True
            if not moved:
                return
        raise AssertionError("the two engines keep talking")

    def open(self) -> proton.Session:
        self.client.open()
        session = self.client.session()
        session.open()
        self.pump()
        return session


def client_send(sender: proton.Sender, payload: bytes, tag: str, *, settled: bool = False) -> proton.Delivery:
    delivery = sender.delivery(tag)
    sender.send(payload)
    sender.advance()
    if settled:
        delivery.settle()
    return delivery


def test_messages_both_ways_with_ranged_dispositions():
    pair = Pair()
    session = pair.open()
    sender = session.sender("in")
    sender.target.address = "q"
    sender.open()
    receiver = session.receiver("out")
    receiver.source.address = "q"
    receiver.open()
    receiver.flow(100)
    pair.pump()
    assert pair.client.remote_container == "router" and sender.credit == 1000
    inbound, outbound = pair.links["in"], pair.links["out"]
    deliveries = [client_send(sender, f"m{n}".encode(), str(n)) for n in range(50)]
    pair.pump()
    assert [payload for _, payload, _ in inbound.handler.transfers] == [f"m{n}".encode() for n in range(50)]
    for delivery_id, _, _ in inbound.handler.transfers:
        inbound.settle(delivery_id, amqp.ACCEPTED)
    out = pair.engine.data_to_send()
    assert out.count(b"\x00\x53\x15") == 1  # one ranged disposition settles all fifty
    pair.transport.push(out)
    pair.pump()
    assert all(d.remote_state == proton.Delivery.ACCEPTED and d.settled for d in deliveries)

    assert outbound.credit == 100
    sent = [outbound.send(f"r{n}".encode()) for n in range(60)]
    pair.pump()
    got = []
    while (delivery := receiver.current) is not None:
        got.append(receiver.recv(delivery.pending))
        receiver.advance()
        delivery.update(proton.Delivery.ACCEPTED if len(got) % 20 else proton.Delivery.RELEASED)
        delivery.settle()
    assert got == [f"r{n}".encode() for n in range(60)] and outbound.credit == 40
    pair.pump()
    assert outbound.handler.outcomes == [  # every 20th released, the rest accepted, each settled once
        (delivery_id, amqp.RELEASED_CODE if n % 20 == 19 else amqp.ACCEPTED_CODE, True)
        for n, delivery_id in enumerate(sent)
    ]
    assert not outbound.session.unsettled


def test_multi_frame_transfers_both_ways():
    pair = Pair(client_max_frame=512, server_max_frame=512)
    session = pair.open()
    sender = session.sender("in")
    sender.open()
    receiver = session.receiver("out")
    receiver.open()
    receiver.flow(10)
    pair.pump()
    big = bytes(range(256)) * 20  # 5,120 bytes: eleven frames of 512 each way
    client_send(sender, big, "big")
    pair.pump()
    assert pair.links["in"].handler.transfers == [(0, big, False)]
    pair.links["out"].send(big)
    pair.pump()
    delivery = receiver.current
    assert delivery is not None and not delivery.partial
    assert receiver.recv(delivery.pending) == big


def test_transfers_wait_for_the_peer_session_window():
    pair = Pair()
    pair.client.open()
    session = pair.client.session()
    session.incoming_capacity = 4 * 65536  # proton then offers a window of four frames
    session.open()
    receiver = session.receiver("out")
    receiver.flow(50)
    receiver.open()
    pair.pump()
    outbound = pair.links["out"]
    for n in range(50):
        outbound.send(f"x{n}".encode())
    got = []
    for _ in range(100):
        pair.pump()
        while (delivery := receiver.current) is not None:
            got.append(receiver.recv(delivery.pending))
            receiver.advance()
            delivery.settle()
        if len(got) == 50:
            break
    assert got == [f"x{n}".encode() for n in range(50)]


def test_drain_uses_up_the_credit():
    pair = Pair()
    session = pair.open()
    receiver = session.receiver("out")
    receiver.open()
    pair.pump()
    receiver.drain(10)
    pair.pump()
    outbound = pair.links["out"]
    assert outbound.credit == 10 and outbound.drain
    outbound.send(b"one")
    outbound.drained()
    assert outbound.credit == 0 and outbound.delivery_count == 10
    pair.pump()
    assert receiver.queued == 1 and not receiver.draining()  # proton saw the drain complete


def test_detach_and_close_reach_the_peer_and_the_owner():
    pair = Pair()
    session = pair.open()
    sender = session.sender("in")
    sender.open()
    pair.pump()
    sender.close()
    pair.pump()
    detached = [event for event in pair.events if isinstance(event, amqp.LinkDetached)]
    assert detached and detached[0].closed and sender.state & proton.Endpoint.REMOTE_CLOSED
    pair.client.close()
    pair.pump()
    assert any(isinstance(event, amqp.ConnectionClosed) and event.by_peer for event in pair.events)
    assert pair.client.state & proton.Endpoint.REMOTE_CLOSED and pair.engine.finished


def frame(code: int, fields: list, payload: bytes = b"", channel: int = 0) -> bytes:
    body = b"\x00\x53" + bytes([code]) + encode(fields) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def opened_engine(**options) -> amqp.Connection:
    engine = amqp.Connection(container_id="router", **options)
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["peer"]))
    engine.open()
    engine.events.clear()
    return engine


@pytest.mark.parametrize(
    "garbage, condition",
    [
        (b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x13\xff", "amqp:decode-error"),  # unknown constructor
        (b"\x00\x00\x00\x04\x02\x00\x00\x00", "amqp:connection:framing-error"),  # size below the header
        (b"\x00\x10\x00\x00\x02\x00\x00\x00", "amqp:connection:framing-error"),  # above max-frame-size
        (b"\x00\x00\x00\x0c\x02\x01\x00\x00abcd", "amqp:connection:framing-error"),  # a SASL frame now
        (frame(0x12, ["l", UInt(0), False], channel=7), "amqp:not-allowed"),  # attach on a channel not begun
        (frame(0x14, [UInt(3), UInt(0), b"t"]), "amqp:not-allowed"),  # transfer before begin
    ],
)
def test_broken_frames_close_the_connection_with_the_right_error(garbage, condition):
    engine = opened_engine(max_frame_size=4096)
    engine.receive_data(garbage)
    closed = [event for event in engine.events if isinstance(event, amqp.ConnectionClosed)]
    assert closed and closed[0].error.condition == condition and not closed[0].by_peer
    out = engine.data_to_send()
    assert b"\x00\x53\x18" in out and condition.encode() in out  # a close frame with the condition
    assert engine.data_to_send() is None and engine.finished


def test_a_wrong_protocol_header_is_answered_with_ours():
    engine = amqp.Connection(container_id="router")
    engine.receive_data(b"HTTP/1.1 200\r\n")
    assert engine.data_to_send().startswith(amqp.AMQP_HEADER)
    assert engine.finished


def attached_link(engine: amqp.Connection, *, peer_receives: bool) -> amqp.Link:
    """Begin a session and attach link "l" (handle 0) from the peer's side; we answer it."""
    engine.receive_data(frame(0x11, [None, UInt(0), UInt(100), UInt(100)]))
    kind = amqp.SOURCE if peer_receives else amqp.TARGET
    terminus = amqp.Terminus(kind=kind, address="q").described()
    source, target = (terminus, None) if peer_receives else (None, terminus)
    engine.receive_data(frame(0x12, ["l", UInt(0), peer_receives, None, None, source, target]))
    link = engine.events[-1].link
    link.handler = Recorder()
    link.attach()
    return link


def test_a_transfer_beyond_credit_is_refused():
    engine = opened_engine()
    attached_link(engine, peer_receives=False)  # and no credit granted
    engine.receive_data(frame(0x14, [UInt(0), UInt(0), b"t", UInt(0), False], b"payload"))
    assert engine.events[-1].error.condition == "amqp:link:transfer-limit-exceeded"


def test_idle_timeout_heartbeats_and_drops_a_silent_peer():
    engine = amqp.Connection(container_id="router", idle_timeout=2.0)
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["peer", None, None, None, UInt(1000)]))
    engine.open()
    engine.data_to_send()
    assert engine.tick(100.0) == pytest.approx(100.5)  # half the peer's 1 s
    assert engine.tick(100.6) == pytest.approx(101.1)
    assert engine.data_to_send() == b"\x00\x00\x00\x08\x02\x00\x00\x00"  # an empty frame
    engine.receive_data(b"\x00\x00\x00\x08\x02\x00\x00\x00")  # the peer's heartbeat counts as input
    engine.tick(101.0)
    engine.tick(102.5)  # past 100 + 2: alive only because the heartbeat at 101 counted
    assert not any(isinstance(event, amqp.ConnectionClosed) for event in engine.events)
    engine.tick(103.5)  # nothing from the peer for 2.5 s
    assert engine.events[-1].error.condition == "amqp:resource-limit-exceeded"
    assert b"local-idle-timeout expired" in engine.data_to_send() and engine.finished


def test_a_write_between_ticks_never_leaves_the_peer_without_a_frame_for_its_idle_timeout():
    """A producer waiting long for its answer: its last transfer went out just after a tick,
    the next tick comes at that tick's heartbeat deadline. The write must not restart the
    count at that later tick, or the peer hears nothing for its whole idle timeout and drops
    us (a router waiting for a full disk lost its producers this way after 60 s)."""
    engine = amqp.Connection(container_id="client", server=False)
    engine.open()
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["router", None, None, None, UInt(60_000)]))
    engine.data_to_send()
    assert engine.tick(100.0) == pytest.approx(130.0)  # half the router's 60 s after our open
    engine.session()  # its begin is written at 100.1, after that tick
    assert engine.data_to_send()
    assert engine.tick(130.0) == pytest.approx(160.0)
    assert engine.data_to_send() == b"\x00\x00\x00\x08\x02\x00\x00\x00"  # 29.9 s after the transfer, not 59.9


def test_frames_sent_before_our_open_wait_for_it():
    engine = amqp.Connection(container_id="router")
    begin = frame(0x11, [None, UInt(0), UInt(100), UInt(100)])
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["peer"]) + begin)
    assert [type(event) for event in engine.events] == [amqp.ConnectionOpened]
    engine.open()
    assert [type(event) for event in engine.events] == [amqp.ConnectionOpened, amqp.SessionBegun]
    out = engine.data_to_send()
    assert out.index(b"\x00\x53\x10") < out.index(b"\x00\x53\x11")  # open, then begin


def test_termini_round_trip_with_filters_and_capabilities():
    selector = Described(ULong(0x0000468C00000004), "color = 'red'")
    source = amqp.Terminus(
        kind=amqp.SOURCE,
        address="topic://news",
        durable=2,
        expiry_policy="never",
        distribution_mode="copy",
        filter={"jms-selector": selector},
        capabilities=["topic"],
    )
    again = amqp.Terminus.from_value(Described(*_redecode(source.described())))
    assert again == source


def _redecode(described: Described) -> tuple:
    value, _ = decode(encode(described))
    return value.descriptor, value.value


def test_a_disposition_naming_every_delivery_id_settles_only_ours():
    engine = opened_engine()
    link = attached_link(engine, peer_receives=True)
    engine.receive_data(frame(0x13, [UInt(0), UInt(100), UInt(0), UInt(100), UInt(0), UInt(0), UInt(10)]))
    sent = [link.send(b"m") for _ in range(3)]
    accepted = Described(ULong(amqp.ACCEPTED_CODE), [])
    engine.receive_data(frame(0x15, [True, UInt(0), UInt(0xFFFFFFFF), True, accepted]))  # 2**32 ids
    assert link.handler.outcomes == [(delivery_id, amqp.ACCEPTED_CODE, True) for delivery_id in sent]
    assert not engine.finished


def test_a_refused_open_reads_nothing_after_it():
    engine = amqp.Connection(container_id="router")
    begin = frame(0x11, [None, UInt(0), UInt(100), UInt(100)])
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["peer"]) + begin)
    engine.close(amqp.Error("amqp:invalid-field", "client id in use"))
    out = engine.data_to_send()
    assert [type(event) for event in engine.events] == [amqp.ConnectionOpened]
    assert b"\x00\x53\x10" in out and b"\x00\x53\x18" in out and b"\x00\x53\x11" not in out
    assert engine.finished


VALID = (
    frame(0x11, [None, UInt(0), UInt(100), UInt(100)])
    + frame(0x12, ["l", UInt(0), False, None, None, None, amqp.Terminus(kind=amqp.TARGET).described()])
    + frame(0x14, [UInt(0), UInt(0), b"t", UInt(0), False], b"\x00\x53\x77\xa1\x02hi")
)


@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_any_bytes_end_in_events_never_in_exceptions(data):
    """Random and mutated byte streams after a valid open: the engine only ever answers with
    events and a close; nothing escapes receive_data."""
    stream = bytearray(VALID)
    for _ in range(data.draw(st.integers(0, 6))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    stream += data.draw(st.binary(max_size=64))
    engine = opened_engine(max_frame_size=4096)
    pieces = data.draw(st.lists(st.integers(1, 40), max_size=6))
    for size in pieces:
        chunk, stream = bytes(stream[:size]), stream[size:]
        engine.receive_data(chunk)
        for event in engine.events:
            if isinstance(event, amqp.LinkAttached):
                event.link.handler = Recorder()
                event.link.attach()
                event.link.flow(5)
        engine.events.clear()
    engine.receive_data(bytes(stream))
    engine.data_to_send()
    if engine.finished:
        assert engine.data_to_send() is None


# -- client mode: our engine (after our SASL client) against proton as the server ------------------


class ServerPeer:
    """proton as the server (SASL ANONYMOUS, then AMQP), our SASL client and client-mode
    engine in front of it, in memory. proton's side opens what is opened to it, grants
    ``credit`` to links it receives on and keeps what arrives."""

    def __init__(self, *, max_frame: int = 0, credit: int = 100, refuse: str | None = None):
        self.transport = proton.Transport(proton.Transport.SERVER)
        if max_frame:
            self.transport.max_frame_size = max_frame
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.server = proton.Connection()
        self.server.container = "broker"
        self.collector = proton.Collector()
        self.server.collect(self.collector)
        self.transport.bind(self.server)
        self.sasl = SaslClient(hostname="broker")
        self.engine = amqp.Connection(container_id="client", server=False, hostname="broker")
        self.engine.open()  # pipelined: sent once SASL is done, before proton's header came
        self.sasl_done = False
        self.credit, self.refuse = credit, refuse
        self.received: list[tuple[bytes, proton.Delivery]] = []
        self.links: dict[str, proton.Link] = {}
        self.session: amqp.Session | None = None

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            out = self.engine.data_to_send() if self.sasl_done else self.sasl.data_to_send
            if out:
                self.transport.push(out)
                moved = True
            if (pending := self.transport.pending()) > 0:
                data = self.transport.peek(pending)
                self.transport.pop(pending)
                if self.sasl_done:
                    self.engine.receive_data(data)
                elif self.sasl.receive_data(data):
                    self.sasl_done = True
                    if self.sasl.remaining:
                        self.engine.receive_data(self.sasl.remaining)
                moved = True
            moved = self.serve() or moved
            if not moved:
                return
        raise AssertionError("the two engines keep talking")

    def serve(self) -> bool:
        acted = False
        while (event := self.collector.peek()) is not None:
            acted = True
            kind = event.type
            if kind == proton.Event.CONNECTION_REMOTE_OPEN:
                event.connection.open()
            elif kind == proton.Event.SESSION_REMOTE_OPEN:
                event.session.open()
            elif kind == proton.Event.LINK_REMOTE_OPEN:
                link = event.link
                self.links[link.name] = link
                link.source.copy(link.remote_source)
                link.target.copy(link.remote_target)
                if link.is_receiver:
                    link.flow(self.credit)
                link.open()
                if self.refuse and link.name == self.refuse:
                    link.condition = proton.Condition("amqp:not-found", "no such node")
                    link.close()
            elif kind == proton.Event.DELIVERY and event.link.is_receiver:
                delivery = event.delivery
                if delivery.readable and not delivery.partial:
                    self.received.append((event.link.recv(delivery.pending), delivery))
                    event.link.advance()
            elif kind == proton.Event.LINK_REMOTE_CLOSE:
                event.link.close()
            elif kind == proton.Event.CONNECTION_REMOTE_CLOSE:
                event.connection.close()
            self.collector.pop()
        return acted

    def link(self, name: str, *, sender: bool, address: str = "q") -> amqp.Link:
        if self.session is None:
            self.session = self.engine.session()
        session = self.session
        link = session.link(name, sender=sender)
        link.source = amqp.Terminus(kind=amqp.SOURCE, address=None if sender else address)
        link.target = amqp.Terminus(kind=amqp.TARGET, address=address if sender else None)
        link.handler = Recorder()
        link.attach()
        return link


def test_client_mode_sends_receives_and_closes_against_a_proton_server():
    peer = ServerPeer()
    assert peer.engine.state is amqp.ConnectionState.OPEN_PIPE
    peer.pump()
    engine = peer.engine
    assert engine.opened and engine.remote_container_id == "broker" and peer.server.remote_hostname == "broker"
    sender, receiver = peer.link("up", sender=True), peer.link("down", sender=False)
    peer.pump()
    attached = [event.link for event in engine.events if isinstance(event, amqp.LinkAttached)]
    assert attached == [sender, receiver] and sender.credit == 100
    assert peer.links["up"].remote_target.address == "q" and peer.links["down"].remote_source.address == "q"

    sent = [sender.send(f"m{n}".encode()) for n in range(20)]
    peer.pump()
    assert [payload for payload, _ in peer.received] == [f"m{n}".encode() for n in range(20)]
    for _, delivery in peer.received:
        delivery.update(proton.Delivery.ACCEPTED)
        delivery.settle()
    peer.pump()
    assert sender.handler.outcomes == [(delivery_id, amqp.ACCEPTED_CODE, True) for delivery_id in sent]

    receiver.flow(10)
    peer.pump()
    proton_sender = peer.links["down"]
    assert proton_sender.credit == 10
    deliveries = []
    for n in range(5):
        deliveries.append(proton_sender.delivery(str(n)))
        proton_sender.send(f"r{n}".encode())
        proton_sender.advance()
    peer.pump()
    assert [payload for _, payload, _ in receiver.handler.transfers] == [f"r{n}".encode() for n in range(5)]
    for delivery_id, _, _ in receiver.handler.transfers:
        receiver.settle(delivery_id, amqp.ACCEPTED)
    peer.pump()
    assert all(d.remote_state == proton.Delivery.ACCEPTED and d.settled for d in deliveries)
    assert proton_sender.credit == 5

    engine.close()
    assert not engine.finished  # a client waits for the server's close
    peer.pump()
    assert peer.server.state & proton.Endpoint.REMOTE_CLOSED and engine.finished
    assert engine.data_to_send() is None


def test_client_mode_multi_frame_send_with_a_transactional_state():
    peer = ServerPeer(max_frame=512)
    peer.pump()
    sender = peer.link("up", sender=True)
    peer.pump()
    big = bytes(range(256)) * 12  # 3,072 bytes: seven frames of 512
    state = amqp.outcome(amqp.TRANSACTIONAL_STATE, b"txn-1")
    out_before = len(peer.received)
    sender.send(big, False, state)
    peer.pump()
    assert len(peer.received) == out_before + 1
    payload, delivery = peer.received[-1]
    assert payload == big and delivery.remote_state == amqp.TRANSACTIONAL_STATE
    assert list(delivery.remote.data) == [b"txn-1"]


def test_client_mode_refused_attach_and_peer_close():
    peer = ServerPeer(refuse="nowhere")
    peer.pump()
    link = peer.link("nowhere", sender=True, address="missing")
    peer.pump()
    detached = [event for event in peer.engine.events if isinstance(event, amqp.LinkDetached)]
    assert detached and detached[0].link is link and detached[0].closed
    assert detached[0].error == amqp.Error("amqp:not-found", "no such node")
    link.detach()
    peer.server.condition = proton.Condition("amqp:connection:forced", "shutting down")
    peer.server.close()
    peer.pump()
    closed = [event for event in peer.engine.events if isinstance(event, amqp.ConnectionClosed)]
    assert closed == [amqp.ConnectionClosed(amqp.Error("amqp:connection:forced", "shutting down"), by_peer=True)]
    assert peer.engine.finished and peer.transport.closed


# -- breaches answered at their scope: a link, a session, the connection [2.8.15-2.8.17] ----------


def performatives(data: bytes) -> list[tuple[int, int, list]]:
    """(channel, code, fields) of each frame we wrote, headers and empty frames skipped."""
    got, offset = [], 0
    while offset < len(data):
        if data.startswith(b"AMQP", offset):
            offset += 8
            continue
        size, _, _, channel = struct.unpack_from(">IBBH", data, offset)
        if size > 8:
            value, _ = decode(data, offset + 8)
            got.append((channel, int(value.descriptor), value.value + [None] * 12))
        offset += size
    return got


def begin(channel: int = 0) -> bytes:
    return frame(0x11, [None, UInt(0), UInt(1000), UInt(1000)], channel=channel)


def attach(name: str, handle: int, *, peer_receives: bool, channel: int = 0) -> bytes:
    terminus = amqp.Terminus(kind=amqp.SOURCE if peer_receives else amqp.TARGET, address="q").described()
    source, target = (terminus, None) if peer_receives else (None, terminus)
    return frame(
        0x12,
        [name, UInt(handle), peer_receives, None, None, source, target, None, None, None if peer_receives else UInt(0)],
        channel=channel,
    )


def transfer(
    handle: int,
    delivery_id: int | None,
    *,
    channel: int = 0,
    more: bool = False,
    payload: bytes = b"\x00\x53\x77\xa1\x02hi",
) -> bytes:
    return frame(
        0x14,
        [UInt(handle), None if delivery_id is None else UInt(delivery_id), b"t", UInt(0), False, more],
        payload,
        channel=channel,
    )


def answered(engine: amqp.Connection, credit: int = 10) -> dict[str, amqp.Link]:
    """The owner's side: answer every attach (credit for what the peer sends); the links by name."""
    links = {}
    for event in engine.events:
        if isinstance(event, amqp.LinkAttached):
            link = links[event.link.name] = event.link
            link.source, link.target = link.remote_source, link.remote_target
            link.handler = Recorder()
            link.attach()
            if not link.is_sender:
                link.flow(credit)
    engine.events.clear()
    return links


def test_a_transfer_beyond_credit_detaches_that_link_and_the_rest_keeps_working():
    """[2.6.7] transfer-limit-exceeded on one link: a closing detach with the error and a
    LinkDetached for the owner; what the peer sends on it until its detach is dropped
    (but counted by the session); the other links carry on; once the peer's detach
    answered, its handle takes a new link."""
    engine = opened_engine()
    engine.receive_data(
        begin()
        + attach("bad", 0, peer_receives=False)
        + attach("good", 1, peer_receives=False)
        + attach("out", 2, peer_receives=True)
    )
    links = answered(engine)
    bad, good, out = links["bad"], links["good"], links["out"]
    bad.flow(2)
    engine.data_to_send()
    engine.receive_data(transfer(0, 0) + transfer(0, 1) + transfer(0, 2))
    assert [event.link for event in engine.events] == [bad]
    detached = engine.events.pop()
    assert (detached.closed, detached.error.condition, detached.by_peer) == (
        True,
        "amqp:link:transfer-limit-exceeded",
        False,
    )
    assert bad.handler.transfers == [(0, b"\x00\x53\x77\xa1\x02hi", False), (1, b"\x00\x53\x77\xa1\x02hi", False)]
    [(_, code, fields)] = performatives(engine.data_to_send())
    assert code == amqp.DETACH and fields[0] == bad.handle and fields[1] is True
    assert amqp.Error.from_value(fields[2]).condition == "amqp:link:transfer-limit-exceeded"
    assert bad.state is amqp.LinkState.DISCARDING and not bad.attached and bad.credit == 0

    engine.receive_data(
        transfer(0, 3)
        + frame(
            0x13, [UInt(0), UInt(1000), UInt(0), UInt(1000), UInt(0), UInt(0), UInt(5)]
        )  # a flow for "bad": dropped too
        + transfer(1, 4)
        + frame(0x13, [UInt(0), UInt(1000), UInt(0), UInt(1000), UInt(2), UInt(0), UInt(1)])
    )  # credit for "out"
    assert [type(event) for event in engine.events] == [amqp.LinkFlow] and engine.events.pop().link is out
    assert len(bad.handler.transfers) == 2 and bad.credit == 0
    assert [delivery_id for delivery_id, _, _ in good.handler.transfers] == [4]
    good.settle(4, amqp.ACCEPTED)
    good.flow(10)
    out.send(b"reply")
    written = performatives(engine.data_to_send())
    assert [code for _, code, _ in written] == [amqp.DISPOSITION, amqp.FLOW, amqp.TRANSFER]
    assert written[1][2][0] == 5  # next-incoming-id: all five transfers counted, the dropped ones too
    assert written[2][2][0] == out.handle

    engine.receive_data(frame(0x16, [UInt(0), True]))  # the peer's answering detach: handle 0 is free
    assert engine.events == [amqp.LinkDetached(bad, True, None)] and bad.state is amqp.LinkState.DETACHED
    engine.events.clear()
    engine.receive_data(attach("again", 0, peer_receives=False))
    again = answered(engine)["again"]
    assert again is not bad and again.remote_handle == 0 and again.state is amqp.LinkState.ATTACHED
    engine.receive_data(transfer(0, 5))
    assert [delivery_id for delivery_id, _, _ in again.handler.transfers] == [5]
    assert not engine.finished and engine.opened


@pytest.mark.parametrize(
    "breach, condition",
    [
        (transfer(2, 0), "amqp:not-allowed"),  # a transfer on a link where the peer receives
        (transfer(0, 0, more=True) + transfer(0, 9), "amqp:not-allowed"),  # a continuation naming another delivery
        (transfer(0, None), "amqp:decode-error"),  # a first transfer without a delivery-id
        (
            transfer(0, 0, more=True, payload=b"x" * 400) + transfer(0, None, payload=b"y" * 400),
            "amqp:link:message-size-exceeded",
        ),
    ],
)
def test_other_link_breaches_detach_only_that_link(breach, condition):
    engine = opened_engine(max_message_size=600)
    engine.receive_data(
        begin()
        + attach("in", 0, peer_receives=False)
        + attach("other", 1, peer_receives=False)
        + attach("out", 2, peer_receives=True)
    )
    links = answered(engine)
    engine.data_to_send()
    engine.receive_data(breach + transfer(1, 20))
    detached = [event for event in engine.events if isinstance(event, amqp.LinkDetached)]
    assert [(event.error.condition, event.by_peer, event.closed) for event in detached] == [(condition, False, True)]
    assert detached[0].link.state is amqp.LinkState.DISCARDING
    assert [delivery_id for delivery_id, _, _ in links["other"].handler.transfers] == [20]
    written = performatives(engine.data_to_send())
    assert [(code, fields[0]) for _, code, fields in written] == [(amqp.DETACH, detached[0].link.handle)]
    assert engine.opened


def test_a_transfer_before_the_owner_answered_the_attach_is_refused_with_an_attach_and_a_detach():
    """A client that pipelines a transfer behind its attach sends beyond (zero) credit. The
    link has to be attached before it can be detached [2.6.3]: our attach with a null
    target, then the detach; the owner's late answer does nothing."""
    engine = opened_engine()
    engine.data_to_send()
    engine.receive_data(begin() + attach("eager", 0, peer_receives=False) + transfer(0, 0))
    assert [type(event) for event in engine.events] == [amqp.SessionBegun, amqp.LinkAttached, amqp.LinkDetached]
    link = engine.events[1].link
    assert engine.events[2] == amqp.LinkDetached(link, True, engine.events[2].error, by_peer=False)
    written = performatives(engine.data_to_send())
    assert [code for _, code, _ in written] == [amqp.BEGIN, amqp.ATTACH, amqp.DETACH]
    assert written[1][2][6] is None  # a null target: refused
    engine.events.clear()
    link.handler = Recorder()
    link.attach()  # the owner answering LinkAttached: too late, nothing goes out
    link.flow(10)
    link.detach()
    assert engine.data_to_send() == b"" and link.state is amqp.LinkState.DISCARDING


@pytest.mark.parametrize(
    "breach, condition",
    [
        (transfer(5, 0), "amqp:session:unattached-handle"),
        (
            frame(0x13, [UInt(0), UInt(1000), UInt(0), UInt(1000), UInt(5), UInt(0), UInt(1)]),
            "amqp:session:unattached-handle",
        ),  # a flow naming no link
        (frame(0x16, [UInt(5), True]), "amqp:session:unattached-handle"),
        (attach("twice", 0, peer_receives=False), "amqp:session:handle-in-use"),
    ],
)
def test_a_session_breach_ends_only_that_session(breach, condition):
    """[2.5.5] the session ends with the error (its links with it); frames on its channel are
    dropped until the peer's end; the other session carries on; the channel is free again
    after the peer's end."""
    engine = opened_engine()
    engine.receive_data(
        begin(0)
        + attach("first", 0, peer_receives=False)
        + begin(1)
        + attach("second", 0, peer_receives=False, channel=1)
    )
    links = answered(engine)
    first, second = links["first"], links["second"]
    engine.data_to_send()
    engine.receive_data(breach)
    session = first.session
    assert engine.events == [
        amqp.LinkDetached(first, False, engine.events[0].error, by_peer=False),
        amqp.SessionEnded(session, engine.events[0].error, by_peer=False),
    ]
    assert engine.events[0].error.condition == condition and session.state is amqp.SessionState.DISCARDING
    assert first.state is amqp.LinkState.DETACHED
    [(channel, code, fields)] = performatives(engine.data_to_send())
    assert (channel, code) == (session.channel, amqp.END) and amqp.Error.from_value(fields[0]).condition == condition
    engine.events.clear()

    engine.receive_data(transfer(0, 1) + attach("late", 1, peer_receives=False) + transfer(0, 2, channel=1))
    assert not engine.events and not first.handler.transfers  # channel 0: dropped
    assert [delivery_id for delivery_id, _, _ in second.handler.transfers] == [2]
    engine.receive_data(frame(0x17, [], channel=0))  # the peer's end
    assert engine.events == [amqp.SessionEnded(session, None)] and session.state is amqp.SessionState.ENDED
    assert engine.data_to_send() == b""  # ours went first: no second end
    engine.events.clear()
    engine.receive_data(begin(0))
    assert [type(event) for event in engine.events] == [amqp.SessionBegun] and engine.opened


def test_a_handle_above_handle_max_closes_the_connection():
    """[2.7.2] "A peer that receives a handle outside the supported range MUST close the
    connection with the framing-error error-code"."""
    engine = opened_engine(handle_max=3)
    engine.receive_data(begin())
    assert performatives(engine.data_to_send())[-1][2][4] == 3  # our begin's handle-max
    engine.receive_data(attach("high", 4, peer_receives=False))
    assert engine.events[-1] == amqp.ConnectionClosed(engine.events[-1].error, by_peer=False)
    assert engine.events[-1].error.condition == "amqp:connection:framing-error"


def test_the_owners_misuse_raises_and_its_repeated_calls_do_nothing():
    engine = amqp.Connection(container_id="router")
    with pytest.raises(amqp.LocalProtocolError, match="session while awaiting the protocol header"):
        engine.session()  # before our open
    engine.receive_data(amqp.AMQP_HEADER + frame(0x10, ["peer"]))
    engine.open()
    with pytest.raises(amqp.LocalProtocolError) as raised:
        engine.open()
    assert (raised.value.condition, raised.value.scope) == ("amqp:not-allowed", "connection")
    engine.receive_data(begin() + attach("l", 0, peer_receives=False))
    link = engine.events[-1].link
    engine.data_to_send()
    for premature in (link.detach, lambda: link.flow(1)):  # before our attach
        with pytest.raises(amqp.LocalProtocolError) as raised:
            premature()
        assert raised.value.scope == "link" and raised.value.endpoint is link
    assert link.state is amqp.LinkState.ATTACH_RCVD and engine.data_to_send() == b""
    link.attach()
    link.attach()
    link.detach()
    link.detach(error=amqp.Error("amqp:internal-error", "again"))
    assert [code for _, code, _ in performatives(engine.data_to_send())] == [amqp.ATTACH, amqp.DETACH]
    session = link.session
    session.end()
    session.end()
    with pytest.raises(amqp.LocalProtocolError) as raised:
        session.link("late", sender=True)
    assert raised.value.scope == "session" and raised.value.endpoint is session
    assert [code for _, code, _ in performatives(engine.data_to_send())] == [amqp.END]


def test_a_client_may_end_a_session_before_the_peer_answered_its_begin():
    """Begin and end pipelined: the peer's begin, then its end, still arrive and are taken
    (before, the forgotten channel made the begin a connection error)."""
    engine = amqp.Connection(container_id="client", server=False)
    engine.open()
    session = engine.session()
    session.end()
    assert session.state is amqp.SessionState.END_PIPE
    engine.receive_data(
        amqp.AMQP_HEADER
        + frame(0x10, ["broker"])
        + frame(0x11, [UShort(0), UInt(0), UInt(10), UInt(10)])
        + frame(0x17, [])
    )
    assert session.state is amqp.SessionState.ENDED and engine.opened
    assert [type(event) for event in engine.events] == [amqp.ConnectionOpened, amqp.SessionEnded]
    assert engine.session().channel == 0  # the channel is free again


def test_what_a_handler_may_do_from_inside_a_call():
    """LinkHandler's contract: the credit already counts the delivery; a handler may settle,
    grant credit and detach from inside on_transfer; after its detach with an error, or its
    close of the connection, nothing more of that read reaches a handler."""
    engine = opened_engine()
    engine.receive_data(begin() + attach("in", 0, peer_receives=False) + attach("other", 1, peer_receives=False))
    links = answered(engine, credit=10)
    engine.data_to_send()
    seen = []

    class Busy:
        def __init__(self, link):
            self.link = link

        def on_transfer(self, delivery_id, payload, settled, state):
            seen.append((self.link.name, delivery_id, self.link.credit))
            if delivery_id == 0:
                self.link.settle(delivery_id, amqp.ACCEPTED)
                self.link.flow(20)
            elif delivery_id == 1:
                self.link.detach(error=amqp.Error("amqp:internal-error", "enough"))
            elif delivery_id == 4:
                engine.close()

    for link in links.values():
        link.handler = Busy(link)
    engine.receive_data(transfer(0, 0) + transfer(0, 1) + transfer(0, 2) + transfer(1, 3))
    assert seen == [("in", 0, 9), ("in", 1, 19), ("other", 3, 9)]
    assert not engine.events  # the owner's own detach: no event
    written = performatives(engine.data_to_send())
    assert [code for _, code, _ in written] == [amqp.DISPOSITION, amqp.FLOW, amqp.DETACH]
    engine.receive_data(transfer(1, 4) + transfer(1, 5) + transfer(1, 6))
    assert seen[-1] == ("other", 4, 8) and len(seen) == 4
    assert [code for _, code, _ in performatives(engine.data_to_send())] == [amqp.CLOSE]


# -- the same against a live router, over a socket, from raw frames --------------------------------


class RawClient:
    """A client made of raw frames on a trio socket (no engine of ours on this side): it
    writes what the test says and reads the router's frames with the codec."""

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self.buffer = b""
        self.unclaimed: list[tuple[int, int, list, bytes]] = []  # read, not asked for yet

    async def send(self, *frames: bytes) -> None:
        await self.stream.send_all(b"".join(frames))

    async def receive(self, code: int, match=lambda fields, payload: True) -> tuple[int, list, bytes]:
        """The router's first ``code`` performative (not taken before) that ``match``
        accepts: (channel, fields, payload)."""
        with trio.fail_after(10):
            while True:
                for index, (channel, kind, fields, payload) in enumerate(self.unclaimed):
                    if kind == code and match(fields, payload):
                        del self.unclaimed[index]
                        return channel, fields, payload
                if self.buffer.startswith(b"AMQP"):
                    self.buffer = self.buffer[8:]
                elif len(self.buffer) >= 8 and len(self.buffer) >= (size := struct.unpack_from(">I", self.buffer)[0]):
                    whole, self.buffer = self.buffer[:size], self.buffer[size:]
                    if size > 8 and whole[5] == 0:  # (not an empty frame, nor SASL's)
                        value, after = decode(whole, whole[4] * 4)
                        self.unclaimed.append(
                            (
                                struct.unpack_from(">H", whole, 6)[0],
                                int(value.descriptor),
                                value.value + [None] * 12,
                                whole[after:],
                            )
                        )
                else:
                    data = await self.stream.receive_some(65536)
                    assert data, "the router closed the connection"
                    self.buffer += data


def flow(handle: int, credit: int, channel: int = 0) -> bytes:
    return frame(0x13, [UInt(0), UInt(1000), UInt(0), UInt(1000), UInt(handle), UInt(0), UInt(credit)], channel=channel)


def named(name: str):
    return lambda fields, payload: fields[0] == name


def disposition(first: int) -> bytes:
    return frame(0x15, [True, UInt(first), UInt(first), True, Described(ULong(amqp.ACCEPTED_CODE), [])])


async def test_a_live_router_detaches_the_breaching_link_and_ends_the_breaching_session_only(amqp_broker):
    """A client on a real socket pipelines a transfer behind the attach of its link "bad"
    (zero credit: beyond it [2.6.7]); the router refuses that link alone — attach with a
    null target, detach with amqp:link:transfer-limit-exceeded — while the client's other
    links on the same connection send and receive, and handle 0 takes a new link once the
    detach exchange is done. A transfer on a handle nobody attached then ends the second
    session alone (amqp:session:unattached-handle), releasing its consumer."""
    running = await amqp_broker()
    stream = await trio.open_tcp_stream("127.0.0.1", running.port)
    client = RawClient(stream)
    sasl_init = encode(Described(ULong(0x41), [Symbol("ANONYMOUS"), b"raw", None]))
    hello = b"\x00\x53\x77\xa1\x05hello"
    await client.send(
        amqp.SASL_HEADER,
        struct.pack(">IBBH", 8 + len(sasl_init), 2, 1, 0),
        sasl_init,
        amqp.AMQP_HEADER,
        frame(0x10, ["raw-client"]),
        begin(),
        attach("bad", 0, peer_receives=False),
        transfer(0, 0),
    )
    _, refused, _ = await client.receive(amqp.ATTACH, named("bad"))
    assert refused[6] is None  # a null target: the router refuses the link
    _, detach, _ = await client.receive(amqp.DETACH)
    assert detach[0] == refused[1] and detach[1] is True
    assert amqp.Error.from_value(detach[2]).condition == "amqp:link:transfer-limit-exceeded"

    out_target = amqp.Terminus(kind=amqp.TARGET, address="q2").described()
    in_source = amqp.Terminus(kind=amqp.SOURCE, address="q2").described()
    await client.send(
        frame(0x16, [UInt(0), True]),  # our answer: handle 0 is free again
        frame(0x12, ["out", UInt(1), False, None, None, None, out_target, None, None, UInt(0)]),
        frame(0x12, ["in", UInt(2), True, None, None, in_source, None]),
        flow(2, 10),
    )
    _, out, _ = await client.receive(amqp.ATTACH, named("out"))
    _, inbound, _ = await client.receive(amqp.ATTACH, named("in"))
    await client.receive(amqp.FLOW, lambda fields, _: fields[4] == out[1] and fields[6])
    await client.send(transfer(1, 1, payload=hello))
    _, settled, _ = await client.receive(amqp.DISPOSITION, lambda fields, _: fields[1] == 1)
    assert settled[3] is True and amqp.state_code(settled[4]) == amqp.ACCEPTED_CODE
    _, delivered, payload = await client.receive(amqp.TRANSFER, lambda fields, _: fields[0] == inbound[1])
    assert payload.endswith(hello)
    await client.send(disposition(delivered[1]), attach("again", 0, peer_receives=False))
    _, again, _ = await client.receive(amqp.ATTACH, named("again"))
    assert again[6] is not None  # a target: taken this time
    await client.receive(amqp.FLOW, lambda fields, _: fields[4] == again[1] and fields[6])
    await client.send(transfer(0, 2))
    await client.receive(amqp.DISPOSITION, lambda fields, _: fields[1] == 2)

    sub_source = amqp.Terminus(kind=amqp.SOURCE, address="q3").described()
    await client.send(
        begin(1), frame(0x12, ["sub", UInt(0), True, None, None, sub_source, None], channel=1), flow(0, 10, channel=1)
    )
    await client.receive(amqp.ATTACH, named("sub"))  # (sent once its consumer exists)
    assert running.usage("q3")["consumers"] == 1
    await client.send(transfer(7, 0, channel=1))  # handle 7: not attached
    channel, end, _ = await client.receive(amqp.END)
    assert channel == 1 and amqp.Error.from_value(end[0]).condition == "amqp:session:unattached-handle"
    await client.send(frame(0x17, [], channel=1), transfer(1, 3, payload=hello))  # session 0 goes on
    await client.receive(amqp.DISPOSITION, lambda fields, _: fields[1] == 3)
    await client.receive(amqp.TRANSFER, lambda fields, _: fields[0] == inbound[1])
    connection = next(iter(running.router.swiftlet("sys$jms")._live))
    assert sorted(link.name for link in connection.links) == ["again", "in", "out"]
    assert running.usage("q3")["consumers"] == 0  # the ended session's consumer is gone
    assert running.usage("q")["enqueued"] == 1  # "again"'s message; "bad"'s was refused
    await stream.aclose()


def test_a_server_connection_keeps_its_instance_dict_small():
    """At 30 instance attributes CPython 3.11 stops sharing the keys of instance dicts, and
    every attribute load on the per-message paths gets slower (measured: Link.send +3 %)."""
    assert len(vars(amqp.Connection(container_id="router"))) <= 29
