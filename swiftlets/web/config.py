"""``sys$web`` configuration: the optional HTTP listener of the web view and ``/metrics``.

Every property takes effect at the next start of the swiftlet (``reboot_required``): the
listener is bound once, when the swiftlet starts. Whether a bind address is allowed depends
on another swiftlet (a non-loopback address needs ``sys$authentication`` with
``authentication-enabled``), so the running swiftlet checks that and refuses to start with
the reason.
"""

from __future__ import annotations

from martinet.kernel import config_class, prop


@config_class
class WebConfig:
    enabled: bool = prop(False, reboot_required=True, description="Serve the web view and /metrics over HTTP.")
    bind_address: str = prop("127.0.0.1", reboot_required=True, description="Address the HTTP listener binds "
                             "to. Anything but a loopback address needs authentication-enabled in "
                             "sys$authentication (every request then logs in with HTTP basic auth).")
    port: int = prop(8080, min=0, max=65535, reboot_required=True, description="TCP port of the HTTP listener "
                     "(0: any free port; usage shows the one bound).")
    admin_group: str = prop("admin", reboot_required=True, description="With authentication enabled, only users "
                            "of this sys$authentication group may use the web view and /metrics.")
