"""A per-second row and a calendar quota beside it keep their state in one key, the
quota's counter: the count first, then the bucket's state, then what pushbacks left.
Whatever else reads or writes that key finds the count where it always was and keeps
the rest: a Redis still holding the old layout (the bucket in a key of its own) goes on
from the period's count, a pushback keeps the count and its expiry, a supplier's report
or a checkpoint keeps the bucket, and ``status`` reads the bucket and the pushback
there."""

from __future__ import annotations

import struct
import uuid

import pytest
import redis

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import IN_PAIR, parse_state
from gateway_limiter.backends.state import calendar_bounds, state_key
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.quotas import parse_quota, quota_call
from gateway_limiter.model.bucket import BucketState
from gateway_limiter.model.calendar import Calendar
from tests.redis.test_a_daily_quota_rides_the_bucket_script import NOW_S, daily, pair
from tests.support.services import RedisServer

US = 1_000_000.0
BOUNDS = calendar_bounds(Calendar.of("day", "Asia/Shanghai"), NOW_S)
NOW = NOW_S * US


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    made = RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="ok"))
    made._commands.clock = lambda: NOW_S
    return made


def raw(client: redis.Redis, key: str) -> bytes:
    got = client.get(key)
    assert isinstance(got, bytes)
    return got


def keys(url: str) -> tuple[str, str]:
    """The quota's key (both now) and the bucket's own (the old layout's)."""
    return state_key("ok", daily(url, 5)), state_key("ok", pair(url))


@pytest.mark.parametrize("paced", [False, True])
def test_a_redis_with_the_old_layout_goes_on_from_the_periods_count(
    backend: RedisBackend, paced: bool
) -> None:
    """Before this layout the bucket had a key of its own and the quota's held the count
    alone; the first decision after the upgrade finds that count and adds to it."""
    client: redis.Redis = backend.client
    url = f"/old/{uuid.uuid4().hex}"
    quota_key, bucket_key = keys(url)
    rule = pair(url, rate=10, paced=paced)
    count = (BOUNDS[1], 8.0, 2.0, NOW - US) if paced else (BOUNDS[1], 8.0)
    client.set(quota_key, struct.pack(f"<{len(count)}d", *count), px=3_600_000)
    client.set(bucket_key, struct.pack("<5d", 0.0, NOW + 9 * US, 4.0, 6.0, US / 4), px=60_000)
    first = backend.reserve(rule, 1, 0.0, now=NOW)
    assert first.allowed and first.quota_left == 1.0  # 8 + 1 of 10
    assert struct.unpack_from("<2d", raw(client, quota_key)) == (BOUNDS[1], 9.0)
    assert backend.reserve(rule, 1, 0.0, now=NOW + US).quota_left == 0.0
    assert not backend.reserve(rule, 1, 0.0, now=NOW + 2 * US).allowed  # the day is spent
    assert client.get(bucket_key) is not None  # left alone: it expires by itself


def test_a_pushback_keeps_the_count_and_its_expiry(backend: RedisBackend) -> None:
    client: redis.Redis = backend.client
    url = f"/pb/{uuid.uuid4().hex}"
    quota_key, _ = keys(url)
    rule = pair(url, rate=10)
    assert backend.pushback(rule, 0.5, now=NOW)[1] == 0.5 * US  # no count yet: none kept
    held = backend.reserve(rule, 1, None, now=NOW)  # the hold, then one interval (1/4 s)
    assert held.allowed and held.wait_us == 0.75 * US and held.quota_left == 9.0
    ttl = client.pttl(quota_key)
    assert ttl > (BOUNDS[2] - NOW) / 1000.0  # the count's: past the end of its day
    backend.pushback(rule, 2.0, now=NOW + US)
    assert struct.unpack_from("<2d", raw(client, quota_key)) == (BOUNDS[1], 1.0)
    assert client.pttl(quota_key) > ttl - 5_000  # not cut to the pushback's seconds
    pushed, _ = backend.peek_pushback(rule)
    assert pushed is not None and pushed.until_us == NOW + 3 * US
    later = backend.reserve(rule, 1, None, now=NOW + US)
    assert later.wait_us == 2.25 * US and later.quota_left == 8.0


def test_a_raised_count_keeps_the_bucket_and_status_reads_it(backend: RedisBackend) -> None:
    client: redis.Redis = backend.client
    url = f"/raise/{uuid.uuid4().hex}"
    quota_key, _ = keys(url)
    rule = pair(url, rate=100)
    for _ in range(3):
        assert backend.reserve(rule, 1, 0.0, now=NOW).allowed
    bucket = parse_state(client.get(quota_key), IN_PAIR)
    assert bucket == BucketState(3.0, NOW, 4.0, 6.0, US / 4)
    peeked, _ = backend.peek(rule)  # status: the per-second row's bucket
    assert peeked == bucket
    report = backend.script(quota_call([quota_key], [*BOUNDS, 0.0, 40.0, float("inf")], now_us=NOW))
    assert parse_quota(report, 1)[1] == [(BOUNDS[1], 40.0, False)]
    assert parse_state(client.get(quota_key), IN_PAIR) == bucket  # kept as it was
    assert backend.reserve(rule, 1, 0.0, now=NOW).quota_left == 59.0


def test_a_bucket_that_outlasts_the_period_outlasts_its_key(backend: RedisBackend) -> None:
    """Just before the day ends, a bucket emptied now is full again only after it: the
    key (a second past the day, for the count) is kept until then."""
    client: redis.Redis = backend.client
    url = f"/end/{uuid.uuid4().hex}"
    quota_key, _ = keys(url)
    rule = pair(url, rate=100)
    now = BOUNDS[2] - 0.5 * US
    assert backend.reserve(rule, 1, 0.0, now=now).allowed  # the key: 1.5 s (the count's)
    assert backend.reserve(rule, 6, None, now=now).allowed  # 5 stored, 1 owed: full in 1.75 s
    ttl = client.pttl(quota_key)
    assert isinstance(ttl, int) and ttl > 1_750
