"""Setting ``switch_source`` read as docs/design.md says, and what each reading of the key
does to the switch (SwitchFollower: no I/O, so no service here)."""

from __future__ import annotations

import logging

import pytest

from gateway_limiter.config.settings import Settings, SettingsError, load_settings
from gateway_limiter.config.switch_source import (
    BadSwitchValue,
    Reading,
    SwitchFollower,
    parse_switch_source,
    switch_value,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(v, True) for v in ("on", "ON", " true ", "1", "Y", "y", "True")]
    + [(v, False) for v in ("off", "Off", "false", "0", "N", "n", "FALSE")],
)
def test_the_values_read_as_on_or_off(text: str, expected: bool) -> None:
    assert switch_value(text) is expected


@pytest.mark.parametrize("text", ["", "yes please", "2", "enabled", "o n"])
def test_anything_else_is_a_bad_value(text: str) -> None:
    with pytest.raises(BadSwitchValue):
        switch_value(text)


def test_etcd_urls_several_hosts_credentials_and_tls() -> None:
    s = parse_switch_source("etcd://gw:p%40ss@10.0.0.1:2379,10.0.0.2,[::1]:2380/gw/switch")
    assert (s.kind, s.key, s.user, s.password) == ("etcd", "gw/switch", "gw", "p@ss")
    assert s.bases() == ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://[::1]:2380"]
    assert s.shown == "etcd://gw:***@10.0.0.1:2379,10.0.0.2,[::1]:2380/gw/switch"
    tls = parse_switch_source("etcds://h:2379//gw/switch?ssl_ca_certs=/ca.pem&ssl_certfile=/c")
    assert (tls.tls, tls.key, tls.ssl_ca_certs, tls.ssl_certfile) == (
        True,
        "/gw/switch",
        "/ca.pem",
        "/c",
    )
    assert tls.bases() == ["https://h:2379"]


def test_apollo_urls() -> None:
    s = parse_switch_source("apollo://cfg:8080/gateway/application?key=limiter.switch")
    assert (s.kind, s.app_id, s.namespace, s.key, s.cluster) == (
        "apollo",
        "gateway",
        "application",
        "limiter.switch",
        "default",
    )
    assert parse_switch_source("apollo://cfg/app/ns?key=k&cluster=sh").cluster == "sh"
    assert parse_switch_source("apollo://cfg/app/ns?key=k").bases() == ["http://cfg:8080"]
    assert parse_switch_source("TABLE").kind == "table"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("zookeeper://h/k", "must be table"),
        ("etcd://h:2379", "names no key"),
        ("etcd://h:2379/", "names no key"),
        ("etcd://h:x/k", "is not a port"),
        ("etcd://h/k?ssl_ca_certs=/ca", "need the etcds:// scheme"),
        ("etcd://h/k?timeout=3", "unknown option 'timeout'"),
        ("apollo://h/app?key=k", "must name an app and a namespace"),
        ("apollo://h/app/ns", "names no key"),
        ("apollo://u:p@h/app/ns?key=k", "takes no user:password"),
    ],
)
def test_bad_sources_are_refused_at_start_naming_the_setting(text: str, why: str) -> None:
    with pytest.raises(SettingsError, match="setting switch_source=") as e:
        Settings(switch_source=text)
    assert why in str(e.value)


def test_a_password_never_shows_in_an_error_or_the_settings() -> None:
    with pytest.raises(SettingsError) as e:
        load_settings(environ={"GATEWAY_LIMITER_SWITCH_SOURCE": "etcd://u:hunter2@h:1/"})
    assert "hunter2" not in str(e.value)
    settings = Settings(switch_source="etcd://u:hunter2@h/k")
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.masked())


def test_what_each_reading_does(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway_limiter")
    changes: list[tuple[bool, str]] = []
    follower = SwitchFollower(
        parse_switch_source("etcd://h/k"), False, lambda on, origin, _: changes.append((on, origin))
    )
    assert (follower.enabled, follower.origin) == (False, "settings")
    follower.lost(OSError("refused"))
    follower.lost(OSError("refused"))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "never reached" in errors[0]
    follower.seen(Reading("on", "5"))
    assert changes == [(True, "etcd")]
    follower.seen(Reading("garbage", "6"))
    follower.seen(Reading("garbage", "7"))
    bad = [r.getMessage() for r in caplog.records if "'garbage'" in r.getMessage()]
    assert len(bad) == 1 and "keeping the switch on" in bad[0]  # warned once per value
    assert follower.enabled is True
    follower.seen(Reading(None, "8"))
    assert changes[-1] == (False, "settings")  # no key: the setting
    follower.seen(Reading("on", "9"))
    follower.lost(OSError("gone"))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "keeping the last good state: switch on" in errors[1]
    assert follower.enabled is True


def test_a_configuration_centre_without_its_extra_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "httpx" else real(name, *a)
    )
    with pytest.raises(SettingsError, match=r"needs httpx: pip install 'gateway-limiter\[etcd\]'"):
        Settings(switch_source="etcd://u:secret@h/k")
    assert Settings().switch_source == "table"  # the table needs nothing more
