"""The JMS-shaped Python client against a live router over real sockets, and interop with
proton clients in both directions."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio
from proton import Message as ProtonMessage
from proton.utils import BlockingConnection

from martinet.messaging.client import (
    AckMode,
    BytesMessage,
    ConnectionLost,
    DeliveryMode,
    InvalidClientId,
    InvalidDestination,
    InvalidSelector,
    JMSError,
    MapMessage,
    Message,
    Queue,
    SecurityError,
    StreamMessage,
    TemporaryQueue,
    TextMessage,
    Topic,
    TransactionRolledBack,
    connect,
)
from martinet.messaging.codec import Int

from tests.harness.paths import ROOT
from tests.harness.polling import wait_until


async def test_send_and_receive_every_message_type(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url, client_id="types") as connection, connection.session() as session:
        producer = await session.producer(Queue("q"))
        sent = [
            TextMessage("héllo", properties={"n": 1, "ok": True, "f": 1.5, "s": "x", "i": Int(7)}),
            BytesMessage(b"\x00\x01binary"),
            MapMessage({"a": 1, "b": "two", "c": None}),
            StreamMessage([1, "two", 3.0, b"4"]),
            Message(type="ping", correlation_id="c-1"),
        ]
        for message in sent:
            await producer.send(message)
        consumer = await session.consumer(Queue("q"))
        received = [await consumer.receive(timeout=5) for _ in sent]
    assert [type(m) for m in received] == [type(m) for m in sent]
    assert [m.body for m in received] == [m.body for m in sent]
    assert received[0].text == "héllo" and received[0].properties == {"n": 1, "ok": True, "f": 1.5, "s": "x", "i": 7}
    assert received[1].data == b"\x00\x01binary"
    assert received[4].type == "ping" and received[4].correlation_id == "c-1"
    for message, original in zip(received, sent, strict=True):
        assert message.message_id == original.message_id and message.message_id.startswith("ID:")
        assert message.destination == Queue("q") and message.delivery_mode is DeliveryMode.PERSISTENT
        assert message.priority == 4 and message.expiration == 0 and not message.redelivered
        assert message.timestamp == original.timestamp > 0
        assert message.producer_client_id == "types"


async def test_headers_priority_ttl_and_listener_defaults(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection, connection.session() as session:
        assert connection.router == "r1" and connection.consumer_cache_size == 500
        producer = await session.producer(Queue("prio"), delivery_mode=DeliveryMode.NON_PERSISTENT)
        assert producer.priority == 4 and producer.ttl == 0
        await producer.send(TextMessage("low"), priority=1)
        await producer.send(TextMessage("high"), priority=9, ttl=60_000)
        await producer.send(TextMessage("persistent"), delivery_mode=DeliveryMode.PERSISTENT)
        await wait_until(lambda: broker.usage("prio")["messages"] == 3)  # the non-persistent sends are not awaited
        consumer = await session.consumer(Queue("prio"))
        first, second, third = [await consumer.receive(timeout=5) for _ in range(3)]
    assert (first.text, first.priority) == ("high", 9)
    assert first.expiration == first.timestamp + 60_000
    assert first.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert (second.text, third.text) == ("persistent", "low")


async def test_receive_timeout_nowait_and_async_iteration(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection, connection.session() as session:
        consumer = await session.consumer(Queue("empty"))
        assert await consumer.receive(timeout=0.3) is None
        assert await consumer.receive_nowait() is None
        producer = await session.producer(Queue("empty"))
        for i in range(5):
            await producer.send(TextMessage(f"m{i}"))
        seen = []
        async for message in consumer:
            seen.append(message.text)
            if len(seen) == 5:
                break
        assert seen == [f"m{i}" for i in range(5)]


async def test_selector_no_local_and_topics(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url, client_id="me") as mine, connect(broker.url, client_id="other") as other:
        session, other_session = await mine.session(), await other.session()
        everything = await session.consumer(Topic("news.sport"))
        not_mine = await session.consumer(Topic("news.%"), no_local=True)
        red = await session.consumer(Queue("colours"), selector="colour = 'red' AND size > 2")
        await (await session.producer(Topic("news.sport"))).send(TextMessage("from me"))
        await (await other_session.producer(Topic("news.sport"))).send(TextMessage("from other"))
        colours = await other_session.producer(Queue("colours"))
        for colour, size in [("red", 1), ("blue", 5), ("red", 5)]:
            await colours.send(TextMessage(colour, properties={"colour": colour, "size": size}))
        assert [(await everything.receive(5)).text for _ in range(2)] == ["from me", "from other"]
        assert (await not_mine.receive(5)).text == "from other"
        assert await not_mine.receive(0.3) is None
        match = await red.receive(5)
        assert match.properties == {"colour": "red", "size": 5}
        assert await red.receive(0.3) is None
        with pytest.raises(InvalidSelector):
            await session.consumer(Queue("colours"), selector="colour = ")


async def test_unknown_queue_and_refused_login(amqp_broker):
    broker = await amqp_broker(autocreate="false", auth="true")
    with pytest.raises(SecurityError):
        async with connect(broker.url, user="app", password="wrong"):
            pass
    broker.router.swiftlet("sys$queuemanager").queue("secret", create=True)
    async with connect(broker.url.replace("amqp://", "amqp://app:s3cret@")) as connection:
        session = await connection.session()
        with pytest.raises(InvalidDestination):
            await session.consumer(Queue("nowhere"))
        with pytest.raises(InvalidDestination):
            await session.producer(Queue("nowhere"))
        anonymous = await session.producer()
        with pytest.raises(InvalidDestination):
            await anonymous.send(TextMessage("x"), Queue("nowhere"))
        # the connection is still good after the refusals
        await anonymous.send(TextMessage("x"), Queue("secret"))  # persistent: stored when send returns
        assert broker.usage("secret")["messages"] == 1
        with pytest.raises(SecurityError):  # the group may send to "secret" but not receive
            await session.consumer(Queue("secret"))


async def test_client_acknowledge_and_recover(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
        producer = await session.producer(Queue("acks"))
        for i in range(3):
            await producer.send(TextMessage(f"m{i}"))
        consumer = await session.consumer(Queue("acks"))
        first = await consumer.receive(5)
        await consumer.receive(5)
        await session.recover()  # both come again, marked redelivered, in order
        again = [await consumer.receive(5) for _ in range(3)]
        assert [m.text for m in again] == ["m0", "m1", "m2"]
        assert [m.redelivered for m in again] == [True, True, False]
        assert first.message_id == again[0].message_id
        await again[1].acknowledge()  # acknowledges everything delivered so far
        await consumer.close()
        assert broker.usage("acks")["messages"] == 0


async def test_unacknowledged_messages_come_back_when_the_connection_ends(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
        await (await session.producer(Queue("held"))).send(TextMessage("keep me"))
        assert (await (await session.consumer(Queue("held"))).receive(5)).text == "keep me"
    async with connect(broker.url) as connection:
        session = await connection.session()
        message = await (await session.consumer(Queue("held"))).receive(5)
        assert message.text == "keep me" and message.redelivered


async def test_acknowledge_count_takes_only_the_oldest_messages(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
        producer = await session.producer(Queue("some"))
        for i in range(3):
            await producer.send(TextMessage(f"m{i}"))
        consumer = await session.consumer(Queue("some"))
        assert [(await consumer.receive(5)).text for _ in range(3)] == ["m0", "m1", "m2"]
        await session.acknowledge(2)  # m0 and m1 only: m2 stays unacknowledged
        await wait_until(lambda: broker.usage("some")["messages"] == 1)
    async with connect(broker.url) as connection:
        session = await connection.session()
        assert (await (await session.consumer(Queue("some"))).receive(5)).text == "m2"


async def test_transacted_session_commit_and_rollback(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session(transacted=True)
        producer = await session.producer(Queue("tx"))
        await producer.send(TextMessage("one"))
        await producer.send(TextMessage("two"))
        assert broker.usage("tx")["messages"] == 0
        await session.rollback()
        await producer.send(TextMessage("three"))
        await session.commit()
        assert broker.usage("tx")["messages"] == 1
        consumer = await session.consumer(Queue("tx"))
        message = await consumer.receive(5)
        assert message.text == "three"
        await session.rollback()  # the receive is undone
        message = await consumer.receive(5)
        assert message.text == "three" and message.redelivered
        await session.commit()
        assert broker.usage("tx")["messages"] == 0
        with pytest.raises(JMSError, match=r"recover\(\) is for non-transacted sessions"):
            await session.recover()
        plain = await connection.session()
        with pytest.raises(JMSError, match=r"commit\(\) and rollback\(\) are for transacted sessions"):
            await plain.commit()


async def test_transaction_rolled_back_when_connection_is_lost(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session(transacted=True)
        await (await session.producer(Queue("lost"))).send(TextMessage("never"))
        await connection._stream.aclose()  # the socket dies under the connection
        with pytest.raises(TransactionRolledBack):
            await session.commit()
    await wait_until(lambda: broker.connections() == 0)  # the router has cleaned up after it
    assert broker.usage("lost")["messages"] == 0


async def test_durable_subscriber_across_a_restart_and_unsubscribe(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url, client_id="dur") as connection:
        session = await connection.session()
        subscriber = await session.durable_subscriber(Topic("prices"), "watch", selector="price > 10")
        await subscriber.close()  # detached: the subscription keeps collecting
        producer = await session.producer(Topic("prices"))
        for price in (5, 20, 30):
            await producer.send(TextMessage(str(price), properties={"price": price}))
    await broker.stop()
    broker = await broker.start()
    async with connect(broker.url, client_id="dur") as connection:
        session = await connection.session()
        subscriber = await session.durable_subscriber(Topic("prices"), "watch", selector="price > 10")
        assert [(await subscriber.receive(5)).text for _ in range(2)] == ["20", "30"]
        with pytest.raises(JMSError, match="durable subscription 'watch' has an active subscriber"):
            await session.unsubscribe("watch")
        await subscriber.close()
        await session.unsubscribe("watch")
        with pytest.raises(InvalidDestination):
            await session.unsubscribe("watch")


async def test_duplicate_client_id_refused(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url, client_id="solo"):
        with pytest.raises(InvalidClientId):
            async with connect(broker.url, client_id="solo"):
                pass


async def test_browser_temporary_queue_and_request_reply(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session()
        producer = await session.producer(Queue("browse"))
        for i in range(30):
            await producer.send(TextMessage(f"b{i}", properties={"even": i % 2 == 0}))
        async with session.browser(Queue("browse")) as browser:
            assert [m.text async for m in browser] == [f"b{i}" for i in range(30)]
        async with session.browser(Queue("browse"), selector="even") as browser:
            assert [m.text async for m in browser] == [f"b{i}" for i in range(0, 30, 2)]
        assert broker.usage("browse")["messages"] == 30

        temporary = await session.create_temporary_queue()
        assert isinstance(temporary, TemporaryQueue)
        name, _, router = temporary.name.partition("@")  # the address carries the router (a reply-to)
        assert router == "r1" and name in broker.router.swiftlet("sys$queuemanager").queues
        await session.delete_temporary(temporary)
        assert name not in broker.router.swiftlet("sys$queuemanager").queues

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            async with connect(broker.url) as server, server.session() as server_session:
                requests = await server_session.consumer(Queue("service"))
                replies = await server_session.producer()
                task_status.started()
                async for request in requests:
                    await replies.send(
                        TextMessage(request.text.upper(), correlation_id=request.message_id), request.reply_to
                    )

        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            async with session.requestor(Queue("service")) as requestor:
                assert (await requestor.request(TextMessage("ping"), timeout=5)).text == "PING"
                assert (await requestor.request(TextMessage("pong"), timeout=5)).text == "PONG"
            nursery.cancel_scope.cancel()


async def test_temporary_topic(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session()
        topic = await session.create_temporary_topic()
        consumer = await session.consumer(topic)
        await (await session.producer(topic)).send(TextMessage("to the temporary topic"))
        received = await consumer.receive(5)
        assert received.text == "to the temporary topic" and received.destination.is_topic


async def test_interop_with_proton_clients_both_ways(amqp_broker):
    broker = await amqp_broker()

    def proton_side():
        connection = BlockingConnection(broker.url, timeout=10)
        try:
            connection.create_sender("to-client").send(
                ProtonMessage(body="from proton", properties={"k": "v"}, durable=True)
            )
            receiver = connection.create_receiver("to-proton")
            message = receiver.receive(timeout=10)
            receiver.accept()
            return message
        finally:
            connection.close()

    async with connect(broker.url) as connection:
        session = await connection.session()
        await (await session.producer(Queue("to-proton"))).send(
            MapMessage({"answer": 42}, properties={"from": "client"})
        )
        async with trio.open_nursery() as nursery:
            result = {}

            async def run_proton():
                result["message"] = await trio.to_thread.run_sync(proton_side)

            nursery.start_soon(run_proton)
            received = await (await session.consumer(Queue("to-client"))).receive(10)
    assert isinstance(received, TextMessage) and received.text == "from proton" and received.properties == {"k": "v"}
    assert result["message"].body == {"answer": 42} and result["message"].properties == {"from": "client"}


async def test_consumer_closed_by_the_router_and_connection_loss(amqp_broker):
    broker = await amqp_broker()
    async with connect(broker.url) as connection:
        session = await connection.session()
        consumer = await session.consumer(Queue("doomed"))
        broker.router.swiftlet("sys$queuemanager").delete_queue("doomed")
        with pytest.raises(JMSError, match="^amqp:resource-deleted: queue doomed was deleted$") as caught:
            await consumer.receive(5)
        assert not isinstance(caught.value, ConnectionLost)  # the link ended, not the connection
        other = await session.consumer(Queue("alive"))
        await broker.stop()
        with pytest.raises(ConnectionLost):
            await other.receive(5)


async def test_blocking_facade(amqp_broker):
    from martinet.messaging.client.blocking import BlockingConnection

    broker = await amqp_broker(auth="true")

    def script():
        with pytest.raises(SecurityError):
            BlockingConnection(broker.url, user="app", password="wrong")
        with BlockingConnection(broker.url, user="app", password="s3cret", client_id="plain") as connection:
            assert connection.client_id == "plain"
            session = connection.session(ack_mode=AckMode.CLIENT_ACKNOWLEDGE)
            producer = session.producer(Queue("blocking"))
            for i in range(3):
                producer.send(TextMessage(f"m{i}"))
            with session.browser(Queue("blocking")) as browser:
                browsed = [m.text for m in browser]
            consumer = session.consumer(Queue("blocking"))
            received = [consumer.receive(timeout=5).text for _ in range(3)]
            session.acknowledge()
            assert consumer.receive(timeout=0.2) is None
            return browsed, received

    browsed, received = await trio.to_thread.run_sync(script)
    assert browsed == received == ["m0", "m1", "m2"]
    assert broker.usage("blocking")["messages"] == 0


async def test_the_readme_example_runs(amqp_broker):
    import sys

    broker = await amqp_broker()
    example = ROOT / "examples" / "client" / "hello.py"
    result = await trio.run_process(
        [sys.executable, str(example), broker.url], capture_stdout=True, capture_stderr=True, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == [
        "received: Hello, Martinet! from client hello-example",
        "subscriber got: goal!",
        "reply: PING",
    ]


async def test_host_access_list_refuses_other_addresses(amqp_broker):
    broker = await amqp_broker(hosts='<host-access-list><host-access-entry name="10.%"/></host-access-list>')
    # The refusal is an AMQP close that says why, as JMS's JMSSecurityException.
    with pytest.raises(SecurityError, match="amqp:unauthorized-access: not in the host access list"):
        async with connect(broker.url, connect_timeout=5):
            pass
    assert broker.router.management.get("/sys$jms/usage/listeners/amqp", "refused") == 1


async def test_connection_usage_counts_and_rates(amqp_broker):
    broker = await amqp_broker(collect="100")
    async with connect(broker.url, client_id="counted") as connection:
        session = await connection.session()
        producer = await session.producer(Queue("counted"))
        for _ in range(10):
            await producer.send(TextMessage("x"))
        consumer = await session.consumer(Queue("counted"))
        for _ in range(4):
            await consumer.receive(5)
        usage = broker.router.management.resolve("/sys$jms/usage/connections")
        (name,) = usage.children
        values = usage.children[name].properties()
        assert (values["client-id"], values["messages-received"], values["messages-sent"]) == ("counted", 10, 10)
        rates = []
        with trio.fail_after(5):
            while not rates or rates[-1] == 0:
                await trio.sleep(0.02)
                rates.append(usage.children[name].properties()["receive-rate"])
        assert rates[-1] > 0
    await wait_until(lambda: not broker.router.management.resolve("/sys$jms/usage/connections").children)


async def test_the_client_drops_a_router_that_goes_silent(nursery, autojump_clock):
    """A router that answers SASL and the open, then says nothing more: past the client's
    idle timeout the connection is lost (the clock jumps while everything waits)."""
    from martinet.messaging import amqp
    from martinet.messaging.amqp.sasl import SaslServer

    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]

    async def silent_router():
        async with listener, await listener.accept() as stream:
            sasl = SaslServer()
            while sasl.receive_data(await stream.receive_some(4096)) is None:
                await stream.send_all(sasl.data_to_send)
            sasl.accept()
            await stream.send_all(sasl.data_to_send)
            engine = amqp.Connection(container_id="silent")  # announces no idle timeout: asks for no heartbeats
            while not engine.events:  # (the client sends its header and open after the outcome)
                engine.receive_data(await stream.receive_some(4096))
            engine.open()
            await stream.send_all(engine.data_to_send())
            await trio.sleep_forever()

    nursery.start_soon(silent_router)
    async with connect(f"amqp://127.0.0.1:{port}", idle_timeout=2) as connection:
        session = await connection.session()
        started = trio.current_time()
        with pytest.raises(ConnectionLost, match="idle-timeout"):
            await (await session.producer(Queue("q"))).send(TextMessage("never acknowledged"))
        assert 2 <= trio.current_time() - started < 3


async def test_flow_control_holds_a_producer_back_until_the_queue_drains(amqp_broker):
    """SwiftMQ's flow control over AMQP: past flowcontrol-start-queuesize (5) a queue whose
    consumer does not keep up gives its producer ever longer delays, and the listener
    withholds the producer's credit (a window of 10) for them; once the consumer drains the
    queue, the producer gets its credit back and every message arrives."""
    broker = await amqp_broker(
        queues='<queues><queue name="slow" flowcontrol-start-queuesize="5" max-flowcontrol-delay="10000"/></queues>',
        listener='incoming-credit="10"',
    )
    total, sent = 200, 0
    async with connect(broker.url) as connection:
        session = await connection.session()
        consumer = await session.consumer(Queue("slow"))
        producer = await session.producer(Queue("slow"), delivery_mode=DeliveryMode.NON_PERSISTENT)

        async def produce():
            nonlocal sent
            for n in range(total):
                await producer.send(TextMessage(str(n)))
                sent += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await trio.sleep(1.0)
            # Without flow control all 200 would be in the queue within some 20 ms; with it
            # the delays grow with the queue ((2 + d) ms per message past 5, waited once per
            # half window of 5 sends).
            held_back = sent  # about 105 on the development machine; fewer on a slower one
            assert 10 <= held_back < total
            usage = broker.router.management.resolve("/sys$jms/usage/connections").children
            assert sum(node.properties()["flow-control-waits"] for node in usage.values()) >= 1
            received = [await consumer.receive(10) for _ in range(total)]
        assert [message.text for message in received] == [str(n) for n in range(total)]
        with trio.fail_after(5):  # the last acknowledgements are on their way
            while broker.usage("slow")["messages"]:
                await trio.sleep(0.01)


async def test_a_queue_nobody_reads_holds_its_producer_back_and_refuses_past_its_cap(amqp_broker):
    """The memory budget over AMQP. A queue without consumers above its
    flowcontrol-start-queuesize (5) holds its producer back by credit (the producer waits, it
    is not refused); a consumer that arrives later drains it and gets every message once, in
    order. A queue at its max-messages refuses the next message with
    amqp:resource-limit-exceeded and keeps what it had."""
    broker = await amqp_broker(
        queues='<queues><queue name="unread" flowcontrol-start-queuesize="5" '
        'max-flowcontrol-delay="60000"/><queue name="capped" max-messages="3" '
        'flowcontrol-start-queuesize="-1"/></queues>',
        listener='incoming-credit="10"',
    )
    total, sent = 2000, 0
    usage = broker.router.management.resolve("/sys$jms/usage/connections").children

    def flow_control_waits() -> int:
        return sum(node.properties()["flow-control-waits"] for node in usage.values())

    async with connect(broker.url) as connection:
        session = await connection.session()
        producer = await session.producer(Queue("unread"), delivery_mode=DeliveryMode.NON_PERSISTENT)

        async def produce():
            nonlocal sent
            for n in range(total):
                await producer.send(TextMessage(str(n)))
                sent += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await wait_until(lambda: flow_control_waits() >= 3, what="the producer held back three times")
            # Unthrottled, 2000 non-persistent sends take some 0.2 s; held back, some 30 a second.
            assert sent < total and broker.usage("unread")["consumers"] == 0
            consumer = await session.consumer(Queue("unread"))
            received = [await consumer.receive(10) for _ in range(total)]
        assert [message.text for message in received] == [str(n) for n in range(total)]
        assert await consumer.receive(0.2) is None  # nothing twice

        capped = await session.producer(Queue("capped"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(3):
            await capped.send(TextMessage(f"c{n}"))
        with pytest.raises(JMSError) as refused:
            await capped.send(TextMessage("c3"))
        assert refused.value.condition == "amqp:resource-limit-exceeded"
        assert "queue capped is full (3 messages)" in str(refused.value)
        consumer = await session.consumer(Queue("capped"))
        assert [(await consumer.receive(10)).text for _ in range(3)] == ["c0", "c1", "c2"]
        assert await consumer.receive(0.2) is None


def test_importing_the_client_imports_nothing_of_the_router():
    """An application that only sends and receives gets the client, the AMQP stack and trio:
    not the kernel, not the config machinery (lxml, cattrs), not pluggy, not a swiftlet."""
    script = (
        "import sys, martinet.messaging.client, martinet.messaging.client.blocking\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert "martinet.messaging.client" in loaded and "trio" in loaded  # the check itself works
    forbidden = [
        name
        for name in loaded
        if name.split(".")[0] in ("lxml", "cattrs", "pluggy", "msgpack", "sqlite3")
        or name.startswith(("martinet.kernel", "martinet.swiftlets"))
    ]
    assert forbidden == []


async def test_client_connections_opening_and_closing_are_logged_with_user_and_address(amqp_broker, caplog):
    import logging

    from martinet.kernel.logs import HostLimitedLog

    caplog.set_level(logging.INFO, logger="martinet.swiftlets.jms")
    broker = await amqp_broker(auth="true")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("client connection from")]

    async with connect(broker.url, user="app", password="s3cret", client_id="shop-1"):
        await wait_until(lambda: len(lines()) == 1, what="the opening logged")
    await wait_until(lambda: len(lines()) == 2, what="the closing logged")
    opened, closed = lines()
    assert opened == "client connection from 127.0.0.1 opened: user app, client id shop-1, listener amqp"
    assert closed.startswith("client connection from 127.0.0.1 closed: user app, client id shop-1, listener amqp, ")
    assert {r.levelname for r in caplog.records if r.getMessage() in (opened, closed)} == {"INFO"}
    for _ in range(HostLimitedLog.LIMIT):  # a client reconnecting in a loop writes LIMIT lines a period, not more
        async with connect(broker.url, user="app", password="s3cret"):
            pass
    await wait_until(lambda: broker.connections() == 0, what="all closed")
    assert len(lines()) == HostLimitedLog.LIMIT
