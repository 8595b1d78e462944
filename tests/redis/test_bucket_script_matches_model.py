"""The Lua script on a real Redis and the Python model decide alike, to the last bit.

Hypothesis feeds both the same random sequences of (time step, permits, timeout, rate
change); the clock is driven through the script's ``now`` argument.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, replace

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import parse_state
from gateway_limiter.backends.state import bucket_key, limit, own_limits, state_key, window_key
from gateway_limiter.config.rules import CHANNEL_URL, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import BucketState, expiry_ms, reserve
from gateway_limiter.model.limits import (
    FixedWindow,
    LimitState,
    SlidingLog,
    reserve_limits,
    reserve_window,
)
from tests.support.services import RedisServer

START = 1_795_000_000_000_000.0  # microseconds, a 2026 wall clock


@dataclass(frozen=True)
class Step:
    dt: int  # microseconds since the previous step
    permits: int
    timeout: float | None  # microseconds; None = acquire
    config: tuple[int, int, float] | None  # new (rate, capacity, warm-up s), or None


steps = st.lists(
    st.builds(
        Step,
        dt=st.one_of(st.integers(0, 2_000), st.integers(0, 3_000_000)),
        permits=st.integers(1, 40),
        timeout=st.one_of(st.none(), st.just(0.0), st.floats(0, 2_000_000)),
        config=st.one_of(
            st.none(),
            st.none(),
            st.tuples(
                st.integers(1, 2_000),
                st.integers(1, 2_000),
                st.one_of(st.just(0.0), st.floats(0.01, 30.0)),
            ),
        ),
    ),
    min_size=1,
    max_size=40,
)


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="prop"))


def stored_state(client: redis.Redis, url: str) -> BucketState | None:
    raw = client.get(bucket_key("prop", url))
    assert raw is None or len(raw) == 40, raw  # five doubles, exactly as the script wrote them
    return parse_state(raw)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rate=st.integers(1, 2_000),
    capacity=st.one_of(st.none(), st.integers(1, 2_000)),
    warmup=st.one_of(st.just(0.0), st.floats(0.01, 30.0)),
    sequence=steps,
)
def test_script_and_model_agree_on_every_decision_and_state(
    backend: RedisBackend, rate: int, capacity: int | None, warmup: float, sequence: list[Step]
) -> None:
    url = f"/p/{uuid.uuid4().hex}"
    cap = capacity or rate
    now = START
    model: BucketState | None = None
    for step in sequence:
        now += step.dt
        if step.config is not None:
            rate, cap, warmup = step.config
        algorithm = "warm_up" if warmup else "token_bucket"
        rule = Rule(url, rate, 0.0, 1, capacity=cap, algorithm=algorithm, warmup=warmup)
        timeout_s = None if step.timeout is None else step.timeout / 1e6
        got = backend.reserve(rule, step.permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        expected, new = reserve(model, rate, cap, step.permits, budget, now, warmup * 1e6)
        assert got == expected
        if new is not None:
            model = new
        assert stored_state(backend.client, url) == model


def test_key_expires_when_the_bucket_would_be_full_again(backend: RedisBackend) -> None:
    url = f"/p/{uuid.uuid4().hex}"
    rule = Rule(url=url, rate=10, cache=0.0, config_id=1)
    now = START
    for _ in range(15):  # 10 stored spent, then 5 permits of debt
        backend.reserve(rule, 1, None, now=now)
    state = stored_state(backend.client, url)
    assert state is not None
    expected_ms = expiry_ms(state, now)
    # empty at now+0.5 s of debt, then 1 s to refill 10 permits, plus the grace
    assert expected_ms == 500 + 1000 + 1000
    pttl = backend.client.pttl(bucket_key("prop", url))
    assert expected_ms - 2000 < pttl <= expected_ms


def test_refusal_writes_nothing(backend: RedisBackend) -> None:
    url = f"/p/{uuid.uuid4().hex}"
    rule = Rule(url=url, rate=5, cache=0.0, config_id=1)
    for _ in range(5):
        assert backend.reserve(rule, 1, 0.0, now=START).allowed
    before = backend.client.get(bucket_key("prop", url))
    verdict = backend.reserve(rule, 1, 0.1, now=START)
    assert not verdict.allowed
    assert verdict.wait_us == pytest.approx(200_000.0)  # one permit at 5/s
    assert backend.client.get(bucket_key("prop", url)) == before


window_steps = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 5_000), st.integers(0, 1_500_000)),  # dt µs
        st.integers(1, 12),  # permits (may exceed the rate)
        st.one_of(st.none(), st.just(0.0), st.floats(0, 2_000_000)),  # timeout µs
        st.one_of(st.none(), st.none(), st.none(), st.integers(1, 10)),  # new rate
    ),
    min_size=1,
    max_size=60,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rate=st.integers(1, 10), sequence=window_steps)
def test_window_script_and_model_agree_on_every_decision_and_list(
    backend: RedisBackend, rate: int, sequence: list[tuple[int, int, float | None, int | None]]
) -> None:
    url = f"/w/{uuid.uuid4().hex}"
    now = START
    model: tuple[float, ...] = ()
    for dt, permits, timeout, new_rate in sequence:
        now += dt
        rate = new_rate or rate
        rule = Rule(url, rate, 0.0, 1, algorithm="sliding_window")
        timeout_s = None if timeout is None else timeout / 1e6
        got = backend.reserve(rule, permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        expected, kept = reserve_window(model, rate, permits, budget, now)
        assert got == expected
        if kept is not None:
            model = kept
        stored = backend.client.lrange(window_key("prop", url), 0, -1)
        assert tuple(float(t) for t in stored) == model


def test_a_foreign_value_at_the_key_is_lost_state_not_an_error(backend: RedisBackend) -> None:
    url = f"/p/{uuid.uuid4().hex}"
    rule = Rule(url=url, rate=5, cache=0.0, config_id=1)
    key = bucket_key("prop", url)
    for foreign in ("hash", "short"):
        backend.client.delete(key)
        if foreign == "hash":  # e.g. left by another program, or an older layout
            backend.client.hset(key, mapping={"s": "1", "b": "2"})
        else:
            backend.client.set(key, b"not five doubles")
        verdicts = [backend.reserve(rule, 1, 0.0, now=START) for _ in range(6)]
        assert [v.allowed for v in verdicts] == [True] * 5 + [False]  # a full bucket of 5
        assert stored_state(backend.client, url) is not None


# --- limits.lua: several limits at once, and the fixed window ------------------------

#: (algorithm, rate range, period range): kinds limits.lua decides.
KINDS = {
    "token_bucket": ((1, 2_000), (1, 120)),
    "sliding_window": ((1, 10), (1, 5)),
    "fixed_window": ((1, 10), (1, 5)),
}


@st.composite
def limit_sets(draw: st.DrawFn) -> list[tuple[str, int, int, int]]:
    """1 to 3 limits (algorithm, rate, period, capacity), no two sharing a key."""
    chosen: list[tuple[str, int, int, int]] = []
    for _ in range(draw(st.integers(1, 3))):
        algorithm = draw(st.sampled_from(sorted(KINDS)))
        (low, high), (short, long) = KINDS[algorithm]
        period = draw(st.integers(short, long))
        if any((a, p) == (algorithm, period) for a, _, p, _ in chosen):
            continue
        capacity = draw(st.integers(1, 2_000)) if algorithm == "token_bucket" else 0
        chosen.append((algorithm, draw(st.integers(low, high)), period, capacity))
    return chosen


limit_steps = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 5_000), st.integers(0, 3_000_000)),  # dt µs
        st.integers(1, 12),  # permits (may exceed a window's rate)
        st.one_of(st.none(), st.just(0.0), st.floats(0, 5_000_000)),  # timeout µs
        st.one_of(st.none(), st.none(), st.none(), st.integers(1, 10)),  # new rate, 1st limit
    ),
    min_size=1,
    max_size=50,
)


def interface(url: str, limits: list[tuple[str, int, int, int]]) -> Rule:
    rules = [
        Rule(url, rate, 0.0, i, capacity=cap, algorithm=alg, period=period)
        for i, (alg, rate, period, cap) in enumerate(limits)
    ]
    return replace(rules[0], also=tuple(rules[1:]))


def stored_limit(client: redis.Redis, rule: Rule) -> LimitState | None:
    """What limits.lua keeps for ``rule``'s limit, read back exactly."""
    key = state_key("prop", rule)
    if rule.algorithm == "sliding_window":
        admissions = [float(t) for t in client.lrange(key, 0, -1)]
        return SlidingLog.of(admissions) if admissions else None
    raw = client.get(key)
    if not isinstance(raw, bytes):
        return None
    if rule.algorithm == "fixed_window":
        assert len(raw) == 16, raw  # two doubles: the window, the permits in it
        return FixedWindow(*struct.unpack("<2d", raw))
    return parse_state(raw)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limits=limit_sets(), sequence=limit_steps)
def test_limits_script_and_model_agree_on_every_decision_and_state(
    backend: RedisBackend,
    limits: list[tuple[str, int, int, int]],
    sequence: list[tuple[int, int, float | None, int | None]],
) -> None:
    url = f"/m/{uuid.uuid4().hex}"
    now = START
    model: list[LimitState | None] = [None] * len(limits)
    for dt, permits, timeout, new_rate in sequence:
        now += dt
        if new_rate is not None:  # a reload changes the first limit's rate
            alg, _, period, cap = limits[0]
            limits[0] = (alg, new_rate, period, cap)
        rule = interface(url, limits)
        if len(rule.limits) == 1 and rule.algorithm == "token_bucket":
            # period 121: no drawn bucket has it (1-120), so the two never share a key
            rule = replace(rule, also=(replace(rule, config_id=99, period=121),))
            limits.append(("token_bucket", rule.rate, 121, rule.capacity))
            model.append(None)  # a lone bucket is bucket.lua's: add a second limit
        timeout_s = None if timeout is None else timeout / 1e6
        got = backend.reserve(rule, permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        specs = [limit(r) for r in rule.limits]
        expected, new = reserve_limits(specs, model, permits, budget, now)
        assert got == expected
        if new is not None:
            model = list(new)
        assert [stored_limit(backend.client, r) for r in rule.limits] == model


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    own=limit_sets(),
    cap=limit_sets(),
    sequence=st.lists(
        st.tuples(
            st.booleans(),  # which of the channel's two interfaces asks
            st.one_of(st.integers(0, 5_000), st.integers(0, 3_000_000)),  # dt µs
            st.integers(1, 12),  # permits
            st.one_of(st.none(), st.just(0.0), st.floats(0, 5_000_000)),  # timeout µs
        ),
        min_size=1,
        max_size=50,
    ),
)
def test_a_channel_cap_is_shared_by_its_interfaces_as_the_model_says(
    backend: RedisBackend,
    own: list[tuple[str, int, int, int]],
    cap: list[tuple[str, int, int, int]],
    sequence: list[tuple[bool, int, int, float | None]],
) -> None:
    """Two interfaces of one channel, each with its own limits (the same shapes) and the
    channel's (``interfaceUrl`` ``*``) last: one limits.lua call decides both, and the
    channel's state is one, shared (capacity shares, docs/algorithms.md)."""
    channel = f"C{uuid.uuid4().hex[:12]}"
    channel_limits = [
        replace(r, url=CHANNEL_URL, channel=channel, config_id=100 + r.config_id)
        for r in interface(CHANNEL_URL, cap).limits
    ]
    rules = []
    for name in ("a", "b"):
        mine = [replace(r, channel=channel) for r in interface(f"/{channel}/{name}", own).limits]
        rules.append(replace(mine[0], also=(*mine[1:], *channel_limits)))
    assert own_limits(rules[0]) == len(own)
    own_states: list[list[LimitState | None]] = [[None] * len(own), [None] * len(own)]
    shared: list[LimitState | None] = [None] * len(cap)
    now = START
    for second, dt, permits, timeout in sequence:
        now += dt
        rule = rules[second]
        timeout_s = None if timeout is None else timeout / 1e6
        got = backend.reserve(rule, permits, timeout_s, now=now)
        budget = None if timeout_s is None else timeout_s * 1_000_000.0
        specs = [limit(r) for r in rule.limits]
        states = own_states[second] + shared
        expected, new = reserve_limits(specs, states, permits, budget, now, own=len(own))
        assert got == expected
        if new is not None:
            own_states[second], shared = list(new[: len(own)]), list(new[len(own) :])
        stored = [stored_limit(backend.client, r) for r in rule.limits]
        assert stored == own_states[second] + shared
    keys = {state_key("prop", r) for rule in rules for r in rule.limits}
    assert {k.split("}")[0] for k in keys} == {f"prop:{{={channel}"}  # one hash tag, one slot


@pytest.mark.parametrize("algorithm", ["token_bucket", "sliding_window", "fixed_window"])
def test_a_foreign_value_at_a_limit_key_is_lost_state_not_an_error(
    backend: RedisBackend, algorithm: str
) -> None:
    url = f"/f/{uuid.uuid4().hex}"
    rule = interface(url, [(algorithm, 3, 1, 3), ("token_bucket", 100, 60, 100)])
    key = state_key("prop", rule)
    for foreign in ("hash", "string"):
        backend.client.delete(key)
        if foreign == "hash":  # e.g. left by another program, or an older layout
            backend.client.hset(key, mapping={"s": "1", "b": "2"})
        else:
            backend.client.set(key, b"not the state of any limit")
        now = START + 10 * 1_000_000.0 * (foreign == "string")  # a fresh window for each
        verdicts = [backend.reserve(rule, 1, 0.0, now=now) for _ in range(4)]
        assert [v.allowed for v in verdicts] == [True] * 3 + [False]  # a fresh limit of 3
        assert stored_limit(backend.client, rule) is not None


@pytest.mark.parametrize("stale", [1, 3, 6, 8])
def test_a_sliding_window_left_counts_only_admissions_still_in_it(
    backend: RedisBackend, stale: int
) -> None:
    """What a window has left skips the admissions its list still holds from before the
    window (the script finds the first live one by halving), as the model does."""
    url = f"/s/{uuid.uuid4().hex}"
    rule = Rule(url, 10, 0.0, 1, algorithm="sliding_window", period=2)
    specs = [limit(rule)]
    model: list[LimitState | None] = [None]
    now = START
    for i in range(8):  # eight admissions, 0.1 s apart
        now = START + i * 100_000.0
        got = backend.reserve(rule, 1, 0.0, now=now)
        expected, new = reserve_limits(specs, model, 1, 0.0, now)
        assert got == expected and new is not None
        model = list(new)
    # later, when the first ``stale`` of them have left the 2 s window
    now = START + (stale - 1) * 100_000.0 + specs[0].size + 1.0
    got = backend.reserve(rule, 1, 0.0, now=now)
    expected, _ = reserve_limits(specs, model, 1, 0.0, now)
    assert got == expected
    assert got.stored == 10 - (8 - stale) - 1
