"""``sys$authentication``: users, groups, grants and host access lists.

A listener logs clients in and checks their attaches through :mod:`.api`
(``context.lookup("sys$authentication", Authentication)``). :mod:`.service` is the running
swiftlet and states the rules (who is let in, which grant decides); :mod:`.config` holds
the users, groups and grants.

Passwords are kept in the config file in plain text (as SwiftMQ keeps them) or as salted
hashes (``martinet hash-password``, :mod:`martinet.kernel.passwords`); management never
shows them. Failed logins are throttled and logged per source address (:mod:`.service`).

Usage: ``/sys$authentication/usage`` counts logins, refused logins and access denials.
"""

from __future__ import annotations

from martinet.kernel import SwiftletSpec, hookimpl


# The hooks import the implementation, so that importing this package (as its api does) stays cheap.
@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    from .config import AuthenticationConfig
    from .service import Authentication

    return [
        SwiftletSpec(
            name="sys$authentication",
            description="Users, groups, queue and topic grants, host access lists.",
            config=AuthenticationConfig,
            factory=Authentication,
        )
    ]
