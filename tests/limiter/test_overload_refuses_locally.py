"""Under overload, hopeless callers are refused in-process, with no Redis round trip,
and exactly: no caller who could have had a permit within its timeout is refused.

Real limiters on real MariaDB/SQLite and a private redis-server; Redis's own
``INFO commandstats`` counts the round trips that really happened.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.decision import Reason
from gateway_limiter.core.local_refusal import LocalRefusals
from gateway_limiter.model.bucket import US_PER_S
from tests.support.clocks import DrivenClock
from tests.support.limiting import evalsha_calls, set_switch, write_row
from tests.support.services import RedisServer


@pytest.fixture
def db(migrated_any_db: tuple[str, Engine]) -> tuple[str, Engine]:
    return migrated_any_db


@pytest.fixture
def limiter_db(db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(db[1], "/slow", rateLimit=1, cache=0.0)  # one permit a second
    return db


@pytest.fixture
def limiter_redis_url(private_redis: RedisServer) -> str:
    return private_redis.url


#: Patient Redis reads: on a loaded host a round trip can pass the default deadline, and
#: a backend failure forgets what was learnt (a test of its own, below).
PATIENT: dict[str, Any] = {"redis_timeout": 2.0, "redis_timeout_ceiling": 2.0}
#: A loaded host can stall a test's calls past the second a permit takes at 1/s (then
#: Redis admits or refuses the later ones itself): such a pattern is tried afresh, on an
#: interface of its own, until one attempt is quick.
ATTEMPTS = 5


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600, **PATIENT}


def test_a_burst_past_the_rate_costs_one_round_trip_until_the_next_permit(
    lim: GatewayLimiter, private_redis: RedisServer
) -> None:
    client = private_redis.client()
    assert lim.try_acquire("/slow")  # the one stored permit
    counted = REGISTRY.get_sample_value("gateway_limiter_local_refusals_total") or 0.0
    before = evalsha_calls(client)
    start = time.monotonic()
    answers = [lim.try_acquire("/slow") for _ in range(200)]
    took = time.monotonic() - start
    trips = evalsha_calls(client) - before
    assert not any(answers)  # nothing admitted before the next permit, a second away
    assert trips + lim.local_refusals == 200  # each call: a round trip or a local refusal
    if took < 0.9:  # the whole burst fell before the next permit (always, unless starved)
        assert trips == 0  # the admission's reply already said when the next permit comes
    assert lim.local_refusals >= 100
    metric = REGISTRY.get_sample_value("gateway_limiter_local_refusals_total")
    assert metric == counted + lim.local_refusals  # the process's metric counts them too


def test_a_caller_who_can_wait_for_the_next_permit_is_asked_about_not_refused(
    lim: GatewayLimiter,
) -> None:
    start = time.monotonic()
    assert lim.try_acquire("/slow")
    assert not lim.try_acquire("/slow")  # learns: next permit in ~1 s
    refused = lim.local_refusals
    verdict = lim.reserve("/slow", timeout=2.0)  # 2 s reaches it: Redis decides
    took = time.monotonic() - start
    assert verdict.allowed
    # the next permit, a second after the first: less only the time the calls took
    assert (1.0 - took - 0.01) * US_PER_S <= verdict.wait_us <= 1.0 * US_PER_S
    assert lim.local_refusals == refused


def test_a_local_refusal_says_why_and_when_to_come_back(
    lim: GatewayLimiter, db: tuple[str, Engine]
) -> None:
    for attempt in range(ATTEMPTS):
        write_row(db[1], f"/why/{attempt}", rateLimit=1, cache=0.0)
    lim.reload()
    for attempt in range(ATTEMPTS):
        url, started = f"/why/{attempt}", time.monotonic()
        assert lim.try_acquire(url)
        assert not lim.try_acquire(url)
        refused = lim.local_refusals
        decision = lim.decide(url)
        if time.monotonic() - started < 0.9:
            break
    assert lim.local_refusals == refused + 1
    assert not decision.allowed and decision.reason == Reason.LIMITED
    assert decision.retry_after is not None and 0.0 < decision.retry_after <= 1.0
    assert int(decision.headers()["Retry-After"]) >= 1


def test_after_the_next_permit_is_due_callers_go_to_redis_again(lim: GatewayLimiter) -> None:
    assert lim.try_acquire("/slow")
    assert not lim.try_acquire("/slow")
    time.sleep(1.05)  # real time: the permit is due on Redis' clock
    assert lim.try_acquire("/slow")  # the local refusal passed: asked, and admitted


def test_a_rate_change_forgets_what_was_learnt(lim: GatewayLimiter, db: tuple[str, Engine]) -> None:
    assert lim.try_acquire("/slow")
    assert not lim.try_acquire("/slow")  # next permit in ~1 s
    write_row(db[1], "/slow", rateLimit=1000)
    summary = lim.reload()
    assert summary.changed == ("/slow",)
    assert len(lim._local_refusals or ()) == 0
    refused = lim.local_refusals
    assert lim.try_acquire("/slow")  # at 1000/s the debt is gone within a millisecond
    assert lim.local_refusals == refused


def test_a_switch_change_forgets_what_was_learnt(
    lim: GatewayLimiter, db: tuple[str, Engine]
) -> None:
    assert lim.try_acquire("/slow")
    assert not lim.try_acquire("/slow")
    assert len(lim._local_refusals or ()) == 1
    set_switch(db[1], 0)
    lim.reload()
    assert len(lim._local_refusals or ()) == 0


def test_a_redis_failure_forgets_what_was_learnt(
    lim: GatewayLimiter, private_redis: RedisServer
) -> None:
    assert lim.try_acquire("/slow")
    assert not lim.try_acquire("/slow")
    assert len(lim._local_refusals or ()) == 1
    private_redis.kill()
    lim.try_acquire("/other-never-limited")  # not limited: no Redis, nothing forgotten
    assert len(lim._local_refusals or ()) == 1
    lim.try_acquire("/slow", timeout=5.0)  # can reach the local refusal: asks Redis, which is gone
    assert not lim.backend_healthy
    assert len(lim._local_refusals or ()) == 0


def test_per_caller_limits_keep_a_local_refusal_per_caller(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = db
    write_row(engine, "/per", rateLimit=1, cache=0.0, perCaller=1)
    with GatewayLimiter(
        database_url=url, redis_url=private_redis.url, key_prefix=key_prefix
    ) as lim:
        # At 1/s, alice's next permit comes a second after her first: the two refusals
        # are local only if they come within that second. A loaded host can stall the
        # three calls for longer (then Redis admits or refuses the later ones itself),
        # so the pattern is tried afresh, with a caller of its own, until one is quick.
        for attempt in range(5):
            alice, before, started = f"alice-{attempt}", lim.local_refusals, time.monotonic()
            assert lim.try_acquire("/per", key=alice)
            second = lim.try_acquire("/per", key=alice)
            third = lim.try_acquire("/per", key=alice)
            if time.monotonic() - started < 0.9:
                break
        assert not second and not third
        assert lim.local_refusals - before == 2  # the admission said when the next comes
        assert lim.try_acquire("/per", key="bob")  # bob's own bucket: not refused for alice's


def test_a_window_far_ahead_is_asked_about_again_within_a_second(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    """A fixed window of an hour: its next slot is an hour away, but a process keeps
    that moment only a second ahead, so state Redis lost without an error (FLUSHALL)
    holds no caller back for longer than that."""
    url, engine = db
    write_row(engine, "/hourly", rateLimit=1, cache=0.0, periodSeconds=3600,
               algorithm="fixed_window")  # fmt: skip
    clock = DrivenClock()  # the moment a process keeps is on the limiter's clock
    with GatewayLimiter(
        database_url=url, redis_url=private_redis.url, key_prefix=key_prefix, clock=clock
    ) as lim:
        assert lim.try_acquire("/hourly")
        assert not lim.try_acquire("/hourly")
        assert lim.local_refusals == 1
        private_redis.client().flushall()  # an operator resets the quota by hand
        clock.advance(0.9)
        assert not lim.try_acquire("/hourly")  # within the second: refused in-process
        assert lim.local_refusals == 2
        clock.advance(0.15)
        assert lim.try_acquire("/hourly")  # asked Redis again: a fresh window


async def test_asyncio_refuses_locally_too(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = db
    for attempt in range(ATTEMPTS):
        write_row(engine, f"/aslow/{attempt}", rateLimit=1, cache=0.0)
    client = private_redis.client()
    async with AsyncGatewayLimiter(
        database_url=url, redis_url=private_redis.url, key_prefix=key_prefix, **PATIENT
    ) as lim:
        for attempt in range(ATTEMPTS):
            aslow, started = f"/aslow/{attempt}", time.monotonic()
            refused = lim.local_refusals
            assert await lim.try_acquire(aslow)
            before = evalsha_calls(client)
            answers = await asyncio.gather(*(lim.try_acquire(aslow) for _ in range(100)))
            trips = evalsha_calls(client) - before
            assert not any(answers)
            assert trips + lim.local_refusals - refused == 100
            # Concurrent callers all ask before the first reply arrives; later ones don't.
            again = await asyncio.gather(*(lim.try_acquire(aslow) for _ in range(100)))
            later_trips = evalsha_calls(client) - before - trips
            if time.monotonic() - started < 0.9:
                break
        assert not any(again)
        assert later_trips == 0  # all refused here


def test_the_map_is_bounded() -> None:
    refusals = LocalRefusals()
    rule = Rule("/x", 1, 0.0, 1)
    for i in range(LocalRefusals.LIMIT + 10):
        refusals.learn(Rule(f"/u{i}", 1, 0.0, i), None, (0.0, 0), 1e6)
    assert len(refusals) <= LocalRefusals.LIMIT
    refusals.learn(rule, None, (100.0, 0), 0.8e6)  # free at 100.8 s on the monotonic clock
    assert refusals.refusal(rule, None, 0.2, 100.5) is not None  # 100.7 < 100.8
    assert refusals.refusal(rule, None, 0.3, 100.5) is None  # 100.8 reaches it
    assert refusals.refusal(Rule("/x", 2, 0.0, 1), None, 0.0, 100.5) is None  # another rule


def test_a_moment_is_kept_at_most_a_second_ahead_and_never_across_a_forget() -> None:
    refusals, rule = LocalRefusals(), Rule("/x", 1, 0.0, 1)
    refusals.learn(rule, None, (100.0, 0), 3600e6)  # a window free in an hour
    assert refusals.refusal(rule, None, 0.0, 100.9) is not None
    assert refusals.refusal(rule, None, 0.0, 101.0) is None  # kept 1 s ahead, no more
    asked = (200.0, refusals.generation)
    refusals.forget()  # e.g. Redis failed while that request was out
    refusals.learn(rule, None, asked, 0.5e6)
    assert len(refusals) == 0  # the reply of before the forget is not learnt


async def test_asyncio_callers_queued_in_a_burst_learn_no_later_moment_than_the_real_one(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    """Callers queued behind a burst are sent late; what they learn counts from the
    moment their call was written, so it never runs past the real next permit."""
    url, engine = db
    write_row(engine, "/burst", rateLimit=2, cache=0.0)  # next permit 0.5 s after each
    async with AsyncGatewayLimiter(
        database_url=url, redis_url=private_redis.url, key_prefix=key_prefix
    ) as lim:
        began = time.monotonic()
        answers = await asyncio.gather(*(lim.try_acquire("/burst") for _ in range(600)))
        took = time.monotonic() - began
        # the stored burst, then nothing within 0 s: but for what a loaded host's slow
        # burst let refill (2/s) while it lasted
        assert 2 <= sum(answers) <= 2 + int(2 * took)
        start = time.monotonic()
        # One permit comes 0.5 s after the burst: a caller who can wait 0.6 s is not
        # refused in-process, whatever the 600 calls taught.
        assert await lim.try_acquire("/burst", timeout=0.6)
        assert time.monotonic() - start <= 0.6 + 0.3
