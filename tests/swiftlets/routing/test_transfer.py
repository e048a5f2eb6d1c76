"""Message transfer on a routing link (swiftlets/routing/stages.py, docs/routing-protocol.md §7–§10):
the XA pipeline and its phase tables, windows and sizes, refusal, non-XA transfer, compression,
the XA recovery stage (the three cases), and random interleavings of both directions."""

from __future__ import annotations

import re
import tracemalloc
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from martinet.swiftlets.routing.stages import (
    INBOUND_PHASES,
    OUTBOUND_PHASES,
    Closed,
    CommitDone,
    CommitReceived,
    Decision,
    LinkMachine,
    NonXaCommitted,
    NonXaTransactionReceived,
    Operational,
    Phase,
    PrepareReceived,
    RecoveryReceived,
    RecoveryRequested,
    Stage,
    State,
    TransactionReceived,
    TransactionRefused,
)
from martinet.swiftlets.routing.window import OPEN_FACTOR, transaction_cost
from martinet.swiftlets.routing.wire import (
    MIN_WINDOW_BYTES,
    Close,
    Commit,
    CommitReply,
    FrameType,
    Keepalive,
    LocalProtocolError,
    NonXaCommit,
    NonXaTransaction,
    PrepareReply,
    Recovery,
    RecoveryDone,
    Refuse,
    RemoteProtocolError,
    Transaction,
    encode,
    pack_messages,
    unpack_messages,
)

from tests.swiftlets.routing.test_stages import CONNECTOR, LISTENER, Pair, answer, connector, decoded, listener, split


def pair_of(**settings) -> Pair:
    pair = Pair(connector(**settings), listener(**settings))
    pair.run()
    assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL
    return pair


def flow(pair: Pair) -> None:
    pair._pump()
    pair.run()


def took(pair: Pair, m: LinkMachine, cls) -> list:
    """The events of type ``cls`` ``m`` emitted so far, removed from the pair's record."""
    got = [e for e in pair.events[m] if isinstance(e, cls)]
    pair.events[m] = [e for e in pair.events[m] if not isinstance(e, cls)]
    return got


def sides(pair: Pair, sender_role):
    return (pair.c, pair.l) if sender_role is CONNECTOR else (pair.l, pair.c)


# -- XA ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sender_role", [CONNECTOR, LISTENER])
def test_the_full_xa_flow_either_way(sender_role):
    pair = pair_of()
    s, r = sides(pair, sender_role)
    assert s.window_available == 10 and s.use_xa and s.peer_max_frame_size == 1 << 20
    assert s.send_transaction("x1", [b"one", b"two", b""]) is True
    assert s.outbound == {"x1": Phase.SENT} and s.window_available == 9 and s.open_transactions == 1
    flow(pair)
    assert took(pair, r, TransactionReceived) == [TransactionReceived(xid="x1", messages=(b"one", b"two", b""))]
    assert r.inbound == {"x1": Phase.RECEIVED}
    r.prepared("x1")
    flow(pair)
    assert took(pair, s, PrepareReceived) == [PrepareReceived(xid="x1")]
    assert s.outbound == {"x1": Phase.PREPARED} and r.inbound == {"x1": Phase.PREPARED}
    assert s.window_available == 10  # the slot is free while the commit is in flight
    s.commit("x1")
    flow(pair)
    assert took(pair, r, CommitReceived) == [CommitReceived(xid="x1", recovery=False)]
    assert s.outbound == {"x1": Phase.COMMITTING} and r.inbound == {"x1": Phase.COMMITTING}
    r.committed("x1")
    flow(pair)
    assert took(pair, s, CommitDone) == [CommitDone(xid="x1", recovery=False)]
    assert s.outbound == {} and r.inbound == {} and s.open_transactions == 0
    types = [f.TYPE for f in pair.frames(s)[-2:]] + [f.TYPE for f in pair.frames(r)[-2:]]
    assert types == [FrameType.TRANSACTION, FrameType.COMMIT, FrameType.PREPARE_REPLY, FrameType.COMMIT_REPLY]
    assert s.state is State.OPERATIONAL and r.state is State.OPERATIONAL


def test_both_directions_at_once_with_the_same_xid():
    """An xid belongs to one direction: the same string both ways is two transactions."""
    pair = pair_of()
    pair.c.send_transaction("same", [b"c"])
    pair.l.send_transaction("same", [b"l"])
    flow(pair)
    assert pair.c.outbound == {"same": Phase.SENT} and pair.c.inbound == {"same": Phase.RECEIVED}
    pair.c.prepared("same")
    pair.l.prepared("same")
    flow(pair)
    assert pair.c.outbound == {"same": Phase.PREPARED} and pair.c.inbound == {"same": Phase.PREPARED}


def test_the_window_pipelines():
    pair = pair_of(inbound_window_size=3, inbound_transaction_size=2)
    c, lis = pair.c, pair.l
    for i in range(3):
        c.send_transaction(f"t{i}", [b"m"])
    assert c.window_available == 0
    data_before = c.data_to_send()
    with pytest.raises(
        LocalProtocolError, match=r"no window available: 3 transactions \(3075 bytes\) await their prep"
    ):
        c.send_transaction("t3", [b"m"])
    assert c.outbound == {f"t{i}": Phase.SENT for i in range(3)} and c.data_to_send() == b""
    pair.l.receive_data(data_before)
    pair.sent[c] += split(data_before)
    flow(pair)
    lis.prepared("t0")
    flow(pair)
    assert c.window_available == 1  # freed at the prepare; t0's commit still to come
    c.send_transaction("t3", [b"m"])
    c.set_send_window(5)  # the owner's controller grew it: two more now
    assert c.window_available == 2 and c.send_window == 5
    c.set_send_window(0)  # never below one
    assert c.send_window == 1 and c.window_available == 0


BIG = b"x" * 20_000  # a message of 21,024 bytes of window cost in a transaction of its own


def test_the_peers_window_bytes_bound_what_awaits_and_what_is_open():
    pair = pair_of(inbound_window_size=100, inbound_window_bytes=MIN_WINDOW_BYTES)
    c, lis = pair.c, pair.l
    # room while less than the bound awaits: the fourth fills it past (63,072 bytes before it)
    for i in range(4):
        c.send_transaction(f"t{i}", [BIG])
    assert c.window_available == 0 and c.bytes_in_flight == 4 * transaction_cost([BIG])
    with pytest.raises(LocalProtocolError, match=r"4 transactions \(84096 bytes\) await their prepare"):
        c.send_transaction("t4", [BIG])
    flow(pair)
    for i in range(4):
        lis.prepared(f"t{i}")
    flow(pair)
    # none awaits; open in all phases is bounded by 3 × the bytes: 196,608, reached by the tenth
    for i in range(4, 10):
        assert c.window_available
        c.send_transaction(f"t{i}", [BIG])
        flow(pair)
        lis.prepared(f"t{i}")
        flow(pair)
    assert c.open_transactions == 10 and c.awaiting == 0 and c.window_available == 0
    c.commit("t0")
    flow(pair)
    lis.committed("t0")
    flow(pair)
    assert c.open_transactions == 9 and c.window_available == 100


@pytest.mark.parametrize(
    "call, reason",
    [
        (lambda m: m.send_transaction("x", [b"a"] * 4), "a transaction carries 1 to 3 messages"),
        (lambda m: m.send_transaction("x", []), "a transaction carries 1 to 3 messages"),
        (lambda m: m.send_transaction("x", ["text"]), "a transaction carries 1 to 3 messages"),
        (lambda m: m.send_transaction("", [b"a"]), "an xid is a string of 1 to 200 characters"),
        (lambda m: m.send_transaction("x" * 201, [b"a"]), "an xid is a string of 1 to 200 characters"),
        (lambda m: m.send_transaction(7, [b"a"]), "an xid is a string"),
        (lambda m: m.send_transaction("open", [b"a"]), "send_transaction for xid 'open', which is sent, not prepared"),
        (lambda m: m.send_transaction("x", [b"a" * 5000]), "exceeds the maximum frame size of 4096 bytes"),
        (lambda m: m.commit("open"), "commit for xid 'open', which is sent, not prepared"),
        (lambda m: m.commit("nope"), "commit for xid 'nope', which is not open"),
        (lambda m: m.prepared("nope"), "prepared for xid 'nope', which is not open (inbound)"),
        (lambda m: m.committed("nope"), "committed for xid 'nope', which is not open"),
        (lambda m: m.refuse_transaction("nope", "no"), "refuse_transaction for xid 'nope', which is not open"),
        (lambda m: m.send_nonxa(1, [b"a"]), "this call on an XA link"),
        (lambda m: m.nonxa_committed(1), "this call on an XA link"),
        (lambda m: m.recovery_list(()), "recovery_list while operational"),
        (lambda m: m.recovery_done(), "recovery_done while operational"),
    ],
)
def test_the_owners_misuse_raises_and_changes_nothing(call, reason):
    pair = pair_of(inbound_transaction_size=3, max_frame_size=4096)
    pair.c.send_transaction("open", [b"a"])
    flow(pair)
    before = (pair.c.outbound, pair.c.inbound, pair.c.window_available)
    with pytest.raises(LocalProtocolError, match=re.escape(reason)):
        call(pair.c)
    assert (pair.c.outbound, pair.c.inbound, pair.c.window_available) == before
    assert pair.c.data_to_send() == b"" and pair.c.state is State.OPERATIONAL


def test_transfer_calls_before_delivery_raise_and_after_the_end_do_nothing():
    pair = Pair(admit=())
    pair.run()
    with pytest.raises(LocalProtocolError, match="send_transaction while awaiting the connect"):
        pair.c.send_transaction("x", [b"a"])
    pair = pair_of()
    pair.c.send_transaction("x", [b"a"])
    flow(pair)
    pair.c.close("bye")
    assert pair.c.send_transaction("y", [b"a"]) is False and pair.c.send_nonxa(1, [b"a"]) is False
    pair.c.commit("x")
    pair.l.prepared("x")  # crossed the close: harmless
    assert pair.c.data_to_send() is not None


def operational(role=CONNECTOR, **settings) -> LinkMachine:
    """A machine in the delivery stage (its peer gone), its events and output taken."""
    pair = pair_of(**settings)
    m = pair.c if role is CONNECTOR else pair.l
    m.events()
    m.data_to_send()
    return m


T = Transaction
BOMB = zlib.compress(msgpack.packb([b"\0" * (4 << 20)], use_bin_type=True), 9)


def own(xid):
    """A step: the machine sends ``xid`` (so the peer may answer it)."""
    return lambda m: m.send_transaction(xid, [b"m"])


@pytest.mark.parametrize(
    "steps, reason",
    [
        (
            [T(xid="a", messages=(b"m",)), T(xid="a", messages=(b"m",))],
            "TRANSACTION 'a': duplicate, it is open already (received, not prepared)",
        ),
        (
            [T(xid=f"t{i}", messages=(BIG,)) for i in range(5)],
            "TRANSACTION 't4' overruns our inbound-window-bytes of 65536 (4 transactions of 84096 bytes await",
        ),
        (
            [T(xid="a", messages=(b"m",) * 4)],
            "TRANSACTION 'a' carries 4 messages (1 to our inbound-transaction-size of 3)",
        ),
        ([T(xid="a", messages=())], "TRANSACTION 'a' carries 0 messages"),
        ([T(xid="", messages=(b"m",))], "TRANSACTION: an xid is a string of 1 to 200 characters"),
        ([T(xid="x" * 201, messages=(b"m",))], "TRANSACTION: an xid is a string of 1 to 200 characters"),
        ([T(xid="a", messages=(b"m",), compressed=True)], "TRANSACTION 'a' is compressed; compression was not agreed"),
        ([PrepareReply(xid="zz")], "PREPARE_REPLY frame for xid 'zz', which is not open (outbound)"),
        (
            [own("a"), PrepareReply(xid="a"), PrepareReply(xid="a")],
            "PREPARE_REPLY frame for xid 'a', which is prepared, not committed (outbound)",
        ),
        ([Commit(xid="zz")], "COMMIT frame for xid 'zz', which is not open (inbound)"),
        ([T(xid="a", messages=(b"m",)), Commit(xid="a")], "COMMIT frame for xid 'a', which is received, not prepared"),
        ([CommitReply(xid="zz")], "COMMIT_REPLY frame for xid 'zz', which is not open (outbound)"),
        ([own("a"), CommitReply(xid="a")], "COMMIT_REPLY frame for xid 'a', which is sent, not prepared"),
        (
            [own("a"), PrepareReply(xid="a"), CommitReply(xid="a")],
            "COMMIT_REPLY frame for xid 'a', which is prepared, not committed",
        ),
        ([Refuse(xid="zz", reason="no")], "REFUSE frame for xid 'zz', which is not open (outbound)"),
        (
            [own("a"), PrepareReply(xid="a"), Refuse(xid="a", reason="no")],
            "REFUSE frame for xid 'a', which is prepared",
        ),
        ([NonXaTransaction(seq=1, messages=(b"m",))], "NONXA_TRANSACTION frame on an XA link"),
        ([NonXaCommit(seq=1)], "NONXA_COMMIT frame on an XA link"),
        ([Recovery(xids=())], "unexpected RECOVERY frame while operational"),
        ([RecoveryDone()], "unexpected RECOVERY_DONE frame while operational"),
        # the open bound: 3 × window bytes open in all, even when each was prepared
        (
            [step for i in range(10) for step in (T(xid=f"t{i}", messages=(BIG,)), lambda m, i=i: m.prepared(f"t{i}"))]
            + [T(xid="t10", messages=(BIG,))],
            "TRANSACTION 't10': more than 3 × our inbound-window-bytes of 65536 open (10 transactions of 210240 bytes)",
        ),
    ],
)
def test_a_peers_transfer_breach_closes_the_link(steps, reason):
    m = operational(inbound_window_size=2, inbound_transaction_size=3, inbound_window_bytes=MIN_WINDOW_BYTES)
    for step in steps:
        if callable(step):
            step(m)
            m.data_to_send()
        else:
            m.receive_data(encode(step))
    closed = [e for e in m.events() if isinstance(e, Closed)]
    assert len(closed) == 1 and reason in closed[0].reason, closed
    assert m.state is State.CLOSED and decoded(split(m.data_to_send()))[-1] == Close(reason=closed[0].reason)


def test_refusal_frees_the_slot_and_the_sender_rolls_back():
    pair = pair_of(inbound_window_size=1)
    pair.c.send_transaction("x", [b"m"])
    flow(pair)
    pair.l.refuse_transaction("x", "queue orders is full\nfor good " + "z" * 600)
    flow(pair)
    [refused] = took(pair, pair.c, TransactionRefused)
    assert refused.xid == "x" and refused.reason.startswith("queue orders is full\\nfor good")
    assert pair.c.outbound == {} and pair.l.inbound == {} and pair.c.window_available == 1
    assert pair.frames(pair.l)[-1] == Refuse(xid="x", reason=("queue orders is full\nfor good " + "z" * 600)[:500])
    with pytest.raises(LocalProtocolError, match="commit for xid 'x', which is not open"):
        pair.c.commit("x")


def test_closed_reports_the_open_transactions_and_their_phases():
    pair = pair_of()
    c, lis = pair.c, pair.l
    for xid in ("sent", "prepared", "committing"):
        c.send_transaction(xid, [b"m"])
        lis.send_transaction("in-" + xid, [b"m"])
    flow(pair)
    for m in (c, lis):
        m.prepared("in-prepared" if m is c else "prepared")
        m.prepared("in-committing" if m is c else "committing")
    flow(pair)
    c.commit("committing")
    flow(pair)
    c.close("stop")
    flow(pair)
    [closed] = took(pair, c, Closed)
    assert closed.outbound == (("sent", Phase.SENT), ("prepared", Phase.PREPARED), ("committing", Phase.COMMITTING))
    assert closed.inbound == (
        ("in-sent", Phase.RECEIVED),
        ("in-prepared", Phase.PREPARED),
        ("in-committing", Phase.PREPARED),
    )
    [peer_closed] = took(pair, lis, Closed)
    assert peer_closed.by_peer and dict(peer_closed.inbound) == {
        "sent": Phase.RECEIVED,
        "prepared": Phase.PREPARED,
        "committing": Phase.COMMITTING,
    }


def test_the_phase_tables_cover_each_frame_and_decision_of_the_transfer():
    inputs = {step for _, step in OUTBOUND_PHASES} | {step for _, step in INBOUND_PHASES}
    assert {
        FrameType.PREPARE_REPLY,
        FrameType.REFUSE,
        FrameType.COMMIT_REPLY,
        FrameType.NONXA_COMMIT,
        FrameType.TRANSACTION,
        FrameType.COMMIT,
        FrameType.NONXA_TRANSACTION,
    } <= inputs
    assert {
        Decision.SEND,
        Decision.COMMIT,
        Decision.PREPARED,
        Decision.REFUSE_TRANSACTION,
        Decision.COMMITTED,
        Decision.SEND_NONXA,
        Decision.NONXA_COMMITTED,
        Decision.RECOVERY_LIST,
        Decision.RECOVERY_DONE,
    } <= inputs
    # every phase is reachable and every open phase can end
    for table in (OUTBOUND_PHASES, INBOUND_PHASES):
        reached = {phase for phase in table.values() if phase}
        assert reached == {phase for phase, _ in table if phase}


# -- non-XA ------------------------------------------------------------------------------------------


def test_the_non_xa_flow_window_and_sequence():
    pair = pair_of(use_xa=False, inbound_window_size=2)
    c, lis = pair.c, pair.l
    assert not c.use_xa
    c.send_nonxa(5, [b"a"])
    c.send_nonxa(9, [b"b", b"c"])
    with pytest.raises(LocalProtocolError, match=r"no window available: 2 transactions \(2051 bytes\) await their com"):
        c.send_nonxa(10, [b"d"])
    flow(pair)
    assert took(pair, lis, NonXaTransactionReceived) == [
        NonXaTransactionReceived(seq=5, messages=(b"a",)),
        NonXaTransactionReceived(seq=9, messages=(b"b", b"c")),
    ]
    lis.nonxa_committed(9)  # any order
    flow(pair)
    assert took(pair, c, NonXaCommitted) == [NonXaCommitted(seq=9)] and c.outbound == {5: Phase.SENT}
    with pytest.raises(LocalProtocolError, match="the sequence number must grow"):
        c.send_nonxa(9, [b"d"])
    with pytest.raises(LocalProtocolError, match="this call on a non-XA link"):
        c.send_transaction("x", [b"d"])
    with pytest.raises(LocalProtocolError, match=re.escape("nonxa_committed for seq 9, which is not open (inbound)")):
        lis.nonxa_committed(9)
    lis.nonxa_committed(5)
    c.send_nonxa(10, [b"d"])
    flow(pair)
    assert c.outbound == {10: Phase.SENT} and lis.inbound == {10: Phase.RECEIVED}
    assert FrameType.RECOVERY not in [f.TYPE for f in pair.frames(c)]  # no recovery stage without XA


@pytest.mark.parametrize(
    "steps, reason",
    [
        (
            [NonXaTransaction(seq=3, messages=(b"m",)), NonXaTransaction(seq=3, messages=(b"m",))],
            "NONXA_TRANSACTION 3 after 3: the sequence number must grow",
        ),
        (
            [NonXaTransaction(seq=3, messages=(b"m",)), NonXaTransaction(seq=2, messages=(b"m",))],
            "NONXA_TRANSACTION 2 after 3",
        ),
        (
            [NonXaTransaction(seq=i, messages=(BIG,)) for i in range(5)],
            "NONXA_TRANSACTION 4 overruns our inbound-window-bytes of 65536",
        ),
        ([NonXaCommit(seq=4)], "NONXA_COMMIT frame for seq 4, which is not open (outbound)"),
        ([T(xid="a", messages=(b"m",))], "TRANSACTION frame on a non-XA link"),
        ([Commit(xid="a")], "COMMIT frame on a non-XA link"),
    ],
)
def test_a_peers_non_xa_breach_closes_the_link(steps, reason):
    m = operational(use_xa=False, inbound_window_size=2, inbound_window_bytes=MIN_WINDOW_BYTES)
    for step in steps:
        m.receive_data(encode(step))
    [closed] = [e for e in m.events() if isinstance(e, Closed)]
    assert reason in closed.reason


# -- compression -------------------------------------------------------------------------------------


@pytest.mark.parametrize("c_wants, l_wants", [(True, True), (True, False), (False, True)])
def test_compression_is_used_when_both_ask_and_round_trips(c_wants, l_wants):
    pair = Pair(connector(use_compression=c_wants), listener(use_compression=l_wants))
    pair.run()
    both = c_wants and l_wants
    assert [e.compression for m in pair.machines for e in pair.events[m] if isinstance(e, Operational)] == [both] * 2
    batch = [b"order %d " % i + b"x" * 300 for i in range(20)]
    pair.c.send_transaction("z", batch)
    pair.c.send_transaction("tiny", [b"\x01"])  # does not shrink: sent as it is
    flow(pair)
    [frame, tiny] = [f for f in pair.frames(pair.c) if isinstance(f, Transaction)]
    assert frame.compressed is both and not tiny.compressed
    if both:
        assert len(frame.messages) == 1 and len(frame.messages[0]) < 1000
    assert took(pair, pair.l, TransactionReceived)[0].messages == tuple(batch)


@pytest.mark.parametrize(
    "payload, reason",
    [
        ((BOMB,), "a compressed batch inflates beyond 1048576 bytes"),
        ((b"junk",), "corrupt compressed batch"),
        ((zlib.compress(msgpack.packb([b"a"]))[:-3],), "truncated"),
        ((zlib.compress(msgpack.packb([b"a"])) + b"tail",), "data after its zlib stream"),
        ((zlib.compress(b"\x93\x01\x02\x03"),), "must inflate to an array of bin"),
        ((zlib.compress(msgpack.packb(["text"])),), "malformed compressed batch"),
        ((zlib.compress(b"\xc1"),), "malformed compressed batch"),
        ((b"a", b"b"), "must hold one zlib stream, got 2 items"),
    ],
)
def test_a_bad_compressed_batch_is_a_breach_never_an_allocation(payload, reason):
    m = operational(use_compression=True)
    assert m.compression
    m.receive_data(encode(Transaction(xid="bomb", messages=payload, compressed=True)))
    [closed] = [e for e in m.events() if isinstance(e, Closed)]
    assert reason in closed.reason and m.state is State.CLOSED
    with pytest.raises(RemoteProtocolError, match="inflates beyond 4096 bytes"):
        unpack_messages((BOMB,), True, 4096)


def test_a_batch_that_would_inflate_beyond_the_peers_frame_size_is_not_compressed():
    pair = pair_of(use_compression=True, max_frame_size=4096)
    with pytest.raises(LocalProtocolError, match="exceeds the maximum frame size of 4096 bytes"):
        pair.c.send_transaction("big", [b"z" * 5000])  # would deflate to a few bytes, but inflate beyond
    assert pair.c.outbound == {}
    pair.c.send_transaction("fits", [b"z" * 4000])
    flow(pair)
    assert [f.compressed for f in pair.frames(pair.c) if isinstance(f, Transaction)] == [True]
    assert took(pair, pair.l, TransactionReceived)[0].messages == (b"z" * 4000,)


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20), st.booleans())
def test_pack_and_unpack_round_trip(messages, compress):
    packed, compressed = pack_messages(tuple(messages), compress)
    assert compressed <= compress
    assert unpack_messages(packed, compressed, 1 << 20) == tuple(messages)


# -- XA recovery -------------------------------------------------------------------------------------


class RecoveringOwner:
    """An owner through the recovery stage: ``held_out`` are its outbound xids prepared for
    the peer (as a sender), ``held_in`` the xids it holds prepared as a receiver from the
    peer. It resolves by the recovery table and records its local decisions."""

    def __init__(self, held_out=(), held_in=(), *, commit_replies=True):
        self.held_out, self.held_in = list(held_out), list(held_in)
        self.committed_locally: list[str] = []  # as the sender (case 1)
        self.rolled_back: list[str] = []  # as the sender (case 2)
        self.committed_in: list[str] = []  # as the receiver, on the peer's COMMIT
        self.commit_replies = commit_replies

    def act(self, m: LinkMachine, events: list) -> bool:
        acted = False
        for e in events:
            if isinstance(e, RecoveryRequested):
                m.recovery_list(self.held_in)
            elif isinstance(e, RecoveryReceived):
                listed = set(e.xids)
                self.committed_locally += [x for x in self.held_out if x in listed]  # case 1
                self.rolled_back += [x for x in self.held_out if x not in listed]  # case 2
                m.recovery_done(commit=e.xids)  # cases 1 and 3: the peer commits all it listed
            elif isinstance(e, CommitReceived) and e.recovery and self.commit_replies:
                self.committed_in.append(e.xid)
                m.committed(e.xid)
            else:
                continue
            acted = True
        return acted


def run_recovery(c_owner: RecoveringOwner, l_owner: RecoveringOwner, **settings) -> Pair:
    """Run a pair through the handshake with the two owners answering the recovery."""
    pair = Pair(connector(**settings), listener(**settings), recover=())
    owners = {pair.c: c_owner, pair.l: l_owner}
    seen = {pair.c: 0, pair.l: 0}
    while True:
        acted = False
        for m in pair.machines:
            new = pair.events[m][seen[m] :]
            seen[m] = len(pair.events[m])
            acted |= owners[m].act(m, new)
        flow(pair)
        if not acted and all(seen[m] == len(pair.events[m]) for m in pair.machines):
            return pair


@pytest.mark.parametrize(
    "case, sender_holds, receiver_lists, committed_locally, rolled_back, peer_commits",
    [
        ("both prepared: commit on both sides", ["x1"], ["x1"], ["x1"], [], ["x1"]),
        ("only the sender prepared: roll back, send again", ["x2"], [], [], ["x2"], []),
        ("only the receiver prepared: the sender committed already", [], ["x3"], [], [], ["x3"]),
        ("all three at once", ["x1", "x2"], ["x1", "x3"], ["x1"], ["x2"], ["x1", "x3"]),
        ("nothing to recover", [], [], [], [], []),
    ],
)
@pytest.mark.parametrize("sender_role", [CONNECTOR, LISTENER])
def test_recovery_resolves_the_three_cases(
    case, sender_holds, receiver_lists, committed_locally, rolled_back, peer_commits, sender_role
):
    sender = RecoveringOwner(held_out=sender_holds)
    receiver = RecoveringOwner(held_in=receiver_lists)
    c_owner, l_owner = (sender, receiver) if sender_role is CONNECTOR else (receiver, sender)
    pair = run_recovery(c_owner, l_owner)
    assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL, case
    assert sender.committed_locally == committed_locally and sender.rolled_back == rolled_back
    assert receiver.committed_in == peer_commits
    s, r = sides(pair, sender_role)
    assert [e.xid for e in pair.events[s] if isinstance(e, CommitDone)] == peer_commits
    assert all(e.recovery for e in pair.events[s] if isinstance(e, CommitDone))
    assert [f.xid for f in pair.frames(s) if isinstance(f, Commit)] == peer_commits
    assert [f.xid for f in pair.frames(r) if isinstance(f, CommitReply)] == peer_commits
    # the delivery stage began only after the recovery on both sides
    for m in pair.machines:
        types = [f.TYPE for f in pair.frames(m)]
        assert types.index(FrameType.RECOVERY_DONE) < types.index(FrameType.ADJUST)
        assert s.outbound == {} and r.inbound == {}
    [op] = [e for e in pair.events[r] if isinstance(e, Operational)]
    assert op.unresolved == ()


def test_delivery_waits_for_the_slower_sides_commits():
    slow = RecoveringOwner(held_in=["x1"], commit_replies=False)  # receives a COMMIT, does not answer yet
    pair = run_recovery(RecoveringOwner(held_out=["x1"]), slow)
    assert pair.c.state is State.RECOVERY_WAIT and pair.l.state is State.RECOVERY_WAIT
    assert pair.l.inbound == {"x1": Phase.COMMITTING} and pair.c.outbound == {"x1": Phase.COMMITTING}
    assert FrameType.ADJUST not in [f.TYPE for m in pair.machines for f in pair.frames(m)]
    with pytest.raises(LocalProtocolError, match="send_transaction while awaiting the XA recovery"):
        pair.c.send_transaction("y", [b"m"])
    pair.l.committed("x1")
    flow(pair)
    assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL


def test_xids_the_peer_does_not_commit_stay_unresolved():
    class Partial(RecoveringOwner):
        def act(self, m, events):
            for e in events:
                if isinstance(e, RecoveryReceived):
                    m.recovery_done(commit=e.xids[:1])
                    return True
            return super().act(m, events)

    receiver = RecoveringOwner(held_in=["a", "b"])
    pair = run_recovery(Partial(), receiver)
    [op] = [e for e in pair.events[pair.l] if isinstance(e, Operational)]
    assert op.unresolved == ("b",) and receiver.committed_in == ["a"] and pair.l.inbound == {}


def test_a_recovery_that_takes_too_long_closes_the_link_and_reports_what_is_open():
    stuck = RecoveringOwner(held_in=["x1", "x2"], commit_replies=False)
    pair = run_recovery(RecoveringOwner(held_out=["x1"]), stuck, recovery_timeout=30)
    assert pair.l.state is State.RECOVERY_WAIT
    pair.tick(100.0)
    assert pair.l.tick(129.9) == 130.0
    pair.tick(130.0)
    closed = took(pair, pair.l, Closed)[0]
    assert closed.reason == "recovery-timeout (30 s) expired in the XA recovery stage (awaiting the XA recovery)"
    assert closed.stage is Stage.RECOVERY
    # the sender told it to commit both (it listed both); it answered neither
    assert closed.inbound == (("x1", Phase.COMMITTING), ("x2", Phase.COMMITTING))
    assert took(pair, pair.c, Closed)[0].outbound == (("x1", Phase.COMMITTING), ("x2", Phase.COMMITTING))
    m = at_recovery(listed=("y1",))  # listed, the peer has not answered yet
    m.close("the router stops")
    assert [e.inbound for e in m.events() if isinstance(e, Closed)] == [(("y1", Phase.IN_DOUBT),)]


def at_recovery(role=LISTENER, listed=("x1",)) -> LinkMachine:
    """A machine in the recovery stage that sent its list; the peer is played by hand."""
    pair = Pair(recover=())
    pair.run()
    m = pair.l if role is LISTENER else pair.c
    assert m.state is State.RECOVERY_WAIT
    m.recovery_list(listed)
    m.events()
    m.data_to_send()
    return m


@pytest.mark.parametrize(
    "frames, reason",
    [
        ([Recovery(xids=()), Recovery(xids=())], "RECOVERY received twice"),
        ([Recovery(xids=("a", "a"))], "RECOVERY: an xid is listed twice"),
        ([Recovery(xids=("",))], "RECOVERY: an xid is a string of 1 to 200 characters"),
        ([Commit(xid="zz")], "COMMIT frame for xid 'zz', which is not open (inbound)"),
        ([CommitReply(xid="zz")], "COMMIT_REPLY frame for xid 'zz', which is not open (outbound)"),
        ([Commit(xid="x1"), RecoveryDone()], "RECOVERY_DONE while its COMMITs await our COMMIT_REPLY"),
        ([RecoveryDone(), RecoveryDone()], "RECOVERY_DONE received twice"),
        ([T(xid="a", messages=(b"m",))], "unexpected TRANSACTION frame while awaiting the XA recovery"),
        ([Keepalive()], "unexpected KEEPALIVE frame while awaiting the XA recovery"),
    ],
)
def test_a_peers_recovery_breach_closes_the_link(frames, reason):
    m = at_recovery()
    for frame in frames:
        m.receive_data(encode(frame))
    [closed] = [e for e in m.events() if isinstance(e, Closed)]
    assert reason in closed.reason


def test_recovery_done_before_our_list_is_a_breach():
    pair = Pair(recover=())
    pair.run()
    pair.l.receive_data(encode(RecoveryDone()))
    [closed] = [e for e in pair.l.events() if isinstance(e, Closed)]
    assert closed.reason == "RECOVERY_DONE before our RECOVERY was sent"


def test_the_owners_recovery_misuse_raises():
    m = at_recovery()
    with pytest.raises(LocalProtocolError, match="recovery_done before the peer's RECOVERY"):
        m.recovery_done()
    with pytest.raises(LocalProtocolError, match="recovery_list given twice"):
        m.recovery_list(())
    m.receive_data(encode(Recovery(xids=("p1",))))
    with pytest.raises(LocalProtocolError, match=r"may commit only xids the peer listed, each once; not \['q'\]"):
        m.recovery_done(commit=["q"])
    with pytest.raises(LocalProtocolError, match="each once"):
        m.recovery_done(commit=["p1", "p1"])
    assert m.data_to_send() == b""
    m.recovery_done(commit=["p1"])
    with pytest.raises(LocalProtocolError, match="recovery_done given twice"):
        m.recovery_done()
    with pytest.raises(LocalProtocolError, match="prepared while awaiting the XA recovery"):
        m.prepared("x1")
    lis = Pair(recover=())
    lis.run()
    with pytest.raises(LocalProtocolError, match="an xid is listed twice"):
        lis.l.recovery_list(["a", "a"])


# -- flow and keepalive ------------------------------------------------------------------------------


def test_keepalives_continue_through_a_long_transfer_with_delayed_prepares():
    pair = pair_of(keepalive_interval=10, inbound_window_size=4)
    pair.tick(0)
    held: list[str] = []
    n = 0
    for second in range(1, 400):
        while pair.c.window_available:
            pair.c.send_transaction(f"t{n}", [b"m%d" % n])
            n += 1
        pair.tick(float(second))
        held += [e.xid for e in took(pair, pair.l, TransactionReceived)]
        if second % 25 == 0:  # inbound flow control: the receiver prepares late, in bulk
            for xid in held:
                pair.l.prepared(xid)
            held = []
        answer(pair.c, took(pair, pair.c, PrepareReceived))
        answer(pair.l, took(pair, pair.l, CommitReceived))
        flow(pair)
        assert pair.c.state is State.OPERATIONAL and pair.l.state is State.OPERATIONAL
        assert pair.c.keepalive_counter >= 4 and pair.l.keepalive_counter >= 4
    keepalives = [f.TYPE for f in pair.frames(pair.c)].count(FrameType.KEEPALIVE)
    assert keepalives == 39 and len(took(pair, pair.c, CommitDone)) >= 60


# -- random interleavings ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans(), st.integers(1, 4), st.integers(1, 3))
def test_random_interleavings_keep_the_invariants(data, xa, window, size):
    """Both directions at once, every step in a random order: no breach, the window is
    never exceeded, no commit reaches a receiver before its sender committed, and in the
    end everything sent was received exactly once and is over on both sides."""
    pair = pair_of(
        use_xa=xa, inbound_window_size=window, inbound_transaction_size=size, inbound_window_bytes=MIN_WINDOW_BYTES
    )
    sent: dict[LinkMachine, dict] = {m: {} for m in pair.machines}  # key -> messages
    received: dict[LinkMachine, list] = {m: [] for m in pair.machines}
    sender_committed: dict[LinkMachine, set] = {m: set() for m in pair.machines}
    counter = {m: 0 for m in pair.machines}
    pending = {m: [] for m in pair.machines}  # events awaiting the owner

    def collect():
        for m in pair.machines:
            for e in pair.events[m]:
                peer = pair.other(m)
                if isinstance(e, Closed):
                    raise AssertionError(e)
                if isinstance(e, TransactionReceived | NonXaTransactionReceived):
                    received[m].append((getattr(e, "xid", None) or getattr(e, "seq", None), e.messages))
                if isinstance(e, CommitReceived):
                    assert e.xid in sender_committed[peer], "committed at the receiver before the sender"
                pending[m].append(e)
            pair.events[m] = []
            # what the receiver holds: below its bound before the last transaction came
            held = [transaction_cost(sent[m][key]) for key in pair.other(m).inbound]
            assert sum(held) - max(held, default=0) < OPEN_FACTOR * MIN_WINDOW_BYTES
            assert sum(p is Phase.SENT for p in m.outbound.values()) <= window

    refused: dict[LinkMachine, set] = {m: set() for m in pair.machines}  # keys the receiver m refused
    done: dict[LinkMachine, set] = {m: set() for m in pair.machines}  # keys over at the sender m

    def act(m, e, refuse=False) -> None:
        if isinstance(e, PrepareReceived):
            sender_committed[m].add(e.xid)
        if isinstance(e, TransactionReceived) and refuse:
            m.refuse_transaction(e.xid, "no")
            refused[m].add(e.xid)
            return
        if isinstance(e, CommitDone | NonXaCommitted | TransactionRefused):
            key = getattr(e, "xid", None) or getattr(e, "seq", None)
            assert key not in done[m]
            done[m].add(key)
        answer(m, [e])

    for _ in range(data.draw(st.integers(1, 60))):
        collect()
        choices = (
            ["deliver"]
            + [f"send{i}" for i, m in enumerate(pair.machines) if m.window_available]
            + [f"answer{i}" for i, m in enumerate(pair.machines) if pending[m]]
        )
        choice = data.draw(st.sampled_from(choices))
        if choice == "deliver":
            senders = [m for m in pair.machines if pair.queue[m]]
            if senders:
                m = data.draw(st.sampled_from(senders))
                pair.other(m).receive_data(pair.queue[m].pop(0))
                pair._pump()
        elif choice.startswith("send"):
            m = pair.machines[int(choice[-1])]
            counter[m] += 1
            padding = b"x" * data.draw(st.sampled_from([0, 0, 30_000]))  # large ones meet the byte bound
            count = data.draw(st.integers(1, size))
            messages = [b"%s-%d-%d" % (m.name.encode(), counter[m], k) + padding for k in range(count)]
            key = f"{m.name}-{counter[m]}" if xa else counter[m]
            assert m.send_transaction(key, messages) if xa else m.send_nonxa(key, messages)
            sent[m][key] = tuple(messages)
            pair._pump()
        else:
            m = pair.machines[int(choice[-1])]
            e = pending[m].pop(data.draw(st.integers(0, len(pending[m]) - 1)))
            act(m, e, refuse=xa and data.draw(st.integers(0, 4)) == 0)
            pair._pump()
    # drain: deliver and answer everything
    for _ in range(1000):
        collect()
        if not any(pending.values()) and not any(pair.queue.values()):
            break
        for m in pair.machines:
            while pending[m]:
                act(m, pending[m].pop(0))
        pair._pump()
        pair.run()
    for m in pair.machines:
        assert m.outbound == {} and m.inbound == {}
        assert sorted(received[pair.other(m)], key=str) == sorted(sent[m].items(), key=str)
        assert done[m] == set(sent[m])  # each over exactly once at its sender (committed or refused)
    event(
        f"transactions: {'0' if not sent[pair.c] else '1-4' if len(sent[pair.c]) < 5 else '5+'}; "
        f"refused: {bool(refused[pair.c] or refused[pair.l])}"
    )


def test_a_zip_bomb_is_refused_without_inflating_it():
    """16 MiB of zeros in about 16 KiB: refused having inflated at most the bound (+ 1 byte)."""
    deflater = zlib.compressobj(9)
    size = 16 << 20
    bomb = deflater.compress(b"\x91\xc6" + size.to_bytes(4, "big"))
    chunk = bytes(1 << 20)
    for _ in range(16):
        bomb += deflater.compress(chunk)
    bomb += deflater.flush()
    assert len(bomb) < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError, match="inflates beyond 4096 bytes"):
            unpack_messages((bomb,), True, 4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([CONNECTOR, LISTENER]))
def test_a_link_cut_at_any_point_then_recovery_gives_exactly_once(data, sender_role):
    """Owners with durable state (what survives a crash) run transfers, the link is cut at
    a random point (the frames in flight are lost), a new connection recovers: every xid
    ends committed on both sides or rolled back at the sender with nothing held at the
    receiver (to be sent again), and no xid is committed twice."""
    pair = pair_of(inbound_window_size=3)
    s, r = sides(pair, sender_role)
    out_prepared: set[str] = set()  # the sender's outbound held prepared (logged before sending)
    out_committed: set[str] = set()
    in_prepared: set[str] = set()  # the receiver's, durable at prepared()
    in_committed: list[str] = []
    pending: dict[LinkMachine, list] = {s: [], r: []}
    sent = 0
    for _ in range(data.draw(st.integers(0, 50))):
        for m in (s, r):
            pending[m] += pair.events[m]
            pair.events[m] = []
        choices = (
            ["deliver"]
            + (["send"] if s.window_available and sent < 8 else [])
            + ["sender"] * bool(pending[s])
            + ["receiver"] * bool(pending[r])
        )
        choice = data.draw(st.sampled_from(choices))
        if choice == "send":
            sent += 1
            out_prepared.add(f"x{sent}")
            s.send_transaction(f"x{sent}", [b"m%d" % sent])
        elif choice == "deliver":
            senders = [m for m in (s, r) if pair.queue[m]]
            if senders:
                m = data.draw(st.sampled_from(senders))
                pair.other(m).receive_data(pair.queue[m].pop(0))
        elif choice == "sender":
            e = pending[s].pop(0)
            if isinstance(e, PrepareReceived):
                out_prepared.remove(e.xid)
                out_committed.add(e.xid)  # durable, then COMMIT
                s.commit(e.xid)
        else:
            e = pending[r].pop(0)
            if isinstance(e, TransactionReceived):
                in_prepared.add(e.xid)
                r.prepared(e.xid)
            elif isinstance(e, CommitReceived):
                in_prepared.remove(e.xid)
                in_committed.append(e.xid)
                r.committed(e.xid)
        pair._pump()
    # the cut: what is in flight is lost; a RECEIVED transaction was never prepared (nothing held)
    sender_owner = RecoveringOwner(held_out=sorted(out_prepared))
    receiver_owner = RecoveringOwner(held_in=sorted(in_prepared))
    again = run_recovery(
        *((sender_owner, receiver_owner) if sender_role is CONNECTOR else (receiver_owner, sender_owner))
    )
    assert again.c.state is State.OPERATIONAL and again.l.state is State.OPERATIONAL
    out_committed |= set(sender_owner.committed_locally)
    in_committed += receiver_owner.committed_in
    assert len(in_committed) == len(set(in_committed)), "an xid committed twice at the receiver"
    assert set(in_committed) == out_committed  # committed on both sides, or on neither
    rolled_back = set(sender_owner.rolled_back)
    assert rolled_back | out_committed == {f"x{i}" for i in range(1, sent + 1)}
    assert not rolled_back & (in_prepared | set(in_committed))  # the receiver holds nothing of them
