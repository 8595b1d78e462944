"""The bucket's semantics (docs/design.md, "The bucket"), on the model with a driven clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_limiter.model.bucket import BucketState, Verdict, reserve
from gateway_limiter.model.limits import WINDOW_US, reserve_window

T0 = 1_000_000_000.0
SECOND = 1_000_000.0


def run(requests: list[tuple[float, int, float | None]], rate: int, capacity: int) -> list[Verdict]:
    """Feed (now, permits, timeout µs) to one bucket; return the verdicts."""
    state: BucketState | None = None
    out = []
    for now, permits, timeout in requests:
        verdict, new = reserve(state, rate, capacity, permits, timeout, now)
        state = new if new is not None else state
        out.append(verdict)
    return out


def test_a_fresh_bucket_serves_its_capacity_at_once_then_one_per_interval() -> None:
    verdicts = run([(T0, 1, None)] * 13, rate=10, capacity=10)
    assert [v.wait_us for v in verdicts[:10]] == [0.0] * 10
    # the shortfall becomes debt, and each caller waits for its own permit
    assert [v.wait_us for v in verdicts[10:]] == pytest.approx([100_000, 200_000, 300_000])


def test_a_reservation_of_n_waits_for_its_whole_shortfall() -> None:
    verdicts = run([(T0, 4, None), (T0, 3, None)], rate=4, capacity=4)
    assert verdicts[0] == Verdict(True, 0.0, 0.0, 0.25 * SECOND)  # next permit in 250 ms
    assert verdicts[1].wait_us == pytest.approx(0.75 * SECOND)


def test_refused_when_the_wait_exceeds_the_timeout_and_nothing_is_reserved() -> None:
    state = None
    for _ in range(5):
        _, state = reserve(state, 5, 5, 1, 0.0, T0)
    refused, untouched = reserve(state, 5, 5, 1, 199_999.0, T0)
    assert not refused.allowed
    assert untouched is None  # nothing to write
    admitted, _ = reserve(state, 5, 5, 1, 200_000.0, T0)  # the same state still serves
    assert admitted.allowed
    assert admitted.wait_us == pytest.approx(200_000.0)


def test_timeout_zero_never_waits() -> None:
    verdicts = run([(T0, 1, 0.0)] * 12, rate=10, capacity=10)
    assert [v.allowed for v in verdicts] == [True] * 10 + [False] * 2
    assert all(v.wait_us == 0.0 for v in verdicts if v.allowed)


def test_idle_time_refills_up_to_capacity_only() -> None:
    verdicts = run(
        [(T0, 10, 0.0), (T0 + 60 * SECOND, 10, 0.0), (T0 + 60 * SECOND, 1, 0.0)],
        rate=10,
        capacity=10,
    )
    assert [v.allowed for v in verdicts] == [True, True, False]


def test_later_callers_queue_behind_debt() -> None:
    # 10 stored spent; a 5-permit reservation creates 0.5 s of debt; the next caller,
    # 0.1 s later, pays after that debt.
    verdicts = run([(T0, 10, None), (T0, 5, None), (T0 + 100_000, 1, None)], rate=10, capacity=10)
    assert verdicts[1].wait_us == pytest.approx(500_000)
    assert verdicts[2].wait_us == pytest.approx(500_000)  # balance T0+0.6 s, now T0+0.1 s


def test_rate_change_rescales_stored_permits_and_keeps_debt() -> None:
    _, state = reserve(None, 10, 10, 5, None, T0)  # half full at 10/s
    assert state is not None
    verdict, state = reserve(state, 100, 100, 1, 0.0, T0)
    assert verdict.stored == pytest.approx(49.0)  # half of 100, minus the one taken
    # debt survives a rate change: queue 1 s of debt at 10/s, then halve the rate
    _, state = reserve(None, 10, 10, 20, None, T0)
    assert state is not None
    assert state.balance_us == pytest.approx(T0 + SECOND)
    verdict, _ = reserve(state, 5, 5, 1, None, T0)
    assert verdict.wait_us == pytest.approx(SECOND + 200_000)  # old debt + one permit at 5/s


requests = st.lists(
    st.tuples(st.integers(0, 400_000), st.integers(1, 5), st.one_of(st.none(), st.floats(0, 1e6))),
    min_size=1,
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(rate=st.integers(1, 50), capacity=st.integers(1, 50), steps=requests)
def test_admitted_never_exceeds_capacity_plus_rate_times_any_interval(
    rate: int, capacity: int, steps: list[tuple[int, int, float | None]]
) -> None:
    now = T0
    state: BucketState | None = None
    releases: list[tuple[float, int]] = []
    for dt, wanted, timeout in steps:
        now += dt
        # A batch larger than the capacity is released at once, beyond any window bound.
        permits = min(wanted, capacity)
        verdict, new = reserve(state, rate, capacity, permits, timeout, now)
        if new is not None:
            state = new
        if verdict.allowed:
            assert timeout is None or verdict.wait_us <= timeout  # never beyond the budget
            releases.append((now + verdict.wait_us, permits))
    releases.sort()
    for i in range(len(releases)):
        total = 0
        for j in range(i, len(releases)):
            total += releases[j][1]
            span = (releases[j][0] - releases[i][0]) / SECOND
            assert total <= capacity + rate * span + 1e-6


def paced_admissions(rate: int, warmup_s: float, seconds: float, start: float) -> list[float]:
    """Release times of callers that acquire back to back on a cold warm-up bucket."""
    state: BucketState | None = None
    now, releases = start, []
    while now < start + seconds * SECOND:
        verdict, state = reserve(state, rate, rate, 1, None, now, warmup_s * SECOND)
        now += verdict.wait_us  # the caller sleeps, then the next one asks
        releases.append(now)
    return releases


def test_warm_up_serves_a_cold_interface_at_a_third_of_the_rate_then_ramps() -> None:
    rate, warmup = 100, 2.0
    releases = paced_admissions(rate, warmup, seconds=4.0, start=T0)
    first_gap = releases[0] - T0
    assert first_gap == pytest.approx(3 * SECOND / rate, rel=0.02)  # cold: 3 intervals
    in_first_second = sum(1 for t in releases if t < T0 + SECOND)
    assert in_first_second <= 0.5 * rate  # "about half the rate" after idle, at most
    # full rate once warm (within warmupPeriod): the last second is paced at the rate
    late = [t for t in releases if T0 + 3 * SECOND <= t < T0 + 4 * SECOND]
    assert len(late) == pytest.approx(rate, abs=1)


def test_warm_up_bucket_goes_cold_again_after_idle() -> None:
    rate, warmup = 50, 1.0
    warm = paced_admissions(rate, warmup, seconds=3.0, start=T0)
    state = None
    for t in warm:
        _, state = reserve(state, rate, rate, 1, None, t, warmup * SECOND)
    later = warm[-1] + 10 * SECOND  # idle much longer than the warm-up period
    verdict, _ = reserve(state, rate, rate, 1, None, later, warmup * SECOND)
    assert verdict.wait_us == pytest.approx(3 * SECOND / rate, rel=0.02)


window_requests = st.lists(
    st.tuples(st.integers(0, 300_000), st.integers(1, 3), st.one_of(st.none(), st.floats(0, 2e6))),
    min_size=1,
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(rate=st.integers(1, 20), steps=window_requests)
def test_sliding_window_never_holds_more_than_the_rate_in_any_second(
    rate: int, steps: list[tuple[int, int, float | None]]
) -> None:
    now = T0
    times: tuple[float, ...] = ()
    releases: list[float] = []
    for dt, permits, timeout in steps:
        now += dt
        verdict, kept = reserve_window(times, rate, permits, timeout, now)
        if kept is not None:
            times = kept
            assert timeout is None or verdict.wait_us <= timeout
            releases += [now + verdict.wait_us] * permits
    releases.sort()
    lo = 0
    for hi, t in enumerate(releases):
        while t - releases[lo] >= SECOND:
            lo += 1
        assert hi - lo + 1 <= rate


def test_sliding_window_serves_the_full_rate_under_overload_and_waits_for_the_next_slot() -> None:
    rate, now = 10, T0
    times: tuple[float, ...] = ()
    admitted = []
    for i in range(30):  # a caller every 10 ms, each willing to wait 2 s: 3 windows fit
        verdict, kept = reserve_window(times, rate, 1, 2 * SECOND, T0 + i * 10_000)
        assert verdict.allowed
        times = kept or times
        admitted.append(T0 + i * 10_000 + verdict.wait_us)
    assert admitted[:10] == [T0 + i * 10_000 for i in range(10)]  # the first 10 at once
    assert admitted[10] == pytest.approx(admitted[0] + WINDOW_US)  # the 11th: a window later
    refused, _ = reserve_window(times, rate, 1, 2 * SECOND, now + 0.3 * SECOND)
    assert not refused.allowed


def test_sliding_window_refuses_a_batch_larger_than_the_rate() -> None:
    verdict, kept = reserve_window((), 5, 6, None, T0)
    assert not verdict.allowed and kept is None
