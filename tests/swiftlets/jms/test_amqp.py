"""sys$jms with real AMQP 1.0 clients (python-qpid-proton) over real sockets: queues,
outcomes, persistence, SASL against sys$authentication, refused attaches, bad input."""

from __future__ import annotations

import socket

import proton
import pytest
import trio
from proton import ConnectionException, Disposition, Message
from proton.handlers import MessagingHandler
from proton.reactor import Selector
from proton.utils import BlockingConnection, LinkDetached, SendException

from martinet.kernel import ManagementError, Router

from tests.harness.polling import wait_until
from tests.harness.routers import amqp_router_xml as router_xml


@pytest.fixture
def broker(amqp_broker):
    return amqp_broker


def in_thread(function, *args):
    return trio.to_thread.run_sync(function, *args)


def send(url, address, bodies, **connect):
    connection = BlockingConnection(url, timeout=10, **connect)
    try:
        sender = connection.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, durable=True))
    finally:
        connection.close()


def receive(url, address, count, *, outcome="accept", **connect):
    connection = BlockingConnection(url, timeout=10, **connect)
    try:
        receiver = connection.create_receiver(address)
        got = []
        for _ in range(count):
            message = receiver.receive(timeout=10)
            got.append((message.body, message.delivery_count))
            getattr(receiver, outcome)()
        return got
    finally:
        connection.close()


async def test_send_and_receive_through_a_queue(broker):
    running = await broker()
    await in_thread(send, running.url, "orders", [f"order {n}" for n in range(20)])
    got = await in_thread(receive, running.url, "orders", 20)
    assert [body for body, _ in got] == [f"order {n}" for n in range(20)]
    await wait_until(lambda: running.connections() == 0)  # the last acceptances are in
    assert (running.usage("orders")["enqueued"], running.usage("orders")["messages"]) == (20, 0)


async def test_persistent_messages_survive_a_restart(broker):
    running = await broker()
    await in_thread(send, running.url, "keep", ["a", "b"])
    await running.stop()
    await running.start()
    assert [body for body, _ in await in_thread(receive, running.url, "keep", 2)] == ["a", "b"]


async def test_released_and_rejected_messages(broker):
    running = await broker()
    await in_thread(send, running.url, "work", ["first", "second"])
    assert await in_thread(lambda: receive(running.url, "work", 1, outcome="release")) == [("first", 0)]
    assert await in_thread(lambda: receive(running.url, "work", 1, outcome="reject")) == [("first", 0)]
    await wait_until(lambda: running.connections() == 0)
    assert running.usage("routerdlq")["messages"] == 1
    assert await in_thread(receive, running.url, "work", 1) == [("second", 0)]


async def test_unsettled_messages_come_back_redelivered(broker):
    running = await broker()
    await in_thread(send, running.url, "again", ["m"])

    def take_and_vanish(url):
        connection = BlockingConnection(url, timeout=10)
        receiver = connection.create_receiver("again")
        receiver.receive(timeout=10)  # never settled
        connection.close()

    await in_thread(take_and_vanish, running.url)
    assert await in_thread(receive, running.url, "again", 1) == [("m", 1)]  # delivery-count travels


async def test_plain_login_against_the_authentication_swiftlet(broker):
    running = await broker(auth="true")
    await in_thread(lambda: send(running.url, "jobs", ["x"], user="app", password="s3cret"))
    with pytest.raises(Exception, match="(?i)auth|sasl"):
        await in_thread(lambda: send(running.url, "jobs", ["y"], user="app", password="wrong"))
    with pytest.raises(Exception, match="(?i)auth|sasl"):
        await in_thread(lambda: send(running.url, "jobs", ["y"]))  # anonymous is not allowed
    with pytest.raises(LinkDetached, match="amqp:unauthorized-access.*may not receive on queue 'secret'"):
        await in_thread(lambda: receive(running.url, "secret", 1, user="app", password="s3cret"))
    assert running.usage("jobs")["messages"] == 1


async def test_unknown_queue_is_not_found(broker):
    running = await broker(autocreate="false")
    with pytest.raises(LinkDetached, match="amqp:not-found.*queue 'nowhere' does not exist on router r1"):
        await in_thread(send, running.url, "nowhere", ["x"])
    await in_thread(send, running.url, "unroutable", ["predefined queues exist"])
    assert running.usage("unroutable")["messages"] == 1


async def test_garbage_is_refused_and_the_router_keeps_serving(broker):
    running = await broker()

    def garbage(port, payload):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(payload)
            raw.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := raw.recv(4096):
                reply += chunk
            return reply

    sasl_header, amqp_header = b"AMQP\x03\x01\x00\x00", b"AMQP\x00\x01\x00\x00"
    mechanisms = b"\x00\x00\x00\x22\x02\x01\x00\x00\x00\x53\x40\xc0\x15\x01\xe0\x12\x02\xa3\x05PLAIN\x09ANONYMOUS"
    for payload, answer in [
        (b"GET / HTTP/1.1\r\n\r\n", sasl_header),  # not AMQP: our header, then the socket closes
        (b"\x00" * 3, sasl_header),  # cannot become a header: the same, without waiting for more
        (sasl_header + b"\xff" * 64, sasl_header + mechanisms),  # a frame too large for SASL: closed
        (amqp_header + b"\x00\x00\x00\x08\x02\x00\x00\x00garbage", amqp_header),  # a frame cut short, then EOF
    ]:
        assert await in_thread(garbage, running.port, payload) == answer, payload
    await in_thread(send, running.url, "still", ["fine"])
    assert await in_thread(receive, running.url, "still", 1) == [("fine", 0)]


async def test_connections_past_max_connections_are_closed(broker):
    running = await broker(maxconn="1")
    first = await in_thread(lambda: BlockingConnection(running.url, timeout=10))
    # Refused with an AMQP close that says why, not a bare socket close.
    with pytest.raises(ConnectionException, match="amqp:resource-limit-exceeded.*max-connections 1 reached"):
        await in_thread(lambda: BlockingConnection(running.url, timeout=5))
    usage = running.router.management.resolve("/sys$jms/usage/listeners/amqp").properties()
    assert (usage["connections"], usage["accepted"], usage["refused"]) == (1, 1, 1)
    await in_thread(first.close)


async def test_topics_fan_out_to_every_subscriber(broker):
    running = await broker()

    def subscribe_then_publish(url):
        listeners = [BlockingConnection(url, timeout=10) for _ in range(2)]
        receivers = [c.create_receiver("topic://news.sport") for c in listeners]
        receivers.append(listeners[0].create_receiver("topic://news"))  # a parent node
        publisher = BlockingConnection(url, timeout=10)
        publisher.create_sender("topic://news.sport").send(Message(body="goal"))
        publisher.create_sender("topic://news.politics").send(Message(body="vote"))
        got = [[r.receive(timeout=10).body] for r in receivers]
        got[2].append(receivers[2].receive(timeout=10).body)  # the parent gets both
        for receiver in receivers:
            receiver.accept()
        for connection in [*listeners, publisher]:
            connection.close()
        return got

    assert await in_thread(subscribe_then_publish, running.url) == [["goal"], ["goal"], ["goal", "vote"]]
    # the client's close returns when the router answered it; the router drops the
    # connection's links (and their interest) as it ends the connection, just after
    await wait_until(lambda: running.connections() == 0)
    assert running.router.swiftlet("sys$topicmanager").interest() == frozenset()  # gone with the links


async def test_request_reply_with_a_dynamic_queue_and_anonymous_relay(broker):
    running = await broker()

    def serve_one(url):
        connection = BlockingConnection(url, timeout=10)
        request = connection.create_receiver("requests").receive(timeout=10)
        relay = connection.create_sender(None)  # anonymous relay: routed by each message's address
        relay.send(Message(address=request.reply_to, body=request.body.upper(), correlation_id=request.id))
        connection.close()

    def ask(url):
        connection = BlockingConnection(url, timeout=10)
        replies = connection.create_receiver(None, dynamic=True)
        reply_to = replies.link.remote_source.address
        connection.create_sender("requests").send(Message(body="hello", reply_to=reply_to, id="q-1"))
        reply = replies.receive(timeout=10)
        replies.accept()
        connection.close()
        return reply_to, reply.body, reply.correlation_id

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, serve_one, running.url)
        reply_to, body, correlation = await in_thread(ask, running.url)
    assert reply_to.startswith("tmp$") and (body, correlation) == ("HELLO", "q-1")
    await wait_until(lambda: running.connections() == 0)
    assert reply_to not in running.router.swiftlet("sys$queuemanager").queues  # gone with its link


async def test_selectors_filter_what_a_consumer_gets(broker):
    running = await broker()

    def colours(url):
        connection = BlockingConnection(url, timeout=10)
        sender = connection.create_sender("paint")
        for n, colour in enumerate(["red", "green", "blue", "green"]):
            sender.send(Message(body=n, properties={"colour": colour}))
        greens = connection.create_receiver("paint", options=Selector("colour = 'green'"))
        got = []
        for _ in range(2):
            got.append(greens.receive(timeout=10).body)
            greens.accept()
        connection.close()
        return got

    assert await in_thread(colours, running.url) == [1, 3]
    with pytest.raises(LinkDetached, match="amqp:invalid-field.*invalid selector"):
        await in_thread(
            lambda: BlockingConnection(running.url, timeout=10).create_receiver("paint", options=Selector("colour = "))
        )


async def test_anonymous_relay_needs_an_address(broker):
    running = await broker()

    def no_address(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            connection.create_sender(None).send(Message(body="nowhere"))
        finally:
            connection.close()

    with pytest.raises(SendException) as caught:
        await in_thread(no_address, running.url)
    assert caught.value.state == Disposition.REJECTED


def transactional(url, queue, *, sends=0, receive=0, finish="abort"):
    """Run one transaction with proton's reactor: send and/or receive-and-accept, then
    commit, abort, or close the connection with the transaction still open."""
    from proton.handlers import MessagingHandler, TransactionHandler
    from proton.reactor import Container

    class Client(MessagingHandler, TransactionHandler):
        def __init__(self):
            super().__init__(prefetch=0, auto_accept=False)
            self.received = []

        def on_start(self, event):
            self.connection = event.container.connect(url)
            self.sender = event.container.create_sender(self.connection, queue)
            if receive:
                self.receiver = event.container.create_receiver(self.connection, queue)
            event.container.declare_transaction(self.connection, handler=self)

        def on_transaction_declared(self, event):
            self.transaction = event.transaction
            for n in range(sends):
                self.transaction.send(self.sender, Message(body=f"t{n}"))
            if receive:
                self.receiver.flow(receive)
            else:
                self.done()

        def on_message(self, event):
            self.received.append(event.message.body)
            self.transaction.accept(event.delivery)
            if len(self.received) == receive:
                self.done()

        def done(self):
            if finish == "commit":
                self.transaction.commit()
            elif finish == "abort":
                self.transaction.abort()
            else:
                self.connection.close()

        def on_transaction_committed(self, event):
            self.connection.close()

        def on_transaction_aborted(self, event):
            self.connection.close()

    client = Client()
    Container(client).run()
    return client.received


async def test_transactions_commit_abort_and_connection_loss(broker):
    running = await broker()
    queue_manager = running.router.swiftlet("sys$queuemanager")
    await in_thread(lambda: transactional(running.url, "txq", sends=3, finish="abort"))
    assert queue_manager.queue("txq").size == 0  # aborted sends never appear
    await in_thread(lambda: transactional(running.url, "txq", sends=3, finish="vanish"))
    await wait_until(lambda: running.connections() == 0)
    assert queue_manager.queue("txq").size == 0  # a lost connection rolls back
    await in_thread(lambda: transactional(running.url, "txq", sends=3, finish="commit"))
    assert queue_manager.queue("txq").size == 3
    got = await in_thread(lambda: transactional(running.url, "txq", receive=2, finish="abort"))
    assert got == ["t0", "t1"]
    await wait_until(lambda: running.connections() == 0)
    assert queue_manager.queue("txq").size == 3 and [e.redelivered for e in queue_manager.queue("txq").browse()] == [
        True,
        True,
        False,
    ]
    got = await in_thread(lambda: transactional(running.url, "txq", receive=3, finish="commit"))
    assert got == ["t0", "t1", "t2"]
    await wait_until(lambda: running.connections() == 0)
    assert queue_manager.queue("txq").size == 0


async def test_producer_client_id_and_no_local(broker):
    running = await broker()

    def chat(url):
        from proton.reactor import Filter

        no_local = Filter({"no-local": proton.Described(proton.symbol("apache.org:no-local-filter:list"), [])})
        me = BlockingConnection(url, timeout=10)
        mine = me.create_receiver("topic://chat", name="mine", options=no_local)
        everything = me.create_receiver("topic://chat", name="everything")
        other = BlockingConnection(url, timeout=10)
        me.create_sender("topic://chat").send(Message(body="from me"))
        other.create_sender("topic://chat").send(Message(body="from other"))
        got_all = [everything.receive(timeout=10) for _ in range(2)]
        got_mine = mine.receive(timeout=10)
        result = (
            [m.body for m in got_all],
            got_mine.body,
            [m.annotations["x-opt-martinet-cid"] == me.container.container_id for m in got_all],
        )
        me.close()
        other.close()
        return result

    everything, mine, stamped_by_me = await in_thread(chat, running.url)
    assert everything == ["from me", "from other"] and mine == "from other"  # no-local skipped my own
    assert stamped_by_me == [True, False]  # every message carries its producer's client id


def durable_client(url, client_id, *, take=0, end="detach"):
    """Attach the durable subscription 'orders-sub' of ``client_id`` (Qpid JMS style),
    receive ``take`` messages, then detach (keep) or close (unsubscribe)."""
    from proton.reactor import Container, DurableSubscription

    container = Container()
    container.container_id = client_id
    connection = BlockingConnection(url, timeout=10, container=container)
    receiver = connection.create_receiver("topic://orders", name="orders-sub", options=DurableSubscription())
    got = []
    for _ in range(take):
        got.append(receiver.receive(timeout=10).body)
        receiver.accept()
    if end == "close":
        receiver.close()
    else:
        receiver.link.detach()
    connection.close()
    return got


async def test_durable_subscriptions_with_the_qpid_jms_conventions(broker):
    running = await broker()
    await in_thread(durable_client, running.url, "client-1")
    topic_manager = running.router.swiftlet("sys$topicmanager")
    assert sorted(topic_manager.durable_subscriptions()) == ["client-1$orders-sub"]  # detach keeps it
    await in_thread(send, running.url, "topic://orders", ["o1", "o2"])  # accepted once stored
    assert running.usage("client-1$orders-sub")["messages"] == 2
    await running.stop()  # it keeps the messages across a restart
    await running.start()
    got = await in_thread(lambda: durable_client(running.url, "client-1", take=2, end="close"))
    assert got == ["o1", "o2"]
    await wait_until(lambda: running.connections() == 0)
    assert running.router.swiftlet("sys$topicmanager").durable_subscriptions() == {}  # close deletes it


SOLE = proton.symbol("sole-connection-for-container")


def held(url, client_id, *, sole):
    """A proton connection with container id ``client_id``, desiring sole use of it or not."""
    from proton.reactor import Container

    container = Container()
    container.container_id = client_id
    return BlockingConnection(url, timeout=10, container=container, desired_capabilities=[SOLE] if sole else None)


class Opener(MessagingHandler):
    """Opens a connection with container id ``client_id`` (desiring its sole use or not):
    :attr:`outcome` is "accepted" once a link on it attaches, else the condition, description
    and info of the router's refusing close."""

    def __init__(self, url, sole):
        super().__init__()
        self.url, self.sole, self.outcome = url, sole, None

    def on_start(self, event):
        event.container.connect(self.url, reconnect=False, desired_capabilities=[SOLE] if self.sole else None)

    def on_connection_opened(self, event):
        event.container.create_sender(event.connection, "probe")  # its answer comes after any refusal

    def on_link_opened(self, event):
        self.outcome = "accepted"
        event.connection.close()

    def on_connection_error(self, event):
        condition = event.connection.remote_condition
        self.outcome = (condition.name, condition.description, dict(condition.info or {}))
        event.connection.close()

    def on_transport_error(self, event):
        self.outcome = self.outcome or f"transport error: {event.transport.condition}"


def open_one(url, client_id, *, sole):
    from proton.reactor import Container

    opener = Opener(url, sole)
    container = Container(opener)
    container.container_id = client_id
    container.run()
    return opener.outcome


async def test_sole_connection_for_container_makes_a_client_id_exclusive(broker):
    """Several connections may share a container id (proton and rhea open
    every connection of a container with its id); one that desires
    sole-connection-for-container (Qpid JMS does when its application set a client id) is
    refused while another uses the id — amqp:invalid-field with info {invalid-field:
    container-id}, which Qpid JMS turns into InvalidClientIDException — and while it has
    the id, no other connection gets it. allow-same-clientid lifts the rule."""
    running = await broker()
    url = running.url

    def in_use(client_id):
        return ("amqp:invalid-field", f"client id {client_id!r} is in use", {"invalid-field": "container-id"})

    async def all_gone():
        with trio.fail_after(10):
            while running.router.management.get("/sys$jms/usage/listeners/amqp", "connections"):
                await trio.sleep(0.01)

    plain = [await in_thread(lambda: held(url, "shared", sole=False)) for _ in range(2)]  # share it
    assert await in_thread(lambda: open_one(url, "shared", sole=False)) == "accepted"
    assert await in_thread(lambda: open_one(url, "shared", sole=True)) == in_use("shared")
    for connection in plain:
        await in_thread(connection.close)

    sole = await in_thread(lambda: held(url, "alone", sole=True))
    assert sole.conn.remote_offered_capabilities is not None and SOLE in sole.conn.remote_offered_capabilities
    assert await in_thread(lambda: open_one(url, "alone", sole=True)) == in_use("alone")
    assert await in_thread(lambda: open_one(url, "alone", sole=False)) == in_use("alone")
    await in_thread(sole.close)
    await all_gone()
    assert await in_thread(lambda: open_one(url, "alone", sole=True)) == "accepted"  # free again

    running.router.management.set("/sys$jms/listeners/amqp", "allow-same-clientid", "true")  # new connections
    sole = await in_thread(lambda: held(url, "alone", sole=True))
    assert await in_thread(lambda: open_one(url, "alone", sole=True)) == "accepted"
    await in_thread(sole.close)


async def test_a_silent_peer_is_dropped_after_the_idle_timeout(nursery, tmp_path, autojump_clock):
    from martinet.messaging.amqp.wire import AMQP_HEADER
    from martinet.messaging.codec import Described, ULong, decode, encode

    path = tmp_path / "router.xml"
    path.write_text(router_xml(tmp_path, listener='keepalive-interval="2000"'))
    router = Router.from_file(path)
    await nursery.start(router.run)
    port = router.management.get("/sys$jms/usage/listeners/amqp", "port")
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    body = encode(Described(ULong(0x10), ["silent-peer"]))  # open(container-id)
    open_frame = len(body + b"12345678").to_bytes(4, "big") + b"\x02\x00\x00\x00" + body
    await stream.send_all(AMQP_HEADER + open_frame)  # no SASL: anonymous; then silence
    begin = trio.current_time()
    received = b""
    with trio.fail_after(60):
        while chunk := await stream.receive_some(4096):
            received += chunk
    assert received.startswith(AMQP_HEADER)  # the router answered, then hung up:
    performatives, offset = [], len(AMQP_HEADER)
    while offset < len(received):
        size = int.from_bytes(received[offset : offset + 4], "big")
        if size > 8:  # (an empty frame is a heartbeat)
            performatives.append(decode(received[offset + 8 : offset + size])[0])
        offset += size
    opened, closed = performatives
    assert (opened.descriptor, opened.value[4]) == (0x10, 2000)  # open, announcing its idle timeout
    assert closed.descriptor == 0x18 and closed.value[0].value[:2] == [
        "amqp:resource-limit-exceeded",
        "local-idle-timeout expired",
    ]
    assert 2 <= trio.current_time() - begin < 10
    await stream.aclose()
    router.request_stop()


class OversizedSender(MessagingHandler):
    """Streams part of a message above the router's limit on one link (the first frames of
    it, never the end), sends a whole oversized message on a second, then a small one on a
    third; what the router answered goes into :attr:`seen`. Gives up after 20 s."""

    def __init__(self, url: str, first_frames: bytes, whole: Message):
        super().__init__()
        self.url, self.first_frames, self.whole = url, first_frames, whole
        self.seen: dict = {}

    def on_start(self, event):
        self.connection = event.container.connect(self.url)
        self.links = {
            name: event.container.create_sender(self.connection, name, name=name)
            for name in ("streamed", "whole", "small")
        }
        self.timer = event.container.schedule(20, self)

    def on_timer_task(self, event):
        self.seen["timed out"] = True
        self.connection.close()

    def on_link_opened(self, event):
        self.seen.setdefault("max-message-size", {})[event.link.name] = event.link.remote_max_message_size

    def on_sendable(self, event):
        name = event.sender.name
        if name in self.seen.setdefault("sent", []):
            return
        self.seen["sent"].append(name)
        if name == "streamed":  # "more" frames of one message; its last frame never comes
            event.sender.delivery(b"streamed")
            event.sender.stream(self.first_frames)
        elif name == "whole":
            event.sender.send(self.whole)

    def on_link_error(self, event):
        condition = event.link.remote_condition
        self.seen.setdefault("detached", {})[event.link.name] = (condition.name, condition.description)
        if len(self.seen["detached"]) == 2:  # both refused: the connection still serves the third
            self.links["small"].send(Message(body="small"))

    def on_accepted(self, event):
        self.seen["accepted"] = event.sender.name
        self.timer.cancel()
        event.connection.close()


async def test_a_message_above_max_message_size_detaches_its_link_at_once(broker):
    """The attach of a link we receive on announces the queue manager's
    max-message-size, and a message above it detaches that link with
    amqp:link:message-size-exceeded [2.7.3] as soon as its first frames pass the limit —
    the router neither waits for the rest nor ends the connection."""
    from proton.reactor import Container

    running = await broker()

    def announced(url):
        connection = BlockingConnection(url, timeout=10)
        try:
            return connection.create_sender("any").link.remote_max_message_size
        finally:
            connection.close()

    assert await in_thread(announced, running.url) == 10 * 1024 * 1024  # the default
    running.router.management.set("/sys$queuemanager", "max-message-size", "200000")  # applies to new links

    encoded = Message(body=b"x" * 600_000).encode()
    client = OversizedSender(running.url, encoded[:300_000], Message(body=b"y" * 600_000))
    container = Container(client)
    await in_thread(container.run)  # (bounded by the client's own timer)
    limit_error = (
        "amqp:link:message-size-exceeded",
        "a message on link '{}' exceeds its max-message-size of 200000 bytes",
    )
    assert client.seen == {
        "max-message-size": {"streamed": 200000, "whole": 200000, "small": 200000},
        "sent": ["streamed", "whole", "small"],
        "detached": {name: (limit_error[0], limit_error[1].format(name)) for name in ("streamed", "whole")},
        "accepted": "small",
    }
    assert {name: running.usage(name)["messages"] for name in ("streamed", "whole", "small")} == {
        "streamed": 0,
        "whole": 0,
        "small": 1,
    }


class DrainingBrowser(MessagingHandler):
    """Browses ``queue`` (distribution-mode copy) in rounds of ``window`` credit with drain
    set, as a client that wants to know where the queue ends does; :attr:`rounds` holds
    (bodies received, credit the router gave back drained) per round. Gives up after 20 s."""

    def __init__(self, url: str, queue: str, window: int):
        super().__init__(prefetch=0)
        self.url, self.queue, self.window = url, queue, window
        self.rounds: list[tuple[list, int]] = []
        self.current: list | None = None

    def on_start(self, event):
        from proton.reactor import Copy

        self.connection = event.container.connect(self.url)
        event.container.create_receiver(self.connection, self.queue, options=Copy())
        self.timer = event.container.schedule(20, self)

    def on_timer_task(self, event):
        self.rounds.append(("timed out", 0))
        self.connection.close()

    def on_link_opened(self, event):
        self.next_round(event.receiver)

    def next_round(self, receiver):
        self.current = []
        receiver.drain(self.window)

    def on_message(self, event):
        self.current.append(event.message.body)
        self.round_over(event.receiver)

    def on_link_flow(self, event):
        self.round_over(event.receiver)

    def round_over(self, receiver):
        if self.current is None or receiver.draining() or receiver.queued:
            return  # the router has not used or given back all of this round's credit yet
        self.rounds.append((self.current, receiver.drained()))
        if len(self.current) < self.window:  # the end of the queue
            self.current = None
            self.timer.cancel()
            self.connection.close()
        else:
            self.next_round(receiver)


async def test_a_browser_gets_the_whole_queue_and_drained_credit_only_at_its_end(broker):
    """A browsing link (tests/interop/test_proton_examples.py shows what the example needs)
    delivers every message the queue holds, and advances its delivery-count
    for credit it cannot use (drained) only once the queue is exhausted [2.6.7]."""
    from proton.reactor import Container

    running = await broker()
    await in_thread(send, running.url, "browsed", [f"m{n}" for n in range(95)])
    client = DrainingBrowser(running.url, "browsed", 10)
    await in_thread(Container(client).run)  # (bounded by the client's own timer)
    assert client.rounds == [([f"m{n}" for n in range(start, start + 10)], 0) for start in range(0, 90, 10)] + [
        ([f"m{n}" for n in range(90, 95)], 5)
    ]
    assert running.usage("browsed")["messages"] == 95  # nothing consumed


class DetachAtOnce(MessagingHandler):
    """Attaches durable subscribers and detaches each in the same write as its attach:
    ``gone`` closing (``closed=true``), ``kept`` not; :attr:`answered` lists the links whose
    detach the router answered. Gives up after 20 s."""

    def __init__(self, url: str):
        super().__init__()
        self.url, self.answered = url, []

    def on_start(self, event):
        from proton.reactor import DurableSubscription

        self.connection = event.container.connect(self.url)
        for name in ("gone", "kept"):
            receiver = event.container.create_receiver(
                self.connection, "topic://at.once", name=name, options=DurableSubscription()
            )
            receiver.close() if name == "gone" else receiver.detach()
        self.timer = event.container.schedule(20, self)

    def on_timer_task(self, event):
        self.answered.append("timed out")
        self.connection.close()

    def on_link_closed(self, event):  # the router's closing detach
        self.answer(event.link.name)

    def on_link_remote_detach(self, event):  # and its plain one
        self.answer(event.link.name)

    def answer(self, name):
        self.answered.append(name)
        if len(self.answered) == 2:
            self.timer.cancel()
            self.connection.close()


async def test_a_durable_subscriber_detached_with_its_attach(broker):
    """Any ordering of frames AMQP allows: a durable subscriber's
    attach waits for the store; a detach sent right behind it is answered with it, after
    that — a closing detach deletes the subscription the attach made (it used to be
    answered at once, and the subscription stayed), a plain detach keeps it."""
    from proton.reactor import Container

    running = await broker()
    client = DetachAtOnce(running.url)
    container = Container(client)
    container.container_id = "at-once"
    await in_thread(container.run)  # (bounded by the client's own timer)
    assert sorted(client.answered) == ["gone", "kept"]
    assert list(running.router.swiftlet("sys$topicmanager").durable_subscriptions()) == ["at-once$kept"]


def performatives(data: bytes) -> list[int]:
    """The performative codes of the AMQP frames in ``data`` (which must hold whole frames)."""
    from martinet.messaging.codec import decode

    codes, offset = [], 0
    while offset < len(data):
        size, doff = int.from_bytes(data[offset : offset + 4], "big"), data[offset + 4]
        assert data[offset + 5] == 0 and offset + size <= len(data), f"not whole AMQP frames: {data[offset:]!r}"
        codes.append(int(decode(data, offset + doff * 4)[0].descriptor))
        offset += size
    return codes


async def test_the_answer_to_a_half_closed_peer_is_still_written(broker):
    """A client that sends the header and an open and then shuts down its
    sending side gets our header and open (and, if we close, a close). Before the driver
    wrote what was queued on the peer's end of input (commit 7c2948d), about half of such
    clients got nothing, and some of those that waited for our header before sending their
    open got only that header; hence 20 of each."""
    from martinet.messaging.amqp.wire import AMQP_HEADER, CLOSE, OPEN
    from martinet.messaging.codec import Described, ULong, encode

    running = await broker()
    body = encode(Described(ULong(OPEN), ["half-closed"]))  # open(container-id)
    open_frame = (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body

    async def half_closed(wait_for_our_header: bool) -> bytes:
        stream = await trio.open_tcp_stream("127.0.0.1", running.port)
        received = b""
        with trio.fail_after(10):
            if wait_for_our_header:
                await stream.send_all(AMQP_HEADER)
                while len(received) < 8 and (chunk := await stream.receive_some(4096)):
                    received += chunk
                await stream.send_all(open_frame)
            else:
                await stream.send_all(AMQP_HEADER + open_frame)
            await stream.send_eof()
            while chunk := await stream.receive_some(4096):
                received += chunk
        await stream.aclose()
        return received

    for wait in [False] * 20 + [True] * 20:
        received = await half_closed(wait)
        assert received[:8] == AMQP_HEADER, f"{received!r} (waited for our header: {wait})"
        assert performatives(received[8:]) in ([OPEN], [OPEN, CLOSE])


async def test_tls_listener(nursery, tmp_path):
    from proton import SSLDomain

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    await trio.run_process(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_stdout=True,
        capture_stderr=True,
    )
    path = tmp_path / "router.xml"
    path.write_text(router_xml(tmp_path, listener=f'tls-certificate="{cert}" tls-key="{key}"'))
    router = Router.from_file(path)
    await nursery.start(router.run)
    port = router.management.get("/sys$jms/usage/listeners/amqp", "port")

    def over_tls():
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(str(cert))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        connection = BlockingConnection(f"amqps://127.0.0.1:{port}", timeout=10, ssl_domain=domain)
        connection.create_sender("secure").send(Message(body="encrypted"))
        body = connection.create_receiver("secure").receive(timeout=10).body
        connection.close()
        return body

    assert await in_thread(over_tls) == "encrypted"
    with pytest.raises(ConnectionException, match="disconnected.*no protocol header found"):  # plain is not TLS
        await in_thread(lambda: send(f"amqp://127.0.0.1:{port}", "secure", ["plain"]))
    assert await in_thread(over_tls) == "encrypted"  # and the listener still serves TLS clients
    assert router.management.get("/sys$queuemanager/usage/queues/secure", "enqueued") == 2  # "plain" never came

    # our client, verifying the router's certificate
    import ssl

    from martinet.messaging.client import ConnectionLost, Queue, TextMessage, connect

    async with connect(f"amqps://127.0.0.1:{port}", ssl_context=ssl.create_default_context(cafile=str(cert))) as c:
        session = await c.session()
        await (await session.producer(Queue("ours"))).send(TextMessage("ours, encrypted"))
        assert (await (await session.consumer(Queue("ours"))).receive(5)).text == "ours, encrypted"
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):  # the default trust store lacks it
        async with connect(f"amqps://127.0.0.1:{port}"):
            pass
    router.request_stop()


async def test_a_missing_tls_certificate_fails_the_start(tmp_path):
    path = tmp_path / "router.xml"
    path.write_text(router_xml(tmp_path, listener='tls-certificate="/nope/cert.pem"'))
    from martinet.kernel import SwiftletFailed

    with pytest.raises(
        SwiftletFailed, match="sys\\$jms failed to start: .*cannot load the TLS certificate '/nope/cert.pem'"
    ):
        await Router.from_file(path).run()


async def test_a_listener_added_at_runtime_accepts_clients_and_one_removed_stops(broker):
    running = await broker()
    tree = running.router.management
    tree.add("/sys$jms/listeners", "extra", {"port": "0", "bind-address": "127.0.0.1"})
    port = tree.get("/sys$jms/usage/listeners/extra", "port")
    url = f"amqp://127.0.0.1:{port}"
    await in_thread(send, url, "added", ["through the new listener"])
    assert [body for body, _ in await in_thread(receive, running.url, "added", 1)] == ["through the new listener"]
    # a port in use is refused when the listener is added, with the reason
    with pytest.raises(ManagementError, match=f"AMQP listener clash: cannot listen on 127.0.0.1:{port}: "):
        tree.add("/sys$jms/listeners", "clash", {"port": str(port), "bind-address": "127.0.0.1"})
    assert set(tree.entity_list("/sys$jms/listeners").entities) == {"amqp", "extra"}
    tree.remove("/sys$jms/listeners", "extra")
    await wait_until(lambda: not _accepts(port), what="the removed listener's port closed")
    await in_thread(send, running.url, "added", ["the first listener goes on"])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
