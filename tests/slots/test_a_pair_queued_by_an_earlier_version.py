"""A waiter queued for a slot by a version before a per-second row and its calendar
quota shared one key (a rolling upgrade) is handed its slot with the quota still
counted: its stored ask of the rate is read in the form it was written in."""

from __future__ import annotations

import struct
import uuid
from dataclasses import replace

import redis

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import Commands
from gateway_limiter.backends.slots import (
    QUEUED,
    TAKEN,
    parse_counts,
    parse_take,
    release_call,
    slot_keys,
    take_call,
)
from gateway_limiter.backends.state import calendar_bounds, state_key
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.calendar import Calendar
from tests.redis.test_a_daily_quota_rides_the_bucket_script import daily, pair
from tests.support.services import RedisServer

#: Rewrites a queued waiter's ask of the rate into the form the earlier version stored:
#: the bucket's key, then the quota's; the bucket's three doubles; the quota's five last.
AS_AN_EARLIER_VERSION_ASKED = """
local ask = cmsgpack.unpack(redis.call("HGET", KEYS[1], ARGV[1]))
local rate, capacity, qrate, b0, b1, b2, b3 = struct.unpack("<ddddddd", ask[3][1])
ask[2] = {ARGV[2], ask[2][1]}
ask[3] = {struct.pack("<ddd", rate, capacity, 0), ask[3][2], ask[3][3], "",
          struct.pack("<ddddd", qrate, b0, b1, b2, b3)}
redis.call("HSET", KEYS[1], ARGV[1], cmsgpack.pack(ask))
return #ask[2]
"""


def count_in(client: redis.Redis, key: str) -> bytes:
    raw = client.get(key)
    assert isinstance(raw, bytes)
    return raw


def test_a_pair_waiter_queued_by_an_earlier_version_is_counted_by_its_quota(
    redis_server: RedisServer,
) -> None:
    prefix = f"sp{uuid.uuid4().hex[:8]}"
    backend = RedisBackend(
        Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix=prefix)
    )
    client: redis.Redis = redis_server.client()
    try:
        url = "/supplier/seat"
        rule = replace(pair(url, rate=5), cache=5.0, max_concurrent=1)
        commands = Commands(prefix)

        def take(lease: str) -> int:
            call = take_call(commands, prefix, rule, 5.0, None, lease, 10.0, 2.0)
            return parse_take(backend.script(call)).state

        assert take("h") == TAKEN
        quota_key = state_key(prefix, daily(url, 5))
        assert struct.unpack_from("<2d", count_in(client, quota_key))[1] == 1.0
        assert take("old") == QUEUED
        asks = slot_keys(prefix, url)[4]
        assert (
            client.eval(AS_AN_EARLIER_VERSION_ASKED, 1, asks, "old", state_key(prefix, rule)) == 2
        )
        assert parse_counts(backend.script(release_call(prefix, url, "h", 1, 10.0))) == (1, 1)
        bounds = calendar_bounds(Calendar.of("day", "Asia/Shanghai"), commands.clock())
        count = struct.unpack_from("<2d", count_in(client, quota_key))
        assert count == (bounds[1], 2.0)  # the hand-over counted in the quota's key
    finally:
        backend.close()
        client.close()
