"""``limiter.pushback``: what the supplier says reaches every process of the fleet at its
next decision (docs/design.md, "Pushback"), on a real Redis and MariaDB.

One pushback with retry_after holds a real second process back for that long, then
its traffic resumes; one without halves the effective rate once per burst, and it
recovers; shadow rows record it without enforcing it; a reload that keeps the row's
rate keeps the pushback; ``memory://`` and asyncio do the same.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy.engine import Engine

import gateway_limiter
from gateway_limiter import GatewayLimiter, LimiterError, Refused
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.core.decision import Decision
from gateway_limiter.model.pushback import RECOVERY_PER_S
from tests.support.limiting import evalsha_calls, limiter, write_row

URL = "/ibe/flight/search"
RATE = 50
#: A loaded 2-core box can miss the default 50 ms: a pushback lost to a timeout is only
#: logged, and these tests are about what a recorded one does.
TIMEOUT_S = 2.0


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"redis_timeout": TIMEOUT_S}


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=RATE, cache=0)
    return limiter_db


@pytest.fixture
def other(
    limiter_db: tuple[str, Engine], limiter_redis_url: str, key_prefix: str
) -> Iterator[GatewayLimiter]:
    """A second limiter on the same table and Redis: another gateway of the fleet."""
    started = limiter(limiter_db[0], limiter_redis_url, key_prefix, redis_timeout=TIMEOUT_S)
    yield started
    started.close()


def _caller(db: str, redis_url: str, prefix: str, out: Any, stop: Any) -> None:
    """Another process: call as fast as it can with no wait budget; report admissions."""
    settings = {"database_url": db, "redis_url": redis_url, "key_prefix": prefix}
    with GatewayLimiter(**settings, redis_timeout=TIMEOUT_S) as lim:
        out.put(("ready", time.time()))
        while not stop.is_set():
            if lim.try_acquire(URL, timeout=0):
                out.put(("admitted", time.time()))
            time.sleep(0.002)


def test_retry_after_holds_another_process_back_then_traffic_resumes(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], limiter_redis_url: str, key_prefix: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(
        target=_caller, args=(limiter_db[0], limiter_redis_url, key_prefix, out, stop)
    )
    proc.start()
    try:
        assert out.get(timeout=60)[0] == "ready"
        admitted: list[float] = []
        while len(admitted) < 3:  # the other process is calling at the row's rate
            kind, at_s = out.get(timeout=10)
            if kind == "admitted":
                admitted.append(at_s)
        before_s = time.time()
        lim.pushback(URL, retry_after=2)
        after_s = time.time()
        time.sleep(4.0)  # real time: the 2 s hold is on Redis' clock, then traffic resumes
        stop.set()
        while True:
            kind, at_s = out.get(timeout=10)
            if kind == "admitted":
                admitted.append(at_s)
            if at_s > after_s + 3.9 or not proc.is_alive():
                break
    finally:
        stop.set()
        proc.join(timeout=30)
    # a call decided before the pushback may still be reported just after it: a round trip
    held = [t for t in admitted if after_s + 0.1 < t < before_s + 2.0 - 0.05]
    assert held == []
    assert any(before_s - 1.0 < t < before_s for t in admitted)  # it was calling before
    resumed = [t for t in admitted if before_s + 2.0 <= t < before_s + 3.5]
    assert len(resumed) >= 10, resumed  # then traffic resumes, at the row's rate


def test_a_caller_whose_budget_reaches_the_moment_waits_for_it(
    lim: GatewayLimiter, other: GatewayLimiter
) -> None:
    lim.pushback(URL, retry_after=0.3)
    refused = other.decide(URL, timeout=0.1)
    assert not refused.allowed and refused.reason == "limited"
    assert refused.retry_after is not None and 0.1 <= refused.retry_after <= 0.3
    started = time.monotonic()
    assert other.try_acquire(URL, timeout=1.0)  # reserves the first slot after the moment
    assert 0.1 <= time.monotonic() - started <= 0.5


def test_a_hold_drains_the_bucket_so_traffic_resumes_at_the_rate_without_a_burst(
    lim: GatewayLimiter, other: GatewayLimiter
) -> None:
    # The bucket is full (50 saved permits): without the drain they would all go the
    # moment the hold ends, at a supplier that has just said to stop.
    pushed_s = time.monotonic()
    lim.pushback(URL, retry_after=1.0)
    time.sleep(max(0.0, pushed_s + 1.0 - time.monotonic()))  # real time: Redis' hold of 1 s
    admitted, started_s = 0, time.monotonic()
    while time.monotonic() - started_s < 0.3:
        admitted += other.try_acquire(URL, timeout=0)
    # The hold ended at the earliest 1 s after pushed_s (the server's clock, this host):
    # since then at most RATE per second can have come back, and none was saved before.
    since_hold_s = time.monotonic() - pushed_s - 1.0
    assert 1 <= admitted <= RATE * since_hold_s + 1, (admitted, since_hold_s)


def test_the_local_refusal_learns_the_moment_from_a_reply(
    lim: GatewayLimiter, other: GatewayLimiter, limiter_redis_url: str
) -> None:
    lim.pushback(URL, retry_after=5)
    assert not other.try_acquire(URL, timeout=0)  # one round trip tells other the moment
    client = redis.Redis.from_url(limiter_redis_url)
    calls = evalsha_calls(client)
    assert [other.try_acquire(URL, timeout=0) for _ in range(20)] == [False] * 20
    assert evalsha_calls(client) == calls  # refused in-process, no round trip
    # the process that pushed back learnt it from the pushback's own reply
    assert not lim.try_acquire(URL, timeout=0)
    assert evalsha_calls(client) == calls


def effective(decision: Decision) -> float:
    assert decision.effective_rate is not None
    return decision.effective_rate


def test_without_retry_after_the_rate_halves_once_per_burst_and_recovers(
    lim: GatewayLimiter, other: GatewayLimiter
) -> None:
    assert effective(other.decide(URL)) == RATE
    assert "X-RateLimit-Effective-Rate" not in other.decide(URL).headers()
    for _ in range(10):  # one burst of 429s
        lim.pushback(URL)
    first = effective(other.decide(URL))
    assert RATE * 0.5 <= first < RATE * 0.52  # halved once, recovering already
    header = other.decide(URL).headers()["X-RateLimit-Effective-Rate"]
    assert RATE * 0.5 <= float(header) < RATE * 0.52
    time.sleep(1.05)  # real time: the next burst counts again, a second on Redis' clock
    lim.pushback(URL)
    second = effective(other.decide(URL))
    assert RATE * 0.25 * 1.0 <= second < RATE * 0.30
    time.sleep(1.0)  # real time: recovery per second on Redis' clock
    recovered = effective(other.decide(URL)) - second
    # recovery: RECOVERY_PER_S of the row's rate per second (a loaded box sleeps longer)
    assert RATE * RECOVERY_PER_S * 0.9 <= recovered <= RATE * RECOVERY_PER_S * 2
    # the bucket really runs at the effective rate: a fresh bucket holds that capacity
    admitted = sum(other.try_acquire(URL, timeout=0) for _ in range(RATE))
    assert admitted <= math.ceil(second + recovered) + 2
    if REGISTRY.get_sample_value("gateway_limiter_rules_in_force") is not None:
        gauge = REGISTRY.get_sample_value("gateway_limiter_effective_rate", {"interface": URL})
        assert gauge is not None and gauge < RATE * 0.4


def test_a_shadow_row_records_pushbacks_without_enforcing_them(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine]
) -> None:
    write_row(limiter_db[1], URL, shadow=1)
    lim.reload()
    lim.pushback(URL, retry_after=5)
    lim.pushback(URL)
    decision = lim.decide(URL, timeout=0)
    assert decision.allowed and decision.shadow
    assert RATE * 0.5 <= effective(decision) < RATE * 0.52  # recorded
    assert decision.headers() == {}  # a limit on trial changes nothing clients see


def test_a_reload_that_keeps_the_rate_keeps_the_pushback(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine]
) -> None:
    lim.pushback(URL)
    write_row(limiter_db[1], URL, cache=0.01)  # the rate stays
    lim.reload()
    assert RATE * 0.5 <= effective(lim.decide(URL)) < RATE * 0.52
    write_row(limiter_db[1], URL, rateLimit=RATE * 2)  # the operator says what it takes
    lim.reload()
    assert effective(lim.decide(URL)) == RATE * 2


def test_pushback_on_an_interface_not_limited_costs_no_round_trip(
    lim: GatewayLimiter, limiter_redis_url: str
) -> None:
    client = redis.Redis.from_url(limiter_redis_url)
    calls = evalsha_calls(client)
    lim.pushback("/not/limited", retry_after=3)
    lim.pushback("/not/limited")
    assert evalsha_calls(client) == calls
    assert lim.try_acquire("/not/limited", timeout=0)


@pytest.mark.parametrize(
    ("args", "error", "named"),
    [
        ((b"/x",), TypeError, "url"),
        ((URL, -1), ValueError, "retry_after"),
        ((URL, float("nan")), ValueError, "retry_after"),
        ((URL, 86_400.5), ValueError, "retry_after must be a number of seconds from 0 to 86400"),
        ((URL, float("inf")), ValueError, "retry_after"),
        ((URL, "2"), TypeError, "retry_after"),
        ((URL, None, 7), TypeError, "key"),
    ],
)
def test_bad_arguments_name_the_argument(
    lim: GatewayLimiter, args: tuple[Any, ...], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        lim.pushback(*args)


def test_refused_carries_the_decision() -> None:
    decision = Decision(False, "limited", retry_after=1.5, limit=10)
    refused = Refused(decision)
    assert isinstance(refused, LimiterError)
    assert refused.decision is decision
    assert "limited" in str(refused)
    assert gateway_limiter.Refused is Refused


@pytest.mark.parametrize("limiter_redis_url", ["memory://"])
def test_memory_does_the_same_in_process(lim: GatewayLimiter) -> None:
    lim.pushback(URL, retry_after=0.5)
    assert not lim.try_acquire(URL, timeout=0)
    assert lim.try_acquire(URL, timeout=1.0)
    lim.pushback(URL)
    assert RATE * 0.5 <= effective(lim.decide(URL)) < RATE * 0.52


async def test_asyncio_pushback_reaches_the_threaded_limiter(
    alim: AsyncGatewayLimiter, other: GatewayLimiter
) -> None:
    await alim.pushback(URL)
    assert RATE * 0.5 <= effective(other.decide(URL)) < RATE * 0.52
    await alim.pushback(URL, retry_after=2)
    refused = await alim.decide(URL, timeout=0)
    assert not refused.allowed
    assert RATE * 0.5 <= effective(refused) < RATE * 0.52  # the local refusal says so too
    assert not other.try_acquire(URL, timeout=0)
