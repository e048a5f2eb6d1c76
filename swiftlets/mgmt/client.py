"""Management requests from a program, over our AMQP client (what ``martinet admin`` uses).

    async with AdminClient.open("amqp://127.0.0.1:5672") as admin:
        print(await admin.call("paris", "get", path="/sys$queuemanager/usage/queues"))

One connection to one router, one temporary reply queue, and a task that hands each reply
to whoever waits for its correlation-id, so requests to several routers (``map`` crawls the
network) run at once and a watch's notifications arrive while other requests are served.
Requests to another router go to ``sys$mgmt@<router>``: the connected router routes them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import trio

from martinet.messaging.client import Connection, DeliveryMode, JMSError, Queue, TextMessage, connect

from .api import MANAGEMENT_QUEUE, VERSION, RequestFailed, Status

__all__ = ["AdminClient", "AdminError"]

DEFAULT_TIMEOUT = 10.0


class AdminError(RequestFailed):
    """A request failed: the router's status and reason, or no answer (status 503)."""


class AdminClient:
    """Management requests over one connection; build it with :meth:`open`."""

    def __init__(self, connection: Connection, session: Any, producer: Any, reply_to: Any, timeout: float):
        self.connection = connection
        self.router = connection.router or ""  # the router connected to
        self._session = session
        self._producer = producer
        self._reply_to = reply_to
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._waiting: dict[str, trio.MemorySendChannel] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, url: str, *, user: str | None = None, password: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> AsyncIterator[AdminClient]:
        """Connect to the router at ``url``; ``timeout``: seconds to wait for each reply.

        Raises:
            JMSError: the connection or its reply queue failed (SecurityError: refused login).
        """
        async with connect(url, user=user, password=password) as connection:
            session = await connection.session()
            reply_to = await session.create_temporary_queue()
            consumer = await session.consumer(reply_to)
            # persistent: the send awaits the router's outcome, so a refusal (an unknown router)
            # comes back at once instead of as a missing reply
            producer = await session.producer(delivery_mode=DeliveryMode.PERSISTENT)
            client = cls(connection, session, producer, reply_to, timeout)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client._dispatch, consumer)
                try:
                    yield client
                finally:
                    nursery.cancel_scope.cancel()

    async def _dispatch(self, consumer: Any) -> None:
        async for message in consumer:
            channel = self._waiting.get(message.correlation_id)
            if channel is None:
                continue  # a late reply to a request that timed out, or a watch unwatched
            try:
                reply = json.loads(message.text)
            except ValueError:
                reply = {"status": int(Status.ERROR), "error": "the reply is not JSON"}
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                channel.send_nowait(reply)

    def _target(self, router: str | None) -> Queue:
        return Queue(f"{MANAGEMENT_QUEUE}@{router}" if router else MANAGEMENT_QUEUE)

    async def request(self, router: str | None, verb: str, **args: Any) -> dict[str, Any]:
        """Send one request to router ``router`` (None: the one connected to) and return the
        reply as it came (``status``, ``router``, ``result`` or ``error``).

        Raises:
            AdminError: the request could not be sent (e.g. an unknown router), or no reply
                came in time (status 503).
        """
        correlation = f"admin-{next(self._ids)}"
        send, receive = trio.open_memory_channel[dict](1)
        self._waiting[correlation] = send
        try:
            await self._send(router, correlation, {"version": VERSION, "verb": verb, **args})
            with trio.move_on_after(self.timeout):
                return await receive.receive()
            raise AdminError(int(Status.UNAVAILABLE), f"no reply within {self.timeout:g} s", router or self.router)
        finally:
            del self._waiting[correlation]

    async def _send(self, router: str | None, correlation: str, body: dict[str, Any]) -> None:
        message = TextMessage(json.dumps(body), correlation_id=correlation, reply_to=self._reply_to)
        try:
            # a request nobody served within the timeout expires: no stale change later
            await self._producer.send(message, self._target(router), ttl=max(1, int(self.timeout * 1000)))
        except JMSError as exc:
            raise AdminError(int(Status.UNAVAILABLE), f"request not sent: {exc}", router or self.router) from None

    async def call(self, router: str | None, verb: str, **args: Any) -> Any:
        """:meth:`request`, and the result of a reply with status 200.

        Raises:
            AdminError: any other status (with the router's reason), or no reply.
        """
        reply = await self.request(router, verb, **args)
        if reply.get("status") != Status.OK:
            raise AdminError(
                reply.get("status", int(Status.ERROR)),
                reply.get("error", "no reason given"),
                reply.get("router", router or self.router),
            )
        return reply.get("result")

    @contextlib.asynccontextmanager
    async def watch(self, router: str | None, path: str) -> AsyncIterator[trio.MemoryReceiveChannel]:
        """Watch the subtree ``path`` of ``router``: a channel of notifications (each a reply's
        ``result``: ``{"watch", "event": {...}}``, or ``{"watch", "ended": reason}`` last).
        The lease is renewed at half its length while the block runs; leaving it unwatches.

        Raises:
            AdminError: the watch was refused.
        """
        correlation = f"admin-{next(self._ids)}"
        send, receive = trio.open_memory_channel[dict](math.inf)
        self._waiting[correlation] = send
        try:
            await self._send(router, correlation, {"version": VERSION, "verb": "watch", "path": path})
            first = None
            with trio.move_on_after(self.timeout):
                first = await receive.receive()
            if first is None or first.get("status") != Status.OK:  # (a notification cannot come before it)
                reason = "no reply" if first is None else first.get("error", "")
                raise AdminError(int(first.get("status", 503)) if first else 503, reason, router or self.router)
            number, lease = first["result"]["watch"], first["result"]["lease"]
            deliver, notices = trio.open_memory_channel[dict](math.inf)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forward, receive, deliver)
                nursery.start_soon(self._renew, router, number, lease)
                try:
                    yield notices
                finally:
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True), contextlib.suppress(AdminError):
                        await self.request(router, "unwatch", watch=number)
        finally:
            self._waiting.pop(correlation, None)

    async def _forward(self, receive: trio.MemoryReceiveChannel, deliver: trio.MemorySendChannel) -> None:
        async for reply in receive:
            deliver.send_nowait(reply.get("result") or {"ended": reply.get("error", "")})

    async def _renew(self, router: str | None, number: int, lease: float) -> None:
        while True:
            await trio.sleep(lease / 2)
            await self.call(router, "watch", watch=number)
