"""SASL, sans-IO, both sides: the exchanges of AMQP 1.0 part 5.3 and every way to break them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging.amqp.sasl import (
    ClientState,
    Credentials,
    SaslClient,
    SaslError,
    SaslRefused,
    SaslServer,
    State,
    sasl_frame,
)
from martinet.messaging.amqp.wire import AMQP_HEADER, SASL_HEADER
from martinet.messaging.codec import Described, Symbol, ULong, decode, encode


def init_frame(mechanism, response=None, hostname=None, *, frame_type=1):
    body = encode(Described(ULong(0x41), [Symbol(mechanism), response, hostname]))
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, 0) + body


def frames(data: bytes):
    """Our header, then the performatives of the SASL frames we sent."""
    assert data[:8] == SASL_HEADER
    data, out = data[8:], []
    while data:
        size = struct.unpack(">I", data[:4])[0]
        out.append(decode(data[8:size])[0])
        data = data[size:]
    return out


def outcome_code(data: bytes) -> int:
    size = struct.unpack(">I", data[:4])[0]
    performative = decode(data[8:size])[0]
    assert performative.descriptor == 0x44
    return performative.value[0]


def test_plain_in_pieces_then_the_amqp_bytes_pass_through():
    sasl = SaslServer()
    stream = SASL_HEADER + init_frame("PLAIN", b"\x00alice\x00secret", "broker.example") + AMQP_HEADER + b"rest"
    result = None
    for i in range(len(stream)):  # one byte at a time
        result = sasl.receive_data(stream[i : i + 1]) or result
        if i == 7:
            [mechanisms] = frames(sasl.data_to_send)
            assert mechanisms.descriptor == 0x40 and mechanisms.value[0].items == ("PLAIN", "ANONYMOUS")
    assert result == Credentials("PLAIN", "alice", "secret", "broker.example")
    sasl.accept()
    assert outcome_code(sasl.data_to_send) == 0 and sasl.state is State.DONE
    assert sasl.remaining == AMQP_HEADER + b"rest"


def test_anonymous_and_refusal():
    sasl = SaslServer()
    sasl.receive_data(SASL_HEADER)
    sasl.data_to_send  # noqa: B018 - the mechanisms, read and dropped
    assert sasl.receive_data(init_frame("ANONYMOUS", b"trace")) == Credentials("ANONYMOUS", None, None)
    sasl.refuse()
    assert outcome_code(sasl.data_to_send) == 1 and sasl.state is State.FAILED
    with pytest.raises(SaslError, match="not complete"):
        sasl.remaining  # noqa: B018


def test_a_client_without_sasl_is_anonymous_and_keeps_its_header():
    sasl = SaslServer()
    assert sasl.receive_data(AMQP_HEADER + b"open") == Credentials(None, None, None)
    sasl.accept()
    assert sasl.data_to_send == b"" and sasl.remaining == AMQP_HEADER + b"open"


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (b"HTTP/1.1", "not an AMQP 1.0 SASL or AMQP header"),
        (b"AMQP\x01\x01\x00\x00", "not an AMQP 1.0 SASL or AMQP header"),
        (b"GET", "not an AMQP 1.0 SASL or AMQP header"),
        (SASL_HEADER + init_frame("SCRAM-SHA-256"), "mechanism 'SCRAM-SHA-256' is not offered"),
        (SASL_HEADER + init_frame("PLAIN", b"no-separators"), "malformed PLAIN response"),
        (SASL_HEADER + struct.pack(">IBBH", 1 << 20, 2, 1, 0), "bad SASL frame header"),
        (SASL_HEADER + struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00" * 4, "bad SASL frame header"),
        (SASL_HEADER + struct.pack(">IBBH", 10, 2, 1, 0) + b"\x02\x03", "malformed SASL frame"),
        (SASL_HEADER + sasl_frame(0x44, [0]), "expected sasl-init"),
        (SASL_HEADER + init_frame("ANONYMOUS") + init_frame("ANONYMOUS"), None),
    ],
)
def test_broken_exchanges_are_refused(stream, message):
    sasl = SaslServer()
    if message is None:  # a second init, after the first is being decided
        sasl.receive_data(stream)
        assert sasl.state is State.DECIDING  # the second frame waits unread; accept then hands it on
        return
    with pytest.raises(SaslError, match=message):
        sasl.receive_data(stream)
    assert sasl.state is State.FAILED
    assert sasl.data_to_send.startswith(SASL_HEADER)  # the client learns which protocol we speak


def test_offered_mechanisms_are_configurable():
    sasl = SaslServer(mechanisms=("PLAIN",))
    sasl.receive_data(SASL_HEADER)
    assert frames(sasl.data_to_send)[0].value[0].items == ("PLAIN",)
    with pytest.raises(SaslError, match="'ANONYMOUS' is not offered"):
        sasl.receive_data(init_frame("ANONYMOUS"))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=64))
def test_random_input_only_ever_raises_sasl_errors(prefix, data):
    sasl = SaslServer()
    for chunk in (SASL_HEADER[: len(prefix) % 9] + prefix, data):
        try:
            sasl.receive_data(chunk)
        except SaslError:
            return


# -- the client side, against our server side --------------------------------------------------------


def exchange(client: SaslClient, server: SaslServer, *, accept: bool = True, trailing: bytes = b"") -> Credentials:
    """Run the exchange a byte at a time each way; the credentials the server saw."""
    credentials = None
    for _ in range(10):
        for byte in client.data_to_send:
            credentials = server.receive_data(bytes([byte])) or credentials
        if credentials is not None and server.state is State.DECIDING:
            server.accept() if accept else server.refuse()
        out = server.data_to_send + (trailing if server.state is State.DONE else b"")
        trailing = b"" if server.state is State.DONE else trailing
        for at in range(len(out)):
            if client.receive_data(out[at : at + 1]):
                client.receive_data(out[at + 1 :])  # the rest arrives after the outcome
                break
        if client.state is ClientState.DONE:
            return credentials
    raise AssertionError("the exchange did not end")


def test_client_plain_and_anonymous_against_our_server():
    client = SaslClient("alice", "s3cret", "broker.example")
    credentials = exchange(client, SaslServer(), trailing=AMQP_HEADER + b"open")
    assert credentials == Credentials("PLAIN", "alice", "s3cret", "broker.example")
    assert client.remaining == AMQP_HEADER + b"open"  # what follows SASL is for the AMQP engine
    anonymous = SaslClient()
    assert exchange(anonymous, SaslServer()).mechanism == "ANONYMOUS"


def test_client_refused_and_broken_exchanges():
    with pytest.raises(SaslRefused, match="code 1") as refused:
        exchange(SaslClient("alice", "wrong"), SaslServer(), accept=False)
    assert refused.value.code == 1
    with pytest.raises(SaslError, match="does not offer ANONYMOUS"):
        exchange(SaslClient(), SaslServer(mechanisms=("PLAIN",)))
    with pytest.raises(SaslError, match="does not speak SASL"):
        SaslClient().receive_data(AMQP_HEADER)
    client = SaslClient()
    with pytest.raises(SaslError, match="bad SASL frame header"):
        client.receive_data(SASL_HEADER + b"\x00\x00\x10\x00\x02\x00\x00\x00")  # a 4 KiB+ frame of type 0
    assert client.state is ClientState.FAILED
    client = SaslClient()
    with pytest.raises(SaslError, match="unexpected SASL performative"):
        client.receive_data(SASL_HEADER + sasl_frame(0x44, [ULong(0)]))  # an outcome before the mechanisms
