"""Fleet membership and ``on_backend_error = "share"`` (docs/design.md, "When a service
fails"): each process beats in ``<prefix>:fleet`` and learns N; while Redis is away it
decides each rule at 1/N of it. Real Redis servers, killed where the test says so."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.fleet import decode_member, fleet_key
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.config.settings import Settings, SettingsError
from gateway_limiter.core.fleet import shared_out
from tests.support.clocks import DrivenClock
from tests.support.clusters import LocalCluster, LocalSentinel
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer
from tests.support.waiting import wait_for, wait_for_async

#: Short beats keep the tests quick; a member is dropped after three missed ones, so
#: 0.25 s lets a loaded 2-core host stall a heartbeat thread for 0.75 s unnoticed.
HEARTBEAT_S = 0.25


# --- shared_out: 1/N of a rule, never more -------------------------------------------


def test_a_token_bucket_is_shared_out_exactly_with_a_capacity_of_at_least_one() -> None:
    rule = Rule("/a", 40, 0.5, 1, capacity=40)
    quarter = shared_out(rule, 4)
    assert quarter.per_second == pytest.approx(10.0)
    assert quarter.burst == 10
    third = shared_out(Rule("/a", 10, 0.5, 1), 3)
    assert third.per_second == pytest.approx(10 / 3)  # exact: no rounding of the rate
    assert third.burst == 3  # floor: three processes hold 9 of 10
    tiny = shared_out(Rule("/a", 2, 0.5, 1), 8)
    assert tiny.per_second == pytest.approx(0.25)  # 2/s over 8 processes: one per 4 s each
    assert tiny.burst == 1  # a bucket must hold one permit to admit anything
    assert shared_out(rule, 1) is rule


@pytest.mark.parametrize("algorithm", [Algorithm.SLIDING_WINDOW, Algorithm.FIXED_WINDOW])
def test_a_window_is_shared_out_rounding_down_and_stretching_below_one(
    algorithm: Algorithm,
) -> None:
    assert (shared_out(Rule("/w", 40, 0.5, 1, algorithm=algorithm), 4).rate, 1) == (10, 1)
    seven = shared_out(Rule("/w", 10, 0.5, 1, algorithm=algorithm, period=60), 3)
    assert (seven.rate, seven.period) == (3, 60)  # 9 of 10 per minute: never over
    stretched = shared_out(Rule("/w", 2, 0.5, 1, algorithm=algorithm), 5)
    assert (stretched.rate, stretched.period) == (1, 3)  # 5 x 1 per 3 s <= 2/s
    assert 5 * stretched.rate / stretched.period <= 2


def test_every_limit_of_an_interface_is_shared_out_and_closed_stays_closed() -> None:
    per_minute = Rule("/m", 600, 0.5, 2, period=60, algorithm=Algorithm.SLIDING_WINDOW)
    per_caller = Rule("/m", 10, 0.5, 3, per_caller=True)
    rule = Rule("/m", 20, 0.5, 1, also=(per_minute, per_caller))
    out = shared_out(rule, 2)
    assert out.per_second == pytest.approx(10.0)
    assert [(r.rate, r.period, r.per_caller) for r in out.also] == [(300, 60, False), (10, 2, True)]
    assert out.also[1].per_second == pytest.approx(5.0)
    assert shared_out(Rule("/c", 0, 0.5, 1), 4).closed


# --- settings ------------------------------------------------------------------------


def test_share_is_the_default_and_the_fleet_settings_are_checked() -> None:
    assert Settings().on_backend_error == "share"
    assert (Settings().fleet_heartbeat, Settings().fleet_size) == (1.0, 0)
    with pytest.raises(SettingsError, match=r"fleet_heartbeat=0\.01"):
        Settings(fleet_heartbeat=0.01)
    with pytest.raises(SettingsError, match=r"fleet_size=-1"):
        Settings(fleet_size=-1)
    with pytest.raises(SettingsError, match=r"on_backend_error=shared: must be one of share"):
        Settings(on_backend_error="shared")


# --- membership ----------------------------------------------------------------------


def test_processes_learn_the_fleet_size_and_one_that_closes_leaves_at_once(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, _ = migrated_db
    lims = [
        limiter(url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S) for _ in range(3)
    ]
    try:
        wait_for(lambda: [lim.fleet_size for lim in lims] == [3, 3, 3], 3)
        members, _ = lims[0].backend.members()
        stored: list[bytes] = private_redis.client().zrange(fleet_key(key_prefix), 0, -1)  # type: ignore[assignment]
        assert {m.decode() for m in stored} == {text for text, _ in members}
        described = [decode_member(text) for text, _ in members]
        assert {d["pid"] for d in described} == {os.getpid()}
        assert all(d["version"] and d["host"] and d["since"] > 0 for d in described)
        lims.pop().close()
        wait_for(lambda: [lim.fleet_size for lim in lims] == [2, 2], 2)
    finally:
        for lim in lims:
            lim.close()


def test_a_member_that_stops_beating_is_dropped_after_its_time_to_live(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, _ = migrated_db
    lim = limiter(url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S)
    try:
        # a process that then died; its 2 s leave this process's heartbeat time to see it
        # (a loaded host may hold that thread for a while), and then to drop it
        lim.backend.heartbeat('{"host":"gone","pid":1}', 2000)
        wait_for(lambda: lim.fleet_size == 2, 2)
        wait_for(lambda: lim.fleet_size == 1, 5)  # 2 s on, the next heartbeat drops it
        assert private_redis.client().zcard(fleet_key(key_prefix)) == 1
    finally:
        lim.close()


def test_membership_costs_one_round_trip_per_heartbeat(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, _ = migrated_db
    admin = private_redis.client()
    lim = limiter(url, private_redis.url, key_prefix, fleet_heartbeat=0.2)
    try:
        admin.config_resetstat()
        started = time.monotonic()
        # real time: heartbeats counted over real seconds
        time.sleep(2.0)
        stats = admin.info("commandstats")
        elapsed = time.monotonic() - started
    finally:
        lim.close()
    evals = int(stats.get("cmdstat_eval", {}).get("calls", 0))
    assert 1 <= evals <= elapsed / 0.2 + 1  # one EVAL per heartbeat at most
    # the ZADD (with ZREMRANGEBYSCORE and ZCARD) runs inside that EVAL, once per EVAL
    assert int(stats["cmdstat_zadd"]["calls"]) == evals


async def test_the_asyncio_limiter_beats_too(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, _ = migrated_db
    sync = limiter(url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S)
    try:
        async with AsyncGatewayLimiter(
            database_url=url,
            redis_url=private_redis.url,
            key_prefix=key_prefix,
            fleet_heartbeat=HEARTBEAT_S,
        ) as alim:
            assert alim.fleet_size == 2  # the first heartbeat is part of start()
            await wait_for_async(lambda: sync.fleet_size == 2, 2, "the sync limiter to see it")
        await wait_for_async(lambda: sync.fleet_size == 1, 2, "aclose() to leave the fleet")
    finally:
        sync.close()


def test_memory_is_a_fleet_of_one(migrated_db: tuple[str, Engine]) -> None:
    url, _ = migrated_db
    with GatewayLimiter(database_url=url, redis_url="memory://") as lim:
        assert lim.fleet_size == 1


def test_the_fleet_size_is_a_metric(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, _ = migrated_db
    lims = [
        limiter(url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S) for _ in range(2)
    ]
    try:
        wait_for(lambda: lims[0].fleet_size == lims[1].fleet_size == 2, 3)
        # The gauge reads the newest limiter at each scrape: it follows the heartbeats.
        wait_for(lambda: REGISTRY.get_sample_value("gateway_limiter_fleet_size") == 2, 3)
    finally:
        for lim in lims:
            lim.close()


# --- share while Redis is away ---------------------------------------------------------


def burst(lim: GatewayLimiter, url: str, calls: int = 60) -> int:
    """Of ``calls`` calls in a row on ``url``, how many ``lim`` admitted."""
    return sum(lim.try_acquire(url, timeout=0) for _ in range(calls))


@pytest.mark.parametrize("algorithm", ["token_bucket", "sliding_window"])
def test_share_decides_at_one_nth_of_the_rule_while_redis_is_away(
    algorithm: str, migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/s", rateLimit=40, cache=0.0, algorithm=algorithm)
    write_row(engine, "/probe", rateLimit=1000, cache=0.0)
    # the fallback decides on the limiter's clock: this one moves only when told to
    clock = DrivenClock()
    lim = limiter(url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S, clock=clock)
    try:
        for n in range(3):  # three other live processes
            lim.backend.heartbeat(f'{{"host":"other","pid":{n}}}', 60_000)
        wait_for(lambda: lim.fleet_size == 4, 2)
        private_redis.kill()

        def probed() -> bool:  # decided by share on a clock that stands still: refused
            lim.try_acquire("/probe", timeout=0)
            return not lim.backend_healthy

        # a call on another interface finds Redis gone; the breaker is the process's
        wait_for(probed, 2, "a call to find Redis gone")
        assert lim.fleet_size == 4  # the last N seen stays while Redis is away
        # share starts its part of the bucket empty: on a clock that has not moved, nothing
        assert burst(lim, "/s") == 0
        # R/N: 40/s over 4 processes, its part 0.95 of a quarter (its demand is the
        # fleet's average): 9.5/s, asked for every quarter of a second over 4 s
        rate = 40 * lim._fleet.part(lim.registry.snapshot.rules["/s"])
        assert 9.0 <= rate <= 10.0
        got = []
        for _ in range(16):
            clock.advance(0.25)
            got.append(burst(lim, "/s"))
        assert max(sum(got[i : i + 4]) for i in range(len(got) - 3)) <= math.ceil(rate)
        assert 3 * math.floor(rate) <= sum(got) <= 4 * rate, got
    finally:
        lim.close()


def test_local_still_decides_the_whole_rule(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/l", rateLimit=40, cache=0.0)
    write_row(engine, "/probe", rateLimit=1000, cache=0.0)
    lim = limiter(
        url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S, on_backend_error="local"
    )
    try:
        for n in range(3):
            lim.backend.heartbeat(f'{{"host":"other","pid":{n}}}', 60_000)
        wait_for(lambda: lim.fleet_size == 4, 2)
        private_redis.kill()
        wait_for(lambda: lim.try_acquire("/probe", timeout=0) and not lim.backend_healthy, 2)
        assert burst(lim, "/l") >= 40  # the whole capacity of 40, not 10
    finally:
        lim.close()


def test_never_reached_redis_uses_fleet_size_or_decides_as_local_with_one_warning(
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/n", rateLimit=40, cache=0.0)
    private_redis.kill()
    caplog.set_level(logging.WARNING, logger="gateway_limiter")
    unknown = limiter(url, private_redis.url, key_prefix)
    clock = DrivenClock()  # the fallback's clock: it moves only when told to
    known = limiter(url, private_redis.url, key_prefix, fleet_size=4, clock=clock)
    try:
        assert (unknown.fleet_size, known.fleet_size) == (0, 4)
        assert burst(known, "/n") == 0  # its part (10) starts empty: nothing refilled yet
        clock.advance(1.0)
        assert burst(known, "/n") == 10  # R/4 = 10 per second
        assert burst(unknown, "/n") >= 40  # the whole rule, as local
        burst(unknown, "/n")
        warnings = [r for r in caplog.records if "fleet_size is 0" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        unknown.close()
        known.close()


@pytest.mark.parametrize("topology", ["redis_cluster", "redis_sentinel"])
def test_membership_works_on_a_cluster_and_behind_sentinel(
    topology: str,
    request: pytest.FixtureRequest,
    migrated_db: tuple[str, Engine],
    key_prefix: str,
) -> None:
    url, _ = migrated_db
    where: LocalCluster | LocalSentinel = request.getfixturevalue(topology)
    lims = [limiter(url, where.url, key_prefix, fleet_heartbeat=HEARTBEAT_S) for _ in range(2)]
    try:
        wait_for(lambda: [lim.fleet_size for lim in lims] == [2, 2], 5)
        members, _ = lims[0].backend.members()
        assert len(members) == 2
        assert "{" not in fleet_key(key_prefix)  # never an interface's key: those carry {...}
    finally:
        for lim in lims:
            lim.close()


def test_a_shared_out_decision_shows_the_rate_this_process_enforces(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/d", rateLimit=40, cache=0.0)
    write_row(engine, "/probe", rateLimit=1000, cache=0.0)
    lim = limiter(url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S)
    try:
        on_redis = lim.decide("/d", timeout=0)
        assert (on_redis.limit, on_redis.effective_rate) == (40, 40)
        for n in range(3):
            lim.backend.heartbeat(f'{{"host":"other","pid":{n}}}', 60_000)
        wait_for(lambda: lim.fleet_size == 4 and 0 < lim._fleet.claims.get("/d", 1) < 1, 2)
        part = lim._fleet.part(lim.registry.snapshot.rules["/d"])
        assert 0.2 <= part <= 0.25  # 0.95 of a quarter: its demand is the fleet's average
        private_redis.kill()
        wait_for(lambda: lim.try_acquire("/probe", timeout=0) and not lim.backend_healthy, 2)
        shared = lim.decide("/d", timeout=0)
        assert shared.reason == "backend_fallback"
        assert shared.effective_rate == pytest.approx(40 * part)
        assert shared.limit == int(40 * part)
        assert shared.headers()["X-RateLimit-Limit"] == str(int(40 * part))
    finally:
        lim.close()


@pytest.mark.parametrize("asyncio_limiter", [False, True])
async def test_back_on_redis_the_shared_bucket_is_charged_for_what_was_admitted_alone(
    asyncio_limiter: bool,
    migrated_db: tuple[str, Engine],
    private_redis: RedisServer,
    key_prefix: str,
) -> None:
    """Alone in its fleet (its part: the whole rule), a process admits about 10 calls
    in-process during a 1 s outage of a 10/s rule; Redis comes back empty (a full
    bucket of 10). The next heartbeat charges the shared bucket those permits (at most
    its part of the capacity, 10), so the fleet cannot spend a fresh burst on top."""
    url, engine = migrated_db
    write_row(engine, "/c", rateLimit=10, cache=0.0)
    write_row(engine, "/probe", rateLimit=1000, cache=0.0)
    if asyncio_limiter:
        alim = AsyncGatewayLimiter(
            database_url=url,
            redis_url=private_redis.url,
            key_prefix=key_prefix,
            fleet_heartbeat=HEARTBEAT_S,
            breaker_seconds=0.2,
        )
        await alim.start()
        fleet = alim._fleet
    else:
        lim = limiter(
            url, private_redis.url, key_prefix, fleet_heartbeat=HEARTBEAT_S, breaker_seconds=0.2
        )
        fleet = lim._fleet

    async def call(u: str) -> bool:
        if asyncio_limiter:
            return await alim.try_acquire(u, timeout=0)
        return lim.try_acquire(u, timeout=0)

    try:
        private_redis.kill()
        alone = 0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            alone += await call("/c")
            await asyncio.sleep(0.005)
        assert 5 <= alone <= 14  # its part (all of 10/s), starting empty
        private_redis.start()  # empty: the bucket of /c would be full
        deadline = time.monotonic() + 5
        while not await call("/probe"):  # the breaker closes: the charge is due
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        while fleet.charged < alone:  # the charge rides the next heartbeat
            assert time.monotonic() < deadline, f"charged {fleet.charged} of {alone}"
            await asyncio.sleep(0.01)
        assert fleet.charged == min(alone, 10)  # never more than its part of the bucket
        after = [await call("/c") for _ in range(20)]
        # without the charge: 10 at once (a full bucket); with it: what is left and
        # what refilled since (10/s)
        assert sum(after) <= 10 - fleet.charged + 3, f"{after} after {alone} admitted alone"
    finally:
        if asyncio_limiter:
            await alim.aclose()
        else:
            lim.close()
