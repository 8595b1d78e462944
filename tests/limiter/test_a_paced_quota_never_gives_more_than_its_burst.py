"""A paced calendar quota never gives one call more than its burst: its bucket never
holds more. With ``quotaPacing=1`` and a burst of 2 (the daily row's ``maxPermits``, else
the ``quota_pacing_burst`` setting), a call for 2 goes at once and a call for 3 is
refused at once, whatever its wait budget, with the quota's figures (no wait told,
since none would ever do), and ``acquire`` raises naming the URL and the most it can
get: on a real Redis (``bucket.lua``'s pair and ``limits.lua``) and on ``memory://``,
and in the model both are pinned to."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.state import limit
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from gateway_limiter.model.limits import reserve_limits
from tests.support.limiting import write_row

URL = "/ibe/paced/burst"
ZONE = "Asia/Shanghai"
QUOTA = 1000  # a day: a paced permit every 87 s or sooner
PER_SECOND = 100  # never the one that binds
BURST = 2


@pytest.fixture(params=["redis", "memory"])
def limiter_redis_url(request: pytest.FixtureRequest, limiter_redis_url: str) -> str:
    return limiter_redis_url if request.param == "redis" else "memory://"


@pytest.fixture(params=["maxPermits", "quota_pacing_burst"])
def burst_from(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["bucket.lua", "limits.lua"])
def script(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def limiter_settings(burst_from: str) -> dict[str, Any]:
    # patient with a loaded host's Redis: a reply past the default ceiling (0.2 s) would
    # be decided by the failure policy, and these tests are about the burst
    patient = {"reload_interval": 3600, "redis_timeout": 0.5, "redis_timeout_ceiling": 2.0}
    if burst_from == "quota_pacing_burst":
        return {**patient, "quota_pacing_burst": BURST}
    return patient


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine], burst_from: str, script: str) -> tuple[str, Engine]:
    engine = limiter_db[1]
    write_row(engine, URL, rateLimit=PER_SECOND, cache=0.0)
    burst = {"maxPermits": BURST} if burst_from == "maxPermits" else {}
    write_row(
        engine, URL, add=True, rateLimit=QUOTA, cache=0.0, quotaPeriod="day", timeZone=ZONE,
        quotaPacing=1, **burst,
    )  # fmt: skip
    if script == "limits.lua":  # a third limit: the quota is limits.lua's kind 5
        write_row(
            engine, URL, add=True, rateLimit=10_000, cache=0.0, periodSeconds=60,
            algorithm="fixed_window",
        )  # fmt: skip
    return limiter_db


def renewal() -> float:
    return float(Calendar.of("day", ZONE).period_at(time.time())[1])


def test_one_more_than_the_burst_is_refused_at_once_and_exactly_the_burst_goes(
    lim: GatewayLimiter,
) -> None:
    (quota,) = [r for r in lim.registry.snapshot.rules[URL].limits if r.calendar is not None]
    assert quota.pacing and quota.pace_burst == BURST
    began = time.monotonic()
    # no budget, an hour's, and none at all: no wait would ever give 3 from a bucket of 2
    for timeout in (0, 3600.0, None):
        refused = lim.decide(URL, permits=BURST + 1, timeout=timeout)
        assert not refused.allowed and refused.reason == "limited"
        assert refused.retry_after is None, refused  # no wait told: none would do
        # the quota refused it, so its figures are told, not the per-second row's
        assert (refused.limit, refused.remaining, refused.reset_at) == (QUOTA, QUOTA, renewal())
        headers = refused.headers()
        assert headers["X-RateLimit-Limit"] == str(QUOTA)
        assert headers["RateLimit-Policy"] == f'"quota";q={QUOTA}'
        assert "Retry-After" not in headers
    assert time.monotonic() - began < 2.0
    with pytest.raises(ValueError, match=f"at most {BURST} for '{URL}'"):
        lim.acquire(URL, permits=BURST + 1)
    whole = lim.decide(URL, permits=BURST, timeout=0)  # the refusals took nothing
    assert whole.allowed and whole.waited == 0.0
    (status,) = [s for s in lim.status(URL) if s.rule.calendar is not None]
    assert status.quota_used == BURST
    # the bucket is empty now: one more waits for the pace, a finite wait told
    paced = lim.decide(URL, timeout=0)
    assert not paced.allowed and paced.retry_after is not None
    assert 1.0 < paced.retry_after < 3600.0


@pytest.mark.parametrize("with_rate", [True, False])
def test_the_model_refuses_one_more_than_the_burst_with_a_wait_that_never_ends(
    with_rate: bool,
) -> None:
    now_s = 1_795_968_000.0 + 3600.0  # 01:00 in Beijing
    quota = Rule(
        URL, QUOTA, 0.0, 2, algorithm="fixed_window", period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=Calendar.of("day", ZONE), pacing=True, pace_burst=BURST,
    )  # fmt: skip
    specs = [limit(quota, now_s)]
    if with_rate:  # bucket.lua's pair
        specs.insert(0, limit(Rule(URL, PER_SECOND, 0.0, 1)))
    states = [None] * len(specs)
    now_us = now_s * 1e6
    for timeout_us in (0.0, 3600e6, None):
        refused, nothing = reserve_limits(specs, states, BURST + 1, timeout_us, now_us)
        assert (refused.allowed, refused.wait_us, nothing) == (False, math.inf, None)
        assert (refused.quota_left, refused.quota_limit) == (QUOTA, QUOTA)
        assert refused.quota_reset_us == 1_796_054_400.0 * 1e6  # the next Beijing midnight
    whole, after = reserve_limits(specs, states, BURST, 0.0, now_us)
    assert whole.allowed and whole.wait_us == 0.0 and after is not None
    assert whole.quota_left == QUOTA - BURST
