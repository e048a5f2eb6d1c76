"""The routing link's window controller (swiftlets/routing/window.py), driven with its own
clock: it stays within its bounds whatever the answers say, grows while the window is full
and the round trip holds, shrinks when the receiver falls behind or stops, and grows back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.swiftlets.routing.window import DECREASE, MAX_WINDOW, STALL_MIN, WindowController

BASE = 0.1  # the link's own round trip in these tests: 100 ms


def fill_rounds(window: WindowController, now: float, rounds: int, rtt: float = BASE) -> float:
    """``rounds`` round trips of a link that always has more to send: each round the whole
    window is answered ``rtt`` after it was sent; the time after them."""
    for _ in range(rounds):
        answers = window.size
        for n in range(answers):
            window.answered(rtt, now + rtt * (n + 1) / answers, limited=True)
        now += rtt
    return now


def test_slow_start_doubles_each_round_trip_while_the_round_trip_holds():
    window = WindowController(10)
    now = fill_rounds(window, 0.0, 1)
    assert window.size == 20
    fill_rounds(window, now, 3)
    assert window.size == 160


def test_an_idle_sender_does_not_grow_the_window():
    window = WindowController(10)
    for n in range(200):
        window.answered(BASE, n * BASE, limited=False)
    assert window.size == 10


def test_a_standing_queue_shrinks_the_window_and_ends_slow_start():
    window = WindowController(10)
    now = fill_rounds(window, 0.0, 4)  # 160
    grown = window.size
    # the receiver falls behind: every answer of a round comes 2 × later than the link's own
    now = fill_rounds(window, now, 2, rtt=2 * BASE)
    assert window.size < grown
    assert window.threshold == window.size  # from here on it grows by one per round trip
    before = window.size
    fill_rounds(window, now + 1, 2)
    assert before < window.size <= before + 2


def test_a_burst_whose_first_answer_is_on_time_is_not_a_queue():
    window = WindowController(10)
    now = fill_rounds(window, 0.0, 3)  # 80
    grown = window.size
    # every round: the first answer on time, the last ones late (the receiver works through
    # a burst), as when a window leaves at once
    for _ in range(3):
        answers = window.size
        for n in range(answers):
            window.answered(BASE * (1 + n / answers), now + BASE * (n + 1) / answers, limited=True)
        now += 2 * BASE
    assert window.size > grown


def test_a_silent_receiver_sends_the_window_back_to_its_start_and_it_grows_again():
    window = WindowController(10)
    now = fill_rounds(window, 0.0, 3)
    assert window.size == 80
    assert not window.check_stall(now + 0.1, oldest_sent=now)  # within a few round trips: waiting is fine
    assert window.check_stall(now + STALL_MIN + 0.01, oldest_sent=now)
    assert window.size == 10 and window.threshold == 40
    now = fill_rounds(window, now + 2, 2)
    assert window.size == 40  # slow start again, up to the threshold
    fill_rounds(window, now, 2)
    assert 40 < window.size <= 42


def test_the_bounds_are_checked():
    with pytest.raises(ValueError, match="a window starts at 1 to 100000 transactions, not 0"):
        WindowController(0)
    window = WindowController(5, limit=8)
    fill_rounds(window, 0.0, 10)
    assert window.size == 8


steps = st.lists(
    st.one_of(
        st.tuples(st.just("answer"), st.floats(0, 5), st.floats(0, 2), st.booleans()),
        st.tuples(st.just("stall"), st.floats(0, 30), st.floats(0, 30), st.booleans()),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(1, 200), limit_over=st.integers(0, 5000), program=steps)
def test_whatever_the_answers_the_window_stays_within_its_bounds(start, limit_over, program):
    limit = min(MAX_WINDOW, start + limit_over)
    window = WindowController(start, limit=limit)
    now = 0.0
    for kind, a, b, flag in program:
        if kind == "answer":
            now += b
            window.answered(a, now, limited=flag)
        else:
            now += a
            window.check_stall(now, None if flag else now - b)
        assert start <= window.size <= limit
        assert window.srtt is None or window.srtt >= 0


@settings(max_examples=200, deadline=None)
@given(start=st.integers(1, 50), rounds=st.integers(1, 6), slow=st.floats(1.5, 20))
def test_grown_shrinks_when_the_receiver_falls_behind_and_grows_back(start, rounds, slow):
    window = WindowController(start)
    now = fill_rounds(window, 0.0, rounds)
    grown = window.size
    assert grown >= min(start * 2**rounds, MAX_WINDOW) // 1 or grown > start
    now = fill_rounds(window, now, 1, rtt=BASE * slow)  # the round in which it falls behind
    now = fill_rounds(window, now, 1, rtt=BASE * slow)  # judged at the round's end
    assert window.size <= max(start, int(grown * DECREASE) + 1)
    shrunk = window.size
    now = fill_rounds(window, now + 20, 30)  # the receiver keeps up again (a fresh epoch of round trips)
    assert window.size > shrunk or shrunk == MAX_WINDOW
