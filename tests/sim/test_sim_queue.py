"""Callers queued for a slot in the simulated fleet: a ``slot()`` with a wait budget
runs the shell's steps (``core/slots.py``, ``take_slot``) parked at each wait while the
world goes on, woken by the grants the store's ``slot.lua`` model publishes; the
checker holds ``maxConcurrent`` across the fleet throughout."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.sim import Checker, Run, Scenario, Step, Violation, run_scenario
from tests.support.slot_model import SlotModel

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
