"""JMS selectors: the conformance table, error positions, any text parses or fails cleanly.

(LIKE against a naive matcher: tests/messaging/test_like.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from martinet.messaging.message import build
from martinet.messaging.selector import SelectorError, compile_selector, message_identifiers

from tests.harness.selector_vectors import CASES, CUSTOM_CASES, INVALID, STANDARD_MESSAGE


def evaluate(selector: str, fields: dict) -> object:
    try:
        compiled = compile_selector(selector)
    except SelectorError:
        return INVALID
    message = build(b"body", **fields)
    return compiled.evaluate(message_identifiers(message, delivery_count=0))


def test_the_table_is_large_enough():
    distinct = {case[0] for case in CASES} | {(case[0], repr(case[1])) for case in CUSTOM_CASES}
    assert len(distinct) >= 300


@pytest.mark.parametrize(("selector", "expected"), CASES, ids=[f"{i}:{c[0][:50]}" for i, c in enumerate(CASES)])
def test_standard_message(selector, expected):
    assert evaluate(selector, STANDARD_MESSAGE) == expected


@pytest.mark.parametrize(
    ("selector", "fields", "expected"), CUSTOM_CASES, ids=[f"{i}:{c[0][:50]}" for i, c in enumerate(CUSTOM_CASES)]
)
def test_custom_message(selector, fields, expected):
    assert evaluate(selector, {**STANDARD_MESSAGE, **fields}) == expected


@pytest.mark.parametrize(
    ("selector", "message", "position"),
    [
        ("name = 'x' AMD rank = 1", "expected an operator or the end, found 'AMD'", 11),
        ("rank = ", "expected a literal, an identifier or '(', found the end", 7),
        ("name = 'abc", "unterminated string literal", 7),
        ("rank ! 1", "unexpected character '!'", 5),
        ("NULL = 1", "keyword NULL cannot start an expression", 0),
        ("3+5", "expected a boolean expression, not arithmetic", 0),
        ("name LIKE 'a' ESCAPE 'xy'", "ESCAPE must be exactly one character", 21),
    ],
)
def test_errors_say_what_and_where(selector, message, position):
    with pytest.raises(SelectorError) as caught:
        compile_selector(selector)
    assert message in str(caught.value)
    assert caught.value.position == position
    assert str(caught.value).endswith(f"at position {position}")


def test_compiled_selectors_are_cached_and_immutable():
    assert compile_selector("rank > 1") is compile_selector("rank > 1")
    with pytest.raises(AttributeError):
        compile_selector("rank > 1").text = "x"  # type: ignore[misc]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_text_parses_or_fails_cleanly(text):
    try:
        compile_selector(text)
    except SelectorError as exc:
        assert 0 <= exc.position <= len(text)
