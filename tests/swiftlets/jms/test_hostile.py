"""What a hostile or careless client could do to a router, each against a live
listener with real proton clients, and each followed by a normal client that must still be
served.

- ``$`` names: temporary queues take replies from anyone but receivers only from their own
  connection; a durable subscription's queue is used only as the subscription; other ``$``
  names need a grant naming them and are never created by a client; a refused attach
  creates nothing. With authentication on and off.
- Durable subscriptions whose queue name cannot exist are refused before anything is
  stored, and a stored record that cannot be restored is set aside at start, not fatal.
- Malformed messages (application-properties against part 3 §3.2.5, broken framing,
  header fields of the wrong type) are rejected before anything is queued, and a selector
  that meets an unreadable stored message skips it instead of crashing its connection.
"""

from __future__ import annotations

import json
import logging
import re
import uuid

import proton
import pytest
import trio
from proton import Delivery, Message
from proton.reactor import Container, Copy, DurableSubscription, Selector
from proton.utils import BlockingConnection, LinkDetached

from martinet.messaging.codec import Described, Int, Symbol, ULong, encode
from martinet.swiftlets.store.api import PutMessage, PutRecord

APP = {"user": "app", "password": "s3cret"}  # group apps: queue grant '%' (no '$' names)
EVE = {"user": "eve", "password": "pw"}  # group public: no grants at all


def in_thread(function, *args):
    return trio.to_thread.run_sync(function, *args)


def connect(url, client_id=None, **credentials):
    container = Container()
    if client_id:
        container.container_id = client_id
    return BlockingConnection(url, timeout=10, container=container, **credentials)


async def hostile_broker(amqp_broker, **options):
    """A router with authentication on; eve (no grants) added, apps granted every topic."""
    running = await amqp_broker(auth="true", **options)
    tree = running.router.management
    tree.add("/sys$authentication/users", "eve", {"password": "pw", "group": "public"})
    tree.add("/sys$authentication/groups/apps/topic-grants", "%", {})
    return running


def refused(attach, address, *, condition="amqp:unauthorized-access", match="", **options):
    """``attach(address, **options)`` (a create_sender / create_receiver) is refused with
    ``condition`` and a description matching ``match``."""
    with pytest.raises(LinkDetached, match=f"{condition}.*{match}"):
        attach(address, **options)


def durable(url, client_id, name, topic="topic://audit", take=0, **credentials):
    """Attach the durable subscription ``name`` of ``client_id``, take ``take`` messages,
    detach (the subscription stays)."""
    connection = connect(url, client_id, **credentials)
    try:
        receiver = connection.create_receiver(topic, name=name, options=DurableSubscription())
        got = []
        for _ in range(take):
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
        receiver.link.detach()
        return got
    finally:
        connection.close()


def publish(url, address, bodies, **credentials):
    connection = connect(url, **credentials)
    try:
        sender = connection.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, durable=True, properties={"colour": "red"}))
    finally:
        connection.close()


def receive(url, address, count, selector=None, **credentials):
    connection = connect(url, **credentials)
    try:
        receiver = connection.create_receiver(address, options=Selector(selector) if selector else None)
        got = []
        for _ in range(count):
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
        return got
    finally:
        connection.close()


# -- item 3: names containing '$' --------------------------------------------------------------


async def test_another_clients_durable_subscription_queue_is_not_a_queue(amqp_broker):
    running = await hostile_broker(amqp_broker)
    url = running.url
    await in_thread(lambda: durable(url, "alice", "audit", **APP))
    await in_thread(lambda: publish(url, "topic://audit", ["a1", "a2"], **APP))

    def intrude():
        eve = connect(url, "eve", **EVE)  # no grants at all
        mallory = connect(url, "mallory", **APP)  # grant '%' on every plain queue, another client id
        try:
            for connection in (eve, mallory):
                refused(connection.create_receiver, "alice$audit", match="durable subscription's")
                refused(connection.create_sender, "alice$audit", match="durable subscription's")
                refused(connection.create_receiver, "alice$audit", name="browse", options=Copy())
                refused(connection.create_receiver, "alice$audit@r1")
        finally:
            eve.close()
            mallory.close()

    await in_thread(intrude)
    assert running.usage("alice$audit")["messages"] == 2  # nothing taken, nothing injected
    # the owner, through the subscription, gets what was published
    assert await in_thread(lambda: durable(url, "alice", "audit", take=2, **APP)) == ["a1", "a2"]


async def test_only_its_own_connection_receives_from_a_temporary_queue(amqp_broker):
    running = await hostile_broker(amqp_broker)
    url = running.url

    def request_reply():
        owner = connect(url, **APP)
        eve = connect(url, **EVE)
        other = connect(url, **APP)
        try:
            replies = owner.create_receiver(None, dynamic=True)
            reply_to = replies.link.remote_source.address
            assert reply_to.startswith("tmp$")
            for connection in (eve, other):  # no grants; or every plain-queue grant: neither may read it
                refused(connection.create_receiver, reply_to, match="only the connection that created it")
                refused(connection.create_receiver, reply_to, options=Copy())
            # anyone handed the reply-to may send to it: that is request/reply
            eve.create_sender(reply_to).send(Message(body="reply from eve"))
            other.create_sender(None).send(Message(address=reply_to, body="reply by relay"))
            got = []
            for _ in range(2):
                got.append(replies.receive(timeout=10).body)
                replies.accept()
            # a temporary queue that does not exist is not made by a send
            refused(eve.create_sender, "tmp$999", condition="amqp:not-found", match="temporary queue 'tmp\\$999'")
            return got
        finally:
            for connection in (owner, eve, other):
                connection.close()

    assert await in_thread(request_reply) == ["reply from eve", "reply by relay"]
    assert "tmp$999" not in running.router.swiftlet("sys$queuemanager").queues


async def test_a_durable_subscription_cannot_take_over_a_temporary_queue(amqp_broker):
    running = await amqp_broker()  # client id 'tmp' + subscription '1' would be the queue tmp$1
    url = running.url

    def take_over():
        owner = connect(url)
        try:
            replies = owner.create_receiver(None, dynamic=True)
            reply_to = replies.link.remote_source.address
            with pytest.raises(LinkDetached, match="amqp:invalid-field.*client id 'tmp' is reserved"):
                durable(url, "tmp", reply_to.partition("@")[0].split("$", 1)[1], topic="topic://anything")
            publish(url, reply_to, ["reply"])
            body = replies.receive(timeout=10).body
            replies.accept()
            return body
        finally:
            owner.close()

    assert await in_thread(take_over) == "reply"
    assert running.router.swiftlet("sys$topicmanager").durable_subscriptions() == {}


async def test_refused_attaches_create_no_queues_and_dollar_names_are_never_created(amqp_broker):
    running = await hostile_broker(amqp_broker)
    queues = running.router.swiftlet("sys$queuemanager").queues
    before = set(queues)

    def attempts(dollar_names):
        eve = connect(url=running.url, **EVE)
        app = connect(url=running.url, **APP)
        try:
            for n in range(25):
                if not dollar_names:  # no grant: refused, and (checked before anything is made) not created
                    refused(eve.create_sender, f"junk-{n}")
                    refused(eve.create_receiver, f"junk-{n}")
                else:
                    refused(eve.create_sender, f"eve$junk{n}", match="a system name")
                    refused(app.create_sender, f"eve$junk{n}", match="a system name")  # '%' does not count
                    refused(app.create_receiver, f"sys$junk{n}", match="a system name")
        finally:
            eve.close()
            app.close()

    await in_thread(attempts, False)
    assert set(queues) == before
    await in_thread(attempts, True)
    assert set(queues) == before
    # a normal client is served as before
    await in_thread(lambda: publish(running.url, "orders", ["o1"], **APP))
    assert await in_thread(lambda: receive(running.url, "orders", 1, **APP)) == ["o1"]


async def test_a_grant_naming_a_dollar_queue_opens_it_but_never_creates_it(amqp_broker):
    running = await hostile_broker(amqp_broker)
    tree = running.router.management
    tree.add("/sys$authentication/groups/apps/queue-grants", "ops$%", {"browse-grant": "false"})
    tree.add("/sys$queuemanager/queues", "ops$inbox", {})

    def use():
        app = connect(running.url, **APP)
        eve = connect(running.url, **EVE)
        try:
            app.create_sender("ops$inbox").send(Message(body="job"))
            receiver = app.create_receiver("ops$inbox")
            body = receiver.receive(timeout=10).body
            receiver.accept()
            refused(app.create_receiver, "ops$inbox", name="browser", options=Copy(), match="may not browse")
            refused(app.create_sender, "ops$missing", condition="amqp:not-found", match="ops\\$missing")
            refused(eve.create_sender, "ops$inbox", match="a system name")
            return body
        finally:
            app.close()
            eve.close()

    assert await in_thread(use) == "job"
    assert "ops$missing" not in running.router.swiftlet("sys$queuemanager").queues


async def test_with_authentication_off_the_system_name_rules_still_apply(amqp_broker):
    running = await amqp_broker()  # authentication-enabled="false": everything else is granted
    url = running.url
    await in_thread(lambda: durable(url, "alice", "audit"))
    await in_thread(lambda: publish(url, "topic://audit", ["a1"]))
    queues = running.router.swiftlet("sys$queuemanager").queues

    def attempts():
        owner, other = connect(url), connect(url, "eve")
        try:
            replies = owner.create_receiver(None, dynamic=True)
            reply_to = replies.link.remote_source.address
            refused(other.create_receiver, reply_to, match="only the connection that created it")
            other.create_sender(reply_to).send(Message(body="reply"))
            assert replies.receive(timeout=10).body == "reply"
            replies.accept()
            refused(other.create_receiver, "alice$audit", match="durable subscription's")
            refused(other.create_sender, "alice$audit", match="durable subscription's")
            refused(other.create_sender, "eve$junk", match="a system name")
        finally:
            owner.close()
            other.close()

    await in_thread(attempts)
    assert "eve$junk" not in queues and running.usage("alice$audit")["messages"] == 1
    await in_thread(lambda: publish(url, "plain", ["p"]))  # everything else is granted
    assert await in_thread(lambda: receive(url, "plain", 1)) == ["p"]


# -- item 4: durable subscriptions that cannot be restored ------------------------------------


async def test_a_durable_subscription_whose_queue_cannot_exist_is_refused_and_nothing_stored(amqp_broker):
    running = await amqp_broker()
    with pytest.raises(LinkDetached, match="amqp:invalid-field.*'order service\\$audit' cannot exist"):
        await in_thread(lambda: durable(running.url, "order service", "audit"))
    await running.stop()
    await running.start()  # the router starts again: nothing was stored
    assert running.router.swiftlet("sys$store").recovered.records.get("durable", {}) == {}
    assert await in_thread(lambda: durable(running.url, "order-service", "audit")) == []  # a valid id works
    assert "order-service$audit" in running.router.swiftlet("sys$topicmanager").durable_subscriptions()


async def test_a_stored_durable_record_that_cannot_be_restored_is_set_aside(amqp_broker, caplog):
    running = await amqp_broker()
    record = {"client_id": "order service", "name": "audit", "topic": "audit", "selector": "", "no_local": False}
    await running.router.swiftlet("sys$store").commit(
        [  # as an older version stored them
            PutRecord("durable", "order service$audit", json.dumps(record).encode()),
            PutRecord("durable", "broken$json", b"{not json"),
        ]
    )
    await in_thread(lambda: durable(running.url, "good", "audit"))
    await running.stop()
    with caplog.at_level(logging.ERROR, logger="martinet.swiftlets.topicmanager"):
        await running.start()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("cannot be restored and is set aside" in e for e in errors), errors
    assert any("'order service$audit'" in e and "invalid queue name" in e for e in errors)
    tree = running.router.management
    assert tree.get("/sys$topicmanager/usage", "unrestorable") == 2
    assert "invalid queue name" in tree.get("/sys$topicmanager/usage/unrestorable/order service$audit", "reason")
    assert "JSONDecodeError" in tree.get("/sys$topicmanager/usage/unrestorable/broken$json", "reason")
    # the store keeps them; the good subscription is back and works
    assert set(running.router.swiftlet("sys$store").recovered.records["durable"]) == {
        "order service$audit",
        "broken$json",
        "good$audit",
    }
    await in_thread(lambda: publish(running.url, "topic://audit", ["a"]))
    assert await in_thread(lambda: durable(running.url, "good", "audit", take=1)) == ["a"]
    # unsubscribing deletes a set-aside record; the next start no longer sees it
    await running.router.swiftlet("sys$topicmanager").unsubscribe("order service", "audit")
    await running.stop()
    await running.start()
    assert set(running.router.swiftlet("sys$store").recovered.records["durable"]) == {"broken$json", "good$audit"}
    assert running.router.management.get("/sys$topicmanager/usage", "unrestorable") == 1


# -- item 5: malformed messages ------------------------------------------------------------------


def section(code: int, value) -> bytes:
    return encode(Described(ULong(code), value))


HEADER, PROPERTIES, APPLICATION_PROPERTIES, BODY = 0x70, 0x73, 0x74, section(0x77, "body")

MALFORMED = [  # (what, bytes, what the rejection must say)
    (
        "application-properties as a list",
        section(HEADER, [True]) + section(APPLICATION_PROPERTIES, ["k", 1]) + BODY,
        "must be a map .*found a list",
    ),
    ("an integer key", section(APPLICATION_PROPERTIES, {Int(1): "x"}) + BODY, "key at offset .* must be a string"),
    ("a symbol key", section(APPLICATION_PROPERTIES, {Symbol("k"): 1}) + BODY, "found a symbol"),
    ("a map value", section(APPLICATION_PROPERTIES, {"k": {"a": 1}}) + BODY, "value of 'k' .* is a map"),
    ("a list value", section(APPLICATION_PROPERTIES, {"k": [1, 2]}) + BODY, "value of 'k' .* is a list"),
    (
        "a described list value",
        section(APPLICATION_PROPERTIES, {"k": Described(Symbol("x"), [1])}) + BODY,
        "described list",
    ),
    ("invalid UTF-8 in a key", b"\x00\x53\x74\xc1\x06\x02\xa1\x02\xff\xfe\x40" + BODY, "invalid UTF-8"),
    ("an odd count", b"\x00\x53\x74\xc1\x03\x01\xa1\x00" + BODY, "even count"),
    ("a map past the end", section(HEADER, [True]) + b"\x00\x53\x74\xc1\x20\x02\xa1\x01k", "size says"),
    (
        "properties whose count lies",
        section(HEADER, [True]) + b"\x00\x53\x73\xd0\x00\x00\x00\x05\xff\xff\xff\xff\x40" + BODY,
        "properties at offset .*: its fields run past the end of the message",
    ),
    (
        "sections out of order",
        section(APPLICATION_PROPERTIES, {"k": 1}) + section(PROPERTIES, ["id"]) + BODY,
        "out of order",
    ),
    ("garbage after the header", section(HEADER, [True]) + b"\xff\xff\xff", "expected a described section"),
    ("a priority that is a string", section(HEADER, [True, "high"]) + BODY, "priority\\) must be a number"),
    ("a ttl that is a string", section(HEADER, [True, None, "soon"]) + BODY, "ttl\\) must be a number"),
    (
        "a first-acquirer that is a string",
        section(HEADER, [True, None, None, "yes"]) + BODY,
        "first-acquirer\\) must be a boolean",
    ),
    (
        "a header whose count lies (a redelivery decodes it)",
        b"\x00\x53\x70\xc0\x09\x6d\x41\x50\x03\x70\x00\x00\x13\x88" + BODY,
        "bad header section: .*at offset",
    ),
    (
        "an expiry time that is a string",
        section(PROPERTIES, ["id", None, None, None, None, None, None, None, "soon"]) + BODY,
        "absolute-expiry-time\\) must be a timestamp",
    ),
    # a message-id is a ulong, uuid, binary or string (AMQP 1.0 §3.2.11): duplicate
    # detection keys on it
    ("a message-id that is a list", section(PROPERTIES, [[1, 2]]) + BODY, "message-id\\) must be a ulong, uuid"),
    ("a message-id that is a map", section(PROPERTIES, [{"a": 1}]) + BODY, "message-id\\) must be .* found dict"),
    ("a message-id that is a boolean", section(PROPERTIES, [True]) + BODY, "message-id\\) must be .* found bool"),
]


class Raw:
    """Bytes sent as a message as they are (proton's Sender.send calls ``send`` on it)."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def send(self, sender, tag=None):
        delivery = sender.delivery(tag or sender.delivery_tag())
        sender.stream(self.payload)
        sender.advance()
        return delivery


def outcome(connection, sender, payload):
    """Send ``payload`` and wait for its settlement: (state, condition name, description)."""
    delivery = sender.link.send(Raw(payload))  # the proton link: no exception, the outcome is looked at
    connection.wait(lambda: delivery.settled, timeout=10, msg="the router did not settle")
    condition = delivery.remote.condition
    return delivery.remote_state, condition and condition.name, condition and condition.description


def wedge_attempt(url, cases):
    """With a selector consumer waiting, send each malformed payload then a good message:
    every malformed one is rejected, every good one accepted and received."""
    consumer_side, producer_side = connect(url), connect(url)
    try:
        reds = consumer_side.create_receiver("wedge", options=Selector("colour = 'red'"))
        sender = producer_side.create_sender("wedge")
        results = []
        for what, payload, _ in cases:
            state, name, description = outcome(producer_side, sender, payload)
            sender.send(Message(body=f"after {what}", properties={"colour": "red"}))  # raises unless accepted
            got = reds.receive(timeout=10).body
            reds.accept()
            results.append((what, state, name, description, got))
        return results
    finally:
        consumer_side.close()
        producer_side.close()


async def test_malformed_messages_are_rejected_before_anything_is_queued(amqp_broker):
    running = await amqp_broker()
    for attempt in ("first start", "after a restart"):
        if attempt == "after a restart":
            await running.stop()
            await running.start()
        results = await in_thread(wedge_attempt, running.url, MALFORMED)
        for (what, state, name, description, got), (_, _, expected) in zip(results, MALFORMED, strict=True):
            # amqp:decode-error for what does not decode, amqp:invalid-field for a wrong type
            assert state == Delivery.REJECTED and name in ("amqp:decode-error", "amqp:invalid-field"), (
                attempt,
                what,
                state,
                name,
            )
            assert re.search(expected, description), (attempt, what, description)  # what is wrong
            assert re.search("at offset [0-9]+|field [0-9]", description), (attempt, what, description)  # where
            assert got == f"after {what}", (attempt, what, got)  # the selector consumer goes on
        usage = running.usage("wedge")
        assert (usage["messages"], usage["enqueued"]) == (0, len(MALFORMED)), usage  # only the good ones


async def test_a_malformed_message_to_a_topic_is_rejected(amqp_broker):
    running = await amqp_broker()

    def publish_bad():
        listener, publisher = connect(running.url), connect(running.url)
        try:
            everything = listener.create_receiver("topic://news", name="everything")
            reds = listener.create_receiver("topic://news", name="reds", options=Selector("colour = 'red'"))
            sender = publisher.create_sender("topic://news")
            results = [outcome(publisher, sender, payload)[:2] for _, payload, _ in MALFORMED[:6]]
            sender.send(Message(body="good", properties={"colour": "red"}))
            got = [everything.receive(timeout=10).body, reds.receive(timeout=10).body]
            everything.accept()
            reds.accept()
            return results, got
        finally:
            listener.close()
            publisher.close()

    results, got = await in_thread(publish_bad)
    assert results == [(Delivery.REJECTED, "amqp:invalid-field")] * 6
    assert got == ["good", "good"]  # nothing malformed reached either subscriber


async def test_a_selector_skips_a_stored_message_it_cannot_read_and_logs_once(amqp_broker, caplog):
    running = await amqp_broker()
    unreadable = MALFORMED[0][1]  # application-properties as a list: readable framing, unreadable properties
    await running.router.swiftlet("sys$store").commit([PutMessage(1_000_000, "wedge", unreadable)])  # an old version
    await running.stop()
    await running.start()
    assert running.usage("wedge")["messages"] == 1

    def select():
        first, second, producer = connect(running.url), connect(running.url), connect(running.url)
        try:
            reds = [c.create_receiver("wedge", options=Selector("colour = 'red'")) for c in (first, second)]
            sender = producer.create_sender("wedge")
            got = []
            for n in range(6):
                sender.send(Message(body=f"red {n}", properties={"colour": "red"}))
                receiver = reds[n % 2]
                got.append(receiver.receive(timeout=10).body)
                receiver.accept()
            return sorted(got)
        finally:
            for connection in (first, second, producer):
                connection.close()

    with caplog.at_level(logging.WARNING, logger="martinet.swiftlets.queuemanager"):
        assert await in_thread(select) == [f"red {n}" for n in range(6)]
    warnings = [r.getMessage() for r in caplog.records if "cannot be evaluated" in r.getMessage()]
    assert len(warnings) == 1 and "queue wedge" in warnings[0] and "colour = 'red'" in warnings[0], warnings
    # the message stays for a consumer without a selector, as it was stored
    consumer = running.router.swiftlet("sys$queuemanager").queue("wedge").consumer()
    consumer.flow(1)
    with trio.fail_after(5):
        entry = await consumer.receive()
    assert entry.message.raw == unreadable
    consumer.accept(entry)


async def test_every_simple_property_type_still_passes(amqp_broker):
    running = await amqp_broker()
    properties = {
        "text": "héllo",
        "empty": "",
        "int": 7,
        "negative": -3,
        "long": 2**40,
        "float": 1.5,
        "true": True,
        "false": False,
        "null": None,
        "binary": b"\x00\xff",
        "uuid": uuid.UUID(int=5),
        "timestamp": proton.timestamp(1_700_000_000_000),
        "char": proton.char("x"),
        "symbol": proton.symbol("s"),
        "ubyte": proton.ubyte(200),
        "ushort": proton.ushort(60000),
        "uint": proton.uint(2**31),
        "ulong": proton.ulong(2**63),
        "byte": proton.byte(-1),
        "short": proton.short(-300),
        "int32": proton.int32(-70000),
        "float32": proton.float32(0.5),
        "long text": "x" * 300,
        "decimal32": proton.decimal32(7),
        "decimal64": proton.decimal64(8),
        "decimal128": proton.decimal128(b"\x01" * 16),
    }

    def round_trip():
        connection = connect(running.url)
        try:
            connection.create_sender("typed").send(Message(body="typed", properties=properties, durable=True))
            receiver = connection.create_receiver("typed", options=Selector("int = 7 AND text = 'héllo'"))
            message = receiver.receive(timeout=10)
            receiver.accept()
            return message.properties
        finally:
            connection.close()

    assert await in_thread(round_trip) == properties


async def test_a_body_the_router_cannot_decode_is_passed_through_and_viewed_as_unreadable(amqp_broker, caplog):
    """The router does not read bodies, so one nested deeper than the codec's bound is queued
    like any other; management's ``view`` of its queue used to fail whole with a traceback in
    the log (MessageError out of the operation). The body is shown as unreadable now, and the
    messages around it as they are."""
    running = await amqp_broker()
    nested = b"\x45"
    for _ in range(100):  # a list of one list of one list ..., beyond the 64 levels decoded
        nested = b"\xd0" + (len(nested) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + nested
    deep = section(HEADER, [True]) + b"\x00\x53\x77" + nested

    def send():
        connection = connect(running.url)
        try:
            sender = connection.create_sender("opaque")
            sender.send(Message(body="before", properties={"n": 1}))
            state, _, _ = outcome(connection, sender, deep)
            sender.send(Message(body="after", properties={"n": 2}))
            return state
        finally:
            connection.close()

    assert await in_thread(send) == Delivery.ACCEPTED
    with caplog.at_level(logging.INFO):
        view = await running.router.management.invoke("/sys$queuemanager/usage/queues/opaque", "view", count=10)
    assert [m["body"] for m in view[::2]] == ["before", "after"]
    assert [m["properties"] for m in view] == [{"n": 1}, {}, {"n": 2}]
    assert "nested deeper than 64" in view[1]["body"]["unreadable"]
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert running.usage("opaque")["messages"] == 3  # a view consumes nothing


async def test_refused_transfers_and_attaches_are_logged_limited_per_host(amqp_broker, caplog, monkeypatch):
    """A client repeating what is refused — a malformed message 60 times, 30 attaches it has
    no grant for — used to write an INFO line per attempt, without bound. Now at most LIMIT
    lines per host and period, then the count in one line when the next period starts; every
    attempt is still answered (rejected, refused)."""
    from martinet.swiftlets.jms.listener import BrokenInputLog

    monkeypatch.setattr(BrokenInputLog, "PERIOD", 3600.0)  # all of it within one period, however slow
    running = await hostile_broker(amqp_broker)
    bad = MALFORMED[0][1]

    def attempts():
        app, eve = connect(running.url, **APP), connect(running.url, **EVE)
        try:
            sender = app.create_sender("limited")
            states = {outcome(app, sender, bad)[0] for _ in range(60)}
            for n in range(30):
                refused(eve.create_sender, f"junk-{n}")
            return states
        finally:
            app.close()
            eve.close()

    def attempt_once():
        eve = connect(running.url, **EVE)
        try:
            refused(eve.create_sender, "junk-last")
        finally:
            eve.close()

    def refusal_lines():
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "martinet.swiftlets.jms.listener" and " refused: " in r.getMessage()
        ]

    with caplog.at_level(logging.INFO, logger="martinet.swiftlets.jms.listener"):
        assert await in_thread(attempts) == {Delivery.REJECTED}
        lines = refusal_lines()
        assert len(lines) == BrokenInputLog.LIMIT, lines
        assert lines[0].startswith("transfer to limited from 127.0.0.1 refused: malformed message"), lines[0]
        monkeypatch.setattr(BrokenInputLog, "PERIOD", 0.0)  # the next refusal starts a period: the count comes
        await in_thread(attempt_once)
    assert refusal_lines()[-1].startswith("attach from 127.0.0.1 refused: ")
    summaries = [r.getMessage() for r in caplog.records if "not logged one by one" in r.getMessage()]
    assert len(summaries) == 1 and re.fullmatch(
        rf"{60 + 30 - BrokenInputLog.LIMIT} more refusals of transfers or attaches from 127\.0\.0\.1 in \d+ s "
        r"\(not logged one by one\)",
        summaries[0],
    ), summaries


async def test_a_hostile_like_selector_does_not_stall_the_router(amqp_broker):
    # A backtracking LIKE took seconds per message for this selector on a 40-character
    # value, on the router's one event-loop thread: every other client waited.
    running = await amqp_broker()
    hostile = "p LIKE '%a%a%a%a%a%a%a%a%a%a%b'"
    near, match = "a" * 1000, "a" * 999 + "b"

    def clients():
        selecting, producer, other = connect(running.url), connect(running.url), connect(running.url)
        try:
            receiver = selecting.create_receiver("hostile", options=Selector(hostile))
            sender = producer.create_sender("hostile")
            sender.send(Message(body="near", properties={"p": near}))
            sender.send(Message(body="match", properties={"p": match}))
            # an unrelated client's messages go round while the selector is evaluated
            other_sender, other_receiver = other.create_sender("other"), other.create_receiver("other")
            for n in range(20):
                other_sender.send(Message(body=n))
            others = []
            for _ in range(20):
                others.append(other_receiver.receive(timeout=10).body)
                other_receiver.accept()
            got = receiver.receive(timeout=10).body
            receiver.accept()
            return others, got
        finally:
            for connection in (selecting, producer, other):
                connection.close()

    assert await in_thread(clients) == (list(range(20)), "match")
    assert running.usage("hostile")["messages"] == 1  # "near" stays, for a consumer it matches
