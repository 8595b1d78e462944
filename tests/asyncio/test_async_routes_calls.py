"""The asyncio limiter decides exactly as the sync one: only limited calls reach Redis;
not configured, disabled rows and the switch off are admitted at once with no Redis
traffic; a closed row refuses; bad arguments name themselves. And a sync and an
asyncio process share one bucket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, InterfaceClosed, NotStarted
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine, upsert_conf
from tests.support.limiting import evalsha_calls, set_row, set_switch
from tests.support.services import RedisServer


@pytest.fixture
async def lim(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> AsyncIterator[AsyncGatewayLimiter]:
    url, engine = migrated_db
    set_row(engine, "/limited", rate=5, cache=0.0, status=1)
    set_row(engine, "/disabled", rate=5, cache=0.0, status=0)
    set_row(engine, "/closed", rate=0, cache=0.5, status=1)
    async with AsyncGatewayLimiter(
        database_url=url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=60
    ) as lim:
        yield lim


async def test_unknown_disabled_and_switch_off_are_admitted_with_no_redis_traffic(
    lim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine], redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert all([await lim.try_acquire("/unknown", timeout=0) for _ in range(50)])
    assert all([await lim.try_acquire("/disabled", timeout=0) for _ in range(50)])
    assert await lim.acquire("/unknown") == 0.0
    assert evalsha_calls(redis_client) == before

    set_switch(migrated_db[1], 0)
    assert (await lim.reload()).switch is False
    assert all([await lim.try_acquire("/limited", timeout=0) for _ in range(50)])
    assert await lim.acquire("/limited", permits=100) == 0.0
    assert evalsha_calls(redis_client) == before


async def test_limited_interface_is_decided_by_redis(
    lim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    admitted = [await lim.try_acquire("/limited", timeout=0) for _ in range(8)]
    assert admitted == [True] * 5 + [False] * 3
    # Five round trips; the fifth reply said the next permit is 200 ms away, so the three
    # callers who could not wait were refused in-process (exactly as Redis would).
    assert evalsha_calls(redis_client) == before + 5
    assert lim.local_refusals == 3


async def test_closed_interface_refuses_at_once_without_redis(
    lim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert not any([await lim.try_acquire("/closed") for _ in range(20)])
    with pytest.raises(InterfaceClosed, match="/closed"):
        await lim.acquire("/closed")
    assert evalsha_calls(redis_client) == before


async def test_caller_waits_within_the_rows_cache_budget(
    lim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    set_row(migrated_db[1], "/wait", rate=10, cache=0.25, status=1)
    await lim.reload()
    results = [await lim.reserve("/wait") for _ in range(14)]
    waits = [v.wait / 1e6 for v in results if v.allowed]
    assert len(waits) == 12  # 10 stored + 2 that fit in 250 ms (100 and 200 ms)
    assert waits[-2:] == pytest.approx([0.1, 0.2], abs=0.02)
    assert not results[-1].allowed


async def test_a_rate_change_in_the_table_applies_after_reload(
    lim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    set_row(migrated_db[1], "/limited", rate=50, cache=0.0, status=1)
    summary = await lim.reload()
    assert summary.changed == ("/limited",)
    assert lim.registry.snapshot.rules["/limited"].rate == 50


async def test_status_shows_the_shared_bucket(lim: AsyncGatewayLimiter) -> None:
    assert await lim.try_acquire("/limited", permits=3, timeout=0)
    [status] = await lim.status("/limited")
    assert status.shared and status.error is None
    assert status.stored == pytest.approx(2, abs=0.2)
    assert await lim.status("/unknown") == []
    assert [s.rule.url for s in await lim.status()] == ["/closed", "/limited"]


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
    lim: AsyncGatewayLimiter, kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    call = {"url": "/limited", "permits": 1, "timeout": None} | kwargs
    with pytest.raises(error, match=names):
        await lim.try_acquire(call["url"], call["permits"], call["timeout"])  # type: ignore[arg-type]
    if "timeout" not in kwargs:
        with pytest.raises(error, match=names):
            await lim.acquire(call["url"], call["permits"])  # type: ignore[arg-type]


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
    lim: AsyncGatewayLimiter,
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
        assert [await lim.try_acquire("/limited", timeout=0) for _ in range(3)] == [
            True,
            True,
            False,
        ]
        assert not sync.try_acquire("/limited", timeout=0)
    finally:
        await asyncio.to_thread(sync.close)


async def test_a_script_flushed_from_redis_is_loaded_again_not_an_error(
    lim: AsyncGatewayLimiter, redis_client: redis.Redis
) -> None:
    assert await lim.try_acquire("/limited", timeout=0)
    redis_client.script_flush()
    assert await lim.try_acquire("/limited", timeout=0)  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA
    assert lim.backend_healthy
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_script|load"]["calls"] >= 1
