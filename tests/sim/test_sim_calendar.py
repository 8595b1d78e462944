"""Calendar quotas in the simulated fleet: each period's count at most the quota
across the fleet (``Checker.finish``, ``_hold_calendar``), across DST changes and
months' ends, the world's clock jumping ahead."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gateway_limiter.backends import scripts, state
from gateway_limiter.model.limit_state import Limit
from tests.support.sim import Checker, Run, Scenario, Step, Violation, run_scenario

#: 2026-03-08 07:30 UTC: New York's 02:30 that night, which the clocks skip; a day
#: quota renewing at 02:30 renews at 03:30 EDT, this moment.
SKIPPED = 1_772_955_000.0
#: 2026-02-01 00:00 UTC: January's end.
FEBRUARY = 1_769_904_000.0


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _quota(period: str, zone: str, quota: int, renews: str | None = None) -> dict[str, Any]:
    return {
        "config_id": 1,
        "interface_url": "/q",
        "rate_limit": quota,
        "cache": 0.0,
        "status": 1,
        "quota_period": period,
        "time_zone": zone,
        "quota_renews": renews,
    }


def _calls(at: float, p: int, n: int) -> Step:
    args = {"p": p, "op": "try_acquire", "url": "/q", "permits": 1, "timeout": 0}
    return Step(at, "call", {**args, "key": None, "n": n})


def _admitted(sc: Scenario) -> list[tuple[float, int]]:
    run = Run(sc)
    run.run(Checker())
    run.close()
    Checker().finish(run)
    return sorted((round(a.at, 1), a.process) for a in run.admissions)


def _across_the_skipped_hour() -> Scenario:
    """A day quota of 3 renewing at 02:30 in New York, the world starting 1.5 s before
    the spring-forward night's 02:30 (which the clocks skip); two processes ask for 5
    each side of it."""
    return Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[_quota("day", "America/New_York", 3, "02:30")],
        steps=[_calls(0.5, 0, 3), _calls(0.5, 1, 2), _calls(2.5, 1, 3), _calls(2.5, 0, 2)],
        epoch_s=SKIPPED - 1.5,
    )


def test_a_day_renewing_at_a_skipped_time_renews_an_hour_later() -> None:
    assert _admitted(_across_the_skipped_hour()) == [
        (0.5, 0),
        (0.5, 0),
        (0.5, 0),
        (2.5, 1),
        (2.5, 1),
        (2.5, 1),
    ]


def test_the_checker_catches_a_store_that_renews_an_hour_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store whose quotas' periods run an hour ahead (the zone's summer time taken
    a day early): it renews at 02:30 EST, 1.5 s into this scenario's world, before the
    skipped hour, so 3 + 3 go in the one period; the checker names the period."""
    limit = state.limit  # the boundaries the calls are sent with (scripts.py's)

    def an_hour_early(rule: Any, now_s: float | None = None) -> Limit:
        spec = limit(rule, None if now_s is None else now_s + 3_600.0)
        if not spec.bounds:
            return spec
        return spec._replace(bounds=tuple(b - 3_600e6 for b in spec.bounds))

    monkeypatch.setattr(scripts, "limit", an_hour_early)
    sc = _across_the_skipped_hour()
    sc.epoch_s = SKIPPED - 3_600.0 - 1.5
    with pytest.raises(Violation, match=r"calendar quota 3 a day in America/New_York: 4 admitted"):
        run_scenario(sc)


def test_a_month_ends_and_the_clock_jumps_a_month() -> None:
    """A month quota of 2 in UTC from 2 s before February: 2 in January, 2 in
    February, then the clock jumps 31 days (into March): 2 more."""
    sc = Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[_quota("month", "UTC", 2)],
        steps=[
            _calls(0.5, 0, 3),
            _calls(2.5, 1, 3),
            Step(2.8, "jump", {"by": 2_678_400.0}),
            _calls(2.9, 0, 3),
        ],
        epoch_s=FEBRUARY - 2.0,
    )
    went = [(round(t - 2_678_400.0, 1) if t > 100 else t, p) for t, p in _admitted(sc)]
    assert went == [(0.5, 0), (0.5, 0), (2.5, 1), (2.5, 1), (2.9, 0), (2.9, 0)]


def test_calls_waiting_beyond_the_next_two_periods_do_not_overrun_the_quota() -> None:
    """A quota of 1 a month in New York, renewing on the 30th; six callers each willing
    to wait a year (``reserve(timeout=1e16)``): one goes now, one at each of the next
    two renewals (30 March, 30 April: the end of the next period the store is told of,
    and the start of the one after), and the other three are refused, whatever their
    budget: the end of the period from 30 April is not known to the store (once the
    store guessed it as its start plus the period before it, 31 May, and booked all
    three there, in the one period). ``limits.lua``, ``bucket.lua`` and their model
    alike."""
    call = {"op": "reserve", "url": "/q", "permits": 1, "timeout": 1e16, "key": None}
    sc = Scenario(
        seed=0,
        processes=[0.0],
        policy="share",
        rows=[_quota("month", "America/New_York", 1, "30 00:00")],
        steps=[Step(0.5, "call", {"p": 0, **call, "n": 6})],
        epoch_s=SKIPPED - 1.5,
    )
    run_scenario(sc)
    start = SKIPPED - 1.5
    march_30 = 1_774_843_200.0 - start  # 2026-03-30 00:00 EDT
    april_30 = 1_777_521_600.0 - start  # 2026-04-30 00:00 EDT
    assert _admitted(sc) == [(0.5, 0), (round(march_30, 1), 0), (round(april_30, 1), 0)]
