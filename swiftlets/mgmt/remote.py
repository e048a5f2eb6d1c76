"""Requests this router makes to another router's ``sys$mgmt`` for a front end inside it (the
web view, the admin's network views): :class:`RemoteRequests`.

Each request goes to ``sys$mgmt@<router>`` with a correlation-id of its own and a reply-to
on a temporary queue of this router, taken from the router's reserve so that replies come
back even when clients have used up their room. One consumer takes every reply and hands it
to the request waiting for its correlation-id; a reply nobody waits for (its request timed
out, or a second reply) is dropped. The request carries the front end's identity, with the
reply-to set to that queue, which the identity's own router may send to.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from martinet.messaging.message import MessageError, build
from martinet.swiftlets.queuemanager.api import ROUTER, QueueError, QueueManager

from .api import IDENTITY_ANNOTATION, MANAGEMENT_QUEUE, VERSION, Identity, Status
from .requests import Refused, decode_request

__all__ = ["RemoteRequests"]

log = logging.getLogger(__name__)

REPLY_CREDIT = 16  # replies taken at once


class RemoteRequests:
    """Requests to other routers' ``sys$mgmt`` and their replies, on ``router``'s queue
    manager (set by :meth:`run`); ``answer`` makes a reply of this router's own (status,
    result or error) for a request that could not be sent or was not answered."""

    def __init__(self, router: str, answer: Callable[..., dict[str, Any]]):
        self.router = router
        self._answer = answer
        self._numbers = itertools.count(1)  # of the correlation-ids
        self._pending: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}  # requests awaiting replies
        self._manager: QueueManager | None = None
        self._reply_queue: Any = None

    async def run(
        self, manager: QueueManager, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Take the replies until cancelled; the reply queue goes with it."""
        self._manager = manager
        self._reply_queue = manager.create_temporary_queue(self, ROUTER)
        consumer = self._reply_queue.consumer(owner=self)
        consumer.set_credit(REPLY_CREDIT)
        task_status.started()
        try:
            while True:
                entry = await consumer.receive()
                consumer.accept(entry)
                consumer.flow(1)
                try:
                    waiter = self._pending.get(entry.message.properties.correlation_id)
                    reply = decode_request(entry.message.body())
                except (MessageError, Refused) as exc:
                    log.info("management reply dropped: %s", exc)
                    continue
                if waiter is not None:
                    try:
                        waiter.send_nowait(reply)
                    except trio.WouldBlock:  # a second reply to one request
                        pass
        finally:
            consumer.close()
            manager.delete_temporary_queues(self)

    async def request(
        self, router: str, request: Mapping[str, Any], identity: Identity, timeout: float = 10.0
    ) -> dict[str, Any]:
        """``request`` served by ``router``'s ``sys$mgmt`` under ``identity``: its reply, or
        one of this router's own with status 503 if it cannot be sent or none came in
        ``timeout`` seconds."""
        assert self._manager is not None, "not running"
        correlation = f"{self.router}:mgmt:{next(self._numbers)}"
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._pending[correlation] = send
        try:
            reply_to = f"{self._reply_queue.name}@{self.router}"  # this router's own: it may send there
            message = build(
                json.dumps({"version": VERSION, **request}),
                correlation_id=correlation,
                reply_to=reply_to,
                annotations={IDENTITY_ANNOTATION: attrs.evolve(identity, reply_to=reply_to).annotation()},
            )
            try:
                self._manager.send_nowait(f"{MANAGEMENT_QUEUE}@{router}", message)
            except QueueError as exc:
                return self._answer(Status.UNAVAILABLE, error=f"cannot reach router {router}: {exc}")
            with trio.move_on_after(timeout if math.isfinite(timeout) else math.inf):
                return await receive.receive()
            return self._answer(Status.UNAVAILABLE, error=f"router {router} did not answer in {timeout} s")
        finally:
            del self._pending[correlation]
