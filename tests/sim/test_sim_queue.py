"""Callers queued for a slot in the simulated fleet: a ``slot()`` with a wait budget
runs the shell's steps (``core/slot_steps.py``, ``take_slot``) parked at each wait while the
world goes on, woken by the grants the store's ``slot.lua`` model publishes; the
checker holds ``maxConcurrent`` across the fleet throughout."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gateway_limiter.core import slot_steps
from tests.support.sim import Checker, Run, Scenario, Step, Violation, run_scenario
from tests.support.slot_model import Interface, SlotModel

CAPPED = {
    "config_id": 1,
    "interface_url": "/a",
    "rate_limit": 100,
    "cache": 0.5,
    "status": 1,
    "max_concurrent": 1,
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _queued() -> Scenario:
    """Process 0 holds the one slot of /a from 0.1 s to 0.6 s; process 1 queues three
    callers at 0.2 s (budgets of 2 s, each holding 0.3 s once it has the slot)."""
    return Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[CAPPED],
        steps=[
            Step(0.1, "slot", {"p": 0, "url": "/a", "key": None, "hold": 0.5, "n": 1}),
            Step(
                0.2,
                "queue",
                {"p": 1, "url": "/a", "key": None, "hold": 0.3, "budget": 2.0, "n": 3},
            ),
        ],
    )


def test_queued_callers_get_the_slot_one_after_another() -> None:
    run = Run(_queued())
    run.run(Checker())
    run.close()
    went = [(round(a.at, 1), a.process) for a in run.admissions]
    # each at the release before it: handed over by the store's grant, no wait
    assert went == [(0.1, 0), (0.6, 1), (0.9, 1), (1.2, 1)]
    assert len(run.world.slots.published) == 3  # three grants, one a release


def test_the_checker_catches_a_hand_over_beyond_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that hands slots to every queued caller, whatever the cap."""
    release = SlotModel._release

    def past_the_cap(self: SlotModel, iface: Any, who: str, cap: float, *rest: Any) -> Any:
        return release(self, iface, who, 99.0, *rest)

    monkeypatch.setattr(SlotModel, "_release", past_the_cap)
    with pytest.raises(Violation, match=r"3 slots of /a held through the store, maxConcurrent 1"):
        run_scenario(_queued())


def test_the_checker_catches_a_hand_over_out_of_ticket_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release that hands the slot to the last caller queued, not the first."""
    monkeypatch.setattr(
        Interface,
        "head",
        lambda self: max(self.queue, key=self.queue.__getitem__) if self.queue else None,
    )
    with pytest.raises(Violation, match=r"was handed a slot with 0 held of 1 and 2 still waiting"):
        run_scenario(_queued())


def test_the_checker_catches_a_waiter_that_loses_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter that never asks again while it waits (the engine's pause its whole
    budget): its place lapses after 2 s, the slot freed at 3.1 s goes to nobody, and
    a newcomer takes it while the waiter still waits."""
    monkeypatch.setattr(slot_steps, "pause_s", lambda remaining, lapses, listening: remaining)
    sc = Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[CAPPED],
        steps=[
            Step(0.1, "slot", {"p": 0, "url": "/a", "key": None, "hold": 3.0, "n": 1}),
            Step(
                0.2,
                "queue",
                {"p": 1, "url": "/a", "key": None, "hold": 0.3, "budget": 5.0, "n": 1},
            ),
            Step(3.2, "slot", {"p": 0, "url": "/a", "key": None, "hold": 0.1, "n": 1}),
        ],
    )
    with pytest.raises(Violation, match=r"still waiting, is gone from the store's queue"):
        run_scenario(sc)


def test_a_class_below_critical_waits_without_a_place() -> None:
    """Seed 141, shrunk by hand: on an interface whose limits hold a reserve, a caller of
    a class below critical takes no place in the queue (docs/priority.md) and is handed
    no slot: it asks again when its wait ends. So a newcomer may take a slot freed
    meanwhile, and the order of places does not bind it. The check of the order counts
    only callers with a place; these were never in the store's queue (the check that
    first tripped on this seed took them for queued callers whose places had gone)."""
    sc = Scenario(
        seed=141,
        processes=[0.0],
        policy="share",
        rows=[
            {
                "config_id": 4,
                "interface_url": "/d",
                "rate_limit": 100,
                "cache": 0.5,
                "status": 1,
                "algorithm": "sliding_window",
                "period_seconds": 10,
                "reserve": "default=0.1,sheddable_plus=0.3,sheddable=0.5",
            },
            {
                "config_id": 5,
                "interface_url": "/d",
                "rate_limit": 1000,
                "cache": None,
                "status": 1,
                "algorithm": "token_bucket",
                "max_concurrent": 2,
            },
        ],
        steps=[
            Step(
                0.4657,
                "queue",
                {"p": 0, "url": "/d", "key": None, "hold": 0.2, "budget": 1.0, "n": 3},
            ),
            Step(
                1.081,
                "queue",
                {"p": 0, "url": "/d", "key": None, "hold": 0.5, "budget": 1.0, "n": 2},
            ),
        ],
    )
    run = Run(sc)
    queued: list[dict[str, int]] = []
    model = SlotModel.run

    def watched(self: SlotModel, call: Any, now_ms: float, rate: Any) -> Any:
        answer = model(self, call, now_ms, rate)
        queued.extend(dict(i.queue) for i in self.interfaces.values())
        return answer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SlotModel, "run", watched)
        run.run(Checker())
    run.close()
    # one slot for the class (2 less its share of 0.1, rounded down), no place taken
    assert queued and not any(queued)
    went = [round(a.at, 4) for a in run.admissions]
    # the slot freed at 0.6657 went to the newcomer at 1.081; the two callers waiting
    # since 0.4657 asked again at the end of their budgets, found it held, and gave up;
    # the slot freed at 1.581 went to the other newcomer when its budget ended
    assert went == [0.4657, 1.081, 2.081]


def test_a_grant_claimed_after_a_restart_counts_as_the_old_stores() -> None:
    """Seed 5914, shrunk: a waiter heard its grant (a slot and a permit) just after an
    outage, while its breaker was still open; it took the failure policy's path, found
    no slot free in-process and waited a second, then claimed the grant, after the store
    had restarted empty. Its slot and permit are of the store before the restart (lost
    with it, as every slot held then: docs/concurrency.md), not slots taken since."""
    sc = Scenario(
        seed=5914,
        processes=[0.0, 0.0],
        policy="local",
        rows=[
            {
                "config_id": 2,
                "interface_url": "/a",
                "rate_limit": 1000000,
                "cache": 2.0,
                "status": 1,
                "algorithm": "sliding_window",
                "period_seconds": 1,
                "max_concurrent": 1,
                "channel_type": "SUP",
            },
            {
                "config_id": 3,
                "interface_url": "*",
                "channel_type": "SUP",
                "rate_limit": 2,
                "cache": 0.5,
                "status": 1,
            },
        ],
        steps=[
            Step(
                0.1965,
                "call",
                {
                    "p": 0,
                    "op": "acquire",
                    "url": "/a",
                    "permits": 1,
                    "timeout": 0.05,
                    "key": "bad",
                    "n": 1,
                },
            ),
            Step(0.3979, "down", {"for": 0.3, "lag": 0.5}),
            Step(1.0058, "restart", {"for": 1.5, "lag": 0.05}),
            Step(
                0.3425,
                "queue",
                {"p": 0, "url": "/a", "key": None, "hold": 0.5, "budget": 2.0, "n": 4},
            ),
            Step(
                0.5075,
                "queue",
                {"p": 0, "url": "/a", "key": None, "hold": 1.0, "budget": 2.0, "n": 4},
            ),
            Step(
                0.137,
                "queue",
                {"p": 1, "url": "/a", "key": None, "hold": 0.2, "budget": 1.0, "n": 2},
            ),
        ],
        epoch_s=1774745998.766,
    )
    run = Run(sc)
    run.run(Checker())
    run.close()
    restarted = run.world.epoch
    claimed = [s for s in run.world.leased_slots.values() if s.epoch < restarted and s.at > 0.6]
    assert claimed, "no grant of the store before the restart"


def test_a_grant_heard_while_the_breaker_is_open_is_taken_at_once() -> None:
    """Seed 18522, shrunk: process 0's breaker opened on a pushback while the store was
    slow; at 2.80 s a release handed its third queued caller the slot (leased 1 s),
    which it heard, but it waited for the breaker (the failure policy had no slot for
    it) and claimed the grant at 3.80 s, as its lease lapsed: it went on with a slot the
    store no longer counted. A grant is heard from Redis: the caller takes it at once."""
    sc = Scenario(
        seed=18522,
        processes=[0.0, -2.40587286876762, 0.16827294462297715],
        policy="share",
        rows=[
            {**CAPPED, "config_id": 2, "cache": None, "max_concurrent": 2},
            {
                "config_id": 5,
                "interface_url": "/d",
                "rate_limit": 1000000,
                "cache": 0.5,
                "status": 1,
                "algorithm": "fixed_window",
                "period_seconds": 1,
                "max_concurrent": 5,
                "channel_type": "SUP",
            },
        ],
        steps=[
            Step(1.7192, "slot", {"p": 2, "url": "/a", "key": "vip", "hold": 0.5, "n": 1}),
            Step(2.4131, "slow", {"for": 0.3, "lag": 0.5}),
            Step(2.4204, "pushback", {"p": 0, "url": "/d", "retry": 1.0}),
            Step(
                1.7998,
                "queue",
                {
                    "p": 0,
                    "url": "/a",
                    "key": None,
                    "hold": 1.0,
                    "budget": 2.0,
                    "n": 3,
                    "priority": "critical",
                },
            ),
        ],
        epoch_s=1774745997.926,
    )
    run = Run(sc)
    run.run(Checker())
    run.close()
    went = [round(a.at, 4) for a in run.admissions if a.process == 0]
    assert went == [1.7998, 2.2192, 2.7998]
