"""A paced calendar quota through the limiters, on a real Redis and on ``memory://``:
the row's maxPermits is its burst, then calls go at the pace (the permits left over the
time left of the day), and a refusal says when the next paced permit comes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.model.calendar import Calendar
from tests.support.limiting import write_row

URL = "/ibe/paced/search"
ZONE = "Asia/Shanghai"


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, limiter_redis_url: str) -> str:
    return limiter_redis_url if request.param == "redis" else "memory://"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


def seconds_left() -> float:
    return Calendar.of("day", ZONE).period_at(time.time())[1] - time.time()


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, URL, rateLimit=1000, cache=0.0)  # per second: never the one that binds
    # one permit every 100 s at an even pace over what is left of today, a burst of 3
    write_row(
        engine,
        URL,
        add=True,
        rateLimit=max(10, int(seconds_left() / 100)),
        cache=0.0,
        quotaPeriod="day",
        timeZone=ZONE,
        quotaPacing=1,
        maxPermits=3,
    )
    return limiter_db


def test_a_paced_quota_admits_its_burst_then_tells_when_the_pace_allows(
    lim: GatewayLimiter,
) -> None:
    decisions = [lim.decide(URL, timeout=0) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    refused = decisions[-1]
    quota = lim.registry.snapshot.rules[URL].also[0].rate
    assert refused.retry_after is not None
    # the next permit: (time left) / (permits left) from the last admission, about 100 s
    pace_s = seconds_left() / (quota - 3)
    assert 0.5 * pace_s <= refused.retry_after <= 1.5 * pace_s + 1
