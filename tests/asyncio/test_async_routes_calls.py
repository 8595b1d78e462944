"""The asyncio limiter decides exactly as the sync one: only limited calls reach Redis;
not configured, disabled rows and the switch off are admitted at once with no Redis
traffic; a closed row refuses; bad arguments name themselves. And a sync and an
asyncio process share one bucket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, InterfaceClosed, NotStarted
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine, upsert_conf
from tests.support.limiting import evalsha_calls, set_switch, write_row
from tests.support.services import RedisServer


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # 5 saved up, refilled at 1/s: a loaded host's stalls between the calls counted on
    # it refill nothing
    write_row(engine, "/limited", rateLimit=1, maxPermits=5, cache=0.0, status=1)
    write_row(engine, "/disabled", rateLimit=5, cache=0.0, status=0)
    write_row(engine, "/closed", rateLimit=0, cache=0.5, status=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 60}


async def test_unknown_disabled_and_switch_off_are_admitted_with_no_redis_traffic(
    alim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine], redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert all([await alim.try_acquire("/unknown", timeout=0) for _ in range(50)])
    assert all([await alim.try_acquire("/disabled", timeout=0) for _ in range(50)])
    assert await alim.acquire("/unknown") == 0.0
    assert evalsha_calls(redis_client) == before

    set_switch(migrated_db[1], 0)
    assert (await alim.reload()).switch is False
    assert all([await alim.try_acquire("/limited", timeout=0) for _ in range(50)])
    assert await alim.acquire("/limited", permits=100) == 0.0
    assert evalsha_calls(redis_client) == before


async def test_limited_interface_is_decided_by_redis(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    admitted = [await alim.try_acquire("/limited", timeout=0) for _ in range(8)]
    assert admitted == [True] * 5 + [False] * 3
    # Five round trips; the fifth reply said the next permit is a second away, so the three
    # callers who could not wait were refused in-process (exactly as Redis would).
    assert evalsha_calls(redis_client) == before + 5
    assert alim.local_refusals == 3


async def test_closed_interface_refuses_at_once_without_redis(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert not any([await alim.try_acquire("/closed") for _ in range(20)])
    with pytest.raises(InterfaceClosed, match="/closed"):
        await alim.acquire("/closed")
    assert evalsha_calls(redis_client) == before


async def test_caller_waits_within_the_rows_cache_budget(
    alim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    # 1 permit a second, 1 stored, 2.5 s of waiting accepted: the refill that a loaded
    # host's slow calls let in shortens each wait by the time the calls took, which is
    # measured, and would need half a second to let a third waiter in
    write_row(migrated_db[1], "/wait", rateLimit=1, maxPermits=1, cache=2.5, status=1)
    await alim.reload()
    start = time.monotonic()
    results = [await alim.reserve("/wait") for _ in range(4)]
    took = time.monotonic() - start
    waits = [v.wait_us / 1e6 for v in results if v.allowed]
    assert len(waits) == 3  # 1 stored + 2 that fit in 2.5 s (1 and 2 s)
    assert waits[0] == 0
    for wait, due in zip(waits[1:], (1.0, 2.0), strict=True):
        assert due - took - 0.02 <= wait <= due + 0.02
    assert not results[-1].allowed


async def test_a_rate_change_in_the_table_applies_after_reload(
    alim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    write_row(migrated_db[1], "/limited", rateLimit=50, cache=0.0, status=1)
    summary = await alim.reload()
    assert summary.changed == ("/limited",)
    assert alim.registry.snapshot.rules["/limited"].rate == 50


async def test_status_shows_the_shared_bucket(alim: AsyncGatewayLimiter) -> None:
    assert await alim.try_acquire("/limited", permits=3, timeout=0)
    [status] = await alim.status("/limited")
    assert status.shared and status.error is None
    assert status.stored == pytest.approx(2, abs=0.2)
    assert await alim.status("/unknown") == []
    assert [s.rule.url for s in await alim.status()] == ["/closed", "/limited"]


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"url": 5}, TypeError, "url"),
        ({"url": None}, TypeError, "url"),
        ({"permits": 0}, ValueError, "permits"),
        ({"permits": -3}, ValueError, "permits"),
        ({"permits": 1.5}, TypeError, "permits"),
        ({"permits": True}, TypeError, "permits"),
        ({"timeout": -0.1}, ValueError, "timeout"),
        ({"timeout": float("nan")}, ValueError, "timeout"),
        ({"timeout": "1"}, TypeError, "timeout"),
    ],
)
async def test_bad_arguments_raise_naming_the_argument(
    alim: AsyncGatewayLimiter, kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    call = {"url": "/limited", "permits": 1, "timeout": None} | kwargs
    with pytest.raises(error, match=names):
        await alim.try_acquire(call["url"], call["permits"], call["timeout"])  # type: ignore[arg-type]
    if "timeout" not in kwargs:
        with pytest.raises(error, match=names):
            await alim.acquire(call["url"], call["permits"])  # type: ignore[arg-type]


async def test_a_limiter_not_started_or_closed_says_so(sqlite_db: str) -> None:
    lim = AsyncGatewayLimiter(database_url=sqlite_db, redis_url="memory://")
    with pytest.raises(NotStarted, match="start"):
        await lim.try_acquire("/x")
    async with lim:
        assert await lim.try_acquire("/x")
    with pytest.raises(NotStarted, match="start"):
        await lim.acquire("/x")


async def test_memory_backend_needs_no_server(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    engine = make_engine(db)
    upgrade(engine)
    upsert_conf(engine, "/m", rate_limit=4, cache=0.5, status=1)
    engine.dispose()
    async with AsyncGatewayLimiter(database_url=db, redis_url="memory://") as lim:
        assert [await lim.try_acquire("/m", timeout=0) for _ in range(5)] == [True] * 4 + [False]
        assert await lim.acquire("/m") == pytest.approx(0.25, abs=0.03)
        [status] = await lim.status("/m")
        assert not status.shared


async def test_a_sync_and_an_asyncio_process_share_one_bucket(
    alim: AsyncGatewayLimiter,
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
) -> None:
    sync = GatewayLimiter(
        database_url=migrated_db[0], redis_url=redis_server.url, key_prefix=key_prefix
    )
    await asyncio.to_thread(sync.start)
    try:
        assert [sync.try_acquire("/limited", timeout=0) for _ in range(3)] == [True] * 3
        assert [await alim.try_acquire("/limited", timeout=0) for _ in range(3)] == [
            True,
            True,
            False,
        ]
        assert not sync.try_acquire("/limited", timeout=0)
    finally:
        await asyncio.to_thread(sync.close)


async def test_a_script_flushed_from_redis_is_loaded_again_not_an_error(
    alim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    assert await alim.try_acquire("/limited", timeout=0)
    redis_client.script_flush()
    assert await alim.try_acquire("/limited", timeout=0)  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA
    assert alim.backend_healthy
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_script|load"]["calls"] >= 1
