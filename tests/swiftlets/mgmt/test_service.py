"""``sys$mgmt``: management requests over real AMQP connections, to the router connected to and
to routers two hops away, in networks of routers in this process (tests/harness/network.py).

Each request travels as the tool sends it (:class:`AdminClient`: our client, a temporary
reply queue, JSON bodies); authorization is checked with real logins, and the rule for clients
without a login with a client connecting from 127.0.0.2 to routers whose local-addresses is
127.0.0.1.
"""

from __future__ import annotations

import json
import logging

import attrs
import pytest
import trio
from proton import Message as ProtonMessage
from proton.reactor import Container, DurableSubscription
from proton.utils import BlockingConnection

from martinet.kernel import Router, load_swiftlet_specs
from martinet.kernel.config import save_config
from martinet.messaging.client import Queue, TextMessage, connect
from martinet.swiftlets.authentication.config import (
    AuthenticationConfig,
    GroupConfig,
    QueueGrant,
    TopicGrant,
    UserConfig,
)
from martinet.swiftlets.mgmt.api import IDENTITY_ANNOTATION, Identity, Management, Role
from martinet.swiftlets.mgmt.client import AdminClient, AdminError
from martinet.swiftlets.mgmt.config import AdminGroup, MgmtConfig
from martinet.swiftlets.mgmt.service import Refused, authorize

from tests.harness.faultproxy import FaultProxy
from tests.harness.network import ROUTING_STACK, STACK, router_config, routing_config
from tests.harness.polling import wait_until

MGMT_STACK = (*ROUTING_STACK, "sys$mgmt")


async def start_line(network, *names: str, **configs) -> None:
    """Routers ``names`` with management, each dialing the next: a line."""
    for name in names:
        await network.start(
            network.config(name, startorder=MGMT_STACK, swiftlets={"sys$routing": routing_config(), **configs})
        )
    for source, target in zip(names, names[1:], strict=False):
        network.connect(source, target)


async def test_requests_to_the_local_router_and_to_one_two_hops_away(network):
    await start_line(network, "a", "b", "c")
    await network.settle({"a": {"b": 1, "c": 2}, "c": {"a": 2, "b": 1}})
    async with AdminClient.open(network.url("a")) as admin:
        assert admin.router == "a"
        root = await admin.call(None, "get", path="/")
        assert root["kind"] == "entity" and root["properties"]["name"] == "a"
        assert {"sys$mgmt", "sys$routing", "usage"} <= set(root["children"])
        remote = await admin.call("c", "get", path="/usage")
        assert remote["properties"]["name"] == "c"
        routers = await admin.call("a", "routers")
        assert [(r["name"], r["hops"]) for r in routers] == [("a", 0), ("b", 1), ("c", 2)]
        # a change two hops away, seen in c's tree and answered with old and new value
        path = "/sys$queuemanager"
        before = network.routers["c"].management.get(path, "max-message-size")
        result = await admin.call("c", "set", path=path, name="max-message-size", value="20000")
        assert (result["old"], result["new"], result["reboot-required"]) == (before, 20000, False)
        assert network.routers["c"].management.get(path, "max-message-size") == 20000
        assert network.routers["a"].management.get(path, "max-message-size") != 20000
        # describe gives the declarations a front end needs
        described = await admin.call("c", "describe", path="/sys$mgmt/groups")
        assert described["item"]["role"]["choices"] == ["read-only", "read-write"]
        assert described["item"]["role"]["default"] == "read-only" and "default" not in described["item"]["name"]
        # a list as entries with their properties (what the CLI shows as a table)
        queues = await admin.call("c", "get", path="/sys$queuemanager/usage/queues")
        assert queues["kind"] == "usage-list" and "sys$mgmt" in queues["entries"]
        assert "rt$a" in queues["entries"] and "messages" in queues["entries"]["rt$a"]


async def test_validation_errors_and_vetoes_come_back_with_their_reasons(network):
    await start_line(network, "a", "b", "c")
    await network.settle({"a": {"b": 1, "c": 2}})
    async with AdminClient.open(network.url("a")) as admin:
        reply = await admin.request("c", "set", path="/sys$queuemanager", name="max-message-size", value="-3")
        assert reply["status"] == 400 and reply["router"] == "c"
        assert "/sys$queuemanager: property 'max-message-size'" in reply["error"]
        # the routing swiftlet vetoes a static route no router can have
        reply = await admin.request("c", "add", path="/sys$routing/static-routes", name="9bad")
        assert reply["status"] == 400
        assert "refused: invalid router name '9bad'" in reply["error"]
        assert "9bad" not in network.routers["c"].management.entity_list("/sys$routing/static-routes").entities
        reply = await admin.request("c", "get", path="/sys$nothing")
        assert reply["status"] == 400 and "no 'sys$nothing' under /" in reply["error"]
        reply = await admin.request(None, "explode")
        assert reply["status"] == 400 and "unknown verb 'explode'" in reply["error"]
        reply = await admin.request(None, "get", version=7)
        assert reply["status"] == 400 and "version 7" in reply["error"]
        with pytest.raises(AdminError, match="request not sent"):  # the connected router knows no 'nowhere'
            await admin.call("nowhere", "get", path="/")
        # a reply larger than c lets a message be says so in one that fits
        await admin.call("c", "set", path="/sys$queuemanager", name="max-message-size", value="1000")
        reply = await admin.request("c", "get", path="/sys$queuemanager/usage/queues")
        assert reply["status"] == 500 and reply["error"].startswith("the reply is too large: message of ")


async def test_operations_of_swiftlets_through_management(network):
    await start_line(network, "a", "b")
    await network.settle({"a": {"b": 1}})
    async with connect(network.url("b")) as client:
        session = await client.session()
        producer = await session.producer(Queue("orders"))
        for n in range(5):
            await producer.send(TextMessage(f"order {n}", properties={"n": n}))
        async with AdminClient.open(network.url("a")) as admin:
            queue = "/sys$queuemanager/usage/queues/orders"
            assert set((await admin.call("b", "get", path=queue))["operations"]) == {"purge", "move", "view"}
            view = await admin.call("b", "invoke", path=queue, operation="view", args={"start": 1, "count": 2})
            assert [(m["body"], m["properties"]) for m in view] == [("order 1", {"n": 1}), ("order 2", {"n": 2})]
            moved = await admin.call(
                "b", "invoke", path=queue, operation="move", args={"target": "kept", "selector": "n >= 3"}
            )
            assert moved == "2 messages moved from orders to kept"
            reply = await admin.request("b", "invoke", path=queue, operation="purge")  # it would drop messages
            assert reply["status"] == 409 and reply["error"] == (
                f"purge of {queue} drops 3 message(s): not done without force (a confirmation)"
            )
            purged = await admin.call("b", "invoke", path=queue, operation="purge", force=True)
            assert purged == "3 messages purged from orders"
            usage = network.routers["b"].management
            assert usage.get("/sys$queuemanager/usage/queues/kept", "messages") == 2
            assert usage.get(queue, "messages") == 0
            reply = await admin.request("b", "invoke", path=queue, operation="move", args={"target": "x@nowhere"})
            assert reply["status"] == 400 and "nowhere" in reply["error"]
            # delete a connection: the client's, on b
            connections = (await admin.call("b", "get", path="/sys$jms/usage/connections"))["entries"]
            [name] = [n for n, c in connections.items() if c["host"] == "127.0.0.1"]
            await admin.call("b", "invoke", path=f"/sys$jms/usage/connections/{name}", operation="delete")
            await wait_until(lambda: not usage.resolve("/sys$jms/usage/connections").children, what="closed")
            # disable and enable a connector of a
            await admin.call("a", "invoke", path="/sys$routing/usage/connectors/b", operation="disable")
            assert network.routers["a"].management.get("/sys$routing/connectors/b", "enabled") is False
            await wait_until(lambda: network.table("a") == {}, what="a's link to b down")
            await admin.call("a", "invoke", path="/sys$routing/usage/connectors/b", operation="enable")
            await network.settle({"a": {"b": 1}})


def users_config() -> AuthenticationConfig:
    groups = [GroupConfig(name=name) for name in ("public", "admin", "viewers")]
    users = [
        UserConfig(name="root", password="root-pw", group="admin"),
        UserConfig(name="watcher", password="watcher-pw", group="viewers"),
        UserConfig(name="guest", password="guest-pw", group="public"),
    ]
    return AuthenticationConfig(authentication_enabled=True, groups=groups, users=users)


async def test_roles_with_authentication(network):
    mgmt = MgmtConfig(
        groups=[AdminGroup(name="admin", role=Role.READ_WRITE), AdminGroup(name="viewers", role=Role.READ_ONLY)]
    )
    await start_line(network, "a", "b", **{"sys$authentication": users_config(), "sys$mgmt": mgmt})
    await network.settle({"a": {"b": 1}})
    url = network.url("a")
    async with AdminClient.open(url, user="watcher", password="watcher-pw") as admin:
        assert (await admin.call("b", "get", path="/usage"))["properties"]["name"] == "b"
        reply = await admin.request("b", "set", path="/sys$queuemanager", name="max-message-size", value="20000")
        assert reply["status"] == 403
        assert reply["error"] == "'set' changes router b, and the role of group viewers is read-only"
    async with AdminClient.open(url, user="guest", password="guest-pw") as admin:
        reply = await admin.request("b", "get", path="/")
        assert reply["status"] == 403 and "user guest (group public) may not manage router b" in reply["error"]
    async with AdminClient.open(url, user="root", password="root-pw") as admin:
        result = await admin.call("b", "set", path="/sys$queuemanager", name="max-message-size", value="20000")
        assert result["new"] == 20000


#: A client "on another machine": every 127.x address is this machine's loopback on Linux, and
#: the routers of the test below count only 127.0.0.1 as local (sys$mgmt's local-addresses),
#: so the outside needs no second interface or network and the test runs on any machine.
OUTSIDE = "127.0.0.2"


async def test_without_authentication_only_local_clients_are_answered(network, nursery, caplog):
    mgmt = MgmtConfig(local_addresses="127.0.0.1")
    await start_line(network, "a", "b", **{"sys$mgmt": mgmt})
    await network.settle({"a": {"b": 1}})
    port = network.routers["a"].management.get("/sys$jms/usage/listeners/amqp", "port")
    # A connection to 127.0.0.2 would come from 127.0.0.1 (the kernel's source address for
    # loopback); the proxy connects to a from 127.0.0.2, so a sees the client there.
    proxy = FaultProxy("127.0.0.1", port, local_address=OUTSIDE)
    await nursery.start(proxy.run)
    outside = f"amqp://127.0.0.1:{proxy.port}"
    async with AdminClient.open(outside) as admin:
        for router in ("a", "b"):  # refused here and two hops on: b trusts the identity a stamped
            reply = await admin.request(router, "get", path="/")
            assert reply["status"] == 403
            assert (
                reply["error"] == f"router {router} has authentication disabled and answers management "
                f"requests only from loopback clients (local-addresses '127.0.0.1'); anonymous@{OUTSIDE} "
                "via a is not one"
            )
    # a forged identity in the request (proton puts it in) is replaced by the one the listener stamps
    reply = await trio.to_thread.run_sync(forged_request, outside)
    assert reply["status"] == 403 and f"anonymous@{OUTSIDE} via a is not one" in reply["error"]
    assert proxy.accepted == 2  # both clients came through the proxy, from 127.0.0.2
    assert "Traceback" not in caplog.text
    async with AdminClient.open(network.url("a")) as admin:  # from 127.0.0.1: answered
        assert (await admin.call("b", "get", path="/usage"))["properties"]["name"] == "b"


def forged_request(url: str) -> dict:
    """A ``get`` sent with proton, claiming a loopback identity and to be the router itself in
    the annotation the listener stamps; the reply."""
    connection = BlockingConnection(url, timeout=10)
    try:
        receiver = connection.create_receiver(None, dynamic=True)
        request = ProtonMessage(
            body=json.dumps({"verb": "get", "path": "/"}),
            reply_to=receiver.remote_source.address,
            correlation_id="forged",
        )
        # the forged stamp names the reply-to too, so that a router trusting it answers (200)
        forged = Identity(host="127.0.0.1", router="a", internal=True, reply_to=receiver.remote_source.address)
        request.annotations = {IDENTITY_ANNOTATION: forged.annotation()}
        connection.create_sender("sys$mgmt").send(request)
        reply = receiver.receive(timeout=10)
        receiver.accept()
        assert reply.correlation_id == "forged"
        return json.loads(reply.body)
    finally:
        connection.close()


def test_the_authorization_decision():
    groups = {"admin": Role.READ_WRITE, "viewers": Role.READ_ONLY}
    root = Identity(user="root", group="admin", authenticated=True, host="10.1.1.1", router="x")
    assert authorize(root, "set", router="r", authentication=True, groups=groups) is Role.READ_WRITE
    with pytest.raises(Refused, match="not authenticated where the request entered"):
        authorize(attrs.evolve(root, authenticated=False), "get", router="r", authentication=True, groups=groups)
    viewer = attrs.evolve(root, user="eve", group="viewers")
    for verb in ("get", "describe", "routers", "watch", "unwatch"):
        assert authorize(viewer, verb, router="r", authentication=True, groups=groups) is Role.READ_ONLY
    for verb in ("set", "add", "remove", "invoke", "save", "reboot", "halt"):  # invoke: purge, delete, rollback…
        with pytest.raises(Refused, match=f"'{verb}' changes router r, and the role of group viewers is read-only"):
            authorize(viewer, verb, router="r", authentication=True, groups=groups)
    local = Identity(host="::ffff:127.0.0.1")
    assert authorize(local, "halt", router="r", authentication=False, groups=groups) is Role.READ_WRITE
    assert Identity(host="::1").loopback and not Identity(host="192.0.2.1").loopback
    # local-addresses: every loopback address by default; a narrower setting refuses the others
    other = Identity(host="127.0.0.2")
    assert authorize(other, "halt", router="r", authentication=False, groups=groups) is Role.READ_WRITE
    only = {"router": "r", "authentication": False, "groups": groups, "local_addresses": "127.0.0.1 ::1"}
    with pytest.raises(Refused, match=r"clients \(local-addresses '127.0.0.1 ::1'\); \(no user\)@127.0.0.2 is not"):
        authorize(other, "get", **only)
    assert authorize(Identity(host="::ffff:127.0.0.1"), "get", **only) is Role.READ_WRITE
    assert authorize(Identity(host="::1"), "get", **only) is Role.READ_WRITE
    with pytest.raises(Refused):
        authorize(Identity(host="127.0.0.1"), "get", **{**only, "local_addresses": ""})
    with pytest.raises(Refused, match="carries no identity"):
        authorize(None, "get", router="r", authentication=False, groups=groups)
    itself = Identity.of_router("x")  # a router's own request: read-only, with or without authentication
    assert Identity.from_annotations({IDENTITY_ANNOTATION: itself.annotation()}) == itself
    for authentication in (True, False):
        assert authorize(itself, "get", router="r", authentication=authentication, groups={}) is Role.READ_ONLY
        with pytest.raises(Refused, match="'set' changes router r"):
            authorize(itself, "set", router="r", authentication=authentication, groups=groups)


async def test_watch_notifications_until_unwatched_the_lease_ends_or_the_reply_queue_goes(network, caplog):
    caplog.set_level(logging.INFO, logger="martinet.swiftlets.mgmt")
    await start_line(network, "a", "b", "c", **{"sys$mgmt": MgmtConfig(watch_lease=2)})  # renewed every second
    await network.settle({"a": {"b": 1, "c": 2}})
    c = network.routers["c"].management
    before = c.get("/sys$queuemanager", "max-message-size")
    async with AdminClient.open(network.url("a")) as admin:
        async with admin.watch("c", "/sys$queuemanager") as notices:
            await admin.call("c", "set", path="/sys$queuemanager", name="max-message-size", value="30000")
            await admin.call("c", "add", path="/sys$queuemanager/queues", name="watched")
            await admin.call("c", "set", path="/sys$routing", name="max-routes-per-link", value="77")  # not below
            await admin.call("c", "remove", path="/sys$queuemanager/queues", name="watched")
            with trio.fail_after(10):
                seen = [(await notices.receive())["event"] for _ in range(3)]
            assert seen == [
                {
                    "type": "property-changed",
                    "path": "/sys$queuemanager",
                    "name": "max-message-size",
                    "old": before,
                    "new": 30000,
                },
                {"type": "entity-added", "path": "/sys$queuemanager/queues", "name": "watched"},
                {"type": "entity-removed", "path": "/sys$queuemanager/queues", "name": "watched"},
            ]
            assert c.get("/sys$mgmt/usage", "watches") == 1
        await wait_until(lambda: c.get("/sys$mgmt/usage", "watches") == 0, what="unwatched")
    # a watcher that goes away without unwatching: its reply queue on c is gone, so the next
    # change ends the watch; one that stays but does not renew: the lease ends it
    for leave in (True, False):
        async with connect(network.url("c")) as client:
            session = await client.session()
            reply_to = await session.create_temporary_queue()
            consumer = await session.consumer(reply_to)
            producer = await session.producer(Queue("sys$mgmt"))
            await producer.send(TextMessage(json.dumps({"verb": "watch", "path": "/"}), reply_to=reply_to))
            assert json.loads((await consumer.receive(timeout=10)).text)["result"]["lease"] == 2
            assert c.get("/sys$mgmt/usage", "watches") == 1
            if not leave:
                await wait_until(lambda: c.get("/sys$mgmt/usage", "watches") == 0, what="the lease ended")
        if leave:
            c.set("/sys$queuemanager", "max-message-size", "40000")
            await wait_until(lambda: c.get("/sys$mgmt/usage", "watches") == 0, what="the watch ended (reply-to gone)")
    ends = [r.getMessage().rpartition(" ended: ")[2] for r in caplog.records if " ended: " in r.getMessage()]
    assert ends == ["unwatched", "its reply-to is gone", "lease expired"]


async def test_management_protocol_inside_the_router_for_front_ends(network):
    await start_line(network, "a", "b", "c")
    await network.settle({"a": {"b": 1, "c": 2}})
    management = network.routers["a"].swiftlet("sys$mgmt")
    assert isinstance(management, Management)
    local = Identity(user="web", host="127.0.0.1", router="a")
    reply = await management.request("c", {"verb": "get", "path": "/usage"}, local)
    assert reply["status"] == 200 and reply["result"]["properties"]["name"] == "c"
    reply = await management.request("a", {"verb": "routers"}, local)
    assert [r["name"] for r in reply["result"]] == ["a", "b", "c"]
    reply = await management.request("c", {"verb": "get"}, Identity(host="192.0.2.9", router="a"))
    assert reply["status"] == 403
    itself = Identity.of_router("a")  # not loopback, not authenticated: read-only as a router
    assert (await management.request("c", {"verb": "routers"}, itself))["status"] == 200
    reply = await management.request("c", {"verb": "halt"}, itself)
    assert reply["status"] == 403 and "read-only" in reply["error"]


async def test_halt_and_reboot(network, tmp_path):
    await start_line(network, "a", "b")
    await network.settle({"a": {"b": 1}})
    async with AdminClient.open(network.url("a")) as admin:
        reply = await admin.request("b", "reboot")
        assert reply["status"] == 400 and "not loaded from a file" in reply["error"]
        assert reply["router"] == "b"
        reply = await admin.request("b", "save")
        assert reply["status"] == 400 and "save failed: this router was not loaded from a file" in reply["error"]
    stopped = network._stopped["b"]
    async with AdminClient.open(network.url("a")) as admin:
        reply = await admin.request("b", "halt")  # a halt is always confirmed
        assert reply["status"] == 409 and reply["error"].startswith("halt stops router b (")
        assert (await admin.request("b", "halt", force="yes"))["status"] == 400
        result = await admin.call("b", "halt", force=True)
        assert result == {"halting": "b", "in-seconds": 1.0}
    with trio.fail_after(15):
        await stopped.wait()


async def test_reboot_runs_the_saved_config(nursery, tmp_path):
    specs = load_swiftlet_specs()
    path = tmp_path / "r.xml"
    save_config(router_config("solo", tmp_path, startorder=(*STACK, "sys$mgmt")), specs, path)
    router = Router.from_file(path)
    done = trio.Event()

    async def run(*, task_status):
        await router.run(task_status=task_status)
        done.set()

    await nursery.start(run)
    port = router.management.get("/sys$jms/usage/listeners/amqp", "port")
    async with AdminClient.open(f"amqp://127.0.0.1:{port}") as admin:
        await admin.call(None, "set", path="/sys$queuemanager", name="max-message-size", value="12345")
        assert (await admin.call(None, "save"))["file"] == str(path)
        assert (await admin.call(None, "reboot"))["rebooting"] == "solo"
    with trio.fail_after(15):
        await done.wait()
    successor = router.successor
    assert successor is not None and successor.management.get("/sys$queuemanager", "max-message-size") == 12345


def guest_requests(url: str, reply_tos: list[str]) -> list[tuple[str, dict]]:
    """As guest (no admin role): one ``get`` to ``sys$mgmt`` here and one to ``sys$mgmt@b`` per
    reply-to, then the same to its own temporary queue, whose replies it returns
    (correlation-id, reply)."""
    connection = BlockingConnection(url, timeout=10, user="guest", password="guest-pw")
    try:
        receiver = connection.create_receiver(None, dynamic=True)
        own = receiver.remote_source.address
        senders = {"a": connection.create_sender("sys$mgmt"), "b": connection.create_sender("sys$mgmt@b")}
        body = json.dumps({"verb": "get", "path": "/usage"})
        for reply_to in [*reply_tos, own]:
            for router, sender in senders.items():
                sender.send(ProtonMessage(body=body, reply_to=reply_to, correlation_id=f"{router} {reply_to}"))
        replies = []
        for _ in senders:
            reply = receiver.receive(timeout=10)
            receiver.accept()
            replies.append((reply.correlation_id, json.loads(reply.body)))
        return sorted(replies, key=lambda item: item[0])
    finally:
        connection.close()


async def test_a_reply_goes_only_where_its_requester_may_send_and_never_creates_a_queue(network):
    # A reply-to used to be trusted: a user without grants had replies put into other users'
    # queues and the router's own, and created a queue per reply-to until max-queues.
    groups = [
        GroupConfig(name="public", queue_grants=[QueueGrant(name="mine", receive_grant=False, browse_grant=False)]),
        GroupConfig(name="admin", topic_grants=[TopicGrant(name="%")]),
    ]
    users = [
        UserConfig(name="guest", password="guest-pw", group="public"),
        UserConfig(name="root", password="root-pw", group="admin"),
    ]
    auth = AuthenticationConfig(authentication_enabled=True, groups=groups, users=users)
    await start_line(network, "a", "b", **{"sys$authentication": auth})
    await network.settle({"a": {"b": 1}})
    managers = {name: network.routers[name].swiftlet("sys$queuemanager") for name in ("a", "b")}
    for manager in managers.values():
        manager.queue("orders", create=True)
    managers["a"].queue("mine", create=True)

    def durable_subscription() -> None:
        connection = BlockingConnection(
            network.url("a"), timeout=10, user="root", password="root-pw", container=Container(container_id="c1")
        )
        try:
            connection.create_receiver("topic://news", name="d1", options=DurableSubscription()).link.detach()
        finally:
            connection.close()

    await trio.to_thread.run_sync(durable_subscription)
    durable = "c1$d1"  # the queue of client c1's durable subscription d1
    assert durable in managers["a"].queues

    def queues_now() -> dict[str, set[str]]:  # (the guest's temporary queue goes when its connection has)
        return {name: {q for q in manager.queues if not q.startswith("tmp$")} for name, manager in managers.items()}

    queues = queues_now()
    refused = ["orders", "orders@b", durable, "sys$topic", "sys$mgmt", "x@nowhere", *(f"junk-{n}" for n in range(20))]
    replies = await trio.to_thread.run_sync(guest_requests, network.url("a"), [*refused, "mine", "mine@a"])

    # guest is answered (403: it may not manage) at its own temporary queue, by both routers
    assert [(correlation.split()[0], reply["status"]) for correlation, reply in replies] == [("a", 403), ("b", 403)]
    usages = {name: network.routers[name].management.resolve("/sys$mgmt/usage") for name in ("a", "b")}
    await wait_until(
        lambda: [usage.properties()["replies-refused"] for usage in usages.values()] == [len(refused)] * 2,
        what="every refused reply-to counted, on a and on b",
    )
    await wait_until(lambda: managers["a"].queue("mine").size == 3, what="a's reply to 'mine', a's and b's to 'mine@a'")
    assert queues_now() == queues  # no queue created
    assert [managers[name].queue("orders").size for name in ("a", "b")] == [0, 0]
    assert managers["a"].queue(durable).size == 0


class RawManager:
    """A client of sys$mgmt on one connection, with its own temporary reply queue."""

    def __init__(self, session, producer, consumer, reply_to):
        self.session, self.producer, self.consumer, self.reply_to = session, producer, consumer, reply_to

    async def request(self, **request) -> dict:
        await self.producer.send(TextMessage(json.dumps(request), reply_to=self.reply_to))
        return json.loads((await self.consumer.receive(timeout=10)).text)


async def raw_manager(connection) -> RawManager:
    session = await connection.session()
    reply_to = await session.create_temporary_queue()
    return RawManager(session, await session.producer(Queue("sys$mgmt")), await session.consumer(reply_to), reply_to)


async def test_a_watch_is_its_owners_and_one_user_has_at_most_max_watches_per_user(network):
    await start_line(network, "c", **{"sys$mgmt": MgmtConfig(max_watches_per_user=2)})
    c = network.routers["c"].management
    async with connect(network.url("c")) as first, connect(network.url("c")) as second:
        owner, other = await raw_manager(first), await raw_manager(second)
        watches = [(await owner.request(verb="watch", path="/"))["result"]["watch"] for _ in range(2)]
        refused = await owner.request(verb="watch", path="/")
        assert refused["status"] == 503
        assert refused["error"].endswith("has max-watches-per-user 2 watches on router c already")
        # the same anonymous user from the same address, but another connection: not its watch
        for verb in ("unwatch", "watch"):
            reply = await other.request(verb=verb, watch=watches[0])
            assert reply["status"] == 403 and reply["error"].startswith(f"watch {watches[0]} is "), reply
        assert c.get("/sys$mgmt/usage", "watches") == 2
        assert (await owner.request(verb="unwatch", watch=watches[0]))["result"] == {
            "watch": watches[0],
            "ended": True,
        }
        await wait_until(lambda: c.get("/sys$mgmt/usage", "watches") == 1, what="unwatched")
        assert (await other.request(verb="watch", path="/"))["status"] == 200  # room for one more of that user


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.0/8", "10.0.0.0/8 is not a loopback network: only loopback clients may manage without logging in"),
        ("126.0.0.0/7", "126.0.0.0/7 is not a loopback network"),
        ("::/0", "::/0 is not a loopback network"),
        ("127.0.0.1/8", "expected a loopback address or network such as 127.0.0.1 or ::1: 127.0.0.1/8 has host bits"),
        ("localhost", "expected a loopback address or network"),
    ],
)
def test_local_addresses_only_narrow_the_loopback_addresses(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MgmtConfig(local_addresses=text)
    assert MgmtConfig(local_addresses="127.0.0.1 127.0.5.0/24 ::1").local_addresses == "127.0.0.1 127.0.5.0/24 ::1"
