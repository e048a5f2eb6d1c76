"""The rules of the topic federation without routers (swiftlets/topicmanager/federation.py):
interest records, remote subscriptions, the durability countdown."""

from __future__ import annotations

import json

import pytest

from martinet.messaging.message import build
from martinet.swiftlets.topicmanager.api import TopicError
from martinet.swiftlets.topicmanager.federation import AllDurable, InterestRecord, RemoteSubscriptions, federable


def record(router: str, epoch: int, seq: int, *roots: str) -> InterestRecord:
    return InterestRecord(router, epoch, seq, frozenset(roots))


def state(subscriptions: RemoteSubscriptions) -> dict[str, dict[str, tuple[bool, bool, bool]]]:
    return {
        router: {root: (s.static, s.keep, s.announced) for root, s in subs.items()}
        for router, subs in subscriptions.routers.items()
    }


def test_a_record_survives_encoding_and_says_its_version():
    original = record("paris", 17, 3, "iit", "news")
    message = original.encode()
    assert json.loads(message.body())["version"] == 1
    assert InterestRecord.decode(message) == original
    asking = InterestRecord("paris", 17, 4, frozenset(), reply=True)
    assert InterestRecord.decode(asking.encode()) == asking


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"version": 2, "router": "a", "epoch": 1, "seq": 1, "roots": []}', "version 2, this router reads 1"),
        (b'{"version": 1, "router": "a", "epoch": 1, "seq": 1, "roots": "iit"}', "roots must be a list of strings"),
        (b'{"version": 1, "router": "a", "epoch": "1", "seq": 1, "roots": []}', "epoch and seq integers"),
        (b'{"version": 1, "router": "a", "roots": []}', "KeyError"),
        (b'{"version": 1, "router": "a", "epoch": 1, "seq": 1, "roots": [], "reply": 1}', "reply must be a boolean"),
        (b"not json", "JSONDecodeError"),
    ],
)
def test_a_record_this_version_cannot_read_is_refused_with_the_reason(body, error):
    with pytest.raises(ValueError, match=error):
        InterestRecord.decode(build(body))


def test_the_newest_record_of_a_router_is_its_whole_interest():
    subscriptions = RemoteSubscriptions("local")
    assert subscriptions.apply(record("b", 5, 1, "iit", "news"))
    assert {s.router for s in subscriptions.of_root("iit")} == {"b"}
    assert subscriptions.apply(record("b", 5, 3, "news"))
    assert not subscriptions.apply(record("b", 5, 2, "iit"))  # overtaken on another path: ignored
    assert state(subscriptions) == {"b": {"news": (False, False, True)}}
    assert subscriptions.of_root("iit") == ()
    assert subscriptions.apply(record("b", 6, 1, "iit"))  # b restarted: a new epoch, seq from 1
    assert state(subscriptions) == {"b": {"iit": (False, False, True)}}
    assert subscriptions.apply(record("b", 6, 2))
    assert state(subscriptions) == {}
    assert not subscriptions.apply(record("local", 9, 9, "iit"))  # never subscribe to ourselves


def test_static_subscriptions_end_with_the_first_record_unless_kept():
    subscriptions = RemoteSubscriptions("local")
    subscriptions.add_static("b", "iit", keep=False)
    subscriptions.add_static("b", "news", keep=True)
    assert {s.router for s in subscriptions.of_root("iit")} == {"b"}
    assert not subscriptions.heard_from("b")
    subscriptions.apply(record("b", 1, 1, "sport"))
    assert subscriptions.heard_from("b")
    assert state(subscriptions) == {"b": {"news": (True, True, False), "sport": (False, False, True)}}
    subscriptions.apply(record("b", 1, 2, "news"))
    assert state(subscriptions)["b"]["news"] == (True, True, True)
    subscriptions.remove_static("b", "news")  # announced: it stays, now dynamic
    assert state(subscriptions)["b"]["news"] == (False, False, True)
    subscriptions.apply(record("b", 1, 3))
    assert state(subscriptions) == {}


def test_delete_by_the_operator():
    subscriptions = RemoteSubscriptions("local")
    subscriptions.apply(record("b", 1, 1, "iit", "news"))
    subscriptions.delete("b", "iit")
    assert state(subscriptions) == {"b": {"news": (False, False, True)}}
    with pytest.raises(TopicError, match="no remote router subscription b/iit"):
        subscriptions.delete("b", "iit")
    subscriptions.delete("b")
    assert state(subscriptions) == {}
    with pytest.raises(TopicError, match=r"no remote router subscription b/\*"):
        subscriptions.delete("b")
    subscriptions.apply(record("b", 1, 2, "iit"))  # the router's next record brings it back
    assert state(subscriptions) == {"b": {"iit": (False, False, True)}}


def test_the_publisher_hears_once_when_every_copy_is_durable():
    heard: list[BaseException | None] = []
    countdown = AllDurable(heard.append)
    local, remote = countdown.add(), countdown.add()
    local(None)
    countdown.one()  # the caller's own copy: everything is sent
    assert heard == []
    failure = OSError("disk full")
    remote(failure)
    assert heard == [failure]


def test_only_roots_that_make_a_queue_name_are_federated():
    assert federable("iit") and federable("tmp$topic$a$1")
    assert not federable("a b") and not federable("x@y") and not federable("a/b")
