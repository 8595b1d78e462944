"""Cancelling a caller: CancelledError at once; the permits it reserved stay spent (the
documented choice: the supplier stays protected, later callers may wait a little
longer); a decision cancelled in flight leaves the limiter and its pool healthy; a
cancelled reload still completes in its thread."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.clocks import WatchedClock
from tests.support.limiting import evalsha_calls, write_row
from tests.support.services import RedisServer, mariadb_connection
from tests.support.waiting import wait_for_async

RATE = 10
#: CancelledError reaches the caller on the loop's next turn; allow a loaded host (its
#: sleep had ~0.45 s left: this still tells "at once" from "after the sleep").
PROMPT = 0.3

Waiter = Callable[[AsyncGatewayLimiter], Coroutine[Any, Any, object]]
WAITERS: dict[str, Waiter] = {
    "acquire": lambda lim: lim.acquire("/w", permits=5),
    "try_acquire": lambda lim: lim.try_acquire("/w", permits=5, timeout=2.0),
}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, "/w", rateLimit=RATE, cache=2.0, status=1)
    write_row(engine, "/quick", rateLimit=100_000, cache=0.0, status=1)
    return limiter_db


@pytest.fixture
def clock() -> WatchedClock:
    """Real sleeps (Redis' clock decides), and an event when a caller begins one."""
    return WatchedClock()


@pytest.fixture
def limiter_settings(clock: WatchedClock) -> dict[str, Any]:
    # no audit: its recording after the start's reload reads the limits table in a
    # thread of its own, and would be the session seen waiting for the test's lock
    return {"reload_interval": 60, "clock": clock, "audit_sql_changes": False}


async def sleeping(clock: WatchedClock) -> None:
    """Until a caller sleeps out its wait on ``clock`` (it has reserved its permits)."""
    await asyncio.wait_for(clock.sleeping.wait(), 10)


async def drain(lim: AsyncGatewayLimiter) -> None:
    """Spend the stored permits (until one is refused: a host that stalls between the
    calls refills a few more), so the next reservation must wait; less than one permit
    is left then."""
    for _ in range(10 * RATE):
        if not await lim.try_acquire("/w", timeout=0):
            return
    pytest.fail(f"{10 * RATE} calls at {RATE}/s never refused")


@pytest.mark.parametrize("call", list(WAITERS))
async def test_a_caller_cancelled_while_it_waits_gets_cancelled_error_at_once(
    call: str, alim: AsyncGatewayLimiter, clock: WatchedClock
) -> None:
    await drain(alim)
    waiter = asyncio.create_task(WAITERS[call](alim))
    await sleeping(clock)  # reserved 5 permits: due in ~0.5 s, sleeping
    assert not waiter.done()
    cancelled_at = time.monotonic()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert time.monotonic() - cancelled_at < PROMPT


@pytest.mark.parametrize("call", list(WAITERS))
async def test_the_permits_of_a_cancelled_caller_stay_spent(
    call: str, alim: AsyncGatewayLimiter, clock: WatchedClock
) -> None:
    drained_at = time.monotonic()  # the refill after the drain is at most what came since
    await drain(alim)
    waiter = asyncio.create_task(WAITERS[call](alim))
    await sleeping(clock)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter

    # The next caller queues behind the cancelled caller's 5 permits, then its own 1:
    # (6 - what the drain left, under one permit) / RATE less the refill since, about
    # 0.45-0.55 s. Had they been given back, it would wait at most 0.1 s.
    verdict = await alim.reserve("/w", timeout=None)
    assert verdict.allowed
    since = time.monotonic() - drained_at
    assert (5 / RATE) - since <= verdict.wait_us / 1e6 <= (5 + 1) / RATE + 1e-3


async def test_decisions_cancelled_in_flight_leave_the_limiter_healthy(
    alim: AsyncGatewayLimiter,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool_size = alim.settings.redis_pool_size
    clients_before = len(redis_client.client_list())
    with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
        for turns in range(4):  # cancel at different points: queued, sending, reading
            calls = [asyncio.create_task(alim.try_acquire("/quick")) for _ in range(200)]
            for _ in range(turns):
                await asyncio.sleep(0)  # a turn of the loop, not a wait
            for task in calls:
                task.cancel()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert all(o is True or isinstance(o, asyncio.CancelledError) for o in outcomes)

        # Cancellation is not a Redis failure, and nothing leaked: every slot and
        # connection came back, and the next decisions are made by Redis as usual.
        assert alim.backend_healthy
        before = evalsha_calls(redis_client)
        started = time.monotonic()
        assert all(await asyncio.gather(*(alim.try_acquire("/quick") for _ in range(300))))
        assert time.monotonic() - started < 5
        assert evalsha_calls(redis_client) - before == 300
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # connections dropped by cancellation were closed, not left open on the server
    await wait_for_async(
        lambda: len(redis_client.client_list()) <= clients_before + pool_size,
        5,
        "the dropped connections closed on the server",
    )


async def test_a_cancelled_reload_still_completes_in_its_thread(
    alim: AsyncGatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    _, engine = migrated_db
    database = engine.url.database
    assert database is not None
    locker = mariadb_connection(database)
    try:
        with locker.cursor() as cur:
            cur.execute("LOCK TABLES t_ratelimite_conf WRITE")
            cur.execute(
                "insert into t_ratelimite_conf (interfaceUrl, rateLimit, cache, status) "
                "values ('/late', 3, 0, 1)"
            )
        # the session seen waiting below is the reload's, in its thread: no other waits
        assert not waits_for_the_table(database)
        reload = asyncio.create_task(alim.reload())
        await wait_for_async(
            lambda: waits_for_the_table(database), 10, "the reload to wait for the lock"
        )
        cancelled_at = time.monotonic()
        reload.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reload
        assert time.monotonic() - cancelled_at < PROMPT  # the caller stops waiting at once
        assert "/late" not in alim.registry.snapshot.rules
        with locker.cursor() as cur:
            cur.execute("UNLOCK TABLES")
    finally:
        locker.close()

    # ... and the thread finishes the reload
    await wait_for_async(
        lambda: "/late" in alim.registry.snapshot.rules, 10, "the cancelled reload to complete"
    )


def waits_for_the_table(database: str) -> bool:
    """A session of ``database`` waits for a table lock (the reload's read, in its
    thread), as the server's process list tells."""
    watcher = mariadb_connection(database)
    try:
        with watcher.cursor() as cur:
            cur.execute(
                "select count(*) from information_schema.PROCESSLIST "
                "where DB = %s and STATE like 'Waiting for table%%'",
                (database,),
            )
            (waiting,) = cur.fetchone()
        return bool(waiting)
    finally:
        watcher.close()
