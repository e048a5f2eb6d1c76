"""The ``martinet`` command: ``martinet run [CONFIG]``, ``martinet check CONFIG`` and
``martinet hash-password`` (prints a salted hash for a user's ``password`` attribute; the
password is read from stdin, or prompted for without echo on a terminal), plus the
subcommands plugins add (hook ``martinet_commands``, e.g. ``martinet schedule next``).

Exit status: 0 after a clean run or a valid check; 1 when a swiftlet failed (to start or
while running); 2 when the config (or a plugin) is invalid, with every problem printed,
one per line, as ``file:line: element-path: attribute 'x': what was wrong``.

``run`` stops the router in order on the first SIGINT or SIGTERM; a second one exits at
once (for a swiftlet that hangs in its cleanup). SIGHUP reboots: the config file is read
again and, only if it is valid, the router stops in order and starts on the new config
(so reboot-required changes take effect); an invalid file is logged and the router keeps
running on the old one. Management's ``reboot`` does the same (``Router.request_reboot``
leaves the new router in ``successor``, which is run here).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.resources
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import trio

from .config import ConfigErrors
from .logs import configure_logging
from .plugins import Command, PluginError, load_plugins
from .router import Router, SwiftletFailed

log = logging.getLogger("martinet")

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def default_config() -> Path:
    """The packaged default config (one router named ``router1``)."""
    return Path(str(importlib.resources.files("martinet.kernel.conf") / "router.xml"))


def _version() -> str:
    """The installed distribution's version ("unknown" when run from an uninstalled tree)."""
    try:
        return importlib.metadata.version("martinet")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="martinet", description="Martinet message router")
    parser.add_argument("--version", action="version", version=f"martinet {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a router")
    run.add_argument("config", nargs="?", type=Path, help="router config (default: packaged)")
    run.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="log level on stderr (default INFO)",
    )
    check = commands.add_parser("check", help="check a router config and report every problem")
    check.add_argument("config", type=Path)
    hashing = commands.add_parser(
        "hash-password",
        help="print a salted hash of a password (read from stdin, or prompted for) for a user's password attribute",
    )
    hashing.add_argument(
        "--iterations", type=int, default=None, help="PBKDF2-SHA256 iterations (default: the authentication swiftlet's)"
    )
    added: dict[str, Command] = {}
    try:
        for commands_of_plugin in load_plugins().hook.martinet_commands():
            for command in commands_of_plugin:
                if command.name in commands.choices:
                    raise PluginError(f"two commands are named {command.name!r}")
                command.configure(commands.add_parser(command.name, help=command.help))
                added[command.name] = command
    except PluginError as exc:  # the built-in commands still work; 'run' and 'check' report it
        log.debug("plugin commands not loaded: %s", exc)
    args = parser.parse_args(argv)
    if args.command in added:
        return added[args.command].run(args)
    if args.command == "check":
        return _check(args.config)
    if args.command == "hash-password":
        return _hash_password(args.iterations)
    configure_logging(args.log_level)
    return _run(args.config)


def _load(path: Path | None) -> Router | None:
    """The router of ``path`` (the packaged default for ``None``); ``None`` after printing
    every problem when the config or a plugin is invalid or the file unreadable."""
    try:
        router = Router.from_file(path or default_config())
    except (ConfigErrors, PluginError) as exc:
        print(exc, file=sys.stderr)
        return None
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror}", file=sys.stderr)
        return None
    if path is None:
        router.config_path = None  # never 'save' over the packaged default
    return router


def _hash_password(iterations: int | None) -> int:
    """Print the hash of the password from a prompt (a terminal) or stdin's first line."""
    from .passwords import DEFAULT_ITERATIONS, hash_password

    if sys.stdin.isatty():
        import getpass

        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("the passwords differ", file=sys.stderr)
            return EXIT_FAILED
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("an empty password cannot log in; nothing printed", file=sys.stderr)
        return EXIT_FAILED
    if iterations is not None and iterations < 1000:
        print("--iterations must be at least 1000", file=sys.stderr)
        return EXIT_INVALID
    print(hash_password(password, iterations=iterations or DEFAULT_ITERATIONS))
    return EXIT_OK


def _check(path: Path) -> int:
    router = _load(path)
    if router is None:
        return EXIT_INVALID
    startorder = " ".join(router.config.startorder) or "(empty)"
    print(f"{path}: OK: router {router.name}, start order: {startorder}")
    return EXIT_OK


def _run(path: Path | None) -> int:
    router = _load(path)
    if router is None:
        return EXIT_INVALID
    # A router process churns through short-lived per-message objects while what it loaded at
    # start lives on: keep the latter out of every collection, and collect the youngest
    # generation less often (bench/amqp_bench.py: about 0.5-1 µs less CPU per message).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    return trio.run(_serve, router, path)


async def _serve(router: Router, path: Path | None) -> int:
    """Run ``router`` (and its successors after SIGHUP) until stopped; the exit status."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        while True:
            reboot: list[Router] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_signals, signals, router, path, reboot)
                try:
                    await router.run()
                except SwiftletFailed as failure:
                    log.critical("router %s stopped: %s", router.name, failure)
                    return EXIT_FAILED
                finally:
                    nursery.cancel_scope.cancel()
            if reboot:  # SIGHUP
                router = reboot[0]
            elif router.successor is not None:  # management's reboot
                router = router.successor
            else:
                return EXIT_OK
            log.info("router %s rebooting", router.name)


async def _watch_signals(signals: AsyncIterator[int], router: Router, path: Path | None, reboot: list[Router]) -> None:
    stopping = False
    async for signum in signals:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP and not stopping:
            try:
                successor = Router.from_file(path or default_config())
            except (ConfigErrors, PluginError, OSError) as exc:
                log.error("%s received, but the config is not valid; still running on the old one:\n%s", name, exc)
                continue
            if path is None:
                successor.config_path = None
            reboot.append(successor)
            router.request_stop(f"{name} received: reboot")
            stopping = True
        elif not stopping:
            router.request_stop(f"{name} received")
            stopping = True
        else:
            log.critical("second %s received: exiting without waiting for cleanup", name)
            logging.shutdown()
            os._exit(EXIT_FAILED)


def entry_point() -> None:  # console script
    sys.exit(main())
