"""The ``priority`` and ``reserve`` columns as the reload reads them: what parses, and
rows whose values cannot be are skipped with a reason naming the configId and column."""

from __future__ import annotations

import pytest

from gateway_limiter import Priority
from gateway_limiter.config.rules import build_rules
from gateway_limiter.config.table import ConfRow
from gateway_limiter.model.priority import PriorityError, Reserve, parse_reserve


def row(config_id: int, url: str, **columns: object) -> ConfRow:
    values: dict[str, object] = {"rate_limit": 10, "cache": 0.0, "status": 1} | columns
    return ConfRow(config_id, values.pop("channel_type", None), None, url, **values)  # type: ignore[arg-type]


def test_classes_are_ordered_highest_first() -> None:
    assert [p.value for p in Priority] == ["critical", "default", "sheddable_plus", "sheddable"]
    assert Priority("sheddable") is Priority.SHEDDABLE
    assert str(Priority.SHEDDABLE) == "sheddable"


@pytest.mark.parametrize(
    ("text", "shares"),
    [
        ("default=0.1,sheddable_plus=0.3,sheddable=0.5", (0.0, 0.1, 0.3, 0.5)),
        (" sheddable = 0.5 ", (0.0, 0.0, 0.0, 0.5)),
        ("default=0.2", (0.0, 0.2, 0.2, 0.2)),  # a missing class takes the one above's
        ("default=0.1,sheddable=0.4", (0.0, 0.1, 0.1, 0.4)),
    ],
)
def test_a_reserve_parses_into_a_share_per_class(text: str, shares: tuple[float, ...]) -> None:
    assert parse_reserve(text) == Reserve(*shares)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("default=1", "below 1"),
        ("default=-0.1", "at least 0"),
        ("default=nan", "below 1"),
        ("critical=0.1", "critical"),
        ("urgent=0.1", "'urgent'"),
        ("default=0.1,default=0.2", "twice"),
        ("default=0.5,sheddable=0.1", "at least what"),
        ("default", "class=share"),
        ("default=x", "not a number"),
        ("d" * 129, "longer than 128"),
    ],
)
def test_a_bad_reserve_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(PriorityError, match=says):
        parse_reserve(text)


@pytest.mark.parametrize(
    ("columns", "says"),
    [
        ({"reserve": "sheddable=2"}, "reserve"),
        ({"priority": "urgent"}, "priority"),
        ({"reserve": "default=0.1", "algorithm": "warm_up", "warmup_period": 1.0}, "warm_up"),
        ({"reserve": "default=0.1", "quota_period": "day"}, "calendar"),
        ({"reserve": 5}, "not text"),
    ],
)
def test_the_reload_skips_a_row_whose_classes_cannot_be(
    columns: dict[str, object], says: str
) -> None:
    rules = build_rules([row(7, "/bad", **columns), row(8, "/good", reserve="default=0.1")], 0.5)
    assert "/bad" not in rules.rules and "/good" in rules.rules
    (skipped,) = rules.skipped
    assert skipped.config_id == 7 and says in skipped.reason
    assert "configId 7" in str(skipped)


def test_a_priority_on_a_channel_row_is_refused() -> None:
    rules = build_rules([row(3, "*", channel_type="C", priority="critical")], 0.5)
    (skipped,) = rules.skipped
    assert skipped.config_id == 3 and "channel row" in skipped.reason


def test_an_interface_keeps_a_rule_per_class_where_a_limit_has_a_reserve() -> None:
    rules = build_rules(
        [
            row(1, "*", channel_type="C", reserve="default=0.1,sheddable=0.5"),
            row(2, "/search", channel_type="C", priority="sheddable"),
            row(3, "/book", channel_type="C"),
            row(4, "/alone"),
        ],
        0.5,
    )
    search = rules.rules["/search"]
    assert search.priority is Priority.SHEDDABLE
    assert [r.shares for r in search.classed] == [
        None,
        (0.0, 0.1),
        (0.0, 0.1),
        (0.0, 0.5),
    ]
    assert [r.priority for r in search.classed] == list(Priority)
    assert rules.rules["/book"].priority is None  # NULL: default
    assert rules.rules["/alone"].classed == ()


def test_a_lease_is_kept_where_a_reserve_keeps_classes_apart() -> None:
    rules = build_rules([row(5, "/hot", reserve="sheddable=0.5", lease_ms=20)], 0.5)
    hot = rules.rules["/hot"]
    assert hot.lease_ms == 20
    assert [r.lease_ms for r in hot.classed] == [20] * 4  # every class leases
    assert not any("configId 5" in w for w in rules.warnings)
