"""A refusal by a paced quota's pace, with a per-second row beside it that has room,
names the quota (its limit, what is left, when it renews), not the per-second row: when
Redis refused it, and when the process refused the next call itself (a local refusal,
learnt from that reply), without a round trip."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.model.calendar import Calendar
from tests.support.limiting import limiter, write_row

URL = "/ibe/paced/refusal"
ZONE = "Asia/Shanghai"
PER_SECOND = 20


def seconds_left() -> float:
    return Calendar.of("day", ZONE).period_at(time.time())[1] - time.time()


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, limiter_redis_url: str) -> str:
    return limiter_redis_url if request.param == "redis" else "memory://"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, URL, rateLimit=PER_SECOND, cache=0.0)
    # at least 100 a day, paced: a permit every 100 s or sooner, a burst of 3
    write_row(
        engine,
        URL,
        add=True,
        rateLimit=max(100, int(seconds_left() / 100)),
        cache=0.0,
        quotaPeriod="day",
        timeZone=ZONE,
        quotaPacing=1,
        maxPermits=3,
    )
    return limiter_db


def test_a_paced_refusal_and_its_local_repeat_name_the_quota(
    lim: GatewayLimiter,
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    key_prefix: str,
) -> None:
    quota = lim.registry.snapshot.rules[URL].also[0].rate
    renews = Calendar.of("day", ZONE).period_at(time.time())[1]
    assert all(lim.decide(URL, timeout=0).allowed for _ in range(3))
    refusals = [lim.decide(URL, timeout=0) for _ in range(2)]  # the third reply taught it
    if limiter_redis_url != "memory://":
        assert lim.local_refusals == 2  # both refused in process, as that reply said
        other = limiter(limiter_db[0], limiter_redis_url, key_prefix, reload_interval=3600)
        try:
            refusals.append(other.decide(URL, timeout=0))  # another process: Redis refuses
            assert other.local_refusals == 0
        finally:
            other.close()
    for refused in refusals:
        assert not refused.allowed and refused.reason == "limited"
        # the quota's figures: 3 of it used; the per-second row (20, 17 left) had room
        assert (refused.limit, refused.remaining) == (quota, quota - 3), refused
        assert refused.reset_at is not None and abs(refused.reset_at - renews) <= 2
        assert refused.retry_after is not None and refused.retry_after > 1.0  # the pace
        headers = refused.headers()
        assert headers["X-RateLimit-Limit"] == str(quota)
        assert headers["RateLimit-Policy"] == f'"quota";q={quota}'


def test_a_refusal_by_the_per_second_row_still_names_that_row(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine]
) -> None:
    with limiter_db[1].begin() as conn:  # the per-second row: 2 a second
        conn.execute(text("update t_ratelimite_conf set rateLimit = 2 where quotaPeriod is null"))
    lim.reload()
    assert lim.decide(URL, timeout=0, permits=2).allowed  # the bucket's 2, of the burst's 3
    refused = lim.decide(URL, timeout=0)  # the pace has one more; the bucket none
    assert not refused.allowed
    assert refused.limit == 2 and refused.reset_at is None
