"""lease.lua on a real Redis, with the clock driven: what a lease takes, what a hand
back returns (what was unused less what refilled since the take, never beyond the
capacity; nothing from a lease older than leaseMs), and that a lease row decides the caller's own
permits exactly as a plain row would in the same state."""

from __future__ import annotations

import itertools
import struct
import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.scripts import (
    SCRIPTS,
    STATE,
    Commands,
    ScriptCall,
    bucket_config,
    parse_reply,
)
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.leases import (
    Debt,
    Leases,
    lease_call,
    lease_size,
    parse_debt,
    parse_lease,
)
from gateway_limiter.model.bucket import Verdict

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
    taken: float = T0,
) -> tuple[bool, float, float, int]:
    """A lease call at ``now``, handing back ``unused`` of a lease taken at ``taken``."""
    size = lease_size(rule, permits)
    call = lease_call(key, rule, permits, budget_s, size, unused, now, taken)
    verdict, granted, moment = parse_lease(client.eval(SCRIPTS["lease"], *call.args))
    assert moment == now  # what the next hand-back of this lease sends back
    return verdict.allowed, verdict.wait_us, verdict.stored, granted


def _plain(
    client: redis.Redis, key: str, rule: Rule, permits: int, timeout_us: float, now: float
) -> tuple[bool, float]:
    args: list[bytes | str] = [bucket_config(rule), str(permits), repr(timeout_us), repr(now)]
    verdict = parse_reply(client.eval(SCRIPTS["bucket"], 1, key, *args))
    return verdict.allowed, verdict.wait_us


def _stored(client: redis.Redis, key: str) -> float:
    raw = client.get(key)
    assert isinstance(raw, bytes)
    return float(STATE.unpack_from(raw)[0])


def _twins(
    client: redis.Redis, prefix: str, rule: Rule, spent: int, budget_ms: float | None
) -> tuple[str, str, float | None, float]:
    """Two keys in the same state (``spent`` permits at T0), one for a lease call and one
    for plain calls, and a budget in ms as a lease call's (s) and as bucket.lua's (µs)."""
    leased, plain = _key(prefix), _key(prefix)
    for key in (leased, plain):
        if spent:
            _plain(client, key, rule, spent, -1.0, T0)
    budget_s = None if budget_ms is None else budget_ms / 1000
    return leased, plain, budget_s, -1.0 if budget_s is None else budget_s * 1e6


RULE = Rule("/lease", 1000, 0.0, 1, lease_ms=100)
_PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # 1000/s, capacity 1000: leases of 100


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
    # 10 ms later: 10 refilled, 60 handed back less those 10, then 100 taken
    assert _lease(redis_client, key, RULE, 1, 0.0, 60, T0 + 10_000)[3] == 100
    assert _stored(redis_client, key) == 900 + 10 + (60 - 10) - 100


def test_a_young_lease_is_handed_back_less_what_refilled_and_an_old_one_not_at_all(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    _lease(redis_client, key, RULE, 1, 0.0, 0, T0)  # stored 900, 99 left in the lease
    # 40 ms on: 40 refilled; of the 99, 99 - 40 come back (hand back only)
    _lease(redis_client, key, RULE, 0, 0.0, 99, T0 + 40_000)
    assert _stored(redis_client, key) == 900 + 40 + (99 - 40)
    # a lease of the same moment handed back at 100 ms (leaseMs): nothing comes back,
    # nothing is written
    other = _key(key_prefix)
    _lease(redis_client, other, RULE, 1, 0.0, 0, T0)
    state = redis_client.get(other)
    _lease(redis_client, other, RULE, 0, 0.0, 99, T0 + 100_000)
    assert redis_client.get(other) == state
    # without the take's moment (or one ahead of the clock), nothing comes back either
    call = lease_call(other, RULE, 0, 0.0, 0, 99, T0 + 1_000)
    redis_client.eval(SCRIPTS["lease"], *call.args[:-1])
    _lease(redis_client, other, RULE, 0, 0.0, 99, T0 + 1_000, taken=T0 + 2_000)
    assert redis_client.get(other) == state


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
    # a budget of 5 ms: the permit 1 ms away, none stored (the rest is debt, below)
    assert _lease(redis_client, key, RULE, 1, 0.005, 0, T0) == (True, 1000.0, 0.0, 1)


def test_hand_back_into_a_full_bucket_or_none_is_dropped(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    _plain(redis_client, key, RULE, 100, 0.0, T0)  # stored 900
    # 95 ms later the bucket is full but for 5 (a plain take of 100 at T0, 95 refilled)
    _lease(redis_client, key, RULE, 0, 0.0, 99, T0 + 95_000, taken=T0 + 90_000)
    assert _stored(redis_client, key) == 1000.0  # 94 to hand back, room for 5
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
    _lease(redis_client, key, rule, 0, 0.0, unused, T0 + elapsed_us)  # a lease of T0
    after = _stored(redis_client, key)
    assert after <= rate  # never more than the capacity
    back = unused - elapsed_us * rate / 1e6  # less what refilled since the take
    if back > 0:
        refilled = min(float(rate), before + elapsed_us * rate / 1e6)  # no debt: taken <= rate
        assert abs(after - min(float(rate), refilled + back)) <= 1e-6 * max(1, rate)
    else:
        assert after == before  # nothing written


def _stored_at(client: redis.Redis, key: str, rule: Rule, now: float) -> float:
    """The stored permits of ``key`` at ``now``, refilled as bucket.lua would."""
    raw = client.get(key)
    if raw is None:
        return float(rule.burst)  # no state: a full bucket
    assert isinstance(raw, bytes)
    stored, balance, _, capacity, interval = STATE.unpack_from(raw)[:5]
    return float(min(capacity, stored + max(0.0, now - balance) / interval))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rate=st.integers(10, 5_000),
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 250_000.0),  # µs since the step before
            st.integers(0, 3),  # which of four processes renews its lease
            st.floats(0.0, 1.0),  # the share of its lease it spent
            st.booleans(),  # whether it hands the rest back (else drops it)
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_hand_backs_never_leave_more_than_a_bucket_that_never_gave_them_out(
    redis_client: redis.Redis,
    key_prefix: str,
    rate: int,
    steps: list[tuple[float, int, float, bool]],
) -> None:
    """The exactness argument (docs/algorithms.md, "Leases"): at every moment the bucket
    holds no more than a plain bucket whose takes were only what the leases did not
    hand back, however late the hand-backs (four processes, any ages)."""
    rule = Rule("/lease", rate, 0.0, 1, lease_ms=100)
    leased, plain = _key(key_prefix), _key(key_prefix)
    now = T0
    held: dict[int, tuple[int, float, int]] = {}  # process -> (lease index, moment, left)
    takes: list[tuple[float, int]] = []  # per lease: its moment, permits granted
    kept: list[int] = []  # per lease: what it handed back (filled in as it is)
    real: list[tuple[float, float]] = []  # (moment, stored then)
    for gap_us, process, spent, hand_back in steps:
        now += gap_us
        unused, taken = 0, T0
        if process in held:
            index, taken, left = held.pop(process)
            unused = left - int(left * spent) if hand_back else 0
            kept[index] = unused
        granted = _lease(redis_client, leased, rule, 1, 0.0, unused, now, taken)[3]
        takes.append((now, granted))
        kept.append(0)
        if granted:
            held[process] = (len(takes) - 1, now, granted - 1)
        real.append((now, _stored_at(redis_client, leased, rule, now)))
    for (moment, granted), back, (_, stored) in zip(takes, kept, real, strict=True):
        if granted - back > 0:  # the plain twin takes only what was not handed back
            assert _plain(redis_client, plain, rule, granted - back, 0.0, moment)[0]
        twin = _stored_at(redis_client, plain, rule, moment)
        assert stored <= twin + 1e-6 * rate, f"at {moment - T0:.0f} µs: {stored} > {twin}"


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
    leased, plain, budget_s, timeout_us = _twins(redis_client, key_prefix, rule, spent, budget_ms)
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
    config = struct.pack("<ddd", 5.0, 5.0, 0.0)
    assert call == ScriptCall("bucket", [1, "p:{/plain}:tb", config, "1", "0"])


def test_a_caller_that_looked_before_a_renewal_takes_from_it_rather_than_renew_again(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    leases = Leases(key_prefix)
    now_s = time.monotonic()
    assert leases.take(RULE, 1, 0.0, now_s) is None  # no lease yet: ask Redis
    call = leases.refill(RULE, 1, 0.0, now_s)
    assert call is not None
    assert leases.filled(RULE, 1, redis_client.eval(SCRIPTS["lease"], *call.args)).allowed
    # a caller that found no lease before that renewal came back, asking to renew: it
    # is told to wait, which ends at once, and takes from the fresh lease
    assert leases.refill(RULE, 1, 0.0, now_s + 0.001) is None
    assert not leases.wait(RULE, lambda: None)
    verdict = leases.take(RULE, 1, 0.0, now_s + 0.001)
    assert verdict is not None and verdict.allowed and verdict.stored == 98.0
    assert (leases.refills, leases.handed_back) == (1, 0)
    # once the lease is older than leaseMs, a renewal goes, and what is left is dropped
    call = leases.refill(RULE, 1, 0.0, now_s + 0.101)
    assert call is not None and (leases.refills, leases.dropped) == (2, 98)


def _debt(
    client: redis.Redis, key: str, rule: Rule, permits: int, budget_s: float | None, now: float
) -> tuple[bool, float, int, Debt]:
    """A lease call at ``now`` handing nothing back: allowed, wait, granted, its debt."""
    call = lease_call(key, rule, permits, budget_s, lease_size(rule, permits), 0, now, T0)
    reply = client.eval(SCRIPTS["lease"], *call.args)
    verdict, granted, _ = parse_lease(reply)
    return verdict.allowed, verdict.wait_us, granted, parse_debt(reply)


def _pushback(client: redis.Redis, key: str, rule: Rule, retry_after_us: str, now: float) -> None:
    client.eval(SCRIPTS["pushback"], 1, key, str(rule.rate), retry_after_us, repr(now), "1")


def test_a_dry_bucket_schedules_debt_for_callers_who_wait(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    assert _plain(redis_client, key, RULE, 1000, 0.0, T0) == (True, 0.0)  # empty
    # a budget of 5 ms: the caller's permit 1 ms away, 4 more at 2, 3, 4 and 5 ms
    assert _debt(redis_client, key, RULE, 1, 0.005, T0) == (
        True,
        1000.0,
        1,
        Debt(4, 2000.0, 1000.0),
    )
    # the bucket's balance moved past them: a plain call now waits 6 ms
    assert _plain(redis_client, key, RULE, 1, -1.0, T0) == (True, 6000.0)
    # no budget: no debt (nor a permit); a budget of a minute: at most the lease (100
    # in all) spanning at most leaseMs; none: the same
    assert _debt(redis_client, key, RULE, 1, 0.0, T0)[2:] == (0, Debt(0, 0.0, 0.0))
    assert _debt(redis_client, key, RULE, 1, 60.0, T0) == (
        True,
        7000.0,
        1,
        Debt(99, 8000.0, 1000.0),
    )
    assert _debt(redis_client, key, RULE, 1, None, T0)[3] == Debt(99, 108_000.0, 1000.0)


def test_a_lease_short_of_stored_permits_takes_the_rest_as_debt(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    assert _plain(redis_client, key, RULE, 970, 0.0, T0) == (True, 0.0)  # 30 left
    # the 30 now, the other 70 of the lease 1, 2, ..., 70 ms from now
    assert _debt(redis_client, key, RULE, 1, 0.5, T0) == (True, 0.0, 30, Debt(70, 1000.0, 1000.0))
    full = _key(key_prefix)  # a full bucket: a whole lease of stored permits, no debt
    assert _debt(redis_client, full, RULE, 1, 0.5, T0) == (True, 0.0, 100, Debt(0, 0.0, 0.0))


def test_a_pushback_slows_the_debt_and_its_hold_stops_it(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    key = _key(key_prefix)
    _pushback(redis_client, key, RULE, "", T0)  # half the rate from T0: 2 ms a permit
    assert _plain(redis_client, key, RULE, 500, 0.0, T0)[0]  # empty (capacity 500 now)
    allowed, wait_us, granted, debt = _debt(redis_client, key, RULE, 1, 0.05, T0)
    assert (allowed, granted, debt.permits) == (True, 1, 24)  # 4, 6, ..., 50 ms: in 50
    assert wait_us == 2000.0 and debt.first_us == 4000.0 and debt.interval_us == 2000.0
    held = _key(key_prefix)
    _pushback(redis_client, held, RULE, "10000", T0)  # retry after 10 ms: a hold
    allowed, wait_us, granted, debt = _debt(redis_client, held, RULE, 1, 0.5, T0)
    assert allowed and wait_us > 10_000.0 and (granted, debt.permits) == (1, 0)


@_PROPERTY
@given(
    rate=st.integers(1, 10_000),
    spent=st.integers(0, 30_000),
    later_us=st.floats(0.0, 2_000_000.0),
    budget_ms=st.sampled_from([None, 0.0, 1.0, 50.0, 900.0]),
    lease_ms=st.sampled_from([1, 20, 250]),
)
def test_debt_is_scheduled_as_one_permit_calls_one_after_another_would_be(
    redis_client: redis.Redis,
    key_prefix: str,
    rate: int,
    spent: int,
    later_us: float,
    budget_ms: float | None,
    lease_ms: int,
) -> None:
    """The debt a lease call takes is what its caller's call, then one-permit calls made
    at the same moment by callers waiting as long as it takes, would take on a plain
    row: the same moments, the same bucket after (docs/algorithms.md, "Rate leases")."""
    rule = Rule("/lease", rate, 0.0, 1, lease_ms=lease_ms)
    leased, plain, budget_s, timeout_us = _twins(redis_client, key_prefix, rule, spent, budget_ms)
    now = T0 + later_us
    allowed, wait_us, granted, debt = _debt(redis_client, leased, rule, 1, budget_s, now)
    assert (allowed, wait_us) == _plain(redis_client, plain, rule, 1, timeout_us, now)
    size = lease_size(rule, 1)
    if not allowed or granted == size or budget_s == 0.0:
        assert debt == Debt(0, 0.0, 0.0)
        return
    if granted > 1:  # stored permits leased first, at the same moment, without a wait
        assert _plain(redis_client, plain, rule, granted - 1, 0.0, now) == (True, 0.0)
    assert debt.permits <= size - granted
    # µs on a clock near 1.7e15 µs: a double's step is 0.25, and each one-permit call
    # rounds the balance once more than one call of them all
    for k in range(debt.permits):
        moment = debt.first_us + k * debt.interval_us
        step = _plain(redis_client, plain, rule, 1, -1.0, now)
        allowed, at = step
        assert allowed
        assert at == pytest.approx(moment, abs=0.25 * (k + 2))
    if debt.permits:
        last = debt.first_us + (debt.permits - 1) * debt.interval_us
        assert last - debt.first_us <= lease_ms * 1000 + 1e-6
        assert budget_s is None or last <= budget_s * 1e6 + 1
    twin = redis_client.get(plain)
    real = redis_client.get(leased)
    assert isinstance(twin, bytes) and isinstance(real, bytes)
    (stored, balance), (twin_stored, twin_balance) = (
        STATE.unpack_from(real)[:2],
        STATE.unpack_from(twin)[:2],
    )
    assert stored == pytest.approx(twin_stored, abs=1e-6)
    assert balance == pytest.approx(twin_balance, abs=0.25 * (debt.permits + 2))
    # it took as many as it could: one more would be beyond the budget or the span
    # (the twin's one-permit calls drift by up to a double's step each)
    if 0 < debt.permits < size - granted:
        after = _plain(redis_client, plain, rule, 1, -1.0, now)[1]
        drift = 0.25 * (debt.permits + 2)
        beyond = budget_s is not None and after > budget_s * 1e6 - drift
        assert beyond or after - debt.first_us > lease_ms * 1000 - drift


def _leased_after(
    client: redis.Redis, prefix: str, spent: int, budget_s: float
) -> tuple[Leases, float, Verdict]:
    """A process's first lease of RULE, asked with ``budget_s`` once ``spent`` permits
    were taken on the server's clock: its Leases, when the request left, the Verdict."""
    leases = Leases(prefix)
    seconds, micros = client.time()
    _plain(client, state_key(prefix, RULE), RULE, spent, -1.0, seconds * 1e6 + micros)
    sent_s = time.monotonic()
    call = leases.refill(RULE, 1, budget_s, sent_s)
    assert call is not None
    return leases, sent_s, leases.filled(RULE, 1, client.eval(SCRIPTS["lease"], *call.args))


def test_scheduled_permits_go_to_waiting_callers_in_order_until_too_late(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    # 20 ms of debt: no permit refills before the lease call, however loaded the host
    leases, sent_s, verdict = _leased_after(redis_client, key_prefix, 1020, 0.5)
    arrived_s = time.monotonic()
    assert verdict.allowed and 0.0 < verdict.wait_us <= 21_000.0
    assert leases.owed == 99  # due 1, 2, ..., 99 ms after the caller's
    # a caller who cannot wait is refused in-process; one who can takes the next permit,
    # sleeping until its moment as measured from the reply's arrival
    refused = leases.take(RULE, 1, 0.0, arrived_s)
    assert refused is not None and not refused.allowed
    first = leases.take(RULE, 1, 0.05, arrived_s)
    assert first is not None and first.allowed
    own_us = verdict.wait_us  # the bucket refilled a little since it was emptied
    # (from the reply's arrival, a little before arrived_s)
    assert 0.0 < first.wait_us <= own_us + 1000.0
    two = leases.take(RULE, 2, 0.05, arrived_s)  # the next two: until the second's moment
    assert (
        two is not None
        and two.allowed
        and two.wait_us == pytest.approx(first.wait_us + 2000.0, abs=1.0)
    )
    # beyond a caller's budget: not taken (the bucket is further still: refused here)
    short = leases.take(RULE, 1, 0.004, arrived_s)
    assert short is not None and not short.allowed
    assert leases.refill(RULE, 1, 0.05, arrived_s) is None  # served by what is scheduled
    # used late, up to leaseMs after its moment (here 100 ms after the lease call)
    late = leases.take(RULE, 1, 0.5, sent_s + 0.1)
    assert late is not None and late.allowed
    assert leases.owed_lost == 0
    # beyond: dropped, never used (the fifth and later, due by 21 + 99 ms)
    assert leases.take(RULE, 1, 0.0, arrived_s + 0.221) is None
    assert leases.owed_lost == 99 - 4
    assert leases.refills == 1


def test_scheduled_permits_outlive_the_stored_ones_of_their_lease(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    leases, sent_s, verdict = _leased_after(redis_client, key_prefix, 970, 0.5)
    # 30 stored (29 left in the lease; one more if one refilled meanwhile), the rest of
    # the 100 scheduled
    assert verdict.allowed and verdict.stored >= 29 and leases.owed == 99 - verdict.stored
    # past leaseMs the 29 stored are not spent any more, but the scheduled permits due
    # from 5 ms on still are, until leaseMs after their moments
    late = leases.take(RULE, 1, 0.5, sent_s + 0.105)
    assert late is not None and late.allowed
    assert leases.owed_lost > 0 and leases.refills == 1  # those due before: too late
