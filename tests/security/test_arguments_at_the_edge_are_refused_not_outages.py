"""Arguments that pass the type checks but that an interface cannot serve are refused
with a ValueError naming them, before anything is reserved; never taken for a Redis
outage (the breaker stays closed, the failure policy decides nothing). On a real Redis."""

from __future__ import annotations

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import BackendUnavailable, GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.connections import call_error
from gateway_limiter.core.failure import script_fault
from gateway_limiter.core.pipeline import MAX_PERMITS, MAX_WINDOW_PERMITS
from tests.support.limiting import write_row
from tests.support.services import RedisServer, free_port

DAY = "/edge/one-a-day"  # 1 per 86,400 s
THOUSAND = "/edge/thousand-a-day"
WINDOW = "/edge/window"  # a sliding window of 2,000,000 per second
OTHER = "/edge/other"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, DAY, rateLimit=1, cache=0.0, periodSeconds=86_400)
    write_row(engine, THOUSAND, rateLimit=1000, cache=0.0, periodSeconds=86_400)
    write_row(engine, WINDOW, rateLimit=2_000_000, cache=0.0, algorithm="sliding_window")
    write_row(engine, OTHER, rateLimit=1000, cache=0.0)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, object]:
    return {"redis_timeout": 2.0, "redis_timeout_ceiling": 2.0}


def healthy(lim: GatewayLimiter | AsyncGatewayLimiter) -> bool:
    return lim.backend_healthy and lim.backend_fallbacks == 0


def test_permits_a_limit_refills_in_more_than_a_year_are_refused_naming_them(
    lim: GatewayLimiter,
) -> None:
    # The reservation's key expiry overflowed what Redis takes: the script failed, the
    # breaker opened, and an unrelated interface was decided by the failure policy.
    with pytest.raises(ValueError, match=r"permits must be at most 365 for '/edge/one-a-day'"):
        lim.reserve(DAY, permits=MAX_PERMITS, timeout=1e16)
    assert healthy(lim)
    assert lim.decide(OTHER, timeout=0).reason == "admitted"
    # A year's worth is served; a budget beyond a year counts as a year.
    assert lim.reserve(DAY, permits=365, timeout=1e16).allowed
    assert not lim.reserve(DAY, permits=365, timeout=1e16).allowed  # two years away
    assert healthy(lim)


def test_acquire_beyond_a_year_is_refused_before_reserving(lim: GatewayLimiter) -> None:
    # acquire reserved the debt, then time.sleep raised OverflowError.
    with pytest.raises(ValueError, match=r"permits must be at most 365000 for"):
        lim.acquire(THOUSAND, permits=MAX_PERMITS)
    assert lim.try_acquire(THOUSAND, timeout=0)  # nothing was reserved
    assert healthy(lim)


def test_permits_on_a_sliding_window_are_bounded_so_one_call_never_stalls_redis(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    # permits=1_000_000 pushed a million list entries in one script: every other
    # client of that Redis waited over a second.
    with pytest.raises(ValueError, match=f"permits must be at most {MAX_WINDOW_PERMITS} for"):
        lim.decide(WINDOW, permits=1_000_000)
    assert lim.decide(WINDOW, permits=MAX_WINDOW_PERMITS, timeout=0).allowed
    assert healthy(lim)
    (key,) = [k for k in redis_client.scan_iter(f"{key_prefix}:*") if b":sw" in k]
    assert redis_client.llen(key) == MAX_WINDOW_PERMITS


async def test_the_asyncio_limiter_refuses_them_alike(alim: AsyncGatewayLimiter) -> None:
    with pytest.raises(ValueError, match="permits must be at most 365 for"):
        await alim.reserve(DAY, permits=MAX_PERMITS, timeout=1e16)
    with pytest.raises(ValueError, match=f"permits must be at most {MAX_WINDOW_PERMITS}"):
        await alim.acquire(WINDOW, permits=MAX_WINDOW_PERMITS + 1)
    assert healthy(alim)


def test_a_script_that_fails_on_its_values_is_told_from_redis_failing(
    redis_server: RedisServer,
) -> None:
    # What Redis answers when a script's own command fails on a value (a PX too large)
    # is the call's fault: the breaker must not open for it.
    client = redis_server.client()
    script = "return redis.call('SET', KEYS[1], 'x', 'PX', ARGV[1])"
    with pytest.raises(redis.ResponseError) as raised:
        client.eval(script, 1, "edge:px", "1e20")
    assert script_fault(call_error(raised.value))
    with pytest.raises(redis.ResponseError) as raised:
        client.eval("return 1 + nil", 0)
    assert script_fault(call_error(raised.value))
    assert not script_fault(BackendError("ConnectionError: Error 111 connecting"))
    assert not script_fault(BackendError("TimeoutError: Timeout reading from socket"))
    oom = "ResponseError: OOM command not allowed when used memory > 'maxmemory'. @user_script:1"
    assert not script_fault(BackendError(oom))


def test_a_script_failing_on_one_calls_values_leaves_the_breaker_closed(
    lim: GatewayLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were a value to slip past the checks, Redis still answered: that one call goes to
    # the failure policy, every other call stays on Redis.
    monkeypatch.setattr("gateway_limiter.core.pipeline.check_permits", lambda *_: None)
    monkeypatch.setattr("gateway_limiter.core.pipeline.MAX_WAIT_S", 1e300)
    lim.reserve(DAY, permits=MAX_PERMITS, timeout=1e16)  # the script fails on its PX
    assert lim.backend_healthy
    assert lim.decide(OTHER, timeout=0).reason == "admitted"


@pytest.fixture
def away_redis_url() -> str:
    return f"redis://127.0.0.1:{free_port()}"


def test_acquire_beyond_a_windows_share_during_an_outage_says_so(
    limiter_db: tuple[str, Engine], away_redis_url: str, key_prefix: str
) -> None:
    # A window of 10 shared out to 2 per process (5 processes) while Redis is away:
    # acquire(permits=5) raised "permits must be at most 10 ... got 5".
    write_row(limiter_db[1], "/edge/w10", rateLimit=10, cache=0.0, algorithm="sliding_window")
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=away_redis_url,
        key_prefix=key_prefix,
        fleet_size=5,
        reload_interval=3600,
    ) as lim:
        with pytest.raises(BackendUnavailable, match=r"holds at most 2 permits .*: got 5"):
            lim.acquire("/edge/w10", permits=5)
        with pytest.raises(ValueError, match="permits must be at most 10 for"):
            lim.acquire("/edge/w10", permits=11)  # more than the window itself: as ever
