"""A thousand coroutines on one interface, one event loop, real Redis: the rate holds.

The bound checked is the bucket's own: with capacity C and rate r, the k-th permit
(k = 1, 2, ...) is released no sooner than (k - C) / r seconds after the first
reservation. Each release is timed when the caller's ``await`` returns, i.e. when it
would call the supplier. Lateness (a loaded host) is allowed generously; earliness
beyond a few milliseconds never is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.limiting import evalsha_calls, write_row

CALLERS = 1000
#: asyncio timers may fire a hair early; the clock of Redis and ours tick alike.
EARLY = 0.005


def assert_never_early(releases: list[float], started: float, capacity: int, rate: int) -> None:
    for k, at in enumerate(sorted(releases), start=1):
        earliest = (k - capacity) / rate
        assert at - started >= earliest - EARLY, (
            f"permit {k} released {at - started:.3f} s in, before {earliest:.3f} s"
        )


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, "/acquire", rateLimit=250, cache=0.0, status=1)
    write_row(engine, "/try", rateLimit=200, cache=0.5, status=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 60}


async def test_a_thousand_coroutines_acquiring_are_released_at_the_rate(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    rate = capacity = 250
    releases: list[float] = []

    async def caller() -> None:
        await alim.acquire("/acquire")
        releases.append(time.monotonic())

    before = evalsha_calls(redis_client)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        await asyncio.gather(*(caller() for _ in range(CALLERS)))

    assert len(releases) == CALLERS
    assert evalsha_calls(redis_client) - before == CALLERS  # every decision made by Redis
    assert alim.backend_healthy
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert_never_early(releases, started, capacity, rate)
    # ... and not much later either: the last of 750 queued permits is due at 3 s.
    assert max(releases) - started <= (CALLERS - capacity) / rate + 1.5


async def test_a_thousand_coroutines_trying_get_the_stored_permits_plus_their_wait_budget(
    alim: AsyncGatewayLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    rate = capacity = 200
    budget = 0.5
    releases: list[float] = []
    refused_after: list[float] = []
    decided: list[float] = []

    async def caller() -> None:
        asked = time.monotonic()
        verdict = await alim.reserve("/try")  # the decision alone, timed
        decided.append(time.monotonic())
        if verdict.allowed:
            # real time: the wait Redis' clock gave, slept as try_acquire does next
            await asyncio.sleep(verdict.wait_us / 1e6)
            releases.append(time.monotonic())
        else:
            refused_after.append(time.monotonic() - asked)

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    spread = max(decided) - started  # every reservation fell within [started, started+spread]

    assert alim.backend_healthy
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
    # C at once, plus r per second of budget, plus what refilled while decisions ran.
    assert capacity + rate * budget - 1 <= len(releases) <= capacity + rate * (budget + spread) + 1
    assert_never_early(releases, started, capacity, rate)
    assert max(releases) - started <= budget + spread + 0.25
    # a refusal never waits for the budget: it is as quick as the decision
    assert max(refused_after) <= spread + 0.05


async def test_try_acquire_itself_admits_within_the_budget(alim: AsyncGatewayLimiter) -> None:
    started = time.monotonic()
    admitted = await asyncio.gather(*(alim.try_acquire("/try") for _ in range(CALLERS)))
    took = time.monotonic() - started
    # C, plus r x the budget, plus what refilled while the thousand decisions were made
    assert 200 + 200 * 0.5 - 1 <= sum(admitted) <= 200 + 200 * took + 1
