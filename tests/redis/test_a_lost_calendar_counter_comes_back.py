"""A calendar quota counter that Redis loses (evicted, or a failover that lost the last
writes) comes back at once, raised to what the process had seen, not at the next
checkpoint: the first reply that shows it low wakes the keeper (threads and asyncio).
A count is only ever raised: one that Redis holds higher than the process saw stays."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.model.calendar import Calendar
from tests.support.clusters import wait_for
from tests.support.limiting import write_row

URL = "/quota/evicted"
ZONE = "Asia/Shanghai"
QUOTA = 20


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    # no checkpoint round comes during the test: only a reply can bring the counter back
    return {"redis_timeout": 2.0, "reload_interval": 3600, "quota_checkpoint_s": 3600}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0)
    write_row(
        limiter_db[1], URL, add=True, rateLimit=QUOTA, cache=0, quotaPeriod="day", timeZone=ZONE
    )
    return limiter_db


def counter_key(prefix: str) -> str:
    calendar = Calendar.of("day", ZONE)
    period = CALENDAR_SECONDS[calendar.renewal.period]
    return state_key(prefix, Rule(URL, QUOTA, 0.0, 2, period=period, calendar=calendar))


def count(client: redis.Redis, key: str) -> float:
    raw = client.get(key)
    # the count first: the per-second row's bucket follows it in the same key
    return struct.unpack_from("<2d", raw)[1] if isinstance(raw, bytes) else 0.0


def test_an_evicted_counter_is_raised_back_by_the_first_reply(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    key = counter_key(key_prefix)
    assert [lim.try_acquire(URL) for _ in range(12)] == [True] * 12
    redis_client.delete(key)  # evicted
    assert lim.try_acquire(URL)  # counted from nothing: 1, and the keeper is woken
    wait_for("the counter raised back", lambda: count(redis_client, key) >= 12, 10)
    # raised to the 12 the process had seen: the day goes on from there (only the call
    # that found it lost, counted before the keeper raised it, is not counted again)
    got = [lim.try_acquire(URL) for _ in range(QUOTA)]
    assert got.count(True) == QUOTA - 12
    assert not lim.try_acquire(URL)


def test_a_counter_is_never_lowered_to_what_a_process_saw(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    key = counter_key(key_prefix)
    assert [lim.try_acquire(URL) for _ in range(5)] == [True] * 5
    start = Calendar.of("day", ZONE).period_at(time.time())[0] * 1_000_000
    redis_client.set(key, struct.pack("<2d", start, 15.0), px=60_000)  # others spent more
    assert lim.try_acquire(URL)
    assert count(redis_client, key) == 16.0
    assert lim.decide(URL).remaining == QUOTA - 17


async def test_asyncio_raises_an_evicted_counter_back(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    key = counter_key(key_prefix)
    assert [await alim.try_acquire(URL) for _ in range(12)] == [True] * 12
    redis_client.delete(key)
    assert await alim.try_acquire(URL)
    deadline = time.monotonic() + 10
    while count(redis_client, key) < 12 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the keeper is a task on this loop: let it run
    assert count(redis_client, key) >= 12
