"""A blocking facade over the trio client, for plain scripts.

    from martinet.messaging.client.blocking import BlockingConnection
    from martinet.messaging.client import Queue, TextMessage

    with BlockingConnection("amqp://localhost:5672") as connection:
        session = connection.session()
        session.producer(Queue("orders")).send(TextMessage("hello"))
        print(session.consumer(Queue("orders")).receive(timeout=5).text)

The connection's trio loop runs in a helper thread; every method of the wrapped objects
(connection, sessions, producers, consumers, browsers, requestors) is the async method of
the same name, run there and waited for. Consumers and browsers iterate with a plain
``for``. In CLIENT_ACKNOWLEDGE mode call ``session.acknowledge()`` (a message's own
``acknowledge()`` is a coroutine). Objects are not meant to be shared between threads.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

import trio

from ._connection import Connection, connect
from ._links import Attaching
from ._session import Browser, Consumer, Producer, Requestor, Session

__all__ = ["BlockingConnection"]

_WRAPPED = (Connection, Session, Producer, Consumer, Browser, Requestor)


class _Blocking:
    """A client object whose methods block; results that are client objects are wrapped too."""

    def __init__(self, target: Any, token: trio.lowlevel.TrioToken):
        self._target = target
        self._token = token

    def _run(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            result = function(*args, **kwargs)
            if inspect.isawaitable(result) or isinstance(result, Attaching):
                result = await result
            return result

        result = trio.from_thread.run(call, trio_token=self._token)
        return _Blocking(result, self._token) if isinstance(result, _WRAPPED) else result

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if callable(attribute) and not isinstance(attribute, type):
            return functools.partial(self._run, attribute)
        return attribute

    def __iter__(self) -> Any:
        iterator = self._target.__aiter__()
        while True:
            try:
                yield self._run(iterator.__anext__)
            except StopAsyncIteration:
                return

    def __enter__(self) -> _Blocking:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._run(self._target.close)

    def __repr__(self) -> str:
        return f"<blocking {self._target!r}>"


class BlockingConnection(_Blocking):
    """:func:`..connect` for plain code: same arguments; raises the same errors."""

    def __init__(self, url: str = "amqp://localhost:5672", **options: Any):
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, url, options), daemon=True, name=f"martinet-client {url}"
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, url: str, options: dict[str, Any]) -> None:
        try:
            async with connect(url, **options) as connection:
                self._stop = trio.Event()
                _Blocking.__init__(self, connection, trio.lowlevel.current_trio_token())
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # handed to the caller's thread, raised there
            self._error = exc
        finally:
            self._ready.set()

    def close(self) -> None:
        """Close the connection and end its thread."""
        if self._thread.is_alive() and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
