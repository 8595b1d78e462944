"""``quota.lua`` on a real Redis and its Python model (``model/quota_floor.py``) raise a
calendar quota's counter alike: only ever up, only in the period the clock is in (or a
later one), only where the supplier's count renews no sooner than the quota; and the
counter's lock goes to one member at a time."""

from __future__ import annotations

import math
import struct
import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.state import calendar_bounds
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.quotas import LOCK_SUFFIX, parse_quota, quota_call
from gateway_limiter.model.calendar import Calendar
from gateway_limiter.model.limits import CalendarWindow
from gateway_limiter.model.quota_floor import NOW_PERIOD, expiry_ms, raise_counter
from tests.support.services import RedisServer

US = 1_000_000.0
ZONE = "America/New_York"
#: a night when New York's clocks go back: a 25-hour day among the periods
NOW_S = 1_793_595_600.0  # 2026-11-01 03:00 UTC, the day before DST ends


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="qf"))


@pytest.fixture(scope="module")
def client(redis_server: RedisServer) -> redis.Redis:
    return redis_server.client()


def stored(client: redis.Redis, key: str) -> CalendarWindow | None:
    raw = client.get(key)
    if not isinstance(raw, bytes):
        return None
    return CalendarWindow(*struct.unpack(f"<{len(raw) // 8}d", raw))


BOUNDS = calendar_bounds(Calendar.of("day", ZONE), NOW_S)
OFFSETS = st.sampled_from([-1.0, 0.0, 1.0, 3600 * US, 23 * 3600 * US, 25 * 3600 * US])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    before=st.one_of(
        st.none(),
        st.tuples(st.sampled_from(BOUNDS[:3]), st.integers(0, 120)),
        st.tuples(st.sampled_from(BOUNDS[:3]), st.integers(0, 120), st.integers(0, 9)),
        st.just("junk"),
    ),
    window=st.one_of(st.just(NOW_PERIOD), st.sampled_from(BOUNDS)),
    used=st.integers(-1, 120),
    now_at=st.sampled_from(BOUNDS[1:3]),
    now_off=OFFSETS,
    until=st.one_of(
        st.just(math.inf), st.sampled_from(BOUNDS), OFFSETS.map(lambda o: BOUNDS[2] + o)
    ),
)
def test_the_script_raises_a_counter_as_the_model_does(
    backend: RedisBackend,
    client: redis.Redis,
    before: tuple[float, int] | tuple[float, int, int] | str | None,
    window: float,
    used: int,
    now_at: float,
    now_off: float,
    until: float,
) -> None:
    key = f"qf:{{/x}}:cq:day:{uuid.uuid4().hex}"
    state = None
    if before == "junk":
        client.rpush(key, "not a counter")  # lost state: another type in its key
    elif isinstance(before, tuple) and len(before) == 2:
        state = CalendarWindow(float(before[0]), float(before[1]))
        client.set(key, struct.pack("<2d", state.window, state.used))
    elif isinstance(before, tuple):  # a paced quota's counter, with its pacing bucket
        state = CalendarWindow(float(before[0]), float(before[1]), float(before[2]), 1.0)
        client.set(key, struct.pack("<4d", *state))
    now = now_at + now_off
    fields = [*BOUNDS, window, float(used), until]
    reply = backend.script(quota_call([key], fields, now_us=now))
    clock, [(got_window, got_used, held)] = parse_quota(reply, 1)

    expected = raise_counter(BOUNDS, state, window, float(used), until, now)
    after = stored(client, key) if client.type(key) != b"list" else None
    assert clock == now and not held
    if expected is None:  # nothing written: the key holds what it held
        assert after == state
        assert (got_window, got_used) == (state[:2] if state else (0.0, 0.0))
    else:
        assert after == expected and expected[:2] == (got_window, got_used)
        ttl = client.pttl(key)
        assert (
            expiry_ms(BOUNDS, expected.window, now) - 50
            <= ttl
            <= expiry_ms(BOUNDS, expected.window, now)
        )


def test_a_counter_is_never_lowered_and_its_lock_has_one_holder(
    backend: RedisBackend, client: redis.Redis
) -> None:
    key = f"qf:{{/y}}:cq:day:{uuid.uuid4().hex}"
    now = BOUNDS[1] + 3600 * US
    raised = backend.script(
        quota_call([key], [*BOUNDS, NOW_PERIOD, 40.0, math.inf], "a", 5000, now)
    )
    assert parse_quota(raised, 1)[1] == [(BOUNDS[1], 40.0, True)]
    lower = backend.script(quota_call([key], [*BOUNDS, BOUNDS[1], 10.0, math.inf], "b", 5000, now))
    assert parse_quota(lower, 1)[1] == [(BOUNDS[1], 40.0, False)]  # a's lock, a's count
    again = backend.script(quota_call([key], [*BOUNDS, NOW_PERIOD, 0.0, math.inf], "a", 5000, now))
    assert parse_quota(again, 1)[1] == [(BOUNDS[1], 40.0, True)]
    client.delete(key + LOCK_SUFFIX)  # a's lock lapsed: b takes it
    taken = backend.script(quota_call([key], [*BOUNDS, NOW_PERIOD, 0.0, math.inf], "b", 5000, now))
    assert parse_quota(taken, 1)[1] == [(BOUNDS[1], 40.0, True)]
    assert client.get(key + LOCK_SUFFIX) == b"b"


def test_a_count_raised_past_the_next_period_outlives_a_longer_period_than_the_last(
    backend: RedisBackend, client: redis.Redis
) -> None:
    """A monthly quota in UTC on 15 January: a checkpoint of March's count (w = b3, the
    period whose end the process only guesses) must keep the counter past 1 April, not
    expire at 29 March (b3 plus February's 28 days) and give March's quota again."""
    bounds = calendar_bounds(Calendar.of("month", "UTC"), 1_800_000_000.0)  # 2027-01-15
    march, april = bounds[3], bounds[3] + 31 * 86400 * US
    now = bounds[1] + 14 * 86400 * US
    key = f"qf:{{/m}}:cq:month:{uuid.uuid4().hex}"
    reply = backend.script(quota_call([key], [*bounds, march, 7.0, math.inf], now_us=now))
    assert parse_quota(reply, 1)[1] == [(march, 7.0, False)]
    ttl = client.pttl(key)
    assert isinstance(ttl, int) and ttl > (april - now) / 1000.0
    assert expiry_ms(bounds, march, now) > (april - now) / 1000.0
