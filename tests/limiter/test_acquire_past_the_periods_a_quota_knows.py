"""``acquire`` on a calendar quota whose next two periods are already booked: the store
books no call past the end of the next period it knows, so ``acquire`` is refused with
the wait to that end, sleeps it, and asks again, when the periods it knows have moved
on; its permit then counts in the period it goes in (memory://, on a clock that moves
only by the sleeps asked of it)."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from tests.support.limiting import write_row

URL = "/daily"
DAY_S = 86_400.0
#: 2026-12-01 12:00 UTC
NOON = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC).timestamp()


class ManualClock:
    """Time that moves only when a caller sleeps."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now - NOON + 1_000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1, cache=0.0, quotaPeriod="day", timeZone="UTC")
    return limiter_db


def test_acquire_sleeps_to_the_end_of_the_next_period_then_books_the_day_after(
    limiter_db: tuple[str, Engine], key_prefix: str
) -> None:
    clock = ManualClock(NOON)
    lim = GatewayLimiter(
        database_url=limiter_db[0],
        redis_url="memory://",
        key_prefix=key_prefix,
        clock=clock,
        reload_interval=3600,
    )
    with lim:
        # 1 December's permit now, 2 and 3 December's booked ahead (reserve sleeps nothing)
        waits = [lim.reserve(URL, timeout=10 * DAY_S).wait_us / 1e6 for _ in range(3)]
        assert waits == [0.0, 0.5 * DAY_S, 1.5 * DAY_S]
        # 4 December is past the periods known at noon on 1 December: told 3 December
        refused = lim.reserve(URL, timeout=10 * DAY_S)
        assert not refused.allowed and refused.wait_us / 1e6 == 1.5 * DAY_S
        # acquire sleeps to 3 December, asks again, and is booked on 4 December
        assert lim.acquire(URL) == 2.5 * DAY_S
        assert clock.slept == [1.5 * DAY_S, DAY_S]
        assert clock.now == NOON + 2.5 * DAY_S
        # 4 December's one permit is the acquire's: nothing more that day
        assert not lim.try_acquire(URL, timeout=0)
        assert lim.try_acquire(URL, timeout=DAY_S)
