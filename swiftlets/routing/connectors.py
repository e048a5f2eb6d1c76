"""Routing connectors: each runs a task that dials its router, runs a link of the connector
role until it ends, waits (``retry-time``, or an exponential backoff) and dials again — while
enabled. A connector whose link was refused for a bad password waits the same delay: it never
hammers the peer. Enabling or disabling takes effect at once (the link closes), any other
change reconnects now; a removed connector's link gets a moment to write its close. Each
connector's state goes to usage and the bus (:class:`.api.LinkStateChanged`): a link that
fails, waits and tries again keeps the time it began failing."""

from __future__ import annotations

import logging
import ssl
import time
from typing import Any

import trio

from martinet.kernel import Change, Entity, SwiftletContext

from .api import LinkState, LinkStateChanged
from .config import ConnectorConfig, RetryPolicy
from .links import CLOSE_TIMEOUT, Link, LinkOwner, LinkStarter, SettingsOf, describe, stamp
from .stages import Role

__all__ = ["Connector", "Connectors"]

log = logging.getLogger(__name__)

BACKOFF_START = 2.0  # seconds: the first delay of an exponential retry policy (Qpid's)
#: The states a failing connector's retries go through; they do not start a new "since".
_RETRY_CYCLE = frozenset({LinkState.FAILED, LinkState.WAITING, LinkState.CONNECTING})


class Connector:
    """A connector's task state: its scope, its current link, and what usage shows."""

    def __init__(self, entity: Entity):
        self.entity = entity
        self.scope = trio.CancelScope()
        self.wakeup = trio.Event()
        self.link: Link | None = None
        self.last_peer = ""  # the router it reached last (for the network map while it is down)
        self.state = LinkState.WAITING
        self.since = time.time()  # when the state began (a retry of a failing link does not move it)
        self.failing = False  # attempts fail since the link was last operational (a retry loop)
        self.error: str | None = None
        self.error_time: float | None = None  # when this error first happened (its repeats do not move it)
        self.previous_error = ""  # the last error before the link became operational again
        self.previous_error_time: float | None = None
        self.attempts = 0
        self.next_attempt: float | None = None

    def wake(self) -> None:
        self.wakeup.set()

    def enter(self, state: LinkState, error: str | None) -> None:
        """Take ``state`` (and ``error``): a link that fails, waits and tries again keeps the
        time it began failing, and an error that repeats keeps the time it first happened, so
        an operator reads how long it has been down, not when the last retry was. An error
        does not outlive the link's recovery: it moves to the previous error, with its time."""
        now = time.time()
        retrying = _RETRY_CYCLE
        if state is not self.state and not (self.failing and self.state in retrying and state in retrying):
            self.since = now
        if state is LinkState.FAILED:
            self.failing = True
        elif state in (LinkState.OPERATIONAL, LinkState.DISABLED):
            self.failing = False
        self.state = state
        if error is not None and error != self.error:
            self.error, self.error_time = error, now
        if state is LinkState.OPERATIONAL and self.error is not None:
            self.previous_error, self.previous_error_time = self.error, self.error_time
            self.error = self.error_time = None

    def usage(self) -> dict[str, Any]:
        config = self.entity.config
        return {
            "state": self.state.value,
            "hostname": config.hostname,
            "port": config.port,
            "routername": self.link.peer if self.link else "",
            "last-routername": self.last_peer,
            "attempts": self.attempts,
            "since": stamp(self.since),
            "last-error": self.error or "",
            "last-error-time": stamp(self.error_time),
            "previous-error": self.previous_error,
            "previous-error-time": stamp(self.previous_error_time),
            "next-attempt": stamp(self.next_attempt),
        }


class Connectors(LinkStarter):
    """The connectors of one router's ``sys$routing``, by name; their links belong to
    ``owner``, with the settings ``settings(config)`` makes. ``nursery``: where their tasks
    run, set while the swiftlet runs."""

    def __init__(self, context: SwiftletContext, owner: LinkOwner, settings: SettingsOf):
        super().__init__(context, owner, settings)
        self._by_name: dict[str, Connector] = {}
        self._usage = context.usage.add_list("connectors")

    def get(self, name: str) -> Connector | None:
        return self._by_name.get(name)

    def added(self, entity: Entity) -> None:
        connector = self._by_name[entity.name] = Connector(entity)
        usage = self._usage.add(entity.name, connector.usage)
        for verb, value in (("enable", True), ("disable", False)):

            def switch(value: bool = value, verb: str = verb) -> str:
                entity.set("enabled", value)
                return f"connector {entity.name} {verb}d"

            usage.add_operation(verb, switch, f"{verb.capitalize()} this connector (sets its enabled property).")
        entity.on_change(lambda change: self._changed(connector, change))
        assert self.nursery is not None  # connectors are added while the swiftlet runs
        self.nursery.start_soon(self._connect_forever, connector)

    def removed(self, entity: Entity) -> None:
        connector = self._by_name.pop(entity.name, None)
        if connector is not None:
            self._usage.remove(entity.name)
            if connector.link is not None:
                connector.link.close(f"connector {entity.name} removed")
                connector.scope.deadline = trio.current_time() + CLOSE_TIMEOUT  # time to write the CLOSE
            else:
                connector.scope.cancel()

    def _changed(self, connector: Connector, change: Change) -> None:
        """Enabling or disabling takes effect at once; any other change reconnects now."""
        if connector.link is not None and (change.field != "enabled" or not change.new):
            why = "disabled" if change.field == "enabled" else f"{change.xml_name} changed"
            connector.link.close(f"connector {connector.entity.name} {why}")
        connector.attempts = 0  # a fresh start: the backoff begins again
        connector.wake()

    def set_state(self, connector: Connector, state: LinkState, error: str | None = None) -> None:
        connector.enter(state, error)
        self.context.bus.publish(
            LinkStateChanged(
                link=f"connector:{connector.entity.name}",
                peer=connector.link.peer if connector.link else None,
                state=state,
                error=error,
                since=connector.since,
            )
        )

    async def _connect_forever(self, connector: Connector) -> None:
        with connector.scope:
            while True:
                config: ConnectorConfig = connector.entity.config
                if not config.enabled:
                    self.set_state(connector, LinkState.DISABLED)
                    while not connector.entity.config.enabled:
                        await connector.wakeup.wait()
                        connector.wakeup = trio.Event()
                    continue
                connector.wakeup = trio.Event()
                operational = await self._attempt(connector, config)
                if self._by_name.get(connector.entity.name) is not connector:
                    return  # removed
                if not connector.entity.config.enabled or connector.wakeup.is_set():
                    continue  # disabled or changed: act on it now
                delay = self._retry_delay(config, connector, operational)
                connector.next_attempt = time.time() + delay
                if connector.state is not LinkState.FAILED:
                    self.set_state(connector, LinkState.WAITING)
                with trio.move_on_after(delay):
                    await connector.wakeup.wait()
                connector.next_attempt = None

    def _retry_delay(self, config: ConnectorConfig, connector: Connector, operational: bool) -> float:
        cap = config.retry_time / 1000
        if config.retry_policy is RetryPolicy.FIXED:
            return cap
        if operational:
            connector.attempts = 1
        return min(cap, BACKOFF_START * 2 ** max(0, connector.attempts - 1))

    async def _attempt(self, connector: Connector, config: ConnectorConfig) -> bool:
        """One connection attempt and the link's whole life; whether it became operational."""
        name = config.name
        connector.attempts += 1
        self.set_state(connector, LinkState.CONNECTING)
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self.context.config.stage_valid_timeout / 1000):
                stream = await trio.open_tcp_stream(config.hostname, config.port)
                if config.use_tls:
                    tls = ssl.create_default_context(cafile=config.tls_ca or None)
                    tls.check_hostname = config.tls_check_hostname
                    stream = trio.SSLStream(stream, tls, server_hostname=config.hostname)
                    await stream.do_handshake()
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
            if stream is not None:  # the TLS handshake failed: close the TCP socket under it
                await trio.aclose_forcefully(stream)
            reason = f"cannot connect to {config.hostname}:{config.port}: " + (
                "timed out" if isinstance(exc, trio.TooSlowError) else describe(exc)
            )
            if connector.error != reason:
                log.warning("routing connector %s: %s", name, reason)
            self.set_state(connector, LinkState.FAILED, reason)
            return False
        assert stream is not None
        link = self.new_link(
            stream, config, role=Role.CONNECTOR, name=f"connector:{name}", address=f"{config.hostname}:{config.port}"
        )
        connector.link = link
        try:
            await link.run()
        finally:
            connector.link = None
            connector.last_peer = link.peer or connector.last_peer
        if connector.state is not link.state:
            self.set_state(connector, link.state)
        return link.operational is not None
