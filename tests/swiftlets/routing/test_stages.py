"""The routing link machine (swiftlets/routing/stages.py), both roles paired in memory, every path
of docs/routing-protocol.md: stages, admission, the authentication matrix, refusals and their
delay, stage-valid-timeout, keepalive, breaches, and fuzzing of recorded sessions."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from martinet.kernel import config as kernel_config
from martinet.messaging.io import Driver
from martinet.swiftlets.routing import handshake, stages
from martinet.swiftlets.routing.stages import (
    AUTH_FAILED,
    LABEL_CONNECTOR,
    LABEL_LISTENER,
    TRANSITIONS,
    Closed,
    CommitReceived,
    LinkMachine,
    LinkSettings,
    NonXaTransactionReceived,
    Operational,
    PeerIdentified,
    PrepareReceived,
    RecoveryReceived,
    RecoveryRequested,
    Role,
    RouteReceived,
    Stage,
    State,
    TransactionReceived,
    proof,
    valid_router_name,
)
from martinet.swiftlets.routing.wire import (
    DEFAULT_TRANSACTION_SIZE,
    MAGIC,
    Adjust,
    Auth,
    AuthReply,
    Close,
    CommitReply,
    Connect,
    ConnectReply,
    FrameType,
    Keepalive,
    LocalProtocolError,
    PrepareReply,
    Protocol,
    ProtocolReply,
    Route,
    StartDelivery,
    decode_body,
    encode,
)

from tests.swiftlets.routing.test_wire import ANY_FRAME

NONCE_C, NONCE_L = b"C" * 32, b"L" * 32
CONNECTOR, LISTENER = Role.CONNECTOR, Role.LISTENER
HELLO = MAGIC + encode(Protocol(versions=("1.1",)))  # what a connector sends first


def split(data: bytes) -> list[bytes]:
    """A side's output cut into the magic and whole frames."""
    chunks = []
    if data.startswith(MAGIC):
        chunks.append(MAGIC)
        data = data[len(MAGIC) :]
    while data:
        size = 4 + struct.unpack(">I", data[:4])[0]
        chunks.append(data[:size])
        data = data[size:]
    return chunks


def decoded(chunks: list[bytes]) -> list:
    return [decode_body(chunk[4:]) for chunk in chunks if chunk != MAGIC]


def connector(password=None, name="r1", now=0.0, **settings) -> LinkMachine:
    return LinkMachine(CONNECTOR, name, password, LinkSettings(**settings), now=now, nonce_source=lambda n: NONCE_C)


def listener(password=None, name="r2", now=0.0, **settings) -> LinkMachine:
    return LinkMachine(LISTENER, name, password, LinkSettings(**settings), now=now, nonce_source=lambda n: NONCE_L)


class Pair:
    """A connector and a listener joined in memory. Chunks (the magic, single frames) are
    delivered one at a time, so a test can stop either side in any state; PeerIdentified
    is answered with admit() unless told otherwise; the XA recovery is answered as an owner
    with nothing prepared would (an empty list; commit what the peer lists; commit
    recovery COMMITs at once) for the sides in ``recover``; ``drop`` holds the sides whose
    output is lost (a half-open connection)."""

    def __init__(
        self,
        c: LinkMachine | None = None,
        lis: LinkMachine | None = None,
        *,
        admit=(CONNECTOR, LISTENER),
        recover=(CONNECTOR, LISTENER),
        auto=(),
    ):
        self.c, self.l = c or connector(), lis or listener()
        self.machines = (self.c, self.l)
        self.admit = {m for m in self.machines if m.role in admit}
        self.recover = {m for m in self.machines if m.role in recover}
        self.auto = {m for m in self.machines if m.role in auto}  # transfers answered at once (answer())
        self.queue: dict[LinkMachine, list[bytes]] = {m: [] for m in self.machines}
        self.sent: dict[LinkMachine, list[bytes]] = {m: [] for m in self.machines}
        self.events: dict[LinkMachine, list] = {m: [] for m in self.machines}
        self.ended: dict[LinkMachine, bool] = {m: False for m in self.machines}
        self.drop: set[LinkMachine] = set()
        self._pump()

    def other(self, m: LinkMachine) -> LinkMachine:
        return self.l if m is self.c else self.c

    def _pump(self) -> None:
        busy = True
        while busy:
            busy = False
            for m in self.machines:
                new = m.events()
                self.events[m] += new
                if any(isinstance(e, PeerIdentified) for e in new) and m in self.admit:
                    m.admit()
                    busy = True
                if m in self.recover:
                    busy |= answer_recovery(m, new)
                if m in self.auto:
                    busy |= answer(m, new)
                data = m.data_to_send()
                if data is None:
                    self.ended[m] = True
                elif data:
                    chunks = split(data)
                    self.sent[m] += chunks
                    if m not in self.drop:
                        self.queue[m] += chunks

    def run(self, until=None) -> None:
        """Deliver chunks, one at a time, until nothing moves or ``until()`` holds."""
        while not (until and until()):
            sender = next((m for m in self.machines if self.queue[m]), None)
            if sender is None:
                return
            self.other(sender).receive_data(self.queue[sender].pop(0))
            self._pump()

    def tick(self, now: float, *machines: LinkMachine) -> None:
        for m in machines or self.machines:
            m.tick(now)
        self._pump()
        self.run()

    def closed(self, m: LinkMachine) -> Closed:
        [event] = [e for e in self.events[m] if isinstance(e, Closed)]
        return event

    def frames(self, m: LinkMachine) -> list:
        return decoded(self.sent[m])


def answer_recovery(m: LinkMachine, events: list) -> bool:
    """Play an owner with nothing prepared through the XA recovery stage; True if it acted."""
    acted = False
    for e in events:
        if isinstance(e, RecoveryRequested):
            m.recovery_list(())
        elif isinstance(e, RecoveryReceived):
            m.recovery_done(commit=e.xids)
        elif isinstance(e, CommitReceived) and e.recovery:
            m.committed(e.xid)
        else:
            continue
        acted = True
    return acted


def answer(m: LinkMachine, events: list) -> bool:
    """Answer the transfer events as an owner that prepares and commits at once; True if it acted."""
    acted = False
    for e in events:
        if isinstance(e, TransactionReceived):
            m.prepared(e.xid)
        elif isinstance(e, PrepareReceived):
            m.commit(e.xid)
        elif isinstance(e, CommitReceived) and not e.recovery:
            m.committed(e.xid)
        elif isinstance(e, NonXaTransactionReceived):
            m.nonxa_committed(e.seq)
        else:
            continue
        acted = True
    return acted


def answer_all(m: LinkMachine) -> list:
    """Drain ``m``'s events, answering the recovery and the transfers at once (admission
    excepted); the events, in order."""
    taken = []
    while new := m.events():
        taken += new
        answer_recovery(m, new)
        answer(m, new)
    return taken


def operational_pair(c_password=None, l_password=None, **settings) -> Pair:
    pair = Pair(connector(c_password, **settings), listener(l_password, **settings))
    pair.run()
    assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL
    return pair


# -- success ------------------------------------------------------------------------------------


@pytest.mark.parametrize("password", [None, "s3cret"])
def test_success_both_ends_operational(password):
    pair = operational_pair(password, password)
    c_events, l_events = pair.events[pair.c], pair.events[pair.l]
    assert c_events == [
        PeerIdentified(peer="r2", version="1.1", authentication=password is not None),
        RecoveryRequested(peer="r2"),
        RecoveryReceived(peer="r2", xids=()),
        Operational(
            peer="r2",
            version="1.1",
            peer_transaction_size=DEFAULT_TRANSACTION_SIZE,
            peer_window_size=10,
            keepalive_interval=60.0,
            use_xa=True,
        ),
    ]
    assert l_events == [
        PeerIdentified(peer="r1", version="1.1", authentication=password is not None),
        RecoveryRequested(peer="r1"),
        RecoveryReceived(peer="r1", xids=()),
        Operational(
            peer="r1",
            version="1.1",
            peer_transaction_size=DEFAULT_TRANSACTION_SIZE,
            peer_window_size=10,
            keepalive_interval=60.0,
            use_xa=True,
        ),
    ]
    c_types = [f.TYPE for f in pair.frames(pair.c)]
    l_types = [f.TYPE for f in pair.frames(pair.l)]
    auth_c = [FrameType.AUTH] if password else []
    auth_l = [FrameType.AUTH_REPLY] if password else []
    recovery = [FrameType.RECOVERY, FrameType.RECOVERY_DONE]  # the link uses XA
    assert c_types == [
        FrameType.PROTOCOL,
        FrameType.CONNECT,
        *auth_c,
        *recovery,
        FrameType.ADJUST,
        FrameType.START_DELIVERY,
    ]
    assert l_types == [
        FrameType.PROTOCOL_REPLY,
        FrameType.CONNECT_REPLY,
        *auth_l,
        *recovery,
        FrameType.ADJUST,
        FrameType.START_DELIVERY,
    ]
    assert pair.sent[pair.c][0] == MAGIC and pair.sent[pair.l][0] == MAGIC
    assert pair.c.stage is Stage.DELIVERY and pair.l.stage is Stage.DELIVERY
    wire = b"".join(pair.sent[pair.c] + pair.sent[pair.l])
    assert b"s3cret" not in wire  # never the password on the wire
    assert NONCE_C in wire and NONCE_L in wire


def test_the_received_adjust_is_the_peers_limits_and_the_listeners_keepalive_applies():
    pair = Pair(
        connector(inbound_transaction_size=7, inbound_window_size=3, keepalive_interval=999, use_xa=False),
        listener(inbound_transaction_size=50, inbound_window_size=4, keepalive_interval=12.5, use_xa=False),
    )
    pair.run()
    [c_op] = [e for e in pair.events[pair.c] if isinstance(e, Operational)]
    [l_op] = [e for e in pair.events[pair.l] if isinstance(e, Operational)]
    assert (c_op.peer_transaction_size, c_op.peer_window_size, c_op.keepalive_interval) == (50, 4, 12.5)
    assert (l_op.peer_transaction_size, l_op.peer_window_size, l_op.keepalive_interval) == (7, 3, 12.5)
    assert not c_op.use_xa and not l_op.use_xa


@pytest.mark.parametrize("c_xa, l_xa", [(True, False), (False, True), (True, True)])
def test_xa_is_used_when_either_side_asks(c_xa, l_xa):
    pair = Pair(connector(use_xa=c_xa), listener(use_xa=l_xa))
    pair.run()
    assert all(e.use_xa for m in pair.machines for e in pair.events[m] if isinstance(e, Operational))


def test_routes_flow_both_ways_in_delivery():
    pair = operational_pair()
    pair.c.send_route(add=True, destination="r9", path=["r1", "r5", "r9"])
    pair.l.send_route(add=False, destination="r7", path=("r2", "r7"))
    pair._pump()
    pair.run()
    assert pair.events[pair.l][-1] == RouteReceived(add=True, destination="r9", path=("r1", "r5", "r9"))
    assert pair.events[pair.c][-1] == RouteReceived(add=False, destination="r7", path=("r2", "r7"))


def test_the_name_rule_is_the_kernels():
    for name in ["r1", "R", "a-b_c", "1r", "", "r 1", "r$1", "r.1", "é", "-r", "r" * 64]:
        assert valid_router_name(name) == bool(kernel_config._ROUTER_NAME.match(name)), name
    assert not valid_router_name("r" * 65)


# -- refusals -----------------------------------------------------------------------------------


def test_wrong_password_is_refused_at_both_ends():
    pair = Pair(connector("one"), listener("two"))
    pair.run()
    l_closed, c_closed = pair.closed(pair.l), pair.closed(pair.c)
    assert l_closed == Closed(reason=AUTH_FAILED, by_peer=False, peer="r1", stage=Stage.AUTHENTICATION)
    assert c_closed == Closed(reason=AUTH_FAILED, by_peer=True, peer="r2", stage=Stage.AUTHENTICATION)
    assert pair.l.state is State.REJECTING and pair.c.state is State.CLOSED
    assert pair.frames(pair.l)[-1] == AuthReply(accepted=False, reason=AUTH_FAILED)
    assert not any(isinstance(e, Operational) for m in pair.machines for e in pair.events[m])


@pytest.mark.parametrize(
    "c_password, l_password, c_reason",
    [
        (None, "pw", "authentication failed: the listener requires authentication and this connector has no password"),
        (
            "pw",
            None,
            "authentication failed: the listener does not authenticate itself and this connector has a password",
        ),
    ],
)
def test_password_matrix_refusals(c_password, l_password, c_reason):
    pair = Pair(connector(c_password), listener(l_password))
    pair.run()
    assert pair.closed(pair.c) == Closed(reason=c_reason, by_peer=False, peer="r2", stage=Stage.CONNECT)
    # the listener is told no more than "authentication failed"
    assert pair.closed(pair.l).reason == AUTH_FAILED and pair.closed(pair.l).by_peer
    assert pair.frames(pair.c)[-1] == Close(reason=AUTH_FAILED)
    assert pair.c.state is State.REJECTING


def test_own_name_is_refused_by_the_listener():
    pair = Pair(connector(name="r1"), listener(name="r1"))
    pair.run()
    reason = "both routers are named 'r1'"
    assert pair.closed(pair.l) == Closed(reason=reason, by_peer=False, peer=None, stage=Stage.CONNECT)
    assert pair.closed(pair.c) == Closed(reason=reason, by_peer=True, peer=None, stage=Stage.CONNECT)
    assert pair.frames(pair.l)[-1] == ConnectReply(accepted=False, reason=reason)
    assert not any(isinstance(e, PeerIdentified) for m in pair.machines for e in pair.events[m])


def script_listener(c: LinkMachine, *replies) -> list:
    """Play a listener by hand: feed ``c`` the magic and ``replies``; the frames ``c`` sent."""
    out = [c.data_to_send()]
    c.receive_data(MAGIC)
    for frame in replies:
        c.receive_data(encode(frame))
        if c.state is State.ADMISSION:
            c.admit()
        out.append(c.data_to_send())
    return decoded(split(b"".join(o for o in out if o)))


@pytest.mark.parametrize(
    "name, reason",
    [
        ("r1", "both routers are named 'r1'"),
        ("", "invalid router name ''"),
        ("9lives", "invalid router name '9lives'"),
        ("r" * 65, "at most 64 characters"),
        ("bad\nname", r"invalid router name 'bad\\nname'"),
    ],
)
def test_the_connector_refuses_bad_listener_names(name, reason):
    c = connector()
    frames = script_listener(
        c,
        ProtocolReply(accepted=True, version="1.1"),
        ConnectReply(accepted=True, name=name, nonce=NONCE_L, keepalive_ms=1000),
    )
    [closed] = c.events()
    assert reason in closed.reason and not closed.by_peer and c.state is State.REJECTING
    assert frames[-1] == Close(reason=closed.reason)


@pytest.mark.parametrize("name", ["", "9lives", "r" * 65, "r/x"])
def test_the_listener_refuses_bad_connector_names(name):
    lis = listener()
    lis.receive_data(HELLO + encode(Connect(name=name, nonce=NONCE_C, use_xa=True)))
    [closed] = lis.events()
    assert "invalid router name" in closed.reason and lis.state is State.REJECTING
    assert decoded(split(lis.data_to_send()))[-1] == ConnectReply(accepted=False, reason=closed.reason)


@pytest.mark.parametrize("refusing", [LISTENER, CONNECTOR])
def test_admission_refused_by_the_owner_reaches_the_peer_and_the_socket_ends_after_the_delay(refusing):
    pair = Pair(connector(now=0), listener(now=0), admit={CONNECTOR, LISTENER} - {refusing})
    pair.run()
    m = pair.c if refusing is CONNECTOR else pair.l
    peer = pair.other(m)
    assert m.state is State.ADMISSION and isinstance(pair.events[m][-1], PeerIdentified)
    m.tick(2.0)
    m.refuse("router r9 is already connected")
    assert m.tick(2.0) == 7.0  # reject-disconnect-delay 5 s from now
    pair._pump()
    pair.run()
    assert pair.closed(m) == Closed(
        reason="router r9 is already connected", by_peer=False, peer=peer.name, stage=Stage.CONNECT
    )
    assert pair.closed(peer).reason == "router r9 is already connected" and pair.closed(peer).by_peer
    assert pair.ended[peer] and peer.finished  # a refusal received ends at once
    refusal = (
        ConnectReply(accepted=False, reason="router r9 is already connected")
        if refusing is LISTENER
        else Close(reason="router r9 is already connected")
    )
    assert pair.frames(m)[-1] == refusal
    assert m.state is State.REJECTING and not pair.ended[m] and not m.finished
    assert m.tick(6.99) == 7.0 and m.data_to_send() == b""
    m.receive_data(b"late input is dropped")
    assert m.tick(7.0) == 0.0 and m.data_to_send() is None and m.finished
    assert len([e for e in pair.events[m] if isinstance(e, Closed)]) == 1 and not m.events()


def test_long_reasons_are_cut_to_fit_the_peers_handshake_limit():
    pair = Pair(connector(max_frame_size=4096), listener(max_frame_size=4096), admit={CONNECTOR})
    pair.run()
    pair.l.refuse("\U0001d11e" * 5000)  # 4 bytes each in UTF-8
    pair._pump()
    pair.run()
    assert pair.closed(pair.c).reason.startswith("\U0001d11e") and pair.closed(pair.c).by_peer
    pair = operational_pair(max_frame_size=4096)
    pair.c.close("\U0001d11e" * 5000)
    pair._pump()
    pair.run()
    assert pair.closed(pair.l).by_peer and len(pair.closed(pair.l).reason) <= 201


def test_the_owner_may_end_the_reject_delay():
    pair = Pair(admit={CONNECTOR})
    pair.run()
    pair.l.refuse("no")
    pair.l.close("the router stops")
    assert [f.TYPE for f in decoded(split(pair.l.data_to_send()))] == [FrameType.CONNECT_REPLY]
    assert pair.l.data_to_send() is None and pair.l.finished
    assert [e.reason for e in pair.l.events() if isinstance(e, Closed)] == ["no"]


def test_input_held_during_admission_is_bounded():
    lis = listener()
    lis.receive_data(HELLO + encode(Connect(name="r1", nonce=NONCE_C, use_xa=True)))
    assert lis.state is State.ADMISSION
    lis.receive_data(encode(Keepalive()) * 100)  # held: the owner has not decided
    assert lis.state is State.ADMISSION
    lis.receive_data(b"x" * 8192)
    [_, closed] = lis.events()
    assert closed.reason.endswith("bytes received while awaiting the owner's admission (at most 8192)")
    assert lis.state is State.CLOSED


def test_a_peer_closing_its_side_ends_the_reject_delay_early():
    pair = Pair(admit={CONNECTOR})
    pair.run()
    pair.l.refuse("no")
    pair.l.data_to_send()
    pair.l.receive_data(b"")
    assert pair.l.data_to_send() is None and pair.l.finished


def test_version_mismatch_is_refused_with_the_listeners_versions():
    lis = listener()
    lis.receive_data(MAGIC + encode(Protocol(versions=("2.0", "0.9"))))
    [closed] = lis.events()
    reason = "no common protocol version (offered: 2.0, 0.9; supported: 1.1)"
    assert closed == Closed(reason=reason, by_peer=False, peer=None, stage=Stage.PROTOCOL)
    reply = lis.data_to_send()
    assert decoded(split(reply)) == [ProtocolReply(accepted=False, versions=("1.1",), reason=reason)]
    assert lis.state is State.REJECTING
    c = connector()
    c.data_to_send()
    c.receive_data(reply)
    assert c.events() == [Closed(reason=reason, by_peer=True, peer=None, stage=Stage.PROTOCOL)]
    assert c.data_to_send() is None


def test_the_listener_picks_the_highest_shared_version_and_the_connector_offers_only_what_it_implements(monkeypatch):
    assert decoded(split(connector().data_to_send())) == [Protocol(versions=("1.1",))]
    monkeypatch.setattr(handshake, "VERSIONS", ("1.0", "1.10", "1.2"))  # where the handshake reads it
    lis = listener()
    lis.receive_data(MAGIC + encode(Protocol(versions=("1.2", "3.0", "1.10", "1.0"))))
    assert decoded(split(lis.data_to_send())) == [ProtocolReply(accepted=True, version="1.10")]


def test_a_version_not_offered_is_a_breach():
    c = connector()
    c.data_to_send()
    c.receive_data(MAGIC + encode(ProtocolReply(accepted=True, version="7.0")))
    [closed] = c.events()
    assert "chose the version '7.0', which was not offered" in closed.reason and not closed.by_peer


# -- authentication -----------------------------------------------------------------------------


def test_a_reflected_proof_is_refused_by_the_connector():
    """A fake listener echoes the connector's own proof back as its proof (reflection)."""
    c = connector("pw")
    frames = script_listener(
        c,
        ProtocolReply(accepted=True, version="1.1"),
        ConnectReply(accepted=True, name="r2", nonce=NONCE_L, keepalive_ms=60000, auth_required=True),
    )
    [auth] = [f for f in frames if isinstance(f, Auth)]
    c.events()
    c.receive_data(encode(AuthReply(accepted=True, proof=auth.proof)))
    [closed] = c.events()
    assert closed.reason == f"{AUTH_FAILED}: the listener's proof is wrong" and c.state is State.REJECTING
    assert decoded(split(c.data_to_send())) == [Close(reason=AUTH_FAILED)]


def test_a_listener_direction_proof_is_refused_by_the_listener():
    """Even made with the right password, a proof with the listener's label does not pass as
    the connector's: the labels keep the directions apart."""
    lis = listener("pw")
    lis.receive_data(HELLO + encode(Connect(name="r1", nonce=NONCE_C, use_xa=True)))
    lis.admit()
    lis.data_to_send()
    wrong = proof(b"pw", LABEL_LISTENER, NONCE_C, NONCE_L, "r1", "r2", "1.1")
    lis.receive_data(encode(Auth(proof=wrong)))
    assert [e.reason for e in lis.events() if isinstance(e, Closed)] == [AUTH_FAILED]
    right = proof(b"pw", LABEL_CONNECTOR, NONCE_C, NONCE_L, "r1", "r2", "1.1")
    lis = listener("pw")
    lis.receive_data(HELLO + encode(Connect(name="r1", nonce=NONCE_C, use_xa=True)))
    lis.admit()
    lis.receive_data(encode(Auth(proof=right)))
    assert lis.state is State.RECOVERY_WAIT  # the link uses XA


def test_the_proof_is_the_documented_computation():
    message = LABEL_CONNECTOR
    for part in (NONCE_C, NONCE_L, b"r1", b"r2", b"1.1"):
        message += len(part).to_bytes(2, "big") + part
    assert (
        proof(b"pw", LABEL_CONNECTOR, NONCE_C, NONCE_L, "r1", "r2", "1.1")
        == hmac.new(b"pw", message, hashlib.sha256).digest()
    )


def test_nonces_must_have_32_bytes():
    lis = listener()
    lis.receive_data(HELLO + encode(Connect(name="r1", nonce=b"x", use_xa=True)))
    [closed] = lis.events()
    assert closed.reason == "the nonce must have 32 bytes, got 1"


# -- timers -------------------------------------------------------------------------------------

WAITING_CASES = [
    (CONNECTOR, State.PROTOCOL_WAIT, None),
    (LISTENER, State.PROTOCOL_WAIT, None),
    (CONNECTOR, State.CONNECT_WAIT, None),
    (LISTENER, State.CONNECT_WAIT, None),
    (CONNECTOR, State.ADMISSION, None),
    (LISTENER, State.ADMISSION, None),
    (CONNECTOR, State.AUTH_WAIT, "pw"),
    (LISTENER, State.AUTH_WAIT, "pw"),
    (CONNECTOR, State.RECOVERY_WAIT, None),
    (LISTENER, State.RECOVERY_WAIT, "pw"),
    (CONNECTOR, State.ADJUST_WAIT, None),
    (LISTENER, State.ADJUST_WAIT, "pw"),
    (CONNECTOR, State.START_WAIT, None),
    (LISTENER, State.START_WAIT, None),
]


def test_every_waiting_state_is_covered():
    assert {state for _, state, _ in WAITING_CASES} == stages.WAITING
    assert {(role, state) for role, state, _ in WAITING_CASES} == {
        (role, state) for role, state, _ in TRANSITIONS if state in stages.WAITING
    }


@pytest.mark.parametrize("role, state, password", WAITING_CASES)
def test_stage_valid_timeout_in_each_waiting_state(role, state, password):
    admit = {CONNECTOR, LISTENER} - ({role} if state is State.ADMISSION else set())
    pair = Pair(connector(password, now=90), listener(password, now=90), admit=admit)
    m = pair.c if role is CONNECTOR else pair.l
    assert m.tick(95) == 105  # the first state's timer runs from the machine's creation
    pair.run(until=lambda: m.state is state)
    assert m.state is state
    # any later state's timer starts at the first tick in it
    start = 90 if state is State.PROTOCOL_WAIT else 100
    timeout, name = (60, "recovery-timeout") if state is State.RECOVERY_WAIT else (15, "stage-valid-timeout")
    assert m.tick(100) == start + timeout
    assert m.tick(start + timeout - 0.1) == start + timeout and m.state is state
    assert m.tick(start + timeout) == 0
    [closed] = [e for e in m.events() if isinstance(e, Closed)]
    stage = stages.STAGE_OF[state]
    assert closed.reason == f"{name} ({timeout} s) expired in the {stage.value} stage ({state.value})"
    assert not closed.by_peer and closed.stage is stage
    assert decoded(split(m.data_to_send()))[-1] == Close(reason=closed.reason)
    assert m.data_to_send() is None


def test_keepalives_keep_the_link_up_for_long():
    pair = operational_pair(keepalive_interval=60)
    pair.tick(0)
    for i in range(1, 2001):
        pair.tick(60.0 * i)
        assert pair.c.keepalive_counter == 5 and pair.l.keepalive_counter == 5
    assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL
    c_keepalives = [f for f in pair.frames(pair.c) if isinstance(f, Keepalive)]
    assert len(c_keepalives) == 2000
    assert len([f for f in pair.frames(pair.l) if isinstance(f, Keepalive)]) == 2000


@pytest.mark.parametrize("silent", [LISTENER, CONNECTOR])
def test_a_silent_peer_is_closed_after_5_intervals(silent):
    pair = operational_pair(keepalive_interval=60)
    quiet = pair.l if silent is LISTENER else pair.c
    watcher = pair.other(quiet)
    pair.tick(1000)
    pair.drop.add(quiet)  # half-open: nothing it sends arrives any more
    for i in range(1, 5):
        pair.tick(1000 + 60.0 * i)
        assert watcher.state is State.OPERATIONAL and watcher.keepalive_counter == 5 - i
    pair.tick(1299.9)
    assert watcher.state is State.OPERATIONAL
    pair.tick(1300)
    assert watcher.state is State.CLOSED
    assert pair.closed(watcher) == Closed(
        reason=f"no keepalive from {quiet.name} for 5 intervals (5 × 60 s)",
        by_peer=False,
        peer=quiet.name,
        stage=Stage.DELIVERY,
    )
    # the quiet side read the watcher's CLOSE (its own output is lost, not its input)
    assert pair.closed(quiet).by_peer


def test_route_traffic_neither_suppresses_nor_replaces_keepalives():
    pair = operational_pair(keepalive_interval=10)
    pair.tick(0)
    # the connector's keepalives get lost, its routes arrive: the listener must still close it
    for second in range(1, 100):
        pair.c.send_route(add=second % 2 == 1, destination="r9", path=["r1", "r9"])
        pair.c.tick(float(second))
        data = pair.c.data_to_send()
        chunks = split(data)
        pair.sent[pair.c] += chunks
        pair.l.receive_data(b"".join(ch for ch in chunks if not isinstance(decode_body(ch[4:]), Keepalive)))
        pair.l.tick(float(second))
        if out := pair.l.data_to_send():
            pair.c.receive_data(out)  # the listener's keepalives arrive
        if pair.l.state is not State.OPERATIONAL:
            break
    # the connector sent one keepalive per interval despite sending a route every second
    assert [f.TYPE for f in pair.frames(pair.c)].count(FrameType.KEEPALIVE) == 5  # at 10, 20, 30, 40, 50 s
    assert pair.l.state is State.CLOSED and second == 50
    assert [e.reason for e in pair.l.events() if isinstance(e, Closed)] == [
        "no keepalive from r1 for 5 intervals (5 × 10 s)"
    ]


def test_keepalive_interval_zero_is_off():
    pair = operational_pair(keepalive_interval=0)
    assert pair.c.tick(0) == 0 and pair.l.tick(0) == 0
    pair.tick(1e9)
    assert pair.c.state is State.OPERATIONAL
    assert FrameType.KEEPALIVE not in [f.TYPE for f in pair.frames(pair.c) + pair.frames(pair.l)]


def test_a_late_tick_decrements_once():
    pair = operational_pair(keepalive_interval=60)
    pair.drop.add(pair.l)
    pair.tick(0)
    assert pair.c.tick(1000) == 1060 and pair.c.keepalive_counter == 4


# -- breaches and the owner's misuse --------------------------------------------------------


def at_operational() -> LinkMachine:
    pair = operational_pair()
    pair.c.events()
    return pair.c


def at_connect_wait() -> LinkMachine:
    lis = listener()
    lis.receive_data(MAGIC + encode(Protocol(versions=("1.1",))))
    lis.data_to_send()
    return lis


@pytest.mark.parametrize(
    "make, data, reason",
    [
        (at_connect_wait, encode(Keepalive()), "unexpected KEEPALIVE frame while awaiting the connect"),
        (at_connect_wait, encode(Protocol(versions=("1.1",))), "unexpected PROTOCOL frame while awaiting the connect"),
        (at_operational, encode(StartDelivery()), "unexpected START_DELIVERY frame while operational"),
        (
            at_operational,
            encode(Adjust(transaction_size=1, window_size=1)),
            "unexpected ADJUST frame while operational",
        ),
        (at_operational, b"\x00\x00\x00\x03\x92\x32\x80", "TRANSACTION frame lacks the field"),
        (
            at_operational,
            encode(PrepareReply(xid="x9")),
            "PREPARE_REPLY frame for xid 'x9', which is not open (outbound)",
        ),
        (
            at_operational,
            encode(Route(add=True, destination="r9", path=("r7", "r9"))),
            "a route's path must run from r2 to its destination 'r9', got 'r7/r9'",
        ),
        (at_operational, encode(Route(add=True, destination="r9", path=("r2", "r9", "r2", "r9"))), "has a loop"),
        (at_operational, encode(Route(add=True, destination="9", path=("r2", "9"))), "invalid router name '9'"),
        (at_operational, encode(Route(add=True, destination="r9", path=())), "1 to 64 routers, got 0"),
        (at_operational, struct.pack(">I", (1 << 20) + 1), "exceeds the maximum frame size of 1048576 bytes"),
        (at_connect_wait, struct.pack(">I", 4097), "exceeds the maximum frame size of 4096 bytes"),
        (
            listener,
            b"GET / HTTP/1.1\r\n\r\n",
            "not a Martinet router: the stream starts with b'GET / HT' (an HTTP request?)",
        ),
        (listener, b"AMQP\x00\x01\x00\x00", "(an AMQP client?)"),
        (connector, b"AMQP\x03\x01\x00\x00", "(an AMQP client?)"),
    ],
)
def test_a_breach_is_answered_with_close_and_never_raised(make, data, reason):
    m = make()
    m.data_to_send()
    m.receive_data(data)
    [closed] = m.events()
    assert reason in closed.reason and not closed.by_peer and m.state is State.CLOSED
    out = m.data_to_send()
    assert decoded(split(out))[-1] == Close(reason=closed.reason)
    if m.role is LISTENER and make is listener:
        assert out.startswith(MAGIC)  # so a Martinet peer could read the reason
    assert m.data_to_send() is None and m.finished
    m.receive_data(encode(Keepalive()))  # nothing happens after the end
    assert not m.events() and m.tick(1e9) == 0


def test_a_peers_close_and_a_peers_hangup_end_the_link():
    c = at_operational()
    c.receive_data(encode(Close(reason="shutting\ndown " + "x" * 500)))
    [closed] = c.events()
    assert closed.by_peer and closed.reason.startswith("shutting\\ndown xxx") and len(closed.reason) <= 201
    assert c.data_to_send() is None
    c = at_operational()
    c.receive_data(b"")
    assert c.events() == [
        Closed(reason="the peer closed the connection (operational)", by_peer=True, peer="r2", stage=Stage.DELIVERY)
    ]


def test_the_owner_closes():
    pair = operational_pair()
    pair.c.close("the routing swiftlet stops")
    pair.c.close("twice does nothing")
    pair._pump()
    pair.run()
    assert pair.closed(pair.c) == Closed(
        reason="the routing swiftlet stops", by_peer=False, peer="r2", stage=Stage.DELIVERY
    )
    assert pair.closed(pair.l).reason == "the routing swiftlet stops" and pair.closed(pair.l).by_peer
    assert pair.ended[pair.c] and pair.ended[pair.l]


def test_local_misuse_raises_and_changes_nothing():
    pair = Pair(admit=())
    pair.run()
    pair.l.admit()
    with pytest.raises(LocalProtocolError, match="admit while awaiting the XA recovery"):
        pair.l.admit()
    with pytest.raises(LocalProtocolError, match="refuse while"):
        pair.l.refuse("x")
    with pytest.raises(LocalProtocolError, match="send_route while awaiting the connect"):
        pair.c.send_route(add=True, destination="r1", path=["r1"])
    pair = operational_pair()
    with pytest.raises(LocalProtocolError, match="must run from r1"):
        pair.c.send_route(add=True, destination="r9", path=["r2", "r9"])
    assert pair.c.state is State.OPERATIONAL and pair.c.data_to_send() == b""
    pair.c.close("bye")
    assert pair.c.send_route(add=True, destination="r9", path=["r1", "r9"]) is False  # dropped with the link
    pair = Pair(admit=())
    pair.run()
    pair.l.receive_data(b"")
    pair.l.admit()  # a decision that crossed the peer's close: nothing happens
    pair.l.refuse("late")
    assert [type(e) for e in pair.l.events()] == [Closed]
    with pytest.raises(ValueError, match="invalid router name"):
        connector(name="1x")
    with pytest.raises(ValueError, match="invalid link settings"):
        LinkSettings(inbound_window_size=0)


# -- fuzzing ------------------------------------------------------------------------------------


def recorded_session(password):
    """A full valid session: handshake (XA recovery, or none for "nonxa"), routes and
    transactions both ways (compressed and not), keepalives, a close."""
    xa = password != "nonxa"
    password = None if password == "nonxa" else password
    pair = Pair(
        connector(password, **SESSION_SETTINGS[xa]),
        listener(password, **SESSION_SETTINGS[xa]),
        auto=(CONNECTOR, LISTENER),
    )
    pair.run()
    assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL
    for i in range(3):
        pair.tick(10.0 * i)
        pair.c.send_route(add=True, destination=f"x{i}", path=["r1", f"x{i}"])
        pair.l.send_route(add=False, destination=f"y{i}", path=["r2", f"y{i}"])
        for m in pair.machines:
            batch = [b"m%d" % i, b"z" * 200 * i]  # the first one does not compress
            if xa:
                m.send_transaction(f"{m.name}-{i}", batch)
            else:
                m.send_nonxa(i, batch)
        pair._pump()
        pair.run()
    pair.c.close("done")
    pair._pump()
    pair.run()
    return list(pair.sent[pair.c]), list(pair.sent[pair.l])


SESSION_SETTINGS = {
    True: {"keepalive_interval": 10, "use_compression": True},
    False: {"keepalive_interval": 10, "use_xa": False},
}
SESSIONS = {password: recorded_session(password) for password in (None, "pw", "nonxa")}


def fresh(role: Role, password):
    """A machine for a recorded session (``password``: None, "pw", or "nonxa" for a non-XA one)."""
    xa = password != "nonxa"
    password = None if password == "nonxa" else password
    make = connector if role is CONNECTOR else listener
    return make(password, **SESSION_SETTINGS[xa])


def feed_and_check(m: LinkMachine, chunks: list[bytes]) -> None:
    """Feed ``chunks``; nothing may raise; the link continues, or it ended with one Closed with a reason."""
    events = []
    m.data_to_send()
    for chunk in chunks:
        m.receive_data(chunk)
        events += answer_all(m)
        if m.state is State.ADMISSION:
            m.admit()
            events += answer_all(m)
        assert m.data_to_send() is not None or m.state is State.CLOSED
    closed = [e for e in events if isinstance(e, Closed)]
    if closed:
        assert len(closed) == 1 and events[-1] is closed[0] and closed[0].reason
        assert m.state in (State.REJECTING, State.CLOSED)
    else:
        assert m.state not in (State.REJECTING, State.CLOSED)
    # whatever happened, the end of input and time end it cleanly
    m.receive_data(b"")
    m.tick(1e9)
    assert m.data_to_send() is None or m.data_to_send() is None
    assert m.finished
    closed = [e for e in events + m.events() if isinstance(e, Closed)]
    assert len(closed) == 1 and closed[0].reason


@st.composite
def mutated_session(draw):
    password = draw(st.sampled_from([None, "pw", "nonxa"]))
    role = draw(st.sampled_from([CONNECTOR, LISTENER]))
    c_chunks, l_chunks = SESSIONS[password]
    chunks = list(c_chunks if role is LISTENER else l_chunks)  # what the other side sent
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["drop", "dup", "swap", "flip", "truncate", "insert", "bytes", "cut"]))
        i = draw(st.integers(0, len(chunks) - 1)) if chunks else 0
        if not chunks and op not in ("insert", "bytes"):
            continue
        if op == "drop":
            del chunks[i]
        elif op == "dup":
            chunks.insert(i, chunks[i])
        elif op == "swap":
            j = draw(st.integers(0, len(chunks) - 1))
            chunks[i], chunks[j] = chunks[j], chunks[i]
        elif op == "flip":
            chunk = bytearray(chunks[i])
            k = draw(st.integers(0, len(chunk) - 1))
            chunk[k] ^= draw(st.integers(1, 255))
            chunks[i] = bytes(chunk)
        elif op == "truncate":
            chunks[i] = chunks[i][: draw(st.integers(1, max(1, len(chunks[i]) - 1)))]
        elif op == "insert":
            chunks.insert(i, encode(draw(ANY_FRAME)))
        elif op == "bytes":
            chunks.insert(i, draw(st.binary(min_size=1, max_size=40)))
        elif op == "cut":  # the same bytes in other pieces
            data = b"".join(chunks)
            k = draw(st.integers(1, max(1, len(data) - 1)))
            chunks = [data[:k], data[k:]] if data[k:] else [data]
    return role, password, chunks


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_session())
def test_mutated_sessions_never_raise_and_end_cleanly(case):
    role, password, chunks = case
    feed_and_check(fresh(role, password), chunks)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([CONNECTOR, LISTENER]),
    st.sampled_from([None, "pw", "nonxa"]),
    st.integers(0, 24),
    st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=4),
)
def test_random_bytes_after_a_valid_prefix(role, password, prefix, noise):
    """Random bytes in any stage, before and after authentication (the prefix of a valid session)."""
    c_chunks, l_chunks = SESSIONS[password]
    chunks = list(c_chunks if role is LISTENER else l_chunks)
    chunks = [ch for ch in chunks if ch == MAGIC or not isinstance(decode_body(ch[4:]), Close)][:prefix]
    feed_and_check(fresh(role, password), chunks + noise)


def test_the_recorded_sessions_replay_cleanly():
    for password, (c_chunks, _) in SESSIONS.items():
        lis = fresh(LISTENER, password)
        feed_and_check(lis, c_chunks)
        assert lis.state is State.CLOSED


@given(st.sampled_from([CONNECTOR, LISTENER]), st.integers(0, 24), st.integers(1, 2**32 - 1))
def test_frames_above_the_maximum_are_refused_from_their_length(role, prefix, length):
    c_chunks, l_chunks = SESSIONS[None]
    # the peer's frames but its close and its answers to transactions of the recorded side
    answers = (Close, PrepareReply, CommitReply)
    chunks = [
        ch
        for ch in (c_chunks if role is LISTENER else l_chunks)
        if ch == MAGIC or not isinstance(decode_body(ch[4:]), answers)
    ][:prefix]
    m = fresh(role, None)
    for chunk in chunks:
        m.receive_data(chunk)
        answer_all(m)
        if m.state is State.ADMISSION:
            m.admit()
            answer_all(m)
    m.events()
    if not chunks:
        m.receive_data(MAGIC)
    limit = (
        1 << 20 if m.state in (State.OPERATIONAL, State.ADJUST_WAIT, State.START_WAIT, State.RECOVERY_WAIT) else 4096
    )
    m.receive_data(struct.pack(">I", length))  # only the length: the body is not waited for
    if length > limit:
        [closed] = m.events()
        assert closed.reason == f"frame of {length} bytes exceeds the maximum frame size of {limit} bytes"
    else:
        assert not m.events() and m.state not in (State.CLOSED, State.REJECTING)


# -- under the trio Driver (messaging/io.py), virtual time --------------------------------------


class Owner:
    """What the routing swiftlet will do around a machine: admit (or refuse) the peer, keep the events."""

    def __init__(self, machine: LinkMachine, refuse: str | None = None):
        self.machine, self.refuse, self.events = machine, refuse, []
        self.times: list[float] = []

    def on_input(self) -> None:
        for event in answer_all(self.machine):
            self.events.append(event)
            self.times.append(trio.current_time())
            if isinstance(event, PeerIdentified):
                if self.refuse:
                    self.machine.refuse(self.refuse)
                else:
                    self.machine.admit()


async def run_link(owner: Owner, stream) -> None:
    try:
        await Driver(stream, owner.machine, on_input=owner.on_input).run()
    finally:
        await stream.aclose()


async def test_a_link_under_the_trio_driver(autojump_clock):
    c_stream, l_stream = trio.testing.memory_stream_pair()
    start = trio.current_time()
    c_owner = Owner(connector("pw", now=start, keepalive_interval=30))
    l_owner = Owner(listener("pw", now=start, keepalive_interval=30))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_link, c_owner, c_stream)
        nursery.start_soon(run_link, l_owner, l_stream)
        await trio.sleep(3600)  # an hour of keepalives, virtual
        assert c_owner.machine.state is State.OPERATIONAL and l_owner.machine.state is State.OPERATIONAL
        l_owner.machine.close("the router stops")
        nursery.cancel_scope.deadline = trio.current_time() + 60  # both ends must finish by themselves
    assert not nursery.cancel_scope.cancelled_caught
    assert [type(e) for e in c_owner.events] == [
        PeerIdentified,
        RecoveryRequested,
        RecoveryReceived,
        Operational,
        Closed,
    ]
    assert c_owner.events[-1].reason == "the router stops" and c_owner.events[-1].by_peer


async def test_a_refused_connection_is_kept_for_the_reject_delay_under_the_driver(autojump_clock):
    c_stream, l_stream = trio.testing.memory_stream_pair()
    start = trio.current_time()
    c_owner = Owner(connector(now=start, reject_disconnect_delay=5))
    l_owner = Owner(listener(now=start, reject_disconnect_delay=5), refuse="router r1 is already connected")
    ended = {}

    async def timed(owner, stream):
        await run_link(owner, stream)
        ended[owner.machine.role] = trio.current_time() - start

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timed, c_owner, c_stream)
            nursery.start_soon(timed, l_owner, l_stream)
    assert c_owner.events[-1] == Closed(
        reason="router r1 is already connected", by_peer=True, peer=None, stage=Stage.CONNECT
    )
    # the connector ends at once; it closes its socket, which ends the listener's wait early
    assert ended[CONNECTOR] < 1 and ended[LISTENER] < 1


async def test_a_silent_stranger_is_dropped_by_the_stage_valid_timeout_under_the_driver(autojump_clock):
    c_stream, l_stream = trio.testing.memory_stream_pair()
    start = trio.current_time()
    l_owner = Owner(listener(now=start))
    with trio.fail_after(60):
        await run_link(l_owner, l_stream)  # nobody speaks on the other end
    assert trio.current_time() - start == pytest.approx(15)
    assert "stage-valid-timeout (15 s) expired in the protocol select stage" in l_owner.events[-1].reason


async def test_the_reject_delay_under_the_driver_when_the_peer_stays(autojump_clock):
    c_stream, l_stream = trio.testing.memory_stream_pair()
    start = trio.current_time()
    l_owner = Owner(listener(now=start, reject_disconnect_delay=5))
    with trio.fail_after(60):  # virtual time: a bug fails the test instead of hanging it
        await reject_delay_exchange(c_stream, l_stream, l_owner, start)
    assert trio.current_time() - start == pytest.approx(5)  # ...after the reject-disconnect-delay
    assert l_owner.events == [
        Closed(reason="both routers are named 'r2'", by_peer=False, peer=None, stage=Stage.CONNECT)
    ]


async def reject_delay_exchange(c_stream, l_stream, l_owner, start):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_link, l_owner, l_stream)
        await c_stream.send_all(HELLO + encode(Connect(name="r2", nonce=NONCE_C, use_xa=True)))  # our own name
        received = b""
        while b"both routers are named 'r2'" not in received:
            data = await c_stream.receive_some()
            assert data, f"the listener closed without the reason; it sent {received!r}"
            received += data
        assert trio.current_time() - start < 1
        assert await c_stream.receive_some() == b""  # the listener closes its socket...
