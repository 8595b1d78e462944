"""lease.lua on a real Redis, with the clock driven: what a lease takes, what a hand
back returns (never beyond the capacity), and that a lease row decides the caller's own
permits exactly as a plain row would in the same state."""

from __future__ import annotations

import itertools

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.scripts import SCRIPTS, STATE, Commands, ScriptCall, parse_reply
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.leases import lease_call, lease_size, parse_lease

T0 = 1_700_000_000_000_000.0  # µs: a driven clock
_keys = itertools.count()


def _key(prefix: str) -> str:
    return f"{prefix}:{{/lease{next(_keys)}}}:tb"


def _lease(
    client: redis.Redis,
    key: str,
    rule: Rule,
    permits: int,
    budget_s: float | None,
    unused: int,
    now: float,
) -> tuple[bool, float, float, int]:
    call = lease_call(key, rule, permits, budget_s, lease_size(rule, permits), unused, now)
    verdict, granted = parse_lease(client.eval(SCRIPTS["lease"], *call.args))
    return verdict.allowed, verdict.wait_us, verdict.stored, granted


def _plain(
    client: redis.Redis, key: str, rule: Rule, permits: int, timeout_us: float, now: float
) -> tuple[bool, float]:
    args = [str(rule.rate), str(rule.burst), str(permits), repr(timeout_us), repr(now)]
    verdict = parse_reply(client.eval(SCRIPTS["bucket"], 1, key, *args))
    return verdict.allowed, verdict.wait_us


def _stored(client: redis.Redis, key: str) -> float:
    raw = client.get(key)
    assert isinstance(raw, bytes)
    return float(STATE.unpack_from(raw)[0])


RULE = Rule("/lease", 1000, 0.0, 1, lease_ms=100)  # 1000/s, capacity 1000: leases of 100


def test_a_lease_takes_leasems_of_the_rate_from_a_full_bucket(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    allowed, wait_us, _, granted = _lease(redis_client, key, RULE, 1, 0.0, 0, T0)
    assert (allowed, wait_us, granted) == (True, 0.0, 100)
    assert _stored(redis_client, key) == 900.0


def test_unused_permits_come_back_before_the_next_lease(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    _lease(redis_client, key, RULE, 1, 0.0, 0, T0)  # stored 900
    # 10 ms later: 10 refilled, 60 handed back, then 100 taken
    assert _lease(redis_client, key, RULE, 1, 0.0, 60, T0 + 10_000)[3] == 100
    assert _stored(redis_client, key) == 900 + 10 + 60 - 100


def test_a_lease_takes_only_what_is_stored(redis_client: redis.Redis, key_prefix: str) -> None:
    key = _key(key_prefix)
    assert _plain(redis_client, key, RULE, 970, 0.0, T0) == (True, 0.0)  # 30 left
    assert _lease(redis_client, key, RULE, 1, 0.0, 0, T0)[3] == 30
    assert _stored(redis_client, key) == 0.0


def test_an_empty_bucket_decides_the_callers_permit_the_plain_way(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    assert _plain(redis_client, key, RULE, 1000, 0.0, T0) == (True, 0.0)  # empty
    # no budget: refused, nothing granted
    assert _lease(redis_client, key, RULE, 1, 0.0, 0, T0) == (False, 1000.0, 0.0, 0)
    # a budget of 5 ms: the permit 1 ms away, and no more (no debt taken for a lease)
    assert _lease(redis_client, key, RULE, 1, 0.005, 0, T0) == (True, 1000.0, 0.0, 1)


def test_hand_back_into_a_full_bucket_or_none_is_dropped(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    _lease(redis_client, key, RULE, 1, 0.0, 0, T0)  # stored 900
    # a second later the bucket is full again: the 99 unused have nowhere to go
    _lease(redis_client, key, RULE, 0, 0.0, 99, T0 + 1_000_000)
    assert _stored(redis_client, key) == 1000.0
    other = _key(key_prefix)
    _lease(redis_client, other, RULE, 0, 0.0, 99, T0)  # no state: a full bucket
    assert redis_client.get(other) is None


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rate=st.integers(1, 100_000),
    spent=st.floats(0.0, 1.0),
    elapsed_us=st.floats(0.0, 3_000_000.0),
    unused=st.integers(1, 200_000),
)
def test_hand_back_never_makes_more_than_the_capacity(
    redis_client: redis.Redis,
    key_prefix: str,
    rate: int,
    spent: float,
    elapsed_us: float,
    unused: int,
) -> None:
    rule = Rule("/lease", rate, 0.0, 1, lease_ms=100)
    key = _key(key_prefix)
    taken = max(1, int(rate * spent))
    assert _plain(redis_client, key, rule, taken, -1.0, T0)[0]
    before = _stored(redis_client, key)
    _lease(redis_client, key, rule, 0, 0.0, unused, T0 + elapsed_us)
    after = _stored(redis_client, key)
    assert after <= rate  # never more than the capacity
    refilled = min(float(rate), before + elapsed_us * rate / 1e6)  # no debt: taken <= rate
    assert abs(after - min(float(rate), refilled + unused)) <= 1e-6 * max(1, rate)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rate=st.integers(1, 10_000),
    spent=st.integers(0, 30_000),
    later_us=st.floats(0.0, 2_000_000.0),
    permits=st.integers(1, 5_000),
    budget_ms=st.sampled_from([None, 0.0, 1.0, 50.0, 900.0]),
)
def test_the_callers_own_permits_are_decided_as_a_plain_row_would(
    redis_client: redis.Redis,
    key_prefix: str,
    rate: int,
    spent: int,
    later_us: float,
    permits: int,
    budget_ms: float | None,
) -> None:
    rule = Rule("/lease", rate, 0.0, 1, lease_ms=250)
    leased, plain = _key(key_prefix), _key(key_prefix)
    for key in (leased, plain):  # the same state in both: `spent` permits at T0
        if spent:
            _plain(redis_client, key, rule, spent, -1.0, T0)
    budget_s = None if budget_ms is None else budget_ms / 1000
    timeout_us = -1.0 if budget_s is None else budget_s * 1e6
    now = T0 + later_us
    allowed, wait_us, _, granted = _lease(redis_client, leased, rule, permits, budget_s, 0, now)
    assert (allowed, wait_us) == _plain(redis_client, plain, rule, permits, timeout_us, now)
    if allowed:
        assert permits <= granted <= max(permits, lease_size(rule, permits))
        assert granted == permits or wait_us == 0.0  # more only from stored permits
    else:
        assert granted == 0


def test_a_row_without_a_lease_sends_the_plain_bucket_call() -> None:
    call = Commands("p")(Rule("/plain", 5, 0.0, 1), 1, 0.0, None, None)
    assert call == ScriptCall("bucket", [1, "p:{/plain}:tb", "5", "5", "1", "0.0"])
