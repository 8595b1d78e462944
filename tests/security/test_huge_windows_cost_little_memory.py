"""A sliding window of a huge ``rateLimit`` (the docs suggest a rate the supplier never
reaches for rows that should cap only concurrency) costs the in-process model memory
and time by the calls it sees, never by its permits: the ``share`` fallback starts each
outage with the window full, and a call may ask for up to 1,000 permits at once."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from gateway_limiter.backends.base import Clocks
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.core.failure import Policy
from gateway_limiter.model.limits import SlidingLog

HUGE = 2**31 - 1


@pytest.mark.parametrize("rate", [5_000_000, HUGE])
def test_an_outage_starts_a_huge_window_full_in_a_few_bytes(rate: int) -> None:
    # share took the window's whole rate in one reservation: one timestamp per permit,
    # 0.2 s and 76 MB at 5,000,000, and the process died at 2**31 - 1.
    rule = Rule("/huge", rate, 0.0, 1, algorithm=Algorithm.SLIDING_WINDOW, period=60)
    policy = Policy("share", MemoryBackend)
    policy.outage_began()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        verdict = policy.reserve(rule, 1, 0.0)
        taken = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not verdict.allowed  # started full: the fleet may just have spent it
    assert peak < 1_000_000 and taken < 0.5


def test_permits_in_bulk_are_one_run_of_the_log() -> None:
    now = [1e15]
    memory = MemoryBackend(clocks=Clocks(lambda: now[0]))
    rule = Rule("/bulk", HUGE, 0.0, 1, algorithm=Algorithm.SLIDING_WINDOW, period=5)
    rule = Rule("/bulk", HUGE, 0.0, 1, algorithm=Algorithm.SLIDING_WINDOW, also=(rule,))
    for _ in range(3):
        assert memory.reserve(rule, 1_000, 0.0).allowed
        now[0] += 1.0
    log = memory.models.live(state_key("gwl", rule), now[0])  # the 1 s window's log
    assert isinstance(log, SlidingLog) and log.total == 3_000 and len(log.times) == 3


def test_the_log_keeps_the_last_admissions_as_a_list_of_them_would() -> None:
    log = SlidingLog.of([1.0, 1.0, 2.0])
    assert log == SlidingLog((1.0, 2.0), (2, 1), 3)
    assert [log.nth(n) for n in (1, 2, 3)] == [1.0, 1.0, 2.0]
    kept = log.add(3, 2.0, keep=4).add(2, 5.0, keep=4)
    assert kept == SlidingLog.of([2.0, 2.0, 5.0, 5.0])
    assert log.add(10, 3.0, keep=10) == SlidingLog.of([3.0] * 10)
