"""The client integrations (httpx sync and async, requests, aiohttp) on a real Redis and
MariaDB, calling a real HTTP supplier on loopback: each decides before the request
(a refusal raises ``Refused`` and never reaches the supplier) and tells the fleet what
a 429 or 503 said (``Retry-After`` seconds or date: a hold; none, or unreadable: the
effective rate halves)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import aiohttp
import httpx
import pytest
import requests
from sqlalchemy.engine import Engine

from gateway_limiter import GatewayLimiter, Refused
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.aiohttp import LimiterMiddleware
from gateway_limiter.integrations.httpx import AsyncLimiterTransport, LimiterTransport
from gateway_limiter.integrations.requests import LimiterAdapter
from tests.support.limiting import write_row
from tests.support.supplier import Supplier

# A minute's period: a loaded box cannot refill a permit between a test's calls.
LIMITED = "/supplier/limited"  # 2 permits a minute, no wait budget
PUSHED = "/supplier/pushed"  # 50 a second: room enough that only pushbacks refuse
OPEN = "/supplier/open"  # no row: not limited


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    # A loaded 2-core box can miss the default 50 ms; these tests are about what a
    # decision or a pushback does, not about a slow Redis.
    return {"redis_timeout": 2.0}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], LIMITED, rateLimit=2, periodSeconds=60, cache=0)
    write_row(limiter_db[1], PUSHED, rateLimit=50, cache=0)
    return limiter_db


@pytest.fixture
def supplier() -> Iterator[Supplier]:
    with Supplier() as running:
        yield running


#: One GET through an integration: the response's status, or Refused raised.
Get = Callable[[str], int]
AsyncGet = Callable[[str], Awaitable[int]]


@pytest.fixture(params=["httpx", "requests"])
def get(request: pytest.FixtureRequest, lim: GatewayLimiter) -> Iterator[Get]:
    """A threaded client through its integration, on ``lim``."""
    if request.param == "httpx":
        with httpx.Client(transport=LimiterTransport(lim)) as client:
            yield lambda url: client.get(url).status_code
    else:
        with requests.Session() as session:
            session.mount("http://", LimiterAdapter(lim))
            yield lambda url: session.get(url, timeout=10).status_code


@pytest.fixture(params=["httpx", "aiohttp"])
async def aget(
    request: pytest.FixtureRequest, alim: AsyncGatewayLimiter
) -> AsyncIterator[AsyncGet]:
    """An asyncio client through its integration, on ``alim``."""
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


def held_for(get: Get, supplier: Supplier, pushed: float, seconds: float, upto: float) -> None:
    """Calls on PUSHED are refused (and never reach the supplier) for at least ``seconds``
    after ``pushed``, and go again ``upto`` s after it. Checked well inside and well
    after the hold: on a loaded box the pushback's own round trip moves its start."""
    before = supplier.count(PUSHED)
    for at in (0.2, seconds - 0.8):
        # real time: inside the hold, on Redis' clock
        time.sleep(max(0.0, pushed + at - time.monotonic()))
        with pytest.raises(Refused) as refused:
            get(supplier.url(PUSHED))
        retry_after = refused.value.decision.retry_after
        assert retry_after is not None and 0 < retry_after <= upto
    assert supplier.count(PUSHED) == before
    # real time: past the hold, on Redis' clock
    time.sleep(max(0.0, pushed + upto + 0.5 - time.monotonic()))
    assert get(supplier.url(PUSHED)) == 200
    assert supplier.count(PUSHED) == before + 1


def test_a_refused_request_raises_refused_and_never_reaches_the_supplier(
    get: Get, supplier: Supplier
) -> None:
    assert [get(supplier.url(LIMITED)) for _ in range(2)] == [200, 200]
    with pytest.raises(Refused, match="/supplier/limited: refused \\(limited") as refused:
        get(supplier.url(LIMITED))
    decision = refused.value.decision
    assert decision.reason == "limited"
    # At most the 30 s to the next of 2 permits a minute (a local refusal may say less).
    assert decision.retry_after is not None and 0 < decision.retry_after <= 30.0
    assert decision.headers()["X-RateLimit-Limit"] == "2"
    assert supplier.count(LIMITED) == 2


async def test_asyncio_clients_refuse_before_the_supplier_too(
    aget: AsyncGet, supplier: Supplier
) -> None:
    assert [await aget(supplier.url(LIMITED)) for _ in range(2)] == [200, 200]
    with pytest.raises(Refused) as refused:
        await aget(supplier.url(LIMITED))
    assert refused.value.decision.reason == "limited"
    assert supplier.count(LIMITED) == 2


def test_an_unlimited_request_goes_through_and_pushes_nothing_back(
    get: Get, lim: GatewayLimiter, supplier: Supplier
) -> None:
    supplier.answer(429, {"Retry-After": "30"})
    assert [get(supplier.url(OPEN)) for _ in range(5)] == [429, 200, 200, 200, 200]
    assert supplier.count(OPEN) == 5
    assert lim.decide(PUSHED, timeout=0).allowed  # nothing was held back


def test_retry_after_seconds_hold_the_interface(
    get: Get, lim: GatewayLimiter, supplier: Supplier
) -> None:
    supplier.answer(429, {"Retry-After": "2"})
    pushed = time.monotonic()
    assert get(supplier.url(PUSHED)) == 429  # the caller gets the supplier's answer
    held_for(get, supplier, pushed, 2.0, 2.0)


def test_retry_after_as_an_http_date_holds_the_interface(
    get: Get, lim: GatewayLimiter, supplier: Supplier
) -> None:
    # Whole seconds: an HTTP date has no fraction, so the hold is 2 to 3 s from now.
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    supplier.answer(503, {"Retry-After": format_datetime(when, usegmt=True)})
    pushed = time.monotonic()
    assert get(supplier.url(PUSHED)) == 503
    held_for(get, supplier, pushed, 2.0, 3.0)


@pytest.mark.parametrize("header", [None, "soon", "-5", "99999999"])
def test_no_or_an_unreadable_retry_after_halves_the_rate_without_an_error(
    get: Get, lim: GatewayLimiter, supplier: Supplier, header: str | None
) -> None:
    assert lim.decide(PUSHED, timeout=0).effective_rate == 50
    supplier.answer(429, {} if header is None else {"Retry-After": header})
    assert get(supplier.url(PUSHED)) == 429
    decision = lim.decide(PUSHED, timeout=0)
    # Halved; it recovers by 2.5/s (5 % of 50): < 30 leaves a loaded box 2 s to get here.
    assert decision.effective_rate is not None and 25 <= decision.effective_rate < 30
    assert decision.allowed  # no hold: only the rate fell
    assert get(supplier.url(PUSHED)) == 200


async def test_asyncio_clients_push_back_retry_after_and_plain(
    aget: AsyncGet, alim: AsyncGatewayLimiter, supplier: Supplier
) -> None:
    supplier.answer(503)
    assert await aget(supplier.url(PUSHED)) == 503
    rate = (await alim.decide(PUSHED, timeout=0)).effective_rate
    assert rate is not None and 25 <= rate < 30
    supplier.answer(429, {"Retry-After": "2"})
    assert await aget(supplier.url(PUSHED)) == 429
    with pytest.raises(Refused) as refused:
        await aget(supplier.url(PUSHED))
    retry_after = refused.value.decision.retry_after
    assert retry_after is not None and 0 < retry_after <= 2.0
    assert supplier.count(PUSHED) == 2  # the 503 and the 429; not the refused one
