#!/usr/bin/env python
"""An asyncio gateway: it limits its own callers (ASGI middleware) and its calls to the
supplier (aiohttp client middleware), with one ``AsyncGatewayLimiter``.

Runs as written: a Starlette app served by uvicorn on a free loopback port, a supplier
on another, the limits in a SQLite file in a temporary folder and the buckets in this
process (``memory://``); ``--database-url`` and ``--redis-url`` point it at MySQL and
Redis.

    pip install 'gateway-limiter[asgi,aiohttp]' uvicorn
    python examples/asgi_gateway_and_aiohttp_client.py

What it shows:

1. ``RateLimitMiddleware`` on ``/search``, a limit of 2 calls a minute per caller
   (the ``X-Api-Key`` header): alice's third call is answered 429 with Retry-After and
   X-RateLimit-* by the middleware, and never reaches the app; bob still has his own.
2. The app calls the supplier through ``aiohttp`` with ``LimiterMiddleware``: the
   supplier's 503 lowers the interface's effective rate for the whole fleet, which
   the next decision reports.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import aiohttp
import httpx
import uvicorn
from aiohttp import web
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway_limiter import admin
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.aiohttp import LimiterMiddleware
from gateway_limiter.integrations.asgi import RateLimitMiddleware, header_key

SEARCH = "/search"  # the gateway's own interface: 2 a minute per caller
AVAILABILITY = "/supplier/availability"  # the supplier's: 20 a second


async def start_supplier() -> tuple[web.AppRunner, str]:
    """The supplier: 503 to its first call (it is busy), 200 after."""
    calls = 0

    async def availability(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=503 if calls == 1 else 200, text="seats: 4\n")

    app = web.Application()
    app.router.add_get(AVAILABILITY, availability)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def main() -> None:
    parser = argparse.ArgumentParser(description="ASGI and aiohttp through the limiter")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary folder")
    parser.add_argument("--redis-url", default="memory://", help="default: memory://")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gateway-limiter-example-") as folder:
        database_url = args.database_url or f"sqlite:///{Path(folder) / 'limits.db'}"
        admin.upgrade(database_url)
        admin.set_limit(database_url, SEARCH, rate=2, period_seconds=60, cache=0, per_caller=True)
        admin.set_limit(database_url, AVAILABILITY, rate=20, cache=0)
        supplier, supplier_base = await start_supplier()
        limiter = AsyncGatewayLimiter(database_url=database_url, redis_url=args.redis_url)
        await limiter.start()
        session = aiohttp.ClientSession(middlewares=(LimiterMiddleware(limiter),))

        async def search(request: Request) -> PlainTextResponse:
            async with session.get(supplier_base + AVAILABILITY) as answer:
                return PlainTextResponse(f"supplier said {answer.status}\n")

        app = Starlette(
            routes=[Route(SEARCH, search)],
            middleware=[
                Middleware(RateLimitMiddleware, limiter=limiter, key=header_key("X-Api-Key"))
            ],
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for caller in ("alice", "alice", "alice", "bob"):
                    answer = await client.get(SEARCH, headers={"X-Api-Key": caller})
                    shown = {k: v for k, v in answer.headers.items() if k.startswith("x-rate")}
                    if answer.status_code == 429:
                        shown["retry-after"] = answer.headers["retry-after"]
                    print(f"{caller:5} -> {answer.status_code} {answer.text.strip()!r} {shown}")
            decision = await limiter.decide(AVAILABILITY)
            print(
                f"{AVAILABILITY}: effective rate {decision.effective_rate:.3g} of "
                f"{decision.limit} a second after the supplier's 503"
            )
        finally:
            server.should_exit = True
            await serving
            await session.close()
            await limiter.aclose()
            await supplier.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
