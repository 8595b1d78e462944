"""Every descriptor of one rate limit request decided together on a real Redis: the
same rows, algorithms, periods and channel caps as a Python caller gets, all or nothing
(``gateway_limiter/rls/judge.py``, ``backends/descriptors.lua``)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.rls.answers import DECIDED_BY, answer
from gateway_limiter.rls.descriptors import Wanted
from gateway_limiter.rls.judge import Judge
from tests.support.clusters import LocalCluster
from tests.support.limiting import write_row
from tests.support.services import RedisServer

HOUR = 3600


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # per hour: nothing refills while a test runs
    write_row(engine, "/a", rateLimit=3, periodSeconds=HOUR, cache=0.0)
    write_row(engine, "/b", rateLimit=1, periodSeconds=HOUR, cache=0.0)
    write_row(engine, "/w", rateLimit=2, periodSeconds=HOUR, algorithm="sliding_window", cache=0)
    write_row(engine, "/c1", rateLimit=100, channelType="IBE", cache=0.0)
    write_row(engine, "/c2", rateLimit=100, channelType="IBE", cache=0.0)
    write_row(engine, "*", rateLimit=3, periodSeconds=HOUR, channelType="IBE", cache=0.0)
    write_row(engine, "/p", rateLimit=2, periodSeconds=HOUR, perCaller=1, cache=0.0)
    write_row(engine, "/closed", rateLimit=0, cache=0.0)
    write_row(engine, "/s", rateLimit=1, periodSeconds=HOUR, shadow=1, cache=0.0)
    write_row(engine, "/lease", rateLimit=1000, leaseMs=1000, cache=0.0)
    write_row(engine, "/q", rateLimit=2, quotaPeriod="month", timeZone="Asia/Shanghai", cache=0)
    return limiter_db


def w(interface: str | None, caller: str | None = None, permits: int = 1) -> Wanted:
    return Wanted(interface, caller, permits)


async def test_a_refusal_takes_nothing_from_the_other_descriptors(
    alim: AsyncGatewayLimiter,
) -> None:
    judge = Judge(alim)
    first = await judge.judge("d", [w("/a"), w("/b")])
    assert first.allowed and first.decided_by == "redis"
    # /b is spent: the pair is refused, and /a keeps the permit the pair would have taken
    for _ in range(3):
        refused = await judge.judge("d", [w("/a"), w("/b")])
        assert not refused.allowed
        assert [j.admitted for j in refused.judged] == [True, False]
    assert [(await alim.decide("/a", timeout=0)).allowed for _ in range(3)] == [True, True, False]


async def test_windows_and_buckets_together_as_a_python_caller_sees_them(
    alim: AsyncGatewayLimiter,
) -> None:
    judge = Judge(alim)
    assert (await judge.judge("d", [w("/w"), w("/a", permits=2)])).allowed
    # the window has one left, the bucket one: asking two of the bucket refuses both
    assert not (await judge.judge("d", [w("/w"), w("/a", permits=2)])).allowed
    assert (await judge.judge("d", [w("/w"), w("/a")])).allowed
    assert not (await alim.decide("/w", timeout=0)).allowed
    assert not (await alim.decide("/a", timeout=0)).allowed


async def test_two_interfaces_of_one_channel_both_count_against_its_cap(
    alim: AsyncGatewayLimiter,
) -> None:
    judge = Judge(alim)
    assert (await judge.judge("d", [w("/c1"), w("/c2")])).allowed  # 2 of the channel's 3
    both = await judge.judge("d", [w("/c1"), w("/c2")])  # would be 4: none taken
    assert not both.allowed
    assert (await alim.decide("/c2", timeout=0)).allowed  # the third
    assert not (await alim.decide("/c1", timeout=0)).allowed


async def test_callers_and_unknown_interfaces(alim: AsyncGatewayLimiter) -> None:
    judge = Judge(alim)
    for _ in range(2):
        assert (await judge.judge("d", [w("/p", "alice"), w("/nowhere")])).allowed
    judged = await judge.judge("d", [w("/p", "alice"), w(None), w("/nowhere")])
    assert not judged.allowed
    assert [j.admitted for j in judged.judged] == [False, True, True]
    assert (await judge.judge("d", [w("/p", "bob")])).allowed  # a caller of its own


async def test_closed_and_shadow_rows(alim: AsyncGatewayLimiter) -> None:
    judge = Judge(alim)
    closed = await judge.judge("d", [w("/a"), w("/closed")])
    assert not closed.allowed
    assert (await alim.decide("/a", timeout=0)).remaining == 2  # nothing was taken
    shadowed = {"interface": "/s", "outcome": "admitted", "reason": "shadow", "priority": "default"}
    before = REGISTRY.get_sample_value("gateway_limiter_decisions_total", shadowed) or 0.0
    for _ in range(3):  # the shadow row would refuse after one: answered OK all the same
        assert (await judge.judge("d", [w("/s")])).allowed
    # and counted as a Python caller's would be: two of the three it would have refused
    assert REGISTRY.get_sample_value("gateway_limiter_decisions_total", shadowed) == before + 2


async def test_the_answer_names_the_row_in_envoys_units(alim: AsyncGatewayLimiter) -> None:
    judge = Judge(alim)
    await judge.judge("d", [w("/b")])
    done = answer(alim, await judge.judge("d", [w("/a"), w("/b")]))
    assert not done.ok
    a, b = done.statuses
    assert a.ok and not b.ok
    assert b.limit is not None and (b.limit.requests_per_unit, b.limit.unit) == (1, 3)  # HOUR
    assert b.limit.exact and "configId" in b.limit.name
    assert b.reset_s is not None and 3000 < b.reset_s <= HOUR
    assert done.headers["X-RateLimit-Limit"] == "1"
    assert done.headers["X-RateLimit-Remaining"] == "0"
    assert 3000 < int(done.headers["Retry-After"]) <= HOUR
    assert done.headers[DECIDED_BY] == "redis"


async def test_a_calendar_quota_goes_together_and_is_said_per_month(
    alim: AsyncGatewayLimiter,
) -> None:
    judge = Judge(alim)
    first = await judge.judge("d", [w("/q"), w("/a")])
    assert first.allowed
    # /a has two left: asking three refuses it in the script, after /q took its permit
    refused = await judge.judge("d", [w("/q"), w("/a", permits=3)])
    assert not refused.allowed
    assert [j.admitted for j in refused.judged] == [True, False]
    done = answer(alim, refused)
    q = done.statuses[0]
    assert q.limit is not None and (q.limit.requests_per_unit, q.limit.unit) == (2, 5)  # MONTH
    assert q.limit.exact and "per month in Asia/Shanghai" in q.limit.name
    assert q.remaining == 2 - 1  # the pair's permit given back: one of two used
    # the quota kept the one permit the first pair took, not the refused pair's
    second = await alim.decide("/q", timeout=0)
    assert second.allowed and second.remaining == 0 and second.reset_at is not None
    assert not (await alim.decide("/q", timeout=0)).allowed
    spent = answer(alim, await judge.judge("d", [w("/q")]))
    assert not spent.ok and not spent.statuses[0].ok
    reset_s = spent.statuses[0].reset_s
    assert reset_s is not None and 0 < reset_s <= 31 * 86_400
    assert spent.headers["X-RateLimit-Limit"] == "2"


async def test_the_script_is_loaded_again_after_a_flush(
    alim: AsyncGatewayLimiter, redis_server: RedisServer
) -> None:
    judge = Judge(alim)
    assert (await judge.judge("d", [w("/a"), w("/w")])).allowed
    redis_server.client().script_flush()
    assert (await judge.judge("d", [w("/a"), w("/w")])).allowed
    assert (await alim.decide("/a", timeout=0)).remaining == 0


@pytest.mark.slow
async def test_on_a_cluster_one_channel_goes_together_and_other_interfaces_one_by_one(
    limiter_db: tuple[str, Engine], redis_cluster: LocalCluster, key_prefix: str
) -> None:
    settings = {
        "database_url": limiter_db[0],
        "redis_url": redis_cluster.url,
        "key_prefix": key_prefix,
    }
    async with AsyncGatewayLimiter(**settings) as limiter, AsyncGatewayLimiter(**settings) as other:
        judge = Judge(limiter)
        # one channel, one hash tag: together, all or nothing, as on one Redis
        assert (await judge.judge("d", [w("/c1"), w("/c2")])).allowed
        assert not (await judge.judge("d", [w("/c1"), w("/c2")])).allowed
        assert (await limiter.decide("/c1", timeout=0)).allowed  # the channel's third
        # interfaces of their own slots: one by one, so /a took its permit though /b
        # refused (the documented difference)
        # (/b spent by another process: this one has learnt nothing of it, and asks)
        assert (await other.decide("/b", timeout=0)).allowed
        refused = await judge.judge("d", [w("/a"), w("/b")])
        assert not refused.allowed
        assert [j.admitted for j in refused.judged] == [True, False]
        assert (await limiter.decide("/a", timeout=0)).remaining == 1


async def test_a_lease_row_among_several_leaves_the_lease_free_for_the_next_caller(
    alim: AsyncGatewayLimiter,
) -> None:
    judge = Judge(alim)
    for _ in range(3):
        assert (await judge.judge("d", [w("/lease"), w("/c1")])).allowed
        # the lease renewal the request began and did not send is given up at once:
        # the next caller does not wait for it
        began = time.monotonic()
        assert (await alim.decide("/lease", timeout=0)).allowed
        assert time.monotonic() - began < 0.2
