"""The client's errors, and how an AMQP error condition maps onto them."""

from __future__ import annotations

import enum
from typing import Any

from .. import amqp
from ..amqp import (
    REJECTED,
)


class AckMode(enum.Enum):
    AUTO_ACKNOWLEDGE = "auto"
    CLIENT_ACKNOWLEDGE = "client"
    DUPS_OK_ACKNOWLEDGE = "dups-ok"


class JMSError(Exception):
    """The router refused something; ``condition`` is the AMQP error condition."""

    def __init__(self, description: str, condition: str = ""):
        super().__init__(f"{condition}: {description}" if condition else description)
        self.condition = condition
        self.description = description


class SecurityError(JMSError):
    """Login or access refused (``amqp:unauthorized-access``)."""


class InvalidDestination(JMSError):
    """No such queue, topic or durable subscription (``amqp:not-found``)."""


class InvalidClientId(JMSError):
    """The client id is in use by another connection."""


class InvalidSelector(JMSError):
    """The router could not parse the selector."""


class TransactionRolledBack(JMSError):
    """A commit failed; the transaction was rolled back."""


class ConnectionLost(JMSError):
    """The connection is closed or was lost; nothing more can be done on it."""


def error_from_condition(name: str | None, description: str | None, info: Any = None) -> JMSError:
    name, description = name or "", description or "refused"
    if name == "amqp:unauthorized-access":
        return SecurityError(description, name)
    if name == "amqp:not-found":
        return InvalidDestination(description, name)
    if name == "amqp:invalid-field" and info and "container-id" in str(info):
        return InvalidClientId(description, name)
    if name == "amqp:invalid-field" and "selector" in description:
        return InvalidSelector(description, name)
    if name == "amqp:transaction:rollback":
        return TransactionRolledBack(description, name)
    return JMSError(description, name)


def condition_error(error: amqp.Error | None, fallback: str) -> JMSError:
    if error is None:
        return JMSError(fallback)
    return error_from_condition(error.condition, error.description, error.info)


def delivery_error(state: Any) -> JMSError:
    """Why the router did not accept a message: a rejected outcome's error, else a plain refusal."""
    error = None
    if amqp.state_code(state) == REJECTED and isinstance(state.value, list) and state.value:
        error = amqp.Error.from_value(state.value[0])
    return condition_error(error, "the router did not accept the message")
