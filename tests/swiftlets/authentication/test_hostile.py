"""Authentication against hostile or careless use: empty passwords,
hashed passwords, unknown users, throttled and aggregated refusals, refusals answered with
an AMQP close, passwords never shown by management. Live listener where the wire matters."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import time

import pytest
import trio

from martinet.kernel.passwords import hash_password, verify_password
from martinet.messaging.amqp.sasl import SaslClient, SaslRefused
from martinet.messaging.amqp.wire import AMQP_HEADER, FRAME_HEADER, descriptor_code
from martinet.messaging.client import Queue, TextMessage, connect
from martinet.messaging.codec import decode
from martinet.swiftlets.authentication import service
from martinet.swiftlets.authentication.api import AccessDenied, AuthenticationFailed
from martinet.swiftlets.authentication.config import UserConfig
from martinet.swiftlets.mgmt.api import Role
from martinet.swiftlets.mgmt.client import AdminClient
from martinet.swiftlets.mgmt.config import AdminGroup, MgmtConfig
from martinet.swiftlets.web.config import WebConfig

from tests.harness.network import ROUTING_STACK, routing_config
from tests.swiftlets.mgmt.test_service import users_config
from tests.swiftlets.web.test_web import basic, fetch

HASHED = hash_password("s3cret-hashed", iterations=2000)


async def sasl_login(port: int, user: str | None, password: str | None) -> bool:
    """A real SASL exchange on a socket: True if let in; raises SaslRefused if refused."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        client = SaslClient(user, password)
        with trio.fail_after(20):
            while True:
                if out := client.data_to_send:
                    await stream.send_all(out)
                data = await stream.receive_some(4096)
                assert data, "the server closed without an outcome"
                if client.receive_data(data):
                    return True


async def amqp_answer(port: int) -> list[tuple[int, list]]:
    """Open with the AMQP header (no SASL); the performatives the server answers before it
    closes the socket, as (descriptor code, fields)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(AMQP_HEADER)
        received = b""
        with trio.fail_after(20):
            while data := await stream.receive_some(4096):
                received += data
    assert received[:8] == AMQP_HEADER, received
    frames, rest = [], received[8:]
    while rest:
        size, doff, _kind, _channel = FRAME_HEADER.unpack_from(rest)
        performative, _ = decode(rest[doff * 4 : size])
        frames.append((descriptor_code(performative.descriptor), performative.value))
        rest = rest[size:]
    return frames


def close_condition(frames: list[tuple[int, list]]) -> tuple[str, str]:
    assert [code for code, _ in frames] == [0x10, 0x18]  # open, then close [2.4.1]
    error = frames[1][1][0]
    return str(error.value[0]), error.value[1]


async def add_user(broker, name: str, password: str | None) -> None:
    values = {"group": "apps"} | ({"password": password} if password is not None else {})
    broker.router.management.resolve("/sys$authentication/users").add(name, values)


async def test_a_user_without_a_password_cannot_log_in_with_an_empty_one(amqp_broker, caplog):
    broker = await amqp_broker(auth="true")
    await add_user(broker, "nopw", None)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(SaslRefused):
            await sasl_login(broker.port, "nopw", "")
    assert "user 'nopw' has no password configured" in caplog.text
    assert await sasl_login(broker.port, "app", "s3cret")


async def test_hashed_passwords_log_in_and_are_never_shown(amqp_broker, tmp_path):
    broker = await amqp_broker(auth="true")
    await add_user(broker, "hashed", HASHED)
    assert await sasl_login(broker.port, "hashed", "s3cret-hashed")
    with pytest.raises(SaslRefused):
        await sasl_login(broker.port, "hashed", HASHED)  # the hash itself is not the password
    management = broker.router.management
    assert management.get("/sys$authentication/users/hashed", "password") == "********"
    assert management.resolve("/sys$authentication/users/app").properties()["password"] == "********"
    saved = broker.router.save(tmp_path / "saved.xml").read_text()
    assert HASHED in saved and 'password="s3cret"' in saved  # saving writes the real values


def test_hash_password_cli_makes_a_hash_that_verifies():
    result = subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "hash-password", "--iterations", "2000"],
        input="correct horse\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    hashed = result.stdout.strip()
    assert hashed.startswith("pbkdf2-sha256$2000$")
    assert verify_password(hashed, "correct horse") and not verify_password(hashed, "correct horse ")


class Pbkdf2Calls:
    """Counts calls of hashlib.pbkdf2_hmac in any thread (the checks run in worker threads)
    and records each one's iteration count: a recording wrapper around the real function
    while the block runs, not a mock."""

    def __init__(self):
        self.iterations = []
        self._real = hashlib.pbkdf2_hmac

    @property
    def count(self):
        return len(self.iterations)

    def __enter__(self):
        def counted(hash_name, password, salt, iterations, *args, **kwargs):
            self.iterations.append(iterations)
            return self._real(hash_name, password, salt, iterations, *args, **kwargs)

        hashlib.pbkdf2_hmac = counted
        return self

    def __exit__(self, *exc):
        hashlib.pbkdf2_hmac = self._real


async def test_unknown_users_go_through_the_same_compare(amqp_broker):
    """Every refusal costs the same hash: an unknown user's and a user's without password
    (a dummy of the configured hashes' iteration count: it was the default 100 000 against
    users' 2 000), and a plain-text user's among hashed ones (it was a plain compare only).
    Each from its own address, so that no throttling delay hides a difference."""
    broker = await amqp_broker(auth="true")
    auth = broker.router.swiftlet("sys$authentication")
    await add_user(broker, "nopw", None)
    users = ("app", "nopw", "nobody-by-this-name")  # plain text, no password, unknown
    for n, user in enumerate(users):  # only plain-text passwords: no hash at all
        with Pbkdf2Calls() as calls, pytest.raises(AuthenticationFailed):
            await auth.login(user, "wrong", f"10.9.8.{n}")
        assert calls.iterations == [], user
    await add_user(broker, "hashed", HASHED)
    iterations = []
    for n, user in enumerate(("hashed", *users)):
        with Pbkdf2Calls() as calls, pytest.raises(AuthenticationFailed):
            await auth.login(user, "wrong", f"10.9.9.{n}")
        iterations.append(calls.iterations)
    assert iterations == [[2000]] * 4
    with Pbkdf2Calls() as calls:  # and a plain-text user still logs in, at the same cost
        await auth.login("app", "s3cret", "10.9.9.9")
    assert calls.iterations == [2000]


async def test_refusals_from_an_address_are_answered_later_and_later(amqp_broker):
    broker = await amqp_broker(auth="true")
    auth = broker.router.swiftlet("sys$authentication")
    delays = []
    for n in range(8):  # a user each: the per-user turns do not wait here
        with pytest.raises(AuthenticationFailed):
            await auth.login(f"user{n}", "wrong", "10.1.1.1")
        delays.append(auth.refusal_delay("10.1.1.1"))
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 4.0]  # doubling, capped
    assert auth.refusal_delay("10.1.1.2") == 0.0  # per address
    await auth.login("app", "s3cret", "10.1.1.1")
    assert auth.refusal_delay("10.1.1.1") == 4.0  # a success does not reset the address
    # Live: refusals from 127.0.0.1 still arrive as SASL outcomes (after the delay).
    for _ in range(3):
        with pytest.raises(SaslRefused):
            await sasl_login(broker.port, "app", "wrong")
    assert auth.refusal_delay("127.0.0.1") == 0.2


async def test_the_throttle_forgets_an_address_after_a_quiet_period(nursery, write_config, autojump_clock):
    from martinet.kernel import Router

    router = Router.from_file(
        write_config(
            '<router name="r1" startorder="sys$authentication"><swiftlet name="sys$authentication" '
            'authentication-enabled="true"><users><user name="u" password="p"/></users></swiftlet></router>'
        )
    )
    await nursery.start(router.run)
    auth = router.swiftlet("sys$authentication")
    for _ in range(4):
        with pytest.raises(AuthenticationFailed):
            await auth.login("u", "wrong", "10.2.2.2")
    assert auth.refusal_delay("10.2.2.2") == 0.4
    await trio.sleep(service.QUIET_PERIOD + service.LOG_INTERVAL)  # MockClock: no real waiting
    assert auth.refusal_delay("10.2.2.2") == 0.0
    router.request_stop()


def refusals(caplog) -> list[logging.LogRecord]:
    """The authentication swiftlet's records (the router's own INFO lines are captured too
    when an earlier test in this process left the root logger at INFO)."""
    return [record for record in caplog.records if record.name.startswith("martinet.swiftlets.authentication")]


async def test_refusals_are_logged_once_per_address_and_interval(nursery, write_config, autojump_clock, caplog):
    from martinet.kernel import Router

    router = Router.from_file(
        write_config(
            '<router name="r1" startorder="sys$authentication"><swiftlet name="sys$authentication" '
            'authentication-enabled="true"><users><user name="u" password="p"/></users></swiftlet></router>'
        )
    )
    await nursery.start(router.run)
    auth = router.swiftlet("sys$authentication")
    with caplog.at_level(logging.WARNING, logger="martinet.swiftlets.authentication"):
        for n in range(50):  # a user name each (a spray): no user's turn holds the loop back
            with pytest.raises(AuthenticationFailed):
                await auth.login(f"user{n}", "wrong", "10.3.3.3")
        assert len(refusals(caplog)) == 1  # the first, with its details
        await trio.sleep(service.LOG_INTERVAL + 1)  # the swiftlet's periodic summary (MockClock)
    assert [r.getMessage() for r in refusals(caplog)] == [
        "login refused from 10.3.3.3: unknown user 'user0'",
        "49 more login(s) refused from 10.3.3.3 in the last 60 s (last: unknown user 'user49')",
    ]
    # Access denials too: a client attaching in a loop to what it may not use (200 refused
    # attaches wrote 200 WARNING lines) gets its first logged, the rest counted, per address.
    caplog.clear()
    principal = await auth.login("u", "p", "10.3.3.3")
    with caplog.at_level(logging.WARNING, logger="martinet.swiftlets.authentication"):
        for n in range(200):
            with pytest.raises(AccessDenied):
                principal.check_queue(f"junk-{n}", "send")
        with pytest.raises(AccessDenied):
            principal.check_topic("news", "subscribe")
        assert len(refusals(caplog)) == 1
        await trio.sleep(service.LOG_INTERVAL + 1)
    assert [r.getMessage() for r in refusals(caplog)] == [
        "access denied from 10.3.3.3: user u (group public) may not send on queue 'junk-0'",
        "200 more access denial(s) from 10.3.3.3 in the last 60 s (last: user u (group public) may not subscribe "
        "on topic 'news')",
    ]
    assert router.management.get("/sys$authentication/usage", "access-denials") == 201
    router.request_stop()


async def test_a_client_skipping_sasl_gets_an_amqp_close_when_authentication_is_required(amqp_broker):
    broker = await amqp_broker(auth="true")
    assert close_condition(await amqp_answer(broker.port)) == (
        "amqp:unauthorized-access",
        "anonymous login not allowed",
    )


async def test_host_access_list_refusal_is_an_amqp_close(amqp_broker):
    broker = await amqp_broker(hosts='<host-access-list><host-access-entry name="10.%"/></host-access-list>')
    assert close_condition(await amqp_answer(broker.port)) == (
        "amqp:unauthorized-access",
        "not in the host access list",
    )


async def test_max_connections_refusal_is_an_amqp_close(amqp_broker):
    broker = await amqp_broker(maxconn="0")
    assert close_condition(await amqp_answer(broker.port)) == (
        "amqp:resource-limit-exceeded",
        "max-connections 0 reached",
    )


def iterations_for(seconds: float) -> int:
    """PBKDF2 iterations one check of which takes about ``seconds`` here (sizes the work of
    the next test; nothing asserts a time)."""
    begin = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"calibrate", b"salt", 20_000)
    return max(20_000, int(20_000 * seconds / (time.perf_counter() - begin)))


async def test_a_burst_of_slow_logins_does_not_stall_an_established_connection(amqp_broker):
    """Password hashes are checked off the event loop. Checked on it, each login of the
    burst froze the router for a whole hash, and an established connection's round trips
    stopped meanwhile; now they go on while worker threads hash."""
    broker = await amqp_broker(auth="true")
    await add_user(broker, "slow", hash_password("slow-but-sure", iterations=iterations_for(0.4)))
    logins, round_trips, stop = 6, 0, trio.Event()

    async def traffic(session) -> None:
        nonlocal round_trips
        async with session.producer(Queue("steady")) as producer, session.consumer(Queue("steady")) as consumer:
            while not stop.is_set():
                await producer.send(TextMessage("tick"))
                assert (await consumer.receive(20)).body == "tick"
                round_trips += 1

    async with connect(broker.url, user="app", password="s3cret") as connection, trio.open_nursery() as nursery:
        nursery.start_soon(traffic, await connection.session())
        with trio.fail_after(20):
            while round_trips < 10:  # established: the traffic flows
                await trio.sleep(0.01)
            before = round_trips
            async with trio.open_nursery() as burst:
                for _ in range(logins):
                    burst.start_soon(sasl_login, broker.port, "slow", "slow-but-sure")
            during = round_trips - before
        stop.set()
    # Stalled, a round trip got through between two hashes at best (2-3 measured); hashing
    # in worker threads, they go on throughout (146-843 measured on a busy 2-core machine).
    assert during >= 5 * logins, f"{during} round trips during {logins} logins"


async def test_no_password_leaves_the_router_through_sys_mgmt_its_log_or_sys_web(network, caplog):
    """Item 9: passwords (users' and a routing listener's) are masked wherever the tree is
    read from outside — ``sys$mgmt`` get, describe, set and add answers, watch notices and
    the changes it logs (what ``martinet admin`` prints) — and ``sys$web``'s pages and
    metrics hold none."""
    caplog.set_level(logging.DEBUG)
    secrets = ["root-pw", "watcher-pw", "guest-pw", "link-secret", "new-guest-pw", "added-pw", HASHED]
    auth = users_config()
    auth = type(auth)(
        authentication_enabled=True,
        groups=list(auth.groups.values()),
        users=[*auth.users.values(), UserConfig(name="hashed", password=HASHED, group="admin")],
    )
    swiftlets = {
        "sys$authentication": auth,
        "sys$routing": routing_config(listener={"password": "link-secret"}),
        "sys$mgmt": MgmtConfig(groups=[AdminGroup(name="admin", role=Role.READ_WRITE)]),
        "sys$web": WebConfig(enabled=True, port=0),
    }
    router = await network.start(
        network.config("a", startorder=(*ROUTING_STACK, "sys$mgmt", "sys$web"), swiftlets=swiftlets)
    )
    answers = []
    async with AdminClient.open(network.url("a"), user="root", password="root-pw") as admin:
        async with admin.watch("a", "/sys$authentication") as notices:
            answers.append(await admin.call("a", "get", path="/sys$authentication/users"))
            answers.append(await admin.call("a", "get", path="/sys$authentication/users/hashed"))
            answers.append(await admin.call("a", "get", path="/sys$routing/listeners"))
            answers.append(await admin.call("a", "describe", path="/sys$authentication/users"))
            answers.append(
                await admin.call(
                    "a", "set", path="/sys$authentication/users/guest", name="password", value="new-guest-pw"
                )
            )
            answers.append(
                await admin.call(
                    "a",
                    "add",
                    path="/sys$authentication/users",
                    name="added",
                    values={"password": "added-pw", "group": "public"},
                )
            )
            with trio.fail_after(10):
                answers.extend([await notices.receive() for _ in range(2)])
    web = router.swiftlet("sys$web").url
    for page in ("/", "/routers/a", "/map.json", "/metrics"):
        status, _, text = await fetch(web + page, basic("hashed", "s3cret-hashed"))
        assert status == 200, page
        answers.append(text)
    assert router.management.get("/sys$authentication/users/guest", "password") == "********"
    seen = json.dumps(answers) + "\n".join(record.getMessage() for record in caplog.records)
    assert [secret for secret in secrets if secret in seen] == []
    assert answers[0]["entries"]["root"]["password"] == "********"  # shown masked, not dropped
    assert answers[4]["old"] == answers[4]["new"] == "********"
    assert "********" in json.dumps(answers[6:8])  # the watch notices: the change and the addition
    assert await sasl_login(int(network.url("a").rsplit(":", 1)[1]), "guest", "new-guest-pw")  # set for real


async def test_guesses_of_one_user_queue_behind_each_other_across_connections(nursery, write_config, autojump_clock):
    """20 logins at once (as from 20 connections) for one user from one address: each
    check waits its turn after the failures before it; another account's success from the
    same address does not reset the turns; the user's own success does."""
    from martinet.kernel import Router

    router = Router.from_file(
        write_config(
            '<router name="r1" startorder="sys$authentication"><swiftlet name="sys$authentication" '
            'authentication-enabled="true"><users><user name="u" password="p"/><user name="v" password="q"/>'
            "</users></swiftlet></router>"
        )
    )
    await nursery.start(router.run)
    auth = router.swiftlet("sys$authentication")
    start = trio.current_time()
    refused_at: list[float] = []

    async def guess() -> None:
        with pytest.raises(AuthenticationFailed):
            await auth.login("u", "wrong", "10.3.3.3")
        refused_at.append(trio.current_time() - start)

    async with trio.open_nursery() as guesses:
        for _ in range(6):
            guesses.start_soon(guess)
    # the first two are checked at once (no failure before them yet); then one turn after
    # another, each a delay longer
    gaps = [round(b - a, 3) for a, b in zip(sorted(refused_at), sorted(refused_at)[1:], strict=False)]
    assert gaps[1:] == [0.1, 0.2, 0.4, 0.8], refused_at
    await auth.login("v", "q", "10.3.3.3")  # another account: u's turns stay
    before = trio.current_time()
    with pytest.raises(AuthenticationFailed):
        await auth.login("u", "wrong", "10.3.3.3")
    assert trio.current_time() - before >= 1.6
    await auth.login("u", "p", "10.3.3.3")  # after its turn; and then u starts afresh
    before = trio.current_time()
    with pytest.raises(AuthenticationFailed):
        await auth.login("u", "wrong", "10.3.3.3")
    assert trio.current_time() - before < 0.05
    router.request_stop()
