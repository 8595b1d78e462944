"""The rate limit service's settings: defaults, the environment, and bad values named."""

from __future__ import annotations

from typing import Any

import pytest

from gateway_limiter.config.settings import SettingsError, load_settings
from gateway_limiter.rls.descriptors import BadRequest, Wanted, read_request


def test_defaults_and_the_environment() -> None:
    settings = load_settings(None, environ={})
    assert (settings.rls_interface_entry, settings.rls_caller_entry) == ("interface", "caller")
    assert settings.rls_domain_channel is False
    env = {
        "GATEWAY_LIMITER_RLS_INTERFACE_ENTRY": "path",
        "GATEWAY_LIMITER_RLS_CALLER_ENTRY": "remote_address",
        "GATEWAY_LIMITER_RLS_DOMAIN_CHANNEL": "yes",
    }
    settings = load_settings(None, environ=env)
    assert (settings.rls_interface_entry, settings.rls_caller_entry) == ("path", "remote_address")
    assert settings.rls_domain_channel is True
    # the mapping follows them
    wanted = read_request(
        settings, "d", [([("path", "/x"), ("remote_address", "10.0.0.1")], None)], 0
    )
    assert wanted == [Wanted("/x", "10.0.0.1", 1)]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"rls_interface_entry": ""}, "rls_interface_entry"),
        ({"rls_caller_entry": "a caller"}, "rls_caller_entry"),
        ({"rls_interface_entry": "x", "rls_caller_entry": "x"}, "must differ"),
    ],
)
def test_bad_values_are_named(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        load_settings(None, environ={}, **overrides)


def test_permits_and_entries() -> None:
    settings = load_settings(None, environ={})
    read = read_request(
        settings,
        "d",
        [
            ([("interface", "/a"), ("other", "ignored")], None),
            ([("interface", "/b"), ("caller", "c")], 0),  # 0: the request's
            ([("interface", "/c")], 7),
            ([("generic_key", "x")], None),  # no interface: limits nothing
        ],
        3,
    )
    assert read == [
        Wanted("/a", None, 3),
        Wanted("/b", "c", 3),
        Wanted("/c", None, 7),
        Wanted(None, None, 3),
    ]
    assert read_request(settings, "d", [([("interface", "/a")], None)], 0)[0].permits == 1
    with pytest.raises(BadRequest, match="entry 'interface' is given twice"):
        read_request(settings, "d", [([("interface", "/a"), ("interface", "/b")], None)], 0)
    with pytest.raises(BadRequest, match="descriptor 1: an entry has no key"):
        read_request(settings, "d", [([("", "/a")], None)], 0)
    with pytest.raises(BadRequest, match="descriptor 1: hits_addend 2147483648"):
        read_request(settings, "d", [([("interface", "/a")], 2**31)], 0)
    assert read_request(settings, "d", [([("interface", "/a")], 2**31 - 1)], 0)[0].permits == (
        2**31 - 1
    )
