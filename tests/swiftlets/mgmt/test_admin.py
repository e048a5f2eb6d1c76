"""``martinet admin``: the network map on a ring of five routers (states right after a link is
cut, through tests/harness/faultproxy.py), the commands in this process, and the one-shot commands
with ``--json`` against the sample network run as real ``martinet run`` processes.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from martinet.swiftlets.mgmt.admin import Commands, Shell, UsageError, _table, crawl, to_dot
from martinet.swiftlets.mgmt.client import AdminClient, AdminError

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import ROUTING_STACK, routing_config
from tests.harness.paths import ROOT
from tests.harness.polling import wait_until
from tests.harness.processes import RouterProcess, free_port

MGMT_STACK = (*ROUTING_STACK, "sys$mgmt")
RING = ("r1", "r2", "r3", "r4", "r5")
CONF = ROOT / "conf" / "network"


async def test_map_of_a_ring_of_five_before_and_right_after_a_link_is_cut(network, nursery):
    for name in RING:  # (the default hop limit, 3, would hide the router 4 hops away once the link is cut)
        routing = routing_config(route_announce_hop_limit=5)
        await network.start(network.config(name, startorder=MGMT_STACK, swiftlets={"sys$routing": routing}))
    proxy = FaultProxy("127.0.0.1", network.routing_port("r2"))  # r1 dials r2 through it
    await nursery.start(proxy.run)
    network.connect("r1", "r2", port=str(proxy.port), **{"retry-time": "1000"})
    for source, target in [("r2", "r3"), ("r3", "r4"), ("r4", "r5"), ("r5", "r1")]:
        network.connect(source, target)
    await network.settle({"r1": {"r2": 1, "r3": 2, "r4": 2, "r5": 1}})
    async with AdminClient.open(network.url("r1")) as admin:
        ring = await crawl(admin)
        assert ring.start == "r1" and ring.unreachable == {}
        assert ring.routers == {"r1": 0, "r2": 1, "r3": 2, "r4": 2, "r5": 1}
        assert [(link.source, link.target, link.state, link.listener_state) for link in ring.links] == [
            (source, target, "operational", "operational")
            for source, target in [("r1", "r2"), ("r2", "r3"), ("r3", "r4"), ("r4", "r5"), ("r5", "r1")]
        ]
        dot = to_dot(ring)
        assert dot.count(" -> ") == 5 and dot.count("color=darkgreen,") == 5
        assert all(f'"{name}" [label=' in dot for name in RING)

        proxy.refuse(True)
        proxy.cut()
        with trio.fail_after(20):  # as soon as r1 has noticed and every router answers again (the long way)
            while True:
                cut = await crawl(admin)
                first = cut.links[0]
                if first.state != "operational" and first.listener_state == "" and not cut.unreachable:
                    break
                await trio.sleep(0.05)
        assert (first.source, first.target, first.connector) == ("r1", "r2", "r2")
        assert first.state in ("waiting", "connecting", "failed")
        assert [link.state for link in cut.links[1:]] == ["operational"] * 4
        assert set(cut.routers) == set(RING)
        await network.settle({"r1": {"r2": 4, "r3": 3, "r4": 2, "r5": 1}})
        after = await crawl(admin)
        assert after.routers == {"r1": 0, "r2": 4, "r3": 3, "r4": 2, "r5": 1}
        assert "color=darkgreen" in to_dot(after) and re.search(
            r'"r1" -> "r2" \[label="(waiting|connecting|failed)"', to_dot(after)
        )


async def test_commands_in_context(network):
    for name in ("a", "b"):
        await network.start(network.config(name, startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    b = network.routers["b"].management
    async with AdminClient.open(network.url("a")) as admin:
        commands = Commands(admin)
        assert [row["name"] for row in (await commands.run(["ar"])).data] == ["a", "b"]
        await commands.run(["sr", "b"])
        await commands.run(["cc", "/sys$queuemanager/queues"])
        for name in ("test.1", "test.2", "keep"):
            await commands.run(["new", ".", name, "max-messages=10"])
        assert b.get("/sys$queuemanager/queues/test.1", "max-messages") == 10
        assert (await commands.run(["set", "test.2", "max-messages", "20"])).data["new"] == 20
        listed = await commands.run(["lc"])
        assert set(listed.data["entries"]) >= {"test.1", "test.2", "keep"}
        deleted = await commands.run(["delete", ".", "test._"])
        assert deleted.data == {"path": "/sys$queuemanager/queues", "deleted": ["test.1", "test.2"]}
        assert set(b.entity_list("/sys$queuemanager/queues").entities) >= {"keep"}
        assert not {"test.1", "test.2"} & set(b.entity_list("/sys$queuemanager/queues").entities)
        await commands.run(["cc", ".."])
        assert commands.path == "/sys$queuemanager"
        commands.watch_limit = 2
        watched = {}

        async def watch() -> None:
            watched["output"] = await commands.run(["watch", "/sys$queuemanager"])

        async with trio.open_nursery() as watching:
            watching.start_soon(watch)
            await wait_until(lambda: b.get("/sys$mgmt/usage", "watches") == 1, what="watching")
            b.set("/sys$queuemanager", "max-message-size", "123456")
            b.add("/sys$queuemanager/queues", "seen")
        assert [(n["event"]["type"], n["event"]["path"]) for n in watched["output"].data] == [
            ("property-changed", "/sys$queuemanager"),
            ("entity-added", "/sys$queuemanager/queues"),
        ]
        await wait_until(lambda: b.get("/sys$mgmt/usage", "watches") == 0, what="unwatched")
        shown = await commands.run(["queues"])
        assert "sys$mgmt" in shown.data["entries"] and shown.views  # a table
        with pytest.raises(AdminError, match="no 'nothing' under /sys\\$queuemanager"):
            await commands.run(["cc", "nothing"])
        with pytest.raises(UsageError, match="usage: set"):
            await commands.run(["set", "x"])
        with pytest.raises(UsageError, match="unknown command 'frobnicate'"):
            await commands.run(["frobnicate"])


def test_table_values_are_shown_as_they_are():
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(
        _table(
            "/sys$scheduler/schedules",
            ["property", "description"],
            [["time-expression", "'start HH:mm[:ss] stop HH:mm[:ss] delay <n>h|m|s [repeat <n>]' [bold]x[/bold]"]],
        )
    )
    assert "delay <n>h|m|s [repeat <n>]' [bold]x[/bold]" in console.export_text()


def sample_network(folder: Path) -> dict[str, str]:
    """The sample network's configs (conf/network) with free ports instead of its fixed ones,
    written to ``folder/NAME/router.xml``; the AMQP URL of each router."""
    ports = {port: free_port() for port in (5681, 5682, 5683, 4101, 4102, 4103, 8081, 8082, 8083)}
    urls = {}
    for file in sorted(CONF.glob("*.xml")):
        text = file.read_text()
        for old, new in ports.items():
            text = text.replace(f'port="{old}"', f'port="{new}"')
        (folder / file.stem).mkdir(parents=True)
        (folder / file.stem / "router.xml").write_text(text)
        amqp = re.search(r'<listener name="amqp" port="(\d+)"', text).group(1)
        urls[file.stem] = f"amqp://127.0.0.1:{amqp}"
    return urls


def admin(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "admin", "-u", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.slow
def test_one_shot_commands_and_json_against_the_sample_network(tmp_path):
    urls = sample_network(tmp_path)
    routers = [RouterProcess(["router.xml"], tmp_path / name, name=name) for name in urls]
    try:
        for router in routers:
            router.wait_started()
        deadline = time.monotonic() + 60
        expected = [("tokyo", 0), ("lyon", 1), ("paris", 1)]
        while True:  # until tokyo has its direct routes to both others
            result = admin(urls["tokyo"], "--json", "ar")
            if result.returncode == 0 and [(r["name"], r["hops"]) for r in json.loads(result.stdout)] == expected:
                break
            assert time.monotonic() < deadline, result.stdout + result.stderr
            time.sleep(0.5)
        # and until all three links are up: a connector that dialled before its peer listened
        # waits its retry-time (5 s) before the next attempt, while the routes already exist
        while True:
            result = admin(urls["tokyo"], "--json", "map")
            if (
                result.returncode == 0
                and [link["state"] for link in json.loads(result.stdout)["links"]] == ["operational"] * 3
            ):
                break
            assert time.monotonic() < deadline, result.stdout + result.stderr
            time.sleep(0.5)

        # a change on paris through tokyo, as the example
        result = admin(
            urls["tokyo"], "-r", "paris", "--json", "set", "/sys$queuemanager/queues/orders", "max-messages", "10000"
        )
        assert result.returncode == 1 and "no entry" not in result.stderr  # no such queue configured yet
        assert "no 'orders' under /sys$queuemanager/queues" in result.stderr
        assert admin(urls["tokyo"], "-r", "paris", "new", "/sys$queuemanager/queues", "orders").returncode == 0
        result = admin(
            urls["tokyo"], "-r", "paris", "--json", "set", "/sys$queuemanager/queues/orders", "max-messages", "10000"
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["new"] == 10000
        shown = json.loads(
            admin(urls["lyon"], "-r", "paris", "--json", "show", "/sys$queuemanager/queues/orders").stdout
        )
        assert shown["properties"]["max-messages"] == 10000

        result = admin(urls["tokyo"], "-r", "paris", "set", "/sys$queuemanager/queues/orders", "max-messages", "x")
        assert (
            result.returncode == 1
            and "paris: /sys$queuemanager/queues/orders: property 'max-messages'" in result.stderr
        )

        network = json.loads(admin(urls["tokyo"], "--json", "map").stdout)
        assert network["routers"] == {"lyon": 1, "paris": 1, "tokyo": 0}
        assert sorted((link["source"], link["target"], link["state"]) for link in network["links"]) == [
            ("lyon", "tokyo", "operational"),
            ("paris", "lyon", "operational"),
            ("tokyo", "paris", "operational"),
        ]
        dot = admin(urls["tokyo"], "map", "--dot").stdout
        assert dot.startswith("digraph martinet {") and dot.count(" -> ") == 3
        table = admin(urls["tokyo"], "links").stdout  # a rich table
        assert all(name in table for name in urls) and table.count("operational") >= 3
        routes = json.loads(admin(urls["paris"], "--json", "routes").stdout)
        assert set(routes) == set(urls) and set(routes["paris"]) == {"lyon", "tokyo"}
        for router in routers:
            assert "Traceback" not in router.text()
    finally:
        for router in routers:
            router.close()


async def test_the_shell_runs_commands_in_context_and_completes_paths(network, capsys):
    for name in ("a", "b"):
        await network.start(network.config(name, startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    network.connect("a", "b")
    await network.settle({"a": {"b": 1}})
    async with AdminClient.open(network.url("a")) as admin:
        shell = Shell(Commands(admin), as_json=False)

        def session() -> list:
            completions = [shell.completenames("s"), shell.completedefault("/sys$q", "lc /sys$q", 3, 9)]
            shell.onecmd("sr b")
            shell.onecmd("cc /sys$queuemanager")
            completions.append(shell.completedefault("usage/q", "lc usage/q", 3, 10))
            completions.append(shell.completedefault("", "sr ", 3, 3))
            shell.onecmd("set max-message-size 4242")
            shell.onecmd("set max-message-size -1")
            shell.onecmd("lc")
            return completions

        completions = await trio.to_thread.run_sync(session)
    # (b first: the router in context)
    assert completions == [["save ", "set ", "show ", "sr "], ["/sys$queuemanager/"], ["usage/queues/"], ["b", "a"]]
    assert shell.prompt == "b:/sys$queuemanager> "
    assert network.routers["b"].management.get("/sys$queuemanager", "max-message-size") == 4242
    out = capsys.readouterr().out
    assert "/sys$queuemanager max-message-size: " in out and "-> 4242" in out
    assert "error: b: /sys$queuemanager: property 'max-message-size'" in out  # refused, shown, shell goes on
    assert "queues" in out and "usage" in out  # the lc table


@pytest.mark.slow
def test_the_shell_reads_commands_from_stdin(tmp_path):
    urls = sample_network(tmp_path)
    router = RouterProcess(["router.xml"], tmp_path / "paris", name="paris")
    try:
        router.wait_started()
        result = subprocess.run(
            [sys.executable, "-m", "martinet.kernel", "admin", "-u", urls["paris"]],
            input="lc\ncc /sys$mgmt/groups\nshow\nhelp sr\nnonsense\nexit\n",
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert result.returncode == 0, result.stderr
        assert "sys$mgmt" in result.stdout and "read-write" in result.stdout  # lc, then the groups table
        assert "sr ROUTER: the router the next commands go to." in result.stdout
        assert "error: unknown command 'nonsense'" in result.stdout
    finally:
        router.close()


async def one_shot(capsys, url: str, *words: str) -> tuple[int, str, str]:
    """``martinet admin -u URL WORDS…`` run in this process (its exit status, stdout,
    stderr): the real command line, connection and router; stdout is captured, not a
    terminal, as when piped."""
    import argparse

    from martinet.swiftlets.mgmt.admin import _configure, _main

    parser = argparse.ArgumentParser()
    _configure(parser)
    capsys.readouterr()
    status = await _main(parser.parse_args(["-u", url, *words]))
    out, err = capsys.readouterr()
    return status, out, err


async def test_watch_errors_are_one_line_and_count_goes_anywhere(network, capsys):
    await network.start(network.config("a", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    a = network.routers["a"].management
    url = network.url("a")
    with trio.fail_after(30):
        status, out, err = await one_shot(capsys, url, "watch", "/nothing")
        assert (status, out) == (1, "") and err.startswith("error: a: no 'nothing' under /;")
        assert err.count("\n") == 1 and err.endswith("\n")
        status, out, err = await one_shot(capsys, url, "watch", "/sys$queuemanager", "--count")
        assert (status, out) == (2, "") and err == "error: usage: watch [PATH] [--count N]\n"
        for words in (["watch", "/sys$queuemanager", "--count", "1"], ["watch", "--count", "1", "/sys$queuemanager"]):
            done: list = []

            async def watch(words=words, done=done) -> None:
                done.append(await one_shot(capsys, url, *words))

            async with trio.open_nursery() as watching:
                watching.start_soon(watch)
                await wait_until(lambda: a.get("/sys$mgmt/usage", "watches") == 1, what="watching")
                a.set("/sys$queuemanager", "max-message-size", str(100000 + len(words[1])))
            status, out, err = done[0]
            assert (status, err) == (0, "")
            assert out.splitlines()[1].startswith("/sys$queuemanager max-message-size: ")
            await wait_until(lambda: a.get("/sys$mgmt/usage", "watches") == 0, what="unwatched")


async def test_piped_tables_are_not_wrapped_and_routing_views_need_sys_routing(network, capsys):
    await network.start(network.config("a", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    await network.start(network.config("lone", startorder=(*MGMT_STACK[:-2], "sys$mgmt")))  # no sys$routing
    long_name = "orders." + "x" * 150
    network.routers["a"].management.add("/sys$queuemanager/queues", long_name)
    with trio.fail_after(30):
        status, out, err = await one_shot(capsys, network.url("a"), "queues")
        assert (status, err) == (0, "")
        assert any(long_name in line for line in out.splitlines())  # on one line, whole
        for command in ("links", "routes", "map"):
            status, out, err = await one_shot(capsys, network.url("lone"), command)
            assert (status, out) == (1, ""), command
            assert err == "error: lone: router lone runs no sys$routing: it has no links or routes\n", command


async def test_set_suggests_a_misspelled_property_and_temporary_queues_go_quietly(network, capsys, caplog):
    import logging

    await network.start(network.config("a", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    caplog.set_level(logging.DEBUG, logger="martinet.swiftlets.queuemanager")
    with trio.fail_after(30):
        status, out, err = await one_shot(capsys, network.url("a"), "set", "/sys$queuemanager", "max-mesage-size", "9")
    assert (status, out) == (1, "")
    assert err == "error: a: /sys$queuemanager: no property 'max-mesage-size'; did you mean 'max-message-size'?\n"
    await wait_until(
        lambda: any("tmp$" in r.getMessage() and "deleted" in r.getMessage() for r in caplog.records),
        what="the admin's reply queue deleted",
    )
    deleted = [r for r in caplog.records if "tmp$" in r.getMessage() and "deleted" in r.getMessage()]
    assert [r.levelname for r in deleted] == ["DEBUG"] * len(deleted)


async def test_link_since_is_when_the_state_began_and_an_old_error_has_its_time(network):
    from martinet.swiftlets.routing.config import ListenerConfig, RoutingConfig

    await network.start(network.config("a", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()}))
    port = free_port()  # b's routing listener, not listening yet: a's connector fails, retry after retry
    network.routers["a"].management.add(
        "/sys$routing/connectors", "b", {"hostname": "127.0.0.1", "port": str(port), "retry-time": "1000"}
    )
    connector = "/sys$routing/usage/connectors/b"
    a = network.routers["a"].management

    def attempts() -> int:
        return a.get(connector, "attempts")

    async with AdminClient.open(network.url("a")) as admin:
        await wait_until(lambda: a.get(connector, "state") == "failed", what="the first failure")
        first = [link for link in (await crawl(admin)).links if link.connector == "b"][0]
        assert first.state == "failed" and first.since and first.error.startswith("cannot connect to 127.0.0.1:")
        seen = attempts()
        # retries a second apart, until the clock's second (the stamps' resolution) has moved on
        await wait_until(
            lambda: attempts() >= seen + 2 and a.get(connector, "state") == "failed", timeout=20, what="two retries"
        )
        again = [link for link in (await crawl(admin)).links if link.connector == "b"][0]
        assert (again.state, again.since, again.error) == ("failed", first.since, first.error)

        routing = RoutingConfig(listeners=[ListenerConfig(name="links", port=port, bindaddress="127.0.0.1")])
        await network.start(network.config("b", startorder=MGMT_STACK, swiftlets={"sys$routing": routing}))
        await wait_until(lambda: a.get(connector, "state") == "operational", timeout=20, what="operational")
        up = [link for link in (await crawl(admin)).links if link.connector == "b"][0]
        assert (up.target, up.state, up.error) == ("b", "operational", "")  # no error without a time
        assert up.since >= first.since
        usage = a.resolve(connector).properties()
        assert usage["previous-error"] == first.error and usage["previous-error-time"] == first.since
        assert usage["last-error"] == usage["last-error-time"] == ""


async def test_destructive_commands_say_what_they_destroy_and_need_a_confirmation(network, capsys):
    from martinet.messaging.client import DeliveryMode, Queue, TextMessage, Topic, connect

    config = network.config("a", startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config()})
    router = await network.start(config)
    tree = router.management
    tree.add("/sys$queuemanager/queues", "orders")
    url = network.url("a")
    async with connect(url, client_id="app") as connection, connection.session() as session:
        producer = await session.producer(Queue("orders"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(5):
            await producer.send(TextMessage(f"order {n}"))
        subscriber = await session.durable_subscriber(Topic("news"), "sub")
        await subscriber.close()
        publisher = await session.producer(Topic("news"), delivery_mode=DeliveryMode.PERSISTENT)
        for n in range(2):
            await publisher.send(TextMessage(f"news {n}"))
    queue_manager = router.swiftlet("sys$queuemanager")
    await prepare_xa(queue_manager)
    await network.stop("a")
    router = await network.start(config)  # the prepared transaction is in doubt after a restart
    tree = router.management
    tree.add("/sys$queuemanager/queues", "orders")  # configured again (the runtime addition was not saved)
    url = network.url("a")
    queues, orders = "/sys$queuemanager/queues", "/sys$queuemanager/usage/queues/orders"
    durable, in_doubt = "/sys$topicmanager/usage/durable-subscribers", "/sys$xa/usage/in-doubt/client-9"
    await wait_until(lambda: tree.get(f"{durable}/app$sub", "messages") == 2, what="the durable's messages back")

    refused = {
        ("delete", queues, "orders"): "removing /sys$queuemanager/queues/orders drops the 5 message(s) it holds",
        ("invoke", orders, "purge"): f"purge of {orders} drops 5 message(s)",
        ("delete", durable, "app$sub"): f"delete of {durable}/app$sub drops 2 message(s)",
        ("invoke", in_doubt, "rollback"): f"rollback of {in_doubt} drops 2 message(s)",
        ("halt",): "halt stops router a (its clients and links are cut; 0 non-persistent message(s) in its "
        "queues are lost, persistent ones wait in its store)",
    }
    with trio.fail_after(60):
        for words, what in refused.items():  # one-shot without --force: refused, saying what would go
            status, out, err = await one_shot(capsys, url, *words)
            assert (status, out) == (1, ""), (words, out, err)
            assert err == f"error: a: {what}: not done without force (a confirmation); add --force to do it\n"
        assert tree.get(orders, "messages") == 5 and tree.get(f"{durable}/app$sub", "messages") == 2
        assert "client-9" in tree.resolve("/sys$xa/usage/in-doubt").children

        async with AdminClient.open(url) as admin:  # the shell asks; no keeps, yes goes
            commands = Commands(admin)
            questions: list[str] = []
            answers = iter([False, True])

            async def ask(question: str) -> bool:
                questions.append(question)
                return next(answers)

            commands.ask = ask
            assert (await commands.run(["invoke", orders, "purge"])).views == ("not done",)
            assert tree.get(orders, "messages") == 5
            assert (await commands.run(["invoke", orders, "purge"])).data == "5 messages purged from orders"
            assert questions == [f"a: purge of {orders} drops 5 message(s). Do it? [y/N] "] * 2
            deleted = await commands.run(["delete", queues, "orders"])  # empty now: no question
            assert deleted.data["deleted"] == ["orders"]
            assert len(questions) == 2

        status, out, err = await one_shot(capsys, url, "--force", "delete", durable, "app$sub")
        assert (status, err) == (0, "") and "1 deleted: app$sub" in out
        status, out, err = await one_shot(capsys, url, "invoke", in_doubt, "rollback", "--force")
        assert (status, err) == (0, "")
        assert "app$sub" not in tree.resolve(durable).children
        assert "client-9" not in tree.resolve("/sys$xa/usage/in-doubt").children
        status, out, err = await one_shot(capsys, url, "halt", "--force")
        assert (status, err, out) == (0, "", "a: halting\n")


async def prepare_xa(queue_manager) -> None:
    """An XA transaction prepared with two sends (in doubt once the router restarts)."""
    from martinet.messaging.message import build

    transaction = queue_manager.transaction()
    for n in range(2):
        transaction.send("out", build(f"x{n}".encode(), message_id=f"x-{n}", durable=True))
    await transaction.prepare("client-9")
