"""``sys$queuemanager`` configuration: queues, queue controllers and manager-wide limits.

Names, defaults and bounds follow SwiftMQ's queue manager: consumer mode ``shared``, cleanup every
120 s, duplicate detection on with a backlog of 2000, flow control from 400 messages with
at most 5000 ms delay, and the default controllers below (first match wins). One
deliberate difference, the memory budget: SwiftMQ's ``max-messages`` defaults to -1
(unlimited), ours to 100,000 messages, with ``max-bytes`` 256 MiB beside it, so that no
queue grows until the router runs out of memory. Likewise ``cache-size`` (500, as SwiftMQ) has
a byte bound beside it, ``cache-size-bytes-kb`` 16 MiB (SwiftMQ: -1).

The persistence and consumer modes are string enums: a config object holds members
(``PersistenceMode.PERSISTENT``), the XML holds their values (``persistent``), and a
member compares equal to its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import attrs

from martinet.kernel import config_class, entity_list, prop


class PersistenceMode(StrEnum):
    """Whether a queue stores a message: as the message says, or forced either way."""

    AS_MESSAGE = "as_message"
    PERSISTENT = "persistent"
    NON_PERSISTENT = "non_persistent"


class ConsumerMode(StrEnum):
    """How a queue shares its messages among its consumers."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    ACTIVESTANDBY = "activestandby"


@config_class
@attrs.frozen(kw_only=True)
class QueueSettings:
    """What a queue, or a controller for the queues it matches, configures."""

    persistence_mode: PersistenceMode = prop(
        PersistenceMode.AS_MESSAGE,
        choices=PersistenceMode,
        description="as_message: as the message's durable flag says; or force persistent / non_persistent.",
    )
    max_messages: int = prop(
        100_000,
        min=-1,
        description="Most messages the queue holds; -1: unlimited "
        "(SwiftMQ's default, which lets one queue take all memory). A send to a full "
        "queue is refused (AMQP: amqp:resource-limit-exceeded).",
    )
    max_bytes: int = prop(
        256 * 1024 * 1024,
        min=-1,
        description="Most bytes (encoded messages) the queue "
        "holds; -1: unlimited. A send that would pass it is refused like one to a full queue.",
    )
    cache_size: int = prop(
        500,
        min=-1,
        description="Persistent messages whose bytes the queue keeps in memory "
        "(SwiftMQ's cache-size); beyond it a persistent message's body stays only in the store, "
        "and is read back, in batches ahead of the consumers, when they get to it. -1: every "
        "message stays in memory.",
    )
    cache_size_bytes_kb: int = prop(
        16384,
        min=-1,
        description="The same in KiB of encoded messages (SwiftMQ's "
        "cache-size-bytes-kb; theirs defaults to -1, unlimited); -1: no byte bound.",
    )
    cleanup_interval: int = prop(120_000, min=1000, description="Milliseconds between removals of expired messages.")
    expired_to_dlq: bool = prop(False, description="Move expired messages to routerdlq instead of dropping them.")
    duplicate_detection_enabled: bool = prop(True, description="Remember message ids to drop duplicates.")
    duplicate_detection_backlog_size: int = prop(
        2000, min=1, max=10_000_000, description="Message ids remembered (persisted) per queue."
    )
    duplicate_check: str = prop(
        "doubt",
        choices=("doubt", "always"),
        description="doubt: check only messages marked as possible duplicates (resends after a failure, "
        "as SwiftMQ does); always: check every message that has a message-id.",
    )
    flowcontrol_start_queuesize: int = prop(
        400,
        min=-1,
        description="Queue size from which producers are told to slow down (messages held in transactions, such "
        "as a routing link's window, do not count); -1: no flow control.",
    )
    max_flowcontrol_delay: int = prop(5000, min=0, description="Largest flow-control delay in milliseconds.")
    consumer_mode: ConsumerMode = prop(
        ConsumerMode.SHARED,
        choices=ConsumerMode,
        description="shared: competing consumers; exclusive: one consumer only; "
        "activestandby: one consumer receives, the others wait to take over.",
    )
    max_delivery_count: int = prop(
        -1,
        min=-1,
        description="Deliveries after which a message goes to routerdlq instead of back to the queue; -1: unlimited.",
    )


@config_class
@attrs.frozen(kw_only=True)
class QueueConfig(QueueSettings):
    name: str = prop(description="Queue name (local, without @router).")


@config_class
@attrs.frozen(kw_only=True)
class ControllerConfig(QueueSettings):
    name: str = prop(description="Controller name; controllers are tried in name order.")
    predicate: str = prop(description="SQL-LIKE pattern on queue names (% any run, _ one character, \\ escape).")


DEFAULT_CONTROLLERS = [
    ControllerConfig(name="01", predicate="tmp$%", persistence_mode=PersistenceMode.NON_PERSISTENT),
    ControllerConfig(name="02", predicate="sys$%"),
    # messages waiting for a route that expire go to routerdlq: nothing in transit vanishes unseen
    ControllerConfig(name="03", predicate="rt$%", expired_to_dlq=True, cache_size=5000),
    ControllerConfig(name="04", predicate="unroutable"),
    ControllerConfig(name="05", predicate="%$%"),
    ControllerConfig(name="06", predicate="routerdlq"),
    ControllerConfig(name="07", predicate="%"),
]


@config_class
@attrs.frozen(kw_only=True)
class QueueManagerConfig:
    auto_create_queues: bool = prop(
        True,
        description="Create a queue on first use (with its controller's settings); "
        "false: using an unknown queue is an error.",
    )
    max_message_size: int = prop(10 * 1024 * 1024, min=1, description="Largest message accepted, in bytes.")
    max_queues: int = prop(
        10_000,
        min=-1,
        description="Most queues the router holds; -1: unlimited. Beyond it "
        "no queue is auto-created and no temporary queue made (clients get "
        "amqp:resource-limit-exceeded); queues defined in the config are always created. "
        "Routing's queues (rt$…) are not counted: routing bounds them by the routers it knows.",
    )
    reserved_queues_percent: int = prop(
        10,
        min=0,
        max=90,
        description="Part of max-queues (rounded down) that clients' queues may not take: kept for the "
        "router's own needs (management's reply queue, temporary queues of users in sys$mgmt's groups), "
        "so that a router whose clients made all the queues they may can still be managed.",
    )
    max_queues_per_user: int = prop(
        1000,
        min=-1,
        max=1_000_000,
        description="Queues made on demand (auto-created, temporary, durable subscriptions') that one "
        "authenticated user may have at once, over all its connections; -1: unlimited. Ten times fewer "
        "than max-queues by default, so that one user cannot take the room of all.",
    )
    max_queues_per_address: int = prop(
        5000,
        min=-1,
        max=1_000_000,
        description="The same for all clients connecting from one address (with authentication off, the "
        "only per-client bound besides the listener's per-connection one); -1: unlimited. Half of "
        "max-queues by default: one host cannot take the room of all.",
    )
    memory_limit_kb: int = prop(
        -1,
        min=-1,
        description="The router's memory budget in KiB: what its queues hold (each message's bytes "
        "in memory, or the leading sections of one swapped out, plus a fixed cost per message) and "
        "its AMQP connections' incomplete messages. Above it the memory alarm is on: publishers get "
        "no new credit and routing links hold what they receive until it falls under "
        "memory-low-watermark-percent of it; consumers go on. -1: memory-limit-percent of the machine's memory.",
    )
    memory_limit_percent: int = prop(
        40,
        min=0,
        max=100,
        description="The memory budget when memory-limit-kb is -1, as a percentage of the machine's "
        "physical memory (or of its control group's limit, if lower); 0: no budget. 40, as RabbitMQ's "
        "first default: what the count leaves out (the interpreter, connections, routing) needs the rest.",
    )
    memory_low_watermark_percent: int = prop(
        90,
        min=1,
        max=100,
        description="Percentage of the memory budget under which the memory alarm goes off again "
        "(a gap, so that publishers are not released and stopped again for every message).",
    )
    memory_alarm_non_persistent: str = prop(
        "accept",
        choices=("accept", "refuse"),
        description="What happens to a client's non-persistent message that arrives while the memory "
        "alarm is on (on credit granted before it): accept takes it, as RabbitMQ does, so each "
        "publisher's link can add up to its incoming-credit messages past the budget; refuse rejects "
        "it (amqp:resource-limit-exceeded, counted as memory-refused), which keeps the router within "
        "its budget by that much. Persistent messages are always taken: past the queue's cache only "
        "their leading sections stay in memory. Users of sys$mgmt's groups are never refused.",
    )
    queues: Mapping[str, QueueConfig] = entity_list(QueueConfig, item="queue", description="Defined queues.")
    queue_controllers: Mapping[str, ControllerConfig] = entity_list(
        ControllerConfig,
        item="queue-controller",
        default=DEFAULT_CONTROLLERS,
        description="Settings for queues not defined above; the first match in name order wins.",
    )
