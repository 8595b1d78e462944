"""Pushback's semantics on the model with a driven clock (docs/algorithms.md, "Pushback")."""

from __future__ import annotations

import pytest

from gateway_limiter.model.bucket import reserve
from gateway_limiter.model.pushback import (
    DECREASE,
    FLOOR,
    RECOVERY_PER_S,
    WINDOW_US,
    factor_at,
    push,
    pushback_expiry_ms,
)

T0 = 1_000_000_000.0
SECOND = 1_000_000.0
RATE = 40.0


def test_one_burst_counts_once_and_each_later_burst_halves_down_to_the_floor() -> None:
    state, factor, _ = push(None, RATE, None, T0)
    for i in range(1, 50):  # the rest of the burst, within the window
        state, again, _ = push(state, RATE, None, T0 + i * 10_000.0)
        assert again >= factor
    assert factor == DECREASE
    now, seen = T0, [factor]
    for _ in range(6):
        now += WINDOW_US
        state, factor, _ = push(state, RATE, None, now)
        seen.append(factor)
    assert seen[1] == pytest.approx(seen[0] * DECREASE + RECOVERY_PER_S * DECREASE)
    assert seen[-1] == FLOOR  # never below a tenth of the row


def test_the_rate_recovers_additively_to_the_row_and_the_state_then_expires() -> None:
    state, factor, _ = push(None, RATE, None, T0)
    assert factor_at(state, RATE, T0 + 2 * SECOND) == pytest.approx(0.5 + 2 * RECOVERY_PER_S)
    full_s = (1 - factor) / RECOVERY_PER_S
    assert factor_at(state, RATE, T0 + full_s * SECOND) == 1.0
    assert pushback_expiry_ms(state, T0) == pytest.approx(full_s * 1000 + 1000, abs=1)


def test_another_row_rate_voids_the_factor_but_not_the_moment() -> None:
    state, _, _ = push(None, RATE, 2.0 * SECOND, T0)
    state, _, _ = push(state, RATE, None, T0)
    assert factor_at(state, RATE * 2, T0) == 1.0
    again, factor, next_free_us = push(state, RATE * 2, None, T0 + 1.0)
    assert factor == DECREASE and next_free_us == pytest.approx(2.0 * SECOND - 1.0)
    assert again.until_us == T0 + 2.0 * SECOND


def test_retry_after_holds_every_call_then_the_bucket_starts_empty() -> None:
    state, _, next_free_us = push(None, RATE, 2.0 * SECOND, T0)
    assert next_free_us == 2.0 * SECOND
    refused, untouched = reserve(None, RATE, RATE, 1, 1.9 * SECOND, T0, until_us=state.until_us)
    assert not refused.allowed and untouched is None
    first_us = 2.0 * SECOND + SECOND / RATE  # empty at the hold's end: one interval on
    assert refused.next_free_us == pytest.approx(first_us)  # what the local refusal learns
    admitted, bucket = reserve(None, RATE, RATE, 1, first_us, T0, until_us=state.until_us)
    assert admitted.allowed and admitted.wait_us == pytest.approx(first_us)
    assert bucket is not None and bucket.stored == 0.0  # nothing saved through the hold


def test_a_hold_drains_what_the_bucket_saved_before_it() -> None:
    """A full bucket held for 2 s does not burst its capacity when the hold ends: half a
    second after it, half a second's permits have come back, and no more."""
    _, bucket = reserve(None, RATE, RATE, 1, 0.0, T0)  # used once, then almost full
    assert bucket is not None and bucket.stored == RATE - 1
    state, _, _ = push(None, RATE, 2.0 * SECOND, T0)
    now_us = T0 + 2.5 * SECOND
    served = 0
    for _ in range(int(RATE) * 2):
        verdict, new = reserve(bucket, RATE, RATE, 1, 0.0, now_us, until_us=state.until_us)
        bucket = new or bucket
        served += verdict.allowed
    assert served == int(RATE) // 2
    # Once a decision has absorbed the hold, the bucket refills as usual.
    verdict, _ = reserve(bucket, RATE, RATE, 1, 0.0, now_us + SECOND, until_us=state.until_us)
    assert verdict.allowed and verdict.stored == pytest.approx(RATE - 1)


def test_the_bucket_runs_at_the_effective_rate_and_capacity() -> None:
    served = 0
    bucket = None
    for _ in range(100):
        verdict, new = reserve(bucket, RATE, RATE, 1, 0.0, T0, factor=0.5)
        bucket = new or bucket
        served += verdict.allowed
        assert verdict.factor == 0.5
    assert served == RATE * 0.5
    verdict, _ = reserve(bucket, RATE, RATE, 1, None, T0, factor=0.5)
    assert verdict.wait_us == pytest.approx(SECOND / (RATE * 0.5))
