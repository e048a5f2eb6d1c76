"""sys$authentication: logins, anonymous, host access lists, queue and topic grants."""

from __future__ import annotations

import logging

import pytest
import trio

from martinet.kernel import Router
from martinet.swiftlets.authentication.api import AccessDenied, AuthenticationFailed

CONFIG = """
<router name="r1" startorder="sys$authentication">
  <swiftlet name="sys$authentication" authentication-enabled="{enabled}" allow-anonymous="{anonymous}">
    <groups>
      <group name="public">
        <queue-grants>
          <queue-grant name="public-%" send-grant="true" receive-grant="false" browse-grant="true"/>
        </queue-grants>
        <topic-grants><topic-grant name="news" durable-grant="false"/></topic-grants>
      </group>
      <group name="traders">
        <queue-grants>
          <queue-grant name="orders"/>
          <queue-grant name="orders-%" browse-grant="false"/>
          <queue-grant name="orders-audit" send-grant="false"/>
        </queue-grants>
        <topic-grants><topic-grant name="prices.%" publish-grant="false"/></topic-grants>
      </group>
    </groups>
    <users>
      <user name="alice" password="secret" group="traders"/>
      <user name="bob" password="hunter2" group="traders">
        <host-access-list><host-access-entry name="10.0.0.%"/><host-access-entry name="localhost"/></host-access-list>
      </user>
    </users>
  </swiftlet>
</router>
"""


@pytest.fixture
def start(nursery, write_config):
    async def start(enabled=True, anonymous=False):
        router = Router.from_file(
            write_config(CONFIG.format(enabled=str(enabled).lower(), anonymous=str(anonymous).lower()))
        )
        await nursery.start(router.run)
        return router, router.swiftlet("sys$authentication")

    return start


async def test_logins(start, caplog):
    router, auth = await start()
    alice = await auth.login("alice", "secret", "127.0.0.1")
    assert (alice.user, alice.group) == ("alice", "traders")
    with caplog.at_level(logging.WARNING):
        for user, password, host in [("alice", "wrong", "h1"), ("mallory", "secret", "h2"), ("alice", None, "h3")]:
            with pytest.raises(AuthenticationFailed) as caught:
                await auth.login(user, password, host)
            assert caught.value.reason == "invalid user name or password"  # the client learns no more
    assert "wrong password for user 'alice'" in caplog.text and "unknown user 'mallory'" in caplog.text
    with pytest.raises(AuthenticationFailed, match="anonymous logins are not allowed"):
        await auth.login(None, None, "h4")
    assert router.management.resolve("/sys$authentication/usage").properties() == {
        "logins": 1,
        "refused-logins": 4,
        "access-denials": 0,
    }
    router.request_stop()


async def test_host_access_lists(start):
    router, auth = await start()
    assert (await auth.login("bob", "hunter2", "10.0.0.7")).user == "bob"
    assert (await auth.login("bob", "hunter2", "localhost")).user == "bob"
    with pytest.raises(AuthenticationFailed, match="host 10.1.0.7 is not allowed for user bob") as caught:
        await auth.login("bob", "hunter2", "10.1.0.7")
    assert caught.value.reason == "host not allowed"
    router.request_stop()


async def test_queue_grants_exact_name_first_then_predicates(start):
    router, auth = await start()
    alice = await auth.login("alice", "secret", "h")
    for queue, action in [
        ("orders", "send"),
        ("orders", "browse"),
        ("orders-eu", "receive"),
        ("orders-audit", "browse"),
        ("orders@r1", "receive"),
    ]:
        alice.check_queue(queue, action)  # granted
    for queue, action, message in [
        ("orders-eu", "browse", "user alice may not browse on queue 'orders-eu'"),
        ("orders-$x", "send", "a system name"),  # '$' names need a grant naming them: orders-% does not
        ("orders-audit", "send", "may not send on queue 'orders-audit'"),  # the exact grant wins
        ("payroll", "receive", "may not receive on queue 'payroll'"),  # no grant at all
    ]:
        with pytest.raises(AccessDenied, match=message):
            alice.check_queue(queue, action)
    with pytest.raises(ValueError, match="unknown queue action"):
        alice.check_queue("orders", "delete")
    router.request_stop()


async def test_topic_grants_and_anonymous(start):
    router, auth = await start(anonymous=True)
    alice = await auth.login("alice", "secret", "h")
    alice.check_topic("prices.eu", "subscribe")
    alice.check_topic("prices.eu", "durable")
    with pytest.raises(AccessDenied, match="may not publish on topic 'prices.eu'"):
        alice.check_topic("prices.eu", "publish")
    with pytest.raises(AccessDenied, match="may not subscribe on topic 'news'"):
        alice.check_topic("news", "subscribe")
    guest = await auth.login(None, None, "h")
    assert (guest.user, guest.group) == ("anonymous", "public")
    guest.check_topic("news", "publish")
    guest.check_queue("public-board", "send")
    with pytest.raises(AccessDenied, match="may not durable on topic 'news'"):
        guest.check_topic("news", "durable")
    with pytest.raises(AccessDenied, match="may not receive on queue 'public-board'"):
        guest.check_queue("public-board", "receive")
    router.request_stop()


async def test_disabled_grants_everything_but_still_checks_hosts(start):
    router, auth = await start(enabled=False)
    anyone = await auth.login("whoever", "whatever", "h")
    anyone.check_queue("payroll", "receive")
    anyone.check_topic("anything", "durable")
    assert (await auth.login(None, None, "h")).user == "anonymous"
    with pytest.raises(AuthenticationFailed, match="host 192.168.1.1 is not allowed for user bob"):
        await auth.login("bob", "", "192.168.1.1")
    router.request_stop()


async def test_changes_apply_at_once(start):
    router, auth = await start()
    tree = router.management
    tree.add("/sys$authentication/users", "carol", {"password": "pw", "group": "traders"})
    assert (await auth.login("carol", "pw", "h")).group == "traders"
    tree.set("/sys$authentication/users/carol", "password", "new")
    with pytest.raises(AuthenticationFailed):
        await auth.login("carol", "pw", "h")
    assert (await auth.login("carol", "new", "h")).user == "carol"
    tree.set("/sys$authentication/groups/traders/topic-grants/prices.%", "publish-grant", "true")
    (await auth.login("alice", "secret", "h")).check_topic("prices.eu", "publish")
    tree.set("/sys$authentication", "authentication-enabled", "false")
    (await auth.login("nobody", None, "h")).check_queue("payroll", "send")
    await trio.sleep(0)
    router.request_stop()
