"""AMQP 1.0, sans-IO: the vocabulary (:mod:`.wire`), the connection engine (:mod:`.engine`)
and SASL (:mod:`.sasl`). The trio driver that runs them on a socket is :mod:`messaging.io`.

Used by the router's listener, the Python client, and the router-to-router links.
"""

from .engine import *  # noqa: F403
from .engine import __all__ as _engine_names
from .wire import *  # noqa: F403
from .wire import __all__ as _wire_names

__all__ = [*_engine_names, *_wire_names]
