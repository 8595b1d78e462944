"""A call asking for more permits than a calendar quota holds in a period ("3 a day from
midnight Beijing time", asked for 4) is refused at once, never told a wait that cannot
come, and takes nothing; one asking for exactly the quota goes. On every path: the pair
``bucket.lua`` decides, ``limits.lua``'s kind 4 (a third row beside them), ``memory://``
and the model."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.state import limit
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from gateway_limiter.model.limits import reserve_limits
from tests.support.limiting import write_row

URL = "/ibe/flight/quote"
QUOTA = 3
ZONE = "Asia/Shanghai"


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, limiter_redis_url: str) -> str:
    return limiter_redis_url if request.param == "redis" else "memory://"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


@pytest.fixture(params=["bucket.lua", "limits.lua"])
def limiter_db(
    request: pytest.FixtureRequest, limiter_db: tuple[str, Engine]
) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, URL, rateLimit=100, maxPermits=100, cache=0.0)  # never the one that binds
    if request.param == "limits.lua":  # a third limit: the quota is limits.lua's kind 4
        write_row(
            engine, URL, add=True, rateLimit=1000, cache=0.0, periodSeconds=60,
            algorithm="fixed_window",
        )  # fmt: skip
    write_row(engine, URL, add=True, rateLimit=QUOTA, cache=0.0, quotaPeriod="day", timeZone=ZONE)
    return limiter_db


def test_one_more_than_the_quota_is_refused_at_once_and_exactly_the_quota_goes(
    lim: GatewayLimiter,
) -> None:
    began = time.monotonic()
    # a budget of an hour, and none: neither makes a call that can never go wait
    over = [lim.decide(URL, permits=QUOTA + 1, timeout=t) for t in (0, 3600.0, None)]
    assert time.monotonic() - began < 2.0
    for refused in over:
        assert not refused.allowed
        assert refused.retry_after is None  # no wait told: none would ever do
    with pytest.raises(ValueError, match=f"at most {QUOTA}"):
        lim.acquire(URL, permits=QUOTA + 1)
    whole = lim.decide(URL, permits=QUOTA, timeout=0)  # the refusals took nothing
    assert whole.allowed and whole.remaining == 0
    (quota,) = [s for s in lim.status(URL) if s.rule.calendar is not None]
    assert quota.quota_used == QUOTA


def test_the_model_refuses_one_more_than_the_quota_with_a_wait_that_never_ends() -> None:
    calendar = Calendar.of("day", ZONE)
    now_s = 1_795_968_000.0 + 3600.0
    quota = Rule(
        URL, QUOTA, 0.0, 2, algorithm="fixed_window", period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=calendar,
    )  # fmt: skip
    specs = [limit(Rule(URL, 100, 0.0, 1)), limit(quota, now_s)]
    now_us = now_s * 1e6
    refused, nothing = reserve_limits(specs, [None, None], QUOTA + 1, None, now_us)
    assert (refused.allowed, refused.wait_us, nothing) == (False, float("inf"), None)
    whole, states = reserve_limits(specs, [None, None], QUOTA, 0.0, now_us)
    assert whole.allowed and whole.wait_us == 0.0 and states is not None
    assert whole.quota_left == 0.0
