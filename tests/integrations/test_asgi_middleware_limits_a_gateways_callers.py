"""``RateLimitMiddleware``: a Starlette app served by uvicorn on loopback limits its own
callers with a real ``AsyncGatewayLimiter`` (Redis, MariaDB): a refused request gets
429 with Retry-After and the X-RateLimit headers and never reaches the app; an
admitted one gets the app's answer with the headers added; per-caller rows key on a
header; an unlimited path is untouched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy.engine import Engine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.asgi import RateLimitMiddleware, header_key
from tests.support.limiting import write_row
from tests.support.services import free_port
from tests.support.waiting import wait_for_async

# A minute's period: a loaded box cannot refill a permit between a test's calls.
SEARCH = "/api/search"  # 2 a minute for everyone, no wait budget
MINE = "/api/mine"  # 1 a minute per caller (x-api-key)
OPEN = "/api/open"  # no row


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"redis_timeout": 2.0}  # a loaded box can miss the default 50 ms


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], SEARCH, rateLimit=2, periodSeconds=60, cache=0)
    write_row(limiter_db[1], MINE, rateLimit=1, periodSeconds=60, cache=0, perCaller=1)
    return limiter_db


class Gateway:
    """The served app, and what reached it."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.seen: list[str] = []


@pytest.fixture
async def gateway(alim: AsyncGatewayLimiter) -> AsyncIterator[Gateway]:
    port = free_port()
    gateway = Gateway(f"http://127.0.0.1:{port}")

    async def endpoint(request: Request) -> PlainTextResponse:
        gateway.seen.append(request.url.path)
        return PlainTextResponse("ok", headers={"X-App": "yes"})

    app = Starlette(
        routes=[Route(path, endpoint) for path in (SEARCH, MINE, OPEN)],
        middleware=[Middleware(RateLimitMiddleware, limiter=alim, key=header_key("X-Api-Key"))],
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    await wait_for_async(lambda: server.started or serving.done(), 10, "uvicorn to start")
    assert server.started, "uvicorn stopped before it started"
    try:
        yield gateway
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


async def test_admitted_calls_get_the_apps_answer_with_the_rate_limit_headers(
    gateway: Gateway,
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base) as client:
        first, second = [await client.get(SEARCH) for _ in range(2)]
    for response in (first, second):
        assert response.status_code == 200
        assert response.text == "ok"
        assert response.headers["X-App"] == "yes"
        assert response.headers["X-RateLimit-Limit"] == "2"
        assert "Retry-After" not in response.headers
    assert int(first.headers["X-RateLimit-Remaining"]) == 1
    assert int(second.headers["X-RateLimit-Remaining"]) == 0
    assert gateway.seen == [SEARCH, SEARCH]


async def test_a_refused_call_gets_429_with_retry_after_and_never_reaches_the_app(
    gateway: Gateway,
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base) as client:
        answers = [await client.get(SEARCH) for _ in range(3)]
    refused = answers[2]
    assert [a.status_code for a in answers] == [200, 200, 429]
    # Whole seconds, at least 1 and at most the 30 s to the next of 2 permits a minute
    # (a local refusal may say less for now: core/'s local-refusal Retry-After).
    assert 1 <= int(refused.headers["Retry-After"]) <= 30
    assert refused.headers["X-RateLimit-Limit"] == "2"
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    assert refused.headers["Content-Type"].startswith("text/plain")
    assert "Too Many Requests: /api/search (limited)" in refused.text
    assert "X-App" not in refused.headers
    assert gateway.seen == [SEARCH, SEARCH]


async def test_a_per_caller_row_keys_on_the_header(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.base) as client:
        a1 = await client.get(MINE, headers={"X-Api-Key": "alice"})
        a2 = await client.get(MINE, headers={"X-Api-Key": "alice"})
        b1 = await client.get(MINE, headers={"X-Api-Key": "bob"})
    assert [a1.status_code, a2.status_code, b1.status_code] == [200, 429, 200]
    assert gateway.seen == [MINE, MINE]


async def test_an_unlimited_path_is_left_as_the_app_made_it(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.base) as client:
        answers = [await client.get(OPEN) for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    assert not any(h.lower().startswith("x-ratelimit") for a in answers for h in a.headers)
    assert gateway.seen == [OPEN] * 5
