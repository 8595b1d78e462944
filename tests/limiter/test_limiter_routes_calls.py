"""Which calls reach Redis: only limited ones; the rest are decided at once, in-process."""

from __future__ import annotations

import math
import time

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, InterfaceClosed, NotStarted
from tests.support.limiting import evalsha_calls, set_switch, write_row


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # 5 saved up, refilled at 1/s: a loaded host's stalls between the calls counted on
    # it refill nothing
    write_row(engine, "/limited", rateLimit=1, maxPermits=5, cache=0.0, status=1)
    write_row(engine, "/disabled", rateLimit=5, cache=0.0, status=0)
    write_row(engine, "/closed", rateLimit=0, cache=0.5, status=1)
    return limiter_db


def test_unknown_disabled_and_switch_off_are_admitted_with_no_redis_traffic(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine], redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert all(lim.try_acquire("/unknown", timeout=0) for _ in range(50))
    assert all(lim.try_acquire("/disabled", timeout=0) for _ in range(50))
    assert lim.acquire("/unknown") == 0.0
    assert evalsha_calls(redis_client) == before

    set_switch(migrated_db[1], 0)
    assert lim.reload().switch is False
    assert all(lim.try_acquire("/limited", timeout=0) for _ in range(50))
    assert evalsha_calls(redis_client) == before


def test_limited_interface_is_decided_by_redis(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    admitted = [lim.try_acquire("/limited", timeout=0) for _ in range(8)]
    assert admitted == [True] * 5 + [False] * 3
    # Five round trips; the fifth reply said the next permit is a second away, so the three
    # callers who could not wait were refused in-process (exactly as Redis would).
    assert evalsha_calls(redis_client) == before + 5
    assert lim.local_refusals == 3


def test_closed_interface_refuses_at_once_without_redis(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert not any(lim.try_acquire("/closed") for _ in range(20))
    with pytest.raises(InterfaceClosed, match="/closed"):
        lim.acquire("/closed")
    assert evalsha_calls(redis_client) == before


def test_caller_waits_within_the_rows_cache_budget(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    write_row(migrated_db[1], "/wait", rateLimit=10, cache=0.25, status=1)
    lim.reload()
    began = time.monotonic()
    results = [lim.reserve("/wait") for _ in range(14)]
    elapsed_s = time.monotonic() - began
    waits = [v.wait_us / 1e6 for v in results if v.allowed]
    # 10 stored + 2 that fit in 250 ms (100 and 200 ms) on a quick host; on a loaded one
    # the bucket refills 1 permit per 100 ms while the calls run, and a later call may fit
    refilled = math.ceil(elapsed_s * 10)
    assert 12 <= len(waits) <= 12 + refilled, (waits, elapsed_s)
    assert 0 < max(waits) <= 0.25  # some waited, and none beyond the row's cache
    if elapsed_s < 0.05:
        assert waits[-2:] == pytest.approx([0.1, 0.2], abs=0.06)
        assert not results[-1].allowed


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"url": 5}, TypeError, "url"),
        ({"url": None}, TypeError, "url"),
        ({"permits": 0}, ValueError, "permits"),
        ({"permits": -3}, ValueError, "permits"),
        ({"permits": 1.5}, TypeError, "permits"),
        ({"permits": True}, TypeError, "permits"),
        ({"timeout": -0.1}, ValueError, "timeout"),
        ({"timeout": float("nan")}, ValueError, "timeout"),
        ({"timeout": "1"}, TypeError, "timeout"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(
    lim: GatewayLimiter, kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    call = {"url": "/limited", "permits": 1, "timeout": None} | kwargs
    with pytest.raises(error, match=names):
        lim.try_acquire(call["url"], call["permits"], call["timeout"])  # type: ignore[arg-type]


def test_acquire_validates_permits_too(lim: GatewayLimiter) -> None:
    with pytest.raises(ValueError, match="permits"):
        lim.acquire("/limited", 0)


def test_a_limiter_that_was_not_started_says_so(sqlite_db: str) -> None:
    lim = GatewayLimiter(database_url=sqlite_db, redis_url="memory://")
    with pytest.raises(NotStarted, match="start"):
        lim.try_acquire("/x")
    lim.close()
