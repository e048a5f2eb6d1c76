"""What a message entering the router network costs its first router beyond a local send,
per message: the routing rewrite.

    .venv/bin/python bench/rewrite_bench.py [--messages N] [--rounds R]

No socket and no router. A 100-byte message as the load generator sends it (a data section,
no properties) gets the producer's client id as the AMQP listener adds it (an
:class:`~martinet.messaging.message.AnnotationPatch`), then, as the queue manager takes it
in, ``queue_info(check=True)``. That is the *local* figure. The *routed* figure hands the
message and the client id to the redirection's rewrite for ``q@B`` instead, as the queue
manager does for a message into ``rt$B``: it merges the client id and the routing
annotations in one splice and checks the expiry. Their difference is what the rewrite costs.
Each figure is the best of ``--rounds`` rounds of N messages.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from martinet.messaging.message import AnnotationPatch, Message, build
from martinet.swiftlets.routing.rewrite import routing_rewrite


def best(step: Callable[[Message], None], raw: bytes, messages: int, rounds: int) -> float:
    """µs per message of ``step`` on a fresh ``Message(raw)``, the best of ``rounds``."""
    fastest = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(messages):
            step(Message(raw))
        fastest = min(fastest, time.perf_counter() - began)
    return fastest / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    raw = build(b"x" * 100).raw
    client_id = AnnotationPatch({"x-opt-jms-client-id": "client-1"})
    rewrite = routing_rewrite("A")

    def local(message: Message) -> None:
        client_id.apply(message).queue_info(0, check=True)

    def routed(message: Message) -> None:
        rewrite("q@B", message, 0, client_id).queue_info(0, check=True)

    there, here = best(routed, raw, args.messages, args.rounds), best(local, raw, args.messages, args.rounds)
    print(f"local (client id, queue_info):    {here:.2f} µs per message")
    print(f"routed (the same and the rewrite): {there:.2f} µs per message")
    print(f"the rewrite:                       {there - here:.2f} µs per message")


if __name__ == "__main__":
    main()
