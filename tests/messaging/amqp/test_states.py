"""The engine's three state machines (messaging/amqp/engine/states.py): the connection [2.4.6], session
[2.5.5] and link [2.6.3, 2.6.6] transition tables, every (state, input) pair of each, and
the engine driven through them by a Hypothesis peer that sends any begin, attach, transfer,
flow, disposition, detach and end a session or link may get, while an owner attaches,
detaches, grants credit and ends sessions at random.

What must hold: each pair either moves to the table's state or raises the table's error
(the peer's inputs a RemoteProtocolError of their scope, the owner's a LocalProtocolError),
leaving the state as it was; breaches of a link or a session never close the connection;
and nothing we write breaks the protocol ourselves (checked frame by frame by a validator
that plays the peer's bookkeeping)."""

from __future__ import annotations

import struct
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from martinet.messaging import amqp
from martinet.messaging.codec import Described, UInt, ULong, UShort, decode, encode

MACHINES = {
    "connection": (amqp.ConnectionState, amqp.ConnectionInput, amqp.CONNECTION_TRANSITIONS),
    "session": (amqp.SessionState, amqp.SessionInput, amqp.SESSION_TRANSITIONS),
    "link": (amqp.LinkState, amqp.LinkInput, amqp.LINK_TRANSITIONS),
}
INITIAL = {
    "connection": amqp.ConnectionState.START,
    "session": amqp.SessionState.UNMAPPED,
    "link": amqp.LinkState.UNATTACHED,
}
FINAL = {"connection": amqp.ConnectionState.END, "session": amqp.SessionState.ENDED, "link": amqp.LinkState.DETACHED}
PEER_INPUTS = {
    amqp.ConnectionInput.HEADER,
    amqp.ConnectionInput.OPEN_IN,
    amqp.ConnectionInput.CLOSE_IN,
    amqp.SessionInput.BEGIN_IN,
    amqp.SessionInput.END_IN,
    amqp.LinkInput.ATTACH_IN,
    amqp.LinkInput.DETACH_IN,
}
# What a pair missing from a table must raise: (kind, condition, scope)
MISSING = {
    amqp.ConnectionInput.HEADER: (amqp.RemoteProtocolError, "amqp:connection:framing-error", "connection"),
    amqp.ConnectionInput.OPEN_IN: (amqp.RemoteProtocolError, "amqp:not-allowed", "connection"),
    amqp.ConnectionInput.CLOSE_IN: (amqp.RemoteProtocolError, "amqp:not-allowed", "connection"),
    amqp.SessionInput.BEGIN_IN: (amqp.RemoteProtocolError, "amqp:not-allowed", "connection"),
    amqp.SessionInput.END_IN: (amqp.RemoteProtocolError, "amqp:not-allowed", "connection"),
    amqp.LinkInput.ATTACH_IN: (amqp.RemoteProtocolError, "amqp:session:handle-in-use", "session"),
    amqp.LinkInput.DETACH_IN: (amqp.RemoteProtocolError, "amqp:session:unattached-handle", "session"),
    **{
        event: (amqp.LocalProtocolError, "amqp:not-allowed", "connection")
        for event in (amqp.ConnectionInput.OPEN_OUT, amqp.ConnectionInput.CLOSE_OUT)
    },
    **{
        event: (amqp.LocalProtocolError, "amqp:not-allowed", "session")
        for event in (amqp.SessionInput.BEGIN_OUT, amqp.SessionInput.END_OUT, amqp.SessionInput.END_ERROR_OUT)
    },
    **{
        event: (amqp.LocalProtocolError, "amqp:not-allowed", "link")
        for event in (amqp.LinkInput.ATTACH_OUT, amqp.LinkInput.DETACH_OUT, amqp.LinkInput.DETACH_ERROR_OUT)
    },
}


def endpoint(machine: str):
    """A fresh connection, session or link object whose state the test sets."""
    connection = amqp.Connection(container_id="t")
    if machine == "connection":
        return connection
    session = amqp.Session(connection, 0)
    return session if machine == "session" else amqp.Link(session, "l", False, 0)


def check_pair(machine: str, state, event) -> None:
    """``event`` in ``state``: the table's next state, or the table's error and no change."""
    _, _, table = MACHINES[machine]
    subject = endpoint(machine)
    subject._state = state
    following = table.get((state, event))
    if following is not None:
        changed = subject._move(event)
        assert subject.state is following
        if machine != "connection":
            assert changed is (following is not state)  # a self-pair reports "nothing to do"
        return
    kind, condition, scope = MISSING[event]
    with pytest.raises(amqp.ProtocolError) as raised:
        subject._move(event)
    error = raised.value
    assert type(error) is kind and (error.condition, error.scope) == (condition, scope)
    expected = {
        "connection": None,
        "session": subject if machine == "session" else getattr(subject, "session", None),
        "link": subject,
    }[scope]
    assert error.endpoint is expected
    assert subject.state is state  # a refused input changes nothing


@pytest.mark.parametrize("machine", MACHINES)
def test_every_pair_of_each_table_moves_or_raises_the_tables_error(machine):
    states, inputs, _ = MACHINES[machine]
    for state in states:
        for event in inputs:
            check_pair(machine, state, event)


@pytest.mark.parametrize("machine", MACHINES)
@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_random_pairs_and_sequences_stay_within_each_table(machine, data):
    """sampled_from(states) × sampled_from(inputs), then a run of inputs from there: every
    step is the table's move or the table's error, and the state is always one of the
    machine's states."""
    states, inputs, table = MACHINES[machine]
    state, event = data.draw(st.sampled_from(list(states))), data.draw(st.sampled_from(list(inputs)))
    check_pair(machine, state, event)
    subject = endpoint(machine)
    subject._state = state
    for event in data.draw(st.lists(st.sampled_from(list(inputs)), max_size=12)):
        before = subject.state
        try:
            subject._move(event)
        except amqp.ProtocolError:
            assert (before, event) not in table and subject.state is before
        else:
            assert subject.state is table[(before, event)]
        assert subject.state in states


@pytest.mark.parametrize("machine", MACHINES)
def test_each_table_is_connected_and_the_peer_always_moves(machine):
    """Every state is reachable from the first; the last is reachable from every state
    (no state to get stuck in); a pair mapping a state to itself is never the peer's
    input (the peer's frames always mean something); a link's session end is total."""
    states, inputs, table = MACHINES[machine]

    def reachable(start):
        seen, todo = {start}, deque([start])
        while todo:
            state = todo.popleft()
            for event in inputs:
                following = table.get((state, event))
                if following is not None and following not in seen:
                    seen.add(following)
                    todo.append(following)
        return seen

    assert reachable(INITIAL[machine]) == set(states)
    assert all(FINAL[machine] in reachable(state) for state in states)
    assert not [pair for pair, following in table.items() if pair[1] in PEER_INPUTS and following is pair[0]]
    if machine == "link":
        assert all(table[(state, amqp.LinkInput.SESSION_END)] is amqp.LinkState.DETACHED for state in states)


# -- the engine through the tables: a random peer, a random owner ---------------------------------


def frame(code: int, fields: list, payload: bytes = b"", channel: int = 0) -> bytes:
    body = b"\x00\x53" + bytes([code]) + encode(fields) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def frames_of(data: bytes) -> list[tuple[int, int, list]]:
    """(channel, performative code, fields) of each frame we wrote (headers and empty frames skipped)."""
    got, offset = [], 0
    while offset < len(data):
        if data.startswith(b"AMQP", offset):
            offset += 8
            continue
        size, _, _, channel = struct.unpack_from(">IBBH", data, offset)
        if size > 8:
            value, _ = decode(data, offset + 8)
            got.append((channel, int(value.descriptor), value.value))
        offset += size
    return got


class OutputValidator:
    """The peer's view of what we send: no frame on a channel we have not begun or have
    ended, no frame naming a handle we have not attached or have detached, no attach on a
    handle in use."""

    def __init__(self):
        self.begun: set[int] = set()
        self.handles: dict[int, set[int]] = {}  # channel → our attached handles

    def check(self, data: bytes) -> list[tuple[int, int, list]]:
        written = frames_of(data)
        for channel, code, fields in written:
            if code in (amqp.OPEN, amqp.CLOSE):
                continue
            if code == amqp.BEGIN:
                assert channel not in self.begun, f"begin on channel {channel}, begun already"
                self.begun.add(channel)
                self.handles[channel] = set()
                continue
            assert channel in self.begun, f"performative 0x{code:02x} on channel {channel}, not begun"
            handles = self.handles[channel]
            if code == amqp.END:
                self.begun.discard(channel)
            elif code == amqp.ATTACH:
                assert fields[1] not in handles, f"attach on handle {fields[1]}, in use"
                handles.add(fields[1])
            elif code == amqp.DETACH:
                assert fields[0] in handles, f"detach of handle {fields[0]}, not attached"
                handles.discard(fields[0])
            elif code in (amqp.FLOW, amqp.TRANSFER):
                handle = (
                    fields[4] if code == amqp.FLOW and len(fields) > 4 else fields[0] if code == amqp.TRANSFER else None
                )
                assert handle is None or handle in handles, f"0x{code:02x} names handle {handle}, not attached"
        return written


CHANNELS, HANDLES, NAMES = st.integers(0, 1), st.integers(0, 2), st.sampled_from(["a", "b"])
TARGET = amqp.Terminus(kind=amqp.TARGET, address="q").described()
SOURCE = amqp.Terminus(kind=amqp.SOURCE, address="q").described()
ACCEPTED = Described(ULong(amqp.ACCEPTED_CODE), [])
SESSION_BREACHES = {"amqp:session:unattached-handle", "amqp:session:handle-in-use"}
LINK_BREACHES = {"amqp:link:transfer-limit-exceeded", "amqp:not-allowed", "amqp:decode-error"}


class Recorder:
    def __init__(self):
        self.transfers, self.outcomes = [], []

    def on_transfer(self, delivery_id, payload, settled, state):
        self.transfers.append(delivery_id)

    def on_outcome(self, delivery_id, state, settled):
        self.outcomes.append(delivery_id)


class EngineUnderAnyPeer(RuleBasedStateMachine):
    """Our server engine; the test is both its peer (raw frames, breaking the rules of
    links and sessions at will, never those of the connection) and its owner."""

    def __init__(self):
        super().__init__()
        self.engine = amqp.Connection(container_id="router")
        self.validator = OutputValidator()
        self.engine.receive_data(amqp.AMQP_HEADER + frame(amqp.OPEN, ["peer"]))
        self.engine.open()
        self.links: list[amqp.Link] = []  # every link the owner heard of or made
        self.sessions: list[amqp.Session] = []
        self.next_delivery = 0
        self.answers = False  # the owner answers the peer's attaches at once (see answer_at_once)
        self.step()

    @initialize(answers=st.booleans())
    def answer_at_once(self, answers):
        """Either an owner that answers each attach as it comes (attach, and credit for a
        receiver: links mostly attached at both ends), or one that leaves that to the rules."""
        self.answers = answers

    def step(self) -> list:
        """Take the engine's events and output; the owner learns of links and sessions."""
        events, self.engine.events = self.engine.events, []
        for event in events:
            assert not isinstance(event, amqp.ConnectionClosed), f"the connection closed: {event}"
            if isinstance(event, amqp.LinkAttached) and event.link not in self.links:
                link = event.link
                self.links.append(link)
                link.handler = Recorder()
                if self.answers and link.state is amqp.LinkState.ATTACH_RCVD:
                    link.source, link.target = link.remote_source, link.remote_target
                    link.attach()
                    if not link.is_sender:
                        link.flow(2)
            elif isinstance(event, amqp.SessionBegun) and event.session not in self.sessions:
                self.sessions.append(event.session)
            elif isinstance(event, amqp.LinkDetached) and not event.by_peer and event.closed:
                assert event.error.condition in LINK_BREACHES
            elif isinstance(event, amqp.SessionEnded) and not event.by_peer:
                assert event.error.condition in SESSION_BREACHES
        self.validator.check(self.engine.data_to_send() or b"")
        return events

    def peer(self, code: int, fields: list, channel: int, payload: bytes = b"") -> list:
        self.engine.receive_data(frame(code, fields, payload, channel))
        return self.step()

    # -- the peer ---------------------------------------------------------------------------------

    @rule(channel=CHANNELS)
    def peer_begins(self, channel):
        if channel not in self.engine._sessions:  # begin twice on a channel: the connection's breach
            self.peer(amqp.BEGIN, [None, UInt(0), UInt(1000), UInt(1000)], channel)
            assert self.engine._sessions[channel].state is amqp.SessionState.MAPPED

    @rule(channel=CHANNELS, data=st.data())
    def peer_answers_our_begin(self, channel, data):
        waiting = [s for s in self.engine._channels.values() if s.remote_channel is None]
        if waiting and channel not in self.engine._sessions:
            session = data.draw(st.sampled_from(waiting))
            before = session.state
            self.peer(amqp.BEGIN, [UShort(session.channel), UInt(0), UInt(1000), UInt(1000)], channel)
            assert session.state is amqp.SESSION_TRANSITIONS[(before, amqp.SessionInput.BEGIN_IN)]

    @rule(channel=CHANNELS, error=st.booleans())
    def peer_ends(self, channel, error):
        session = self.engine._sessions.get(channel)
        if session is not None:
            condition = amqp.Error("amqp:internal-error", "bye").described() if error else None
            events = self.peer(amqp.END, [condition], channel)
            assert session.state is amqp.SessionState.ENDED and channel not in self.engine._sessions
            assert any(isinstance(e, amqp.SessionEnded) and e.session is session and e.by_peer for e in events)

    @rule(channel=CHANNELS, data=st.data(), name=NAMES, peer_receives=st.booleans())
    def peer_attaches(self, channel, data, name, peer_receives):
        session = self.engine._sessions.get(channel)
        if session is None:
            return
        free = [handle for handle in range(3) if handle not in session._links]
        handle = data.draw(st.sampled_from(free)) if free and data.draw(st.integers(0, 3)) != 3 else data.draw(HANDLES)
        in_use = handle in session._links
        expect_end = in_use and session.state is amqp.SessionState.MAPPED
        source, target = (SOURCE, None) if peer_receives else (None, TARGET)
        events = self.peer(
            amqp.ATTACH,
            [
                name,
                UInt(handle),
                peer_receives,
                None,
                None,
                source,
                target,
                None,
                None,
                None if peer_receives else UInt(0),
            ],
            channel,
        )
        if expect_end:
            assert session.state is amqp.SessionState.DISCARDING
            assert [e.error.condition for e in events if isinstance(e, amqp.SessionEnded)] == [
                "amqp:session:handle-in-use"
            ]

    @rule(data=st.data())
    def peer_answers_our_attach(self, data):
        waiting = [
            link
            for link in self.links
            if link.state in (amqp.LinkState.ATTACH_SENT, amqp.LinkState.DETACH_PIPE)
            and link.session.remote_channel is not None
        ]
        if waiting:
            link = data.draw(st.sampled_from(waiting))
            handle = data.draw(HANDLES)
            session = link.session
            in_use = handle in session._links
            before = link.state
            self.peer(
                amqp.ATTACH,
                [
                    link.name,
                    UInt(handle),
                    link.is_sender,
                    None,
                    None,
                    SOURCE,
                    TARGET,
                    None,
                    None,
                    None if link.is_sender else UInt(0),
                ],
                session.remote_channel,
            )
            if not in_use and session.state in (amqp.SessionState.MAPPED, amqp.SessionState.END_SENT):
                assert link.state is amqp.LINK_TRANSITIONS[(before, amqp.LinkInput.ATTACH_IN)]

    def handle(self, data, session: amqp.Session) -> int:
        """Mostly a handle the peer has attached (a random one breaks the session)."""
        if session._links and data.draw(st.integers(0, 3)) != 3:
            return data.draw(st.sampled_from(sorted(session._links)))
        return data.draw(HANDLES)

    @rule(channel=CHANNELS, data=st.data(), closed=st.booleans())
    def peer_detaches(self, channel, data, closed):
        session = self.engine._sessions.get(channel)
        if session is None:
            return
        handle = self.handle(data, session)
        link, state = session._links.get(handle), session.state
        events = self.peer(amqp.DETACH, [UInt(handle), closed], channel)
        if state is amqp.SessionState.DISCARDING:
            assert not events  # dropped until the peer's end
        elif link is None and state is amqp.SessionState.MAPPED:
            assert [e.error.condition for e in events if isinstance(e, amqp.SessionEnded)] == [
                "amqp:session:unattached-handle"
            ]
        elif link is not None:
            assert link.state in (
                amqp.LinkState.DETACH_RCVD,
                amqp.LinkState.ATTACH_DETACH_RCVD,
                amqp.LinkState.DETACHED,
            )
            assert any(isinstance(e, amqp.LinkDetached) and e.link is link and e.by_peer for e in events)

    @rule(channel=CHANNELS, data=st.data(), more=st.booleans(), with_id=st.booleans())
    def peer_transfers(self, channel, data, more, with_id):
        session = self.engine._sessions.get(channel)
        if session is None:
            return
        handle = self.handle(data, session)
        link, state = session._links.get(handle), session.state
        link_state = link.state if link is not None else None
        handed = len(link.handler.transfers) if link is not None and link.handler is not None else 0
        credit, partial = (link.credit, link._partial) if link is not None else (0, None)
        delivery_id = UInt(self.next_delivery) if with_id else None
        self.next_delivery += 1
        events = self.peer(amqp.TRANSFER, [UInt(handle), delivery_id, b"t", UInt(0), False, more], channel, b"m")
        if state is amqp.SessionState.DISCARDING or link_state is amqp.LinkState.DISCARDING:
            assert not events
            assert link is None or link.handler is None or len(link.handler.transfers) == handed
        elif link is None and state is amqp.SessionState.MAPPED:
            assert [e.error.condition for e in events if isinstance(e, amqp.SessionEnded)] == [
                "amqp:session:unattached-handle"
            ]
        elif (
            link_state is amqp.LinkState.ATTACHED and not link.is_sender and credit <= 0 and partial is None and with_id
        ):
            assert [(e.error.condition, e.by_peer) for e in events if isinstance(e, amqp.LinkDetached)] == [
                ("amqp:link:transfer-limit-exceeded", False)
            ]
            assert link.state is amqp.LinkState.DISCARDING

    @rule(channel=CHANNELS, data=st.data(), of_link=st.booleans(), credit=st.integers(0, 3))
    def peer_flows(self, channel, data, of_link, credit):
        session = self.engine._sessions.get(channel)
        if session is not None:
            fields = [UInt(0), UInt(1000), UInt(0), UInt(1000)]
            if of_link:
                fields += [UInt(self.handle(data, session)), UInt(0), UInt(credit)]
            self.peer(amqp.FLOW, fields, channel)

    @rule(channel=CHANNELS, first=st.integers(0, 5), span=st.integers(0, 3))
    def peer_settles(self, channel, first, span):
        if channel in self.engine._sessions:
            self.peer(amqp.DISPOSITION, [True, UInt(first), UInt(first + span), True, ACCEPTED], channel)

    # -- the owner --------------------------------------------------------------------------------

    def owner(self, call, event, link_or_session, table) -> None:
        """An owner's call: the table's move, or a LocalProtocolError and no change."""
        before = link_or_session.state
        following = table.get((before, event))
        if following is None:
            with pytest.raises(amqp.LocalProtocolError):
                call()
            assert link_or_session.state is before
        else:
            call()
            assert link_or_session.state is following
        self.step()

    def pick(self, data, links: list[amqp.Link], *states: amqp.LinkState) -> amqp.Link:
        """Mostly a link in one of ``states`` (where the call means most), else any."""
        wanted = [link for link in links if link.state in states]
        return data.draw(st.sampled_from(wanted if wanted and data.draw(st.integers(0, 3)) != 3 else links))

    @precondition(lambda self: self.links)
    @rule(data=st.data())
    def owner_attaches(self, data):
        link = self.pick(data, self.links, amqp.LinkState.ATTACH_RCVD, amqp.LinkState.ATTACH_DETACH_RCVD)
        if link.source is None and link.target is None:
            link.source, link.target = link.remote_source, link.remote_target
        self.owner(link.attach, amqp.LinkInput.ATTACH_OUT, link, amqp.LINK_TRANSITIONS)

    @precondition(lambda self: self.links)
    @rule(data=st.data(), error=st.booleans(), closed=st.booleans())
    def owner_detaches(self, data, error, closed):
        link = self.pick(
            data, self.links, amqp.LinkState.ATTACHED, amqp.LinkState.DETACH_RCVD, amqp.LinkState.ATTACH_SENT
        )
        reason = amqp.Error("amqp:not-found", "no") if error else None
        event = amqp.LinkInput.DETACH_ERROR_OUT if error else amqp.LinkInput.DETACH_OUT
        self.owner(lambda: link.detach(closed=closed, error=reason), event, link, amqp.LINK_TRANSITIONS)

    @precondition(lambda self: any(not link.is_sender for link in self.links))
    @rule(data=st.data(), credit=st.integers(0, 3))
    def owner_grants_credit(self, data, credit):
        link = self.pick(data, [link for link in self.links if not link.is_sender], amqp.LinkState.ATTACHED)
        state = link.state
        if state in (amqp.LinkState.UNATTACHED, amqp.LinkState.ATTACH_RCVD, amqp.LinkState.ATTACH_DETACH_RCVD):
            with pytest.raises(amqp.LocalProtocolError):
                link.flow(credit)
        else:
            link.flow(credit)
            if not link.attached:
                assert link.credit == 0 or state is amqp.LinkState.DETACH_SENT  # a detached link takes nothing
        self.step()

    @precondition(lambda self: self.links)
    @rule(data=st.data())
    def owner_sends(self, data):
        link = data.draw(st.sampled_from(self.links))
        if link.is_sender and link.attached and link.credit > 0 and not link.session.blocked:
            link.send(b"out")
            self.step()

    @rule(data=st.data(), error=st.booleans())
    def owner_ends(self, data, error):
        if self.sessions:
            session = data.draw(st.sampled_from(self.sessions))
            reason = amqp.Error("amqp:internal-error", "bye") if error else None
            event = amqp.SessionInput.END_ERROR_OUT if error else amqp.SessionInput.END_OUT
            self.owner(lambda: session.end(reason), event, session, amqp.SESSION_TRANSITIONS)

    @rule()
    def owner_begins(self):
        if len(self.engine._channels) < 3:
            self.sessions.append(self.engine.session())
            self.step()

    @rule(data=st.data(), sender=st.booleans())
    def owner_attaches_a_new_link(self, data, sender):
        name = f"ours-{len(self.links)}"  # link names are unique per direction [2.6.1]
        live = self.engine._channels.values()
        sessions = [s for s in self.sessions if s in live]  # (in a stable order, for replays)
        if sessions:
            session = data.draw(st.sampled_from(sessions))
            if session.state not in (amqp.SessionState.BEGIN_SENT, amqp.SessionState.MAPPED):
                with pytest.raises(amqp.LocalProtocolError):
                    session.link(name, sender=sender)
                return
            link = session.link(name, sender=sender)
            link.source = amqp.Terminus(kind=amqp.SOURCE, address="q")
            link.target = amqp.Terminus(kind=amqp.TARGET, address="q")
            link.handler = Recorder()
            link.attach()
            self.links.append(link)
            self.step()

    # -- what always holds -------------------------------------------------------------------------

    @invariant()
    def the_maps_agree_with_the_states(self):
        engine_ = self.engine
        assert not engine_.finished and engine_.state is amqp.ConnectionState.OPENED
        for channel, session in engine_._sessions.items():
            assert session.remote_channel == channel
            assert session.state in (amqp.SessionState.MAPPED, amqp.SessionState.END_SENT, amqp.SessionState.DISCARDING)
        for channel, session in engine_._channels.items():
            assert session.channel == channel and session.state is not amqp.SessionState.ENDED
            if session.state is amqp.SessionState.DISCARDING:
                assert not session._links and not session._handles and not session._unsettled_out
            for handle, link in session._handles.items():
                assert link.handle == handle and link.session is session and link.state is not amqp.LinkState.DETACHED
            for handle, link in session._links.items():
                assert link.remote_handle == handle and link.remote_attached
                assert session._handles.get(link.handle) is link
        for link in self.links:
            assert link.state in amqp.LinkState
            if link.state in (amqp.LinkState.DISCARDING, amqp.LinkState.DETACHED):
                assert link.credit == 0 and link._partial is None


test_the_engine_under_any_peer_and_owner = EngineUnderAnyPeer.TestCase
test_the_engine_under_any_peer_and_owner.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
