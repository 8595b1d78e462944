"""``lease.lua`` on a real Redis and its Python model (``model/lease.py``) decide alike,
to the last bit: random sequences of lease calls of every class, with hand-backs, on
rows with a reserve and without, in reply and in the state left. Then the property
the model shows for a row with a reserve: a lease's permits beyond its caller's never
take a class's reserve, so every class may spend them.

The clock is driven through the script's ``now`` argument.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.scripts import SCRIPTS, parse_state
from gateway_limiter.backends.state import bucket_key
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.leases import lease_call, lease_floor, parse_debt, parse_lease
from gateway_limiter.model.bucket import BucketState
from gateway_limiter.model.lease import lease
from gateway_limiter.model.priority import Priority, parse_reserve

START = 1_795_000_000_000_000.0  # microseconds, a 2026 wall clock
RESERVES = [None, "sheddable=0.5", "default=0.1,sheddable_plus=0.3,sheddable=0.5", "default=0.2"]


def _stored(client: redis.Redis, url: str) -> BucketState | None:
    raw = client.get(bucket_key("prop", url))
    assert raw is None or len(raw) == 40, raw
    return parse_state(raw)


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rate=st.integers(1, 2_000),
    capacity=st.integers(1, 2_000),
    lease_ms=st.integers(1, 2_000),
    reserve=st.sampled_from(RESERVES),
    sequence=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 2_000), st.integers(0, 3_000_000)),  # dt µs
            st.integers(0, 20),  # permits (0: hand back only)
            st.one_of(st.none(), st.just(0.0), st.floats(0, 2_000_000)),  # timeout µs
            st.sampled_from(list(Priority)),
            st.integers(0, 50),  # unused permits handed back
            st.integers(0, 500_000),  # how long before now that lease was taken, µs
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_lease_script_and_model_agree_for_every_class(
    redis_client: redis.Redis,
    rate: int,
    capacity: int,
    lease_ms: int,
    reserve: str | None,
    sequence: list[tuple[int, int, float | None, Priority, int, int]],
) -> None:
    url = f"/l/{uuid.uuid4().hex}"
    key = bucket_key("prop", url)
    base = Rule(url, rate, 0.0, 1, capacity=capacity, lease_ms=lease_ms)
    parsed = parse_reserve(reserve)
    base = replace(base, reserve=parsed)
    floor = lease_floor(base)
    now = START
    model: BucketState | None = None
    for dt, permits, timeout, cls, unused, age in sequence:
        now += dt
        share = None if parsed is None or cls is Priority.CRITICAL else parsed.share(cls)
        rule = base if share is None else replace(base, shares=(share,))
        budget_s = None if timeout is None else timeout / 1e6
        budget_us = None if budget_s is None else budget_s * 1e6
        size = max(permits, int(rate * lease_ms / 1000))
        call = lease_call(key, rule, permits, budget_s, size, unused, now, now - age)
        reply = redis_client.eval(SCRIPTS["lease"], *call.args)
        verdict, granted, moment = parse_lease(reply)
        debt = parse_debt(reply)
        span = 0.0 if floor else lease_ms * 1000.0
        expected, after = lease(
            model,
            rate,
            capacity,
            permits,
            budget_us,
            now,
            size,
            unused,
            now - age,
            span,
            share,
            floor,
        )
        model = after
        assert moment == now
        if permits > 0:
            assert verdict == expected.verdict
            assert granted == expected.granted
            assert (debt.permits, debt.first_us, debt.interval_us) == expected[2:]
        assert _stored(redis_client, url) == model
        if floor and permits > 0 and granted > permits:
            # the lease's own permits left every class's reserve stored
            assert verdict.stored >= floor * capacity - 1e-9
            assert debt.permits == 0


def test_a_lease_on_a_row_with_a_reserve_takes_the_rest_from_above_it(
    redis_client: redis.Redis,
) -> None:
    """A full bucket of 100 keeping half for the classes above sheddable: a lease of 80
    for a sheddable caller takes its own permit and 49 more; a critical caller's takes
    its own from the reserve and no more; the model says the same."""
    url = f"/l/{uuid.uuid4().hex}"
    key = bucket_key("prop", url)
    rule = Rule(url, 100, 0.0, 1, lease_ms=800, reserve=parse_reserve("sheddable=0.5"))
    shed = replace(rule, shares=(0.5,))
    call = lease_call(key, shed, 1, 0.0, 80, 0, START)
    verdict, granted, _ = parse_lease(redis_client.eval(SCRIPTS["lease"], *call.args))
    assert verdict.allowed and granted == 50 and verdict.stored == 50.0
    expected, state = lease(None, 100, 100, 1, 0.0, START, 80, share=0.5, floor=0.5)
    assert (expected.verdict, expected.granted) == (verdict, granted)
    # sheddable now finds nothing above the reserve; critical takes from it, alone
    call = lease_call(key, shed, 1, 0.0, 80, 0, START)
    verdict, granted, _ = parse_lease(redis_client.eval(SCRIPTS["lease"], *call.args))
    assert not verdict.allowed and verdict.reserved and granted == 0
    call = lease_call(key, rule, 1, 0.0, 80, 0, START)
    verdict, granted, _ = parse_lease(redis_client.eval(SCRIPTS["lease"], *call.args))
    assert verdict.allowed and granted == 1 and verdict.stored == 49.0
    assert lease(state, 100, 100, 1, 0.0, START, 80, floor=0.5)[0].granted == 1


@pytest.mark.parametrize("reserve", ["sheddable=0.5", "default=0.1"])
def test_a_row_with_a_reserve_sends_no_debt_lease(reserve: str) -> None:
    rule = Rule("/l", 100, 0.0, 1, lease_ms=800, reserve=parse_reserve(reserve))
    call = lease_call("k", rule, 1, None, 80, 0)
    assert call.args[-2:] == ["0", repr(lease_floor(rule))]
    plain = lease_call("k", replace(rule, reserve=None), 1, None, 80, 0)
    assert plain.args[-1] == "800000" and len(plain.args) == len(call.args) - 1
