"""Rows become rules in one place: bad rows skipped with their configId, duplicates resolved."""

from __future__ import annotations

import dataclasses

from gateway_limiter.rules import Rule, build_rules
from gateway_limiter.table import ConfRow


def row(
    config_id: int,
    url: str | None = "/a",
    rate: int | None = 10,
    cache: float | None = 0.3,
    status: int | None = 1,
) -> ConfRow:
    return ConfRow(config_id, "IBE+", "N1", url, rate, cache, status)


def test_enabled_row_becomes_a_rule_and_disabled_row_is_not_limited() -> None:
    ruleset = build_rules([row(1), row(2, url="/b", status=0)], default_cache=0.5)
    assert dict(ruleset.rules) == {"/a": Rule("/a", 10, 0.3, 1)}
    assert ruleset.skipped == ()


def test_null_cache_takes_the_default_and_float_noise_is_rounded() -> None:
    ruleset = build_rules([row(1, cache=None), row(2, url="/b", cache=0.30000001192092896)], 0.5)
    assert ruleset.rules["/a"].cache == 0.5
    assert ruleset.rules["/b"].cache == 0.3


def test_rate_zero_enabled_is_a_closed_rule() -> None:
    assert build_rules([row(1, rate=0)], 0.5).rules["/a"].closed


def test_invalid_rows_are_skipped_with_their_config_id_and_the_rest_apply() -> None:
    rows = [
        row(1, rate=None),
        row(2, rate=-1),
        row(3, cache=-0.5),
        row(4, url=""),
        row(5, url=None),
        row(6, status=2),
        row(7, url="/" + "x" * 200),
        row(8, url="/ok"),
    ]
    ruleset = build_rules(rows, 0.5)
    assert list(ruleset.rules) == ["/ok"]
    reasons = {s.config_id: s.reason for s in ruleset.skipped}
    assert set(reasons) == {1, 2, 3, 4, 5, 6, 7}
    assert "rateLimit is NULL" in reasons[1]
    assert "negative" in reasons[2]
    assert "cache" in reasons[3]
    assert "empty" in reasons[4] and "empty" in reasons[5]
    assert "status 2" in reasons[6]
    assert "longer than 128" in reasons[7]
    assert str(ruleset.skipped[0]).startswith("configId 1:")


def test_duplicate_enabled_urls_the_stricter_row_wins_whatever_the_order() -> None:
    for rows in ([row(1, rate=50), row(2, rate=20)], [row(2, rate=20), row(1, rate=50)]):
        ruleset = build_rules(rows, 0.5)
        assert ruleset.rules["/a"].config_id == 2
        (skip,) = ruleset.skipped
        assert skip.config_id == 1 and "configId 2" in skip.reason
    tie = build_rules([row(7, rate=20), row(3, rate=20)], 0.5)
    assert tie.rules["/a"].config_id == 3  # on a tie, the lower configId


def test_shadow_rows_become_shadow_rules_and_bad_shadow_values_are_skipped() -> None:
    rows = [
        dataclasses.replace(row(1), shadow=1),
        dataclasses.replace(row(2, url="/b"), shadow=0),
        dataclasses.replace(row(3, url="/c"), shadow=None),  # a schema before revision 0005
        dataclasses.replace(row(4, url="/d"), shadow=2),
    ]
    ruleset = build_rules(rows, 0.5)
    shadows = {u: r.shadow for u, r in ruleset.rules.items()}
    assert shadows == {"/a": True, "/b": False, "/c": False}
    assert [str(s) for s in ruleset.skipped] == ["configId 4: shadow 2 is not 0 or 1"]


def test_an_enforced_row_beats_a_stricter_shadow_row() -> None:
    strict_shadow = dataclasses.replace(row(1, rate=2), shadow=1)
    ruleset = build_rules([strict_shadow, row(2, rate=50)], 0.5)
    assert (ruleset.rules["/a"].rate, ruleset.rules["/a"].shadow) == (50, False)
    reason = ruleset.skipped[0].reason
    assert "configId 2 (rateLimit 50) is enforced (this one is shadow)" in reason
    both_shadow = [
        dataclasses.replace(row(1, rate=2), shadow=1),
        dataclasses.replace(row(2), shadow=1),
    ]
    assert build_rules(both_shadow, 0.5).rules["/a"].rate == 2  # same mode: stricter wins


def test_urls_with_only_disabled_rows_are_remembered_as_disabled() -> None:
    rows = [row(1, url="/off", status=0), row(2, url="/on"), row(3, url="/on", status=0)]
    ruleset = build_rules(rows, 0.5)
    assert ruleset.disabled == frozenset({"/off"})  # /on has an enabled row: it is a rule
