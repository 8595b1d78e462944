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
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.model.limits import (
    WINDOW_GUARD_US,
    FixedWindow,
    Limit,
    LimitKind,
    reserve_limits,
)
from tests.support.clusters import LocalCluster
from tests.support.limiting import write_row
from tests.support.services import RedisServer

DAY = 86_400
#: A fresh cluster on a loaded host can take more than the default 50 ms to answer:
#: these tests read what Redis holds, so no decision may fall back to in-process state.
PATIENT: dict[str, Any] = {
    "reload_interval": 3600,
    "redis_timeout": 1.0,
    "redis_timeout_ceiling": 2.0,
    "redis_connect_timeout": 2.0,
}


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


@pytest.fixture(params=["redis", "memory", "cluster"])
def status_redis_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    """Where ``status`` reads windows: one Redis, ``memory://``, a Redis Cluster."""
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
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
    assert refused["X-RateLimit-Remaining"] == "0"
    retry_after = int(refused["Retry-After"])
    if algorithm == "fixed_window":
        # A fixed window ends where it is aligned (on Redis, the next 00:00 UTC, which
        # may be minutes away when the test runs late in the day), at most a day away.
        assert 0 < retry_after <= 86400
    else:  # the sliding window frees its first permit a day after it was taken
        assert 86400 - 60 <= retry_after <= 86401


def test_several_limits_report_what_the_binding_one_has_left(lim: GatewayLimiter) -> None:
    decisions = [lim.decide("/mixed") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]


def _window_statuses(statuses: list[Any]) -> dict[str, tuple[float | None, float | None]]:
    return {s.rule.url: (s.used, s.reset_ms) for s in statuses}


def test_status_reads_what_each_window_has_used_and_when_it_resets(
    limiter_db: tuple[str, Engine], status_redis_url: str, key_prefix: str
) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=status_redis_url,
        key_prefix=key_prefix,
        **PATIENT,
    ) as lim:
        for _ in range(3):
            assert lim.decide("/daily/fixed_window").allowed
            assert lim.decide("/daily/sliding_window").allowed
        shown = _window_statuses(lim.status())
        idle = lim.status("/mixed")
    used, reset_ms = shown["/daily/fixed_window"]
    assert used == 3 and reset_ms is not None and 0 < reset_ms <= DAY * 1000  # to midnight UTC
    used, reset_ms = shown["/daily/sliding_window"]
    assert used == 3 and reset_ms is not None and (DAY - 60) * 1000 < reset_ms <= DAY * 1000 + 10
    # a window nothing has used: 0 of its limit, nothing to reset; a bucket: no count
    assert [(s.rule.algorithm, s.used, s.reset_ms) for s in idle] == [
        ("token_bucket", None, None),
        ("fixed_window", 0.0, None),
    ]


async def test_the_asyncio_limiter_reads_windows_too(
    limiter_db: tuple[str, Engine], status_redis_url: str, key_prefix: str
) -> None:
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0],
        redis_url=status_redis_url,
        key_prefix=key_prefix,
        **PATIENT,
    ) as alim:
        for _ in range(10):
            assert (await alim.decide("/daily/sliding_window")).allowed
        assert (await alim.decide("/daily/fixed_window")).remaining == 9
        shown = _window_statuses(await alim.status())
        refused = await alim.decide("/daily/sliding_window")
    assert not refused.allowed and refused.remaining == 0
    assert shown["/daily/sliding_window"][0] == 10
    assert shown["/daily/fixed_window"][0] == 1


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
