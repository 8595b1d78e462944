"""A call asking for more permits than a limit can ever give it is refused at once: no
``retry_after`` whatever its budget, with the figures of the limit that can never give
it, ``reserved`` when it is the class's share that can never give it, else ``limited``.
Whatever the state of the interface's other limits: a per-second row full or partly
drained beside a paced daily quota (more than its burst), an unpaced daily quota fresh
or spent (more than its permits per period), a row keeping a reserve for the classes
above sheddable (more than sheddable can take at once), alone, beside a paced quota
(``bucket.lua``'s pair) or with a third limit (``limits.lua``). On a real Redis, where a
process refuses on its own until a reply's next free moment, and on ``memory://``;
threaded and asyncio. Exactly the most goes when there is room, and otherwise is
refused with a finite wait."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import Decision, GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.model.calendar import Calendar
from tests.support.limiting import write_row

ZONE = "Asia/Shanghai"
PER_SECOND = 20
BUDGET = 0.2
DAILY = 50_000
BURST = 10
SMALL = 5
SHEDDABLE_MOST = 10  # half of the 20/s row kept for the classes above sheddable

PACED = ["/over/paced", "/over/paced3"]
DAILY_URLS = ["/over/daily", "/over/daily3"]
CLASSES = ["/over/classes", "/over/classes_paced", "/over/classes3"]


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, limiter_redis_url: str) -> str:
    return limiter_redis_url if request.param == "redis" else "memory://"


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {"reload_interval": 3600}


def _third(engine: Engine, url: str) -> None:
    """A third limit that never binds: the interface is then limits.lua's."""
    write_row(
        engine, url, add=True, rateLimit=10_000, cache=BUDGET, periodSeconds=60,
        algorithm="fixed_window",
    )  # fmt: skip


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = limiter_db[1]
    for url in PACED:
        write_row(engine, url, rateLimit=PER_SECOND, cache=BUDGET)
        write_row(
            engine, url, add=True, rateLimit=DAILY, cache=BUDGET, quotaPeriod="day",
            timeZone=ZONE, quotaPacing=1, maxPermits=BURST,
        )  # fmt: skip
    for url in DAILY_URLS:
        write_row(engine, url, rateLimit=PER_SECOND, cache=BUDGET)
        write_row(
            engine, url, add=True, rateLimit=SMALL, cache=BUDGET, quotaPeriod="day", timeZone=ZONE
        )
    for url in CLASSES:
        write_row(engine, url, rateLimit=PER_SECOND, cache=BUDGET, reserve="sheddable=0.5")
    write_row(
        engine, "/over/classes_paced", add=True, rateLimit=DAILY, cache=BUDGET,
        quotaPeriod="day", timeZone=ZONE, quotaPacing=1, maxPermits=100,
    )  # fmt: skip
    for url in ("/over/paced3", "/over/daily3", "/over/classes3"):
        _third(engine, url)
    return limiter_db


def renewal() -> float:
    return float(Calendar.of("day", ZONE).period_at(time.time())[1])


def never(refused: Decision, reason: str, limit: int) -> None:
    """Refused at once with no wait told, and the figures of the limit that binds."""
    assert not refused.allowed and refused.reason == reason, refused
    assert refused.retry_after is None, refused
    assert refused.limit == limit, refused
    assert "Retry-After" not in refused.headers()
    assert refused.headers()["X-RateLimit-Limit"] == str(limit)


@pytest.mark.parametrize("url", PACED)
@pytest.mark.parametrize("drained", [False, True], ids=["full", "drained"])
def test_more_than_a_paced_quota_burst(lim: GatewayLimiter, url: str, drained: bool) -> None:
    if drained:  # half the per-second bucket, and the whole burst
        assert all(lim.decide(url).allowed for _ in range(BURST))
    used = BURST if drained else 0
    for timeout in (None, 0.0, 3600.0):
        refused = lim.decide(url, permits=BURST + 1, timeout=timeout)
        never(refused, "limited", DAILY)
        assert (refused.remaining, refused.reset_at) == (DAILY - used, renewal())
    with pytest.raises(ValueError, match=f"at most {BURST} .*its paced quota's burst"):
        lim.acquire(url, permits=BURST + 1)
    most = lim.decide(url, permits=BURST)
    if drained:  # the burst is spent: its pace refills it, a finite wait
        assert not most.allowed and most.retry_after is not None and most.retry_after > 0.0
    else:
        assert most.allowed and most.waited == 0.0


@pytest.mark.parametrize("url", DAILY_URLS)
@pytest.mark.parametrize("spent", [False, True], ids=["fresh", "spent"])
def test_more_than_a_quota_per_period(lim: GatewayLimiter, url: str, spent: bool) -> None:
    if spent:
        assert all(lim.decide(url).allowed for _ in range(SMALL))
    for timeout in (None, 0.0, 3600.0):
        refused = lim.decide(url, permits=SMALL + 1, timeout=timeout)
        never(refused, "limited", SMALL)
        assert (refused.remaining, refused.reset_at) == (0 if spent else SMALL, renewal())
    with pytest.raises(ValueError, match=f"at most {SMALL} .*its quota per period"):
        lim.acquire(url, permits=SMALL + 1)
    most = lim.decide(url, permits=SMALL)
    if spent:  # until the quota renews
        assert not most.allowed and most.retry_after is not None
        assert abs(most.retry_after - (renewal() - time.time())) < 5.0
    else:
        assert most.allowed and most.waited == 0.0


@pytest.mark.parametrize("url", CLASSES)
@pytest.mark.parametrize("drained", [False, True], ids=["full", "drained"])
def test_more_than_a_class_share(lim: GatewayLimiter, url: str, drained: bool) -> None:
    if drained:  # 5 left: the limits alone would make 11 wait past the budget
        assert all(lim.decide(url, priority="critical").allowed for _ in range(15))
    for timeout in (None, 0.0, 3600.0):
        refused = lim.decide(url, permits=SHEDDABLE_MOST + 1, priority="sheddable", timeout=timeout)
        never(refused, "reserved", PER_SECOND)
    with pytest.raises(ValueError, match=f"at most {SHEDDABLE_MOST} "):
        lim.acquire(url, permits=SHEDDABLE_MOST + 1, priority="sheddable")
    most = lim.decide(url, permits=SHEDDABLE_MOST, priority="sheddable")
    if drained:  # once 20 are stored again: a finite wait
        assert not most.allowed and most.retry_after is not None and most.retry_after > 0.0
    else:
        assert most.allowed and most.waited == 0.0


async def test_asyncio_refuses_an_impossible_ask_at_once(alim: AsyncGatewayLimiter) -> None:
    url = "/over/paced"
    for _ in range(BURST):
        assert (await alim.decide(url)).allowed
    never(await alim.decide(url, permits=BURST + 1), "limited", DAILY)
    for _ in range(SMALL):
        assert (await alim.decide("/over/daily")).allowed
    never(await alim.decide("/over/daily", permits=SMALL + 1), "limited", SMALL)
    for _ in range(15):
        assert (await alim.decide("/over/classes", priority="critical")).allowed
    refused = await alim.decide("/over/classes", permits=SHEDDABLE_MOST + 1, priority="sheddable")
    never(refused, "reserved", PER_SECOND)
