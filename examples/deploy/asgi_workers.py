"""An ASGI gateway under uvicorn or hypercorn workers: the limiter starts in the lifespan.

    uvicorn --workers 4 asgi_workers:app
    hypercorn --workers 4 asgi_workers:app

An ``AsyncGatewayLimiter`` belongs to the event loop it runs on, so each worker starts
its own in the app's lifespan, on the worker's loop, and closes it at shutdown (a
decision before ``start()`` raises ``NotStarted``, which the middleware would turn
into a 500 on every request). Building it at import is fine: it connects on first use.
Settings come from ``settings.toml`` or ``GATEWAY_LIMITER_*`` variables.

Every path is an interface (``RateLimitMiddleware``'s default): refused calls get 429
with ``Retry-After``; admitted ones reach the app, and both carry ``X-RateLimit-*``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.integrations.asgi import RateLimitMiddleware

limiter = AsyncGatewayLimiter.from_settings()


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    await limiter.start()  # in this worker, on its event loop
    try:
        yield
    finally:
        await limiter.aclose()  # leaves the fleet at once


async def answer(request: Request) -> JSONResponse:
    """What the supplier call would be: here, which process answered."""
    return JSONResponse({"pid": os.getpid(), "path": request.url.path})


app = Starlette(routes=[Route("/{path:path}", answer)], lifespan=lifespan)
app.add_middleware(RateLimitMiddleware, limiter=limiter)
