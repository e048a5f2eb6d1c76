"""Routing listeners: each accepts sockets (TLS ones with a certificate), checks the host
access list and hands each to a :class:`~.links.Link` of the listener role. What any peer can
repeat at will is bounded per address: at most :attr:`.links.HandshakeThrottle.MAX_PENDING`
handshakes under way, a delay after failed ones that doubles with each wrong password, and a
log of refusals limited per address and minute. A listener added at runtime is bound at
once, so that a port in use refuses the add with the reason; one removed closes its links."""

from __future__ import annotations

import contextlib
import itertools
import logging
import ssl
import time
from typing import Any

import trio

from martinet.kernel import Entity, SwiftletContext, Veto
from martinet.kernel.logs import HostLimitedLog
from martinet.messaging.like import like_pattern
from martinet.messaging.listening import Accepted, listen, port_of

from .config import ListenerConfig
from .links import CLOSE_TIMEOUT, HandshakeThrottle, Link, LinkOwner, LinkStarter, SettingsOf, stamp
from .stages import AUTH_FAILED, LinkMachine, Role

__all__ = ["Listeners"]

log = logging.getLogger(__name__)

# What a listener accepts: a TCP connection, with TLS on top when the listener has a certificate.
_Accepted = Accepted


class Listeners(LinkStarter):
    """The routing listeners of one router, by name: their cancel scopes and the links each
    accepted (``links``); the links belong to ``owner``, with the settings ``settings(config)``
    makes. ``nursery``: where they run, set while the swiftlet runs."""

    def __init__(self, context: SwiftletContext, owner: LinkOwner, settings: SettingsOf):
        super().__init__(context, owner, settings)
        self._scopes: dict[str, trio.CancelScope] = {}
        self.links: dict[str, set[Link]] = {}
        self.handshakes = HandshakeThrottle()
        # a listener link that fails its handshake: one line per peer address and minute, then a count
        self.handshake_log = HostLimitedLog(log, "%s from %s closed: %s", "routing handshakes from %s refused")
        self._link_numbers = itertools.count(1)
        self._usage = context.usage.add_list("listeners")
        self._lost: dict[str, dict[str, Any]] = {}  # by peer router: see lost()
        self._usage_lost = context.usage.add_list("lost-links")

    def lost(self, link: Link) -> None:
        """Keep the listener side's last word on a link a neighbour dialed: when that router is
        gone, nobody else can tell the network map (a crawl asks the dialing router for its
        connectors) that the link was there and since when it is down. One entry per peer
        router, until a link from it is operational again (:meth:`found`)."""
        assert link.peer is not None
        entry = {
            "listener": link.name,
            "address": link.address,
            "state": link.state.value,
            "since": stamp(time.time()),
            "last-error": link.error or "",
        }
        self.found(link.peer)
        self._lost[link.peer] = entry
        self._usage_lost.add(link.peer, lambda: entry)

    def found(self, peer: str) -> None:
        """A link with ``peer`` is operational: it is no longer lost."""
        if self._lost.pop(peer, None) is not None:
            self._usage_lost.remove(peer)

    def added(self, entity: Entity) -> None:
        """Bind the listener now, so that an add with a port in use is refused with the reason."""
        if entity.name in self._scopes:  # bound at start, before the list was bound
            return
        try:
            listeners = self.bind(entity.config)
        except (OSError, ssl.SSLError) as exc:
            raise Veto(str(exc)) from None
        self.start(entity, listeners)

    def removed(self, entity: Entity) -> None:
        scope = self._scopes.pop(entity.name, None)
        if scope is not None:
            links = self.links.pop(entity.name, set())
            for link in links:
                link.close(f"listener {entity.name} removed")
            scope.cancel()

    @staticmethod
    def bind(config: ListenerConfig) -> list[trio.abc.Listener[_Accepted]]:
        """The listening sockets of ``config`` (TLS ones with a certificate).

        Raises: OSError (e.g. the port is in use) or ssl.SSLError, with the listener named."""
        where = f"routing listener {config.name}"
        return listen(where, config.bindaddress, config.port, certificate=config.tls_certificate, key=config.tls_key)

    def start(self, entity: Entity, listeners: list[trio.abc.Listener[_Accepted]]) -> None:
        """Show the bound listener in usage and start accepting on it."""
        config: ListenerConfig = entity.config
        port = port_of(listeners)
        counts = {"port": port, "links": 0, "accepted": 0, "refused": 0}
        self._usage.add(config.name, lambda: dict(counts))
        self._scopes[config.name] = scope = trio.CancelScope()
        log.info(
            "routing listener %s on %s:%d%s",
            config.name,
            config.bindaddress,
            port,
            " (TLS)" if config.tls_certificate else "",
        )
        assert self.nursery is not None  # listeners are started while the swiftlet runs
        self.nursery.start_soon(self._serve, entity, listeners, counts, scope)

    async def _serve(
        self,
        entity: Entity,
        listeners: list[trio.abc.Listener[_Accepted]],
        counts: dict[str, int],
        scope: trio.CancelScope,
    ) -> None:
        """Accept links on ``listeners`` until the listener is removed or the swiftlet stops."""
        name = entity.name
        links = self.links.setdefault(name, set())

        async def handle(stream: _Accepted) -> None:
            live: ListenerConfig = entity.config
            transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
            try:
                host, peer_port = transport.socket.getpeername()[:2]
            except OSError:  # the peer is gone already
                await trio.aclose_forcefully(stream)
                return
            pending = sum(
                1
                for others in self.links.values()
                for other in others
                if other.operational is None and other.address.rpartition(":")[0] == host
            )
            if pending >= HandshakeThrottle.MAX_PENDING:
                counts["refused"] += 1
                self.handshake_log.warn(
                    host, f"routing link to listener {name}", f"{pending} handshakes from there under way already"
                )
                await trio.aclose_forcefully(stream)
                return
            if live.host_access_list and not any(like_pattern(p).matches(host) for p in live.host_access_list):
                counts["refused"] += 1
                self.handshake_log.warn(host, f"routing link to listener {name}", "not in the host access list")
                refusal = LinkMachine(Role.LISTENER, self.context.router_name, None, now=trio.current_time())
                refusal.close(
                    f"{host} is not in the host access list of routing listener {name} of {self.context.router_name}"
                )
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        await stream.send_all(refusal.data_to_send() or b"")
                    await stream.aclose()
                return
            counts["accepted"] += 1
            counts["links"] += 1
            link = self.new_link(
                stream,
                live,
                role=Role.LISTENER,
                name=f"listener:{name}:{next(self._link_numbers)}",
                address=f"{host}:{peer_port}",
            )
            links.add(link)
            try:
                await trio.sleep(self.handshakes.delay(host, trio.current_time()))  # after failures from there
                await link.run()
            finally:
                links.discard(link)
                counts["links"] -= 1
                # only a wrong password is a guess to slow down; garbage is refused at once anyway
                operational = link.operational is not None
                guessed = not operational and AUTH_FAILED in (link.error or "")
                self.handshakes.ended(host, trio.current_time(), operational=operational, wrong_password=guessed)

        try:
            async with trio.open_nursery() as link_tasks:
                with scope:  # cancelled when the listener is removed: accept no more
                    await trio.serve_listeners(handle, listeners, handler_nursery=link_tasks)
                for listener in listeners:
                    await listener.aclose()
                # the removal closed the links: their CLOSE frames get a moment to be written
                link_tasks.cancel_scope.deadline = trio.current_time() + CLOSE_TIMEOUT
        finally:
            self._usage.remove(name)
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
