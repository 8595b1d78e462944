"""Taking a slot is written once, with no I/O (``core.slot_steps.take_slot``): it answers the
next step for the shell to carry out (reserve, send, wait until woken) and is sent back
what the step got. Driven here by hand, step by step: no thread, no sleep, no socket."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.pipeline import route
from gateway_limiter.core.slot_steps import take_slot
from gateway_limiter.core.slots import Moved, Taking
from gateway_limiter.core.steps import Await, Reserve
from gateway_limiter.errors import Refused
from tests.support.limiting import write_row

URL = "/supplier/book"

pytestmark = pytest.mark.parametrize("limiter_redis_url", ["memory://"])


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.5, maxConcurrent=1)
    return limiter_db


def _taking(lim: GatewayLimiter, budget_s: float) -> tuple[Rule, Taking]:
    rule = route(lim.registry.snapshot, URL)
    assert rule is not None and rule.max_concurrent == 1
    lease_id = lim._slotting.leases.new_id()
    return rule, Taking(rule, None, lease_id, time.monotonic() + budget_s, budget_s)


def test_a_free_slot_is_one_reserve_step_then_the_slot(lim: GatewayLimiter) -> None:
    rule, taking = _taking(lim, 0.5)
    state = lim._slotting
    steps = take_slot(lim, state, taking, state.waiter(taking.lease_id))
    step = next(steps)
    assert isinstance(step, Reserve)
    assert (step.ask.rule, step.ask.permits) == (rule, 1)
    with pytest.raises(StopIteration) as done:
        steps.send(lim.backend.reserve(rule, 1, step.ask.budget_s))
    held = done.value.value
    assert held.local and held.decision.allowed and held.decision.in_flight == 1
    assert state.local.in_flight(URL) == 1
    state.give_back(held)
    assert state.local.in_flight(URL) == 0


def test_no_free_slot_waits_until_a_local_release_and_then_takes_it(
    lim: GatewayLimiter,
) -> None:
    state = lim._slotting
    assert state.local.take(URL, 1)  # another caller holds the one slot
    _, taking = _taking(lim, 0.5)
    steps = take_slot(lim, state, taking, state.waiter(taking.lease_id))
    step = next(steps)
    assert isinstance(step, Await) and 0 < step.seconds <= 0.5
    # what the shell waits for: the interface's generation moving on from what it was
    moved = step.until
    assert isinstance(moved, Moved) and moved.url == URL
    assert state.wakeups.generation(URL) == moved.seen
    state.local.give_back(URL)
    started = time.monotonic()
    moved.wait(5.0)  # moved already: no wait
    assert time.monotonic() - started < 1.0
    assert isinstance(steps.send(None), Reserve)  # woken: the slot is free now


def test_no_free_slot_and_no_time_to_wait_is_refused_without_a_step(
    lim: GatewayLimiter,
) -> None:
    state = lim._slotting
    assert state.local.take(URL, 1)
    _, taking = _taking(lim, 0.0)
    steps = take_slot(lim, state, taking, state.waiter(taking.lease_id))
    with pytest.raises(Refused) as refused:
        next(steps)
    assert refused.value.decision.in_flight == 1
    state.local.give_back(URL)
