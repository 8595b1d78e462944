"""``remaining`` and ``X-RateLimit-Remaining`` count down on windows as on buckets.

A fixed or sliding window of 10 per day tells each admitted caller how many of the 10
are left, and an interface of several limits tells what the limit that binds has left.
Real MariaDB rows, on a real Redis (``limits.lua``) and on ``memory://`` (the model).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.model.limits import (
    WINDOW_GUARD_US,
    FixedWindow,
    Limit,
    LimitKind,
    reserve_limits,
)
from tests.support.limiting import write_row
from tests.support.services import RedisServer

DAY = 86_400


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    for algorithm in ("fixed_window", "sliding_window"):
        write_row(
            engine,
            f"/daily/{algorithm}",
            rateLimit=10,
            periodSeconds=DAY,
            algorithm=algorithm,
            cache=0.0,
            status=1,
        )
    # a bucket of 100/s and a fixed window of 3 a day: the window binds
    write_row(engine, "/mixed", rateLimit=100, cache=0.0, status=1)
    write_row(
        engine,
        "/mixed",
        add=True,
        rateLimit=3,
        periodSeconds=DAY,
        algorithm="fixed_window",
        cache=0.0,
        status=1,
    )
    return limiter_db


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    return redis_server.url if request.param == "redis" else "memory://"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_a_daily_window_counts_down_to_zero_then_refuses(
    lim: GatewayLimiter, algorithm: str
) -> None:
    url = f"/daily/{algorithm}"
    decisions = [lim.decide(url) for _ in range(11)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    assert [d.remaining for d in decisions] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0]
    assert decisions[0].headers() == {"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9"}
    refused = decisions[-1].headers()
    assert refused["X-RateLimit-Remaining"] == "0" and int(refused["Retry-After"]) > 3600


def test_several_limits_report_what_the_binding_one_has_left(lim: GatewayLimiter) -> None:
    decisions = [lim.decide("/mixed") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]


def test_admissions_that_left_a_sliding_window_no_longer_count() -> None:
    """The window's list still holds admissions that have left it (it is trimmed only
    once full); what is left counts only those still in the window."""
    window = Limit(LimitKind.SLIDING_WINDOW, 10.0, 60 * US_PER_S + WINDOW_GUARD_US)
    t0 = 1_000 * US_PER_S
    state: Any = None
    for i in range(6):
        verdict, new = reserve_limits([window], [state], 1, 0.0, t0 + i)
        assert new is not None and verdict.stored == 9 - i
        state = new[0]
    later = t0 + 30 * US_PER_S
    verdict, new = reserve_limits([window], [state], 1, 0.0, later)
    assert new is not None and verdict.stored == 3  # 7 in the last minute
    # a minute after the first six, only the one at +30 s is still in the window
    gone = t0 + 61 * US_PER_S
    verdict, _ = reserve_limits([window], [new[0]], 1, 0.0, gone)
    assert verdict.allowed and verdict.stored == 8
    refused, _ = reserve_limits([window], [new[0]], 20, 0.0, gone)
    assert refused.stored == 0  # more than the window holds: never, and not read


def test_a_fixed_window_refused_reports_its_window_spent() -> None:
    window = Limit(LimitKind.FIXED_WINDOW, 2.0, 60 * US_PER_S)
    now = 1_000 * 60 * US_PER_S  # the start of window 1000
    verdict, _ = reserve_limits([window], [FixedWindow(1000.0, 2.0)], 1, 0.0, now)
    assert not verdict.allowed and verdict.stored == 0
    verdict, _ = reserve_limits([window], [FixedWindow(999.0, 2.0)], 1, 0.0, now)
    assert verdict.allowed and verdict.stored == 1  # a new window: the old count is gone
