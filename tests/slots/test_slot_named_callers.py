"""``slot(url, key=...)`` follows the caller's own row, as ``try_acquire`` does: a named
caller's rate and cap apply to its slots, and ``in_flight`` counts a named row's slots."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.errors import Refused
from tests.support.limiting import write_row

SHARED = "/named/per-caller"
ONLY_NAMED = "/named/only"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, SHARED, rateLimit=100, cache=0.0, perCaller=1, maxConcurrent=5)
    write_row(engine, SHARED, add=True, rateLimit=2, cache=0.0, perCaller=1, callerKey="bad")
    write_row(
        engine, ONLY_NAMED, rateLimit=1000, cache=0.0, perCaller=1, callerKey="vip", maxConcurrent=1
    )
    return limiter_db


def slots_admitted(lim: GatewayLimiter, url: str, key: str, calls: int) -> int:
    admitted = 0
    for _ in range(calls):
        try:
            with lim.slot(url, timeout=0, key=key):
                admitted += 1
        except Refused:
            pass
    return admitted


def test_a_named_callers_slots_obey_its_own_rate(lim: GatewayLimiter) -> None:
    # slot() routed without the key: "bad" got the per-caller row's 100/s, 50 of 50.
    assert slots_admitted(lim, SHARED, "bad", 50) == 2
    assert sum(lim.try_acquire(SHARED, timeout=0, key="bad") for _ in range(10)) == 0
    # another caller still has the per-caller row's 100/s and its cap of 5
    assert slots_admitted(lim, SHARED, "good", 20) == 20


def test_a_named_rows_cap_holds_and_is_counted(lim: GatewayLimiter) -> None:
    # Only a named row caps the interface: two nested slots of "vip" were both held,
    # and in_flight said None.
    assert lim.in_flight(ONLY_NAMED) == 0
    with lim.slot(ONLY_NAMED, key="vip") as held:
        assert held.in_flight == 1
        assert lim.in_flight(ONLY_NAMED) == 1
        with pytest.raises(Refused), lim.slot(ONLY_NAMED, timeout=0.05, key="vip"):
            pytest.fail("a second slot of vip beside the first")
    assert lim.in_flight(ONLY_NAMED) == 0
    with lim.slot(ONLY_NAMED, key="someone-else") as other:  # no row names it: not limited
        assert other.allowed and other.in_flight is None


async def test_the_asyncio_limiter_routes_slots_by_caller_alike(alim: AsyncGatewayLimiter) -> None:
    assert await alim.in_flight(ONLY_NAMED) == 0
    async with alim.slot(ONLY_NAMED, key="vip"):
        assert await alim.in_flight(ONLY_NAMED) == 1
        with pytest.raises(Refused):
            async with alim.slot(ONLY_NAMED, timeout=0.05, key="vip"):
                pytest.fail("a second slot of vip beside the first")
    admitted = 0
    for _ in range(20):
        try:
            async with alim.slot(SHARED, timeout=0, key="bad"):
                admitted += 1
        except Refused:
            pass
    assert admitted == 2
