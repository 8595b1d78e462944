"""Several limits on one interface, and the fixed window, on the reference model.

The clock is driven (microseconds), so every assertion is exact. ``limits.lua`` is held
equal to this model by tests/redis/test_bucket_script_matches_model.py; the same behaviours
through a real Redis are in tests/redis/test_several_limits_on_redis.py.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_limiter.model.bucket import BucketState, Verdict
from gateway_limiter.model.limits import (
    WINDOW_GUARD_US,
    FixedWindow,
    Limit,
    LimitKind,
    LimitState,
    reserve_limits,
)

SECOND = 1_000_000.0
T0 = 1_000_000 * SECOND  # a window boundary for every period below


class Interface:
    """Limits and their states, asked in turn like limits.lua (nothing else)."""

    def __init__(self, *limits: Limit) -> None:
        self.limits = limits
        self.states: list[LimitState | None] = [None] * len(limits)

    def ask(self, now: float, permits: int = 1, timeout: float | None = 0.0) -> Verdict:
        verdict, new = reserve_limits(self.limits, self.states, permits, timeout, now)
        if new is not None:
            self.states = list(new)
        return verdict


def bucket(per_period: int, period: int, capacity: int | None = None) -> Limit:
    return Limit(LimitKind.TOKEN_BUCKET, per_period / period, float(capacity or per_period))


def fixed(per_period: int, period: int) -> Limit:
    return Limit(LimitKind.FIXED_WINDOW, float(per_period), period * SECOND)


def sliding(per_period: int, period: int) -> Limit:
    return Limit(LimitKind.SLIDING_WINDOW, float(per_period), period * SECOND + WINDOW_GUARD_US)


# --- two periods ---------------------------------------------------------------------


def test_the_slower_period_binds_once_its_capacity_is_spent() -> None:
    iface = Interface(bucket(5, 1), bucket(8, 10))  # 5 per second and 8 per 10 s
    waits = [iface.ask(T0, timeout=None).wait_us for _ in range(10)]
    # the first five at once (the second's capacity), then one per 0.2 s ...
    assert waits[:5] == [0.0] * 5
    assert waits[5:8] == pytest.approx([200_000, 400_000, 600_000])
    # ... until 8 in 10 s are spent: then one per 10/8 = 1.25 s, the per-second limit idle
    assert waits[8] == pytest.approx(1_250_000)
    assert waits[9] == pytest.approx(2_500_000)


def test_a_refusal_by_one_limit_takes_nothing_from_the_others() -> None:
    iface = Interface(bucket(5, 1), bucket(3, 60))
    assert [iface.ask(T0).allowed for _ in range(3)] == [True] * 3
    fast_before = iface.states[0]
    assert isinstance(fast_before, BucketState) and fast_before.stored == pytest.approx(2.0)

    refused = iface.ask(T0, timeout=0.5 * SECOND)  # the minute limit needs 20 s
    assert not refused.allowed
    assert refused.wait_us == pytest.approx(20 * SECOND)
    assert iface.states[0] is fast_before  # the per-second bucket gave nothing
    assert iface.ask(T0, permits=2, timeout=None).allowed is True  # nor was it touched
    assert iface.states[0] != fast_before


def test_waiting_is_allowed_when_every_limit_can_serve_within_the_timeout() -> None:
    iface = Interface(bucket(2, 1), bucket(4, 2))
    assert [iface.ask(T0).allowed for _ in range(2)] == [True, True]
    verdict = iface.ask(T0, timeout=0.6 * SECOND)
    assert verdict.allowed
    assert verdict.wait_us == pytest.approx(500_000)  # the per-second limit's next permit


def test_every_limit_records_the_call_when_it_really_goes() -> None:
    # The per-second bucket could serve at once, but the call waits 6 s for the
    # minute limit: the bucket must count it at 6 s, when it refilled, not before.
    iface = Interface(bucket(10, 1), bucket(10, 60))
    for _ in range(10):
        iface.ask(T0)
    verdict = iface.ask(T0 + 100_000, timeout=None)
    assert verdict.wait_us == pytest.approx(6 * SECOND - 100_000)
    fast = iface.states[0]
    assert isinstance(fast, BucketState)
    assert fast.balance_us == pytest.approx(T0 + 6 * SECOND)
    assert fast.stored == pytest.approx(9.0)  # full at 6 s, minus the call


def test_one_window_too_small_for_the_batch_refuses_it_at_once() -> None:
    iface = Interface(bucket(100, 1), fixed(3, 1))
    verdict = iface.ask(T0, permits=4, timeout=None)
    assert verdict == Verdict(False, math.inf, 0.0)
    assert iface.states == [None, None]


# --- the fixed window -------------------------------------------------------------------


def test_fixed_window_admits_the_rate_per_aligned_window_and_resets_at_the_boundary() -> None:
    iface = Interface(fixed(3, 2))  # 3 per 2 s; windows start at T0, T0 + 2 s, ...
    late = T0 + 1.9 * SECOND
    assert [iface.ask(late).allowed for _ in range(4)] == [True, True, True, False]
    # 0.1 s later a new window opens: 3 more at once (the fixed window's boundary burst)
    assert [iface.ask(T0 + 2 * SECOND).allowed for _ in range(4)] == [True] * 3 + [False]
    assert iface.states == [FixedWindow((T0 + 2 * SECOND) / (2 * SECOND), 3.0)]


def test_fixed_window_refusals_do_not_count() -> None:
    iface = Interface(fixed(2, 1))
    assert iface.ask(T0, permits=2).allowed
    for _ in range(5):
        assert not iface.ask(T0 + 0.5 * SECOND).allowed
    assert iface.states == [FixedWindow(T0 / SECOND, 2.0)]
    assert [iface.ask(T0 + SECOND).allowed for _ in range(3)] == [True, True, False]


def test_fixed_window_callers_wait_for_the_start_of_the_next_window_in_order() -> None:
    iface = Interface(fixed(2, 1))
    now = T0 + 0.75 * SECOND
    waits = [iface.ask(now, timeout=2 * SECOND).wait_us for _ in range(6)]
    assert waits == [0.0, 0.0, 250_000.0, 250_000.0, 1_250_000.0, 1_250_000.0]
    # a small request does not slip back into a window already given out
    assert not iface.ask(now, timeout=1 * SECOND).allowed


def test_fixed_window_state_expires_with_its_window() -> None:
    from gateway_limiter.model.limits import limit_expiry_ms

    limit = fixed(5, 10)
    _, new = reserve_limits([limit], [None], 1, 0.0, T0 + 4 * SECOND)
    assert new is not None
    assert limit_expiry_ms(limit, new[0], T0 + 4 * SECOND) == 6_000 + 1_000  # window + grace


# --- every limit holds, whatever the traffic ------------------------------------------


limit_specs = st.lists(
    st.tuples(
        st.sampled_from([LimitKind.TOKEN_BUCKET, LimitKind.SLIDING_WINDOW, LimitKind.FIXED_WINDOW]),
        st.integers(1, 8),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=3,
)
traffic = st.lists(
    st.tuples(
        st.integers(0, 700_000),  # µs since the previous call
        st.integers(1, 3),  # permits
        st.one_of(st.none(), st.just(0.0), st.floats(0, 3 * SECOND)),  # timeout
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(specs=limit_specs, steps=traffic)
def test_no_limit_is_ever_exceeded_at_the_times_calls_really_go(
    specs: list[tuple[LimitKind, int, int]], steps: list[tuple[int, int, float | None]]
) -> None:
    build = {
        LimitKind.TOKEN_BUCKET: bucket,
        LimitKind.SLIDING_WINDOW: sliding,
        LimitKind.FIXED_WINDOW: fixed,
    }
    iface = Interface(*(build[kind](rate, period) for kind, rate, period in specs))
    smallest = min(rate for _, rate, _ in specs)
    now = T0
    released: list[tuple[float, int]] = []
    for dt, wanted, timeout in steps:
        now += dt
        permits = min(wanted, smallest)  # a batch beyond a bucket's capacity goes at once
        verdict = iface.ask(now, permits, timeout)
        if verdict.allowed:
            assert timeout is None or verdict.wait_us <= timeout
            released.append((now + verdict.wait_us, permits))
    released.sort()
    for kind, rate, period in specs:
        length = period * SECOND
        if kind == LimitKind.FIXED_WINDOW:  # each aligned window holds at most the rate
            per_window = Counter[int]()
            for t, n in released:
                per_window[math.floor(t / length)] += n
            assert max(per_window.values(), default=0) <= rate
            continue
        for i, (start, _) in enumerate(released):
            total = 0
            for t, n in released[i:]:
                total += n
                if (
                    kind == LimitKind.SLIDING_WINDOW and t - start < length
                ):  # any window of one period
                    assert total <= rate
                if kind == LimitKind.TOKEN_BUCKET:  # capacity + rate x the span
                    assert total <= rate + rate * (t - start) / length + 1e-6
