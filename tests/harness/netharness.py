"""A network of real ``martinet run`` processes under faults, with counted traffic.

Theory of operation
-------------------
:class:`ProcessNetwork` starts one ``martinet run`` process per router of a
:class:`Topology`, each from a generated config in its own folder (its store, its log), and
puts a :class:`~tests.harness.faultproxy.FaultProxy` on every link: the connector dials the proxy, the
proxy the listener. Every router has a static route to every other one, so a producer's
``q@R`` is accepted (into ``rt$R``) even while R is down or cut off: messages wait and move
on later (store and forward). Listeners have passwords (each its own) and a keepalive of
1 s, connectors retry every second; ``xa=False`` sets ``use-xa="false"`` on both ends.

:class:`Producer` sends numbered persistent messages (application properties ``producer``
and ``seq``, message-id ``ID:<producer>-<seq>``, so a message can be looked up in the
stores and duplicate backlogs) one at a time: ``send`` returns when the router has the message stored. So a
message counts as **sent** only once its router accepted it; a send that ends with the
connection is **in doubt** (the router may or may not have it) and is never sent again, so
that any second copy anywhere is a duplicate made by the network. A producer reconnects
while its router is down or restarting.

:class:`Consumer` receives from ``q`` on the destination router in a transacted session and
commits every ``batch`` messages: what a committed batch held is **received** for good (a
second copy of it later is a **duplicate**). A batch whose commit did not come back
(connection lost) is **in doubt at the consumer**: the router may or may not have
committed it. The harness does not guess: each batch's transaction also sends a *receipt*
(its number) to the consumer's own queue ``receipts-<n>`` on that router, so the receipt
exists exactly when the batch was committed (the router's local transactions are atomic:
that is one of the promises under test too). :meth:`Consumer.settle_doubt` reads the
receipts at the end: an in-doubt batch with a receipt was received (a copy of it that came
again is a duplicate), one without was not (its messages must come again, or they are
lost). The verdict's "in doubt at the consumer" row counts the messages so settled.

:func:`verdict` compares what the producers had accepted with what the consumers received,
per producer: lost (sent, never received), duplicated, out of order (a seq lower than one
already received from that producer: allowed where the path changed, reported only),
in doubt (at the producer: how many of them arrived anyway; at the consumer).

:meth:`ProcessNetwork.inject` applies one fault: ``kill`` (SIGKILL of a router process,
then a restart; as with ``kill -9`` of its pid, its store engine is left to finish what it
had read and exit), ``kill-store`` (SIGKILL of a router's store engine process: the router stops
itself; restart), ``cut`` (every connection of a link closed; the connector dials again),
``blackhole`` (a half-open link: nothing passes, nothing errors, until keepalive notices;
then cut and healed), ``one-way`` (the same, one direction only: a partition where one
side still hears the other), ``delay`` and ``disk-full`` (the router's store file system
filled to the last byte by a ballast file, removed when the fault ends: its producers are
refused, its commits wait; needs ``disks``: each router's store on a tmpfs of its own,
mounted by the harness as root and unmounted at the end). :func:`chaos` runs producers and consumers, injects a
fault per round from a seeded random schedule, drains (waits, bounded, until every sent
message has arrived, then a little longer for late duplicates) and returns the
:class:`Results`; ``bench/network_chaos.py`` prints them as a table.

**Topic mode** (``Schedule(mode="topics")``): the producers publish to the topic ``chaos``
instead; every router has a durable subscriber (client id ``sub-<router>``) and a
non-durable one, a :class:`Consumer` each, subscribed and known to every router
(:meth:`ProcessNetwork.wait_interest`) before the first publication. :func:`topic_verdict`
checks each subscriber against everything accepted: a durable one must have each exactly
once (as the queue consumer above: a batch in doubt may come again), whatever was killed,
its own router included (docs/reliability.md, "Testing the network under faults", says why that holds);
a non-durable one loses what comes while it or its router is away (reported), and must
never get one twice. Every process test builds its routers from :func:`network_router_xml`.

Blocking process operations (start, wait for a log line, kill) run in worker threads
(:func:`trio.to_thread.run_sync`); everything else runs in the caller's trio nursery.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import attrs
import trio

from martinet.messaging.client import ConnectionLost, DeliveryMode, JMSError, Queue, TextMessage, Topic, connect
from martinet.swiftlets.store import dbprocess

from tests.harness.faultproxy import FaultProxy
from tests.harness.processes import RouterProcess, RouterProcesses, free_port

FAULTS = ("kill", "kill-store", "cut", "blackhole", "one-way", "delay", "disk-full")
ROUTER_FAULTS = ("kill", "kill-store", "disk-full")  # aimed at a router (the rest at a link)
DISK = "128m"  # each router's store file system, with disks (disk-full)
KEEPALIVE_MS = 1000  # a half-open link is noticed after 5 intervals

# route-log="each": a line per route added or removed, which table() replays
ROUTER = """\
<router name="{name}"
        startorder="sys$log sys$store sys$authentication sys$queuemanager sys$xa sys$topicmanager sys$jms sys$routing">
  <swiftlet name="sys$log" level="INFO"/>
  <swiftlet name="sys$store" path="store" sync="normal"/>
  <swiftlet name="sys$jms">
    <listeners>
      <listener name="amqp" port="{amqp}" bind-address="127.0.0.1"/>
    </listeners>
  </swiftlet>
  <swiftlet name="sys$routing" reject-disconnect-delay="1000" route-log="each">
    <static-routes>{static}
    </static-routes>
    <listeners>
      <listener name="links" port="{routing}" bindaddress="127.0.0.1" password="{password}"
                keepalive-interval="{keepalive}" use-xa="{xa}"/>
    </listeners>
    <connectors>{connectors}
    </connectors>
  </swiftlet>
</router>
"""
CONNECTOR = """
      <connector name="{target}" hostname="127.0.0.1" port="{port}" password="{password}" retry-time="1000"
                 use-xa="{xa}"/>"""


def network_router_xml(
    name: str,
    *,
    amqp: int,
    routing: int,
    password: str,
    connectors: Iterable[tuple[str, int, str]] = (),
    static_routes: Iterable[str] = (),
    xa: bool = True,
) -> str:
    """The XML config of a full router ``name`` for a test network (the one template of every
    process test): the default stack with routing, its store in ``store`` (``sync="normal"``),
    AMQP on ``127.0.0.1:amqp``, a routing listener on ``routing`` with ``password`` and a
    keepalive of 1 s, a connector per ``(router, port, password)`` retrying every second,
    ``static_routes`` and XA on the links (or ``use-xa="false"`` on both ends)."""
    flag = "true" if xa else "false"
    return ROUTER.format(
        name=name,
        amqp=amqp,
        routing=routing,
        password=password,
        keepalive=KEEPALIVE_MS,
        xa=flag,
        static="".join(f'\n      <static-route name="{other}"/>' for other in static_routes),
        connectors="".join(
            CONNECTOR.format(target=target, port=port, password=secret, xa=flag) for target, port, secret in connectors
        ),
    )


_ROUTE = re.compile(
    r"\[(?P<router>[\w-]+)\] \S+: route to (?P<dest>[\w-]+) via (?P<hop>[\w-]+) "
    r"\(\d+ hops?: (?P<path>[\w -]+)\) (?P<change>added|removed)$",
    re.MULTILINE,
)


def table(log: str) -> dict[str, set[tuple[str, ...]]]:
    """A router's routing table as its log tells it (one INFO line per route added or
    removed with route-log="each", replayed in order): destination -> routes (paths)."""
    routes: set[tuple[str, ...]] = set()
    for match in _ROUTE.finditer(log):
        path = tuple(match["path"].split())
        assert path[0] == match["hop"] and path[-1] == match["dest"], match[0]
        if match["change"] == "added":
            routes.add(path)
        else:
            routes.discard(path)
    result: dict[str, set[tuple[str, ...]]] = {}
    for path in routes:
        result.setdefault(path[-1], set()).add(path)
    return result


@attrs.frozen
class Topology:
    """Routers, links (connector, listener) and where the traffic goes: producers on each
    of ``sources`` send to ``queue@destination``."""

    routers: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    sources: tuple[str, ...]
    destination: str
    queue: str = "chaos"


TOPOLOGIES = {
    # a → b → c: every message passes the intermediate b
    "chain": Topology(("a", "b", "c"), (("a", "b"), ("b", "c")), sources=("a",), destination="c"),
    # a, b, c all linked: a's messages go a-c, or a-b-c while a-c is down
    "triangle": Topology(("a", "b", "c"), (("a", "b"), ("b", "c"), ("c", "a")), sources=("a", "b"), destination="c"),
    # five routers, every pair linked: many paths, and a fault leaves most of them
    "mesh": Topology(
        ("a", "b", "c", "d", "e"),
        tuple(itertools.combinations(("a", "b", "c", "d", "e"), 2)),
        sources=("a", "b", "c"),
        destination="e",
    ),
}


def store_engine_pid(router_pid: int) -> int | None:
    """The pid of a router's store engine (its child ``python -P …/store/dbprocess.py``;
    Linux /proc: children are listed per thread, and trio starts processes from a worker thread)."""
    for children in Path(f"/proc/{router_pid}/task").glob("*/children"):
        for child in children.read_text().split():
            with contextlib.suppress(OSError):
                if dbprocess.__file__.encode() in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
    return None


class ProcessNetwork:
    """The routers of ``topology`` as processes in ``folder``, a proxy on every link.

    Use :func:`open_network`. ``routers[name]`` is the :class:`~processes.RouterProcess`,
    ``proxies[(connector, listener)]`` the link's proxy, ``faults`` counts what
    :meth:`inject` did by kind.
    """

    def __init__(self, folder: Path, topology: Topology, *, xa: bool = True, disks: bool = False):
        self.topology = topology
        self.xa = xa
        self.folder = folder
        self.disks = disks
        self.mounted: list[Path] = []
        self.processes = RouterProcesses(folder)
        self.routers: dict[str, RouterProcess] = {}
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        self.amqp = {name: free_port() for name in topology.routers}
        self.routing = {name: free_port() for name in topology.routers}
        self.faults: collections.Counter[str] = collections.Counter()

    def config(self, name: str) -> str:
        connectors = [
            (listener, self.proxies[(name, listener)].port, f"secret-{listener}")
            for connector, listener in self.topology.links
            if connector == name
        ]
        return network_router_xml(
            name,
            amqp=self.amqp[name],
            routing=self.routing[name],
            password=f"secret-{name}",
            connectors=connectors,
            static_routes=[r for r in self.topology.routers if r != name],
            xa=self.xa,
        )

    async def start(self, nursery: trio.Nursery) -> None:
        for connector, listener in self.topology.links:
            proxy = self.proxies[(connector, listener)] = FaultProxy("127.0.0.1", self.routing[listener])
            await nursery.start(proxy.run)
        for name in self.topology.routers:
            if self.disks:
                self._mount(self.store(name))
            xml = self.config(name)
            self.routers[name] = await trio.to_thread.run_sync(self.processes.start, xml)
        await self.wait_connected()

    def url(self, name: str) -> str:
        return f"amqp://127.0.0.1:{self.amqp[name]}"

    def store(self, name: str) -> Path:
        """Router ``name``'s store folder (``store`` in its own folder)."""
        return self.folder / name / "store"

    def _mount(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(folder)], capture_output=True
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"cannot mount a tmpfs on {folder} for disk-full (root needed): {result.stderr.decode()}"
            )
        self.mounted.append(folder)

    async def fill_disk(self, name: str, down: float) -> None:
        """Fill router ``name``'s store file system to the last byte for ``down`` seconds (at
        least 2: long enough for commits to meet it), then free it."""
        if not self.disks:
            raise ValueError("disk-full needs a network opened with disks=True")
        ballast = self.store(name) / "ballast"
        await trio.to_thread.run_sync(_fill, ballast)
        await trio.sleep(max(down, 2.0))
        ballast.unlink()

    def logs(self) -> str:
        return self.processes.logs()

    def _connected(self) -> bool:
        """Every router has a route to every router it has a link path to (all, here)."""
        names = set(self.topology.routers)
        return all(set(table(self.routers[name].current())) == names - {name} for name in names)

    async def wait_connected(self, timeout: float = 60) -> None:
        """Wait (bounded) until every router has a route to every other one.

        Raises: AssertionError with every log if the time is up."""
        with trio.move_on_after(timeout):
            while not self._connected():
                await trio.sleep(0.1)
            return
        raise AssertionError(f"the routers did not connect within {timeout} s\n{self.logs()}")

    async def wait_interest(self, root: str, timeout: float = 60) -> None:
        """Wait (bounded) until every router has logged every other one's interest in ``root``.

        Raises: AssertionError with every log if the time is up."""

        def known() -> bool:
            return all(
                f"interest of router {other}: {root}" in self.routers[name].current()
                for name in self.topology.routers
                for other in self.topology.routers
                if other != name
            )

        with trio.move_on_after(timeout):
            while not known():
                await trio.sleep(0.1)
            return
        raise AssertionError(
            f"the routers did not learn each other's interest in {root} within {timeout} s\n{self.logs()}"
        )

    async def kill(self, name: str) -> None:
        """SIGKILL router ``name`` (no cleanup: its store is as a crash leaves it)."""
        await trio.to_thread.run_sync(self.routers[name].kill)

    async def kill_store(self, name: str, timeout: float = 30) -> None:
        """SIGKILL router ``name``'s store engine; wait (bounded) until the router has
        stopped itself.

        Raises: AssertionError if there is no store engine or the router does not stop."""
        router = self.routers[name]
        pid = store_engine_pid(router.proc.pid)
        if pid is None:
            raise AssertionError(f"router {name} (pid {router.proc.pid}) has no store engine process")
        os.kill(pid, signal.SIGKILL)
        try:
            await trio.to_thread.run_sync(router.proc.wait, timeout)
        except Exception as exc:
            raise AssertionError(
                f"router {name} did not stop after its store engine was killed: {exc}; "
                f"the end of its log:\n{router.current()[-5000:]}"
            ) from None

    async def stop(self, name: str) -> None:
        """Stop router ``name`` in order (SIGTERM); raises AssertionError unless it exits 0."""
        code = await trio.to_thread.run_sync(self.routers[name].stop)
        if code != 0:
            raise AssertionError(f"router {name} stopped with exit code {code}\n{self.routers[name].current()}")

    async def restart(self, name: str) -> None:
        """Start router ``name`` again on its config and store; returns once it started."""
        await trio.to_thread.run_sync(self.routers[name].restart)

    async def inject(self, kind: str, target: str | tuple[str, str], down: float, *, round_trip: float = 0.2) -> None:
        """Apply fault ``kind`` to ``target`` (a router, or a link for cut, blackhole,
        one-way and delay: ``round_trip`` seconds, half each way) for ``down`` seconds, then end it
        (restart the router, heal the link)."""
        self.faults[kind] += 1
        if kind == "disk-full":
            assert isinstance(target, str)
            await self.fill_disk(target, down)
            return
        if kind in ("kill", "kill-store"):
            assert isinstance(target, str)
            await (self.kill(target) if kind == "kill" else self.kill_store(target))
            await trio.sleep(down)
            await self.restart(target)
            return
        proxy = self.proxies[target]  # type: ignore[index]
        if kind == "cut":
            proxy.cut()
        elif kind in ("blackhole", "one-way"):
            # one-way: a partition where one side hears the other, not the reverse (each
            # such fault turns the other way); the deaf side's keepalive ends the link
            direction = None if kind == "blackhole" else ("to_target", "to_client")[self.faults[kind] % 2]
            proxy.blackhole(True, direction=direction)
            await trio.sleep(max(down, 6 * KEEPALIVE_MS / 1000))  # long enough for keepalive to notice
            proxy.cut()  # the byte streams have holes: these connections cannot go on
        elif kind == "delay":
            proxy.delay(round_trip / 2)  # each direction
            await trio.sleep(down)
        else:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        proxy.heal()

    def close(self) -> None:
        self.processes.close()
        for folder in self.mounted:  # (after the routers: their store processes have let go)
            subprocess.run(["umount", "-l", str(folder)], check=False)
        self.mounted.clear()


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full (unbuffered: the last write is a
    short one, then one fails)."""
    chunk = bytes(1 << 20)
    with open(path, "wb", buffering=0) as file:
        try:
            while True:
                file.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


@contextlib.asynccontextmanager
async def open_network(
    folder: Path, topology: Topology, *, xa: bool = True, disks: bool = False
) -> AsyncIterator[ProcessNetwork]:
    """A started :class:`ProcessNetwork` (every route known); its processes are killed and
    its proxies closed when the block ends (``disks``: see :class:`ProcessNetwork`)."""
    network = ProcessNetwork(folder, topology, xa=xa, disks=disks)
    try:
        async with trio.open_nursery() as nursery:
            await network.start(nursery)
            yield network
            nursery.cancel_scope.cancel()
    finally:
        network.close()


# -- traffic -------------------------------------------------------------------------------------

RETRY = 0.2  # seconds between connection attempts of producers and consumers


class NumberedMessage(TextMessage):
    """A text message whose message-id is ``ID:<producer>-<seq>`` (not a random one), so
    that a message can be followed in the routers' stores and duplicate backlogs."""

    def __init__(self, producer: str, seq: int):
        super().__init__(f"{producer}-{seq}", properties={"producer": producer, "seq": seq})

    def encode(self, *, message_id: str, **headers) -> bytes:
        return super().encode(message_id=f"ID:{self.text}", **headers)


class Producer:
    """Sends seq 1, 2, … to ``address`` (a queue's name, or a :class:`Topic`) on ``url``
    until stopped (or ``count`` are sent), at most ``rate`` a second (0: as fast as the
    router accepts them). ``sent`` lists the accepted seqs, ``in_doubt`` those whose
    connection ended before the answer, ``refused`` those the router refused (e.g. while it
    stopped)."""

    def __init__(self, ident: str, url: str, address: str | Topic, *, rate: float = 0, count: int | None = None):
        self.ident = ident
        self.url = url
        self.destination = Queue(address) if isinstance(address, str) else address
        self.interval = 1 / rate if rate else 0.0
        self.count = count
        self.sent: list[int] = []
        self.in_doubt: list[int] = []
        self.refused: list[int] = []
        self._next = 1

    def _more(self, stop: trio.Event) -> bool:
        return not stop.is_set() and (self.count is None or self._next <= self.count)

    async def run(self, stop: trio.Event) -> None:
        """Send until ``stop`` is set (or ``count`` are sent); reconnect while the router is away."""
        while self._more(stop):
            with contextlib.suppress(JMSError):
                async with connect(self.url) as connection, connection.session() as session:
                    async with session.producer(self.destination, delivery_mode=DeliveryMode.PERSISTENT) as producer:
                        while self._more(stop):
                            await self._send(producer)
            if self._more(stop):
                await trio.sleep(RETRY)

    async def _send(self, producer) -> None:
        seq, self._next = self._next, self._next + 1
        try:
            await producer.send(NumberedMessage(self.ident, seq))
        except ConnectionLost:
            self.in_doubt.append(seq)
            raise
        except JMSError:
            self.refused.append(seq)
            raise
        self.sent.append(seq)
        if self.interval:
            await trio.sleep(self.interval)


class Consumer:
    """Receives from ``queue`` on ``url`` in a transacted session, committing every ``batch``
    messages (or when none came for a moment). ``received`` counts per (producer, seq) the
    copies in committed batches; ``in_doubt`` holds those of batches whose commit did not
    come back; ``out_of_order`` counts seqs received after a higher one of their producer.

    ``queue`` may be a :class:`Topic`: a subscriber, non-durable (a new subscription per
    connection: what is published while it reconnects is not its), or with ``durable``
    the durable subscription of that name of client id ``durable`` (the same on every
    connection). ``name`` labels it in results."""

    _numbers = itertools.count(1)  # receipt queues, one per consumer of a process

    def __init__(self, url: str, queue: str | Topic, *, batch: int = 50, durable: str | None = None, name: str = ""):
        self.url = url
        self.source = Queue(queue) if isinstance(queue, str) else queue
        self.durable = durable
        self.name = name or str(queue)
        self.batch = batch
        self.attached = trio.Event()  # subscribed (durable: the subscription exists)
        self.received: collections.Counter[tuple[str, int]] = collections.Counter()
        self.in_doubt: set[tuple[str, int]] = set()  # of batches whose commit did not come back
        self.receipts = f"receipts-{next(self._numbers)}"
        self._batches = itertools.count(1)
        self._doubtful: dict[int, list[tuple[str, int]]] = {}  # batch number → its keys, commit unanswered
        self._receipts: set[int] = set()  # batches known committed (their receipts read)
        self.settled_in_doubt = 0  # messages of in-doubt batches that their receipts say were committed
        self.out_of_order = 0
        self._highest: dict[str, int] = {}
        self.last_arrival = time.monotonic()

    async def run(self, stop: trio.Event) -> None:
        """Receive until ``stop`` is set and nothing more comes; reconnect while the router is away."""
        while True:
            batch: list[tuple[str, int]] = []
            try:
                async with (
                    connect(self.url, client_id=self.durable) as connection,
                    connection.session(transacted=True) as session,
                ):
                    subscribe = (
                        session.durable_subscriber(self.source, self.durable)
                        if self.durable
                        else session.consumer(self.source)
                    )
                    async with subscribe as consumer, session.producer(Queue(self.receipts)) as receipts:
                        self.attached.set()
                        while True:
                            message = await consumer.receive(0.2)
                            if message is not None:
                                batch.append((message.properties["producer"], message.properties["seq"]))
                            if batch and (message is None or len(batch) >= self.batch):
                                number = next(self._batches)
                                await receipts.send(TextMessage(str(number)))
                                try:
                                    await session.commit()
                                except JMSError:
                                    self._doubtful[number] = batch
                                    self.in_doubt.update(batch)
                                    batch = []
                                    raise
                                self._committed(batch)
                                batch = []
                            elif message is None and stop.is_set():
                                return
            except JMSError:
                pass  # (a batch not committed comes again: the router gives its messages again)
            await trio.sleep(RETRY)

    async def settle_doubt(self, timeout: float = 30) -> bool:
        """Read the receipts written so far (see the module doc) and settle the batches
        whose commit did not come back: received if the router committed them, else their
        messages are due again (:meth:`has` no longer counts them). Needs the router;
        returns whether there were any to settle."""
        if not self._doubtful:
            return False
        with trio.fail_after(timeout):
            async with connect(self.url) as connection, connection.session() as session:
                async with session.consumer(Queue(self.receipts)) as receipts:
                    while (message := await receipts.receive(0.5)) is not None:
                        self._receipts.add(int(message.text))
        for number, batch in self._doubtful.items():
            if number in self._receipts:
                self._committed(batch)
                self.settled_in_doubt += len(batch)
            else:
                self.in_doubt.difference_update(key for key in batch if not self.received[key])
        self._doubtful.clear()
        return True

    def _committed(self, batch: list[tuple[str, int]]) -> None:
        self.last_arrival = time.monotonic()
        for key in batch:
            producer, seq = key
            if key not in self.in_doubt and seq < self._highest.get(producer, 0):
                self.out_of_order += 1
            self._highest[producer] = max(seq, self._highest.get(producer, 0))
            self.received[key] += 1

    def has(self, key: tuple[str, int]) -> bool:
        """``key`` arrived in a committed batch, or in one whose commit is in doubt (not settled yet)."""
        return self.received[key] > 0 or key in self.in_doubt


@attrs.frozen
class Results:
    """What a run gave (see the module doc for the terms)."""

    rounds: int
    faults: dict[str, int]
    sent: int
    received: int
    lost: int
    duplicated: int
    out_of_order: int
    producer_in_doubt: int
    producer_in_doubt_arrived: int
    refused: int
    consumer_in_doubt: int
    drain_seconds: float
    examples: dict[str, list[tuple[str, int]]]  # a few lost and duplicated (producer, seq)
    #: Topics: each subscriber's own results (name, durable, results); the totals above count
    #: lost and received at the durable ones, duplicated at all.
    subscribers: tuple[tuple[str, bool, Results], ...] = ()

    def table(self, title: str = "") -> str:
        rows = [
            ("rounds", self.rounds),
            ("faults injected", ", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items())) or "none"),
            ("messages sent (accepted)", self.sent),
            ("received" + (" (durable subscribers)" if self.subscribers else ""), self.received),
            ("lost" + (" (durable subscribers)" if self.subscribers else ""), self.lost),
            ("duplicated", self.duplicated),
            (
                "in doubt at the producer (of them arrived)",
                f"{self.producer_in_doubt} ({self.producer_in_doubt_arrived})",
            ),
            ("refused by the router", self.refused),
            ("in doubt at the consumer (commit unanswered; its receipt: committed)", self.consumer_in_doubt),
            ("out of order (allowed where the path changed)", self.out_of_order),
            ("drain (s)", f"{self.drain_seconds:.1f}"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [title] if title else []
        lines += [f"{name:<{width}}  {value}" for name, value in rows]
        if self.subscribers:
            header = ("subscriber", "kind", "expected", "received", "lost", "duplicated", "in doubt", "out of order")
            cells = [header] + [
                (
                    name,
                    "durable" if durable else "non-durable",
                    r.sent,
                    r.received,
                    r.lost,
                    r.duplicated,
                    r.consumer_in_doubt,
                    r.out_of_order,
                )
                for name, durable, r in self.subscribers
            ]
            widths = [max(len(str(row[i])) for row in cells) for i in range(len(header))]
            lines += [
                "  ".join(
                    f"{cell!s:>{w}}" if i > 1 else f"{cell!s:<{w}}"
                    for i, (cell, w) in enumerate(zip(row, widths, strict=True))
                )
                for row in cells
            ]
        lines += [f"{kind} e.g. {keys}" for kind, keys in self.examples.items() if keys]
        return "\n".join(lines)


def verdict(
    producers: list[Producer],
    consumers: list[Consumer],
    *,
    rounds: int = 0,
    faults: dict[str, int] | None = None,
    drain_seconds: float = 0.0,
) -> Results:
    """Compare what the producers had accepted with what the consumers received."""
    received: collections.Counter[tuple[str, int]] = collections.Counter()
    for consumer in consumers:
        received.update(consumer.received)
    got = set(received)  # committed (an in-doubt batch counts once settle_doubt found its receipt)
    lost = [(p.ident, seq) for p in producers for seq in p.sent if (p.ident, seq) not in got]
    duplicated = sorted(key for key, n in received.items() if n > 1)
    in_doubt = [(p.ident, seq) for p in producers for seq in p.in_doubt + p.refused]
    return Results(
        rounds=rounds,
        faults=dict(faults or {}),
        sent=sum(len(p.sent) for p in producers),
        received=len(got),
        lost=len(lost),
        duplicated=sum(received[key] - 1 for key in duplicated),
        out_of_order=sum(c.out_of_order for c in consumers),
        producer_in_doubt=sum(len(p.in_doubt) for p in producers),
        producer_in_doubt_arrived=sum(1 for key in in_doubt if key in got),
        refused=sum(len(p.refused) for p in producers),
        consumer_in_doubt=sum(consumer.settled_in_doubt for consumer in consumers),
        drain_seconds=drain_seconds,
        examples={"lost": lost[:5], "duplicated": duplicated[:5]},
    )


def topic_verdict(
    producers: list[Producer],
    durable: list[Consumer],
    non_durable: list[Consumer],
    *,
    rounds: int = 0,
    faults: dict[str, int] | None = None,
    drain_seconds: float = 0.0,
) -> Results:
    """Each subscriber against everything the producers had accepted (every subscriber
    expects every message); the totals: lost and received at the durable subscribers (a
    non-durable one may lose while it or its router is away), duplicated at any."""
    rows = [(c.name, c in durable, verdict(producers, [c])) for c in durable + non_durable]
    in_doubt = {(p.ident, seq) for p in producers for seq in p.in_doubt + p.refused}
    arrived = set().union(*(set(c.received) for c in durable + non_durable))
    examples = {f"{kind} at {name}": r.examples[kind] for name, _, r in rows for kind in ("lost", "duplicated")}
    return Results(
        rounds=rounds,
        faults=dict(faults or {}),
        sent=sum(len(p.sent) for p in producers),
        received=sum(r.received for _, d, r in rows if d),
        lost=sum(r.lost for _, d, r in rows if d),
        duplicated=sum(r.duplicated for _, _, r in rows),
        out_of_order=sum(r.out_of_order for _, _, r in rows),
        producer_in_doubt=sum(len(p.in_doubt) for p in producers),
        producer_in_doubt_arrived=len(in_doubt & arrived),
        refused=sum(len(p.refused) for p in producers),
        consumer_in_doubt=sum(r.consumer_in_doubt for _, _, r in rows),
        drain_seconds=drain_seconds,
        examples=examples,
        subscribers=tuple(rows),
    )


# How long the consumers must have had nothing new before a run ends, so that a late
# duplicate is seen: once the faults are over, a copy sent again comes over a link that a
# connector dials again (retry-time 1 s) after a half-open one was noticed (5 keepalive
# intervals), then reaches a consumer polling every 0.2 s: about 6.2 s at most; 7.
QUIET = 5 * KEEPALIVE_MS / 1000 + 2


async def drain(
    producers: list[Producer], consumers: list[Consumer], timeout: float, quiet: float = QUIET, *, each: bool = False
) -> float:
    """Wait until every sent message has arrived (at any of ``consumers``; ``each``: at every
    one) or ``timeout`` seconds pass — settling the consumers' batches in doubt on the way
    (:meth:`Consumer.settle_doubt`: the messages of one not committed are due again, and
    waited for) — then until the consumers have had nothing new for ``quiet`` seconds (late
    duplicates); returns the time."""
    started = trio.current_time()
    expected = [(p.ident, seq) for p in producers for seq in p.sent]
    arrived = all if each else any
    with trio.move_on_after(timeout):
        while True:
            while not all(arrived(c.has(key) for c in consumers) for key in expected):
                await trio.sleep(0.2)
            if not [c for c in consumers if await c.settle_doubt()]:
                break
        while time.monotonic() - max(c.last_arrival for c in consumers) < quiet:
            await trio.sleep(0.2)
    return trio.current_time() - started


@attrs.frozen
class Schedule:
    """What :func:`chaos` does: ``rounds`` faults drawn (``seed``) from ``faults``, each
    lasting ``down`` seconds, with ``gap`` seconds of traffic after each; routers listed in
    ``spare`` are never killed."""

    rounds: int = 5
    faults: tuple[str, ...] = FAULTS
    down: float = 1.0
    gap: float = 2.0
    seed: int = 1
    producers: int = 2  # per source router
    rate: float = 100.0  # messages a second per producer
    drain_timeout: float = 120.0
    spare: tuple[str, ...] = ()
    mode: str = "queues"  # or "topics" (see chaos)


def plan(network: ProcessNetwork, schedule: Schedule) -> list[tuple[str, str | tuple[str, str], float]]:
    """The faults of ``schedule`` with their targets, drawn from its seed, and for a delay
    its round trip in seconds (50–200 ms: a link across a continent or an ocean, which the
    window must fill without losing or doubling anything)."""
    rng = random.Random(schedule.seed)
    victims = [name for name in network.topology.routers if name not in schedule.spare]
    links = list(network.topology.links)
    steps: list[tuple[str, str | tuple[str, str], float]] = []
    for _ in range(schedule.rounds):
        kind = rng.choice(schedule.faults)
        target = rng.choice(victims) if kind in ROUTER_FAULTS else rng.choice(links)
        steps.append((kind, target, rng.uniform(0.05, 0.2) if kind == "delay" else 0.0))
    return steps


async def chaos(
    network: ProcessNetwork, schedule: Schedule, report: Callable[[str], None] = lambda line: None
) -> Results:
    """Traffic under ``schedule``'s faults, then drain; ``report`` is told each step.

    ``queues``: producers on the sources send to ``queue@destination``, one consumer there.
    ``topics``: producers on the sources publish to the topic ``queue``; every router has a
    durable and a non-durable subscriber, subscribed (and their interest known on every
    router) before the first publication; drained until every durable one has everything."""
    topology = network.topology
    topics = schedule.mode == "topics"
    address = Topic(topology.queue) if topics else f"{topology.queue}@{topology.destination}"
    producers = [
        Producer(f"{source}{n}", network.url(source), address, rate=schedule.rate)
        for source in topology.sources
        for n in range(schedule.producers)
    ]
    if topics:
        durable = [
            Consumer(network.url(name), address, durable=f"sub-{name}", name=f"{name} durable")
            for name in topology.routers
        ]
        non_durable = [Consumer(network.url(name), address, name=f"{name} non-durable") for name in topology.routers]
    else:
        durable, non_durable = [Consumer(network.url(topology.destination), topology.queue)], []
    consumers = durable + non_durable
    stop_producing, stop_consuming = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:
        for consumer in consumers:
            nursery.start_soon(consumer.run, stop_consuming)
        if topics:
            with trio.fail_after(60):
                for consumer in consumers:
                    await consumer.attached.wait()
            await network.wait_interest(topology.queue)
        for producer in producers:
            nursery.start_soon(producer.run, stop_producing)
        await trio.sleep(schedule.gap)
        for number, (kind, target, round_trip) in enumerate(plan(network, schedule), 1):
            what = f"{kind} {target if isinstance(target, str) else '-'.join(target)}"
            report(f"round {number}: {what}" + (f" ({round_trip * 1000:.0f} ms round trip)" if round_trip else ""))
            await network.inject(kind, target, schedule.down, round_trip=round_trip)
            await trio.sleep(schedule.gap)
        stop_producing.set()
        await network.wait_connected()
        seconds = await drain(producers, durable, schedule.drain_timeout, each=topics)
        stop_consuming.set()
    for consumer in consumers:  # (what the last moments left in doubt, the non-durable ones' too)
        await consumer.settle_doubt()
    if topics:
        return topic_verdict(
            producers, durable, non_durable, rounds=schedule.rounds, faults=network.faults, drain_seconds=seconds
        )
    return verdict(producers, consumers, rounds=schedule.rounds, faults=network.faults, drain_seconds=seconds)
