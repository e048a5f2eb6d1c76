"""Martinet's Python client in a few lines: send, receive, request/reply, a durable
subscriber. Run a router first (`martinet run`), then: python examples/client/hello.py [URL]"""

import sys

import trio

from martinet.messaging.client import Queue, TextMessage, Topic, connect


async def main(url: str) -> None:
    async with connect(url, client_id="hello-example") as connection:
        async with connection.session() as session:
            # point to point: a persistent send returns once the router has stored it
            producer = await session.producer(Queue("hello"))
            await producer.send(TextMessage("Hello, Martinet!", properties={"lang": "en"}))
            consumer = await session.consumer(Queue("hello"), selector="lang = 'en'")
            message = await consumer.receive(timeout=5)
            print("received:", message.text, "from client", message.producer_client_id)

            # publish/subscribe with a durable subscriber that survives while we are away
            subscriber = await session.durable_subscriber(Topic("news.sport"), "sport-fan")
            await (await session.producer(Topic("news.sport"))).send(TextMessage("goal!"))
            print("subscriber got:", (await subscriber.receive(timeout=5)).text)
            await subscriber.close()
            await session.unsubscribe("sport-fan")

            # request/reply through a temporary queue
            async with trio.open_nursery() as nursery:

                async def echo_service() -> None:
                    requests, replies = await session.consumer(Queue("echo")), await session.producer()
                    request = await requests.receive()
                    reply = TextMessage(request.text.upper(), correlation_id=request.message_id)
                    await replies.send(reply, request.reply_to)

                nursery.start_soon(echo_service)
                async with session.requestor(Queue("echo")) as requestor:
                    print("reply:", (await requestor.request(TextMessage("ping"), timeout=5)).text)


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "amqp://localhost:5672")
