"""Password hashes for ``sys$authentication`` and ``martinet hash-password``:
``pbkdf2-sha256$ITERATIONS$SALT$HASH``.

SALT and HASH are unpadded URL-safe base64; the hash is
``hashlib.pbkdf2_hmac("sha256", password, salt, ITERATIONS)`` (no dependency beyond the
standard library). ``martinet hash-password`` prints one. A configured password that does
not start with ``pbkdf2-sha256$`` is a plain-text password (as SwiftMQ keeps them).

Checking runs in the caller's thread: one hash of :data:`DEFAULT_ITERATIONS` takes some
tens of milliseconds of CPU, so the authentication swiftlet calls it in a worker thread
(hashlib releases the GIL while it hashes), never on the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["hash_password", "verify_password", "is_hashed", "DEFAULT_ITERATIONS", "SCHEME"]

SCHEME = "pbkdf2-sha256"
DEFAULT_ITERATIONS = 100_000


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """The configurable hash of ``password`` (a fresh 16-byte salt unless given)."""
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def is_hashed(stored: str) -> bool:
    return stored.startswith(SCHEME + "$")


def verify_password(stored: str, given: str) -> bool:
    """Whether ``given`` matches ``stored`` (a hash of :func:`hash_password` or plain text),
    compared in constant time. A malformed hash matches nothing."""
    if not is_hashed(stored):
        # Digests of both, so neither the length nor the content shows in the timing.
        return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(stored.encode()).digest())
    try:
        _scheme, iterations, salt, digest = stored.split("$")
        expected = _unb64(digest)
        actual = hashlib.pbkdf2_hmac("sha256", given.encode(), _unb64(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)
