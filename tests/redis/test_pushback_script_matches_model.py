"""Pushback on a real Redis and in the Python model: the same decisions, to the last bit.

Hypothesis interleaves decisions and pushbacks (with and without retry_after) on one
interface, with the clock driven through the scripts' ``now`` argument; the model is
``model/pushback.py`` with ``model/bucket.py`` (bucket.lua) or ``model/limits.py``
(limits.lua), as ``memory://`` runs them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import parse_state
from gateway_limiter.backends.state import (
    limit,
    own_limits,
    pushback_rate,
    single_bucket,
    state_key,
)
from gateway_limiter.config.rules import CALENDAR_SECONDS, Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import US_PER_S, BucketState, reserve
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from gateway_limiter.model.limits import LimitState, reserve_limits
from gateway_limiter.model.pushback import PushbackState, factor_at, push, until_of
from tests.support.services import RedisServer

START = 1_795_000_000_000_000.0  # microseconds, a 2026 wall clock


@dataclass(frozen=True)
class Step:
    dt: int  # microseconds since the previous step
    pushback: bool  # a pushback (else a decision)
    retry_after: float | None  # seconds, for a pushback
    permits: int
    timeout: float | None  # seconds; None = acquire


steps = st.lists(
    st.builds(
        Step,
        dt=st.one_of(st.integers(0, 2_000), st.integers(0, 3_000_000)),
        pushback=st.booleans(),
        retry_after=st.one_of(st.none(), st.floats(0.0, 3.0)),
        permits=st.integers(1, 5),
        timeout=st.one_of(st.none(), st.just(0.0), st.floats(0, 2.0)),
    ),
    min_size=1,
    max_size=40,
)


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="pbp"))


def rules(url: str) -> list[Rule]:
    bucket = Rule(url, 20, 0.5, 1, capacity=10)
    warm = Rule(url, 20, 0.5, 1, algorithm=Algorithm.WARM_UP, warmup=2.0)
    window = Rule(url, 8, 0.5, 2, algorithm=Algorithm.SLIDING_WINDOW, period=2)
    both = Rule(url, 20, 0.5, 1, also=(window,))
    # windows alone (limits.lua): the slowdown caps their count, in whole permits
    sliding = Rule(url, 8, 0.5, 2, algorithm=Algorithm.SLIDING_WINDOW, period=2)
    fixed = Rule(url, 8, 0.5, 2, algorithm=Algorithm.FIXED_WINDOW, period=2)
    # capacity shares: the channel's bucket is neither scaled nor delayed by the pushback
    channel = f"C{url[-8:]}"
    cap = Rule("*", 12, 0.5, 3, capacity=6, channel=channel)
    capped = Rule(url, 20, 0.5, 1, channel=channel, also=(replace(window, channel=channel), cap))
    # a per-second bucket and a paced daily quota: bucket.lua decides the pair as
    # limits.lua would, the pushback in the bucket's key
    calendar = Calendar.of("day", "Asia/Shanghai")
    daily = Rule(
        url,
        60,
        0.5,
        2,
        algorithm=Algorithm.FIXED_WINDOW,
        period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=calendar,
        pacing=True,
        pace_burst=4,
    )
    pair = Rule(url, 20, 0.5, 1, capacity=10, also=(daily,))
    return [bucket, warm, both, sliding, fixed, capped, pair]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=st.integers(0, 6), sequence=steps)
def test_scripts_and_model_agree_under_pushbacks(
    backend: RedisBackend, shape: int, sequence: list[Step]
) -> None:
    rule = rules(f"/prop/{uuid.uuid4().hex}")[shape]
    pushed: PushbackState | None = None
    bucket: BucketState | None = None
    limits: list[LimitState | None] = [None] * len(rule.limits)
    backend._commands.clock = lambda: START / US_PER_S  # a calendar quota's boundaries
    specs = [limit(r, START / US_PER_S) for r in rule.limits]
    now = START
    for step in sequence:
        now += step.dt
        if step.pushback:
            got = backend.pushback(rule, step.retry_after, now=now)
            retry_us = None if step.retry_after is None else step.retry_after * US_PER_S
            pushed, factor, next_free_us = push(pushed, pushback_rate(rule), retry_us, now)
            assert got == (factor, next_free_us)
            continue
        timeout_us = None if step.timeout is None else step.timeout * US_PER_S
        factor = factor_at(pushed, pushback_rate(rule), now)
        if not single_bucket(rule):
            expected, changed = reserve_limits(
                specs,
                limits,
                step.permits,
                timeout_us,
                now,
                factor,
                until_of(pushed),
                own_limits(rule),
            )
            if changed is not None:
                limits = list(changed)
        else:
            expected, new = reserve(
                bucket,
                rule.per_second,
                rule.burst,
                step.permits,
                timeout_us,
                now,
                rule.warmup * US_PER_S,
                factor,
                until_of(pushed),
            )
            bucket = new if new is not None else bucket
        got_verdict = backend.reserve(rule, step.permits, step.timeout, now=now)
        assert got_verdict == expected, (step, pushed)
    if single_bucket(rule):  # the state the script stored is the model's, bit for bit
        raw = backend.client.get(state_key("pbp", rule))
        stored = parse_state(raw)
        assert stored == bucket or (stored is None and bucket is None)
