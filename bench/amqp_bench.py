"""AMQP 1.0 end to end: Martinet against RabbitMQ 3.10, same load, same run. Prints figures.

    .venv/bin/python bench/amqp_bench.py [--messages N] [--rounds R] [--no-rabbitmq]

Load: our C load generator (``bench/amqp_loadgen.c``, built here against Debian's
``libqpid-proton11-dev`` with gcc), one sender process and one receiver process running
concurrently, one queue, 100-byte messages, at-least-once (the sender keeps the link's
credit full of unsettled messages and counts accepts; the receiver accepts each). The
figure is messages per second from the first send to the last receive; the best of
``--rounds`` rounds is printed, next to all of them. For Martinet it also prints the
router's CPU time per message (user + system, from ``/proc``, best round): a figure that
other load on the machine disturbs far less than the rate.

Brokers, each in its own process, on loopback ports chosen here, data in a temporary folder:

- Martinet (``python -m martinet.kernel run``; ``sync="full"``, i.e. fsync per group commit);
- RabbitMQ 3.10 from Debian (``apt-get install rabbitmq-server``), private node, the
  ``rabbitmq_amqp1_0`` plugin, address ``/queue/<name>`` (a durable queue), PLAIN as guest.

Needs: gcc, libqpid-proton11-dev, rabbitmq-server (skipped with a note when missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

ROUTER = """<router name="bench" startorder="sys$store sys$queuemanager sys$jms">
  <swiftlet name="sys$store" path="{folder}/store" sync="full"/>
  <swiftlet name="sys$jms"><listeners><listener name="amqp" port="{port}" bind-address="127.0.0.1"/></listeners>
  </swiftlet>
</router>"""

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
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "amqp_loadgen.c"), *flags.stdout.split()],
                   check=True)
    return binary


def run_round(loadgen: Path, port: int, address: str, count: int, durable: bool, credentials: list[str]) -> float:
    """One concurrent sender + receiver round: messages per second, first send to last receive."""
    extra = ["100", "durable" if durable else "transient", *credentials]
    receiver = subprocess.Popen([str(loadgen), "recv", "127.0.0.1", str(port), address, str(count), *extra],
                                stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # the receiver's link is attached (RabbitMQ declares the queue on attach)
    sender = subprocess.run([str(loadgen), "send", "127.0.0.1", str(port), address, str(count), *extra],
                            capture_output=True, text=True, timeout=600)
    received, _ = receiver.communicate(timeout=600)
    if sender.returncode or receiver.returncode:
        raise RuntimeError(f"load generator failed: {sender.stderr.strip()} / receiver status {receiver.returncode}")
    first = float(sender.stdout.split()[2])
    last = float(received.split()[3])
    return count / (last - first)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(name: str, loadgen: Path, port: int, prefix: str, args: argparse.Namespace,
            credentials: list[str], pid: int | None = None) -> dict[str, float]:
    results = {}
    for durable in (False, True):
        kind = "persistent" if durable else "non-persistent"
        count = args.messages if not durable else args.messages // 2
        rates, cpu = [], []
        for i in range(args.rounds):
            before = cpu_seconds(pid) if pid else 0.0
            rates.append(run_round(loadgen, port, f"{prefix}bench-{kind}-{i}", count, durable, credentials))
            cpu.append((cpu_seconds(pid) - before) / count * 1e6 if pid else 0.0)
        results[kind] = max(rates)
        usage = f"; router CPU {min(cpu):.2f} µs/msg" if pid else ""
        print(f"{name:10} {kind:15} {max(rates):>9,.0f} msgs/s   (rounds: {', '.join(f'{r:,.0f}' for r in rates)}; "
              f"{count:,} messages each{usage})", flush=True)
    return results


def martinet(loadgen: Path, folder: Path, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    config = folder / "router.xml"
    config.write_text(ROUTER.format(folder=folder, port=port))
    with (folder / "martinet.log").open("w") as log:
        router = subprocess.Popen([sys.executable, "-m", "martinet.kernel", "run", str(config)], stderr=log, cwd=folder)
    try:
        wait_for_port(port, 60, router)
        return measure("Martinet", loadgen, port, "", args, [], router.pid)
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(60)


def rabbitmq(loadgen: Path, folder: Path, args: argparse.Namespace) -> dict[str, float] | None:
    sbin = Path("/usr/lib/rabbitmq/bin")  # the scripts themselves; those on PATH switch to the rabbitmq user
    if not (sbin / "rabbitmq-server").exists():
        print("RabbitMQ: not installed (apt-get install rabbitmq-server) — comparison skipped")
        return None
    base = folder / "rabbitmq"
    for sub in ("erlhome", "mnesia", "log"):
        (base / sub).mkdir(parents=True)
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    (base / "rabbitmq.conf").write_text(RABBITMQ_CONF.format(port=port))
    (base / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
    env = os.environ | {
        "HOME": str(base / "erlhome"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "RABBITMQ_NODENAME": "bench@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"), "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"), "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
        "PATH": f"{sbin}:{os.environ['PATH']}",
    }
    with (base / "server.out").open("w") as out:
        broker = subprocess.Popen([str(sbin / "rabbitmq-server")], env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_for_port(port, 120, broker)
        version = subprocess.run([str(sbin / "rabbitmqctl"), "-q", "version"], env=env, capture_output=True,
                                 text=True).stdout.strip()
        print(f"RabbitMQ {version} (amqp1_0 plugin) on 127.0.0.1:{port}", flush=True)
        return measure("RabbitMQ", loadgen, port, "/queue/", args, ["guest", "guest"])
    finally:
        subprocess.run([str(sbin / "rabbitmqctl"), "stop", str(base / "rabbit.pid")], env=env,
                       capture_output=True, timeout=120)
        if broker.poll() is None:
            os.killpg(broker.pid, signal.SIGKILL)
        subprocess.run(["epmd", "-kill"], env=env, capture_output=True)


def main(args: argparse.Namespace) -> None:
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build the load generator")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        loadgen = build_loadgen(folder)
        print(f"one C sender + one C receiver process, concurrent, 100-byte messages, at-least-once; "
              f"{os.cpu_count()} CPUs", flush=True)
        ours = martinet(loadgen, folder, args)
        theirs = None if args.no_rabbitmq else rabbitmq(loadgen, folder, args)
        if theirs:
            for kind in ("non-persistent", "persistent"):
                print(f"ratio Martinet / RabbitMQ, {kind}: {ours[kind] / theirs[kind]:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="per non-persistent round (half persistent)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-rabbitmq", action="store_true")
    main(parser.parse_args())
