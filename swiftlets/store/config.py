"""``sys$store`` configuration: where the database lives, how hard it syncs, batch size."""

from __future__ import annotations

import attrs

from martinet.kernel import config_class, prop


@config_class
@attrs.frozen(kw_only=True)
class StoreConfig:
    path: str = prop(
        "store",
        reboot_required=True,
        description="Folder of the store; the database is <path>/<router name>.sqlite. A relative "
        "path is resolved against the directory the router was started in.",
    )
    sync: str = prop(
        "full",
        choices=("full", "normal", "off"),
        reboot_required=True,
        description="full: fsync every group commit (survives power loss); normal: no fsync "
        "(survives a process crash, not an OS crash); off: leave it to the OS.",
    )
    max_batch: int = prop(
        20_000,
        min=1,
        max=1_000_000,
        description="Most operations in one group commit; bounds commit latency under load.",
    )
    accept_empty_store: bool = prop(
        False,
        reboot_required=True,
        description="Start even if the store existed and its database is now empty, replaced or "
        "damaged (a WAL whose damage drops committed transactions, a failed integrity check); "
        "each problem is logged as an ERROR. Set it for one start after an operator decided to "
        "accept the loss, then remove it. Without it such a start is refused.",
    )
    disk_free_limit_kb: int = prop(
        51_200,
        min=0,
        description="Free space (KiB) of the store's file system under which the disk alarm goes on: "
        "new persistent messages are refused with amqp:resource-limit-exceeded and routing links hold "
        "their transfers, until the free space is above it again (by 10 % of it, at least 1 MiB). "
        "0: no alarm before the disk is full (a commit that meets a full disk waits for space either way).",
    )
    disk_check_interval: int = prop(
        1000,
        min=100,
        max=3_600_000,
        description="Milliseconds between two reads of the store's free space.",
    )
