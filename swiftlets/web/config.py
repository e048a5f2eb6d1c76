"""``sys$web`` configuration: the optional HTTP listener of the web view and ``/metrics``.

The listener's properties take effect at the next start of the swiftlet
(``reboot_required``): the listener is bound once, when the swiftlet starts. The crawl's
(``map-*``) are read at each crawl. Whether a bind address is allowed depends
on another swiftlet (a non-loopback address needs ``sys$authentication`` with
``authentication-enabled``), so the running swiftlet checks that and refuses to start with
the reason; so it does for such an address without TLS unless ``plain-http-auth`` allows
passwords in clear.
"""

from __future__ import annotations

import attrs

from martinet.kernel import config_class, prop


@config_class
@attrs.frozen(kw_only=True)
class WebConfig:
    enabled: bool = prop(False, reboot_required=True, description="Serve the web view and /metrics over HTTP.")
    bind_address: str = prop(
        "127.0.0.1",
        reboot_required=True,
        description="Address the HTTP listener binds "
        "to. Anything but a loopback address needs authentication-enabled in "
        "sys$authentication (every request then logs in with HTTP basic auth).",
    )
    port: int = prop(
        8080,
        min=0,
        max=65535,
        reboot_required=True,
        description="TCP port of the HTTP listener (0: any free port; usage shows the one bound).",
    )
    tls_certificate: str = prop(
        "",
        reboot_required=True,
        description="PEM certificate chain: the listener serves HTTPS with it; empty: plain HTTP.",
    )
    tls_key: str = prop(
        "",
        reboot_required=True,
        description="PEM private key of the TLS certificate (empty: in the certificate's file).",
    )
    plain_http_auth: bool = prop(
        False,
        reboot_required=True,
        description="Allow a bind-address beyond loopback without TLS: "
        "HTTP basic auth then sends passwords across the network in clear (only on a network "
        "you trust); false: such a listener refuses to start.",
    )
    admin_group: str = prop(
        "admin",
        reboot_required=True,
        description="With authentication enabled, only users "
        "of this sys$authentication group may use the web view and /metrics.",
    )
    map_refresh_interval: float = prop(
        10.0,
        min=0.5,
        max=3600.0,
        description="Seconds "
        "between two crawls of the network through sys$mgmt (every known router "
        "asked for its links), when sys$mgmt runs here.",
    )
    map_request_timeout: float = prop(
        5.0,
        min=0.1,
        max=600.0,
        description="Seconds a "
        "router has to answer one request of a crawl (or of a remote router's "
        "page); one that does not is shown as not answering.",
    )
    map_concurrency: int = prop(8, min=1, max=1000, description="Routers a crawl asks at once.")
