"""Rows with ``perCaller = 1``: each caller key gets its own limits, on a real Redis (and
the same in-process, as the ``local`` policy decides while Redis is down). Keys stay
under the prefix, in the interface's hash tag, bounded in length whatever the caller
key holds, and idle per-caller state expires."""

from __future__ import annotations

import time

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.base import Clocks
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.state import MAX_PLAIN_CALLER, caller_part
from gateway_limiter.config.rules import Rule
from tests.support.limiting import limiter, state_keys, write_row
from tests.support.services import RedisServer

#: Caller keys that must not be written into a Redis key as they are.
ODD_KEYS = [
    "x" * (MAX_PLAIN_CALLER + 1),
    "x" * 10_000,
    "two words",
    "line\nbreak",
    "{/other}",
    "nul\x00byte",
    "überall",
    "\ud800",  # a lone surrogate: not even valid UTF-8
    "*",
]


@pytest.fixture
def db(migrated_db: tuple[str, Engine]) -> Engine:
    engine = migrated_db[1]
    write_row(engine, "/each", rateLimit=2, cache=0.0, perCaller=1)
    # 3 per second for everyone together, 2 per second for each caller
    write_row(engine, "/both", rateLimit=3, cache=0.0)
    write_row(engine, "/both", add=True, rateLimit=2, cache=0.0, perCaller=1)
    write_row(engine, "/shared", rateLimit=2, cache=0.0)
    # per caller, two periods, a fixed window: 2 per 2 s window and 3 per minute each
    write_row(
        engine,
        "/mix",
        rateLimit=2,
        cache=0.0,
        perCaller=1,
        algorithm="fixed_window",
        periodSeconds=2,
    )
    write_row(engine, "/mix", add=True, rateLimit=3, cache=0.0, perCaller=1, periodSeconds=60)
    return engine


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine], db: Engine) -> tuple[str, Engine]:
    return limiter_db  # with the rows of ``db``


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    """The shared Redis, then memory:// (as the ``local`` policy decides)."""
    return redis_server.url if request.param == "redis" else "memory://"


def burst(lim: GatewayLimiter, url: str, key: str | None, n: int) -> list[bool]:
    return [lim.try_acquire(url, timeout=0, key=key) for _ in range(n)]


def test_each_caller_key_has_its_own_bucket(lim: GatewayLimiter) -> None:
    assert burst(lim, "/each", "10.0.0.1", 3) == [True, True, False]
    assert burst(lim, "/each", "10.0.0.2", 3) == [True, True, False]
    assert burst(lim, "/each", "2001:db8::1", 3) == [True, True, False]
    assert burst(lim, "/each", None, 3) == [True, True, False]  # no key: one caller too
    assert burst(lim, "/each", "", 1) == [False]  # ... the same as the empty key


def test_a_shared_limit_still_caps_all_callers_together(lim: GatewayLimiter) -> None:
    assert burst(lim, "/both", "a", 3) == [True, True, False]  # a's own 2
    assert burst(lim, "/both", "b", 2) == [True, False]  # the shared 3 are gone
    assert burst(lim, "/both", "c", 1) == [False]


def test_rows_that_are_not_per_caller_ignore_the_key(lim: GatewayLimiter) -> None:
    assert burst(lim, "/shared", "a", 1) + burst(lim, "/shared", "b", 2) == [True, True, False]


def test_per_caller_limits_combine_periods_and_windows_for_each_caller(
    lim: GatewayLimiter,
) -> None:
    assert burst(lim, "/mix", "a", 3) == [True, True, False]  # the 2 s window's 2
    assert burst(lim, "/mix", "b", 2) == [True, True]
    verdict = lim.reserve("/mix", timeout=3.0, key="a")  # a's next window, within 2 s
    assert verdict.allowed and 0 < verdict.wait_us <= 2_000_000
    # a's minute is now spent (3), whatever its windows allow
    assert not lim.reserve("/mix", timeout=5.0, key="a").allowed


@pytest.mark.parametrize("odd", ODD_KEYS, ids=range(len(ODD_KEYS)))
def test_odd_caller_keys_still_get_exactly_their_own_limit(lim: GatewayLimiter, odd: str) -> None:
    assert burst(lim, "/each", odd, 3) == [True, True, False]
    assert burst(lim, "/each", odd[:-1] or "y", 1) == [True]  # another key, another bucket


def test_a_key_that_is_not_a_string_is_refused_naming_the_argument(lim: GatewayLimiter) -> None:
    with pytest.raises(TypeError, match="key must be a string or None, got int"):
        lim.try_acquire("/each", key=7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be a string or None, got bytes"):
        lim.acquire("/each", key=b"a")  # type: ignore[arg-type]


def test_redis_keys_are_under_the_prefix_in_the_hash_tag_and_bounded(
    migrated_db: tuple[str, Engine], db: Engine, redis_server: RedisServer, key_prefix: str
) -> None:
    client: redis.Redis = redis_server.client()
    lim = limiter(migrated_db[0], redis_server.url, key_prefix)
    try:
        for key in [*ODD_KEYS, "10.0.0.1", None]:
            assert lim.try_acquire("/mix", timeout=0, key=key)
        keys = state_keys(client, key_prefix)
    finally:
        lim.close()
    assert len(keys) == 2 * (len(ODD_KEYS) + 2)  # two limits for each caller
    base = f"{key_prefix}:{{/mix}}:"
    assert all(k.startswith(base) for k in keys)
    longest = len(base) + len("tb:60s") + len(caller_part("x" * MAX_PLAIN_CALLER))
    assert max(len(k) for k in keys) <= longest
    assert all(k.isprintable() and " " not in k for k in keys)
    assert f"{base}tb:60s:k=10.0.0.1" in keys  # plain keys stay readable
    assert f"{base}fw:2s:k=" in keys  # no key
    hashed = [k for k in keys if ":k#" in k]
    assert len(hashed) == 2 * len(ODD_KEYS)
    assert all(len(k.rsplit(":k#", 1)[1]) == 40 for k in hashed)  # sha1 hex


def test_idle_per_caller_state_expires(
    migrated_db: tuple[str, Engine], db: Engine, redis_server: RedisServer, key_prefix: str
) -> None:
    client: redis.Redis = redis_server.client()
    lim = limiter(migrated_db[0], redis_server.url, key_prefix)
    try:
        assert lim.try_acquire("/each", timeout=0, key="idle")
        assert lim.try_acquire("/mix", timeout=0, key="idle")
    finally:
        lim.close()
    each = f"{key_prefix}:{{/each}}:tb:k=idle"
    # one permit of 2/s refills in 0.5 s; the key lives that long plus 1 s of grace
    assert 0 < client.pttl(each) <= 500 + 1000
    # the fixed window's counter goes with its 2 s window, the minute's bucket once full
    assert 0 < client.pttl(f"{key_prefix}:{{/mix}}:fw:2s:k=idle") <= 2000 + 1000
    assert 0 < client.pttl(f"{key_prefix}:{{/mix}}:tb:60s:k=idle") <= 20_000 + 1000


def test_the_local_policy_keeps_per_caller_limits_while_redis_is_down(
    migrated_db: tuple[str, Engine], db: Engine, private_redis: RedisServer, key_prefix: str
) -> None:
    lim = limiter(
        migrated_db[0], private_redis.url, key_prefix, breaker_seconds=60, on_backend_error="local"
    )
    try:
        assert burst(lim, "/both", "a", 1) == [True]  # on Redis
        private_redis.kill()
        assert burst(lim, "/both", "a", 3) == [True, True, False]  # in-process: a's own 2
        assert burst(lim, "/both", "b", 2) == [True, False]  # ... and the shared 3
        assert not lim.backend_healthy
        assert lim.backend_fallbacks == 5  # every call since the kill
    finally:
        lim.close()


def test_memory_state_per_caller_is_bounded_least_recently_used_first_out() -> None:
    now = [1e12]
    memory = MemoryBackend(clocks=Clocks(lambda: now[0]), max_callers=3)
    rule = Rule("/each", 2, 0.0, 1, per_caller=True)
    shared = Rule("/shared", 2, 0.0, 2)
    assert memory.reserve(shared, 2, 0.0).allowed
    for key in ("a", "b", "c"):
        assert memory.reserve(rule, 2, 0.0, key).allowed
    assert not memory.reserve(rule, 1, 0.0, "a").allowed  # refused, yet used: most recent
    assert memory.reserve(rule, 2, 0.0, "d").allowed  # pushes out b, the least recent
    assert len(memory) == 1 + 3
    assert memory.reserve(rule, 2, 0.0, "b").allowed  # b forgotten: a full bucket again
    assert not memory.reserve(rule, 1, 0.0, "a").allowed  # a kept its state
    assert not memory.reserve(shared, 1, 0.0).allowed  # shared state never evicted


async def test_the_asyncio_limiter_takes_a_key_too(alim: AsyncGatewayLimiter) -> None:
    assert [await alim.try_acquire("/both", timeout=0, key="a") for _ in range(3)] == [
        True,
        True,
        False,
    ]
    assert [await alim.try_acquire("/both", timeout=0, key="b") for _ in range(2)] == [
        True,
        False,
    ]
    assert (await alim.reserve("/each", key="c")).allowed
    started = time.monotonic()
    assert await alim.acquire("/each", permits=2, key="c") == pytest.approx(0.5, abs=0.1)
    assert time.monotonic() - started >= 0.35
    with pytest.raises(TypeError, match="key must be a string or None"):
        await alim.try_acquire("/each", key=1.5)  # type: ignore[arg-type]
