"""A lease row under ``AsyncGatewayLimiter``: coroutines share the process's lease (one
renews it while the others wait for that), and closing hands it back."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.scripts import STATE
from gateway_limiter.backends.state import bucket_key
from tests.support.limiting import evalsha_calls, write_row
from tests.support.services import RedisServer


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    # leases of 100 permits that last 1 s: a round of 100 callers on a loaded host is
    # well within that (with 100 ms leases one sometimes went stale mid-round)
    write_row(limiter_db[1], "/hot", rateLimit=100, maxPermits=1000, cache=0.0, leaseMs=1000)
    # refills 100/s only: what comes back is seen before time could have refilled it
    write_row(limiter_db[1], "/slow", rateLimit=100, maxPermits=1000, cache=0.0, leaseMs=10_000)
    # a burst of 10, then 1 ms a permit: callers who wait are served from debt leases
    write_row(limiter_db[1], "/waits", rateLimit=1000, maxPermits=10, cache=0.5, leaseMs=100)
    return limiter_db


async def test_coroutines_share_the_lease(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    admitted, stalled = 0, 0
    for _ in range(5):  # 5 rounds of 100 concurrent callers
        started = time.monotonic()
        got = await asyncio.gather(*(alim.try_acquire("/hot", timeout=0) for _ in range(100)))
        # a round that a stalled host stretched past the lease's 1 s outlived the lease
        # it renewed: one more renewal for it, and only for it
        stalled += time.monotonic() - started >= 1.0
        admitted += sum(got)
    assert admitted == 500  # half the burst
    # Each round: one coroutine renews the lease (100 permits), the 99 others wait for
    # that renewal and take from it.
    assert 5 <= evalsha_calls(redis_client) - before <= 5 + stalled


async def test_coroutines_who_wait_share_a_debt_lease(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    before, started = evalsha_calls(redis_client), time.monotonic()
    got = await asyncio.gather(*(alim.try_acquire("/waits") for _ in range(60)))
    elapsed = time.monotonic() - started
    assert all(got)
    # one lease call: the burst of 10 now, and the other 90 of the lease as debt, 1 ms
    # apart, that 50 of the callers wait for (without debt for the rest of a short
    # lease, renewals finding a few permits refilled left waiters to go the plain way
    # on a loaded host)
    assert evalsha_calls(redis_client) - before <= 2
    assert elapsed >= 0.045  # the rate kept: the 60th permit is 50 ms after the burst
    leases = alim._leases
    assert leases is not None and leases.owed == 90


async def test_closing_hands_the_lease_back(
    limiter_db: tuple[str, Engine],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0], redis_url=redis_server.url, key_prefix=key_prefix
    ) as own:
        assert await own.try_acquire("/slow", timeout=0)  # 999 left in the lease
        raw = redis_client.get(bucket_key(key_prefix, "/slow"))
        assert isinstance(raw, bytes) and STATE.unpack_from(raw)[0] < 10.0
    raw = redis_client.get(bucket_key(key_prefix, "/slow"))
    assert isinstance(raw, bytes) and STATE.unpack_from(raw)[0] >= 999.0  # 999 back
