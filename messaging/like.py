"""SQL-LIKE matching: ``%`` any run of characters, ``_`` exactly one, an escape before either.

Theory of operation
-------------------
One pattern language serves the whole router: JMS selectors' ``LIKE`` (JMS 1.1 §3.8.1.1),
queue-controller predicates, routing redirections (``%@paris``), predicate topics
(``iit.s%``), authentication grants and host access lists. :func:`like_pattern` turns a
pattern into a compiled regular expression once; callers match a whole string with
``fullmatch`` (LIKE never matches a part of a string).

- ``%`` matches any run of characters, the empty run and line breaks included;
- ``_`` matches exactly one character;
- the escape character (``\\`` for names, the ``ESCAPE`` clause's character in a
  selector, or none) may precede only ``%``, ``_`` or itself, which then stand for
  themselves; anywhere else — including at the very end — it makes the pattern invalid,
  as in SQL;
- every other character stands for itself (regular-expression metacharacters included).

Pure functions, no state beyond :mod:`re`'s own compile cache.
"""

from __future__ import annotations

import re

__all__ = ["LikePatternError", "like_escape", "like_pattern"]


class LikePatternError(ValueError):
    """A malformed LIKE pattern: an escape character not followed by ``%``, ``_`` or itself."""


def like_pattern(pattern: str, escape: str | None = "\\") -> re.Pattern[str]:
    """A compiled SQL-LIKE pattern (``%`` any run, ``_`` one character, ``escape`` before
    either or itself), for names such as queue-controller predicates; match with
    ``fullmatch``. ``escape=None`` means no escape character.

    Raises:
        LikePatternError: a misplaced escape character.
    """
    parts, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if escape is not None and char == escape:
            if index + 1 >= len(pattern) or pattern[index + 1] not in ("%", "_", escape):
                raise LikePatternError(f"escape character {escape!r} must precede %, _ or itself")
            parts.append(re.escape(pattern[index + 1]))
            index += 2
            continue
        parts.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
        index += 1
    return re.compile("".join(parts), re.DOTALL)


def like_escape(text: str, escape: str = "\\") -> str:
    """``text`` as a LIKE pattern that matches exactly ``text``: ``%``, ``_`` and ``escape``
    each preceded by ``escape`` (router names may hold ``_``, which alone matches any one
    character: ``%@a_b`` would capture ``q@axb`` too)."""
    return "".join(escape + char if char in ("%", "_", escape) else char for char in text)
