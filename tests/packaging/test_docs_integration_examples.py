"""The integrations guide's examples run as written, on a real MariaDB table and Redis.

The ASGI block is executed unchanged (settings from ``GATEWAY_LIMITER_*``, as a
deployment gives them), and the app it builds is served by uvicorn on loopback,
lifespan and all: the limiter starts in the lifespan, the middleware answers 429 past
the row's rate, and the limiter is closed at shutdown. The HTTP clients' block runs
with the ``limiter`` the getting-started page builds, on a closed interface: refused
before any request leaves, as it says."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.errors import NotStarted
from tests.support.deploy import limiter_env
from tests.support.limiting import write_row
from tests.support.services import RedisServer, free_port
from tests.support.waiting import wait_for_async

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "integrations.md"


def guide_block(showing: str) -> str:
    """The python block of the integrations guide that shows ``showing``."""
    section = PAGE.read_text(encoding="utf-8")
    blocks = [
        block
        for block in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
        if showing in block
    ]
    assert len(blocks) == 1, f"the integrations guide should show {showing} once"
    return str(blocks[0])


def test_http_clients_example_refuses_before_the_request(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], capsys: pytest.CaptureFixture[str]
) -> None:
    write_row(limiter_db[1], "/ibe/flight/search", rateLimit=0, cache=0.0)  # closed
    lim.reload()
    namespace: dict[str, Any] = {"__name__": "readme_example", "limiter": lim}
    exec(compile(guide_block("LimiterTransport"), str(PAGE), "exec"), namespace)
    assert capsys.readouterr().out == "closed None\n"  # refused: supplier.example never asked


async def test_asgi_example_starts_in_the_lifespan_and_limits_callers(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/ibe/flight/search", rateLimit=2, cache=0.0)
    for name, value in limiter_env(url, redis_server.url, key_prefix).items():
        if name.startswith("GATEWAY_LIMITER_"):  # as a deployment's environment gives them
            monkeypatch.setenv(name, value)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(guide_block("RateLimitMiddleware"), str(PAGE), "exec"), namespace)
    limiter: AsyncGatewayLimiter = namespace["async_limiter"]

    port = free_port()
    config = uvicorn.Config(namespace["app"], host="127.0.0.1", port=port, lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await wait_for_async(lambda: server.started or serving.done(), 10, "uvicorn to start")
        assert server.started, "uvicorn stopped before it started"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            answers = [
                await client.get("/ibe/flight/search", headers={"X-Api-Key": "alice"})
                for _ in range(3)
            ]
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
    # admitted: the app's own answer (it has no routes: 404), with the limit's headers
    assert [a.status_code for a in answers] == [404, 404, 429]
    assert answers[0].headers["x-ratelimit-limit"] == "2"
    assert "retry-after" in answers[2].headers
    with pytest.raises(NotStarted):  # closed by the lifespan's end
        await limiter.decide("/ibe/flight/search")
