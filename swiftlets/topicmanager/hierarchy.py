"""Topic names and the hierarchy rules, as pure functions (no queues, no I/O).

Theory of operation
-------------------
A topic name is ``root.sub.subsub``: levels separated by ``.``. Any level but the root may
be a SQL-LIKE predicate (``%`` any run, ``_`` one character, ``\\`` escapes the next
character); the root must be a plain name, because it decides which topic broker (and,
across routers, which interest announcement) a message belongs to.

The hierarchy rules (SwiftMQ's): publishing to a node reaches that
node and everything below it; subscribing to a node receives what is published to it, to
its parents and to its sub-nodes. Both follow from one comparison: a subscription and a
publication *match* when their levels agree pairwise over their common prefix (the
shorter one's length). Two levels agree when they are equal, or when one is a predicate
that matches the other as text; two predicates agree only when one matches the other's
text (so ``a.%`` and ``a.b%`` agree, ``a.x%`` and ``a.y%`` do not).

Clients written for other brokers use the AMQP/ActiveMQ-style wildcards instead: a level
``*`` for any one level, a last level ``#`` for zero or more levels. :func:`from_wildcards`
translates such a name into this syntax (a listener does it for its clients when told to):
``*`` becomes the predicate ``%``; a last ``#`` is dropped, since a node already reaches
everything below it. A ``#`` anywhere else would need a level that matches several levels,
which the hierarchy does not have: it is refused.
"""

from __future__ import annotations

import functools
import re

import attrs

from martinet.messaging.like import LikePattern, LikePatternError, like_pattern

__all__ = ["TopicName", "TopicNameError", "parse_topic", "matches", "from_wildcards"]

_WILDCARDS = re.compile(r"(?<!\\)[%_]")


class TopicNameError(ValueError):
    """An invalid topic name; the message says what is wrong."""


@attrs.frozen
class Level:
    text: str
    pattern: LikePattern | None  # None: a plain name

    def agrees(self, other: Level) -> bool:
        if self.pattern is None and other.pattern is None:
            return self.text == other.text
        if self.pattern is not None and self.pattern.matches(other.text):
            return True
        return other.pattern is not None and other.pattern.matches(self.text)


@attrs.frozen
class TopicName:
    """A parsed topic name: ``text`` as given, ``root`` and its ``levels``."""

    text: str
    levels: tuple[Level, ...]

    @property
    def root(self) -> str:
        return self.levels[0].text

    @property
    def has_predicate(self) -> bool:
        return any(level.pattern is not None for level in self.levels)


@functools.lru_cache(maxsize=4096)
def parse_topic(text: str) -> TopicName:
    """Parse and check a topic name (cached).

    Raises:
        TopicNameError: empty, an empty level, or a predicate root.
    """
    if not text:
        raise TopicNameError("a topic name cannot be empty")
    parts = text.split(".")
    if any(not part for part in parts):
        raise TopicNameError(f"topic {text!r} has an empty level")
    if _WILDCARDS.search(parts[0]) or "\\" in parts[0]:
        raise TopicNameError(
            f"topic {text!r}: the root level {parts[0]!r} may not be a predicate (it names the topic broker)"
        )
    levels = []
    for part in parts:
        if _WILDCARDS.search(part) or "\\" in part:
            try:
                levels.append(Level(part, like_pattern(part)))
            except LikePatternError:
                raise TopicNameError(f"topic {text!r}: level {part!r} ends with a lone escape '\\'") from None
        else:
            levels.append(Level(part, None))
    return TopicName(text, tuple(levels))


def matches(subscription: TopicName, publication: TopicName) -> bool:
    """Whether a subscription to ``subscription`` receives a publication to ``publication``."""
    return all(s.agrees(p) for s, p in zip(subscription.levels, publication.levels, strict=False))


def from_wildcards(text: str) -> str:
    """The native name of a topic name written with ``*`` and ``#`` wildcards (whole levels
    only; ``a*`` is a plain level). Other characters keep their meaning, so ``%`` and ``_``
    are still predicates. The result is not checked: :func:`parse_topic` does that.

    Raises:
        TopicNameError: a wildcard root, or ``#`` before the last level.
    """
    levels = text.split(".")
    if levels[0] in ("*", "#"):
        raise TopicNameError(f"topic {text!r}: the root level may not be a wildcard (it names the topic broker)")
    if "#" in levels[:-1]:
        raise TopicNameError(f"topic {text!r}: '#' is supported as the last level only")
    return ".".join("%" if level == "*" else level for level in (levels[:-1] if levels[-1] == "#" else levels))
