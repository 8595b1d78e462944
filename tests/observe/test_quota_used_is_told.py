"""A calendar quota's use is told: the ``gateway_limiter_quota_used_ratio`` gauge per
interface and period, and one warning log line per period as each ``quota_warn_at``
fraction (80 % and 95 % by default) is passed, on a real Redis and a real table."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.model.calendar import Calendar
from tests.support.limiting import write_row

URL = "/quota/told"
GAUGE = "gateway_limiter_quota_used_ratio"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600, "metrics": True}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, URL, rateLimit=1000, cache=0.0)
    write_row(
        engine, URL, add=True, rateLimit=20, cache=0.0, quotaPeriod="day", timeZone="Asia/Shanghai"
    )
    return limiter_db


def test_the_gauge_follows_the_period_and_each_fraction_is_warned_once(
    lim: GatewayLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    labels = {"interface": URL, "period": "day"}

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "calendar quota" in r.getMessage()]

    for _ in range(15):
        assert lim.try_acquire(URL, timeout=0)
    assert REGISTRY.get_sample_value(GAUGE, labels) == pytest.approx(0.75)
    assert warnings() == []
    assert lim.try_acquire(URL, timeout=0)  # 16 of 20: 80 %
    (first,) = warnings()
    assert "'/quota/told' (day): 80 % used (16 of 20), past 80 %" in first
    # when it renews: a date-time in the quota's zone, the epoch seconds beside it
    ends = Calendar.of("day", "Asia/Shanghai").period_at(time.time())[1]
    local = dt.datetime.fromtimestamp(ends, ZoneInfo("Asia/Shanghai"))
    assert first.endswith(f"renews at {local:%Y-%m-%d} 00:00 CST (Asia/Shanghai; {ends} epoch s)")
    for _ in range(2):
        assert lim.try_acquire(URL, timeout=0)
    assert len(warnings()) == 1  # 90 %: nothing new to tell
    assert lim.try_acquire(URL, timeout=0)  # 19 of 20: 95 %
    assert len(warnings()) == 2 and "95 % used (19 of 20), past 95 %" in warnings()[-1]
    assert lim.try_acquire(URL, timeout=0)
    assert not lim.try_acquire(URL, timeout=0)  # spent: refused, and told no more
    assert len(warnings()) == 2
    assert REGISTRY.get_sample_value(GAUGE, labels) == 1.0
