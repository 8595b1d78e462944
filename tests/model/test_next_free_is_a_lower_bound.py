"""A decision's ``next_free`` is a time before which no later call can go: the ground on
which the limiter refuses hopeless callers in-process.

On the reference model with a driven clock (the scripts return the same numbers, to the
bit: test_bucket_script_matches_model.py). For any state, after a decision at ``now``
with ``next_free`` N, every later call of the same interface (any permits, any
timeout, any time, any number of them) is placed at ``now + N`` or later: refusing a
caller whose ``t + timeout`` falls short of it loses nothing. And N is not needlessly
far: a one-permit call right after the decision goes exactly at ``now + N`` (token
buckets and windows; warm-up is a bound only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_limiter.model.bucket import US_PER_S, Verdict, reserve
from gateway_limiter.model.limits import WINDOW_GUARD_US, Limit, LimitKind, reserve_limits

T0 = 1_795_000_000_000_000.0

calls = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 3_000), st.integers(0, 2_000_000)),  # dt µs
        st.integers(1, 6),  # permits
        st.one_of(st.none(), st.just(0.0), st.floats(0, 3_000_000)),  # timeout µs
    ),
    min_size=1,
    max_size=30,
)

# Times near T0 are doubles 0.25 µs apart; a bound may round to the next one.
ROUNDING = 1.0  # µs


#: One decision on a state: (state, permits, timeout µs, now) -> (verdict, new state or None).
Decide = Callable[[Any, int, float | None, float], tuple[Verdict, Any]]
Steps = list[tuple[int, int, float | None]]


def drive(
    decide_one: Decide, steps: Steps, state: Any = None, now: float = T0
) -> tuple[list[tuple[float, Verdict]], Any, float]:
    """Feed ``steps`` to one state: each decision's time and verdict, the state, the time."""
    seen = []
    for dt, permits, timeout in steps:
        now += dt
        verdict, new = decide_one(state, permits, timeout, now)
        state = new if new is not None else state
        seen.append((now, verdict))
    return seen, state, now


def assert_nothing_goes_before(
    first: tuple[float, Verdict], later: list[tuple[float, Verdict]]
) -> None:
    """No call after ``first`` is placed before the moment ``first`` said is next free
    (nor before what each later reply said in turn)."""
    at, verdict = first
    assert verdict.next_free_us >= 0
    horizon = at + verdict.next_free_us
    for at, verdict in later:
        if math.isinf(verdict.wait_us):  # more permits than a window holds: never placed
            continue
        assert at + verdict.wait_us >= horizon - ROUNDING
        horizon = max(horizon, at + verdict.next_free_us)


def bucket(rate: int, capacity: int, warmup: float = 0.0) -> Decide:
    return lambda state, permits, timeout, now: reserve(
        state, rate, capacity, permits, timeout, now, warmup * US_PER_S
    )


def several(limits: list[Limit]) -> Decide:
    return lambda states, permits, timeout, now: reserve_limits(
        limits, states or [None] * len(limits), permits, timeout, now
    )


@settings(max_examples=400, deadline=None)
@given(
    rate=st.integers(1, 50),
    capacity=st.integers(1, 50),
    warmup=st.one_of(st.just(0.0), st.floats(0.05, 5.0)),
    before=calls,
    after=calls,
)
def test_no_call_of_a_bucket_goes_before_next_free(
    rate: int, capacity: int, warmup: float, before: Steps, after: Steps
) -> None:
    seen, state, now = drive(bucket(rate, capacity, warmup), before)
    later, _, _ = drive(bucket(rate, capacity, warmup), after, state, now)
    assert_nothing_goes_before(seen[-1], later)


@settings(max_examples=200, deadline=None)
@given(rate=st.integers(1, 50), capacity=st.integers(1, 50), before=calls)
def test_a_token_bucket_lets_one_permit_go_exactly_at_next_free(
    rate: int, capacity: int, before: Steps
) -> None:
    seen, state, now = drive(bucket(rate, capacity), before)
    one, _ = reserve(state, rate, capacity, 1, None, now)
    assert one.wait_us == pytest.approx(seen[-1][1].next_free_us, abs=ROUNDING)


def limit_sets() -> st.SearchStrategy[list[Limit]]:
    one = st.one_of(
        st.builds(
            lambda r, c: Limit(LimitKind.TOKEN_BUCKET, float(r), float(c)),
            st.integers(1, 20),
            st.integers(1, 20),
        ),
        st.builds(
            lambda r, p: Limit(LimitKind.SLIDING_WINDOW, float(r), p * US_PER_S + WINDOW_GUARD_US),
            st.integers(1, 8),
            st.integers(1, 3),
        ),
        st.builds(
            lambda r, p: Limit(LimitKind.FIXED_WINDOW, float(r), p * US_PER_S),
            st.integers(1, 8),
            st.integers(1, 3),
        ),
    )
    return st.lists(one, min_size=1, max_size=3)


@settings(max_examples=400, deadline=None)
@given(limits=limit_sets(), before=calls, after=calls)
def test_no_call_of_several_limits_goes_before_next_free(
    limits: list[Limit], before: Steps, after: Steps
) -> None:
    seen, states, now = drive(several(limits), before)
    later, _, _ = drive(several(limits), after, states, now)
    assert_nothing_goes_before(seen[-1], later)


@settings(max_examples=200, deadline=None)
@given(limits=limit_sets(), before=calls)
def test_several_limits_let_one_permit_go_exactly_at_next_free(
    limits: list[Limit], before: Steps
) -> None:
    seen, states, now = drive(several(limits), before)
    verdict = seen[-1][1]
    if math.isinf(verdict.wait_us):
        assert verdict.next_free_us == 0.0  # not every limit was read: no bound given
        return
    one, _ = several(limits)(states, 1, None, now)
    assert one.wait_us == pytest.approx(verdict.next_free_us, abs=ROUNDING)


def test_a_drained_bucket_says_when_its_next_permit_comes() -> None:
    state = None
    for _ in range(10):  # rate 10, capacity 10: ten at once drain it
        verdict, state = reserve(state, 10, 10, 1, 0.0, T0)
    assert verdict.allowed and verdict.next_free_us == pytest.approx(100_000.0)
    refused, _ = reserve(state, 10, 10, 1, 0.0, T0 + 40_000.0)
    assert not refused.allowed
    assert refused.next_free_us == pytest.approx(60_000.0)  # the same moment, 40 ms nearer
    waiting, _ = reserve(state, 10, 10, 3, None, T0)  # three queued: 300 ms of debt
    assert waiting.next_free_us == pytest.approx(400_000.0)
