"""Trunk reservation in the scripts on a real Redis and in the Python model decide
alike, to the last bit: calls of every class on a bucket (``bucket.lua``) and on sets
of limits (``limits.lua``), each limit with its share for the call's class or none.

Hypothesis feeds both the same random sequences; the clock is driven through the
scripts' ``now`` argument, as the other property tests of the scripts do.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import IN_PAIR, parse_state
from gateway_limiter.backends.state import limit, state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import BucketState, reserve
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from gateway_limiter.model.limits import LimitState, reserve_limits
from tests.redis.test_bucket_script_matches_model import (
    interface,
    limit_sets,
    stored_limit,
    stored_state,
)
from tests.support.services import RedisServer

START = 1_795_000_000_000_000.0  # microseconds, a 2026 wall clock
PAIR_NOW_S = 1_796_000_000.0  # 2026-12-01, mid-afternoon in Beijing: no day ends in a run

#: A share of a limit for the call's class: none in play (critical), 0, or a reserve.
shares = st.one_of(st.none(), st.just(0.0), st.sampled_from([0.1, 0.3, 0.5]), st.floats(0.0, 0.99))


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="prop"))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rate=st.integers(1, 2_000),
    capacity=st.integers(1, 2_000),
    sequence=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 2_000), st.integers(0, 3_000_000)),  # dt µs
            st.integers(1, 40),  # permits
            st.one_of(st.none(), st.just(0.0), st.floats(0, 2_000_000)),  # timeout µs
            shares,
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_bucket_script_and_model_agree_for_every_class(
    backend: RedisBackend,
    rate: int,
    capacity: int,
    sequence: list[tuple[int, int, float | None, float | None]],
) -> None:
    url = f"/p/{uuid.uuid4().hex}"
    now = START
    model: BucketState | None = None
    base = Rule(url, rate, 0.0, 1, capacity=capacity)
    for dt, permits, timeout, share in sequence:
        now += dt
        rule = base if share is None else replace(base, shares=(share,))
        timeout_s = None if timeout is None else timeout / 1e6
        got = backend.reserve(rule, permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        expected, new = reserve(model, rate, capacity, permits, budget, now, share=share)
        assert got == expected
        if new is not None:
            model = new
        if share is not None and not got.allowed:
            assert got.wait_us > 0.0  # a lower class never takes a debt: it waits outside
        assert stored_state(backend.client, url) == model


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    limits=limit_sets(),
    data=st.data(),
    sequence=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 5_000), st.integers(0, 3_000_000)),  # dt µs
            st.integers(1, 12),  # permits (may exceed a window's rate)
            st.one_of(st.none(), st.just(0.0), st.floats(0, 5_000_000)),  # timeout µs
            st.booleans(),  # the call is critical (no shares in play)
        ),
        min_size=1,
        max_size=50,
    ),
)
def test_limits_script_and_model_agree_for_every_class(
    backend: RedisBackend,
    limits: list[tuple[str, int, int, int]],
    data: st.DataObject,
    sequence: list[tuple[int, int, float | None, bool]],
) -> None:
    url = f"/m/{uuid.uuid4().hex}"
    rule = interface(url, limits)
    if len(rule.limits) == 1 and rule.algorithm == "token_bucket":
        # a lone bucket is bucket.lua's: add a second limit (period 121: no shared key)
        rule = replace(rule, also=(replace(rule, config_id=99, period=121),))
    lower = tuple(
        data.draw(st.one_of(st.just(0.0), st.sampled_from([0.1, 0.5]), st.floats(0, 0.99)))
        for _ in rule.limits
    )
    now = START
    model: list[LimitState | None] = [None] * len(rule.limits)
    specs = [limit(r) for r in rule.limits]
    for dt, permits, timeout, critical in sequence:
        now += dt
        asked = rule if critical else replace(rule, shares=lower)
        timeout_s = None if timeout is None else timeout / 1e6
        got = backend.reserve(asked, permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        expected, new = reserve_limits(
            specs, model, permits, budget, now, shares=None if critical else lower
        )
        assert got == expected
        if new is not None:
            model = list(new)
        if not critical and got.allowed:
            assert got.wait_us == 0.0  # a lower class goes now or not at all
        assert [stored_limit(backend.client, r) for r in rule.limits] == model


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rate=st.integers(1, 20),
    capacity=st.integers(1, 20),
    share=st.one_of(st.just(0.0), st.sampled_from([0.1, 0.5]), st.floats(0.0, 0.99)),
    sequence=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 5_000), st.integers(0, 3_000_000)),  # dt µs
            st.integers(1, 30),  # permits (may exceed the bucket, or the quota)
            st.one_of(st.none(), st.just(0.0), st.floats(0, 5_000_000)),  # timeout µs
            st.booleans(),  # the call is critical (no shares in play)
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_the_bucket_and_quota_pair_and_model_agree_for_every_class(
    backend: RedisBackend,
    rate: int,
    capacity: int,
    share: float,
    sequence: list[tuple[int, int, float | None, bool]],
) -> None:
    """A bucket with a calendar quota beside it, decided by ``bucket.lua`` in one call,
    against the model of both limits (the quota keeps no reserve): a bucket's share of 0
    still never gives a lower class more than it holds at once."""
    url = f"/q/{uuid.uuid4().hex}"
    quota = Rule(
        url,
        25,
        0.0,
        2,
        algorithm=Algorithm.FIXED_WINDOW,
        period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=Calendar.of("day", "Asia/Shanghai"),
    )
    rule = Rule(url, rate, 0.0, 1, capacity=capacity, also=(quota,))
    lower = (share, 0.0)
    backend._commands.clock = lambda: PAIR_NOW_S
    specs = [limit(rule), limit(quota, PAIR_NOW_S)]
    model: list[LimitState | None] = [None, None]
    now = PAIR_NOW_S * 1_000_000.0
    for dt, permits, timeout, critical in sequence:
        now += dt
        asked = rule if critical else replace(rule, shares=lower)
        timeout_s = None if timeout is None else timeout / 1e6
        got = backend.reserve(asked, permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        expected, new = reserve_limits(
            specs, model, permits, budget, now, shares=None if critical else lower
        )
        assert got == expected
        if new is not None:
            model = list(new)
        if not critical and permits > capacity:
            assert not got.allowed and got.wait_us == math.inf  # never at once
        # the bucket's state is in the quota's key, after the count
        raw = backend.client.get(state_key("prop", quota))
        assert parse_state(raw, IN_PAIR) == model[0]
