"""``sys$log`` configuration: the level and the rotating file of this router's log."""

from __future__ import annotations

import attrs

from martinet.kernel import config_class, prop

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@config_class
@attrs.frozen(kw_only=True)
class LogConfig:
    level: str = prop("INFO", choices=LEVELS, description="Lowest level written to the log file.")
    logfile: str = prop(
        "",
        reboot_required=True,
        description="Log file of this router; empty for none. A relative path is resolved "
        "against the directory the router was started in.",
    )
    logfile_max_size: int = prop(
        10_240,
        min=1,
        max=10_485_760,
        reboot_required=True,
        description="Size in KB at which the log file is rotated.",
    )
    number_old_logfiles: int = prop(
        10,
        min=0,
        max=1000,
        reboot_required=True,
        description="Rotated log files kept (logfile.1 is the newest).",
    )
