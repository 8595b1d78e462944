"""Several rows per interface (periods) and fixed windows, read from MariaDB and decided
on a real Redis: the slower limit binds, a refusal takes nothing from any limit, and
waiting is allowed when every limit can serve in time. The in-process backend (the
``local`` failure policy) decides the same.

Where the point is an exact number, the clock is driven through the script's ``now``
(``backend.reserve(..., now=...)``); through the limiter, waits are asserted in ranges
wide enough for a loaded 2-core machine.
"""

from __future__ import annotations

import time

import pytest
import redis
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.table import make_engine
from tests.support.limiting import evalsha_calls, limiter, state_keys, write_row
from tests.support.services import RedisServer

SECOND = 1_000_000.0
T0 = 1_795_000_000 * SECOND  # a whole second of a 2026 clock: a boundary of every window


@pytest.fixture
def db(migrated_db: tuple[str, Engine]) -> Engine:
    """The rows every test here reads (MariaDB)."""
    engine = migrated_db[1]
    # 5 per second and 8 per 10 s: the 10 s limit binds once 8 went
    write_row(engine, "/two", rateLimit=5, cache=0.0)
    write_row(engine, "/two", add=True, rateLimit=8, cache=0.0, periodSeconds=10)
    # 5 per 5 s and 3 per minute: the minute refuses long before the other does
    write_row(engine, "/minute", rateLimit=5, cache=0.0, periodSeconds=5)
    write_row(engine, "/minute", add=True, rateLimit=3, cache=0.0, periodSeconds=60)
    # 3 per aligned 2 s window
    write_row(engine, "/fixed", rateLimit=3, cache=0.0, algorithm="fixed_window", periodSeconds=2)
    return engine


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine], db: Engine) -> tuple[str, Engine]:
    return limiter_db  # with the rows of ``db``


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    """A limiter on the shared Redis, then one on memory:// (the local policy's model)."""
    return redis_server.url if request.param == "redis" else "memory://"


def rule_of(lim: GatewayLimiter, url: str) -> Rule:
    return lim.registry.snapshot.rules[url]


def test_two_periods_are_one_interface_decided_in_one_script_call(
    migrated_db: tuple[str, Engine], db: Engine, redis_server: RedisServer, key_prefix: str
) -> None:
    client: redis.Redis = redis_server.client()
    lim = limiter(migrated_db[0], redis_server.url, key_prefix)
    try:
        rule = rule_of(lim, "/two")
        assert [(r.rate, r.period) for r in rule.limits] == [(5, 1), (8, 10)]
        before = evalsha_calls(client)
        assert lim.try_acquire("/two", timeout=0)
        assert evalsha_calls(client) == before + 1
        # each limit's key, under the prefix and the interface's {hash tag}
        keys = sorted(state_keys(client, key_prefix))
        assert keys == [f"{key_prefix}:{{/two}}:tb", f"{key_prefix}:{{/two}}:tb:10s"]
    finally:
        lim.close()


def test_the_slower_period_binds_once_its_capacity_is_spent(lim: GatewayLimiter) -> None:
    start = time.monotonic()
    waits = [lim.reserve("/two", timeout=30).wait_us / SECOND for _ in range(10)]
    late = time.monotonic() - start + 0.05  # the clock moved on between the calls
    assert waits[:5] == pytest.approx([0.0] * 5, abs=late)
    assert waits[5:8] == pytest.approx([0.2, 0.4, 0.6], abs=late)  # the second's pace
    # 8 per 10 s spent: one more every 1.25 s, far slower than 5 per second
    assert waits[8:] == pytest.approx([1.25, 2.5], abs=late)


def test_a_refusal_by_the_slow_limit_takes_nothing_from_the_fast_one(lim: GatewayLimiter) -> None:
    assert [lim.try_acquire("/minute", timeout=0) for _ in range(3)] == [True] * 3
    assert not lim.try_acquire("/minute", timeout=0.5)  # the minute needs 20 s more
    # The 5 per 5 s bucket has 2 of its 5 left (it refills one a second), untouched by
    # the refusal: asked on its own, 2 go at once and the third must wait.
    fast = rule_of(lim, "/minute")
    assert fast.period == 5
    alone = Rule("/minute", fast.rate, 0.0, fast.config_id, period=5)
    verdicts = [lim.backend.reserve(alone, 1, 0.0) for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]


def test_a_refusal_writes_no_key_at_all(
    migrated_db: tuple[str, Engine], db: Engine, redis_server: RedisServer, key_prefix: str
) -> None:
    client: redis.Redis = redis_server.client()
    lim = limiter(migrated_db[0], redis_server.url, key_prefix)
    try:
        rule = rule_of(lim, "/minute")
        keys = [state_key(key_prefix, r) for r in rule.limits]
        backend = lim.backend
        assert isinstance(backend, RedisBackend)
        for _ in range(3):
            assert backend.reserve(rule, 1, 0.0, now=T0).allowed
        before = [client.get(k) for k in keys]
        ttls = [client.pttl(k) for k in keys]
        refused = backend.reserve(rule, 1, 0.5, now=T0 + SECOND)
        assert not refused.allowed
        assert refused.wait_us == pytest.approx(19 * SECOND)  # 20 s per permit, 1 s gone
        assert [client.get(k) for k in keys] == before
        assert all(t > 0 for t in ttls)
    finally:
        lim.close()


def test_waiting_is_allowed_when_every_limit_can_serve_within_the_timeout(
    lim: GatewayLimiter,
) -> None:
    first = time.monotonic()
    assert [lim.try_acquire("/two", timeout=0) for _ in range(5)] == [True] * 5
    start = time.monotonic()
    assert lim.try_acquire("/two", timeout=0.5)  # the second's next permit: 0.2 s
    done = time.monotonic()
    # 0.2 s after the first call, less what refilled while the five ran (a loaded host
    # can take a while over them)
    assert 0.2 - (start - first) - 0.02 <= done - start < 0.5
    assert done - start >= 0.1 or start - first > 0.08
    # the next permit is due 0.4 s after the first call: a budget of 0.05 s cannot
    # reach it, unless the host stalled (before or after the wait) past 0.35 s
    asked = time.monotonic()
    refused = not lim.try_acquire("/two", timeout=0.05)
    assert refused or asked - first > 0.3


def test_fixed_window_admits_its_rate_then_refuses_until_the_next_window(
    lim: GatewayLimiter,
) -> None:
    assert [lim.try_acquire("/fixed", timeout=0) for _ in range(5)] == [True] * 3 + [False] * 2
    verdict = lim.reserve("/fixed", timeout=2.5)  # the next aligned window, within 2 s
    assert verdict.allowed
    assert 0 < verdict.wait_us / SECOND <= 2.0


def test_fixed_window_boundaries_on_redis_with_the_clock_driven(
    migrated_db: tuple[str, Engine], db: Engine, redis_server: RedisServer, key_prefix: str
) -> None:
    client: redis.Redis = redis_server.client()
    lim = limiter(migrated_db[0], redis_server.url, key_prefix)
    try:
        rule = rule_of(lim, "/fixed")
        backend = lim.backend
        assert isinstance(backend, RedisBackend)
        key = state_key(key_prefix, rule)
        assert key == f"{key_prefix}:{{/fixed}}:fw:2s"

        def ask(at: float, timeout: float | None = 0.0) -> tuple[bool, float]:
            verdict = backend.reserve(rule, 1, timeout, now=T0 + at * SECOND)
            return verdict.allowed, verdict.wait_us / SECOND

        # the end of window [T0, T0 + 2 s): 3 admitted, then refusals that count nothing
        assert [ask(1.9)[0] for _ in range(6)] == [True] * 3 + [False] * 3
        pttl = client.pttl(key)
        assert 0 < pttl <= 100 + 1000  # expires as its window ends (+1 s grace)
        # a waiting caller goes exactly at the next window's start
        allowed, wait = ask(1.9, timeout=0.2)
        assert allowed and wait == pytest.approx(0.1)
        # the new window holds its own 3: the one reserved, 2 more, then refused
        assert [ask(2.0)[0] for _ in range(3)] == [True, True, False]
        assert ask(3.99)[0] is False
        assert [ask(4.0)[0] for _ in range(4)] == [True] * 3 + [False]
    finally:
        lim.close()


def test_acquire_of_more_permits_than_a_window_holds_names_the_argument(
    lim: GatewayLimiter,
) -> None:
    with pytest.raises(ValueError, match=r"permits must be at most 3 for '/fixed'"):
        lim.acquire("/fixed", permits=4)
    assert not lim.try_acquire("/fixed", permits=4, timeout=5)


def test_a_0003_schema_still_loads_and_upgrading_keeps_every_row_per_second_and_shared(
    mariadb_db: str, redis_server: RedisServer, key_prefix: str
) -> None:
    engine = make_engine(mariadb_db)
    upgrade(engine, "0003")  # code newer than the schema: the new columns read as NULL
    write_row(engine, "/old", rateLimit=2, cache=0.0)
    try:
        lim = limiter(mariadb_db, redis_server.url, key_prefix)
        try:
            assert lim.registry.snapshot.rules["/old"] == Rule("/old", 2, 0.0, 1)
            assert [lim.try_acquire("/old") for _ in range(3)] == [True, True, False]
        finally:
            lim.close()
        upgrade(engine)
        with engine.connect() as conn:
            row = conn.execute(text("select periodSeconds, perCaller from t_ratelimite_conf"))
            assert tuple(row.one()) == (1, 0)
    finally:
        engine.dispose()
