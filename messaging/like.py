"""SQL-LIKE matching: ``%`` any run of characters, ``_`` exactly one, an escape before either.

Theory of operation
-------------------
One pattern language serves the whole router: JMS selectors' ``LIKE`` (JMS 1.1 §3.8.1.1),
queue-controller predicates, routing redirections (``%@paris``), predicate topics
(``iit.s%``), authentication grants and host access lists. :func:`like_pattern` compiles a
pattern once into a :class:`LikePattern`, whose :meth:`~LikePattern.matches` tests a whole
string (LIKE never matches a part of a string).

- ``%`` matches any run of characters, the empty run and line breaks included;
- ``_`` matches exactly one character;
- the escape character (``\\`` for names, the ``ESCAPE`` clause's character in a
  selector, or none) may precede only ``%``, ``_`` or itself, which then stand for
  themselves; anywhere else — including at the very end — it makes the pattern invalid,
  as in SQL;
- every other character stands for itself (regular-expression metacharacters included).

Patterns come from clients (a selector is any consumer's to choose) and the text from any
producer, and the match runs on the router's one event-loop thread, so it must never
backtrack: a regular expression ``.*a.*a.*b`` takes time exponential in the number of
``%`` on a text that almost matches (a selector of eleven ``%a`` froze a router for 23 s on
a 40-character value). Here the ``%`` split the pattern into segments of fixed length
(characters and ``_``). The first segment must match at the start, the last at the end, and
each one between is taken at its leftmost place after the previous one: taking the
leftmost place never loses a match, since every later place leaves less text for the
segments that follow. Each segment is looked for once, left to right, so a match costs at
most O(len(text) × len(pattern)) and never more.

Pure functions and immutable patterns; :func:`like_pattern` keeps the recently compiled
ones (a grant or a host list is matched against each login with the same patterns).
"""

from __future__ import annotations

import functools
import re

__all__ = ["LikePattern", "LikePatternError", "like_escape", "like_pattern"]


class LikePatternError(ValueError):
    """A malformed LIKE pattern: an escape character not followed by ``%``, ``_`` or itself."""


class _Segment:
    """A run of pattern characters between two ``%``: literal characters and ``_``; it
    always spans ``length`` characters of the text."""

    __slots__ = ("length", "literal", "regex")

    def __init__(self, tokens: list[str | None]):  # None: ``_``
        self.length = len(tokens)
        # A segment without ``_`` is found by str's own search; one with ``_`` by a regular
        # expression of fixed width (no repetition in it, so no backtracking either).
        self.literal: str | None = None if None in tokens else "".join(t for t in tokens if t is not None)
        self.regex = (
            None
            if self.literal is not None
            else re.compile("".join("." if t is None else re.escape(t) for t in tokens), re.DOTALL)
        )

    def at(self, text: str, position: int) -> bool:
        """Whether the segment matches ``text`` at ``position``."""
        if self.literal is not None:
            return text.startswith(self.literal, position)
        assert self.regex is not None
        return self.regex.match(text, position) is not None

    def find(self, text: str, start: int, end: int) -> int:
        """The leftmost position from ``start`` where the segment matches and ends by
        ``end``; -1 if there is none."""
        if self.literal is not None:
            return text.find(self.literal, start, end)
        assert self.regex is not None
        found = self.regex.search(text, start, end)
        return -1 if found is None else found.start()


class LikePattern:
    """A compiled SQL-LIKE pattern; :meth:`matches` tests a whole string."""

    __slots__ = ("_segments", "escape", "source")

    def __init__(self, source: str, escape: str | None, segments: list[_Segment]):
        self.source, self.escape, self._segments = source, escape, segments

    def matches(self, text: str) -> bool:
        """Whether the whole of ``text`` matches; in O(len(text) × len(pattern)) at most."""
        segments = self._segments
        head = segments[0]
        if len(segments) == 1:  # no %
            return len(text) == head.length and head.at(text, 0)
        tail = segments[-1]
        end = len(text) - tail.length
        if end < head.length or not head.at(text, 0) or not tail.at(text, end):
            return False
        position = head.length
        for segment in segments[1:-1]:
            found = segment.find(text, position, end)
            if found < 0:
                return False
            position = found + segment.length
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LikePattern) and (self.source, self.escape) == (other.source, other.escape)

    def __hash__(self) -> int:
        return hash((self.source, self.escape))

    def __repr__(self) -> str:
        return f"LikePattern({self.source!r}, escape={self.escape!r})"


@functools.lru_cache(maxsize=1024)
def like_pattern(pattern: str, escape: str | None = "\\") -> LikePattern:
    """A compiled SQL-LIKE pattern (``%`` any run, ``_`` one character, ``escape`` before
    either or itself); ``escape=None`` means no escape character.

    Raises:
        LikePatternError: a misplaced escape character.
    """
    segments: list[_Segment] = []
    tokens: list[str | None] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if escape is not None and char == escape:
            if index + 1 >= len(pattern) or pattern[index + 1] not in ("%", "_", escape):
                raise LikePatternError(f"escape character {escape!r} must precede %, _ or itself")
            tokens.append(pattern[index + 1])
            index += 2
            continue
        if char == "%":
            segments.append(_Segment(tokens))
            tokens = []
        else:
            tokens.append(None if char == "_" else char)
        index += 1
    segments.append(_Segment(tokens))
    # Empty segments between two % (``a%%b``) ask nothing; the first and last stay, as the
    # anchors at the start and the end.
    inner = [segment for segment in segments[1:-1] if segment.length]
    return LikePattern(pattern, escape, [segments[0], *inner, segments[-1]] if len(segments) > 1 else segments)


def like_escape(text: str, escape: str = "\\") -> str:
    """``text`` as a LIKE pattern that matches exactly ``text``: ``%``, ``_`` and ``escape``
    each preceded by ``escape`` (router names may hold ``_``, which alone matches any one
    character: ``%@a_b`` would capture ``q@axb`` too)."""
    return "".join(escape + char if char in ("%", "_", escape) else char for char in text)
