"""The routing link's handshake: protocol select, connect, admission, authentication; sans-IO.

Theory of operation
-------------------
The stages before the transfer, both roles (``docs/routing-protocol.md``)::

    protocol select -> connect -> (admission by the owner) -> authentication
        -> [XA recovery, when the link uses XA] -> delivery

:class:`Handshake` is the part of :class:`~.stages.LinkMachine` that runs them, through
its :class:`~.linkcore.LinkCore` (which keeps the state and its transitions).

- **Protocol select.** The connector offers :data:`VERSIONS`; the listener picks the
  highest it shares or refuses.
- **Admission.** The machine does not know the router's other links, so it does not
  decide who may connect. When it learns the peer's name it emits
  :class:`~.linkevents.PeerIdentified` and waits (state ``ADMISSION``, input read no
  further) until the owner calls :meth:`~.stages.LinkMachine.admit` or
  :meth:`~.stages.LinkMachine.refuse`. It refuses by itself a peer with an invalid name
  or with our own name.
- **Authentication** (mutual, HMAC-SHA256 over both nonces; see :func:`proof`): the
  matrix is in the module constant :data:`AUTH_MATRIX` and in the document. A connector
  that refuses tells the peer no more than :data:`AUTH_FAILED`.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from .linkcore import Handler, LinkCore
from .linkevents import PeerIdentified
from .linkstate import MAX_NAME_LENGTH, MAX_REASON, Role, State, printable, valid_router_name
from .window import Decision
from .wire import (
    Auth,
    AuthReply,
    Connect,
    ConnectReply,
    FrameType,
    Protocol,
    ProtocolReply,
    RemoteProtocolError,
)
from .xarecovery import XaRecovery

VERSIONS = ("1.1",)  # the versions this module implements; never offer more (SwiftMQ defect 6)
NONCE_SIZE = 32
MAX_VERSIONS = 16
AUTH_FAILED = "authentication failed"
LABEL_CONNECTOR = b"martinet-routing connector proof"  # the proof the connector sends
LABEL_LISTENER = b"martinet-routing listener proof"  # the proof the listener sends

_VERSION = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\Z")

# Who must authenticate, by (listener has a password, connector has a password):
# True = the authentication stage runs; a string = the connector refuses, for that reason.
AUTH_MATRIX: dict[tuple[bool, bool], bool | str] = {
    (False, False): False,
    (True, True): True,
    (True, False): "the listener requires authentication and this connector has no password",
    (False, True): "the listener does not authenticate itself and this connector has a password",
}


def proof(
    password: bytes,
    label: bytes,
    connector_nonce: bytes,
    listener_nonce: bytes,
    connector_name: str,
    listener_name: str,
    version: str,
) -> bytes:
    """HMAC-SHA256 keyed with ``password`` over the label and the handshake's values.

    The message is ``label``, then each of connector nonce, listener nonce, connector
    name, listener name, version (names and version UTF-8) preceded by its length as a
    2-byte big-endian integer. The label differs per direction, so a proof one side sent
    is never valid as the other side's (no reflection).
    """
    message = bytearray(label)
    for part in (connector_nonce, listener_nonce, connector_name.encode(), listener_name.encode(), version.encode()):
        message += len(part).to_bytes(2, "big") + part
    return hmac.new(password, bytes(message), hashlib.sha256).digest()


def _version_key(version: str) -> tuple[int, ...]:
    match = _VERSION.match(version)
    return (int(match[1]), int(match[2])) if match else (-1,)


class Handshake:
    """The handshake of one link (see the module docstring). The connector's PROTOCOL is
    queued at once.

    Args:
        core: the link's core.
        recovery: the XA recovery part, begun after the handshake when the link uses XA.
        password: the link's shared secret, None for none.
        nonce: our nonce (:data:`NONCE_SIZE` bytes).
    """

    def __init__(self, core: LinkCore, recovery: XaRecovery, password: bytes | None, nonce: bytes):
        self._core = core
        self._recovery = recovery
        self._password = password
        self._nonce = nonce
        self._peer_nonce = b""
        self._authenticate = False
        if core.role is Role.CONNECTOR:
            core.send(Protocol(versions=VERSIONS))

    def handlers(self) -> dict[FrameType, Handler]:
        """The frames this part handles."""
        return {
            FrameType.PROTOCOL: self._on_protocol,
            FrameType.PROTOCOL_REPLY: self._on_protocol_reply,
            FrameType.CONNECT: self._on_connect,
            FrameType.CONNECT_REPLY: self._on_connect_reply,
            FrameType.AUTH: self._on_auth,
            FrameType.AUTH_REPLY: self._on_auth_reply,
        }

    # -- the owner's calls -------------------------------------------------------------------

    def admit(self) -> None:
        """Let the identified peer in: the handshake continues (authentication or delivery).
        Does nothing once the link ended (the :class:`~.linkevents.Closed` event said so),
        so a decision that crosses the peer's close is harmless.

        Raises:
            LocalProtocolError: not awaiting admission (e.g. admitted already).
        """
        self._core.decide(Decision.ADMIT, self._on_admit)

    def refuse(self, reason: str) -> None:
        """Refuse the identified peer with ``reason`` (e.g. "router r2 is already connected"):
        it reads the reason, the socket ends after the reject-disconnect-delay. Does
        nothing once the link ended.

        Raises:
            LocalProtocolError: not awaiting admission.
        """
        core, reason = self._core, reason[:MAX_REASON]
        core.decide(
            Decision.REFUSE,
            lambda: core.refuse(
                reason, ConnectReply(accepted=False, reason=reason) if core.role is Role.LISTENER else None
            ),
        )

    # -- handlers (each returns the next state, or None when it ended the link) --------------

    def _on_protocol(self, frame: Protocol) -> State | None:
        core = self._core
        if len(frame.versions) > MAX_VERSIONS:
            raise RemoteProtocolError(f"PROTOCOL offers {len(frame.versions)} versions (at most {MAX_VERSIONS})")
        shared = [v for v in frame.versions if v in VERSIONS]
        if not shared:
            offered = ", ".join(printable(v, 20) for v in frame.versions) or "none"
            reason = f"no common protocol version (offered: {offered}; supported: {', '.join(VERSIONS)})"
            core.refuse(reason, ProtocolReply(accepted=False, versions=VERSIONS, reason=reason))
            return None
        core.version = max(shared, key=_version_key)
        core.send(ProtocolReply(accepted=True, version=core.version))
        return State.CONNECT_WAIT

    def _on_protocol_reply(self, frame: ProtocolReply) -> State | None:
        core = self._core
        if not frame.accepted:
            core.end(printable(frame.reason) or "the listener refused the protocol versions", by_peer=True)
            return None
        if frame.version not in VERSIONS:
            raise RemoteProtocolError(
                f"the listener chose the version {printable(frame.version, 20)!r}, which was not offered"
            )
        core.version = frame.version
        core.send(Connect(name=core.name, nonce=self._nonce, use_xa=core.settings.use_xa))
        return State.CONNECT_WAIT

    def _check_nonce(self, nonce: bytes) -> None:
        if len(nonce) != NONCE_SIZE:
            raise RemoteProtocolError(f"the nonce must have {NONCE_SIZE} bytes, got {len(nonce)}")

    def _name_problem(self, name: str) -> str | None:
        if not valid_router_name(name):
            return (
                f"invalid router name {printable(name, 80)!r}: use letters, digits, '_' and '-', "
                f"starting with a letter, at most {MAX_NAME_LENGTH} characters"
            )
        if name == self._core.name:
            return f"both routers are named {name!r}"
        return None

    def _identified(self, name: str) -> State:
        core = self._core
        core.peer = name
        core.emit(PeerIdentified(peer=name, version=core.version or "", authentication=self._authenticate))
        return State.ADMISSION

    def _on_connect(self, frame: Connect) -> State | None:
        self._check_nonce(frame.nonce)
        if problem := self._name_problem(frame.name):
            self._core.refuse(problem, ConnectReply(accepted=False, reason=problem))
            return None
        self._peer_nonce, self._core.peer_use_xa = frame.nonce, frame.use_xa
        self._authenticate = self._password is not None
        return self._identified(frame.name)

    def _on_connect_reply(self, frame: ConnectReply) -> State | None:
        core = self._core
        if not frame.accepted:
            core.end(printable(frame.reason) or "the listener refused the connection", by_peer=True)
            return None
        self._check_nonce(frame.nonce)
        if problem := self._name_problem(frame.name):
            core.refuse(problem)
            return None
        core.peer = frame.name
        authenticate = AUTH_MATRIX[(frame.auth_required, self._password is not None)]
        if isinstance(authenticate, str):  # the peer is told no more than "authentication failed"
            core.refuse(AUTH_FAILED, local_reason=f"{AUTH_FAILED}: {authenticate}")
            return None
        self._peer_nonce, core.peer_use_xa = frame.nonce, frame.use_xa
        core.keepalive_interval = frame.keepalive_ms / 1000
        self._authenticate = authenticate
        return self._identified(frame.name)

    def _on_admit(self) -> State | None:
        core = self._core
        if core.role is Role.LISTENER:
            core.send(
                ConnectReply(
                    accepted=True,
                    name=core.name,
                    nonce=self._nonce,
                    keepalive_ms=round(core.keepalive_interval * 1000),
                    auth_required=self._authenticate,
                    use_xa=core.settings.use_xa,
                )
            )
            return State.AUTH_WAIT if self._authenticate else self._after_authentication()
        if self._authenticate:
            core.send(Auth(proof=self._proof(LABEL_CONNECTOR)))
            return State.AUTH_WAIT
        return self._after_authentication()

    def _proof(self, label: bytes) -> bytes:
        core = self._core
        assert self._password is not None and core.peer is not None and core.version is not None
        if core.role is Role.CONNECTOR:
            return proof(self._password, label, self._nonce, self._peer_nonce, core.name, core.peer, core.version)
        return proof(self._password, label, self._peer_nonce, self._nonce, core.peer, core.name, core.version)

    def _on_auth(self, frame: Auth) -> State | None:
        if not hmac.compare_digest(frame.proof, self._proof(LABEL_CONNECTOR)):
            self._core.refuse(AUTH_FAILED, AuthReply(accepted=False, reason=AUTH_FAILED))
            return None
        self._core.send(AuthReply(accepted=True, proof=self._proof(LABEL_LISTENER)))
        return self._after_authentication()

    def _on_auth_reply(self, frame: AuthReply) -> State | None:
        if not frame.accepted:
            self._core.end(printable(frame.reason) or AUTH_FAILED, by_peer=True)
            return None
        if not hmac.compare_digest(frame.proof, self._proof(LABEL_LISTENER)):
            self._core.refuse(AUTH_FAILED, local_reason=f"{AUTH_FAILED}: the listener's proof is wrong")
            return None
        return self._after_authentication()

    def _after_authentication(self) -> State:
        """With XA (either side asked), the XA recovery stage; else the delivery stage.
        Either way the peer is authenticated: frames up to the configured size from now."""
        core = self._core
        core.reader.max_frame_size = core.settings.max_frame_size
        if not core.use_xa:
            return core.enter_delivery()
        return self._recovery.begin()
