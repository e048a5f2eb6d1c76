"""Random and mutated byte streams thrown at a live AMQP listener; afterwards a normal client
must still be served. Every stream gets the router's header or nothing, then a closed socket
within bounded time (the listener's SASL timeout bounds a peer that stops mid-frame)."""

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
from martinet.messaging.codec import Described, Symbol, ULong, encode

CONFIG = """<router name="fuzz" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{store}" sync="off"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="0" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""


def frame(performative: int, fields: list, kind: int = 0) -> bytes:
    body = encode(Described(ULong(performative), fields))
    return (8 + len(body)).to_bytes(4, "big") + bytes([2, kind, 0, 0]) + body


VALID = (SASL_HEADER + frame(0x41, [Symbol("ANONYMOUS"), b"x", None], kind=1) + AMQP_HEADER
         + frame(0x10, ["fuzzer"]) + frame(0x11, [None, 0, 100, 100]) + frame(0x12, ["l", 0, False]))


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
    st.builds(lambda at, byte: VALID[:at] + bytes([byte]) + VALID[at + 1:], st.integers(0, len(VALID) - 1),
              st.integers(0, 255)),
)


def test_random_and_mutated_streams_then_a_normal_client(live):
    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(streams)
    def fuzz(data):
        reply = throw(live.port, data)
        assert reply == b"" or reply.startswith(b"AMQP")

    fuzz()
    connection = BlockingConnection(f"amqp://127.0.0.1:{live.port}", timeout=10)
    connection.create_sender("after-fuzz").send(Message(body="still serving"))
    assert connection.create_receiver("after-fuzz").receive(timeout=10).body == "still serving"
    connection.close()
