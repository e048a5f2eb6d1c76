"""SQL-LIKE matching (messaging/like.py): a table of patterns, escapes, errors, and LIKE
against a naive matcher, directly and through a selector."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging.like import LikePatternError, like_pattern
from martinet.messaging.selector import SelectorError, compile_selector


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("%", "", True),
        ("%", "anything at all", True),
        ("tmp$%", "tmp$1", True),
        ("tmp$%", "xtmp$1", False),  # a whole-string match, never a part
        ("%@paris", "orders@paris", True),
        ("%@paris", "orders@paris2", False),
        ("_", "a", True),
        ("_", "", False),
        ("_", "ab", False),
        ("a_c", "abc", True),
        ("a%c", "ac", True),
        ("ab%ba", "aba", False),  # what comes before the first % and after the last never overlap
        ("ab%ba", "abba", True),
        ("a%c", "a\nc", True),  # % spans line breaks
        ("a.b", "a.b", True),  # regular-expression metacharacters stand for themselves
        ("a.b", "axb", False),
        ("a*", "aaa", False),
        ("10.0.0.%", "10.0.0.7", True),
        ("10.0.0.%", "10.0.1.7", False),
        ("100\\%", "100%", True),  # an escaped % is a plain %
        ("100\\%", "1000", False),
        ("a\\_b", "a_b", True),
        ("a\\_b", "axb", False),
        ("a\\\\b", "a\\b", True),  # an escaped escape is the escape character
    ],
)
def test_patterns(pattern, text, expected):
    assert like_pattern(pattern).matches(text) is expected


@pytest.mark.parametrize(
    ("pattern", "escape", "text", "expected"),
    [
        ("a!%", "!", "a%", True),
        ("a!%", "!", "ab", False),
        ("a\\%", "!", "a\\anything", True),  # with another escape, \ is an ordinary character
        ("a\\%", None, "a\\x", True),  # no escape character at all
    ],
)
def test_other_escape_characters(pattern, escape, text, expected):
    assert like_pattern(pattern, escape).matches(text) is expected


@pytest.mark.parametrize("pattern", ["abc\\", "a\\b", "\\"])
def test_a_misplaced_escape_is_an_error(pattern):
    with pytest.raises(LikePatternError, match="escape character '\\\\\\\\' must precede %, _ or itself"):
        like_pattern(pattern)


def test_a_selector_reports_a_bad_like_pattern_at_its_position():
    with pytest.raises(SelectorError, match="must precede %, _ or itself at position 7") as caught:
        compile_selector("v LIKE 'a!b' ESCAPE '!'")
    assert caught.value.position == len("v LIKE ")  # where the pattern literal starts


def naive_like(value: str, pattern: str) -> bool:
    """Reference matcher: recursive, no regular expressions."""
    if not pattern:
        return not value
    head, rest = pattern[0], pattern[1:]
    if head == "%":
        return any(naive_like(value[i:], rest) for i in range(len(value) + 1))
    if not value:
        return False
    return (head == "_" or head == value[0]) and naive_like(value[1:], rest)


alphabet = st.sampled_from("ab%_.*\n")


@settings(max_examples=400, deadline=None)
@given(value=st.text(st.sampled_from("ab.*\n%_"), max_size=8), pattern=st.text(alphabet, max_size=6))
def test_like_agrees_with_a_naive_matcher(value, pattern):
    quoted = pattern.replace("'", "''")
    selector = compile_selector(f"v LIKE '{quoted}'")
    assert selector.matches(lambda name: value) == naive_like(value, pattern)


@settings(max_examples=400, deadline=None)
@given(value=st.text(st.sampled_from("ab.*\n%_"), max_size=8), pattern=st.text(alphabet, max_size=6))
def test_like_pattern_agrees_with_a_naive_matcher(value, pattern):
    assert like_pattern(pattern, None).matches(value) == naive_like(value, pattern)


# A text that almost matches: a backtracking matcher tries every way of spreading the a's
# over the %'s before it gives up (exponential in their number); this one looks for each
# segment once.
HOSTILE = "%a%a%a%a%a%a%a%a%a%a%b"


@pytest.mark.parametrize("length", [200, 1000])
async def test_a_hostile_pattern_is_matched_without_backtracking(length):
    # In a thread, so that a matcher that backtracks fails the bounded wait instead of
    # hanging the run (the thread is abandoned; it would run until the process ends).
    def match():
        pattern = like_pattern(HOSTILE)
        return [pattern.matches("a" * length), pattern.matches("a" * (length - 1) + "b"), pattern.matches("b")]

    with trio.fail_after(20):
        assert await trio.to_thread.run_sync(match, abandon_on_cancel=True) == [False, True, False]


@settings(max_examples=300, deadline=None)
@given(
    value=st.text(st.sampled_from("aab"), max_size=30),
    pattern=st.lists(st.sampled_from(["%", "a", "b", "_", "%a", "a%"]), max_size=12).map("".join),
)
def test_many_wildcards_agree_with_a_naive_matcher(value, pattern):
    # Longer texts and patterns with many %, where a segment can be placed in many ways.
    assert like_pattern(pattern, None).matches(value) == naive_like(value, pattern)


@settings(max_examples=300, deadline=None)
@given(
    value=st.text(st.sampled_from("a!%_b"), max_size=10),
    pattern=st.lists(st.sampled_from(["%", "a", "_", "!%", "!_", "!!", "b"]), max_size=8),
)
def test_escaped_wildcards_agree_with_a_naive_matcher(value, pattern):
    # The reference reads an escaped character as a literal: one token per pattern piece.
    def naive(text: str, tokens: list[str]) -> bool:
        if not tokens:
            return not text
        head, rest = tokens[0], tokens[1:]
        if head == "%":
            return any(naive(text[i:], rest) for i in range(len(text) + 1))
        if not text:
            return False
        literal = head[-1] if head.startswith("!") else head
        return (head == "_" or text[0] == literal) and naive(text[1:], rest)

    assert like_pattern("".join(pattern), "!").matches(value) == naive(value, pattern)
