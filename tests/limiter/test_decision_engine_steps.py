"""Every operation of the limiters is written once, with no I/O (``core/engine.py``): it
answers the next step for the shell to carry out (reserve, send, read, beat, sleep on
the clock) and is sent back what the step got. Driven here by hand, step by step, on
``memory://``: no thread, no sleep, no socket."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.core import engine
from gateway_limiter.core.pipeline import route
from gateway_limiter.core.slot_steps import holding
from gateway_limiter.core.status import BucketStatus
from gateway_limiter.core.steps import Beat, Peek, PeekPushback, PushBack, Reserve, Shield, Sleep
from tests.support.limiting import write_row

URL = "/supplier/search"
SLOTS = "/supplier/book"

pytestmark = pytest.mark.parametrize("limiter_redis_url", ["memory://"])


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1, cache=5.0)
    write_row(limiter_db[1], SLOTS, rateLimit=1, cache=5.0, maxConcurrent=1)
    return limiter_db


def _done(steps: Any, got: Any = None) -> Any:
    """Send ``got``; the answer the steps return then (they must ask for nothing more)."""
    with pytest.raises(StopIteration) as done:
        steps.send(got)
    return done.value.value


def test_a_decision_is_one_reserve_then_its_wait_as_a_sleep_step(lim: GatewayLimiter) -> None:
    rule = route(lim.registry.snapshot, URL)
    assert rule is not None
    first = engine.trying(lim, URL, 1, None, None, None)
    step = next(first)
    assert isinstance(step, Reserve) and step.ask.rule == rule
    assert _done(first, lim.backend.reserve(rule, 1, step.ask.budget_s)) is True

    # the bucket is empty now: the next permit is a second away, within the budget
    second = engine.deciding(lim, URL, 1, None, None, None)
    step = next(second)
    assert isinstance(step, Reserve)
    wait = second.send(lim.backend.reserve(rule, 1, step.ask.budget_s))
    assert isinstance(wait, Sleep) and 0.5 < wait.seconds <= 1.0  # slept by the shell
    decision = _done(second)
    assert decision.allowed and decision.waited == pytest.approx(wait.seconds)

    # no budget for the next: refused at once, nothing to sleep
    third = engine.trying(lim, URL, 1, 0.0, None, None)
    step = next(third)
    assert isinstance(step, Reserve)
    assert _done(third, lim.backend.reserve(rule, 1, step.ask.budget_s)) is False


def test_a_pushback_is_one_step_and_the_next_decision_obeys_it(lim: GatewayLimiter) -> None:
    rule = route(lim.registry.snapshot, URL)
    assert rule is not None
    push = engine.pushing(lim, URL, 30.0, None)
    step = next(push)
    assert step == PushBack(rule, 30.0, None)
    _done(push, lim.backend.pushback(rule, 30.0, None))
    trying = engine.trying(lim, URL, 1, 1.0, None, None)
    step = next(trying)
    assert isinstance(step, Reserve)
    assert _done(trying, lim.backend.reserve(rule, 1, step.ask.budget_s)) is False


def test_a_status_read_is_a_peek_per_limit(lim: GatewayLimiter) -> None:
    reading = engine.statuses(lim, lim._slotting, URL)
    step = next(reading)
    peeked = []
    while True:
        assert isinstance(step, (Peek, PeekPushback))
        peeked.append(step)
        read = lim.backend.peek if isinstance(step, Peek) else lim.backend.peek_pushback
        try:
            step = reading.send(read(step.rule))
        except StopIteration as done:
            shown: list[BucketStatus] = done.value
            break
    assert [s.rule.url for s in peeked if isinstance(s, Peek)] == [URL]
    assert [s.rule.url for s in shown] == [URL] and shown[0].error is None


def test_heartbeats_are_beat_steps(lim: GatewayLimiter) -> None:
    member, ttl_ms = lim._fleet.member, lim._fleet.ttl_ms
    beat = next(engine.beating(lim))
    assert isinstance(beat, Beat) and beat.args[:2] == (member, ttl_ms) and len(beat.args) == 4
    assert next(engine.leaving(lim)) == Beat((member, 0))  # gone at once, not on expiry


def test_a_slot_interrupted_in_its_rate_wait_is_given_back_shielded(
    lim: GatewayLimiter,
) -> None:
    rule = route(lim.registry.snapshot, SLOTS)
    assert rule is not None and rule.max_concurrent == 1
    state = lim._slotting
    assert lim.backend.reserve(rule, 1, 0.0).allowed  # the rate's one permit, spent
    taking = holding(lim, state, rule, 5.0, None)
    step = next(taking)
    assert isinstance(step, Reserve)
    wait = taking.send(lim.backend.reserve(rule, 1, step.ask.budget_s))
    assert isinstance(wait, Sleep) and wait.seconds > 0  # the slot held meanwhile
    assert state.local.in_flight(SLOTS) == 1
    shield = taking.throw(KeyboardInterrupt())
    assert isinstance(shield, Shield)
    _done(shield.steps)  # this process's own slot: given back with no round trip
    assert state.local.in_flight(SLOTS) == 0
    with pytest.raises(KeyboardInterrupt):
        taking.send(None)
