"""What rows with ``interfaceUrl`` ``*`` (channel caps) and ``callerKey`` (named callers)
turn into (``config/rules.py``): which limits each interface and each caller gets, and
which rows are left out, with a reason naming them."""

from __future__ import annotations

from typing import Any

from gateway_limiter.config.rules import CHANNEL_URL, RuleSet, build_rules
from gateway_limiter.config.table import ConfRow


def row(config_id: int, url: str, rate: int, **columns: Any) -> ConfRow:
    fields: dict[str, Any] = {"channel_type": None, "interface_no": None, "cache": 0.5}
    fields |= {"status": 1} | columns
    return ConfRow(config_id=config_id, interface_url=url, rate_limit=rate, **fields)


def rules(*rows: ConfRow) -> RuleSet:
    return build_rules(rows, 0.5)


def reasons(ruleset: RuleSet) -> dict[int, str]:
    return {s.config_id: s.reason for s in ruleset.skipped}


def test_a_channel_row_joins_every_interface_of_its_channel_last() -> None:
    got = rules(
        row(1, "/a", 25, channel_type="IBE+"),
        row(2, "/b", 25, channel_type="IBE+", period_seconds=60),
        row(3, CHANNEL_URL, 30, channel_type="IBE+", cache=0.2),
        row(4, "/other", 5, channel_type="1A"),
        row(5, "/none", 5),
    )
    assert CHANNEL_URL not in got.rules  # not an interface called "*"
    a, b = got.rules["/a"], got.rules["/b"]
    assert [(r.url, r.rate, r.config_id) for r in a.limits] == [("/a", 25, 1), ("*", 30, 3)]
    assert [(r.url, r.config_id) for r in b.limits] == [("/b", 2), ("*", 3)]
    assert {r.channel for r in (*a.limits, *b.limits)} == {"IBE+"}  # one hash tag
    assert a.cache == 0.2  # the channel's wait budget is the smaller
    assert got.rules["/other"].also == () and got.rules["/other"].channel is None
    assert got.rules["/none"].channel is None
    assert got.skipped == () and got.warnings == ()


def test_a_closed_channel_closes_its_interfaces_and_a_disabled_one_caps_nothing() -> None:
    closed = rules(row(1, "/a", 25, channel_type="C"), row(2, CHANNEL_URL, 0, channel_type="C"))
    assert closed.rules["/a"].closed and closed.rules["/a"].url == "/a"
    off = rules(
        row(1, "/a", 25, channel_type="C"), row(2, CHANNEL_URL, 9, channel_type="C", status=0)
    )
    assert off.rules["/a"].also == () and off.disabled == frozenset()


def test_rows_of_one_interface_that_disagree_on_channel_are_warned_about_by_configid() -> None:
    got = rules(
        row(7, "/a", 25, channel_type="B"),
        row(3, "/a", 99, channel_type="A", period_seconds=60),
        row(9, CHANNEL_URL, 30, channel_type="A"),
        row(10, CHANNEL_URL, 40, channel_type="B"),
    )
    (warning,) = got.warnings
    assert "'/a'" in warning and "configId 7" in warning and "configId 3" in warning
    assert "follow 'A'" in warning  # the lowest configId's channel caps it
    assert [r.config_id for r in got.rules["/a"].limits] == [7, 3, 9]


def test_channel_rows_that_cannot_apply_are_skipped_naming_why() -> None:
    got = rules(
        row(1, CHANNEL_URL, 30),  # no channelType
        row(2, "/w", 10, channel_type="W", algorithm="warm_up", warmup_period=5.0),
        row(3, CHANNEL_URL, 30, channel_type="W"),
        row(4, "/s", 10, channel_type="S", shadow=1),
        row(5, CHANNEL_URL, 30, channel_type="S"),
        row(6, CHANNEL_URL, 30, channel_type="x\ny"),
    )
    why = reasons(got)
    assert "needs the channelType" in why[1]
    assert "'/w'" in why[3] and "warm_up" in why[3]
    assert "'/s'" in why[5] and "shadow" in why[5]
    assert "control character" in why[6]
    assert got.rules["/w"].also == () and got.rules["/s"].also == ()


def test_a_named_caller_replaces_the_default_per_caller_row_of_its_period() -> None:
    got = rules(
        row(1, "/p", 100),  # everyone together
        row(2, "/p", 10, per_caller=1),
        row(3, "/p", 600, per_caller=1, period_seconds=60),
        row(4, "/p", 50, per_caller=1, caller_key="partner-a"),
    )
    default = got.rules["/p"]
    assert [(r.rate, r.period, r.per_caller) for r in default.limits] == [
        (100, 1, False),
        (10, 1, True),
        (600, 60, True),
    ]
    named = got.named[("/p", "partner-a")]
    assert [(r.rate, r.period, r.caller) for r in named.limits] == [
        (100, 1, None),
        (50, 1, "partner-a"),
        (600, 60, None),
    ]
    assert ("/p", "someone-else") not in got.named


def test_callerkey_rows_that_cannot_apply_are_skipped_naming_the_value() -> None:
    got = rules(
        row(1, "/p", 10, per_caller=1),
        row(2, "/p", 50, caller_key="shared-row"),  # perCaller 0
        row(3, "/p", 50, per_caller=1, caller_key="tab\there"),
        row(4, "/p", 50, per_caller=1, caller_key=""),
        row(5, "/p", 50, per_caller=1, caller_key="x" * 65),
    )
    why = reasons(got)
    assert "'shared-row'" in why[2] and "perCaller = 1" in why[2]
    assert "'tab\\there'" in why[3] and "control character" in why[3]
    assert "empty" in why[4]
    assert "longer than 64" in why[5]
    assert got.named == {}


def test_a_named_caller_of_a_channel_row_gets_its_own_share_of_the_channel() -> None:
    got = rules(
        row(1, "/a", 100, channel_type="C"),
        row(2, CHANNEL_URL, 10, channel_type="C", per_caller=1),
        row(3, CHANNEL_URL, 40, channel_type="C", per_caller=1, caller_key="big"),
    )
    assert [(r.url, r.rate) for r in got.rules["/a"].limits] == [("/a", 100), ("*", 10)]
    assert [(r.url, r.rate) for r in got.named[("/a", "big")].limits] == [("/a", 100), ("*", 40)]


def test_two_named_rows_for_one_caller_and_period_the_stricter_wins() -> None:
    got = rules(
        row(1, "/p", 10, per_caller=1),
        row(2, "/p", 50, per_caller=1, caller_key="a"),
        row(3, "/p", 40, per_caller=1, caller_key="a"),
    )
    assert got.named[("/p", "a")].limits[0].config_id == 3
    assert "for caller 'a'" in reasons(got)[2]


def test_an_interface_with_only_named_rows_is_limited_for_those_callers_alone() -> None:
    got = rules(row(1, "/only", 5, per_caller=1, caller_key="A"))
    assert "/only" not in got.rules  # other callers: not limited
    assert [r.rate for r in got.named[("/only", "A")].limits] == [5]
