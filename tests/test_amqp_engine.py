"""The AMQP engine (swiftlets/jms/amqp.py) against proton's engine as the peer, in memory:
bytes are pumped between our sans-IO connection and a proton client transport, so every
frame we write is judged by proton and every frame proton writes is read by us."""

from __future__ import annotations

import struct

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging.codec import Described, UInt, ULong, encode
from martinet.messaging import amqp
from martinet.messaging.amqp.sasl import SaslClient


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

    def __init__(self, *, client_max_frame: int = 0, server_max_frame: int = 65536, credit: int = 1000,
                 idle_timeout: float = 0.0):
        self.engine = amqp.Connection(container_id="router", max_frame_size=server_max_frame,
                                      idle_timeout=idle_timeout)
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
        for n, delivery_id in enumerate(sent)]
    assert not outbound.session.unsettled_out


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


@pytest.mark.parametrize("garbage, condition", [
    (b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x13\xff", "amqp:decode-error"),  # unknown constructor
    (b"\x00\x00\x00\x04\x02\x00\x00\x00", "amqp:connection:framing-error"),  # size below the header
    (b"\x00\x10\x00\x00\x02\x00\x00\x00", "amqp:connection:framing-error"),  # above max-frame-size
    (b"\x00\x00\x00\x0c\x02\x01\x00\x00abcd", "amqp:connection:framing-error"),  # a SASL frame now
    (frame(0x12, ["l", UInt(0), False], channel=7), "amqp:not-allowed"),  # attach on a channel not begun
    (frame(0x14, [UInt(3), UInt(0), b"t"]), "amqp:not-allowed"),  # transfer before begin
])
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
    source = amqp.Terminus(kind=amqp.SOURCE, address="topic://news", durable=2, expiry_policy="never",
                           distribution_mode="copy", filter={"jms-selector": selector}, capabilities=["topic"])
    again = amqp.Terminus.from_value(Described(*_redecode(source.described())))
    assert again == source


def _redecode(described: Described) -> tuple:
    from martinet.messaging.codec import decode
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


VALID = (frame(0x11, [None, UInt(0), UInt(100), UInt(100)])
         + frame(0x12, ["l", UInt(0), False, None, None, None, amqp.Terminus(kind=amqp.TARGET).described()])
         + frame(0x14, [UInt(0), UInt(0), b"t", UInt(0), False], b"\x00\x53\x77\xa1\x02hi"))


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
        session = self.engine.channels.get(0) or self.engine.session()
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
