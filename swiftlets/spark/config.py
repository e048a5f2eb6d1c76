"""``sys$spark`` configuration: what is sampled, how often, and where the rows go.

``output`` chooses where this router's own rows go: ``files`` (partitioned files in
``folder``), ``topic`` (published to ``topic`` for a collector, possibly on another router)
or ``none``. ``collector-enabled`` makes this router also subscribe durably to ``topic`` and
write every router's rows into ``folder``: the network-wide collection. Include and exclude
lists are SQL-LIKE predicates separated by spaces; a swiftlet or entity is exported when it
matches an include predicate and no exclude predicate.
"""

from __future__ import annotations

import importlib.util
from enum import StrEnum

import attrs

from martinet.kernel import config_class, prop
from martinet.messaging.like import like_pattern


class Output(StrEnum):
    FILES = "files"
    TOPIC = "topic"
    NONE = "none"


class FileFormat(StrEnum):
    PARQUET = "parquet"
    JSONL = "jsonl"


def check_format(value: str) -> None:
    """Parquet needs pyarrow, which only the ``spark`` extra installs."""
    if value == FileFormat.PARQUET and importlib.util.find_spec("pyarrow") is None:
        raise ValueError(
            "format 'parquet' needs pyarrow, which is not installed "
            "(pip install 'martinet[spark]'), or use format 'jsonl'"
        )


def check_predicates(value: str) -> None:
    for pattern in value.split():
        like_pattern(pattern)


@config_class
@attrs.frozen(kw_only=True)
class SparkConfig:
    collect_interval: int = prop(
        10_000, min=10, max=86_400_000, description="Milliseconds between two samples of every swiftlet's usage."
    )
    full_sample_interval: int = prop(
        30,
        min=1,
        max=1_000_000,
        description="Every this many samples, one holds every value (a full sample); "
        "the others hold only the numbers that changed since the previous sample, and "
        "every text. 1: every sample is full.",
    )
    include_swiftlets: str = prop(
        "%",
        check=check_predicates,
        description="LIKE predicates (separated by spaces) of the swiftlets exported, "
        "e.g. 'sys$queuemanager sys$routing'; 'router' is the router's own usage.",
    )
    exclude_swiftlets: str = prop(
        "", check=check_predicates, description="LIKE predicates of swiftlets not exported (wins over include)."
    )
    include_entities: str = prop(
        "%",
        check=check_predicates,
        description="LIKE predicates of the entities exported, as rows name them "
        "(e.g. 'queues/orders%'; '' is the swiftlet's own usage). Also applied to "
        "events' entities.",
    )
    exclude_entities: str = prop(
        "", check=check_predicates, description="LIKE predicates of entities not exported, e.g. 'queues/tmp$%'."
    )
    events_enabled: bool = prop(
        True,
        description="Record bus events (link states, routes, destinations, "
        "schedule runs, usage entries that appear or go) as event rows.",
    )
    output: Output = prop(
        Output.FILES,
        choices=Output,
        description="Where this router's rows go: files (in folder), topic (published to "
        "topic, for a collector) or none.",
    )
    collector_enabled: bool = prop(
        False,
        reboot_required=True,
        description="Subscribe durably to topic and write the rows of every router that "
        "publishes there into folder (network-wide collection).",
    )
    topic: str = prop(
        "martinet.metrics", reboot_required=True, description="The metrics topic for output 'topic' and the collector."
    )
    folder: str = prop(
        "metrics",
        description="Folder of the files: rows/ and events/ below it, partitioned date=YYYY-MM-DD/router=NAME/.",
    )
    format: FileFormat = prop(
        FileFormat.PARQUET,
        choices=FileFormat,
        check=check_format,
        description="File format: parquet (needs pyarrow) or jsonl (JSON lines).",
    )
    roll_interval: int = prop(
        60_000,
        min=10,
        max=86_400_000,
        description="Milliseconds rows are gathered before they are written as one file "
        "per partition (the most a crash can lose of a router's own rows).",
    )
    retention_age: int = prop(-1, min=-1, description="Files older than this many milliseconds are deleted; -1: kept.")
    retention_size: int = prop(
        -1, min=-1, description="Bytes the files may take in all; the oldest go first beyond it; -1: no limit."
    )
