"""A lease row through the limiter, on real MariaDB and Redis: far fewer round trips,
the same decisions where a lease cannot apply, and what a reload, a pushback and
closing do to a lease."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.scripts import STATE
from gateway_limiter.backends.state import bucket_key
from tests.support.clocks import DrivenClock
from tests.support.limiting import evalsha_calls, limiter, set_switch, write_row
from tests.support.services import RedisServer


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # leases of 100 permits that last 1 s: the calls counted on one lease, on a loaded
    # host, are well within that (with 100 ms leases a stall could make one go stale)
    write_row(engine, "/hot", rateLimit=100, maxPermits=1000, cache=0.0, leaseMs=1000)
    write_row(engine, "/plain", rateLimit=1000, cache=0.0)
    write_row(engine, "/window", rateLimit=1000, cache=0.0, leaseMs=100, algorithm="sliding_window")
    # refills 100/s only: what comes back is seen before time could have refilled it
    write_row(engine, "/slow", rateLimit=100, maxPermits=1000, cache=0.0, leaseMs=10_000)
    return limiter_db


@pytest.fixture
def limiter_settings() -> dict[str, float]:
    # Patient Redis reads: on a loaded host a round trip can pass the default deadline,
    # and the outage policy's decisions are not what these tests count.
    return {"reload_interval": 3600, "redis_timeout": 2.0, "redis_timeout_ceiling": 2.0}


def _stored(client: redis.Redis, prefix: str, url: str) -> float:
    raw = client.get(bucket_key(prefix, url))
    assert isinstance(raw, bytes)
    return float(STATE.unpack_from(raw)[0])


def test_a_lease_row_admits_its_burst_with_one_round_trip_per_lease(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    admitted = sum(lim.try_acquire("/hot", timeout=0) for _ in range(500))
    assert admitted == 500  # half the burst: leases of 100 (1 s of 100/s)
    assert evalsha_calls(redis_client) - before == 5


def test_a_row_without_a_lease_still_asks_redis_for_every_call(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    assert all(lim.try_acquire("/plain", timeout=0) for _ in range(50))
    assert evalsha_calls(redis_client) - before == 50


def test_a_lease_where_it_cannot_apply_is_ignored_with_a_warning(
    lim: GatewayLimiter, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    assert lim.registry.snapshot.rules["/window"].lease_ms == 0
    said = [r.getMessage() for r in caplog.get_records("setup") if r.levelno == logging.WARNING]
    assert any("leaseMs of configId 3 ignored" in m and "sliding_window" in m for m in said)
    before = evalsha_calls(redis_client)
    assert all(lim.try_acquire("/window", timeout=0) for _ in range(20))
    assert evalsha_calls(redis_client) - before == 20


def test_the_lease_does_not_outlast_leasems(
    limiter_db: tuple[str, Engine],
    limiter_redis_url: str,
    limiter_settings: dict[str, float],
    key_prefix: str,
    redis_client: redis.Redis,
) -> None:
    clock = DrivenClock()  # a lease's age is read on the limiter's clock
    lim = limiter(limiter_db[0], limiter_redis_url, key_prefix, clock=clock, **limiter_settings)
    try:
        assert lim.try_acquire("/hot", timeout=0)  # a lease of 100, 99 left in it
        before = evalsha_calls(redis_client)
        assert lim.try_acquire("/hot", timeout=0)  # from the lease
        assert evalsha_calls(redis_client) == before
        clock.advance(0.9)  # younger than leaseMs: still spent from
        assert lim.try_acquire("/hot", timeout=0)
        assert evalsha_calls(redis_client) == before
        clock.advance(0.2)  # older than leaseMs: not spent any more, renewed
        assert lim.try_acquire("/hot", timeout=0)
        assert evalsha_calls(redis_client) - before == 1
        leases = lim._leases
        # its 97 are dropped, not handed back: by the limiter's clock 1.1 s went by, in
        # which 100/s refills more than 97 (a guess on that clock; Redis' barely moved)
        assert leases is not None
        assert (leases.dropped, leases.handed_back) == (97, 0)
    finally:
        lim.close()


def test_closing_hands_the_lease_back(
    limiter_db: tuple[str, Engine],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    own = limiter(limiter_db[0], redis_server.url, key_prefix, reload_interval=3600)
    assert own.try_acquire("/slow", timeout=0)  # a lease of the whole 1000, 999 left in it
    assert _stored(redis_client, key_prefix, "/slow") < 10.0
    own.close()  # a young lease: back, less what refilled since (which is there instead)
    assert own._leases is not None and own._leases.handed_back == 999
    assert _stored(redis_client, key_prefix, "/slow") == pytest.approx(999.0, abs=1e-6)


def test_a_reload_that_changes_the_row_carries_the_lease_back(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], redis_client: redis.Redis, key_prefix: str
) -> None:
    started = time.monotonic()
    assert lim.try_acquire("/slow", timeout=0)  # a lease of the whole 1000, 999 left in it
    write_row(limiter_db[1], "/slow", rateLimit=200)
    lim.reload()
    decision = lim.decide("/slow", timeout=0)  # the new lease hands the 999 back first
    elapsed_s = time.monotonic() - started
    assert decision.allowed and decision.remaining is not None
    # ... less what refilled since (at 100/s, discounted at the faster 200/s), and takes
    # them again with that refill: time alone would give a few, never 999
    assert 999 - 100 * elapsed_s - 2 <= decision.remaining <= 999


def test_a_pushback_drops_the_lease_at_once(lim: GatewayLimiter, redis_client: redis.Redis) -> None:
    assert lim.try_acquire("/hot", timeout=0)
    lim.pushback("/hot", retry_after=5.0)
    before = evalsha_calls(redis_client)
    assert not lim.try_acquire("/hot", timeout=0)  # not from the lease: Redis holds it
    assert evalsha_calls(redis_client) - before == 1


def test_a_lease_serves_the_decision_headers(lim: GatewayLimiter) -> None:
    first = lim.decide("/hot", timeout=0)
    second = lim.decide("/hot", timeout=0)
    assert first.allowed and second.allowed
    assert (first.remaining, second.remaining) == (99, 98)  # what is left in the lease


def test_a_short_lease_refuses_in_process_until_the_bucket_can_have_refilled(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    admitted = 0
    while lim.try_acquire("/hot", timeout=0):  # all of C, and what refills meanwhile
        admitted += 1
    assert 1000 <= admitted < 1200  # 200 more would take 2 s
    before = evalsha_calls(redis_client)  # the last lease call found the bucket dry
    assert not any(lim.try_acquire("/hot", timeout=0) for _ in range(50))
    assert evalsha_calls(redis_client) == before  # the 50: refused without a round trip
    time.sleep(1.2)  # real time: Redis refills a lease's worth (1 s of the rate) meanwhile
    assert sum(lim.try_acquire("/hot", timeout=0) for _ in range(100)) == 100
    assert evalsha_calls(redis_client) - before == 1
    assert lim.try_acquire("/hot", timeout=0.5)  # a caller who can wait goes to Redis


def test_the_switch_turning_off_hands_the_lease_back_on_the_next_heartbeat(
    limiter_db: tuple[str, Engine],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    own = limiter(
        limiter_db[0], redis_server.url, key_prefix, reload_interval=3600, fleet_heartbeat=0.05
    )
    try:
        assert own.try_acquire("/slow", timeout=0)  # 999 left in the lease
        set_switch(limiter_db[1], 0)
        own.reload()
        deadline = time.monotonic() + 3.0  # time alone refills 300 at most meanwhile
        while _stored(redis_client, key_prefix, "/slow") < 999.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _stored(redis_client, key_prefix, "/slow") >= 999.0
    finally:
        own.close()


def test_threads_wait_for_the_renewal_in_flight_rather_than_ask_redis_each(
    lim: GatewayLimiter, redis_client: redis.Redis
) -> None:
    before = evalsha_calls(redis_client)
    admitted = [0] * 8
    go = threading.Barrier(8)

    def calls(i: int) -> None:
        go.wait()
        admitted[i] = sum(lim.try_acquire("/hot", timeout=0) for _ in range(50))

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 400  # within the burst: leases of 100
    # Four leases, and maybe a renewal or two more (the last permits of a lease and a
    # caller's wish of one can cross). Decided the plain way instead, each thread would
    # send a call of its own while a renewal is in flight: 14 to 42 here.
    assert 4 <= evalsha_calls(redis_client) - before <= 8
