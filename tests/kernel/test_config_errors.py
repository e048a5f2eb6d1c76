"""Bad configs: every kind of mistake gives a precise message with file:line (DESIGN §2.1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from martinet.kernel import ConfigErrors, load_config

R = '<router name="r1" startorder="test$a">'

# (id, xml, expected line, expected attribute (or None), a substring of the message)
CASES = [
    (
        "wrong-type-int",
        f'{R}\n<swiftlet name="test$a" cleanup-ms="soon"/></router>',
        2,
        "cleanup-ms",
        "expected an integer, found 'soon'",
    ),
    (
        "wrong-type-float-for-int",
        f'{R}\n<swiftlet name="test$a" cleanup-ms="1.5"/></router>',
        2,
        "cleanup-ms",
        "expected an integer, found '1.5'",
    ),
    (
        "wrong-type-bool",
        '<router name="r1" startorder="sys$log">\n<swiftlet name="sys$log" logfile-max-size="true"/></router>',
        2,
        "logfile-max-size",
        "expected an integer",
    ),
    (
        "below-min",
        f'{R}\n<swiftlet name="test$a" cleanup-ms="-1"/></router>',
        2,
        "cleanup-ms",
        "expected a value between 0 and 600000, found -1",
    ),
    (
        "above-max",
        f'{R}\n<swiftlet name="test$a" cleanup-ms="600001"/></router>',
        2,
        "cleanup-ms",
        "between 0 and 600000, found 600001",
    ),
    (
        "bad-choice",
        f'{R}\n<swiftlet name="test$a" fail="sometimes"/></router>',
        2,
        "fail",
        "expected one of 'never', 'start', 'run', 'return', found 'sometimes'",
    ),
    (
        "unknown-attribute",
        f'{R}\n<swiftlet name="test$a" clenup-ms="1"/></router>',
        2,
        "clenup-ms",
        "unknown attribute; did you mean 'cleanup-ms'?",
    ),
    ("unknown-root-attribute", '<router name="r1" colour="blue"/>', 1, "colour", "unknown attribute"),
    (
        "unknown-element",
        f'{R}\n<swiftlet name="test$a"/>\n<listeners/></router>',
        3,
        None,
        "unknown element <listeners>",
    ),
    (
        "unknown-element-in-swiftlet",
        f'{R}\n<swiftlet name="test$a">\n  <queues/>\n</swiftlet></router>',
        3,
        None,
        "unknown element <queues>",
    ),
    ("missing-mandatory", '<router startorder="">\n</router>', 1, "name", "missing mandatory attribute"),
    ("invalid-router-name", '<router name="paris@eu"/>', 1, "name", "invalid router name 'paris@eu'"),
    (
        "unknown-swiftlet-in-startorder",
        '<router name="r1" startorder="sys$nope"/>',
        1,
        "startorder",
        "unknown swiftlet 'sys$nope'; installed: sys$log, test$a",
    ),
    (
        "unknown-swiftlet-element",
        '<router name="r1">\n<swiftlet name="sys$queuemanager"/></router>',
        2,
        "name",
        "unknown swiftlet 'sys$queuemanager'; installed:",
    ),
    (
        "swiftlet-without-name",
        '<router name="r1">\n<swiftlet/></router>',
        2,
        None,
        "<swiftlet> needs a 'name' attribute",
    ),
    (
        "swiftlet-twice",
        f'{R}\n<swiftlet name="test$a"/>\n<swiftlet name="test$a"/></router>',
        3,
        None,
        "swiftlet 'test$a' is configured twice (first at line 2)",
    ),
    (
        "startorder-twice",
        '<router name="r1" startorder="test$a test$a"/>',
        1,
        "startorder",
        "swiftlet 'test$a' is listed twice",
    ),
    (
        "duplicate-entity-name",
        f'{R}\n<swiftlet name="test$a"><pools>\n<pool name="a.serial"/>\n'
        '<pool name="a.serial"/></pools></swiftlet></router>',
        4,
        None,
        "duplicate pool name 'a.serial' (first defined at line 3)",
    ),
    (
        "entity-without-name",
        f'{R}\n<swiftlet name="test$a"><pools>\n<pool max-concurrency="2"/></pools></swiftlet></router>',
        3,
        None,
        "<pool> needs a non-empty 'name' attribute",
    ),
    (
        "foreign-item-in-list",
        f'{R}\n<swiftlet name="test$a"><pools>\n<thread name="x"/></pools></swiftlet></router>',
        3,
        None,
        "unknown element <thread>; expected <pool>",
    ),
    (
        "unknown-pool",
        f'{R}\n<swiftlet name="test$a"><pools>\n<pool name="a.nope"/></pools></swiftlet></router>',
        3,
        "name",
        "swiftlet test$a has no pool 'a.nope'; its pools: a.serial, a.wide",
    ),
    (
        "bad-value-in-list-item",
        f'{R}\n<swiftlet name="test$a"><pools>\n<pool name="a.wide" max-concurrency="0"/></pools></swiftlet></router>',
        3,
        "max-concurrency",
        "expected a value between 1 and 100000, found 0",
    ),
    (
        "unknown-attribute-in-list-item",
        f'{R}\n<swiftlet name="test$a"><pools>\n<pool name="a.wide" max-threads="2"/></pools></swiftlet></router>',
        3,
        "max-threads",
        "unknown attribute",
    ),
    (
        "pools-twice",
        f'{R}\n<swiftlet name="test$a"><pools/>\n<pools/></swiftlet></router>',
        3,
        None,
        "<pools> may appear only once here",
    ),
    ("stray-text", f'{R}\n<swiftlet name="test$a">hello</swiftlet></router>', 2, None, "unexpected text 'hello'"),
    ("malformed-xml", '<router name="r1">\n<swiftlet name="test$a">\n</router>', 3, None, "malformed XML"),
    ("wrong-root", '<routers name="r1"/>', 1, None, "the root element must be <router>"),
]


@pytest.mark.parametrize(
    ("xml", "line", "attribute", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_config_is_reported_precisely(write_config, probe_specs, xml, line, attribute, message):
    specs = {name: spec for name, spec in probe_specs.items() if name in ("sys$log", "test$a")}
    path = write_config(xml)
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, specs)
    errors = caught.value.errors
    assert len(errors) == 1, str(caught.value)
    error = errors[0]
    assert (error.file, error.line, error.attribute) == (str(path), line, attribute)
    assert message in error.message
    assert str(error).startswith(f"{path}:{line}: /")


def test_error_names_the_element_path(write_config, probe_specs):
    path = write_config(
        '<router name="r1" startorder="test$a">\n<swiftlet name="test$a"><pools>\n'
        '<pool name="a.wide" queue-size="many"/></pools></swiftlet></router>'
    )
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, probe_specs)
    assert str(caught.value) == (
        f"{path}:3: /router[@name='r1']/swiftlet[@name='test$a']/pools/pool[@name='a.wide']:"
        " attribute 'queue-size': expected an integer, found 'many'"
    )


def test_every_error_is_reported_at_once(write_config, probe_specs):
    path = write_config(
        """
<router name="r1" startorder="test$a test$b sys$nope" shutdown-timeout="-1">
  <swiftlet name="test$a" fail="maybe" cleanup-ms="x"/>
  <swiftlet name="test$b">
    <pools><pool name="b.serial" max-concurrency="0"/><pool name="b.serial"/></pools>
  </swiftlet>
  <swiftlet name="test$z"/>
</router>"""
    )
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, probe_specs)
    found = [(e.line, e.attribute) for e in caught.value.errors]
    assert found == [
        (1, "shutdown-timeout"),
        (1, "startorder"),
        (2, "fail"),
        (2, "cleanup-ms"),
        (4, None),  # the duplicate pool, found while reading the structure
        (4, "max-concurrency"),
        (6, "name"),  # the unknown swiftlet
    ]


def test_external_entities_are_refused(write_config, probe_specs):
    """No external entities: the classic XXE file read is a parse error, not a read."""
    path = write_config(
        '<?xml version="1.0"?>\n<!DOCTYPE router [<!ENTITY secret SYSTEM "file:///etc/hostname">]>\n'
        '<router name="r1"><swiftlet name="test$a" note="&secret;"/></router>'
    )
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, probe_specs)
    assert "malformed XML: Attribute references external entity 'secret'" in str(caught.value)


def test_entity_expansion_bomb_is_refused(write_config, probe_specs):
    levels = ['<!ENTITY l0 "0123456789">'] + [f'<!ENTITY l{n} "{f"&l{n - 1};" * 10}">' for n in range(1, 8)]
    path = write_config(
        f'<?xml version="1.0"?>\n<!DOCTYPE router [{"".join(levels)}]>\n'
        '<router name="r1"><swiftlet name="test$a" note="&l7;"/></router>'
    )
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, probe_specs)
    assert "malformed XML" in str(caught.value)


def test_missing_file_is_an_os_error(tmp_path, probe_specs):
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nope.xml", probe_specs)


def test_check_command_prints_every_error_and_exits_2(write_config):
    path = write_config(
        '<router name="r1" startorder="sys$log">\n'
        '<swiftlet name="sys$log" level="LOUD" number-old-logfiles="-3"/></router>'
    )
    done = subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "check", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}:2: /router[@name='r1']/swiftlet[@name='sys$log']: attribute 'level':")
    assert lines[1].startswith(
        f"{path}:2: /router[@name='r1']/swiftlet[@name='sys$log']: attribute 'number-old-logfiles':"
    )


def test_check_command_accepts_the_default_config():
    from martinet.kernel.cli import default_config

    done = subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "check", str(default_config())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "OK: router router1, start order: sys$log sys$store sys$authentication sys$queuemanager sys$xa "
        "sys$topicmanager sys$jms"
    ) in done.stdout


STATIC_SUBSCRIPTIONS = """
<router name="a" startorder="sys$log sys$store sys$queuemanager sys$topicmanager{routing}">
  <swiftlet name="sys$topicmanager">
    <static-remote-router-subscriptions>
      <static-remote-router-subscription name="b">
        <static-topic-subscriptions>
          <static-topic-subscription name="iit" keep-on-unsubscribe="true"/>
        </static-topic-subscriptions>
      </static-remote-router-subscription>
      <static-remote-router-subscription name="c"/>
    </static-remote-router-subscriptions>
  </swiftlet>
  <swiftlet name="sys$routing">
    <static-routes>
      <static-route name="{route}"/>
    </static-routes>
  </swiftlet>
</router>
"""
TOPICMANAGER = "/router[@name='a']/swiftlet[@name='sys$topicmanager']/static-remote-router-subscriptions/"


def test_check_command_reports_a_static_remote_subscription_without_a_static_route(write_config):
    """A rule across swiftlets (SwiftletSpec.check): b has no static route, c has one."""
    path = write_config(STATIC_SUBSCRIPTIONS.format(routing=" sys$routing", route="c"))
    done = subprocess.run(
        [sys.executable, "-m", "martinet.kernel", "check", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().splitlines() == [
        f"{path}:4: {TOPICMANAGER}static-remote-router-subscription[@name='b']: a static remote subscription needs "
        """a static route to b: add <static-route name="b"/> to sys$routing's <static-routes>"""
    ]


def test_a_router_does_not_start_on_a_static_remote_subscription_without_routing(write_config):
    from martinet.kernel import Router

    path = write_config(STATIC_SUBSCRIPTIONS.format(routing="", route="b"))
    with pytest.raises(ConfigErrors) as caught:
        Router.from_file(path)
    assert [(e.line, e.path) for e in caught.value.errors] == [
        (4, f"{TOPICMANAGER}static-remote-router-subscription[@name='b']"),
        (9, f"{TOPICMANAGER}static-remote-router-subscription[@name='c']"),
    ]
    assert all(e.message.endswith("(sys$routing is not in the start order)") for e in caught.value.errors)


def test_static_remote_subscriptions_with_their_static_routes_pass(write_config):
    from martinet.kernel import Router

    path = write_config(
        STATIC_SUBSCRIPTIONS.format(routing=" sys$routing", route="b").replace(
            '<static-route name="b"/>', '<static-route name="b"/><static-route name="c"/>'
        )
    )
    assert set(
        Router.from_file(path).config.swiftlets["sys$topicmanager"].config.static_remote_router_subscriptions
    ) == {"b", "c"}
