"""Messages through sys$jms as clients nobody here wrote see them, with
python-qpid-proton over real sockets: message annotations pass through with their AMQP
types, an undecodable message is refused alone (the link goes on), the header's
delivery-count and first-acquirer follow AMQP 1.0 §3.2.1, and the modified outcome
(§3.4.5) is honoured in full: delivery-failed, undeliverable-here and message-annotations."""

from __future__ import annotations

import trio
from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Delivery,
    Described,
    Message,
    byte,
    char,
    float32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
)
from proton.reactor import Selector
from proton.utils import BlockingConnection

from martinet.messaging.codec import Described as OurDescribed
from martinet.messaging.codec import ULong, encode
from martinet.messaging.message import Message as OurMessage
from martinet.swiftlets.queuemanager.queue import Entry

from tests.harness.polling import wait_until

CLIENT_ID = symbol("x-opt-martinet-cid")


def in_thread(function, *args):
    return trio.to_thread.run_sync(function, *args)


def flush(connection: BlockingConnection) -> None:
    """Run proton's I/O until everything it has to send (a disposition) is written."""
    transport = connection.conn.transport
    connection.wait(lambda: transport.pending() <= 0, timeout=10, msg="flushing")


def send_raw(connection: BlockingConnection, sender, raw: bytes, tag: str):
    """Send ``raw`` as one message (bytes proton would not encode itself); the settled
    delivery, with the router's outcome in ``remote_state`` / ``remote.condition``."""
    link = sender.link
    delivery = link.delivery(tag)
    link.send(raw)
    link.advance()
    connection.wait(lambda: delivery.settled, timeout=10, msg="waiting for the outcome")
    return delivery


def modify(connection: BlockingConnection, receiver, *, failed=False, undeliverable=False, annotations=None):
    """Settle the oldest unsettled message of ``receiver`` with the modified outcome."""
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.local.failed = failed
    delivery.local.undeliverable = undeliverable
    if annotations is not None:
        delivery.local.annotations = annotations
    delivery.update(Delivery.MODIFIED)
    delivery.settle()
    flush(connection)


def section(code: int, value) -> bytes:
    return encode(OurDescribed(ULong(code), value))


# Annotations of many AMQP types, as Qpid JMS and other clients send them.
TYPED_ANNOTATIONS = {
    symbol("x-opt-jms-msg-type"): byte(5),
    symbol("x-opt-jms-dest"): byte(0),
    symbol("x-opt-ubyte"): ubyte(200),
    symbol("x-opt-short"): short(-3),
    symbol("x-opt-uint"): uint(7),
    symbol("x-opt-ulong"): ulong(2**40),
    symbol("x-opt-float"): float32(1.5),
    symbol("x-opt-char"): char("é"),
    symbol("x-opt-timestamp"): timestamp(1700000000000),
    symbol("x-opt-array"): Array(UNDESCRIBED, Data.INT, 1, 2, 3),
    symbol("x-opt-described"): Described(symbol("x-opt:thing"), ubyte(1)),
    symbol("x-opt-list"): [ubyte(1), "s", float32(2.5)],
    symbol("x-opt-map"): {symbol("k"): uint(1)},
    ulong(42): "a ulong key",
}


async def test_annotations_keep_their_amqp_types_and_the_client_id_is_added(amqp_broker):
    """[3.2.10] The router adds x-opt-martinet-cid by splicing it into the map: every other
    annotation comes back with its own type (Qpid JMS casts x-opt-jms-msg-type to a byte),
    and an array among them neither breaks the message nor the connection."""
    running = await amqp_broker()

    def round_trip(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            connection.create_sender("typed").send(Message(body="typed", annotations=TYPED_ANNOTATIONS))
            receiver = connection.create_receiver("typed")
            got = receiver.receive(timeout=10)
            receiver.accept()
            return connection.container.container_id, got.annotations
        finally:
            connection.close()

    container_id, annotations = await in_thread(round_trip, running.url)
    assert annotations.pop(CLIENT_ID) == container_id
    assert annotations == TYPED_ANNOTATIONS
    for key, value in TYPED_ANNOTATIONS.items():
        assert type(annotations[key]) is type(value), key


async def test_an_undecodable_message_is_rejected_alone_and_the_link_goes_on(amqp_broker):
    """A message with an array annotation is taken like any other; one whose annotations
    cannot be decoded is rejected with amqp:decode-error; the same link then sends on."""
    running = await amqp_broker()
    # message-annotations: a map8 of three elements (a key without its value), then a body
    broken = b"\x00\x53\x72\xc1\x06\x03\xa3\x01a\x41\x40" + section(0x77, "broken")

    def send_three(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            sender = connection.create_sender("robust")
            with_array = Message(body="array", annotations={symbol("x-opt-array"): Array(UNDESCRIBED, Data.LONG, 1, 2)})
            first = sender.send(with_array)
            refused = send_raw(connection, sender, broken, "broken")
            last = sender.send(Message(body="after"))
            receiver = connection.create_receiver("robust")
            got = []
            for _ in range(2):
                got.append(receiver.receive(timeout=10))
                receiver.accept()
            return (
                first.remote_state,
                refused.remote_state,
                refused.remote.condition,
                last.remote_state,
                [m.body for m in got],
                got[0].annotations[symbol("x-opt-array")],
            )
        finally:
            connection.close()

    first, refused, condition, last, bodies, array = await in_thread(send_three, running.url)
    assert (first, last) == (Delivery.ACCEPTED, Delivery.ACCEPTED)
    assert refused == Delivery.REJECTED
    assert condition.name == "amqp:decode-error" and "message-annotations" in condition.description
    assert bodies == ["array", "after"]
    assert array == Array(UNDESCRIBED, Data.LONG, 1, 2)


async def test_delivery_count_counts_on_from_the_producers_and_first_acquirer_clears(amqp_broker):
    """[3.2.1] delivery-count is what the producer sent plus one per failed delivery
    (modified with delivery-failed; released does not count), and first-acquirer is false
    once the message has been acquired before. A message without a header counts from 0."""
    running = await amqp_broker()
    headerless = section(0x77, "headerless")  # no header section at all

    def scenario(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            sender = connection.create_sender("counted")
            sender.send(Message(body="counted", delivery_count=3, first_acquirer=True))
            send_raw(connection, sender, headerless, "headerless")
            receiver = connection.create_receiver("counted")
            seen = []

            def take():
                message = receiver.receive(timeout=10)
                seen.append((message.body, message.delivery_count, message.first_acquirer))

            take()
            modify(connection, receiver, failed=True)
            take()
            receiver.release(delivered=False)  # released: not a failed delivery
            take()
            receiver.accept()
            take()
            modify(connection, receiver, failed=True)
            take()
            receiver.accept()
            return seen
        finally:
            connection.close()

    assert await in_thread(scenario, running.url) == [
        ("counted", 3, True),  # as the producer sent it
        ("counted", 4, False),
        ("counted", 4, False),
        ("headerless", 0, False),
        ("headerless", 1, False),
    ]


async def test_undeliverable_here_goes_to_another_link_never_back_to_the_same(amqp_broker):
    """[3.4.5] modified with undeliverable-here: "the message should not be redelivered to
    the same link" — with credit, the first link is passed over; the second link gets it."""
    running = await amqp_broker()
    queue = running.router.swiftlet("sys$queuemanager").queue("shared")

    def refuse(url):
        connection = BlockingConnection(url, timeout=10)
        connection.create_sender("shared").send(Message(body="m"))
        first = connection.create_receiver("shared")
        body = first.receive(timeout=10).body
        modify(connection, first, undeliverable=True)
        first.link.flow(5)
        flush(connection)
        return connection, first, body

    connection, first, body = await in_thread(refuse, running.url)
    assert body == "m"
    # The refusal came before the new credit: the first link had credit and was passed over.
    await wait_until(lambda: queue.available == 1 and queue.consumers[0].credit == 5)

    def second_link(url):
        other = BlockingConnection(url, timeout=10)
        try:
            second = other.create_receiver("shared")
            message = second.receive(timeout=10)
            second.accept()
            return message.body, message.delivery_count, message.first_acquirer
        finally:
            other.close()

    assert await in_thread(second_link, running.url) == ("m", 0, False)  # not a failed delivery
    await wait_until(lambda: queue.size == 0)

    def first_link_goes_on():
        try:
            assert not first.fetcher.has_message  # "m" never came back to it
            connection.create_sender("shared", name="another-sender").send(Message(body="n"))
            message = first.receive(timeout=10)
            first.accept()
            return message.body
        finally:
            connection.close()

    assert await in_thread(first_link_goes_on) == "n"


async def test_undeliverable_here_on_the_only_link_waits_for_another_link(amqp_broker):
    """With the refusing link as the only consumer the message stays in the queue; once that
    link detaches, a new link (on the same connection) gets it."""
    running = await amqp_broker()
    queue = running.router.swiftlet("sys$queuemanager").queue("alone")

    def refuse(url):
        connection = BlockingConnection(url, timeout=10)
        connection.create_sender("alone").send(Message(body="m"))
        receiver = connection.create_receiver("alone")
        receiver.receive(timeout=10)
        modify(connection, receiver, undeliverable=True)
        receiver.link.flow(5)
        flush(connection)
        return connection, receiver

    connection, receiver = await in_thread(refuse, running.url)
    await wait_until(lambda: queue.available == 1 and queue.consumers[0].credit == 5)
    assert not receiver.fetcher.has_message

    def new_link():
        try:
            receiver.close()
            again = connection.create_receiver("alone")
            message = again.receive(timeout=10)
            again.accept()
            return message.body
        finally:
            connection.close()

    assert await in_thread(new_link) == "m"


async def test_modified_annotations_are_merged_and_survive_a_restart(amqp_broker):
    """[3.4.5] The modified outcome's message-annotations are merged into the message for
    its redelivery, next to the annotations it had (their types kept); a persistent
    message keeps them across a restart."""
    running = await amqp_broker()

    def annotate(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            connection.create_sender("noted").send(
                Message(body="note", durable=True, annotations={symbol("x-opt-jms-msg-type"): byte(5)})
            )
            receiver = connection.create_receiver("noted")
            receiver.receive(timeout=10)
            modify(connection, receiver, failed=True, annotations={symbol("x-opt-foo"): 1})
            message = receiver.receive(timeout=10)
            receiver.release(delivered=False)  # back to the queue for after the restart
            return message.annotations, message.delivery_count
        finally:
            connection.close()

    def take(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            receiver = connection.create_receiver("noted")
            message = receiver.receive(timeout=10)
            receiver.accept()
            return message.annotations, message.delivery_count
        finally:
            connection.close()

    for step in (annotate, take):
        annotations, count = await in_thread(step, running.url)
        assert annotations[symbol("x-opt-foo")] == 1 and count == 1
        assert type(annotations[symbol("x-opt-jms-msg-type")]) is byte and CLIENT_ID in annotations
        if step is annotate:
            await wait_until(lambda: running.usage("noted")["available"] == 1)  # the release arrived
            await running.stop()
            await running.start()


async def test_a_selector_consumer_passes_over_a_message_whose_properties_cannot_be_read(amqp_broker):
    """Defence in depth: the listener refuses a message whose application-properties do not
    decode, so only a message put in the queue some other way (here: directly) can meet a
    selector that cannot read it. Its identifiers are unknown (not selected), and neither the
    consumer's connection nor the queue's dispatch fails on it."""
    running = await amqp_broker()
    queue = running.router.swiftlet("sys$queuemanager").queue("sel")
    unreadable = b"\x00\x53\x74\xc1\x03\x02\x02\x02" + section(0x77, "unreadable")  # 0x02: no such type
    queue.add(Entry(10**12, OurMessage(unreadable), 4, None, False))

    def scenario(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            receiver = connection.create_receiver("sel", options=Selector("colour = 'red'"))
            connection.create_sender("sel").send(Message(body="red", properties={"colour": "red"}))
            message = receiver.receive(timeout=10)
            receiver.accept()
            return message.body
        finally:
            connection.close()

    assert await in_thread(scenario, running.url) == "red"
    await wait_until(lambda: queue.size == 1)
    assert [entry.message.raw for entry in queue.browse()] == [unreadable]  # still there, as it was


async def test_a_queued_message_that_cannot_go_out_again_goes_to_routerdlq_and_the_link_goes_on(amqp_broker):
    """Defence in depth: the listener refuses a message whose header cannot be read, so only a
    message put in the queue some other way (here: directly) can fail to get its header
    rewritten for a redelivery. It goes to routerdlq; the link delivers the next message."""
    running = await amqp_broker()
    manager = running.router.swiftlet("sys$queuemanager")
    queue = manager.queue("odd")
    broken_header = b"\x00\x53\x70\xc0\x03\x05\x40\x40" + section(0x77, "odd")  # says 5 elements, holds 2
    queue.add(Entry(10**12, OurMessage(broken_header), 4, None, False, delivery_count=1, acquired=True))

    def scenario(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            connection.create_sender("odd").send(Message(body="fine"))
            receiver = connection.create_receiver("odd")
            message = receiver.receive(timeout=10)
            receiver.accept()
            return message.body
        finally:
            connection.close()

    assert await in_thread(scenario, running.url) == "fine"
    await wait_until(lambda: running.usage("routerdlq")["messages"] == 1 and queue.size == 0)


async def test_a_dead_lettered_message_keeps_its_annotation_types(amqp_broker):
    """Dead-lettering adds x-opt-martinet-dlq-reason/-queue with the same splice."""
    running = await amqp_broker()

    def reject_then_read_the_dlq(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            connection.create_sender("doomed").send(Message(body="doomed", annotations=TYPED_ANNOTATIONS))
            receiver = connection.create_receiver("doomed")
            receiver.receive(timeout=10)
            receiver.reject()
            dlq = connection.create_receiver("routerdlq")
            message = dlq.receive(timeout=10)
            dlq.accept()
            return message.annotations
        finally:
            connection.close()

    annotations = await in_thread(reject_then_read_the_dlq, running.url)
    assert annotations.pop(symbol("x-opt-martinet-dlq-queue")) == "doomed"
    assert annotations.pop(symbol("x-opt-martinet-dlq-reason")) == "rejected by the client"
    annotations.pop(CLIENT_ID)
    assert annotations == TYPED_ANNOTATIONS
    assert {key: type(value) for key, value in annotations.items()} == {
        key: type(value) for key, value in TYPED_ANNOTATIONS.items()
    }
