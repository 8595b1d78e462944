"""The integrations decide each request in its class: ``priority=`` on the httpx and
requests clients (before a real loopback supplier) and the ASGI middleware's per-route
mapping (under a real uvicorn). A channel of 4 per minute keeps half for critical."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import requests
import uvicorn
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway_limiter import GatewayLimiter, Priority, Refused
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.asgi import RateLimitMiddleware
from gateway_limiter.integrations.httpx import LimiterTransport
from gateway_limiter.integrations.requests import LimiterAdapter
from tests.support.limiting import write_row
from tests.support.services import free_port
from tests.support.supplier import Supplier
from tests.support.waiting import wait_for_async

SEARCH, BOOK = "/c/search", "/c/book"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"redis_timeout": 2.0}  # a loaded box can miss the default 50 ms


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    # a minute's period: a loaded box cannot refill a permit between a test's calls
    engine = limiter_db[1]
    write_row(engine, "*", channelType="CLS", rateLimit=4, periodSeconds=60, reserve="default=0.5")
    write_row(engine, SEARCH, channelType="CLS", rateLimit=100, cache=0)
    write_row(engine, BOOK, channelType="CLS", rateLimit=100, cache=0)
    return limiter_db


def test_httpx_sends_each_request_in_the_class_it_is_given(lim: GatewayLimiter) -> None:
    with Supplier() as supplier:
        searches = httpx.Client(transport=LimiterTransport(lim))  # the row's class: default
        books = httpx.Client(transport=LimiterTransport(lim, priority=Priority.CRITICAL))
        with searches, books:
            assert [searches.get(supplier.url(SEARCH)).status_code for _ in range(2)] == [200] * 2
            with pytest.raises(Refused) as refused:
                searches.get(supplier.url(SEARCH))
            assert refused.value.decision.reason == "reserved"
            assert [books.get(supplier.url(BOOK)).status_code for _ in range(2)] == [200] * 2
        assert supplier.count(SEARCH) == 2 and supplier.count(BOOK) == 2


def test_requests_takes_a_function_of_the_request(lim: GatewayLimiter) -> None:
    def by_header(request: requests.PreparedRequest) -> str | None:
        value = request.headers.get("X-Class")
        return value if isinstance(value, str) else None

    with Supplier() as supplier, requests.Session() as session:
        session.mount("http://", LimiterAdapter(lim, priority=by_header))
        for _ in range(2):
            assert session.get(supplier.url(SEARCH)).status_code == 200
        with pytest.raises(Refused):
            session.get(supplier.url(SEARCH))
        critical = {"X-Class": "critical"}
        assert session.get(supplier.url(BOOK), headers=critical).status_code == 200
    with pytest.raises(ValueError, match="priority"):
        LimiterAdapter(lim, priority="urgent")


@pytest.fixture
async def gateway(alim: AsyncGatewayLimiter) -> AsyncIterator[str]:
    port = free_port()

    async def endpoint(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    routes = {BOOK: "critical"}  # the route's class; the others take their row's
    app = Starlette(
        routes=[Route(path, endpoint) for path in (SEARCH, BOOK)],
        middleware=[Middleware(RateLimitMiddleware, limiter=alim, priority=routes)],
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    await wait_for_async(lambda: server.started or serving.done(), 10, "uvicorn to start")
    assert server.started, "uvicorn stopped before it started"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


async def test_the_asgi_middleware_maps_routes_to_classes(gateway: str) -> None:
    async with httpx.AsyncClient(base_url=gateway) as client:
        searches = [(await client.get(SEARCH)).status_code for _ in range(3)]
        books = [(await client.get(BOOK)).status_code for _ in range(3)]
    assert searches == [200, 200, 429]
    assert books == [200, 200, 429]  # critical takes the reserve, then the cap is spent
