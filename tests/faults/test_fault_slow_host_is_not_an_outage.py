"""A slow host is not an outage: the read deadline follows the round trips seen
(``backends/round_trips.py``), so a loaded 2-core host does not take a healthy Redis
for a dead one, while a Redis that stops answering is still seen within
``redis_timeout_ceiling``.

The load is the outage suite's: 3 processes x 6 unpaced threads on one sliding-window
interface (R = 20/s), default settings. With a fixed 50 ms read timeout (the ceiling
set to ``redis_timeout``) about one run in five fell back while Redis was up.
``GWL_SLOW_HOST_RUNS`` runs (default 2; docs/reliability.md has the 20-run figures).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.round_trips import FACTOR, STEP_S, WINDOW_S, RoundTrips
from gateway_limiter.config.settings import Settings
from tests.support.cpu import off_cpu_since, run_queues
from tests.support.fleet import Fleet, WorkerConfig
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

RATE = 20
PROCESSES = 3
THREADS = 6
SECONDS = 4.0
RUNS = int(os.environ.get("GWL_SLOW_HOST_RUNS", "2"))
#: The default ceiling, and what a call may add on a loaded host besides waiting for a
#: CPU, which is subtracted (``tests/support/cpu.py``): the GIL, the policy's decision.
CEILING_S = Settings().redis_timeout_ceiling
NOISE_S = 0.3
#: Decisions in a row answered by Redis before it is paused.
WARM_UP = 50
#: How long the warm-up may take at most, however loaded the host.
WARM_UP_S = 30.0


def most_admitted_in_a_second(calls: list[tuple[float, float]]) -> int:
    """The most admitted calls (start, duration in s) that began and ended within one
    second, over every second that starts at a call. Redis decided each call at some
    moment between its start and end, so these were decided within that second: the
    count is one the sliding window bounds by R, whatever the host's delays."""
    calls = sorted(calls)
    most = 0
    for i, (first, _) in enumerate(calls):
        inside = sum(1 for started, took in calls[i:] if started + took <= first + 1.0)
        most = max(most, inside)
    return most


def slow_host_run(
    db_url: str, redis_url: str, prefix: str, settings: dict[str, Any]
) -> tuple[int, int]:
    """One run of the load: (fallbacks in the fleet, most calls admitted in one second)."""
    config = WorkerConfig(
        database_url=db_url,
        redis_url=redis_url,
        key_prefix=prefix,
        urls=["/slow/host"],
        seconds=SECONDS,
        threads=THREADS,
        pause=0.0,
        settings=settings,
    )
    fleet = Fleet(config, PROCESSES)
    try:
        fleet.start()
        results = fleet.results()
    finally:
        fleet.kill()
    admitted = [(started, took) for r in results for started, took, ok, _, _ in r["calls"] if ok]
    return sum(r["fallbacks"] for r in results), most_admitted_in_a_second(admitted)


@pytest.mark.slow
def test_a_loaded_host_does_not_fall_back_while_redis_is_up(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    figures: Callable[..., None],
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/slow/host", rateLimit=RATE, cache=0.0, algorithm="sliding_window")
    runs = [slow_host_run(db_url, private_redis.url, f"{key_prefix}{n}", {}) for n in range(RUNS)]
    figures(
        "slow host, default settings",
        runs=RUNS,
        fallbacks=[f for f, _ in runs],
        most_admitted_in_a_second=[m for _, m in runs],
    )
    assert [f for f, _ in runs] == [0] * RUNS  # no false outage
    # A false outage admitted 2-3 x R in a second (40, 60). R + 1 (22 once, on a host
    # loaded past load average 8) came from the count, not the window: the workers read
    # a call's start before its duration's (tests/support/fleet.py), so on a loaded host
    # its interval slid early and took in calls decided after it. Read around the call,
    # runs under the same load count R; R + 1 stays allowed, as before.
    assert max(m for _, m in runs) <= RATE + 1


class WarmUp:
    """Counts the decisions in a row that Redis answered (``answered`` after each one).

    The round trips seen set the deadline: the floor on a quiet host, up to the ceiling
    on a loaded one. Before the deadline has seen how slow the host is, a loaded host
    can keep a reply past the floor: a fallback, then the breaker decides for
    ``breaker_seconds``. The count then starts over, so that Redis is paused only after
    it has answered ``WARM_UP`` decisions in a row, whatever the deadline they left.
    """

    def __init__(self, lim: GatewayLimiter | AsyncGatewayLimiter) -> None:
        self.lim = lim
        self.in_a_row = 0
        self.until = time.monotonic() + WARM_UP_S
        self._fallbacks = lim.backend_fallbacks

    @property
    def done(self) -> bool:
        assert time.monotonic() < self.until, f"Redis never answered {WARM_UP} in a row"
        return self.in_a_row >= WARM_UP

    def answered(self) -> None:
        fallbacks, self._fallbacks = self._fallbacks, self.lim.backend_fallbacks
        self.in_a_row = self.in_a_row + 1 if self._fallbacks == fallbacks else 0


def test_a_paused_redis_is_seen_within_the_ceiling(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    figures: Callable[..., None],
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/paused", rateLimit=1000, cache=0.0)
    lim = limiter(db_url, private_redis.url, key_prefix)
    try:
        warm = WarmUp(lim)
        while not warm.done:
            lim.try_acquire("/paused", timeout=0)
            warm.answered()
        fallbacks = lim.backend_fallbacks
        private_redis.client().client_pause(3000, all=True)
        before, t0 = run_queues(), time.perf_counter()
        lim.try_acquire("/paused", timeout=0)
        took_s = time.perf_counter() - t0
        off_cpu_s = off_cpu_since(before)
        figures("CLIENT PAUSE seen, threads", seconds=round(took_s, 3), off_cpu=round(off_cpu_s, 3))
        assert lim.backend_fallbacks == fallbacks + 1  # seen as an outage
        assert took_s - off_cpu_s < CEILING_S + NOISE_S
    finally:
        private_redis.client().client_unpause()
        lim.close()


async def test_asyncio_sees_a_paused_redis_within_the_ceiling(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    figures: Callable[..., None],
) -> None:
    db_url, engine = migrated_db
    write_row(engine, "/paused", rateLimit=1000, cache=0.0)
    async with AsyncGatewayLimiter(
        database_url=db_url, redis_url=private_redis.url, key_prefix=key_prefix
    ) as lim:
        warm = WarmUp(lim)
        while not warm.done:
            await lim.try_acquire("/paused", timeout=0)
            warm.answered()
        fallbacks = lim.backend_fallbacks
        private_redis.client().client_pause(3000, all=True)
        try:
            before, t0 = run_queues(), time.perf_counter()
            await lim.try_acquire("/paused", timeout=0)
            took_s = time.perf_counter() - t0
            off_cpu_s = off_cpu_since(before)
        finally:
            private_redis.client().client_unpause()
        figures("CLIENT PAUSE seen, asyncio", seconds=round(took_s, 3), off_cpu=round(off_cpu_s, 3))
        assert lim.backend_fallbacks == fallbacks + 1
        assert took_s - off_cpu_s < CEILING_S + NOISE_S


def test_the_deadline_follows_round_trips_between_floor_and_ceiling() -> None:
    trips = RoundTrips(0.05, 0.2)
    assert trips.timeout_s == 0.05
    trips.observe(0.002, now=100.0)
    assert trips.timeout_s == 0.05  # quiet host: the floor
    trips.observe(0.030, now=101.0)  # a slow round trip: FACTOR x it, in steps
    assert trips.timeout_s == pytest.approx(round(FACTOR * 0.030 / STEP_S) * STEP_S)
    trips.observe(0.5, now=102.0)
    assert trips.timeout_s == 0.2  # never past the ceiling
    trips.observe(0.001, now=100.0 + WINDOW_S + 0.5)  # next window: the last one counts
    assert trips.timeout_s == 0.2
    trips.observe(0.001, now=100.0 + 2 * WINDOW_S + 1.0)  # two windows on: forgotten
    assert trips.timeout_s == 0.05
    assert RoundTrips(0.05, 0.01).deadline_s(1.0) == 0.05  # a ceiling below: fixed floor


def test_most_admitted_in_a_second_counts_calls_wholly_inside_one() -> None:
    calls = [(0.0, 0.01), (0.5, 0.01), (0.99, 0.02), (1.2, 0.01), (1.4, 0.01)]
    assert most_admitted_in_a_second(calls) == 4  # from 0.5 every later call ends by 1.5
    assert most_admitted_in_a_second(calls[:3]) == 2  # from 0: the one at 0.99 ends past 1.0


def test_the_ceiling_is_a_setting_named_in_errors() -> None:
    assert Settings(redis_timeout_ceiling=0.5).redis_timeout_ceiling == 0.5
    with pytest.raises(ValueError, match="redis_timeout_ceiling"):
        Settings(redis_timeout_ceiling=float("nan"))


def test_the_socket_keeps_the_followed_deadline_across_check_outs(
    private_redis: RedisServer,
) -> None:
    """redis-py's pool resets a socket's timeout at each check-out (can_read): the
    deadline must survive that, with no socket call of ours per decision."""
    # The ceiling is the deadline a 40 ms round trip gives (3 x 40 ms): the test's own
    # round trips, however slow on a loaded host, cannot move it on.
    backend = RedisBackend(Settings(redis_url=private_redis.url, redis_timeout_ceiling=0.12))
    try:
        backend.prepare()
        trips = backend._round_trips
        trips.observe(0.04)  # slow: the deadline is 3 x 40 ms, from the floor's 50 ms
        assert trips.timeout_s == pytest.approx(0.12)
        for _ in range(3):
            backend.client.get("x")
        pool = backend.client.connection_pool
        conn = pool.get_connection()
        try:
            sock: Any = conn._sock
            assert sock.gettimeout() == pytest.approx(0.12)
        finally:
            pool.release(conn)
    finally:
        backend.close()
