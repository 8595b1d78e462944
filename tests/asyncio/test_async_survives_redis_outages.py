"""Redis killed, restarted, stopped or absent under asyncio load: callers see no
exception, no call waits much past the timeouts, the failure policy decides meanwhile,
and shared limiting resumes on its own. And a busy loop is not taken for a slow Redis."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import BackendUnavailable
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.state import bucket_key
from tests.support.limiting import evalsha_calls, write_row
from tests.support.services import RedisServer
from tests.support.waiting import wait_for_async

REDIS_TIMEOUT = 0.05
CONNECT_TIMEOUT = 0.3
#: Scheduling noise of a loaded 2-core host (seen: 0.33 s at a load average of 6).
NOISE = 0.45
#: A call on an open connection: the read timeout plus that noise.
CALL_BOUND = REDIS_TIMEOUT + NOISE
#: A call that must also open a connection (the breaker's probe after an outage).
CONNECT_BOUND = CONNECT_TIMEOUT + REDIS_TIMEOUT + NOISE


def limiter(db_url: str, server: RedisServer, prefix: str, **settings: Any) -> AsyncGatewayLimiter:
    defaults: dict[str, Any] = {
        "redis_timeout": REDIS_TIMEOUT,
        "redis_connect_timeout": CONNECT_TIMEOUT,
        "breaker_seconds": 0.3,
        "reload_interval": 60,
    }
    return AsyncGatewayLimiter(
        database_url=db_url, redis_url=server.url, key_prefix=prefix, **(defaults | settings)
    )


@dataclass
class Load:
    """Coroutines calling try_acquire(timeout=0) in a loop, outcomes and latency by phase."""

    lim: AsyncGatewayLimiter
    url: str
    phase: str = "before"
    errors: list[BaseException] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    outcomes: dict[str, list[bool]] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            phase = self.phase
            started = time.monotonic()
            try:
                ok = await self.lim.try_acquire(self.url, timeout=0)
            except Exception as e:  # any exception is the failure here
                self.errors.append(e)
                continue
            self.latencies.setdefault(phase, []).append(time.monotonic() - started)
            self.outcomes.setdefault(phase, []).append(ok)
            await asyncio.sleep(0.002)

    async def __aenter__(self) -> Load:
        self.tasks = [asyncio.create_task(self.run()) for _ in range(20)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def called(self, phase: str, calls: int = 20) -> bool:
        """At least ``calls`` decided in ``phase``."""
        return len(self.outcomes.get(phase, ())) >= calls

    def slowest(self, *phases: str) -> float:
        return max((t for p in phases for t in self.latencies.get(p, [])), default=0.0)


@pytest.fixture
async def db(migrated_db: tuple[str, Engine]) -> AsyncIterator[str]:
    url, engine = migrated_db
    write_row(engine, "/r", rateLimit=20, cache=0.0, status=1)
    write_row(engine, "/quick", rateLimit=100_000, cache=0.0, status=1)
    yield url


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["local", "allow", "deny"])
async def test_redis_killed_and_restarted_under_load(
    policy: str, db: str, private_redis: RedisServer, key_prefix: str
) -> None:
    lim = limiter(db, private_redis, key_prefix, on_backend_error=policy)
    async with lim, Load(lim, "/r") as load:
        await wait_for_async(lambda: load.called("before"), 5, "traffic decided on Redis")
        load.phase = "killing"  # calls may still reach Redis until it is dead
        await asyncio.to_thread(private_redis.kill)
        # Until the next permit the last reply named (50 ms at most), callers are
        # refused in-process as Redis would have refused them: nobody asks it yet.
        await wait_for_async(lambda: not lim.backend_healthy, 2)
        load.phase = "outage"
        await asyncio.sleep(1.5)  # real time: traffic through the outage, its bound counts 1.5 s
        load.phase = "after"
        await asyncio.to_thread(private_redis.start)
        await wait_for_async(lambda: lim.backend_healthy, 5)
        load.phase = "rejoined"
        started = time.monotonic()
        await asyncio.sleep(1.2)  # real time: traffic on Redis' bucket, bounded by its seconds
        rejoined_for = time.monotonic() - started

    assert load.errors == []
    # a killed server refuses connections at once: every call is quick
    assert load.slowest("before", "killing", "outage", "after", "rejoined") < CALL_BOUND
    outage = load.outcomes["outage"]
    if policy == "allow":
        assert all(outage)
    elif policy == "deny":
        assert not any(outage)
    else:  # local: the same limit, in this process alone, over ~1.5 s
        assert 5 <= sum(outage) <= 20 + 20 * 1.5 + 20 + 5
    # shared state resumed: the bucket lives in the restarted Redis ...
    assert private_redis.client().exists(bucket_key(key_prefix, "/r"))
    # ... and limits again: a fresh (full) bucket plus the rate, no more
    assert sum(load.outcomes["rejoined"]) <= 20 + 20 * (rejoined_for + CALL_BOUND)


@pytest.mark.slow
async def test_redis_that_stops_answering_costs_a_caller_about_redis_timeout(
    db: str, private_redis: RedisServer, key_prefix: str
) -> None:
    assert private_redis.proc is not None
    async with limiter(db, private_redis, key_prefix) as lim, Load(lim, "/quick") as load:
        await wait_for_async(lambda: load.called("before"), 5, "traffic decided on Redis")
        load.phase = "stopped"
        private_redis.proc.send_signal(signal.SIGSTOP)  # up, connected, silent
        try:
            await asyncio.sleep(1.0)  # real time: Redis silent for 1 s, the probes' bound counts it
        finally:
            private_redis.proc.send_signal(signal.SIGCONT)
        load.phase = "after"
        await wait_for_async(lambda: lim.backend_healthy, 5)
        await wait_for_async(lambda: load.called("after"), 5, "traffic decided on Redis again")

    assert load.errors == []
    stopped = load.latencies["stopped"]
    assert all(load.outcomes["stopped"])  # the local policy: 100,000/s admits them all
    # Calls in flight when Redis stopped waited about redis_timeout; queued ones gave up
    # with them. Only the breaker's probes (one per breaker_seconds) had to open a
    # connection, and so may take the connect timeout.
    assert max(stopped) < CONNECT_BOUND
    probes = 1.0 / 0.3 + 2
    assert sum(t > CALL_BOUND for t in stopped) <= probes
    assert load.slowest("before", "after") < CONNECT_BOUND


@pytest.mark.parametrize("warm", [True, False], ids=["open-connections", "new-connections"])
async def test_a_busy_loop_is_not_taken_for_a_slow_redis(
    warm: bool,
    db: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A timeout Redis itself meets even when a loaded host starves it of CPU for a while;
    # the loop is then held for four times as long.
    timeout = 0.3
    async with limiter(db, redis_server, key_prefix, redis_timeout=timeout) as lim:
        if warm:
            await asyncio.gather(*(lim.try_acquire("/quick") for _ in range(64)))
        before = evalsha_calls(redis_client)
        with caplog.at_level(logging.WARNING, logger="gateway_limiter"):
            calls = [asyncio.create_task(lim.try_acquire("/quick")) for _ in range(64)]
            await asyncio.sleep(0)  # they send their EVALSHAs (or start connecting) ...
            # real time: the application hogs the loop, what this test is about
            time.sleep(4 * timeout)
            admitted = await asyncio.gather(*calls)
        assert all(admitted)
        assert lim.backend_healthy
        assert evalsha_calls(redis_client) - before == 64  # all decided by Redis
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_start_with_redis_down_then_share_once_it_is_up(
    db: str, private_redis: RedisServer, key_prefix: str
) -> None:
    await asyncio.to_thread(private_redis.kill)
    async with limiter(db, private_redis, key_prefix) as lim:  # starts all the same
        assert not lim.backend_healthy
        started = time.monotonic()
        admitted = [await lim.try_acquire("/r", timeout=0) for _ in range(25)]
        span = time.monotonic() - started
        # the local policy: the same rule, a full bucket of 20 at 20/s, then refusals
        # (a host that stalls between the calls refills one more per 50 ms of it)
        assert admitted[:20] == [True] * 20
        assert 20 <= sum(admitted) <= 20 + math.ceil(20 * span)
        assert not admitted[-1] or span > 0.05
        await asyncio.to_thread(private_redis.start)

        async def probe() -> bool:
            await lim.try_acquire("/r", timeout=0)
            return lim.backend_healthy

        deadline = time.monotonic() + 5
        while not await probe():
            assert time.monotonic() < deadline, "never went back to Redis"
            await asyncio.sleep(0.05)
        assert private_redis.client().exists(bucket_key(key_prefix, "/r"))


async def test_deny_policy_refuses_and_acquire_says_why(
    db: str, private_redis: RedisServer, key_prefix: str
) -> None:
    async with limiter(db, private_redis, key_prefix, on_backend_error="deny") as lim:
        assert await lim.try_acquire("/r", timeout=0)
        await asyncio.to_thread(private_redis.kill)
        assert not await lim.try_acquire("/r", timeout=0)
        with pytest.raises(BackendUnavailable, match="deny"):
            await lim.acquire("/r")
        assert await lim.acquire("/not-limited") == 0.0  # no rule: no Redis needed
