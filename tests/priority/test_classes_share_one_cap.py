"""Priority classes inside one cap, read from MariaDB rows and decided on a real Redis
(and on ``memory://``, the model the failure policy runs): a channel row's reserve with
each interface row's ``priority`` gives bookings first call on the supplier's capacity.

Counts are exact (timeout 0, a bucket of 10 that refills one a second: a stall of a
loaded machine refills well under one permit); the wait of a lower class is asserted in
a range that holds on a loaded machine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, Priority
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from tests.support.clocks import DrivenClock
from tests.support.limiting import write_row
from tests.support.services import RedisServer

CHANNEL = "PRIO"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # the supplier's cap: 10 per 10 s, 10 stored; half of it kept for classes above
    # sheddable, a tenth of it for critical alone
    write_row(
        engine,
        "*",
        channelType=CHANNEL,
        rateLimit=10,
        periodSeconds=10,
        cache=0.0,
        reserve="default=0.1,sheddable=0.5",
    )
    write_row(engine, "/p/search", channelType=CHANNEL, rateLimit=1000, priority="sheddable")
    write_row(engine, "/p/book", channelType=CHANNEL, rateLimit=1000, priority="critical")
    write_row(engine, "/p/plain", rateLimit=10, cache=0.0)  # no reserve anywhere
    return limiter_db


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def limiter_redis_url(backend: str, redis_server: RedisServer) -> str:
    return redis_server.url if backend == "redis" else "memory://"


@pytest.fixture
def clock(backend: str) -> Clock:
    """The clock the limiter decides and waits on: on Redis the server's clock decides
    (a refill is a real second), so the system's; ``memory://`` decides on the
    limiter's, so one that moves only as the waits are slept, and a refill costs no
    real time."""
    return SYSTEM_CLOCK if backend == "redis" else DrivenClock()


@pytest.fixture
def limiter_settings(clock: Clock) -> dict[str, Any]:
    # patient with a loaded host's Redis: these tests are about classes, not timeouts,
    # and a reply past the default ceiling (0.2 s) would be decided by the policy
    return {"clock": clock, "redis_timeout": 0.5, "redis_timeout_ceiling": 2.0}


def test_searches_leave_the_reserve_that_bookings_then_take(lim: GatewayLimiter) -> None:
    searches = [lim.decide("/p/search", timeout=0) for _ in range(8)]
    assert [d.allowed for d in searches] == [True] * 5 + [False] * 3
    refused = searches[-1]
    assert refused.reason == "reserved"
    assert refused.priority == "sheddable"
    assert refused.retry_after is not None and 0.5 < refused.retry_after <= 1.0
    # a default call may go down to a tenth of the cap: 4 more
    defaults = [lim.decide("/p/search", timeout=0, priority="default") for _ in range(6)]
    assert [d.allowed for d in defaults] == [True] * 4 + [False] * 2
    assert defaults[-1].reason == "reserved" and defaults[-1].priority == "default"
    # bookings (the row's class: critical) take what is left, and then are limited
    book = [lim.decide("/p/book", timeout=0) for _ in range(3)]
    assert [d.allowed for d in book] == [True, False, False]
    assert book[0].priority == "critical"
    assert book[-1].reason == "limited"


def test_the_row_class_is_overridden_by_the_call(lim: GatewayLimiter) -> None:
    assert (
        sum(lim.try_acquire("/p/book", timeout=0, priority=Priority.SHEDDABLE) for _ in range(8))
        == 5
    )
    assert sum(lim.try_acquire("/p/search", timeout=0, priority="critical") for _ in range(8)) == 5


def test_a_lower_class_waits_without_reserving_and_asks_again(
    lim: GatewayLimiter, clock: Clock
) -> None:
    assert sum(lim.try_acquire("/p/search", timeout=0) for _ in range(6)) == 5
    began = clock.monotonic()
    waited = lim.decide("/p/search", timeout=3.0)  # one permit comes back in 1 s
    took = clock.monotonic() - began
    assert waited.allowed and waited.reason == "admitted"
    assert 0.5 <= took < 3.0
    # it took nothing ahead: a booking now still finds the whole reserve
    assert sum(lim.try_acquire("/p/book", timeout=0) for _ in range(8)) == 5


def test_with_no_higher_demand_a_lower_class_gets_the_whole_rate(
    lim: GatewayLimiter, clock: Clock
) -> None:
    """The reserve is a floor held back at each moment: once the burst above it is
    spent, searches alone still go at the cap's rate (within their budget)."""
    assert sum(lim.try_acquire("/p/search", timeout=0) for _ in range(6)) == 5
    began = clock.monotonic()
    admitted = sum(lim.try_acquire("/p/search", timeout=2.0) for _ in range(2))
    took = clock.monotonic() - began
    assert admitted == 2
    assert 1.0 <= took < 4.0  # one a second, as the cap refills


def test_an_interface_without_a_reserve_is_decided_as_before(lim: GatewayLimiter) -> None:
    for priority in Priority:
        assert lim.registry.snapshot.rules["/p/plain"].classed == ()
        d = lim.decide("/p/plain", timeout=0, priority=priority)
        assert d.allowed and d.priority == priority.value


def test_a_bad_priority_argument_is_named(lim: GatewayLimiter) -> None:
    with pytest.raises(ValueError, match="priority"):
        lim.try_acquire("/p/search", priority="urgent")
    with pytest.raises(TypeError, match="priority"):
        lim.try_acquire("/p/search", priority=3)  # type: ignore[arg-type]


async def test_asyncio_keeps_the_same_order(alim: AsyncGatewayLimiter) -> None:
    got = [await alim.decide("/p/search", timeout=0) for _ in range(6)]
    assert [d.allowed for d in got] == [True] * 5 + [False]
    assert got[-1].reason == "reserved"
    waited = await asyncio.wait_for(alim.decide("/p/search", timeout=3.0), 10)
    assert waited.allowed
    books = [await alim.try_acquire("/p/book", timeout=0) for _ in range(8)]
    assert sum(books) == 5


def test_the_metrics_count_each_class_apart(lim: GatewayLimiter) -> None:
    from prometheus_client import REGISTRY

    def count(reason: str, priority: str, outcome: str) -> float:
        labels = {"interface": "/p/search", "outcome": outcome, "reason": reason}
        found = REGISTRY.get_sample_value(
            "gateway_limiter_decisions_total", labels | {"priority": priority}
        )
        return found or 0.0

    before = count("reserved", "sheddable", "refused"), count("admitted", "critical", "admitted")
    assert sum(lim.try_acquire("/p/search", timeout=0) for _ in range(6)) == 5
    assert lim.try_acquire("/p/search", timeout=0, priority="critical")
    after = count("reserved", "sheddable", "refused"), count("admitted", "critical", "admitted")
    assert (after[0] - before[0], after[1] - before[1]) == (1.0, 1.0)


def test_a_lower_class_waits_on_the_limiters_clock(
    limiter_db: tuple[str, Engine], key_prefix: str
) -> None:
    """The wait before a lower class asks again is slept on ``clock=``, as every other
    wait, and ``memory://`` decides on that clock: on a clock that moves only when slept
    on, the permit comes back after that clock's second (the wait was an event no one
    set, waited on the system's clock, and ``memory://`` read the system's clock: found
    by the simulated fleet, whose clock is its own)."""
    clock = DrivenClock()
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url="memory://",
        key_prefix=key_prefix,
        reload_interval=3600,
        clock=clock,
    ) as lim:
        assert sum(lim.try_acquire("/p/search", timeout=0) for _ in range(6)) == 5
        answers: list[bool] = []
        asking = threading.Thread(
            target=lambda: answers.append(lim.decide("/p/search", timeout=3.0).allowed),
            daemon=True,
        )
        asking.start()
        asking.join(20.0)  # on the system's clock, the clock given never moves: no answer
        assert answers == [True]
        assert 0.5 <= clock.slept <= 3.0  # one permit comes back in 1 s of this clock


def test_a_lower_class_asking_more_than_a_bucket_holds_is_refused_at_once(
    limiter_db: tuple[str, Engine], key_prefix: str
) -> None:
    """7 permits of a default-class call on an interface of 3 per second (its bucket
    holds 3) under the channel's reserve: it can never go now, so it should be refused
    at once rather than wait out its budget (seed 80 of the simulated fleet)."""
    write_row(limiter_db[1], "/p/small", channelType=CHANNEL, rateLimit=3, cache=0.0)
    clock = DrivenClock()
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url="memory://",
        key_prefix=key_prefix,
        reload_interval=3600,
        clock=clock,
    ) as lim:
        began = time.monotonic()  # the driven clock moves only when slept on: real time too
        decision = lim.decide("/p/small", 7, timeout=5.0, priority="default")
        assert not decision.allowed
        assert decision.reason == "reserved" and decision.retry_after is None
        with pytest.raises(ValueError, match=r"permits must be at most 3 .* got 7"):
            lim.acquire("/p/small", 7, priority="default")
        assert clock.slept == 0.0
        assert time.monotonic() - began < 1.0


# Each path a lower class's call is decided on, and the most permits a default call can
# get from it at once: limits.lua (the interface's bucket of 3, no share of its own,
# under the channel's reserve), bucket.lua (a row's own reserve: half of 4), and
# bucket.lua with a calendar quota beside it (a reserve for sheddable only: default's
# share of the bucket is 0, so all 3 of it).
PATHS = {
    "limits.lua": ("/p/small", 3),
    "bucket.lua": ("/p/own", 2),
    "bucket.lua with a quota": ("/p/daily", 3),
}


@pytest.fixture
def edge_rows(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    # one permit a second each: a stall of a loaded machine refills well under the wait
    write_row(engine, "/p/small", channelType=CHANNEL, rateLimit=3, periodSeconds=3, cache=0.0)
    write_row(engine, "/p/own", rateLimit=4, periodSeconds=4, cache=0.0, reserve="default=0.5")
    write_row(engine, "/p/daily", rateLimit=3, periodSeconds=3, cache=0.0, reserve="sheddable=0.5")
    write_row(engine, "/p/daily", add=True, rateLimit=1000, cache=0.0, quotaPeriod="day")
    return limiter_db


@pytest.mark.parametrize("path", list(PATHS))
def test_a_lower_class_gets_all_its_bucket_gives_it_after_a_wait(
    edge_rows: tuple[str, Engine], lim: GatewayLimiter, clock: Clock, path: str
) -> None:
    """Exactly the most a default call can get at once: once spent, the same again is
    admitted after the bucket refills (2 or 3 s), not refused."""
    url, most = PATHS[path]
    lim.reload()
    assert lim.decide(url, most, timeout=0, priority="default").allowed
    began = clock.monotonic()
    again = lim.decide(url, most, timeout=5.0, priority="default")
    took = clock.monotonic() - began
    assert again.allowed and again.reason == "admitted"
    assert 1.0 <= took < 5.0


@pytest.mark.parametrize("path", list(PATHS))
def test_one_permit_more_than_its_bucket_gives_it_is_refused_at_once(
    edge_rows: tuple[str, Engine], lim: GatewayLimiter, clock: Clock, path: str
) -> None:
    """One more than a default call can ever get at once: refused at once with no
    retry_after, whatever its budget, full bucket or not; ``acquire`` names permits."""
    url, most = PATHS[path]
    lim.reload()
    for _ in range(2):  # a full bucket, then a spent one
        began, real = clock.monotonic(), time.monotonic()
        refused = lim.decide(url, most + 1, timeout=5.0, priority="default")
        assert clock.monotonic() - began < 1.0
        assert time.monotonic() - real < 1.0  # the driven clock (memory://) says 0 s anyway
        assert not refused.allowed and refused.retry_after is None
        assert refused.reason == "reserved" and refused.priority == "default"
        lim.decide(url, most, timeout=0, priority="default")
    with pytest.raises(ValueError, match=rf"permits must be at most {most} .* got {most + 1}"):
        lim.acquire(url, most + 1, priority="default")
    # critical takes the bucket's debt: it goes, after a wait
    assert lim.decide(url, most + 1, timeout=5.0, priority="critical").allowed
