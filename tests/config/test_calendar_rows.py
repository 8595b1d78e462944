"""Calendar quota rows (quotaPeriod, timeZone, quotaRenews, quotaPacing) become rules:
a daily quota beside a per-second row, per caller and over a channel; bad values skipped
naming the configId; the default_time_zone setting for rows without a zone."""

from __future__ import annotations

import dataclasses
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from gateway_limiter.config.rules import CALENDAR_SECONDS, Algorithm, build_rules
from gateway_limiter.config.settings import Settings, SettingsError, load_settings
from gateway_limiter.config.table import ConfRow
from gateway_limiter.model.calendar import QuotaPeriod


def row(
    config_id: int,
    url: str = "/search",
    rate: int = 50_000,
    *,
    quota: str | None = "day",
    zone: str | None = "Asia/Shanghai",
    renews: str | None = None,
    pacing: int | None = 0,
    **more: object,
) -> ConfRow:
    base = ConfRow(
        config_id,
        "IBE+",
        None,
        url,
        rate,
        0.5,
        1,
        algorithm="token_bucket",
        period_seconds=1,
        per_caller=0,
        quota_period=quota,
        time_zone=zone,
        quota_renews=renews,
        quota_pacing=pacing,
    )
    return dataclasses.replace(base, **more)  # type: ignore[arg-type]


def test_a_daily_row_is_a_calendar_quota_counted_per_day_of_its_zone() -> None:
    ruleset = build_rules([row(1)], 0.5)
    assert ruleset.skipped == ()
    rule = ruleset.rules["/search"]
    assert rule.calendar is not None
    assert rule.calendar.zone == ZoneInfo("Asia/Shanghai")
    assert rule.quota_period is QuotaPeriod.DAY
    assert rule.algorithm is Algorithm.FIXED_WINDOW
    assert rule.period == CALENDAR_SECONDS[QuotaPeriod.DAY] == 86_400
    assert rule.rate == 50_000


def test_a_row_without_a_zone_takes_the_default_time_zone() -> None:
    rows = [row(1, zone=None, quota="month", renews="15 00:00")]
    assert build_rules(rows, 0.5).rules["/search"].calendar.zone.key == "UTC"  # type: ignore[union-attr]
    rule = build_rules(rows, 0.5, "America/New_York").rules["/search"]
    assert rule.calendar is not None
    assert rule.calendar.zone.key == "America/New_York"
    assert rule.calendar.renewal.day == 15


def test_a_daily_quota_and_a_per_second_row_apply_together() -> None:
    per_second = row(2, rate=20, quota=None, zone=None)
    rolling_day = row(3, rate=60_000, quota=None, zone=None, period_seconds=86_400)
    ruleset = build_rules([row(1), per_second, rolling_day], 0.5)
    assert ruleset.skipped == ()
    rule = ruleset.rules["/search"]
    # the per-second row leads; a calendar day and 86,400 s are different limits
    assert [(r.config_id, r.quota_period) for r in rule.limits] == [
        (2, None),
        (1, QuotaPeriod.DAY),
        (3, None),
    ]


def test_two_daily_quotas_for_one_url_the_stricter_applies() -> None:
    ruleset = build_rules([row(1, rate=50_000), row(2, rate=40_000, zone="UTC")], 0.5)
    assert ruleset.rules["/search"].config_id == 2
    assert [s.config_id for s in ruleset.skipped] == [1]
    assert "(per day)" in ruleset.skipped[0].reason


def test_calendar_quotas_per_caller_for_a_named_caller_and_over_a_channel() -> None:
    rows = [
        row(1, rate=20, quota=None, zone=None),
        row(2, rate=1_000, per_caller=1),
        row(3, rate=5_000, per_caller=1, caller_key="big"),
        row(4, url="*", rate=200_000, quota="month"),
    ]
    ruleset = build_rules(rows, 0.5)
    assert ruleset.skipped == ()
    rule = ruleset.rules["/search"]
    assert [(r.config_id, r.quota_period, r.per_caller) for r in rule.limits] == [
        (1, None, False),
        (2, QuotaPeriod.DAY, True),
        (4, QuotaPeriod.MONTH, False),
    ]
    assert rule.also[-1].caps_channel and rule.also[-1].channel == "IBE+"
    big = ruleset.named[("/search", "big")]
    assert [r.config_id for r in big.limits] == [1, 3, 4]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"time_zone": "Mars/Olympus"}, "timeZone 'Mars/Olympus' is not an IANA time zone"),
        ({"quota_renews": "midnight"}, "quotaRenews 'midnight' is not a day renewal"),
        ({"quota_period": "month", "quota_renews": "31 00:00"}, "names the 31st"),
        ({"quota_period": "year"}, "quotaPeriod 'year' is not one of day, week, month"),
        ({"quota_period": None}, "timeZone 'Asia/Shanghai' is for calendar quotas"),
        ({"quota_period": None, "time_zone": None, "quota_pacing": 1}, "quotaPacing 1 is for"),
        ({"quota_pacing": 2}, "quotaPacing 2 is not 0 or 1"),
        ({"time_zone": 8}, "timeZone 8 is not text"),
        ({"algorithm": "sliding_window"}, "algorithm 'sliding_window' cannot count"),
        ({"period_seconds": 60}, "periodSeconds 60 cannot go with quotaPeriod day"),
        ({"max_permits": 10}, "maxPermits 10 is not used by a calendar quota without pacing"),
        ({"max_permits": 0, "quota_pacing": 1}, "maxPermits 0 of a paced quota"),
    ],
)
def test_bad_calendar_rows_are_skipped_naming_their_config_id(
    changes: dict[str, Any], says: str
) -> None:
    good = row(1, url="/other")
    bad = row(7, **changes)
    ruleset = build_rules([good, bad], 0.5)
    assert "/search" not in ruleset.rules
    assert "/other" in ruleset.rules  # every valid row still applies
    (skipped,) = ruleset.skipped
    assert skipped.config_id == 7
    assert says in skipped.reason
    assert str(skipped).startswith("configId 7: ")


def test_a_fixed_window_calendar_row_is_accepted() -> None:
    ruleset = build_rules([row(1, algorithm="fixed_window", quota="week", renews="sun 18:00")], 0)
    rule = ruleset.rules["/search"]
    assert rule.calendar is not None and rule.calendar.renewal.text == "sun 18:00"


def test_default_time_zone_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().default_time_zone == "UTC"
    monkeypatch.setenv("GATEWAY_LIMITER_DEFAULT_TIME_ZONE", "Asia/Shanghai")
    assert load_settings(None).default_time_zone == "Asia/Shanghai"
    with pytest.raises(SettingsError, match=r"default_time_zone.*Beijing"):
        Settings(default_time_zone="Beijing")


@pytest.mark.parametrize(
    ("max_permits", "setting", "burst"), [(None, None, 10), (None, 40, 40), (25, 40, 25)]
)
def test_a_paced_row_applies_with_its_burst_from_max_permits_else_the_setting(
    max_permits: int | None, setting: int | None, burst: int
) -> None:
    paced = row(4, pacing=1, max_permits=max_permits)
    ruleset = (
        build_rules([paced], 0.5) if setting is None else build_rules([paced], 0.5, "UTC", setting)
    )
    rule = ruleset.rules["/search"]
    assert ruleset.warnings == () and ruleset.skipped == ()
    assert rule.pacing and rule.pace_burst == burst
    assert rule.capacity == 0  # the quota itself holds rateLimit per period


def test_a_paced_fixed_window_row_takes_max_permits_as_its_burst() -> None:
    paced = row(4, pacing=1, algorithm="fixed_window", max_permits=3)
    rule = build_rules([paced], 0.5).rules["/search"]
    assert rule.pacing and rule.pace_burst == 3


def test_quota_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().quota_pacing_burst == 10 and Settings().quota_warn_at == "0.8,0.95"
    monkeypatch.setenv("GATEWAY_LIMITER_QUOTA_PACING_BURST", "50")
    assert load_settings(None).quota_pacing_burst == 50
    with pytest.raises(SettingsError, match="quota_pacing_burst"):
        Settings(quota_pacing_burst=0)
    with pytest.raises(SettingsError, match=r"quota_warn_at.*above 0"):
        Settings(quota_warn_at="0.8,1.5")
    with pytest.raises(SettingsError, match=r"quota_warn_at.*'most' is not a number"):
        Settings(quota_warn_at="most")
