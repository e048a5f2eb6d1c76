"""The published swiftlet interfaces match the running objects: every member each ``api``
protocol declares exists on the object a caller gets, with the same parameters, and async
where the protocol says async. A change to one side without the other fails here."""

from __future__ import annotations

import inspect

import pytest

from martinet.messaging.message import build
from martinet.swiftlets.authentication import api as authentication_api
from martinet.swiftlets.queuemanager import api as queue_api
from martinet.swiftlets.store import api as store_api
from martinet.swiftlets.topicmanager import api as topic_api

from tests.harness.routers import RunningRouter

API_ROUTER = """
<router name="r1" startorder="sys$store sys$authentication sys$queuemanager sys$topicmanager"
        shutdown-timeout="5000">
  <swiftlet name="sys$store" path="{store}" sync="normal"/>
</router>
"""


def declared(protocol: type) -> dict[str, object]:
    """The public members a protocol declares (through its bases): name → the declared object
    (a function, a property) or None for an annotated attribute."""
    members: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass.__module__ in ("builtins", "typing"):
            continue
        for name in getattr(klass, "__annotations__", {}):
            members.setdefault(name, None)
        members.update(vars(klass))
    return {name: value for name, value in members.items() if not name.startswith("_")}


def mismatches(obj: object, protocol: type) -> list[str]:
    problems = []
    for name, member in declared(protocol).items():
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
            continue
        if not inspect.isfunction(member):
            continue  # a property or an attribute: being there is enough
        # a method of the object's class, or a part's method the object holds as it is (a
        # façade binds those once, so that a call goes to the part with no layer between)
        actual = getattr(type(obj), name, None)
        if inspect.isfunction(actual):
            parameters = list(inspect.signature(actual).parameters.values())[1:]  # (without self)
        elif inspect.ismethod(actual := getattr(obj, name)):
            parameters = list(inspect.signature(actual).parameters.values())  # (self is bound)
        else:
            problems.append(f"{name}: not a method")
            continue
        want = [(p.name, p.kind, p.default) for p in list(inspect.signature(member).parameters.values())[1:]]
        got = [(p.name, p.kind, p.default) for p in parameters]
        if want != got:
            problems.append(f"{name}: parameters {got} instead of {want}")
        if inspect.iscoroutinefunction(member) != inspect.iscoroutinefunction(actual):
            problems.append(f"{name}: {'not ' if inspect.iscoroutinefunction(member) else ''}async")
    return problems


@pytest.fixture
async def running(nursery, tmp_path):
    router = RunningRouter(nursery, tmp_path)
    router.path.write_text(API_ROUTER.format(store=tmp_path / "store"))
    await router.start()
    yield router
    await router.stop()


async def test_every_interface_matches_its_implementation(running):
    swiftlet = running.router.swiftlet
    queue_manager = swiftlet("sys$queuemanager")
    await queue_manager.send("conformance", build(b"x"))
    queue = queue_manager.queue("conformance")
    consumer = queue.consumer()
    consumer.flow(1)
    entry = consumer.receive_nowait()
    topic_manager = swiftlet("sys$topicmanager")
    authentication = swiftlet("sys$authentication")
    cases = [
        (swiftlet("sys$store"), store_api.Store),
        (queue_manager, queue_api.QueueManager),
        (queue, queue_api.Queue),
        (consumer, queue_api.Consumer),
        (entry, queue_api.Entry),
        (queue_manager.transaction(), queue_api.Transaction),
        (topic_manager, topic_api.TopicManager),
        (topic_manager.subscribe("conformance.x"), topic_api.Subscription),
        (authentication, authentication_api.Authentication),
        (await authentication.login(None, None, "127.0.0.1"), authentication_api.Principal),
    ]
    found = {
        f"{type(obj).__name__} as {protocol.__module__}.{protocol.__name__}": problems
        for obj, protocol in cases
        if (problems := mismatches(obj, protocol))
    }
    assert found == {}
    for obj, protocol in cases:
        if getattr(protocol, "_is_runtime_protocol", False):
            assert isinstance(obj, protocol)


def test_the_comparison_notices_a_difference():
    class Wrong:
        def queue(self, address):  # no keyword-only create
            pass

        def send(self, address, message, *, possible_duplicate=False):  # not async
            pass

    problems = mismatches(Wrong(), queue_api.QueueManager)
    assert any(p.startswith("queue: parameters [") for p in problems)  # create= is missing
    assert "send: not async" in problems
    assert "transaction: missing" in problems
