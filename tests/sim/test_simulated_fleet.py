"""The simulated fleet: random rows, calls and faults against many real engines.

Every scenario is seeded: ``GWL_SIM_SCENARIOS`` scenarios (default 2,000) from seed
``GWL_SIM_SEED`` (default 0) run in the normal test run; a long run is
``GWL_SIM_SCENARIOS=100000 GWL_SIM_SEED=$RANDOM .venv/bin/python -m pytest -q tests/sim``.
A scenario that breaks a promise is shrunk and printed as a test to paste here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway_limiter.config.rules import Rule
from tests.support.sim import (
    Checker,
    Run,
    Scenario,
    SimClock,
    SimLimiter,
    Step,
    Violation,
    World,
    _hold,
    as_test,
    fails,
    run_scenario,
    scenario,
    shrink,
)

SCENARIOS = int(os.environ.get("GWL_SIM_SCENARIOS", "2000"))
FIRST_SEED = int(os.environ.get("GWL_SIM_SEED", "0"))
CHUNKS = 8


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """The engines log every outage and skipped row: thousands of lines, none read here."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_promise_holds_in_random_scenarios(chunk: int) -> None:
    seeds = range(FIRST_SEED + chunk, FIRST_SEED + SCENARIOS, CHUNKS)
    for seed in seeds:
        sc = scenario(seed)
        message = fails(sc)
        if message is None:
            continue
        small = shrink(sc)
        pytest.fail(
            f"seed {seed}: {message}\nshrunk to a test to paste:\n"
            f"{as_test(small, fails(small) or message)}",
            pytrace=False,
        )


def test_scenarios_are_reproducible() -> None:
    """The same seed makes the same scenario and the same admissions."""
    for seed in (1, 17, 40):
        assert scenario(seed) == scenario(seed)
        runs = []
        for _ in range(2):
            run = Run(scenario(seed))
            run.run(Checker())
            runs.append([(a.at, a.process, a.url, a.permits, a.by_store) for a in run.admissions])
            run.close()
        assert runs[0] == runs[1]
        assert runs[0], "a scenario that admits nothing checks nothing"


def test_the_clock_is_the_simulated_one() -> None:
    """No real sleep: a scenario of seconds of waits runs in a fraction of a second,
    and the waits are on the world's timeline."""
    sc = Scenario(
        seed=0,
        processes=[0.0, 1.5],
        policy="share",
        rows=[{"config_id": 1, "interface_url": "/a", "rate_limit": 2, "cache": 5.0, "status": 1}],
        steps=[
            Step(
                0.1,
                "call",
                {
                    "p": p,
                    "op": "acquire",
                    "url": "/a",
                    "permits": 1,
                    "timeout": None,
                    "key": None,
                    "n": 10,
                },
            )
            for p in (0, 1)
        ],
    )
    began = time.perf_counter()
    run = Run(sc)
    run.run(Checker())
    run.close()
    assert time.perf_counter() - began < 2.0
    waits = sorted(a.at for a in run.admissions)
    assert len(waits) == 20
    assert waits[-1] > 8.0  # 20 permits at 2/s, 2 saved: about 9 s of waits
    clock = SimClock(World(), 2.5)
    assert clock.time() - clock.monotonic() == pytest.approx(1_767_571_200.0 - 1_000.0)


def test_the_checker_catches_a_bucket_over_its_bound() -> None:
    """C + R x T over every span: 3 permits at once on a bucket of 2 at 1/s breaks it."""
    rule = Rule("/a", 1, 0.0, 1, capacity=2)
    _hold(rule, [(0.0, 1), (0.5, 1), (1.0, 1), (2.0, 1)], 1.0, 0.0, "ok")
    with pytest.raises(Violation):
        _hold(rule, [(0.0, 2), (0.5, 1), (0.6, 1)], 1.0, 0.0, "over")
    # a span that starts late: 3 at once at 10 s (decided then), after a quiet start
    with pytest.raises(Violation):
        _hold(rule, [(0.0, 1), (10.0, 3, 10.0)], 1.0, 0.0, "over, late")
    # a call of 5 decided at 7 s goes at 10 s: 2 stored, 3 refilled meanwhile
    _hold(rule, [(0.0, 1), (10.0, 5, 7.0)], 1.0, 0.0, "a large call that waited")
    window = Rule("/a", 3, 0.0, 1, algorithm="sliding_window")
    _hold(window, [(0.0, 3), (1.0, 3)], 1.0, 0.0, "ok")
    with pytest.raises(Violation):
        _hold(window, [(0.0, 2), (0.9, 2)], 1.0, 0.0, "over")


def test_a_failing_scenario_shrinks_and_prints_a_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken promise (here every call "takes too long": the real-time ceiling set
    below zero) shrinks to one step and prints as a test that runs."""
    from tests.support import sim

    sc = scenario(5)
    assert fails(sc) is None
    monkeypatch.setattr(sim, "CALL_REAL_S", -1.0)
    message = fails(sc)
    assert message is not None and "of CPU time" in message
    small = shrink(sc)
    assert len(small.steps) == 1 and small.steps[0].what == "call"
    assert len(small.rows) <= 1
    assert small.steps[0].args["p"] == len(small.processes) - 1 or len(small.processes) == 1
    text = as_test(small, message)
    namespace: dict[str, object] = {}
    exec(compile("from tests.support.sim import *\n" + text, "pasted", "exec"), namespace)
    with pytest.raises(Violation):
        namespace[f"test_simulated_fleet_seed_{small.seed}"]()  # type: ignore[operator]


def test_a_part_changed_mid_outage_carries_the_bucket_over() -> None:
    """Seed 1128, shrunk: the store is away 1.5 s; a heartbeat answers meanwhile (after
    a call on ``/b``) and the claim on ``/d`` goes from 1 to 0.95. A token bucket of 1
    per 10 s had booked 7 permits at part 1; at 0.95 a second bucket booked as many
    again over the same seconds."""
    sc = Scenario(
        seed=1128,
        processes=[0.0],
        policy="share",
        rows=[
            {
                "config_id": 2,
                "interface_url": "/b",
                "rate_limit": 1000000,
                "cache": 0.5,
                "status": 1,
                "algorithm": "token_bucket",
                "period_seconds": 10,
                "max_concurrent": 2,
            },
            {
                "config_id": 5,
                "interface_url": "/d",
                "rate_limit": 1,
                "cache": 0.0,
                "status": 1,
                "algorithm": "token_bucket",
                "period_seconds": 10,
            },
        ],
        steps=[
            Step(0.2973, "down", {"for": 1.5, "lag": 0.05}),
            Step(
                0.7441,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "/d",
                    "permits": 7,
                    "timeout": 0.05,
                    "key": "k1",
                    "n": 2,
                },
            ),
            Step(
                1.7836,
                "call",
                {
                    "p": 0,
                    "op": "try_acquire",
                    "url": "/b",
                    "permits": 1,
                    "timeout": None,
                    "key": "vip",
                    "n": 5,
                },
            ),
            Step(
                2.4544,
                "call",
                {
                    "p": 0,
                    "op": "decide",
                    "url": "/d",
                    "permits": 1,
                    "timeout": 1e16,
                    "key": "k1",
                    "n": 5,
                },
            ),
        ],
    )
    run_scenario(sc)


def test_a_part_changed_mid_outage_carries_the_window_over() -> None:
    """Seed 29, shrunk: as above on a sliding window of 1 per 2 s, stretched to 1 per
    3 s at 0.95; its bookings at part 1 must count in the window at the new part."""
    sc = Scenario(
        seed=29,
        processes=[-0.9250090599716709],
        policy="share",
        rows=[
            {
                "config_id": 1,
                "interface_url": "}c{",
                "rate_limit": 1,
                "cache": None,
                "status": 1,
                "algorithm": "sliding_window",
                "period_seconds": 2,
                "max_concurrent": 2,
            }
        ],
        steps=[
            Step(0.3993, "paused", {"for": 1.5, "lag": 0.05}),
            Step(
                0.4034,
                "call",
                {
                    "p": 0,
                    "op": "reserve",
                    "url": "}c{",
                    "permits": 7,
                    "timeout": None,
                    "key": "k1",
                    "n": 1,
                },
            ),
            Step(
                0.8863,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "}c{",
                    "permits": 1,
                    "timeout": 0.05,
                    "key": "k1",
                    "n": 1,
                },
            ),
            Step(
                1.4197,
                "call",
                {
                    "p": 0,
                    "op": "reserve",
                    "url": "}c{",
                    "permits": 1,
                    "timeout": 1e16,
                    "key": None,
                    "n": 1,
                },
            ),
            Step(
                2.0709,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "}c{",
                    "permits": 1,
                    "timeout": 1e16,
                    "key": "vip",
                    "n": 2,
                },
            ),
        ],
    )
    run_scenario(sc)


def test_a_named_callers_slots_follow_its_row() -> None:
    """Seed 1186, shrunk (break 1 of the eight, with ``slot()`` routing without the key
    put back): the only row of ``/b`` names caller ``k1`` with ``maxConcurrent`` 2;
    ``slot()`` routed ``k1`` to no row and held 3 at once."""
    sc = Scenario(
        seed=1186,
        processes=[0.0, 0.0],
        policy="allow",
        rows=[
            {
                "config_id": 3,
                "interface_url": "/b",
                "rate_limit": 5,
                "cache": 2.0,
                "status": 1,
                "algorithm": "sliding_window",
                "period_seconds": 2,
                "per_caller": 1,
                "caller_key": "k1",
                "max_concurrent": 2,
            }
        ],
        steps=[Step(1.0479, "slot", {"p": 1, "url": "/b", "key": "k1", "hold": 2.0, "n": 3})],
    )
    run = Run(sc)
    run.run(Checker())
    run.close()
    assert [(a.process, a.by_store) for a in run.admissions] == [(1, True), (1, True)]


def test_slots_held_through_the_store_count_against_the_outage_part() -> None:
    """Seed 70, shrunk: two slots of a cap of 2 taken through the store, then the store
    pauses; under ``local`` the process's part is the whole cap, and the two it holds
    count against it (it took a third beside them)."""
    sc = Scenario(
        seed=70,
        processes=[0.0],
        policy="local",
        rows=[
            {
                "config_id": 2,
                "interface_url": "/a",
                "rate_limit": 1000,
                "cache": None,
                "status": 1,
                "algorithm": "sliding_window",
                "period_seconds": 1,
                "max_concurrent": 2,
            }
        ],
        steps=[
            Step(1.6072, "slot", {"p": 0, "url": "/a", "key": "bad", "hold": 2.0, "n": 2}),
            Step(1.7504, "paused", {"for": 4.0, "lag": 0.05}),
            Step(2.7445, "slot", {"p": 0, "url": "/a", "key": "{x}", "hold": 2.0, "n": 1}),
        ],
    )
    run = Run(sc)
    run.run(Checker())
    run.close()
    assert [a.by_store for a in run.admissions] == [True, True]


CAPPED = {"config_id": 1, "interface_url": "/a", "rate_limit": 100, "cache": 0.5, "status": 1}


def _killed_holder(renew: bool = True) -> Scenario:
    """Process 0 takes both slots of ``/a`` for 3 s and is killed at 0.5 s; process 1
    asks at 0.8 s (both still leased to the dead one) and at 1.6 s (the lease of 1 s,
    last renewed by 0.34 s, has lapsed)."""
    slot = {"url": "/a", "key": None, "n": 1}
    return Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[{**CAPPED, "max_concurrent": 2}],
        steps=[
            Step(0.1, "slot", {"p": 0, **slot, "hold": 3.0, "n": 2}),
            Step(0.5, "kill", {"p": 0}),
            Step(0.8, "slot", {"p": 1, **slot, "hold": 0.1}),
            Step(1.6, "slot", {"p": 1, **slot, "hold": 0.1, "n": 2}),
            Step(1.9, "slot", {"p": 1, **slot, "hold": 1.5}),
        ],
    )


def test_a_killed_holders_slots_are_free_within_a_lease() -> None:
    run = Run(_killed_holder())
    run.run(Checker())
    run.close()
    taken = [(round(a.at, 1), a.process, a.by_store) for a in run.admissions]
    assert taken == [(0.1, 0, True), (0.1, 0, True), (1.6, 1, True), (1.6, 1, True), (1.9, 1, True)]


def test_the_checker_catches_a_slot_whose_lease_was_not_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewer that renews nothing: a 1.5 s call loses its 1 s lease with the store
    answering throughout, which the checker names."""
    from tests.support import sim

    monkeypatch.setattr(sim.SimLimiter, "_renew_slots", lambda self: None)
    with pytest.raises(Violation, match="lost its lease"):
        run_scenario(_killed_holder())


def test_a_caller_first_seen_after_the_part_changed_counts_what_the_others_booked() -> None:
    """Seed 3831, shrunk: a bucket of 1 at 3 a second beside a per-caller window; the
    store away 0.3 s, then a heartbeat answers while the breaker is open and the part
    goes from 1 to 0.95. Caller ``bad`` had booked the bucket to 2.3 s at part 1;
    caller ``{x}``, first seen at 0.95, was admitted at 1.64 beside those bookings."""
    sc = Scenario(
        seed=3831,
        processes=[0.0],
        policy="share",
        rows=[
            {
                "config_id": 1,
                "interface_url": "}c{",
                "rate_limit": 3,
                "cache": 2.0,
                "status": 1,
                "algorithm": "token_bucket",
                "period_seconds": 1,
                "max_permits": 1,
            },
            {
                "config_id": 2,
                "interface_url": "}c{",
                "rate_limit": 100,
                "cache": 0.0,
                "status": 1,
                "algorithm": "fixed_window",
                "period_seconds": 2,
                "per_caller": 1,
                "max_concurrent": 2,
            },
        ],
        steps=[
            Step(0.4198, "down", {"for": 0.3, "lag": 0.5}),
            Step(
                0.6446,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "}c{",
                    "permits": 1,
                    "timeout": None,
                    "key": "bad",
                    "n": 5,
                },
            ),
            Step(
                1.2867,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "}c{",
                    "permits": 1,
                    "timeout": 0.05,
                    "key": "{x}",
                    "n": 1,
                },
            ),
        ],
    )
    run_scenario(sc)


def test_a_named_caller_first_seen_in_an_outage_keeps_the_channels_debt() -> None:
    """Seed 2514, shrunk: a channel of 5 a second over ``/d`` and ``}c{``, whose caller
    ``k1`` has a row of its own. In an outage ``/d`` booked the channel to 3.53 s (7
    permits); then ``k1``'s first slot on ``}c{``, after an unnamed caller there, had
    the interface's limits carried to its Rule by position: the channel's state went to
    ``k1``'s row, and three slots went at 2.63 s on a channel started afresh."""
    sc = Scenario(
        seed=2514,
        processes=[1.6758789512919865],
        policy="share",
        rows=[
            {
                "config_id": 1,
                "interface_url": "}c{",
                "rate_limit": 5,
                "cache": 2.0,
                "status": 1,
                "algorithm": "token_bucket",
                "period_seconds": 1,
                "channel_type": "SUP",
                "reserve": "sheddable_plus=0.25",
                "lease_ms": 20,
            },
            {
                "config_id": 2,
                "interface_url": "}c{",
                "rate_limit": 1000,
                "cache": None,
                "status": 1,
                "algorithm": "token_bucket",
                "period_seconds": 1,
                "max_permits": 3000,
                "per_caller": 1,
                "caller_key": "k1",
                "channel_type": "SUP",
            },
            {
                "config_id": 4,
                "interface_url": "/d",
                "rate_limit": 1000000,
                "cache": 0.5,
                "status": 1,
                "algorithm": "fixed_window",
                "period_seconds": 1,
                "channel_type": "SUP",
            },
            {
                "config_id": 5,
                "interface_url": "*",
                "channel_type": "SUP",
                "rate_limit": 30,
                "cache": 0.5,
                "status": 1,
            },
        ],
        steps=[
            Step(1.0356, "edit", {"id": 5, "rate_limit": 5}),
            Step(2.0912, "down", {"for": 0.3, "lag": 0.5}),
            Step(
                2.1298,
                "call",
                {
                    "p": 0,
                    "op": "decide",
                    "url": "/d",
                    "permits": 1000000,
                    "timeout": None,
                    "key": "k1",
                    "n": 1,
                    "priority": None,
                },
            ),
            Step(
                2.4747,
                "call",
                {
                    "p": 0,
                    "op": "decide",
                    "url": "}c{",
                    "permits": 1000000,
                    "timeout": None,
                    "key": "ü\x00",
                    "n": 1,
                    "priority": None,
                },
            ),
            Step(
                2.5837,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "/d",
                    "permits": 7,
                    "timeout": None,
                    "key": "vip",
                    "n": 1,
                    "priority": "sheddable_plus",
                },
            ),
            Step(
                2.6332,
                "slot",
                {
                    "p": 0,
                    "url": "}c{",
                    "key": "k1",
                    "hold": 0.5,
                    "n": 3,
                    "priority": "sheddable",
                },
            ),
        ],
    )
    run_scenario(sc)


def _ran(steps: list[Step], rows: list[dict[str, Any]]) -> Run:
    run = Run(Scenario(seed=0, processes=[0.0, 0.0], policy="share", rows=rows, steps=steps))
    run.run(Checker())
    run.close()
    return run


def test_a_holder_killed_in_its_rate_wait_keeps_its_slot_for_the_wait_and_a_lease() -> None:
    """Seed 3109: a slot is leased for the rate's wait and a lease from when it is taken
    (``slot.lua``: the lease runs from when the call goes). Process 0's second caller
    waits about 1 s for its permit with the slot held, and the process dies 0.2 s in:
    the lease runs past its death plus one lease, to the end of the wait plus one."""
    rate = {**CAPPED, "rate_limit": 1, "max_concurrent": 2}
    queue = {"p": 0, "url": "/a", "key": None, "hold": 0.5, "budget": 2.0, "n": 2}
    run = _ran([Step(0.1, "queue", queue), Step(0.3, "kill", {"p": 0})], [rate])
    (waited,) = [s.until for s in run.world.leased_slots.values() if s.until > 1300 and s.at < 0.2]
    assert 2000 < waited < 2200  # 0.1 + its wait (about 1 s) + the lease


def test_a_waiter_killed_in_the_queue_may_be_handed_a_slot_within_its_place() -> None:
    """Seed 3848: a dead waiter's place lapses 2 s after its last ask; a release before
    then hands it the slot, leased for a lease from the hand-over, then lapsing."""
    steps = [
        Step(0.1, "slot", {"p": 1, "url": "/a", "key": None, "hold": 1.4, "n": 1}),
        Step(0.2, "queue", {"p": 0, "url": "/a", "key": None, "hold": 0.3, "budget": 2.0, "n": 1}),
        Step(0.5, "kill", {"p": 0}),
    ]
    run = _ran(steps, [{**CAPPED, "max_concurrent": 1}])
    handed = [
        (round(s.at, 1), round(s.until))
        for who, s in run.world.leased_slots.items()
        if run.world.owners.get(who) == 0
    ]
    assert handed == [(1.5, 2500)]


def test_the_checker_catches_a_dead_processs_lease_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal that renews the leases of every process, the killed one's too."""
    run = Run(_killed_holder())
    renew = SimLimiter._renew_slots

    def renewing_all(self: SimLimiter) -> None:
        for lim in run.limiters:
            renew(lim)

    monkeypatch.setattr(SimLimiter, "_renew_slots", renewing_all)
    with pytest.raises(Violation, match=r"of process 0, killed at 0.500, runs to"):
        run.run(Checker())
    run.close()


def test_slots_held_when_a_channel_row_goes_are_not_counted_under_the_new_keys() -> None:
    """Seed 4325: removing the channel row moves ``/a``'s keys from the channel's hash
    tag to its own (docs/cluster.md: they start afresh), its slots' too: the two held
    under the old keys are not counted under the new ones, as after a restart."""
    rows = [
        {**CAPPED, "max_concurrent": 2, "channel_type": "SUP"},
        {
            "config_id": 2,
            "interface_url": "*",
            "channel_type": "SUP",
            "rate_limit": 100,
            "cache": 0.5,
            "status": 1,
        },
    ]
    steps = [
        Step(0.1, "slot", {"p": 0, "url": "/a", "key": None, "hold": 2.0, "n": 2}),
        Step(0.5, "edit", {"id": 2, "status": 0}),
        Step(1.2, "slot", {"p": 0, "url": "/a", "key": None, "hold": 0.5, "n": 3}),
    ]
    run = _ran(steps, rows)
    keys = sorted({s.key for s in run.world.leased_slots.values()})
    assert keys == ["sim:{/a}:slots", "sim:{=SUP}:/a:slots"]
    assert [round(a.at, 1) for a in run.admissions] == [0.1, 0.1, 1.2, 1.2]


def test_a_channels_part_changed_mid_outage_carries_over_to_its_other_interfaces() -> None:
    """Seed 6274, shrunk: process 0 started first (N = 1 as it last heard) and the store
    went slow; ``/b``'s named caller booked the channel of 2 a second at part 1 to 6.7
    s; a heartbeat then said N = 2 while the breaker was open, and ``}c{``'s first call
    in the outage found the channel at part 0.5 with a bucket of its own beside the
    debt: 5.3 permits beyond R x T + C."""
    sc = Scenario(
        seed=6274,
        processes=[0.0, 2.6068359088908633],
        policy="share",
        rows=[
            {
                "config_id": 1,
                "interface_url": "}c{",
                "rate_limit": 100,
                "cache": 2.0,
                "status": 1,
                "algorithm": "token_bucket",
                "period_seconds": 1,
                "channel_type": "SUP",
            },
            {
                "config_id": 6,
                "interface_url": "/b",
                "rate_limit": 3,
                "cache": 0.0,
                "status": 1,
                "algorithm": "fixed_window",
                "period_seconds": 1,
                "per_caller": 1,
                "caller_key": "k1",
                "channel_type": "SUP",
                "reserve": "default=0.9",
                "priority": "critical",
            },
            {
                "config_id": 8,
                "interface_url": "*",
                "channel_type": "SUP",
                "rate_limit": 2,
                "cache": 0.5,
                "status": 1,
            },
        ],
        steps=[
            Step(0.4195, "slow", {"for": 1.5, "lag": 0.05}),
            Step(
                1.7422,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "/b",
                    "permits": 2,
                    "timeout": 1e16,
                    "key": "k1",
                    "n": 5,
                    "priority": None,
                },
            ),
            Step(
                2.4199,
                "call",
                {
                    "p": 0,
                    "op": "try_acquire",
                    "url": "}c{",
                    "permits": 1000000,
                    "timeout": 1e16,
                    "key": None,
                    "n": 1,
                    "priority": "sheddable",
                },
            ),
        ],
    )
    run_scenario(sc)


def test_a_call_decided_at_the_moment_of_a_restart_but_before_it_counts_before_it() -> None:
    """Seed 25646, shrunk: 2 permits of a bucket of 2 taken at 0.6707, then the store
    restarts at that same moment and a fresh bucket gives one more at 0.7438. The
    checker cut the spans by time alone and put the first call after the restart."""
    row = {
        "config_id": 4,
        "interface_url": "}c{",
        "rate_limit": 2,
        "cache": 2.0,
        "status": 1,
        "algorithm": "token_bucket",
        "period_seconds": 1,
        "max_permits": 2,
        "per_caller": 1,
        "max_concurrent": 2,
        "reserve": "sheddable=0.5",
        "priority": "default",
        "lease_ms": 500,
    }
    call = {"p": 0, "op": "acquire", "url": "}c{", "permits": 2, "timeout": None}
    sc = Scenario(
        seed=25646,
        processes=[-2.4731690819067476],
        policy="share",
        rows=[row],
        steps=[
            Step(0.6707, "call", {**call, "key": "k1", "n": 1, "priority": "critical"}),
            Step(0.6707, "restart", {"for": 1.5, "lag": 0.05}),
            Step(
                0.7438,
                "call",
                {**call, "op": "try_acquire", "permits": 1, "timeout": 1.0, "key": "k1", "n": 1},
            ),
        ],
    )
    run = Run(sc)
    run.run(Checker())
    run.close()
    assert [(a.permits, a.epoch) for a in run.admissions] == [(2, 0), (1, 1)]
    Checker().finish(run)


def test_a_channel_shared_out_while_a_named_caller_waits_out_its_window() -> None:
    """Seed 20703, shrunk: during an outage under ``share`` at N = 2, the channel (2 a
    second, 1 here) starts empty at 2.24 s on ``}c{``, whose claim (0.475) writes it as
    10**6 per 10**6 s; ``/d``'s named caller ``{x}``, with no claim, writes it as 2 per
    2 s, another key: its first decision carried the channel there and booked it for
    3.24 s and 4.48 s. The ``try_acquire`` on ``}c{`` at 2.29 s, its part unchanged, did
    not look where the channel had gone, found its own key empty and went at 2.48 s: 2
    permits in 0.76 s with ``{x}``'s first, 1.24 beyond R x T where C allows 1. By hand
    the channel's next permit was free at 5.48 s, beyond the call's 0.5 s budget. The
    policy's fault, not the harness': an ``acquire`` books its permit when it asks, then
    sleeps, so carrying it out whole at 2.26 s leaves the state a real process would.
    A channel's cap now follows the channel at every decision
    (``Policy._channel_caps``), and the call is refused."""
    sc = Scenario(
        seed=20703,
        processes=[2.2532321941791746, -0.4816637771237877],
        policy="share",
        rows=[
            {
                "config_id": 1,
                "interface_url": "}c{",
                "rate_limit": 3,
                "cache": 0.5,
                "status": 1,
                "algorithm": "fixed_window",
                "period_seconds": 1,
                "channel_type": "SUP",
            },
            {
                "config_id": 3,
                "interface_url": "/d",
                "rate_limit": 1,
                "cache": 2.0,
                "status": 1,
                "algorithm": "fixed_window",
                "period_seconds": 1,
                "per_caller": 1,
                "caller_key": "{x}",
                "channel_type": "SUP",
            },
            {
                "config_id": 4,
                "interface_url": "*",
                "channel_type": "SUP",
                "rate_limit": 2,
                "cache": 0.5,
                "status": 1,
            },
        ],
        steps=[
            Step(2.1525, "paused", {"for": 1.5, "lag": 0.05}),
            Step(
                2.2368,
                "call",
                {
                    "p": 1,
                    "op": "reserve",
                    "url": "}c{",
                    "permits": 2,
                    "timeout": 1.0,
                    "key": "k1",
                    "n": 2,
                },
            ),
            Step(
                2.2633,
                "call",
                {
                    "p": 1,
                    "op": "acquire",
                    "url": "/d",
                    "permits": 1,
                    "timeout": 0.05,
                    "key": "{x}",
                    "n": 2,
                },
            ),
            Step(
                2.2914,
                "call",
                {
                    "p": 1,
                    "op": "try_acquire",
                    "url": "}c{",
                    "permits": 1,
                    "timeout": None,
                    "key": "bad",
                    "n": 1,
                },
            ),
        ],
    )
    run_scenario(sc)
