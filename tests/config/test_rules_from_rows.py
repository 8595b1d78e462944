"""Rows become rules in one place: bad rows skipped with their configId, duplicates resolved,
each URL's limits (periods, per caller) gathered into one Rule."""

from __future__ import annotations

import dataclasses

import pytest

from gateway_limiter.config.rules import MAX_PERIOD, Rule, build_rules
from gateway_limiter.config.table import ConfRow


def row(
    config_id: int,
    url: str | None = "/a",
    rate: int | None = 10,
    cache: float | None = 0.3,
    status: int | None = 1,
    *,
    period: int | None = None,
    per_caller: int | None = None,
    algorithm: str | None = None,
    warmup: float | None = None,
    max_permits: int | None = None,
) -> ConfRow:
    return ConfRow(
        config_id,
        "IBE+",
        "N1",
        url,
        rate,
        cache,
        status,
        algorithm=algorithm,
        max_permits=max_permits,
        warmup_period=warmup,
        period_seconds=period,
        per_caller=per_caller,
    )


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


def test_rows_of_one_url_with_different_periods_all_apply_as_one_rule() -> None:
    rows = [row(1, rate=200, cache=0.8, period=60), row(2, rate=5, cache=0.2), row(3, url="/b")]
    ruleset = build_rules(rows, 0.5)
    assert ruleset.skipped == ()
    rule = ruleset.rules["/a"]
    assert [(r.config_id, r.rate, r.period) for r in rule.limits] == [(2, 5, 1), (1, 200, 60)]
    assert rule.cache == 0.2  # the interface's wait budget: the smallest cache of its rows
    assert rule.per_second == 5.0 and rule.also[0].per_second == pytest.approx(200 / 60)
    assert ruleset.rules["/b"].also == ()


def test_a_shared_and_a_per_caller_limit_of_the_same_period_both_apply() -> None:
    rule = build_rules([row(1, rate=10, per_caller=1), row(2, rate=100)], 0.5).rules["/a"]
    assert [(r.config_id, r.per_caller) for r in rule.limits] == [(2, False), (1, True)]
    assert rule.keyed


def test_same_url_same_period_and_scope_the_stricter_row_wins_and_the_period_is_named() -> None:
    ruleset = build_rules([row(1, rate=300, period=60), row(2, rate=200, period=60)], 0.5)
    assert [r.config_id for r in ruleset.rules["/a"].limits] == [2]
    (skip,) = ruleset.skipped
    assert skip.config_id == 1
    assert "(per 60 s)" in skip.reason and "configId 2" in skip.reason


def test_one_closed_limit_closes_the_whole_interface() -> None:
    rule = build_rules([row(1, rate=5), row(2, rate=0, period=60)], 0.5).rules["/a"]
    assert rule.closed
    assert len(rule.limits) == 2


@pytest.mark.parametrize("period", [0, -1, MAX_PERIOD + 1])
def test_a_period_out_of_range_is_skipped_naming_the_column(period: int) -> None:
    ruleset = build_rules([row(1, period=period), row(2, url="/ok")], 0.5)
    assert list(ruleset.rules) == ["/ok"]
    (skip,) = ruleset.skipped
    assert skip.config_id == 1
    assert f"periodSeconds {period} is not a whole number from 1 to {MAX_PERIOD}" in skip.reason


def test_null_period_and_per_caller_read_as_per_second_and_shared() -> None:
    rule = build_rules([row(1)], 0.5).rules["/a"]
    assert (rule.period, rule.per_caller) == (1, False)
    assert rule == Rule("/a", 10, 0.3, 1)


def test_per_caller_other_than_0_or_1_is_skipped() -> None:
    (skip,) = build_rules([row(1, per_caller=2)], 0.5).skipped
    assert skip.reason == "perCaller 2 is not 0 or 1"


def test_fixed_window_is_an_algorithm_with_any_period_and_no_max_permits() -> None:
    rules = build_rules([row(1, algorithm="fixed_window", period=3600, per_caller=1)], 0.5).rules
    assert (rules["/a"].algorithm, rules["/a"].period) == ("fixed_window", 3600)
    (skip,) = build_rules([row(1, algorithm="fixed_window", max_permits=5)], 0.5).skipped
    assert "maxPermits 5 is invalid for fixed_window" in skip.reason


@pytest.mark.parametrize(
    ("period", "per_caller", "reason"),
    [
        (60, 0, "warm_up paces per second: periodSeconds must be 1, got 60"),
        (1, 1, "warm_up warms the supplier as a whole: it cannot be perCaller"),
    ],
)
def test_warm_up_is_per_second_and_shared_only(period: int, per_caller: int, reason: str) -> None:
    warm = row(1, algorithm="warm_up", warmup=2.0, period=period, per_caller=per_caller)
    (skip,) = build_rules([warm], 0.5).skipped
    assert skip.reason == reason


def test_warm_up_beside_other_limits_of_its_url_is_skipped_and_the_others_apply() -> None:
    rows = [row(1, algorithm="warm_up", warmup=2.0), row(2, rate=100, period=60)]
    ruleset = build_rules(rows, 0.5)
    assert [r.config_id for r in ruleset.rules["/a"].limits] == [2]
    (skip,) = ruleset.skipped
    assert skip.config_id == 1
    assert "warm_up cannot be combined with other limits of '/a' (configId 2 apply)" in (
        skip.reason
    )


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
    assert [str(s) for s in ruleset.skipped] == [
        "configId 4: shadow 2 is not 0 or 1 (interfaceUrl '/d')"
    ]


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


def test_a_shadow_row_beside_enforced_limits_of_other_periods_is_skipped() -> None:
    rows = [row(1, rate=5), dataclasses.replace(row(2, rate=100, period=60), shadow=1)]
    ruleset = build_rules(rows, 0.5)
    rule = ruleset.rules["/a"]
    assert [r.config_id for r in rule.limits] == [1] and not rule.shadow
    (skip,) = ruleset.skipped
    assert skip.config_id == 2
    assert "shadow row beside enforced limits of '/a' (configId 1 apply)" in skip.reason


def test_an_interface_whose_limits_are_all_shadow_is_on_trial_as_a_whole() -> None:
    rows = [
        dataclasses.replace(row(1, rate=5), shadow=1),
        dataclasses.replace(row(2, rate=100, period=60), shadow=1),
    ]
    ruleset = build_rules(rows, 0.5)
    rule = ruleset.rules["/a"]
    assert ruleset.skipped == ()
    assert [r.config_id for r in rule.limits] == [1, 2] and rule.shadow


@pytest.mark.parametrize("url", ["/bad\nx", "/tab\there", "/nul\x00", "/sep\u2028x"])
def test_a_url_with_a_control_character_is_skipped_naming_it(url: str) -> None:
    rules = build_rules([row(7, url), row(8, "/good")], 0.5)
    assert list(rules.rules) == ["/good"]
    [skipped] = rules.skipped
    assert skipped.config_id == 7
    bad = next(c for c in url if not c.isprintable())
    assert f"control character {bad!r}" in skipped.reason
