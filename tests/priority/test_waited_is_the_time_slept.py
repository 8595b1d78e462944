"""``Decision.waited`` (and ``acquire``'s answer) is the time a call actually waited for
its permit: for a class below critical on an interface with a reserve, the sleeps
between its re-checks, slept on the limiter's clock, and none when it is refused.

The clock given to the limiter records every sleep the shell asks of it (and sleeps it,
so the real Redis's own clock moves on too): the answer is checked against what was
slept, in a range that holds on a loaded machine.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.limiting import write_row
from tests.support.services import RedisServer


class RecordingClock:
    """The system's clocks; each sleep asked of it is recorded, then slept."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        # real time: this clock's sleeps are the system's
        time.sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        self.slept.append(seconds)
        # real time: this clock's sleeps are the system's
        await asyncio.sleep(seconds)


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    # 10 a second, 10 stored, half of them kept for critical
    write_row(limiter_db[1], "/w", rateLimit=10, cache=0.0, reserve="default=0.5")
    return limiter_db


def _drain(lim: GatewayLimiter) -> None:
    assert sum(lim.try_acquire("/w", timeout=0, priority="critical") for _ in range(10)) == 10


def test_a_lower_class_waited_the_sleeps_between_its_rechecks(
    limiter_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    clock = RecordingClock()
    lim = GatewayLimiter(
        database_url=limiter_db[0], redis_url=redis_server.url, key_prefix=key_prefix, clock=clock
    )
    with lim:
        _drain(lim)
        # a default call needs 1 + 5 stored: 0.6 s of refill; it sleeps on the clock
        d = lim.decide("/w", timeout=3.0, priority="default")
        assert d.allowed and d.reason == "admitted"
        assert clock.slept and 0.0 < sum(clock.slept) <= 0.7  # less if draining took long
        # what it waited is what it slept (measured on the clock), not 0
        assert sum(clock.slept) <= d.waited < sum(clock.slept) + 1.0
        # a critical call that takes stored permits waits nothing and sleeps nothing
        clock.slept.clear()
        c = lim.decide("/w", timeout=0, priority="critical")
        assert c.allowed and c.waited == 0.0 and clock.slept == []


def test_a_refused_lower_class_waited_nothing(
    limiter_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    clock = RecordingClock()
    lim = GatewayLimiter(
        database_url=limiter_db[0], redis_url=redis_server.url, key_prefix=key_prefix, clock=clock
    )
    with lim:
        _drain(lim)
        d = lim.decide("/w", timeout=0.2, priority="default")  # 0.6 s is beyond its budget
        assert not d.allowed and d.reason == "reserved"
        assert d.waited == 0.0 and clock.slept == []
        assert d.retry_after is not None and 0.2 < d.retry_after <= 0.6


def test_acquire_answers_the_time_slept(
    limiter_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    clock = RecordingClock()
    lim = GatewayLimiter(
        database_url=limiter_db[0], redis_url=redis_server.url, key_prefix=key_prefix, clock=clock
    )
    with lim:
        _drain(lim)
        waited = lim.acquire("/w", priority="default")
        assert clock.slept and sum(clock.slept) <= waited < sum(clock.slept) + 1.0


async def test_asyncio_waited_the_sleeps_too(
    limiter_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    clock = RecordingClock()
    async with AsyncGatewayLimiter(
        database_url=limiter_db[0], redis_url=redis_server.url, key_prefix=key_prefix, clock=clock
    ) as alim:
        for _ in range(10):
            assert await alim.try_acquire("/w", timeout=0, priority="critical")
        d = await asyncio.wait_for(alim.decide("/w", timeout=3.0, priority="default"), 10)
        assert d.allowed
        assert clock.slept and sum(clock.slept) <= d.waited < sum(clock.slept) + 1.0
