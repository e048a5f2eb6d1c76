"""JMS 1.1 message selectors (JMS 1.1 §3.8.1): parse once, evaluate per message.

Theory of operation
-------------------
:func:`compile_selector` tokenizes the text, parses it by recursive descent into an
immutable AST (frozen attrs nodes), checks it, and compiles the AST into nested closures;
compiled selectors are cached by text. Evaluation uses SQL's three-valued logic: every
boolean node returns ``True``, ``False`` or ``None`` (UNKNOWN), and a message is selected
only when the whole selector is ``True``.

Grammar (keywords case-insensitive, identifiers case-sensitive)::

    selector := [or]                        -- empty: selects everything
    or       := and {OR and}
    and      := not {AND not}
    not      := NOT not | pred              -- NOT binds looser than comparisons
    pred     := sum [cmp sum | [NOT] BETWEEN sum AND sum
                     | [NOT] IN '(' string {',' string} ')'
                     | [NOT] LIKE string [ESCAPE string] | IS [NOT] NULL]
    sum      := prod {(+|-) prod}
    prod     := unary {(*|/) unary}
    unary    := (+|-) unary | primary
    primary  := literal | identifier | '(' or ')'

Choices where implementations differ (each pinned by a test):

- ``NOT a = 1`` means ``NOT (a = 1)`` (SQL and Qpid Broker-J; ActiveMQ/Artemis differ).
- Division of two exact numbers is Java ``long`` division, truncating toward zero
  (``123 / 2 = 61``); division of exact numbers by zero is UNKNOWN. ActiveMQ and Artemis
  divide as doubles instead.
- No type conversion: a number never equals a string, ``'2' > 1`` is false; comparing
  values of different types is false, comparing with NULL is UNKNOWN; strings and
  booleans compare only with ``=`` and ``<>`` (other comparisons are false); exact and
  approximate numbers compare numerically.
- Arithmetic on anything but numbers, and AND/OR/NOT on anything but booleans, is
  UNKNOWN at runtime; with a literal operand it is refused when parsing.
- ``IN``, ``LIKE`` and ``IS NULL`` apply to identifiers only; an ESCAPE is one character
  and may precede only ``%``, ``_`` or itself (the pattern language is :mod:`.like`'s,
  shared with the router's names).
- Exact literals may be decimal, hexadecimal (``0x1F``) or octal (``017``), as the Java
  brokers accept; approximate literals use Java syntax (``7.``, ``.5``, ``1.5E3``).

Identifiers name application properties, except the JMS headers, which map to AMQP
fields as Qpid JMS maps them (:func:`message_identifiers`).
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from .like import LikePatternError, like_pattern

__all__ = ["SelectorError", "Selector", "compile_selector", "message_identifiers"]


class SelectorError(ValueError):
    """A selector that cannot be parsed; ``position`` is the 0-based offset of the problem."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} at position {position}")
        self.position = position


# -- tokens -------------------------------------------------------------------------------

KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<approx>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[dDfF]?|\d+[eE][+-]?\d+[dDfF]?)
  | (?P<exact>0[xX][0-9a-fA-F]+|\d+)(?P<suffix>[lL]?)
  | (?P<ident>[^\W\d][\w$]*|\$[\w$]*)
  | (?P<op><>|<=|>=|[=<>+\-*/(),])
    """,
    re.VERBOSE,
)


@attrs.frozen
class Token:
    kind: str  # string, exact, approx, ident, keyword, op, end
    value: Any
    position: int


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens.

    Raises:
        SelectorError: a character that starts no token, or an unterminated string.
    """
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position] == "'":
                raise SelectorError("unterminated string literal", position)
            raise SelectorError(f"unexpected character {text[position]!r}", position)
        assert match.lastgroup is not None  # each alternative of _TOKEN is a named group
        kind = match.lastgroup if match.lastgroup != "suffix" else "exact"
        raw = match.group(kind)
        if kind == "string":
            tokens.append(Token("string", raw[1:-1].replace("''", "'"), position))
        elif kind == "approx":
            tokens.append(Token("approx", float(raw.rstrip("dDfF")), position))
        elif kind == "exact":
            if raw[:2] in ("0x", "0X"):
                value = int(raw, 16)
            elif len(raw) > 1 and raw[0] == "0":
                if not set(raw) <= set("01234567"):
                    raise SelectorError(f"invalid octal literal {raw!r}", position)
                value = int(raw, 8)
            else:
                value = int(raw)
            tokens.append(Token("exact", value, position))
        elif kind == "ident":
            upper = raw.upper()
            tokens.append(Token("keyword", upper, position) if upper in KEYWORDS else Token("ident", raw, position))
        elif kind == "op":
            tokens.append(Token("op", raw, position))
        position = match.end()
    tokens.append(Token("end", None, len(text)))
    return tokens


# -- AST ----------------------------------------------------------------------------------


@attrs.frozen
class Literal:
    value: Any  # bool, int, float or str


@attrs.frozen
class Identifier:
    name: str


@attrs.frozen
class Negate:
    operand: Any


@attrs.frozen
class Arithmetic:
    op: str
    left: Any
    right: Any


@attrs.frozen
class Comparison:
    op: str
    left: Any
    right: Any


@attrs.frozen
class Between:
    operand: Any
    low: Any
    high: Any
    negated: bool


@attrs.frozen
class InList:
    operand: Identifier
    values: frozenset[str]
    negated: bool


@attrs.frozen
class Like:
    operand: Identifier
    pattern: str
    escape: str | None
    negated: bool


@attrs.frozen
class IsNull:
    operand: Identifier
    negated: bool


@attrs.frozen
class And:
    left: Any
    right: Any


@attrs.frozen
class Or:
    left: Any
    right: Any


@attrs.frozen
class Not:
    operand: Any


_BOOLEAN_NODES = (Comparison, Between, InList, Like, IsNull, And, Or, Not)


# -- parser -------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.index = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def at(self, kind: str, value: Any = None) -> bool:
        token = self.token
        return token.kind == kind and (value is None or token.value == value)

    def accept(self, kind: str, value: Any = None) -> Token | None:
        return self.take() if self.at(kind, value) else None

    def expect(self, kind: str, value: Any, what: str) -> Token:
        if not self.at(kind, value):
            self.fail(f"expected {what}")
        return self.take()

    def fail(self, message: str, token: Token | None = None) -> None:
        token = token or self.token
        found = "the end" if token.kind == "end" else repr(str(token.value))
        raise SelectorError(f"{message}, found {found}", token.position)

    def parse(self) -> Any:
        if self.at("end"):
            return None
        start = self.token
        node = self.or_()
        if not self.at("end"):
            self.fail("expected an operator or the end")
        _require_boolean(node, start)
        return node

    def or_(self) -> Any:
        node = self.and_()
        while (token := self.accept("keyword", "OR")) is not None:
            right_start = self.token
            right = self.and_()
            _require_boolean(node, token)
            _require_boolean(right, right_start)
            node = Or(node, right)
        return node

    def and_(self) -> Any:
        node = self.not_()
        while (token := self.accept("keyword", "AND")) is not None:
            right_start = self.token
            right = self.not_()
            _require_boolean(node, token)
            _require_boolean(right, right_start)
            node = And(node, right)
        return node

    def not_(self) -> Any:
        if self.accept("keyword", "NOT"):
            start = self.token
            operand = self.not_()
            _require_boolean(operand, start)
            return Not(operand)
        return self.predicate()

    def predicate(self) -> Any:
        start = self.token
        left = self.sum()
        token = self.token
        if token.kind == "op" and token.value in ("=", "<>", "<", "<=", ">", ">="):
            self.take()
            right_start = self.token
            right = self.sum()
            _check_ordering(token.value, left, right, right_start)
            return Comparison(token.value, left, right)
        negated = bool(self.accept("keyword", "NOT"))
        if self.accept("keyword", "BETWEEN"):
            low = self.sum()
            self.expect("keyword", "AND", "AND in BETWEEN")
            high = self.sum()
            return Between(left, low, high, negated)
        if self.accept("keyword", "IN"):
            operand = _identifier(left, start, "IN")
            self.expect("op", "(", "'(' after IN")
            values = [self.expect("string", None, "a string literal in the IN list").value]
            while self.accept("op", ","):
                values.append(self.expect("string", None, "a string literal in the IN list").value)
            self.expect("op", ")", "')' closing the IN list")
            return InList(operand, frozenset(values), negated)
        if self.accept("keyword", "LIKE"):
            operand = _identifier(left, start, "LIKE")
            pattern = self.expect("string", None, "a string literal pattern after LIKE")
            escape = None
            if self.accept("keyword", "ESCAPE"):
                escape_token = self.expect("string", None, "a string literal after ESCAPE")
                escape = escape_token.value
                if len(escape) != 1:
                    raise SelectorError("ESCAPE must be exactly one character", escape_token.position)
            try:
                like_pattern(pattern.value, escape)  # validate now
            except LikePatternError as exc:
                raise SelectorError(str(exc), pattern.position) from None
            return Like(operand, pattern.value, escape, negated)
        if negated:
            self.fail("expected BETWEEN, IN or LIKE after NOT")
        if self.accept("keyword", "IS"):
            is_negated = bool(self.accept("keyword", "NOT"))
            self.expect("keyword", "NULL", "NULL after IS")
            return IsNull(_identifier(left, start, "IS NULL"), is_negated)
        return left

    def sum(self) -> Any:
        node = self.product()
        while self.at("op", "+") or self.at("op", "-"):
            token = self.take()
            right = self.product()
            _require_numeric(node, token)
            _require_numeric(right, token)
            node = Arithmetic(token.value, node, right)
        return node

    def product(self) -> Any:
        node = self.unary()
        while self.at("op", "*") or self.at("op", "/"):
            token = self.take()
            right = self.unary()
            _require_numeric(node, token)
            _require_numeric(right, token)
            node = Arithmetic(token.value, node, right)
        return node

    def unary(self) -> Any:
        if self.at("op", "-") or self.at("op", "+"):
            token = self.take()
            operand = self.unary()
            _require_numeric(operand, token)
            if token.value == "+":
                return operand
            if isinstance(operand, Literal):
                return Literal(-operand.value)
            return Negate(operand)
        return self.primary()

    def primary(self) -> Any:
        token = self.token
        if token.kind in ("string", "exact", "approx"):
            self.take()
            return Literal(token.value)
        if token.kind == "keyword" and token.value in ("TRUE", "FALSE"):
            self.take()
            return Literal(token.value == "TRUE")
        if token.kind == "ident":
            self.take()
            return Identifier(token.value)
        if self.accept("op", "("):
            node = self.or_()
            self.expect("op", ")", "')'")
            return node
        if token.kind == "keyword":
            self.fail(f"keyword {token.value} cannot start an expression; it is not an identifier")
        self.fail("expected a literal, an identifier or '('")


def _require_boolean(node: Any, token: Token) -> None:
    if isinstance(node, Literal) and not isinstance(node.value, bool):
        raise SelectorError("expected a boolean expression, not a literal", token.position)
    if isinstance(node, (Arithmetic, Negate)):
        raise SelectorError("expected a boolean expression, not arithmetic", token.position)


def _require_numeric(node: Any, token: Token) -> None:
    if isinstance(node, Literal) and (isinstance(node.value, (bool, str))):
        raise SelectorError(f"'{token.value}' needs numbers, not {node.value!r}", token.position)
    if isinstance(node, _BOOLEAN_NODES):
        raise SelectorError(f"'{token.value}' needs numbers, not a condition", token.position)


def _check_ordering(op: str, left: Any, right: Any, token: Token) -> None:
    for side in (left, right):
        if op not in ("=", "<>") and isinstance(side, Literal) and isinstance(side.value, (bool, str)):
            raise SelectorError(f"'{op}' does not apply to strings or booleans", token.position)


def _identifier(node: Any, token: Token, what: str) -> Identifier:
    if not isinstance(node, Identifier):
        raise SelectorError(f"{what} applies to an identifier only", token.position)
    return node


# -- evaluation ---------------------------------------------------------------------------

Lookup = Callable[[str], Any]
Evaluator = Callable[[Lookup], Any]


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    kind = _kind(left)
    if kind is None or kind != _kind(right):
        return False
    if op == "=":
        return bool(left == right)
    if op == "<>":
        return bool(left != right)
    if kind != "number":
        return False
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _arithmetic(op: str, left: Any, right: Any) -> int | float | None:
    a, b = _number(left), _number(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return None
        quotient = abs(a) // abs(b)  # Java long division truncates toward zero
        return quotient if (a >= 0) == (b >= 0) else -quotient
    if b == 0:
        return float("nan") if a == 0 else float("inf") if a > 0 else float("-inf")
    return a / b


def _compile(node: Any) -> Evaluator:
    if isinstance(node, Literal):
        value = node.value
        return lambda get: value
    if isinstance(node, Identifier):
        name = node.name
        return lambda get: get(name)
    if isinstance(node, Negate):
        operand = _compile(node.operand)

        def negate(get: Lookup) -> Any:
            value = _number(operand(get))
            return None if value is None else -value

        return negate
    if isinstance(node, Arithmetic):
        op, left, right = node.op, _compile(node.left), _compile(node.right)
        return lambda get: _arithmetic(op, left(get), right(get))
    if isinstance(node, Comparison):
        op, left, right = node.op, _compile(node.left), _compile(node.right)
        return lambda get: _compare(op, left(get), right(get))
    if isinstance(node, Between):
        operand, low, high = _compile(node.operand), _compile(node.low), _compile(node.high)
        negated = node.negated

        def between(get: Lookup) -> bool | None:
            value = operand(get)
            result = _and(_compare(">=", value, low(get)), _compare("<=", value, high(get)))
            return _not(result) if negated else result

        return between
    if isinstance(node, InList):
        name, values, negated = node.operand.name, node.values, node.negated

        def in_list(get: Lookup) -> bool | None:
            value = get(name)
            if value is None:
                return None
            if not isinstance(value, str):
                return False
            return (value in values) != negated

        return in_list
    if isinstance(node, Like):
        name, pattern, negated = node.operand.name, like_pattern(node.pattern, node.escape), node.negated

        def like(get: Lookup) -> bool | None:
            value = get(name)
            if value is None:
                return None
            if not isinstance(value, str):
                return False
            return pattern.matches(value) != negated

        return like
    if isinstance(node, IsNull):
        name, negated = node.operand.name, node.negated
        return lambda get: (get(name) is None) != negated
    if isinstance(node, And):
        left, right = _compile(node.left), _compile(node.right)
        return lambda get: _and(_truth(left(get)), _truth(right(get)))
    if isinstance(node, Or):
        left, right = _compile(node.left), _compile(node.right)

        def either(get: Lookup) -> bool | None:
            first = _truth(left(get))
            if first is True:
                return True
            second = _truth(right(get))
            if second is True:
                return True
            return None if first is None or second is None else False

        return either
    if isinstance(node, Not):
        operand = _compile(node.operand)
        return lambda get: _not(_truth(operand(get)))
    raise TypeError(f"unknown selector node {node!r}")  # a parser bug


def _truth(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _and(left: bool | None, right: bool | None) -> bool | None:
    if left is False or right is False:
        return False
    if left is None or right is None:
        return None
    return True


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


@attrs.frozen
class Selector:
    """A compiled selector. ``text`` is the source; ``tree`` the AST (``None`` if empty)."""

    text: str
    tree: Any
    _evaluate: Evaluator | None = attrs.field(repr=False, eq=False)

    def evaluate(self, get: Lookup) -> bool | None:
        """True, False or None (UNKNOWN) for the values ``get(identifier)`` returns."""
        if self._evaluate is None:
            return True
        return _truth(self._evaluate(get))

    def matches(self, get: Lookup) -> bool:
        """Whether a message with these values is selected (the result is TRUE)."""
        return self._evaluate is None or self._evaluate(get) is True


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Parse, check and compile ``text``; an empty or blank text selects everything.

    Raises:
        SelectorError: with the position of the first problem; also a selector nested
            too deeply for the recursive parser (a peer's attach may carry any text).
    """
    try:
        tree = _Parser(text).parse()
        return Selector(text, tree, None if tree is None else _compile(tree))
    except RecursionError:
        raise SelectorError("the selector is nested too deeply", 0) from None


# -- identifiers of a message ---------------------------------------------------------------

_DELIVERY_MODES = {True: "PERSISTENT", False: "NON_PERSISTENT"}


def _jms_id(value: Any) -> str | None:
    """An AMQP message-id or correlation-id as Qpid JMS shows it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return f"ID:AMQP_ULONG:{value}"
    if isinstance(value, uuid.UUID):
        return f"ID:AMQP_UUID:{value}"
    if isinstance(value, bytes):
        return f"ID:AMQP_BINARY:{value.hex().upper()}"
    return None


def _plain(value: Any) -> Any:
    """An application-property value as a selector sees it (non-JMS types are NULL)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # Timestamp and fixed-width ints are plain exact numbers
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)  # Symbol and Char are strings
    return None


def message_identifiers(message: Any, delivery_count: int = 0) -> Lookup:
    """The identifier lookup of a :class:`messaging.message.Message` for selectors.

    JMS headers map to AMQP fields as Qpid JMS maps them: JMSDeliveryMode ← durable,
    JMSPriority ← priority, JMSMessageID ← message-id, JMSTimestamp ← creation-time,
    JMSCorrelationID ← correlation-id, JMSType ← subject, JMSXUserID ← user-id,
    JMSXGroupID ← group-id, JMSXGroupSeq ← group-sequence, JMSXDeliveryCount ← the
    header's delivery-count + 1, where ``delivery_count`` (the failed deliveries since the
    message arrived) is added to the count the producer sent [3.2.1], as the consumer will
    see it. Any other name is an application property.
    """

    def get(name: str) -> Any:
        # An unreadable section raises MessageError out of the selector's evaluation: the
        # dispatch that asked (a queue's, a topic's) counts the message as not selected and
        # logs that once per selector.
        if name[:3] == "JMS":
            if name == "JMSDeliveryMode":
                return _DELIVERY_MODES[message.header.durable]
            if name == "JMSPriority":
                return message.header.priority
            if name == "JMSMessageID":
                return _jms_id(message.properties.message_id)
            if name == "JMSTimestamp":
                value = message.properties.creation_time
                return None if value is None else int(value)
            if name == "JMSCorrelationID":
                return _jms_id(message.properties.correlation_id)
            if name == "JMSType":
                return message.properties.subject
            if name == "JMSXUserID":
                user = message.properties.user_id
                return user.decode("utf-8", "replace") if isinstance(user, bytes) else None
            if name == "JMSXGroupID":
                return message.properties.group_id
            if name == "JMSXGroupSeq":
                return message.properties.group_sequence
            if name == "JMSXDeliveryCount":
                sent = message.header.delivery_count
                return (sent if type(sent) is int else 0) + delivery_count + 1
        return _plain(message.application_properties.get(name))

    return get
