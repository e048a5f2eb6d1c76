"""What the end-to-end benchmarks share: the C load generator, router and RabbitMQ processes.

The load generator (``amqp_loadgen.c``) is built here with gcc against Debian's
``libqpid-proton11-dev``; :func:`run_round` drives one sender and one receiver process of it
concurrently (they may talk to different brokers: the receiver's link is attached first,
then the sender starts) and gives messages per second from the first send to the last
receive. Routers run as ``python -m martinet.kernel run CONFIG`` processes, stderr (the log)
in a file; RabbitMQ nodes as private nodes on loopback with all state in a folder (the
unwrapped scripts of Debian's ``rabbitmq-server``, not the wrappers on the PATH,
which switch to the ``rabbitmq`` user and its data folder).
These helpers block; the benchmarks using them are plain scripts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
RABBITMQ_SBIN = Path("/usr/lib/rabbitmq/bin")  # the scripts themselves; those on PATH switch to the rabbitmq user

RABBITMQ_CONF = """listeners.tcp.1 = 127.0.0.1:{port}
loopback_users.guest = true
log.console = false
log.file.level = warning
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the broker exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def build_loadgen(folder: Path) -> Path:
    binary = folder / "amqp_loadgen"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libqpid-proton"], capture_output=True, text=True)
    if flags.returncode:
        raise SystemExit("libqpid-proton11-dev is needed (apt-get install libqpid-proton11-dev pkg-config)")
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "amqp_loadgen.c"), *flags.stdout.split()], check=True)
    return binary


def run_round(
    loadgen: Path,
    send: tuple[int, str],
    receive: tuple[int, str],
    count: int,
    *,
    durable: bool,
    size: int = 100,
    credentials: tuple[str, ...] = (),
    timeout: float = 900,
    pace: float | None = None,
) -> float:
    """One concurrent sender + receiver round: messages per second, first send to last receive.

    ``send`` and ``receive`` are (port, address) on 127.0.0.1. ``pace``: the sender keeps to
    that many messages a second (``LOADGEN_RATE``), else it sends as fast as credit allows.

    Raises:
        RuntimeError: a load generator failed (its error text), e.g. messages were refused,
            or the round took longer than ``timeout`` seconds (both are killed).
    """
    extra = [str(size), "durable" if durable else "transient", *credentials]
    receiver = subprocess.Popen(
        [str(loadgen), "recv", "127.0.0.1", str(receive[0]), receive[1], str(count), *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)  # the receiver's link is attached (RabbitMQ declares the queue on attach)
    try:
        sender = subprocess.run(
            [str(loadgen), "send", "127.0.0.1", str(send[0]), send[1], str(count), *extra],
            env=os.environ | {"LOADGEN_RATE": str(pace)} if pace else None,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        received, _ = receiver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        receiver.kill()
        receiver.wait()
        raise RuntimeError(f"the round took more than {timeout} s") from exc
    if sender.returncode or receiver.returncode:
        raise RuntimeError(f"load generator failed: {sender.stderr.strip()} / receiver status {receiver.returncode}")
    first = float(sender.stdout.split()[2])
    last = float(received.split()[3])
    return count / (last - first)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def martinet_router(
    folder: Path, config: str, *, port: int, timeout: float = 60, python: str = sys.executable
) -> Iterator[subprocess.Popen]:
    """A ``martinet run`` process of ``config`` in ``folder`` (made), its log in
    ``folder/stderr.log``, once ``port`` listens; stopped with SIGTERM on exit. ``python``: the
    interpreter, whose installed martinet runs (another build's, to compare two)."""
    folder.mkdir(parents=True)
    (folder / "router.xml").write_text(config)
    with (folder / "stderr.log").open("w") as log:
        router = subprocess.Popen([python, "-m", "martinet.kernel", "run", "router.xml"], stderr=log, cwd=folder)
    try:
        wait_for_port(port, timeout, router)
        yield router
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(60)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()


class RabbitNode:
    """A running private RabbitMQ node: its AMQP ``port`` and its ``ctl`` (rabbitmqctl)."""

    def __init__(self, port: int, env: dict[str, str]):
        self.port = port
        self.env = env

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl ARGS`` against this node; its output.

        Raises: RuntimeError with rabbitmqctl's error text when it fails.
        """
        done = subprocess.run(
            [str(RABBITMQ_SBIN / "rabbitmqctl"), "-q", *args], env=self.env, capture_output=True, text=True, timeout=120
        )
        if done.returncode:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout.strip()


def rabbitmq_installed() -> bool:
    return (RABBITMQ_SBIN / "rabbitmq-server").exists()


@contextmanager
def rabbitmq_node(folder: Path, name: str, plugins: tuple[str, ...], epmd_port: int) -> Iterator[RabbitNode]:
    """A private RabbitMQ node ``name@localhost`` on loopback, state in ``folder/name``, with
    ``plugins`` enabled; stopped on exit. Nodes of one run share the epmd on ``epmd_port``
    (the caller stops it: :func:`stop_epmd`)."""
    base = folder / name
    for sub in ("erlhome", "mnesia", "log"):
        (base / sub).mkdir(parents=True)
    port, dist_port = free_port(), free_port()
    (base / "rabbitmq.conf").write_text(RABBITMQ_CONF.format(port=port))
    (base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    env = os.environ | {
        "HOME": str(base / "erlhome"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "RABBITMQ_NODENAME": f"{name}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
        "PATH": f"{RABBITMQ_SBIN}:{os.environ['PATH']}",
    }
    with (base / "server.out").open("w") as out:
        broker = subprocess.Popen(
            [str(RABBITMQ_SBIN / "rabbitmq-server")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    node = RabbitNode(port, env)
    try:
        wait_for_port(port, 120, broker)
        yield node
    finally:
        subprocess.run(
            [str(RABBITMQ_SBIN / "rabbitmqctl"), "stop", str(base / "rabbit.pid")],
            env=env,
            capture_output=True,
            timeout=120,
        )
        if broker.poll() is None:
            os.killpg(broker.pid, signal.SIGKILL)


def stop_epmd(epmd_port: int) -> None:
    """Stop the private epmd the RabbitMQ nodes of a run started on ``epmd_port``."""
    subprocess.run(["epmd", "-kill"], env=os.environ | {"ERL_EPMD_PORT": str(epmd_port)}, capture_output=True)


def start_shovel(node: RabbitNode, name: str, queue: str, source_port: int, target_port: int) -> None:
    """A dynamic shovel ``name`` on ``node`` from ``queue`` at ``source_port`` to ``queue`` at
    ``target_port`` (AMQP 0-9-1, on-confirm; it declares both queues durable), once running.

    Raises: RuntimeError if it is not running within 180 s (a failed start is retried after
    the shovel's reconnect delay)."""
    uri = "amqp://guest:guest@127.0.0.1:{}"
    node.ctl(
        "set_parameter",
        "shovel",
        name,
        f'{{"src-protocol": "amqp091", "src-uri": "{uri.format(source_port)}", "src-queue": "{queue}",'
        f' "dest-protocol": "amqp091", "dest-uri": "{uri.format(target_port)}", "dest-queue": "{queue}",'
        ' "ack-mode": "on-confirm"}',
    )
    deadline = time.monotonic() + 180
    while "running" not in node.ctl("shovel_status"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shovel is not running: {node.ctl('shovel_status')}")
        time.sleep(0.5)
