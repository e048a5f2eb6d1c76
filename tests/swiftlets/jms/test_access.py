"""The listener's access policy (swiftlets/jms/access.py), from a table: every rule of
``queue_access`` and ``topic_access``, with the refusal's condition and text as the client
gets them. The policy looks nothing up, so each row is its inputs and its answer."""

from __future__ import annotations

import attrs
import pytest

from martinet.swiftlets.authentication.api import AccessDenied
from martinet.swiftlets.jms.access import Access, Refused, Temporary, queue_access, topic_access

HERE = "r1"


@attrs.frozen
class Grants:
    """A principal's grants: queue or topic name → the actions granted on it."""

    queues: dict[str, frozenset[str]] = attrs.Factory(dict)
    topics: dict[str, frozenset[str]] = attrs.Factory(dict)
    user: str = "u"
    host: str = "127.0.0.1"
    group: str = "g"

    def check_queue(self, queue: str, action: str) -> None:
        if action not in self.queues.get(queue.split("@", 1)[0], frozenset()):
            raise AccessDenied(f"user {self.user} may not {action} on queue {queue!r}")

    def check_topic(self, topic: str, action: str) -> None:
        if action not in self.topics.get(topic, frozenset()):
            raise AccessDenied(f"user {self.user} may not {action} on topic {topic!r}")


ALL = frozenset({"send", "receive", "browse"})
OPEN = Grants(queues={"q": ALL, "rt$x": ALL, "sys$mgmt": ALL})
CLOSED = Grants()
NOT_FOUND, DENIED, INVALID = "amqp:not-found", "amqp:unauthorized-access", "amqp:invalid-field"
DOLLAR = "a name with '$' is the router's, and without sys$authentication no grant can name it"
DURABLE = (
    "as a queue: it is a durable subscription's; attach to its topic as a durable subscriber, "
    "with the client id that created it"
)
REMOTE = "and only queues of this router (r1) can be read here"
OWNER = "only the connection that created it may receive from it"

# address, action, grants, create, temporary, durable → Access, or (condition, text) of the refusal
QUEUE_ROWS = [
    ("", "send", None, True, None, False, (INVALID, "an address is required")),
    # another router's queue: only sends
    (
        "q@r2",
        "receive",
        None,
        True,
        None,
        False,
        (NOT_FOUND, f"cannot receive queue 'q@r2': it is on router r2, {REMOTE}"),
    ),
    (
        "q@r2",
        "browse",
        OPEN,
        True,
        None,
        False,
        (NOT_FOUND, f"cannot browse queue 'q@r2': it is on router r2, {REMOTE}"),
    ),
    (
        "tmp$1@r2",
        "receive",
        None,
        True,
        None,
        False,
        (NOT_FOUND, f"cannot receive queue 'tmp$1@r2': it is on router r2, {REMOTE}"),
    ),
    ("q@r2", "send", None, True, None, False, Access.CREATE),
    ("q@r2", "send", None, False, None, False, Access.RESOLVE),
    # a plain name: the grant, then created on first use (or only looked up)
    ("q", "send", None, True, None, False, Access.CREATE),
    ("q", "receive", None, True, None, False, Access.CREATE),
    ("q@r1", "receive", None, True, None, False, Access.CREATE),
    ("q", "send", None, False, None, False, Access.EXISTING),
    ("q@r1", "send", None, False, None, False, Access.EXISTING),
    ("q", "browse", OPEN, True, None, False, Access.CREATE),
    ("q", "receive", CLOSED, True, None, False, (DENIED, "user u may not receive on queue 'q'")),
    ("q@r2", "send", CLOSED, False, None, False, (DENIED, "user u may not send on queue 'q@r2'")),
    ("q", "receive", None, True, Temporary.OTHERS, True, Access.CREATE),  # the facts matter only for '$' names
    # sys$mgmt: anyone sends (not as a reply-to); receiving needs a grant naming it
    ("sys$mgmt", "send", None, True, None, False, Access.EXISTING),
    ("sys$mgmt", "send", CLOSED, True, None, False, Access.EXISTING),
    ("sys$mgmt@r1", "send", None, True, None, False, Access.EXISTING),
    ("sys$mgmt@r2", "send", None, True, None, False, Access.RESOLVE),
    ("sys$mgmt", "send", None, False, None, False, (DENIED, "'sys$mgmt' is a management queue, not a reply-to")),
    ("sys$mgmt@r2", "send", OPEN, False, None, False, (DENIED, "'sys$mgmt@r2' is a management queue, not a reply-to")),
    ("sys$mgmt", "receive", None, True, None, False, (DENIED, f"cannot receive queue 'sys$mgmt': {DOLLAR}")),
    ("sys$mgmt", "receive", CLOSED, True, None, False, (DENIED, "user u may not receive on queue 'sys$mgmt'")),
    ("sys$mgmt", "receive", OPEN, True, None, False, Access.EXISTING),
    # temporary queues: anyone sends while it exists, only its connection receives or browses
    ("tmp$1", "send", None, True, None, False, (NOT_FOUND, "temporary queue 'tmp$1' does not exist on router r1")),
    (
        "tmp$1@r1",
        "send",
        OPEN,
        False,
        Temporary.MISSING,
        False,
        (NOT_FOUND, "temporary queue 'tmp$1' does not exist on router r1"),
    ),
    (
        "tmp$1",
        "receive",
        None,
        True,
        Temporary.MISSING,
        False,
        (NOT_FOUND, "temporary queue 'tmp$1' does not exist on router r1"),
    ),
    ("tmp$1", "send", None, True, Temporary.OTHERS, False, Access.GRANTED),
    ("tmp$1", "send", CLOSED, False, Temporary.OTHERS, False, Access.GRANTED),
    ("tmp$1", "send", None, True, Temporary.MINE, False, Access.GRANTED),
    ("tmp$1", "receive", None, True, Temporary.MINE, False, Access.GRANTED),
    ("tmp$1@r1", "browse", CLOSED, True, Temporary.MINE, False, Access.GRANTED),
    (
        "tmp$1",
        "receive",
        OPEN,
        True,
        Temporary.OTHERS,
        False,
        (DENIED, f"cannot receive temporary queue 'tmp$1': {OWNER}"),
    ),
    (
        "tmp$1",
        "browse",
        None,
        True,
        Temporary.OTHERS,
        False,
        (DENIED, f"cannot browse temporary queue 'tmp$1': {OWNER}"),
    ),
    ("tmp$1@r2", "send", None, True, None, False, Access.RESOLVE),
    ("tmp$1@r2", "send", CLOSED, False, None, False, Access.RESOLVE),
    # a durable subscription's queue: never as a queue (here; another router's is another '$' name)
    ("c$s", "receive", OPEN, True, None, True, (DENIED, f"cannot receive queue 'c$s' {DURABLE}")),
    ("c$s", "send", None, True, None, True, (DENIED, f"cannot send queue 'c$s' {DURABLE}")),
    ("c$s@r1", "browse", None, True, None, True, (DENIED, f"cannot browse queue 'c$s' {DURABLE}")),
    ("c$s@r2", "send", None, True, None, True, (DENIED, f"cannot send queue 'c$s@r2': {DOLLAR}")),
    # any other '$' name: a grant naming it, and it must exist
    ("rt$x", "send", None, True, None, False, (DENIED, f"cannot send queue 'rt$x': {DOLLAR}")),
    ("rt$x@r1", "receive", None, True, None, False, (DENIED, f"cannot receive queue 'rt$x@r1': {DOLLAR}")),
    ("rt$x", "send", CLOSED, True, None, False, (DENIED, "user u may not send on queue 'rt$x'")),
    ("rt$x", "send", OPEN, True, None, False, Access.EXISTING),
    ("rt$x", "receive", OPEN, False, None, False, Access.EXISTING),
    ("rt$x@r2", "send", OPEN, True, None, False, Access.EXISTING),
]


@pytest.mark.parametrize(
    ("address", "action", "grants", "create", "temporary", "durable", "expected"),
    QUEUE_ROWS,
    ids=[f"{row[1]}-{row[0] or 'empty'}-{i}" for i, row in enumerate(QUEUE_ROWS)],
)
def test_queue_access(address, action, grants, create, temporary, durable, expected):
    answer = queue_access(
        address,
        action,
        router=HERE,
        grants=grants,
        create=create,
        temporary=temporary or Temporary.MISSING,
        durable=durable,
    )
    if isinstance(expected, Access):
        assert answer is expected
    else:
        assert isinstance(answer, Refused)
        assert (answer.condition, str(answer)) == expected


TOPICS = Grants(topics={"a.b": frozenset({"publish", "subscribe"}), "a.%": frozenset({"subscribe"})})

# address, action, available, wildcards, grants → the topic's name, or (condition, text) of the refusal
TOPIC_ROWS = [
    (None, "publish", True, False, None, (INVALID, "an address is required")),
    ("", "subscribe", False, False, None, (INVALID, "an address is required")),
    ("a.b", "publish", False, False, None, (NOT_FOUND, "topics are not available: sys$topicmanager is not running")),
    ("a.b", "publish", True, False, None, "a.b"),
    ("a.b", "durable", True, False, None, "a.b"),
    ("a/b", "subscribe", True, False, None, "a/b"),  # one level
    ("a.b", "publish", True, False, TOPICS, "a.b"),
    ("a.b", "durable", True, False, TOPICS, (DENIED, "user u may not durable on topic 'a.b'")),
    ("a.c", "publish", True, False, TOPICS, (DENIED, "user u may not publish on topic 'a.c'")),
    ("a.*", "subscribe", True, True, TOPICS, "a.%"),
    ("a.b.#", "subscribe", True, True, None, "a.b"),
    ("a.*", "subscribe", True, False, None, "a.*"),  # without topic-wildcards '*' is a name
    (
        "*.b",
        "subscribe",
        True,
        True,
        None,
        (INVALID, "topic '*.b': the root level may not be a wildcard (it names the topic broker)"),
    ),
    ("a.#.b", "subscribe", True, True, None, (INVALID, "topic 'a.#.b': '#' is supported as the last level only")),
    ("a..b", "publish", True, False, None, (INVALID, "topic 'a..b' has an empty level")),
    ("a..b", "publish", True, False, CLOSED, (INVALID, "topic 'a..b' has an empty level")),  # the name first
]


@pytest.mark.parametrize(
    ("address", "action", "available", "wildcards", "grants", "expected"),
    TOPIC_ROWS,
    ids=[f"{row[1]}-{row[0] or 'empty'}-{i}" for i, row in enumerate(TOPIC_ROWS)],
)
def test_topic_access(address, action, available, wildcards, grants, expected):
    answer = topic_access(address, action, available=available, wildcards=wildcards, grants=grants)
    if isinstance(expected, str):
        assert answer == expected
    else:
        assert isinstance(answer, Refused)
        assert (answer.condition, str(answer)) == expected
