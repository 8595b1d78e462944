"""``decide`` answers with the whole Decision, one reason per outcome, and its HTTP headers.

Every outcome runs on a real MariaDB table and a real Redis; the Redis traffic of the
outcomes that must not touch Redis is counted on the server.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.core.decision import Decision
from tests.support.limiting import evalsha_calls, limiter, set_switch, write_row
from tests.support.services import RedisServer


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, "/lim", rateLimit=5, cache=0.0, status=1)
    # 10 saved up, then a permit every 0.5 s: a loaded host's stalls between the calls
    # counted on it refill nothing that would change what they show
    write_row(engine, "/wait", rateLimit=2, maxPermits=10, cache=1.25, status=1)
    write_row(engine, "/closed", rateLimit=0, cache=0.5, status=1)
    write_row(engine, "/disabled", rateLimit=5, cache=0.0, status=0)
    write_row(engine, "/shadow", rateLimit=2, cache=0.0, status=1, shadow=1)
    write_row(engine, "/shadow-closed", rateLimit=0, cache=0.0, status=1, shadow=1)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


def test_admitted_calls_count_permits_down_and_a_refusal_says_when_to_retry(
    lim: GatewayLimiter,
) -> None:
    decisions = [lim.decide("/lim") for _ in range(8)]
    admitted = [d for d in decisions if d.allowed]
    refused = [d for d in decisions if not d.allowed]

    first = decisions[0]
    assert first == Decision(
        True, "admitted", 0.0, None, 4, 5, False, 5.0, priority="default"
    )  # 5 stored, 1 taken
    assert first.headers() == {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4"}
    assert {d.reason for d in admitted} == {"admitted"}
    assert all(0 <= (d.remaining or 0) <= 4 and d.waited == 0.0 for d in admitted)
    assert len(admitted) >= 5 and refused  # a stalled host may refill one more
    last = refused[-1]
    assert (last.reason, last.remaining, last.limit, last.waited) == ("limited", 0, 5, 0.0)
    # The next permit is at most one interval (1/5 s) away; the budget is 0.
    assert last.retry_after is not None and 0 < last.retry_after <= 0.2
    assert last.headers() == {
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "0",
        "Retry-After": "1",  # whole seconds, rounded up
    }


def test_a_call_that_waited_says_how_long_and_a_refusal_counts_its_budget(
    lim: GatewayLimiter,
) -> None:
    for _ in range(10):
        assert lim.decide("/wait").waited == 0.0
    began = time.monotonic()
    waited = lim.decide("/wait")  # 2/s, stored permits gone: about 0.5 s
    took = time.monotonic() - began
    assert waited.allowed and waited.reason == "admitted"
    assert 0 < waited.waited <= 0.5  # less whatever refilled while the first ten ran
    assert took >= waited.waited - 0.005  # the call did sleep it out
    assert waited.remaining == 0

    for _ in range(3):  # queue 1.5 s of debt without sleeping it
        assert lim.reserve("/wait", timeout=5).allowed
    refused = lim.decide("/wait")  # would wait about 2 s, the budget is 1.25 s
    assert (refused.allowed, refused.reason, refused.waited) == (False, "limited", 0.0)
    assert refused.retry_after is not None and 0 < refused.retry_after <= 0.75
    assert refused.headers()["Retry-After"] == "1"


def test_closed_refuses_without_redis_and_without_a_retry_time(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    closed = lim.decide("/closed")
    assert closed == Decision(False, "closed", 0.0, None, 0, 0, False, 0.0, priority="default")
    # Waiting cannot help a closed interface: no Retry-After.
    assert closed.headers() == {"X-RateLimit-Limit": "0", "X-RateLimit-Remaining": "0"}
    assert evalsha_calls(redis_client) == before


def test_unlimited_calls_say_why_and_carry_no_headers(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine], redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert lim.decide("/disabled") == Decision(True, "disabled")
    assert lim.decide("/nowhere") == Decision(True, "not_configured")
    assert lim.decide("/disabled").headers() == {}
    assert lim.decide("/nowhere").headers() == {}

    set_switch(migrated_db[1], 0)
    lim.reload()
    for url in ("/lim", "/closed", "/disabled", "/nowhere"):
        assert lim.decide(url) == Decision(True, "switch_off")
    assert evalsha_calls(redis_client) == before


def test_shadow_rules_admit_at_once_what_they_would_refuse_and_show_no_headers(
    lim: GatewayLimiter,
) -> None:
    decisions = [lim.decide("/shadow") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True] * 4
    assert [d.reason for d in decisions[:2]] == ["admitted", "admitted"]
    assert [d.reason for d in decisions[2:]] == ["shadow", "shadow"]
    assert all(d.shadow and d.limit == 2 and d.retry_after is None for d in decisions)
    assert all(d.headers() == {} for d in decisions)  # a limit on trial is invisible

    shadow_closed = lim.decide("/shadow-closed")
    assert (shadow_closed.allowed, shadow_closed.reason) == (True, "shadow")
    assert lim.acquire("/shadow-closed") == 0.0  # no InterfaceClosed in shadow mode
    assert lim.try_acquire("/shadow", permits=2)


def test_shadow_rules_never_make_a_caller_wait(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    write_row(migrated_db[1], "/shadow", rateLimit=2, cache=2.0, status=1, shadow=1)
    lim.reload()
    assert lim.decide("/shadow", permits=2).remaining == 0
    began = time.monotonic()
    late = lim.decide("/shadow")  # enforced, it would wait 0.5 s
    assert lim.acquire("/shadow") == 0.0  # enforced: 1 s
    assert time.monotonic() - began < 0.3
    assert (late.allowed, late.reason, late.waited) == (True, "admitted", 0.0)
    verdict = lim.reserve("/shadow")
    assert verdict.allowed and verdict.wait_us == 0.0


def test_try_acquire_is_decide_allowed_on_one_bucket(
    lim: GatewayLimiter, migrated_db: tuple[str, Engine]
) -> None:
    write_row(migrated_db[1], "/one", rateLimit=1, cache=0.0, status=1)  # one permit a second
    lim.reload()
    answers = [lim.try_acquire("/one") if i % 2 else lim.decide("/one").allowed for i in range(4)]
    assert answers == [True, False, False, False]
    for url in ("/closed", "/disabled", "/nowhere", "/shadow-closed"):
        assert lim.try_acquire(url) == lim.decide(url).allowed


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"url": 5}, TypeError, "url"),
        ({"permits": 0}, ValueError, "permits"),
        ({"timeout": -1}, ValueError, "timeout"),
    ],
)
def test_decide_rejects_bad_arguments_naming_them(
    lim: GatewayLimiter, kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    args: dict[str, object] = {"url": "/lim"} | kwargs
    with pytest.raises(error, match=names):
        lim.decide(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            "deny",
            Decision(False, "backend_fallback", 0.0, 1.0, None, 5, False, 5.0, priority="default"),
        ),
        (
            "allow",
            Decision(True, "backend_fallback", 0.0, None, None, 5, False, 5.0, priority="default"),
        ),
        (
            "local",
            Decision(True, "backend_fallback", 0.0, None, 4, 5, False, 5.0, priority="default"),
        ),
    ],
)
def test_redis_down_decisions_say_the_failure_policy_decided(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    policy: str,
    expected: Decision,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/lim", rateLimit=5, cache=0.0, status=1)
    private_redis.kill()
    lim = limiter(url, private_redis.url, key_prefix, on_backend_error=policy, breaker_seconds=1.0)
    try:
        decision = lim.decide("/lim")
        assert decision == expected
        assert lim.backend_fallbacks == 1
        if policy == "deny":  # Retry-After: when the breaker lets a call probe Redis again
            assert decision.headers() == {"X-RateLimit-Limit": "5", "Retry-After": "1"}
    finally:
        lim.close()


async def test_asyncio_decide_gives_the_same_decisions(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/lim", rateLimit=2, cache=0.0, status=1)
    write_row(engine, "/closed", rateLimit=0, cache=0.0, status=1)
    write_row(engine, "/disabled", rateLimit=2, cache=0.0, status=0)
    write_row(engine, "/shadow", rateLimit=1, cache=0.0, status=1, shadow=1)
    async with AsyncGatewayLimiter(
        database_url=url, redis_url=redis_server.url, key_prefix=key_prefix, reload_interval=3600
    ) as lim:
        first, second, third = [await lim.decide("/lim") for _ in range(3)]
        assert first == Decision(True, "admitted", 0.0, None, 1, 2, False, 2.0, priority="default")
        assert (second.allowed, second.remaining) == (True, 0)
        assert (third.allowed, third.reason) == (False, "limited")
        assert third.headers()["Retry-After"] == "1"
        assert await lim.decide("/closed") == Decision(
            False, "closed", 0.0, None, 0, 0, False, 0.0, priority="default"
        )
        assert await lim.decide("/disabled") == Decision(True, "disabled")
        assert await lim.decide("/nowhere") == Decision(True, "not_configured")
        shadow = [await lim.decide("/shadow") for _ in range(2)]
        assert [d.reason for d in shadow] == ["admitted", "shadow"]
        assert all(d.allowed and d.headers() == {} for d in shadow)
        assert await lim.acquire("/shadow") == 0.0
        for url in ("/closed", "/disabled", "/nowhere"):
            assert await lim.try_acquire(url) == (await lim.decide(url)).allowed


def test_decide_takes_the_caller_key_of_per_caller_rows(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/each", rateLimit=2, cache=0.0, status=1, perCaller=1)
    lim = limiter(url, redis_server.url, key_prefix, reload_interval=3600)
    try:
        a = [lim.decide("/each", key="a") for _ in range(3)]
        b = lim.decide("/each", key="b")  # a caller of its own: its own 2 permits
    finally:
        lim.close()
    assert [d.reason for d in a] == ["limited" if i == 2 else "admitted" for i in range(3)]
    assert [d.remaining for d in a[:2]] == [1, 0]
    assert b.allowed and b.remaining == 1
