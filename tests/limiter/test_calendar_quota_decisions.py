"""A calendar quota through the limiters: "3 a day from midnight Beijing time" beside a
per-second row, on a real Redis and on ``memory://``: all or nothing, the quota told
back (``Decision.reset_at``, ``limit``, ``remaining``, ``retry_after``, the headers); a
call asking for more than the quota holds in a period refused at once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.state import limit
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from gateway_limiter.model.limits import reserve_limits
from tests.support.clocks import DrivenClock, let_pass
from tests.support.limiting import write_row

URL = "/ibe/flight/search"
QUOTA = 3


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def limiter_redis_url(backend: str, limiter_redis_url: str) -> str:
    return limiter_redis_url if backend == "redis" else "memory://"


@pytest.fixture
def clock(backend: str) -> Clock:
    """Redis decides on its own clock, real time; ``memory://`` on the limiter's: one the
    test moves, its wall time starting at today's (the quota's day is the real one)."""
    return SYSTEM_CLOCK if backend == "redis" else DrivenClock(wall=time.time())


@pytest.fixture
def limiter_settings(clock: Clock) -> dict[str, Any]:
    return {"reload_interval": 3600, "clock": clock}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, URL, rateLimit=100, cache=0.0)  # per second: never the one that binds
    write_row(
        engine, URL, add=True, rateLimit=3, cache=0.0, quotaPeriod="day", timeZone="Asia/Shanghai"
    )
    return limiter_db


def beijing_midnight() -> float:
    return float(Calendar.of("day", "Asia/Shanghai").period_at(time.time())[1])


def test_a_daily_quota_is_told_back_and_refuses_until_beijing_midnight(
    lim: GatewayLimiter,
) -> None:
    decisions = [lim.decide(URL) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert {d.limit for d in decisions} == {3}
    midnight = beijing_midnight()
    assert {d.reset_at for d in decisions} == {midnight}
    refused = decisions[-1]
    assert refused.retry_after is not None
    # seconds to the renewal on the server's clock: this host's, within a few seconds
    assert abs(refused.retry_after - (midnight - time.time())) < 5
    headers = refused.headers()
    assert headers["X-RateLimit-Reset"] == str(int(midnight))
    assert headers["X-RateLimit-Limit"] == "3" and headers["X-RateLimit-Remaining"] == "0"
    assert headers["RateLimit-Policy"] == '"quota";q=3'
    assert headers["RateLimit"].startswith('"quota";r=0;t=')
    assert int(headers["Retry-After"]) >= int(refused.retry_after)
    # refused again at once (on Redis without a round trip): told back alike
    again = lim.decide(URL)
    assert not again.allowed
    assert (again.limit, again.remaining, again.reset_at) == (3, 0, midnight)
    assert again.retry_after is not None and again.retry_after > refused.retry_after - 5
    (quota,) = [s for s in lim.status(URL) if s.rule.calendar is not None]
    assert (quota.quota_used, quota.renews_at) == (3, midnight)


def test_a_call_the_per_second_row_refuses_takes_nothing_from_the_quota(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], clock: Clock
) -> None:
    with limiter_db[1].begin() as conn:  # the per-second row: 2 a second
        conn.execute(text("update t_ratelimite_conf set rateLimit = 2 where quotaPeriod is null"))
    lim.reload()
    first, second, third = (lim.decide(URL) for _ in range(3))
    assert first.allowed and second.allowed
    # the bucket binds while it has no more left than the quota: no reset_at
    assert (second.limit, second.remaining, second.reset_at) == (2, 0, None)
    assert not third.allowed and third.reset_at is None  # refused by the rate
    let_pass(clock, 0.6)  # a permit of the rate again
    fourth = lim.decide(URL)
    assert fourth.allowed  # the refused call took nothing from the quota: 1 was left
    let_pass(clock, 0.6)
    spent = lim.decide(URL)
    assert not spent.allowed
    assert (spent.limit, spent.remaining, spent.reset_at) == (3, 0, beijing_midnight())


async def test_the_asyncio_limiter_tells_the_quota_back_alike(
    alim: AsyncGatewayLimiter,
) -> None:
    decisions = [await alim.decide(URL) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert decisions[-1].reset_at == beijing_midnight()
    assert decisions[-1].limit == 3


@pytest.mark.parametrize("script", ["bucket.lua", "limits.lua"])
def test_one_more_than_the_quota_is_refused_at_once_and_exactly_the_quota_goes(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], script: str
) -> None:
    if script == "limits.lua":  # a third limit: the quota is limits.lua's kind 4
        write_row(
            limiter_db[1], URL, add=True, rateLimit=1000, cache=0.0, periodSeconds=60,
            algorithm="fixed_window",
        )  # fmt: skip
        lim.reload()
    began = time.monotonic()
    # a budget of an hour, and none: neither makes a call that can never go wait
    over = [lim.decide(URL, permits=QUOTA + 1, timeout=t) for t in (0, 3600.0, None)]
    assert time.monotonic() - began < 2.0
    midnight = beijing_midnight()
    for refused in over:
        assert not refused.allowed
        assert refused.retry_after is None  # no wait told: none would ever do
        # the quota binds: its figures, not the per-second row's 100
        assert (refused.limit, refused.remaining, refused.reset_at) == (QUOTA, QUOTA, midnight)
        headers = refused.headers()
        assert headers["X-RateLimit-Limit"] == str(QUOTA)
        assert headers["RateLimit-Policy"] == f'"quota";q={QUOTA}'
        assert headers["RateLimit"].startswith(f'"quota";r={QUOTA};t=')
    with pytest.raises(ValueError, match=f"at most {QUOTA}"):
        lim.acquire(URL, permits=QUOTA + 1)
    whole = lim.decide(URL, permits=QUOTA, timeout=0)  # the refusals took nothing
    assert whole.allowed and whole.remaining == 0
    (quota,) = [s for s in lim.status(URL) if s.rule.calendar is not None]
    assert quota.quota_used == QUOTA


@pytest.mark.parametrize("script", ["bucket.lua", "limits.lua"])
def test_a_refusal_by_a_spent_or_over_asked_quota_names_the_quota(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], script: str
) -> None:
    if script == "limits.lua":
        write_row(
            limiter_db[1], URL, add=True, rateLimit=1000, cache=0.0, periodSeconds=60,
            algorithm="fixed_window",
        )  # fmt: skip
        lim.reload()
    assert lim.decide(URL, permits=2, timeout=0).allowed
    midnight = beijing_midnight()
    # one left: 2 is more than is left today, 4 more than the day ever holds
    for permits in (2, QUOTA + 1, 2):
        refused = lim.decide(URL, permits=permits, timeout=0)
        assert not refused.allowed, permits
        assert (refused.limit, refused.remaining, refused.reset_at) == (QUOTA, 1, midnight)
        headers = refused.headers()
        assert (headers["X-RateLimit-Limit"], headers["X-RateLimit-Remaining"]) == (
            str(QUOTA),
            "1",
        )
        assert headers["RateLimit-Policy"] == f'"quota";q={QUOTA}'
    assert lim.decide(URL, timeout=0).allowed  # the last one: the refusals took nothing
    for permits in (1, QUOTA + 1):  # spent: told alike, asking 1 or more than a day holds
        refused = lim.decide(URL, permits=permits, timeout=0)
        assert not refused.allowed
        assert (refused.limit, refused.remaining, refused.reset_at) == (QUOTA, 0, midnight)
        assert refused.headers()["RateLimit-Policy"] == f'"quota";q={QUOTA}'


def test_the_model_refuses_one_more_than_the_quota_with_a_wait_that_never_ends() -> None:
    now_s = 1_795_968_000.0 + 3600.0  # 01:00 in Beijing
    quota = Rule(
        URL, QUOTA, 0.0, 2, algorithm="fixed_window", period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=Calendar.of("day", "Asia/Shanghai"),
    )  # fmt: skip
    specs = [limit(Rule(URL, 100, 0.0, 1)), limit(quota, now_s)]
    now_us = now_s * 1e6
    refused, nothing = reserve_limits(specs, [None, None], QUOTA + 1, None, now_us)
    assert (refused.allowed, refused.wait_us, nothing) == (False, float("inf"), None)
    whole, states = reserve_limits(specs, [None, None], QUOTA, 0.0, now_us)
    assert whole.allowed and whole.wait_us == 0.0 and states is not None
    assert whole.quota_left == 0.0
