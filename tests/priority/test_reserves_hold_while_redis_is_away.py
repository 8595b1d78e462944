"""While Redis is away, the failure policy decides in-process with the same model, so
a class's reserve still holds: searches leave their share of the channel cap for
bookings (``on_backend_error = local``: the whole rule in this process)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from tests.support.limiting import write_row
from tests.support.services import free_port


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(
        engine,
        "*",
        channelType="AWAY",
        rateLimit=10,
        periodSeconds=10,
        cache=0.0,
        reserve="sheddable=0.5",
    )
    write_row(engine, "/a/search", channelType="AWAY", rateLimit=1000, priority="sheddable")
    write_row(engine, "/a/book", channelType="AWAY", rateLimit=1000, priority="critical")
    return limiter_db


@pytest.fixture
def limiter_redis_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"on_backend_error": "local", "redis_connect_timeout": 0.2}


def test_searches_leave_the_reserve_while_redis_is_away(lim: GatewayLimiter) -> None:
    searches = [lim.decide("/a/search", timeout=0) for _ in range(7)]
    assert [d.allowed for d in searches] == [True] * 5 + [False] * 2
    assert all(d.reason == "backend_fallback" for d in searches)
    assert sum(lim.try_acquire("/a/book", timeout=0) for _ in range(7)) == 5
