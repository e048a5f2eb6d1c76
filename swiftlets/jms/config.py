"""``sys$jms`` configuration: the AMQP listeners and the connection-factory defaults they
announce to clients."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from martinet.kernel import config_class, entity_list, prop


@config_class
@attrs.frozen(kw_only=True)
class HostAccessEntry:
    name: str = prop(description="SQL-LIKE pattern of client addresses allowed to connect.")


@config_class
@attrs.frozen(kw_only=True)
class ListenerConfig:
    name: str = prop(description="Listener name.")
    port: int = prop(
        5672, min=0, max=65535, reboot_required=True, description="TCP port; 0 takes any free port (shown under usage)."
    )
    bind_address: str = prop("0.0.0.0", reboot_required=True, description="Interface to listen on.")
    max_connections: int = prop(
        -1, min=-1, description="Most connections at once; -1: unlimited. Connections past it are closed at once."
    )
    keepalive_interval: int = prop(
        60_000,
        min=0,
        description="Milliseconds of silence after which a "
        "peer counts as dead (the AMQP idle timeout we announce); 0: never.",
    )
    max_frame_size: int = prop(1_048_576, min=512, description="Largest AMQP frame, in bytes.")
    max_sessions: int = prop(
        256,
        min=1,
        max=65536,
        description="Sessions one connection may have at once: "
        "we announce channel-max one less in our open, and a begin on a higher channel "
        "closes the connection with amqp:connection:framing-error [2.7.1].",
    )
    max_links_per_session: int = prop(
        1024,
        min=1,
        max=4_294_967_296,
        description="Links one session may "
        "have at once: we announce handle-max one less in our begin, and an attach "
        "with a higher handle closes the connection with "
        "amqp:connection:framing-error [2.7.2].",
    )
    max_incoming_buffer: int = prop(
        64 * 1024 * 1024,
        min=65536,
        description="Bytes of incomplete incoming "
        "multi-frame messages one connection may hold, all its links together; "
        "beyond it the connection is closed with amqp:resource-limit-exceeded. "
        "(One message may hold up to sys$queuemanager's max-message-size, beyond "
        "which its link is detached with amqp:link:message-size-exceeded: keep this "
        "above it.)",
    )
    max_auto_created_queues_per_connection: int = prop(
        1000,
        min=-1,
        description="Queues one connection may have created: those auto-created by its "
        "attaches and anonymous-relay sends (they outlive it) and its temporary queues still alive; -1: "
        "unlimited. An attach or send beyond it is refused with amqp:resource-limit-exceeded.",
    )
    incoming_credit: int = prop(
        1000,
        min=1,
        max=1_000_000,
        description="Messages a producer may have in flight on one link (the link credit we grant).",
    )
    tls_certificate: str = prop(
        "",
        reboot_required=True,
        description="PEM certificate chain for TLS; empty: plain TCP. Clients then connect with amqps://.",
    )
    tls_key: str = prop("", reboot_required=True, description="PEM private key of the TLS certificate.")
    allow_same_clientid: bool = prop(
        False,
        description="Several connections may always share a client id "
        "(container id), even when one asks to be its only connection "
        "(capability sole-connection-for-container, sent by Qpid JMS when a client id "
        "is set); false: such a request is refused with amqp:invalid-field while "
        "another connection uses the id, and holds the id exclusively once granted.",
    )
    topic_wildcards: bool = prop(
        False,
        description="Topic addresses of this listener's clients use the "
        "AMQP/ActiveMQ wildcards: a level * matches any one level, a last level # "
        "zero or more; they are translated to SQL-LIKE predicates (* to %, a last # "
        "dropped). false: * and # are plain characters. New connections follow a change.",
    )
    host_access_list: Mapping[str, HostAccessEntry] = entity_list(
        HostAccessEntry,
        item="host-access-entry",
        description="Client addresses allowed to connect (SQL-LIKE "
        "patterns); empty: any. Others are closed at once and logged.",
    )
    consumer_cache_size: int = prop(
        500,
        min=1,
        description="Messages a consumer of our client prefetches "
        "(its link credit window; SwiftMQ's smqp-consumer-cache-size). "
        "Announced to clients in the open frame.",
    )
    jms_default_delivery_mode: str = prop(
        "persistent",
        choices=("persistent", "non_persistent"),
        description="Delivery mode of our client's producers unless set.",
    )
    jms_default_message_priority: int = prop(
        4, min=0, max=9, description="Priority of our client's messages unless set."
    )
    jms_default_message_ttl: int = prop(
        0, min=0, description="Time to live (ms) of our client's messages unless set; 0: forever."
    )


@config_class
@attrs.frozen(kw_only=True)
class JmsConfig:
    collect_interval: int = prop(
        10_000,
        min=100,
        description="Milliseconds between samples of the per-connection message rates shown under usage/connections.",
    )
    listeners: Mapping[str, ListenerConfig] = entity_list(
        ListenerConfig, item="listener", default=[ListenerConfig(name="amqp")], description="AMQP listeners."
    )
