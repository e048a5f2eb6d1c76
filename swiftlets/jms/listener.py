"""The AMQP 1.0 listener: accepted sockets, SASL, the engine, and links to queues.

Theory of operation
-------------------
One :class:`AmqpConnection` per accepted socket, with two tasks: the reader feeds the
socket's bytes to SASL (:mod:`.sasl`) and then to the engine (:mod:`.engine`) and handles
the engine's events; the writer sends what the engine has to send whenever something
woke it (events handled, a queue delivered to one of our consumers, a message became
durable). Both run in the router's trio thread, so the engine needs no lock.

Links (so far: queues):

- a link on which the client *sends* (our receiver) puts each complete transfer into the
  queue named by its target with ``send_nowait``, and settles the transfer as accepted
  when the message is durable (at once for a non-persistent one); credit is topped up to
  ``incoming-credit`` as it is used;
- a link on which the client *receives* (our sender) is a queue consumer whose credit
  follows the link's credit; deliveries are sent as they arrive, and the client's
  outcome (accepted, released, rejected, modified) settles the queue entry. Closing the
  link or losing the connection releases what is unsettled.

Refused attaches get the AMQP conditions ``amqp:not-found`` (unknown queue),
``amqp:unauthorized-access`` (no grant) or ``amqp:invalid-field``.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import proton
import trio

from messaging.message import Message
from swiftlets.queuemanager import ConsumerRefused, QueueError, QueueFull, QueueNotFound

from .engine import Engine, EngineClosed, delivery_tag, ffi, lib, receive_transfer, send_transfer, settle
from .sasl import SaslError, SaslServer

log = logging.getLogger(__name__)

SASL_TIMEOUT = 30.0


class _Refused(Exception):
    def __init__(self, condition: str, description: str):
        super().__init__(description)
        self.condition = condition


class IncomingLink:
    """A link the client sends on: transfers go into a queue."""

    def __init__(self, connection: AmqpConnection, link: proton.Link, address: str):
        self.connection = connection
        self.link = link
        self.pointer = link._impl
        self.address = address
        self.window = connection.config.incoming_credit
        lib.pn_link_flow(self.pointer, self.window)

    def on_delivery(self, delivery: Any) -> None:
        data = receive_transfer(self.pointer, delivery)
        if data is None:
            return
        remotely_settled = lib.pn_delivery_settled(delivery)
        connection = self.connection

        def durable(error: BaseException | None) -> None:
            if connection.closed or remotely_settled:
                return
            settle(delivery, lib.PN_REJECTED if error else lib.PN_ACCEPTED)
            connection.wake()

        try:
            connection.qm.send_nowait(self.address, Message(data), on_durable=durable)
        except QueueError as exc:
            log.info("transfer to %s refused: %s", self.address, exc)
            if not remotely_settled:
                condition = lib.pn_disposition_condition(lib.pn_delivery_local(delivery))
                lib.pn_condition_set_name(condition, b"amqp:resource-limit-exceeded" if isinstance(exc, QueueFull)
                                          else b"amqp:invalid-field")
                lib.pn_condition_set_description(condition, str(exc).encode())
                settle(delivery, lib.PN_REJECTED)
        if remotely_settled:
            lib.pn_delivery_settle(delivery)
        credit = lib.pn_link_credit(self.pointer)
        if credit < self.window // 2:
            lib.pn_link_flow(self.pointer, self.window - credit)

    def close(self) -> None:
        pass


class OutgoingLink:
    """A link the client receives on: a queue consumer whose credit follows the link's."""

    def __init__(self, connection: AmqpConnection, link: proton.Link, consumer: Any):
        self.connection = connection
        self.link = link
        self.pointer = link._impl
        self.consumer = consumer
        self.presettled = link.snd_settle_mode == proton.Link.SND_SETTLED
        self.unsettled: dict[bytes, Any] = {}
        self._tags = itertools.count(1)
        consumer.notify = connection.wake

    def sync_credit(self) -> None:
        self.consumer.set_credit(lib.pn_link_credit(self.pointer) - len(self.consumer._buffer))

    def pump(self) -> None:
        """Send what the consumer received, within the link's credit."""
        pointer, consumer = self.pointer, self.consumer
        while lib.pn_link_credit(pointer) > 0:
            try:
                entry = consumer.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError):
                break
            message = entry.message if not entry.delivery_count else entry.message.with_delivery_count(
                entry.delivery_count)
            tag = str(next(self._tags)).encode()
            send_transfer(pointer, tag, message.raw, settled=self.presettled)
            if self.presettled:
                consumer.accept(entry)
            else:
                self.unsettled[tag] = entry
        if lib.pn_link_get_drain(pointer) and lib.pn_link_credit(pointer) > 0 and not consumer._buffer:
            consumer.drain()
            lib.pn_link_drained(pointer)

    def on_delivery(self, delivery: Any) -> None:
        if not (lib.pn_delivery_updated(delivery) or lib.pn_delivery_settled(delivery)):
            return
        entry = self.unsettled.pop(delivery_tag(delivery), None)
        state = lib.pn_delivery_remote_state(delivery)
        lib.pn_delivery_settle(delivery)
        if entry is None:
            return
        consumer = self.consumer
        if state == lib.PN_RELEASED:
            consumer.release(entry)
        elif state == lib.PN_REJECTED:
            consumer.reject(entry, "rejected by the client")
        elif state == lib.PN_MODIFIED:
            disposition = lib.pn_delivery_remote(delivery)
            consumer.modify(entry, delivery_failed=bool(lib.pn_disposition_is_failed(disposition)),
                            undeliverable_here=bool(lib.pn_disposition_is_undeliverable(disposition)))
        else:  # accepted, or settled by the client without an outcome
            consumer.accept(entry)

    def close(self) -> None:
        self.consumer.notify = None
        self.consumer.close()


class AmqpConnection:
    """One client connection."""

    def __init__(self, swiftlet: Any, config: Any, stream: trio.abc.Stream, host: str):
        self.swiftlet = swiftlet
        self.config = config
        self.stream = stream
        self.host = host
        self.qm = swiftlet.qm
        self.principal: Any = None
        self.engine: Engine | None = None
        self.links: dict[Any, IncomingLink | OutgoingLink] = {}
        self.closed = False
        self._wakeup = trio.Event()
        self._handlers = {
            lib.PN_CONNECTION_REMOTE_OPEN: self._on_connection_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self._on_connection_close,
            lib.PN_SESSION_REMOTE_OPEN: self._on_session_open,
            lib.PN_SESSION_REMOTE_CLOSE: self._on_session_close,
            lib.PN_LINK_REMOTE_OPEN: self._on_link_open,
            lib.PN_LINK_REMOTE_CLOSE: self._on_link_close,
            lib.PN_LINK_REMOTE_DETACH: self._on_link_close,
            lib.PN_LINK_FLOW: self._on_flow,
            lib.PN_DELIVERY: self._on_delivery,
        }

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        try:
            remaining = await self._authenticate()
            if remaining is None:
                return
            self.engine = Engine(server=True, container_id=f"martinet:{self.swiftlet.router_name}",
                                 idle_timeout=self.config.keepalive_interval / 1000,
                                 max_frame_size=self.config.max_frame_size)
            if remaining:  # (empty is not end of input here)
                self.engine.receive_data(remaining)
            self._handle_events()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_forever)
                await self._read_forever()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, EngineClosed) as group:
            log.debug("connection from %s ended: %s", self.host, group.exceptions[0])
        finally:
            self._release()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()

    async def _authenticate(self) -> bytes | None:
        """SASL in front of the engine; the bytes that follow it, or None if refused."""
        sasl = SaslServer()
        credentials = None
        with trio.move_on_after(SASL_TIMEOUT) as timer:
            while credentials is None:
                data = await self.stream.receive_some(4096)
                if not data:
                    return None
                try:
                    credentials = sasl.receive_data(data)
                except SaslError as exc:
                    log.info("connection from %s refused: %s", self.host, exc)
                    await self.stream.send_all(sasl.data_to_send)
                    return None
                if out := sasl.data_to_send:
                    await self.stream.send_all(out)
        if timer.cancelled_caught:
            log.info("connection from %s closed: no SASL exchange within %.0f s", self.host, SASL_TIMEOUT)
            return None
        try:
            self.principal = self.swiftlet.login(credentials, self.host)
        except Exception as exc:  # AuthenticationFailed: logged by the authentication swiftlet
            log.debug("login refused: %s", exc)
            sasl.refuse()
            await self.stream.send_all(sasl.data_to_send)
            return None
        sasl.accept()
        await self.stream.send_all(sasl.data_to_send)
        return sasl.remaining

    async def _read_forever(self) -> None:
        assert self.engine is not None
        engine = self.engine
        while not engine.closed:
            deadline = engine.tick(trio.current_time())
            with trio.move_on_at(deadline if deadline else float("inf")):
                data = await self.stream.receive_some(65536)
                engine.receive_data(data)
                if not data:
                    self._handle_events()
                    self.wake()
                    return
            self._handle_events()
            self.wake()

    async def _write_forever(self) -> None:
        assert self.engine is not None
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            for link in list(self.links.values()):
                if isinstance(link, OutgoingLink):
                    link.pump()
            self._handle_events()
            data = self.engine.data_to_send()
            if data is None:
                return
            if data:
                await self.stream.send_all(data)

    def _handle_events(self) -> None:
        engine = self.engine
        assert engine is not None
        handlers = self._handlers
        while (event := engine.next_event()) != ffi.NULL:
            handler = handlers.get(lib.pn_event_type(event))
            if handler is not None:
                handler(event)
            engine.pop_event()

    # -- events ---------------------------------------------------------------------------------

    def _on_connection_open(self, event: Any) -> None:
        self.engine.connection.open()

    def _on_connection_close(self, event: Any) -> None:
        self.engine.connection.close()

    def _on_session_open(self, event: Any) -> None:
        proton.Session.wrap(lib.pn_event_session(event)).open()

    def _on_session_close(self, event: Any) -> None:
        proton.Session.wrap(lib.pn_event_session(event)).close()

    def _on_link_open(self, event: Any) -> None:
        link = proton.Link.wrap(lib.pn_event_link(event))
        try:
            if link.is_sender:
                state: IncomingLink | OutgoingLink = self._attach_outgoing(link)
            else:
                state = self._attach_incoming(link)
        except _Refused as refusal:
            log.info("attach from %s refused: %s", self.host, refusal)
            link.condition = proton.Condition(refusal.condition, str(refusal))
            link.open()
            link.close()
            return
        self.links[link._impl] = state
        link.open()
        if isinstance(state, OutgoingLink):
            state.sync_credit()

    def _check(self, address: str | None, action: str) -> str:
        if not address:
            raise _Refused("amqp:invalid-field", "a queue address is required")
        try:
            self.qm.queue(address)
            if self.principal is not None:
                self.principal.check_queue(address, action)
        except QueueNotFound as exc:
            raise _Refused("amqp:not-found", str(exc)) from None
        except QueueError as exc:
            raise _Refused("amqp:invalid-field", str(exc)) from None
        except Exception as exc:  # AccessDenied
            raise _Refused("amqp:unauthorized-access", str(exc)) from None
        return address

    def _attach_incoming(self, link: proton.Link) -> IncomingLink:
        address = self._check(link.remote_target.address, "send")
        link.target.address = address
        return IncomingLink(self, link, address)

    def _attach_outgoing(self, link: proton.Link) -> OutgoingLink:
        address = self._check(link.remote_source.address, "receive")
        try:
            consumer = self.qm.queue(address).consumer(owner=self)
        except ConsumerRefused as exc:
            raise _Refused("amqp:resource-locked", str(exc)) from None
        link.source.address = address
        return OutgoingLink(self, link, consumer)

    def _on_link_close(self, event: Any) -> None:
        pointer = lib.pn_event_link(event)
        state = self.links.pop(pointer, None)
        if state is not None:
            state.close()
        link = proton.Link.wrap(pointer)
        if link.state & proton.Endpoint.LOCAL_ACTIVE:
            link.close()

    def _on_flow(self, event: Any) -> None:
        state = self.links.get(lib.pn_event_link(event))
        if isinstance(state, OutgoingLink):
            state.sync_credit()

    def _on_delivery(self, event: Any) -> None:
        delivery = lib.pn_event_delivery(event)
        state = self.links.get(lib.pn_delivery_link(delivery))
        if state is not None:
            state.on_delivery(delivery)

    def _release(self) -> None:
        self.closed = True
        for state in self.links.values():
            state.close()
        self.links.clear()
