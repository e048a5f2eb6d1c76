"""The AMQP 1.0 vocabulary shared by every user of the wire: headers, the frame header,
descriptor codes, delivery states, errors, termini, and the JMS mapping's names.

Everything here is defined once: the engine (:mod:`.engine`), SASL (:mod:`.sasl`), the
listener, the client and the tools import it from here. Descriptor codes are the numeric
ones of the spec (part 2, 3, 4 and 5); a peer may send the symbolic form instead
(``amqp:open:list``), which :func:`descriptor_code` maps back.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from ..codec import Array, Described, Symbol, UInt, ULong

__all__ = [
    "AMQP_HEADER",
    "TLS_HEADER",
    "SASL_HEADER",
    "FRAME_HEADER",
    "AMQP_FRAME",
    "SASL_FRAME",
    "MIN_MAX_FRAME_SIZE",
    "MASK",
    "OPEN",
    "BEGIN",
    "ATTACH",
    "FLOW",
    "TRANSFER",
    "DISPOSITION",
    "DETACH",
    "END",
    "CLOSE",
    "ERROR",
    "RECEIVED",
    "ACCEPTED_CODE",
    "REJECTED",
    "RELEASED_CODE",
    "MODIFIED",
    "SOURCE",
    "TARGET",
    "COORDINATOR",
    "DECLARE",
    "DISCHARGE",
    "DECLARED",
    "TRANSACTIONAL_STATE",
    "SASL_MECHANISMS",
    "SASL_INIT",
    "SASL_OUTCOME",
    "SELECTOR_FILTER",
    "SELECTOR_FILTER_CODE",
    "NO_LOCAL_FILTER",
    "NO_LOCAL_FILTER_CODE",
    "JMS_DEST",
    "JMS_REPLY_TO",
    "JMS_MSG_TYPE",
    "JMS_QUEUE",
    "JMS_TOPIC",
    "JMS_TEMPORARY_QUEUE",
    "JMS_TEMPORARY_TOPIC",
    "TOPIC_PREFIX",
    "QUEUE_PREFIX",
    "SOLE_CONNECTION_FOR_CONTAINER",
    "descriptor_code",
    "Scope",
    "ProtocolError",
    "RemoteProtocolError",
    "LocalProtocolError",
    "Error",
    "Terminus",
    "outcome",
    "state_code",
    "ACCEPTED",
    "RELEASED",
    "symbols",
    "symbol_array",
]

# -- protocol headers and frames [2.2, 2.3, 5.1, 5.3.1] ----------------------------------------

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
FRAME_HEADER = struct.Struct(">IBBH")  # size, data offset (in 4-byte words), type, channel
AMQP_FRAME, SASL_FRAME = 0x00, 0x01  # frame types
MIN_MAX_FRAME_SIZE = 512  # [2.7.1]
MASK = 0xFFFFFFFF  # sequence numbers are 32-bit serial numbers [RFC 1982]

# -- descriptor codes ----------------------------------------------------------------------

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)  # [2.7]
ERROR = 0x1D  # [2.8.14]
RECEIVED, ACCEPTED_CODE, REJECTED, RELEASED_CODE, MODIFIED = 0x23, 0x24, 0x25, 0x26, 0x27  # [3.4]
SOURCE, TARGET = 0x28, 0x29  # [3.5.3, 3.5.4]
COORDINATOR, DECLARE, DISCHARGE, DECLARED, TRANSACTIONAL_STATE = 0x30, 0x31, 0x32, 0x33, 0x34  # [4.5]
SASL_MECHANISMS, SASL_INIT, SASL_OUTCOME = 0x40, 0x41, 0x44  # [5.3.3]
_SYMBOLIC = {
    f"amqp:{name}:list": code
    for name, code in (
        ("open", OPEN),
        ("begin", BEGIN),
        ("attach", ATTACH),
        ("flow", FLOW),
        ("transfer", TRANSFER),
        ("disposition", DISPOSITION),
        ("detach", DETACH),
        ("end", END),
        ("close", CLOSE),
        ("error", ERROR),
        ("source", SOURCE),
        ("target", TARGET),
        ("received", RECEIVED),
        ("accepted", ACCEPTED_CODE),
        ("rejected", REJECTED),
        ("released", RELEASED_CODE),
        ("modified", MODIFIED),
        ("coordinator", COORDINATOR),
        ("declare", DECLARE),
        ("discharge", DISCHARGE),
        ("declared", DECLARED),
        ("transactional-state", TRANSACTIONAL_STATE),
        ("sasl-mechanisms", SASL_MECHANISMS),
        ("sasl-init", SASL_INIT),
        ("sasl-outcome", SASL_OUTCOME),
    )
}

# -- the JMS mapping (Qpid JMS's names, which other clients follow) --------------------------

SELECTOR_FILTER = Symbol("apache.org:selector-filter:string")
SELECTOR_FILTER_CODE = 0x0000468C00000004
NO_LOCAL_FILTER = Symbol("apache.org:no-local-filter:list")
NO_LOCAL_FILTER_CODE = 0x0000468C00000003
JMS_DEST = Symbol("x-opt-jms-dest")  # message annotation: the kind of the ``to`` destination
JMS_REPLY_TO = Symbol("x-opt-jms-reply-to")  # and of ``reply-to``
JMS_MSG_TYPE = Symbol("x-opt-jms-msg-type")
JMS_QUEUE, JMS_TOPIC, JMS_TEMPORARY_QUEUE, JMS_TEMPORARY_TOPIC = 0, 1, 2, 3  # values of x-opt-jms-dest
TOPIC_PREFIX, QUEUE_PREFIX = "topic://", "queue://"  # address prefixes naming the kind
# A connection capability Qpid JMS desires in its open when the application set a client id:
# no other connection may use this container id at the same time.
SOLE_CONNECTION_FOR_CONTAINER = "sole-connection-for-container"


def descriptor_code(descriptor: Any) -> Any:
    """The numeric code of a descriptor given in either form; other descriptors unchanged."""
    try:
        return _SYMBOLIC.get(descriptor, descriptor)
    except TypeError:  # an unhashable descriptor (a list or map) names nothing we know
        return None


# -- errors ----------------------------------------------------------------------------------

Scope = Literal["connection", "session", "link"]


class ProtocolError(Exception):
    """A breach of the protocol, with the AMQP error ``condition`` to report and the
    ``scope`` it ends: the whole connection (``close``), one session (``end``) or one link
    (``detach``) [2.8.14–2.8.17]; ``endpoint`` is that session or link (the engine's
    object; None for the connection). Abstract: raised as one of the two below."""

    def __init__(self, condition: str, description: str, scope: Scope = "connection", endpoint: Any = None):
        super().__init__(description)
        self.condition = condition
        self.scope = scope
        self.endpoint = endpoint


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. The engine answers it itself — a ``detach`` (scope
    ``link``), an ``end`` (``session``) or a ``close`` (``connection``) carrying the error —
    and reports it as an event (:class:`~.engine.LinkDetached`, :class:`~.engine.SessionEnded`
    or :class:`~.engine.ConnectionClosed`, each with ``by_peer`` false); it never reaches
    the owner as an exception."""


class LocalProtocolError(ProtocolError):
    """The owner asked for something the protocol does not allow in this state (a bug in
    the caller): raised by the engine's methods, nothing is sent and no state changes."""


def outcome(code: int, *fields: Any) -> Described:
    """A delivery state, e.g. ``outcome(REJECTED, error.described())``."""
    return Described(ULong(code), list(fields))


ACCEPTED, RELEASED = outcome(ACCEPTED_CODE), outcome(RELEASED_CODE)


def state_code(state: Any) -> int | None:
    """The descriptor code of a decoded delivery state (``ACCEPTED_CODE``, …); None for none."""
    if not isinstance(state, Described):
        return None
    descriptor = state.descriptor
    return descriptor if type(descriptor) is int else descriptor_code(descriptor)


@attrs.frozen
class Error:
    """An AMQP error [2.8.14]: a condition symbol, a description, an info map."""

    condition: str
    description: str | None = None
    info: dict[Any, Any] | None = None

    def described(self) -> Described:
        return Described(ULong(ERROR), [Symbol(self.condition), self.description, self.info])

    @classmethod
    def from_value(cls, value: Any) -> Error | None:
        if not isinstance(value, Described) or not isinstance(value.value, list) or not value.value:
            return None
        fields = value.value + [None, None]
        return cls(
            str(fields[0]),
            fields[1] if isinstance(fields[1], str) else None,
            fields[2] if isinstance(fields[2], dict) else None,
        )

    def __str__(self) -> str:
        return f"{self.condition}: {self.description}" if self.description else self.condition


def symbols(value: Any) -> list[str]:
    """A multiple symbol field (one symbol, an array, or null) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, Array):
        return [str(item) for item in value.items]
    if isinstance(value, list):
        return [str(item) for item in value]
    return [str(value)]


def symbol_array(names: Sequence[str]) -> Array | None:
    """``names`` as an array of symbols (None if there are none): sym8 elements, or sym32
    ones when a name is longer than one size byte can say (a peer's capability echoed back
    may be: symbols are ASCII, a byte a character)."""
    if not names:
        return None
    return Array(0xB3 if any(len(name) > 255 for name in names) else 0xA3, tuple(Symbol(name) for name in names))


def _ulong_descriptors(value: Any) -> Any:
    """Decoded values lose their integer widths; descriptors must go back out as ulongs."""
    if isinstance(value, Described):
        descriptor = value.descriptor
        if type(descriptor) is int and 0 <= descriptor < 2**64:
            descriptor = ULong(descriptor)
        return Described(descriptor, _ulong_descriptors(value.value))
    if isinstance(value, dict):
        return {key: _ulong_descriptors(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_ulong_descriptors(item) for item in value]
    return value


@attrs.define
class Terminus:
    """A source, target or coordinator [3.5.3, 3.5.4, 4.5.1]."""

    kind: int = SOURCE
    address: str | None = None
    durable: int = 0  # 0 none, 1 configuration, 2 unsettled-state
    expiry_policy: str = "session-end"
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    distribution_mode: str | None = None  # sources only: "move" or "copy"
    filter: dict[Any, Any] | None = None  # sources only
    default_outcome: Any = None
    outcomes: Any = None
    capabilities: list[str] = attrs.Factory(list)

    @classmethod
    def from_value(cls, value: Any) -> Terminus | None:
        """Decode a terminus field; None for a null terminus.

        Raises:
            RemoteProtocolError: not a terminus.
        """
        if value is None:
            return None
        kind = value.descriptor if isinstance(value, Described) else None
        kind = descriptor_code(kind)
        if kind not in (SOURCE, TARGET, COORDINATOR) or not isinstance(value.value, list):
            raise RemoteProtocolError("amqp:decode-error", f"not a source, target or coordinator: {value!r}"[:200])
        fields = value.value
        if kind == COORDINATOR:
            return cls(kind=COORDINATOR, capabilities=symbols(fields[0] if fields else None))
        fields = fields + [None] * (11 - len(fields))
        for index in (1, 3):  # durable, timeout: uints
            if fields[index] is not None and (type(fields[index]) is not int or not 0 <= fields[index] <= MASK):
                raise RemoteProtocolError("amqp:decode-error", f"terminus field {index} is {fields[index]!r}"[:200])
        address = fields[0]
        terminus = cls(
            kind=kind,
            address=str(address) if address is not None else None,
            durable=fields[1] or 0,
            expiry_policy=str(fields[2] or "session-end"),
            timeout=fields[3] or 0,
            dynamic=bool(fields[4]),
            dynamic_node_properties=fields[5],
        )
        if kind == SOURCE:
            terminus.distribution_mode = str(fields[6]) if fields[6] is not None else None
            terminus.filter = fields[7] if isinstance(fields[7], dict) else None
            terminus.default_outcome, terminus.outcomes = fields[8], fields[9]
            terminus.capabilities = symbols(fields[10])
        else:
            terminus.capabilities = symbols(fields[6])
        # Symbols are ASCII [1.6.21]; these go back out as symbols when the attach is answered.
        if not all(
            name.isascii()
            for name in (terminus.expiry_policy, terminus.distribution_mode or "", *terminus.capabilities)
        ):
            raise RemoteProtocolError("amqp:decode-error", "a terminus symbol field is not ASCII")
        return terminus

    def described(self) -> Described:
        capabilities = symbol_array(self.capabilities)
        if self.kind == COORDINATOR:
            return Described(ULong(COORDINATOR), [capabilities])
        fields = [
            self.address,
            UInt(self.durable),
            Symbol(self.expiry_policy),
            UInt(self.timeout),
            self.dynamic,
            _ulong_descriptors(self.dynamic_node_properties),
        ]
        if self.kind == SOURCE:
            fields += [
                Symbol(self.distribution_mode) if self.distribution_mode else None,
                _ulong_descriptors(self.filter),
                _ulong_descriptors(self.default_outcome),
                _ulong_descriptors(self.outcomes),
            ]
        fields.append(capabilities)
        return Described(ULong(self.kind), fields)

    def copy(self) -> Terminus:
        return attrs.evolve(self, capabilities=list(self.capabilities))
