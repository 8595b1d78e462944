"""A per-second row with a calendar quota beside it, the usual pair, is decided by
``bucket.lua`` in one call on one key (the quota's counter, the bucket's state after the
count), not by the general ``limits.lua``: the pair costs Redis little more than the
bucket alone. Both scripts decide the pair alike, to the last bit, decisions and what
they store; on a cluster the pair's key shares its interface's slot, per caller too."""

from __future__ import annotations

import random
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import cast

import pytest
import redis

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import (
    SCRIPTS,
    SHAS,
    Commands,
    count_size,
    fragment_sections,
    limits_args,
    parse_reply,
)
from gateway_limiter.backends.state import pushback_key, state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from tests.support.services import RedisServer, free_port

US = 1_000_000.0
NOW_S = 1_796_000_000.0  # 2026-12-01, mid-afternoon in Beijing


def daily(url: str, rate: int, paced: bool = False, per_caller: bool = False) -> Rule:
    calendar = Calendar.of("day", "Asia/Shanghai")
    return Rule(
        url,
        rate,
        0.0,
        2,
        algorithm=Algorithm.FIXED_WINDOW,
        period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=calendar,
        pacing=paced,
        pace_burst=3,
        per_caller=per_caller,
    )


def pair(url: str, rate: int = 5, paced: bool = False, per_caller: bool = False) -> Rule:
    quota = daily(url, rate, paced, per_caller)
    return Rule(url, 4, 0.0, 1, capacity=6, per_caller=per_caller, also=(quota,))


def test_both_scripts_take_the_quota_arithmetic_from_calendar_lua() -> None:
    """One copy of the calendar arithmetic, taken into both decision scripts (and into
    those composed of them) as text, each section once per decision script."""
    sections = fragment_sections("calendar.lua")
    assert set(sections) == {"step 1", "step 3"}
    # slot.lua and descriptors.lua wrap both decision scripts, lease.lua bucket.lua
    taken = {"bucket": 1, "limits": 1, "slot": 2, "lease": 1, "descriptors": 2}
    for name, times in taken.items():
        assert "-- include:" not in SCRIPTS[name]
        assert [SCRIPTS[name].count(text) for text in sections.values()] == [times, times]


def test_the_pair_is_one_bucket_script_call_and_other_pairs_are_not() -> None:
    commands = Commands("p")
    commands.clock = lambda: NOW_S
    for paced in (False, True):
        call = commands(pair("/a", paced=paced), 1, 0.0, None, None)
        assert call.name == "bucket"
        assert call.args[:2] == [1, state_key("p", daily("/a", 5))]
        assert len(call.args[2]) == 72  # the bucket's, the quota's and a share: nine doubles
    # a second row of another kind, a warm-up row or a channel's cap: limits.lua
    window = Rule("/w", 4, 0.0, 1, also=(Rule("/w", 9, 0.0, 2, period=60),))
    warm = replace(pair("/warm"), algorithm=Algorithm.WARM_UP, warmup=2.0)
    capped = Rule(
        "/c", 4, 0.0, 1, channel="S", also=(replace(daily("*", 5), url="*", channel="S"),)
    )
    three = replace(pair("/t"), also=(daily("/t", 5), Rule("/t", 9, 0.0, 3, period=60)))
    # rows that disagree on per caller have keys apart: no one key holds both
    mixed = replace(pair("/m"), also=(daily("/m", 5, per_caller=True),))
    for rule in (window, warm, capped, three, mixed):
        assert commands(rule, 1, 0.0, None, None).name == "limits", rule.url


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="bq"))


@pytest.mark.parametrize("paced", [False, True])
def test_bucket_lua_and_limits_lua_decide_the_pair_alike(
    backend: RedisBackend, paced: bool
) -> None:
    """The same calls, pushbacks and clock on two copies of the pair: one decided by
    bucket.lua (the backend), one by limits.lua (called directly): equal replies, and
    equal bucket and counter states, up to and across the day's end."""
    client: redis.Redis = backend.client
    rng = random.Random(7 if paced else 8)
    fast = pair(f"/f/{uuid.uuid4().hex}", rate=40, paced=paced)
    url = f"/s/{uuid.uuid4().hex}"
    slow = replace(fast, url=url, also=(replace(fast.also[0], url=url),))
    backend._commands.clock = lambda: NOW_S
    slow_args = limits_args(slow, NOW_S)
    slow_keys = [
        state_key("bq", slow),
        state_key("bq", slow.also[0]),
        pushback_key("bq", slow, None),
    ]
    midnight = Calendar.of("day", "Asia/Shanghai").period_at(NOW_S)[1] * US
    now = midnight - 30 * US
    client.script_load(SCRIPTS["limits"])
    for step in range(300):
        now += rng.choice([0.0, 1_000.0, 50_000.0, 200_000.0, 700_000.0])
        permits = rng.choice([1, 1, 1, 2, 5])
        timeout = rng.choice([0.0, 0.0, 0.3, None])
        if step % 37 == 36:  # a pushback with a hold on both
            backend.pushback(fast, 0.4, now=now)
            client.evalsha(
                SHAS["pushback"], 1, slow_keys[2], repr(fast.per_second), repr(0.4 * US),
                repr(now), "0",
            )  # fmt: skip
            continue
        got = backend.reserve(fast, permits, timeout, now=now)
        timeout_us = "-1" if timeout is None else ("0" if timeout == 0 else repr(timeout * US))
        reply = client.evalsha(
            SHAS["limits"], 3, *slow_keys, str(permits), timeout_us, repr(now), *slow_args
        )
        assert got == parse_reply(reply), (step, now)
        both = cast(bytes, client.get(state_key("bq", fast.also[0])) or b"")
        count = count_size(both)
        assert both[:count] == client.get(slow_keys[1])
        slow_bucket = client.get(slow_keys[0])
        if slow_bucket is not None:
            assert both[count : count + 40] == slow_bucket[:40]
        elif len(both) > count:  # limits.lua's expired once full: the pair's is full too
            stored, balance, _, capacity, refill = struct.unpack_from("<5d", both, count)
            assert stored < 0 or stored + (now - balance) / refill >= capacity
    assert now > midnight  # the day turned over on the way
    # the key written in place within a period keeps the expiry its first write set
    # (limits.lua sets it again each call: later by the driven clock's steps since)
    kept, reset = client.pttl(state_key("bq", fast.also[0])), client.pttl(slow_keys[1])
    assert 0 < reset <= kept <= reset + 300_000


@pytest.fixture
def cluster_node() -> Iterator[RedisServer]:
    """A one-node Redis Cluster holding all 16384 slots (CROSSSLOT is checked there)."""
    server = RedisServer(
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
        "--cluster-port", str(free_port()),
    )  # fmt: skip
    server.start()
    try:
        client = server.client()
        client.cluster("ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while client.cluster("INFO").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                pytest.fail("the one-node cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        yield server
    finally:
        server.stop()


def test_the_pairs_keys_share_a_slot_per_caller_too(cluster_node: RedisServer) -> None:
    backend = RedisBackend(
        Settings(redis_url=cluster_node.url, redis_timeout=5.0, key_prefix="bqc")
    )
    try:
        for rule in (pair("/a/b"), pair("}odd{", per_caller=True)):
            verdicts = [backend.reserve(rule, 1, 0.0, "caller-7") for _ in range(6)]
            assert [v.allowed for v in verdicts] == [True] * 5 + [False]
            assert verdicts[-1].quota_left == 0  # the quota refused, in the same call
        client = cluster_node.client()
        keys = [k.decode() if isinstance(k, bytes) else k for k in client.keys("bqc*")]
        assert len(keys) == 2  # one key per pair: the quota's, the bucket after its count
        assert len({client.cluster("KEYSLOT", k) for k in keys if "/a/b" in k}) == 1
        assert len({client.cluster("KEYSLOT", k) for k in keys if "odd" in k}) == 1
    finally:
        backend.close()
