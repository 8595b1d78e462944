"""The fleet's daily quota follows what the supplier says is left: a real HTTP supplier on
loopback keeps its own daily count, which callers outside the fleet spend too. Through
every client integration (httpx sync and async, requests, aiohttp), the fleet reads
``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` or the IETF ``RateLimit`` field and
stops where the supplier's quota ends: no request of the fleet gets a 429, and another
process of the fleet, which never saw a response, stops there too. A report only ever
lowers what is left."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, Refused
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.aiohttp import LimiterMiddleware
from gateway_limiter.integrations.httpx import AsyncLimiterTransport, LimiterTransport
from gateway_limiter.integrations.requests import LimiterAdapter
from gateway_limiter.model.calendar import Calendar
from tests.support.limiting import limiter, write_row
from tests.support.quota_supplier import QuotaSupplier

URL = "/ibe/daily/search"
ZONE = "Asia/Shanghai"
QUOTA = 50  # the supplier's, and the fleet's row: the same contract
OUTSIDE = 30  # spent by a caller outside the fleet, straight at the supplier


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"redis_timeout": 2.0, "reload_interval": 3600}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0)  # per second: never binds
    write_row(
        limiter_db[1], URL, add=True, rateLimit=QUOTA, cache=0, quotaPeriod="day", timeZone=ZONE
    )
    return limiter_db


@pytest.fixture(params=["x-ratelimit", "ietf"])
def supplier(request: pytest.FixtureRequest) -> Iterator[QuotaSupplier]:
    with QuotaSupplier(QUOTA, ZONE, ietf=request.param == "ietf") as running:
        with httpx.Client() as outside:  # not through the fleet: the supplier counts it all
            for _ in range(OUTSIDE):
                assert outside.get(running.url(URL)).status_code == 200
        yield running


@pytest.fixture
def other(
    limiter_db: tuple[str, Engine], limiter_redis_url: str, key_prefix: str
) -> Iterator[GatewayLimiter]:
    """Another process of the fleet: it decides, and never sees a response."""
    started = limiter(limiter_db[0], limiter_redis_url, key_prefix, redis_timeout=2.0)
    yield started
    started.close()


def spend(get: Callable[[str], int], supplier: QuotaSupplier, calls: int) -> tuple[int, int]:
    """``calls`` requests through the fleet: (answered 200, refused by the fleet)."""
    ok = refused = 0
    for _ in range(calls):
        try:
            status = get(supplier.url(URL))
        except Refused:
            refused += 1
        else:
            assert status == 200, status  # never the supplier's 429
            ok += 1
    return ok, refused


@pytest.fixture(params=["httpx", "requests"])
def get(request: pytest.FixtureRequest, lim: GatewayLimiter) -> Iterator[Callable[[str], int]]:
    if request.param == "httpx":
        with httpx.Client(transport=LimiterTransport(lim)) as client:
            yield lambda url: client.get(url).status_code
    else:
        with requests.Session() as session:
            session.mount("http://", LimiterAdapter(lim))
            yield lambda url: session.get(url, timeout=10).status_code


def test_the_fleet_stops_where_the_suppliers_shared_quota_ends(
    get: Callable[[str], int], supplier: QuotaSupplier, other: GatewayLimiter
) -> None:
    ok, refused = spend(get, supplier, QUOTA)
    assert (ok, refused) == (QUOTA - OUTSIDE, OUTSIDE)
    assert supplier.refused == 0  # the fleet never called past the supplier's quota
    assert supplier.spent == QUOTA
    # the rest of the fleet knows without a response of its own: one round trip reached it
    decision = other.decide(URL)
    assert not decision.allowed and decision.remaining == 0
    midnight = Calendar.of("day", ZONE).period_at(time.time())[1]
    assert decision.reset_at == midnight


@pytest.fixture(params=["httpx", "aiohttp"])
async def aget(
    request: pytest.FixtureRequest, alim: AsyncGatewayLimiter
) -> AsyncIterator[Callable[[str], Awaitable[int]]]:
    if request.param == "httpx":
        async with httpx.AsyncClient(transport=AsyncLimiterTransport(alim)) as client:

            async def get_httpx(url: str) -> int:
                return (await client.get(url)).status_code

            yield get_httpx
    else:
        async with aiohttp.ClientSession(middlewares=(LimiterMiddleware(alim),)) as session:

            async def get_aiohttp(url: str) -> int:
                async with session.get(url) as response:
                    await response.read()
                    return response.status

            yield get_aiohttp


async def test_asyncio_clients_stop_where_the_suppliers_shared_quota_ends(
    aget: Callable[[str], Awaitable[int]], supplier: QuotaSupplier, other: GatewayLimiter
) -> None:
    ok = refused = 0
    for _ in range(QUOTA):
        try:
            assert await aget(supplier.url(URL)) == 200
            ok += 1
        except Refused:
            refused += 1
    assert (ok, refused) == (QUOTA - OUTSIDE, OUTSIDE)
    assert supplier.refused == 0
    assert not other.decide(URL).allowed


def test_a_report_only_ever_lowers_what_is_left(lim: GatewayLimiter, other: GatewayLimiter) -> None:
    for _ in range(10):
        assert lim.try_acquire(URL)
    midnight = Calendar.of("day", ZONE).period_at(time.time())[1]
    # the supplier's count was reset, or it counts less: the fleet keeps its own
    assert lim.observe(URL, remaining=QUOTA, reset_at=midnight) == QUOTA - 10
    assert lim.observe(URL, remaining=45, reset_at=midnight) == QUOTA - 10
    # fewer left than the fleet thinks: the fleet follows, every process at once
    assert lim.observe(URL, remaining=3, reset_at=midnight) == 3
    assert other.decide(URL).remaining == 2
    assert lim.observe(URL, remaining=40, reset_at=midnight) == 2  # and never back up
    assert [other.try_acquire(URL), lim.try_acquire(URL), other.try_acquire(URL)] == [
        True,
        True,
        False,
    ]


def test_a_report_that_renews_before_the_day_ends_leaves_the_day_alone(
    lim: GatewayLimiter,
) -> None:
    assert lim.try_acquire(URL)
    # "0 left until a minute from now": a per-minute window of the supplier's, not its day
    assert lim.observe(URL, remaining=0, reset_at=time.time() + 60) == QUOTA - 1
    assert lim.try_acquire(URL)
    # without a renewal time, a report speaks of every quota
    assert lim.observe(URL, remaining=5) == 5
    # an interface without a calendar quota has nothing to follow
    assert lim.observe("/not/limited", remaining=0, reset_at=time.time() + 60) is None


def test_observe_names_a_bad_argument(lim: GatewayLimiter) -> None:
    with pytest.raises(TypeError, match="remaining"):
        lim.observe(URL, remaining="3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="remaining"):
        lim.observe(URL, remaining=-1)
    with pytest.raises(ValueError, match="reset_at"):
        lim.observe(URL, remaining=1, reset_at=float("nan"))
    with pytest.raises(TypeError, match="url"):
        lim.observe(b"/x", remaining=1)  # type: ignore[arg-type]
