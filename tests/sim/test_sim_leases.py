"""Rate leases (``leaseMs``) in the simulated fleet: ``lease.lua``'s Python model
(``model/lease.py``, pinned to the Lua by ``tests/priority/test_lease_script_matches_model.py``)
on the store, each process's real ``Leases``; the checker holds every span of a lease
row to C + R x (T + leaseMs) (docs/algorithms.md, "The exactness bound")."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gateway_limiter.config.rules import Rule
from gateway_limiter.core.leases import Leases
from gateway_limiter.model.bucket import Verdict
from tests.support.sim import Checker, Run, Scenario, Step, Violation, _hold, run_scenario

#: 100/s, a bucket of 300, leases of 500 ms: 50 permits a lease.
LEASED = {
    "config_id": 1,
    "interface_url": "/a",
    "rate_limit": 100,
    "max_permits": 300,
    "cache": 0.5,
    "status": 1,
    "algorithm": "token_bucket",
    "lease_ms": 500,
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _decide(p: int, permits: int, n: int = 1) -> dict[str, Any]:
    return {
        "p": p,
        "op": "decide",
        "url": "/a",
        "permits": permits,
        "timeout": 0,
        "key": None,
        "n": n,
    }


def _stale_leases() -> Scenario:
    """Three processes each take a lease at 0.1 s and spend one permit of it; at 10 s
    each wants 49 more (their leases long past 500 ms) and a fourth wants the whole
    bucket (300) at once. No reload meanwhile (a reload ends every lease: its rules are
    new ones)."""
    return Scenario(
        seed=0,
        processes=[0.0, 0.0, 0.0, 0.0],
        policy="share",
        rows=[LEASED],
        steps=[
            *(Step(0.1, "call", _decide(p, 1)) for p in range(3)),
            *(Step(10.0, "call", _decide(p, 49)) for p in range(3)),
            Step(10.0, "call", _decide(3, 300)),
        ],
        reload_s=60.0,
    )


def test_leases_are_taken_and_spent_in_the_simulation() -> None:
    """Each process's first call sends one lease call (50 permits) and its later calls
    spend the lease in-process; a stale lease is renewed, not spent."""
    run = Run(_stale_leases())
    run.run(Checker())
    run.close()
    # three at 0.1 s, three renewals at 10 s, and p3's (refused)
    assert [(p, t) for p, _, t in run.world.leased] == [
        *((p, 0.1) for p in range(3)),
        *((p, 10.0) for p in range(4)),
    ]
    admitted = sorted((round(a.at, 1), a.process, a.permits) for a in run.admissions)
    # at 10 s the three renewals take 49 (+1) each; 150 are left of 300: p3 is refused
    assert admitted == [(0.1, 0, 1), (0.1, 1, 1), (0.1, 2, 1)] + [(10.0, p, 49) for p in range(3)]


def test_spending_a_lease_past_leasems_breaks_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that keeps spending its lease past ``leaseMs`` (each lease made fresh
    again before it is read): 3 x 49 old permits beside a full bucket of 300, 447 at one
    moment against C + R x L = 350. The checker names it."""
    take = Leases.take

    def never_stale(
        self: Leases, rule: Rule, permits: int, budget_s: float | None, now_s: float
    ) -> Verdict | None:
        lease = self._held.get(rule.url)
        if lease is not None:
            lease.since = now_s
        return take(self, rule, permits, budget_s, now_s)

    monkeypatch.setattr(Leases, "take", never_stale)
    with pytest.raises(Violation, match=r"leaseMs 500.*more than C \+ R x T"):
        run_scenario(_stale_leases())


def test_a_lease_row_is_held_to_c_plus_r_times_t_plus_l() -> None:
    """The allowance is R x leaseMs, no more: a lease of 50 spent at 0.49 s beside a
    bucket refilled to 299 (348 at once) is within C + R x L = 350 and over C = 300.
    (time, permits, from when they count as given out: the lease's, all at once)"""
    rule = Rule("/a", 100, 0.0, 1, capacity=300, lease_ms=500)
    seen = [(0.0, 1, 0.0), (0.49, 49, 0.49), (0.49, 299, 0.49)]
    _hold(rule, seen, 1.0, 50.0, "leased")
    with pytest.raises(Violation):
        _hold(rule, seen, 1.0, 0.0, "as a plain row")
    with pytest.raises(Violation):
        _hold(rule, [*seen, (0.49, 3, 0.49)], 1.0, 50.0, "leased, 3 over")


def test_a_killed_lease_holder_and_an_outage_keep_the_bound() -> None:
    """Process 0 takes a lease and is killed holding it (never handed back); the store
    then pauses: process 1 spends its own lease meanwhile (its lease call after it
    fails, and the policy's bucket starts empty), then the store again. Every span
    holds."""
    sc = Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[LEASED],
        steps=[
            Step(0.1, "call", _decide(0, 1)),
            Step(0.1, "call", _decide(1, 1)),
            Step(0.2, "kill", {"p": 0}),
            Step(0.3, "paused", {"for": 1.5, "lag": 0.05}),
            Step(0.35, "call", _decide(1, 1, n=60)),
            Step(2.0, "call", _decide(1, 1, n=300)),
        ],
    )
    run = Run(sc)
    run.run(Checker())
    run.close()
    Checker().finish(run)
    leased = [a for a in run.admissions if a.process == 1 and a.by_store and a.at < 1.8]
    assert sum(a.permits for a in leased) == 50  # its lease, spent while the store was away
    after = [a for a in run.admissions if a.at >= 2.0]
    # a bucket of 300 less what the dead process leased and never handed back
    assert 150 <= sum(a.permits for a in after) <= 300
