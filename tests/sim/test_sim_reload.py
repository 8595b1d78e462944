"""The reload in the simulated fleet: rows written to a table and read by each
process's real reload (``Registry.reload``: the read, each value converted as the
driver gives it, the rules built, the switch read, the snapshot swapped); after every
reload the checker holds each process to the rules the table's rows make then."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gateway_limiter.config import reload, table
from gateway_limiter.config.reload import Registry, ReloadSummary
from gateway_limiter.config.table import ConfRow
from tests.support.sim import Checker, Run, Scenario, Step, Violation, run_scenario


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _calls(at: float, p: int) -> Step:
    args = {"p": p, "op": "try_acquire", "url": "/a", "permits": 1, "timeout": 0}
    return Step(at, "call", {**args, "key": None, "n": 20})


def _edited() -> Scenario:
    """/a at 5 a second, then 50 from 0.5 s (written to the table); two processes call
    20 times at 0.2 s and at 1.2 s (after the reload at 1 s); the switch turned off at
    1.5 s, a call at 2.2 s."""
    return Scenario(
        seed=0,
        processes=[0.0, 0.0],
        policy="share",
        rows=[
            {"config_id": 1, "interface_url": "/a", "rate_limit": 5, "cache": 0.0, "status": 1},
            {"config_id": 2, "interface_url": "/b", "rate_limit": 5, "cache": 0.0, "status": 1},
        ],
        steps=[
            _calls(0.2, 0),
            Step(0.5, "edit", {"id": 1, "rate_limit": 50}),
            _calls(1.2, 1),
            Step(1.5, "edit", {"id": 1, "switch": False}),
            _calls(2.2, 0),
        ],
        table=True,
    )


def test_a_change_written_to_the_table_is_in_force_after_the_next_reload() -> None:
    run = Run(_edited())
    run.run(Checker())
    run.close()
    Checker().finish(run)
    limits = [(round(a.decided, 1), a.process, a.rule.rate) for a in run.admissions]
    # 5 of the first 20 (a bucket of 5); 50 of the new rate's bucket has room for 20;
    # the switch off at 2.2 s: nothing limited, nothing counted
    assert limits == [(0.2, 0, 5)] * 5 + [(1.2, 1, 50)] * 20


def test_the_checker_catches_a_reload_that_keeps_the_old_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reload that reads the table and keeps the snapshot it had."""

    def stale(self: Registry) -> ReloadSummary:
        return self._succeeded(self.snapshot, self.snapshot)

    monkeypatch.setattr(Registry, "_reload", stale)
    with pytest.raises(Violation, match=r"process 0's reload did not apply the table"):
        run_scenario(_edited())


def test_the_checker_catches_a_read_that_drops_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table read that loses the last row (``/b``)."""
    read = table.read_rows  # what reload.py reads with

    def short(*args: Any, **kwargs: Any) -> list[ConfRow]:
        return read(*args, **kwargs)[:-1]

    monkeypatch.setattr(reload, "read_rows", short)
    with pytest.raises(Violation, match=r"rules of \['/b'\] differ"):
        run_scenario(_edited())
