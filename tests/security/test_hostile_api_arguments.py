"""Any arguments to the public API: a decision, or TypeError/ValueError naming the argument.

Never another exception, never a caller's argument taken for a Redis outage (the
breaker stays closed, the failure policy never decides), never a Redis key outside the
prefix. The same for ``GatewayLimiter`` and ``AsyncGatewayLimiter``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, InterfaceClosed
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.state import bucket_key, window_key
from gateway_limiter.config.table import upsert_conf
from gateway_limiter.core.pipeline import MAX_PERMITS
from gateway_limiter.model.bucket import Verdict
from tests.support.limiting import scan_keys
from tests.support.services import RedisServer

#: url -> (rateLimit, algorithm, warmupPeriod); rates high enough that nothing waits long.
RULES = {
    "/tb": (1000, "token_bucket", None),
    "/sw": (5, "sliding_window", None),
    "/wu": (1000, "warm_up", 1.0),
    "/closed": (0, "token_bucket", None),
    "/q'uote {tag} é": (1000, "token_bucket", None),
}
LIMITED = [u for u, (rate, _, _) in RULES.items() if rate > 0]

NOT_A_NUMBER = st.one_of(
    st.none(), st.booleans(), st.text(max_size=4), st.binary(max_size=4), st.lists(st.none())
)
urls = st.one_of(
    st.sampled_from([*RULES, "/unknown"]),
    st.text(max_size=300),
    NOT_A_NUMBER,
    st.integers(),
)
permits = st.one_of(
    st.integers(1, 10),
    st.integers(-5, 5),
    st.integers(),
    st.just(MAX_PERMITS),
    st.just(MAX_PERMITS + 1),
    st.just(10**400),
    st.just(-(10**5000)),
    st.floats(),
    NOT_A_NUMBER,
)
timeouts = st.one_of(
    st.none(),
    st.floats(),
    st.floats(0, 1e300),
    st.integers(),
    st.just(10**400),
    NOT_A_NUMBER,
)

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def db_url(migrated_any_db: tuple[str, Engine]) -> str:
    url, engine = migrated_any_db
    for u, (rate, algorithm, warmup) in RULES.items():
        upsert_conf(
            engine,
            u,
            rate_limit=rate,
            cache=0.0,
            status=1,
            algorithm=algorithm,
            warmup_period=warmup,
        )
    return url


def options(server: RedisServer, prefix: str) -> dict[str, Any]:
    # A generous timeout: the property is about arguments, not a slow CI host.
    return {
        "redis_url": server.url,
        "key_prefix": prefix,
        "reload_interval": 3600,
        "redis_timeout": 2.0,
    }


@pytest.fixture
def lim(db_url: str, private_redis: RedisServer, key_prefix: str) -> Iterator[GatewayLimiter]:
    with GatewayLimiter(database_url=db_url, **options(private_redis, key_prefix)) as limiter:
        yield limiter


def expected_error(url: object, permits: object, timeout: object) -> type[Exception] | None:
    """What the Python API (docs/design.md) says these arguments must raise (None: a decision)."""
    if not isinstance(url, str):
        return TypeError
    if not isinstance(permits, int) or isinstance(permits, bool):
        return TypeError
    if not 1 <= permits <= MAX_PERMITS:
        return ValueError
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        return TypeError
    if not (timeout >= 0 and (isinstance(timeout, int) or math.isfinite(timeout))):
        return ValueError
    if isinstance(timeout, int) and timeout > 1e308:
        return ValueError
    return None


def named(error: Exception) -> bool:
    return any(name in str(error) for name in ("url", "permits", "timeout"))


def check_keys(server: RedisServer, prefix: str) -> None:
    allowed = {key(prefix, u) for u in LIMITED for key in (bucket_key, window_key)}
    keys = scan_keys(server.client())
    assert keys <= allowed, keys - allowed


@PROPERTY
@given(url=urls, permits=permits, timeout=timeouts)
def test_reserve_decides_or_names_the_bad_argument(
    lim: GatewayLimiter,
    private_redis: RedisServer,
    key_prefix: str,
    url: Any,
    permits: Any,
    timeout: Any,
) -> None:
    expected = expected_error(url, permits, timeout)
    if expected is None:
        assert isinstance(lim.reserve(url, permits, timeout), Verdict)
        # try_acquire only where no wait can be long: a budget of at most 10 ms
        if timeout is not None and timeout <= 0.01:
            assert isinstance(lim.try_acquire(url, permits, timeout), bool)
    else:
        with pytest.raises(expected) as error:
            lim.reserve(url, permits, timeout)
        assert named(error.value), error.value
        with pytest.raises(expected):
            lim.try_acquire(url, permits, timeout)
    # A caller's argument is never taken for an outage of Redis.
    assert lim.backend_healthy and lim.backend_fallbacks == 0
    check_keys(private_redis, key_prefix)


def acquire_error(url: object, permits: object) -> type[Exception] | None:
    """What ``acquire(url, permits)`` must raise; None when it may wait (for long)."""
    expected = expected_error(url, permits, None)
    if expected is not None:
        return expected
    if url == "/closed":
        return InterfaceClosed
    if url == "/sw" and isinstance(permits, int) and permits > RULES["/sw"][0]:
        return ValueError  # more than the window admits in any 1 s: never granted
    return None


@PROPERTY
@given(url=urls, permits=permits)
def test_acquire_waits_or_names_the_bad_argument(
    lim: GatewayLimiter, url: Any, permits: Any
) -> None:
    expected = acquire_error(url, permits)
    if expected is None:
        if url not in LIMITED:
            assert lim.acquire(url, permits) == 0.0  # not limited: at once
        return  # a real wait, which may be long: other tests time those
    with pytest.raises(expected) as error:
        lim.acquire(url, permits)
    assert expected is InterfaceClosed or named(error.value), error.value
    assert lim.backend_healthy and lim.backend_fallbacks == 0


_started: dict[tuple[str, str], AsyncGatewayLimiter] = {}


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    """One event loop across hypothesis examples (the async limiter belongs to one loop)."""
    with asyncio.Runner() as r:
        yield r
        while _started:
            _, lim = _started.popitem()
            r.run(lim.aclose())


async def started_async(db_url: str, server: RedisServer, prefix: str) -> AsyncGatewayLimiter:
    """One started asyncio limiter per test (examples share it, as a process would)."""
    lim = _started.get((db_url, prefix))
    if lim is None:
        lim = AsyncGatewayLimiter(database_url=db_url, **options(server, prefix))
        await lim.start()
        _started[(db_url, prefix)] = lim
    return lim


@PROPERTY
@given(url=urls, permits=permits, timeout=timeouts)
def test_the_asyncio_limiter_decides_or_names_the_bad_argument_alike(
    runner: asyncio.Runner,
    db_url: str,
    private_redis: RedisServer,
    key_prefix: str,
    url: Any,
    permits: Any,
    timeout: Any,
) -> None:
    lim = runner.run(started_async(db_url, private_redis, key_prefix))
    expected = expected_error(url, permits, timeout)
    expected_of_acquire = acquire_error(url, permits)

    async def check() -> None:
        if expected is None:
            assert isinstance(await lim.reserve(url, permits, timeout), Verdict)
            if timeout is not None and timeout <= 0.01:
                assert isinstance(await lim.try_acquire(url, permits, timeout), bool)
        else:
            with pytest.raises(expected) as error:
                await lim.reserve(url, permits, timeout)
            assert named(error.value), error.value
            with pytest.raises(expected):
                await lim.try_acquire(url, permits, timeout)
        if expected_of_acquire is not None:
            with pytest.raises(expected_of_acquire):
                await asyncio.wait_for(lim.acquire(url, permits), 5)

    runner.run(check())
    assert lim.backend_healthy
    check_keys(private_redis, key_prefix)


# --- what the properties found ---------------------------------------------------------


def test_an_int_timeout_too_large_for_a_float_is_a_value_error_not_an_overflow(
    lim: GatewayLimiter,
) -> None:
    # It passed the argument check (10**400 < inf), then raised OverflowError when
    # converted to microseconds.
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        lim.try_acquire("/tb", timeout=10**400)


def test_absurd_permits_are_refused_before_redis_and_do_not_open_the_breaker(
    lim: GatewayLimiter,
) -> None:
    # 10**20 permits made the script's SET ... PX overflow: Redis answered with an
    # error, the breaker opened, and for breaker_seconds every call of the process,
    # on every interface, went to the failure policy.
    with pytest.raises(ValueError, match=f"permits must be at most {MAX_PERMITS}"):
        lim.acquire("/tb", permits=10**20)
    assert lim.backend_healthy and lim.backend_fallbacks == 0
    assert lim.try_acquire("/tb", timeout=0)


async def test_acquire_more_than_a_sliding_window_admits_is_a_value_error_not_a_hang(
    lim: GatewayLimiter, db_url: str, private_redis: RedisServer, key_prefix: str
) -> None:
    # The window refuses 6 permits at 5/s forever: acquire slept for an infinite wait
    # (OverflowError from time.sleep; the asyncio limiter hung for ever).
    with pytest.raises(ValueError, match="permits must be at most 5 for '/sw'"):
        lim.acquire("/sw", permits=6)
    assert lim.acquire("/sw", permits=5) == 0.0
    async with AsyncGatewayLimiter(
        database_url=db_url, **options(private_redis, key_prefix)
    ) as alim:
        with pytest.raises(ValueError, match="permits must be at most 5 for '/sw'"):
            await asyncio.wait_for(alim.acquire("/sw", permits=6), 5)
