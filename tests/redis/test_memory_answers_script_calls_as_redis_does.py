"""``memory://`` is the operations every Redis backend is, over a transport that answers
each script call on the scripts' models: the same calls, sent to Redis and to
``memory://`` on the same driven clock, get the same verdicts, to the last bit, and
leave the same state for a peek."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway_limiter.backends import script_models
from gateway_limiter.backends.base import BackendError, Clocks
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.state import per_caller_key, state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Algorithm, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import BucketState
from gateway_limiter.model.calendar import Calendar, QuotaPeriod
from gateway_limiter.model.limits import CalendarWindow
from tests.support.services import RedisServer

US = 1_000_000.0
NOW_S = 1_796_000_000.0  # 2026-12-01, mid-afternoon in Beijing


def _daily(url: str, rate: int, paced: bool = False) -> Rule:
    return Rule(
        url,
        rate,
        0.0,
        2,
        algorithm=Algorithm.FIXED_WINDOW,
        period=CALENDAR_SECONDS[QuotaPeriod.DAY],
        calendar=Calendar.of("day", "Asia/Shanghai"),
        pacing=paced,
        pace_burst=3,
    )


RULES = {
    "token bucket": Rule("/tb", 5, 0.0, 3),
    "warm-up": Rule("/wu", 5, 2.0, 0),
    "per caller": Rule("/pc", 3, 0.0, 2, per_caller=True),
    "sliding and fixed": Rule(
        "/win",
        4,
        0.0,
        0,
        algorithm=Algorithm.SLIDING_WINDOW,
        also=(Rule("/win", 6, 0.0, 0, algorithm=Algorithm.FIXED_WINDOW, period=3),),
    ),
    "bucket and daily quota": Rule("/pair", 4, 0.0, 1, capacity=6, also=(_daily("/pair", 5),)),
    "fixed and paced quota": Rule(
        "/paced", 4, 0.0, 0, algorithm=Algorithm.FIXED_WINDOW, also=(_daily("/paced", 7, True),)
    ),
}


@pytest.fixture
def both(
    redis_server: RedisServer, key_prefix: str
) -> Iterator[tuple[RedisBackend, MemoryBackend]]:
    """Redis and ``memory://`` with the same calls: the wall clock NOW_S (a calendar
    quota's boundaries), ``memory://``'s clock on it too (no distance to move them by)."""
    clocks = Clocks(lambda: NOW_S * US, lambda: NOW_S)
    settings = Settings(redis_url=redis_server.url, key_prefix=key_prefix, redis_timeout=2.0)
    redis_backend = RedisBackend(settings, clocks)
    try:
        yield redis_backend, MemoryBackend(settings, clocks)
    finally:
        redis_backend.close()


@pytest.mark.parametrize("name", list(RULES))
def test_the_same_calls_get_the_same_verdicts_and_leave_the_same_state(
    both: tuple[RedisBackend, MemoryBackend], name: str
) -> None:
    redis_backend, memory = both
    rule = RULES[name]
    now = NOW_S * US
    asks = [(1, 0.0), (2, 0.0), (1, 0.0), (3, 0.5), (1, None), (1, 0.0), (2, 1.0)]
    for step, (permits, timeout) in enumerate(asks):
        for caller in (None, "k1") if rule.per_caller else (None,):
            there = redis_backend.reserve(rule, permits, timeout, caller, now=now)
            here = memory.reserve(rule, permits, timeout, caller, now=now)
            assert here == there, (step, caller)
        if step == 3:
            pushed_there = redis_backend.pushback(rule, 0.25, None, now=now)
            assert memory.pushback(rule, 0.25, None, now=now) == pushed_there
        now += 137_000.0
    if not rule.per_caller:
        assert memory.peek(rule)[0] == redis_backend.peek(rule)[0]
        assert memory.peek_pushback(rule)[0] == redis_backend.peek_pushback(rule)[0]


def test_a_script_no_model_answers_is_a_backend_error() -> None:
    memory = MemoryBackend()
    with pytest.raises(BackendError, match="memory:// runs no slot script"):
        memory.script(ScriptCall("slot", [0, "release"]))


def test_per_caller_keys_are_known_by_their_caller_part() -> None:
    shared, keyed = Rule("/a:k=b", 1, 0.0, 1), Rule("/a", 1, 0.0, 1, per_caller=True)
    assert not per_caller_key(state_key("gwl", shared))  # the URL's ":k=" is in the tag
    assert per_caller_key(state_key("gwl", keyed) + ":k=caller:1")
    assert per_caller_key(state_key("gwl", keyed) + ":k#" + "0" * 40)
    assert not per_caller_key(state_key("gwl", keyed))


def test_decoded_configs_are_kept_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script_models, "DECODED", 3)
    memory = MemoryBackend()
    for n in range(1, 8):  # a new row each time: a bucket and a daily quota, each decoded
        rule = Rule(f"/r{n}", n, 0.0, 1, capacity=2, also=(_daily(f"/r{n}", 5 + n),))
        assert memory.reserve(rule, 1, 0.0).allowed
        assert len(memory.models._decoded) <= 3


def test_a_pairs_bucket_and_quota_are_peeked_each_on_its_own_clock() -> None:
    """memory:// decides on the limiter's clock; a calendar quota's key is read on the
    wall clock (its periods are the calendar's), the pair's bucket in it too, with the
    time beside it: each peek's state and time on one clock."""
    now = [5_000_000.0]  # µs, far from the wall clock's epoch µs
    memory = MemoryBackend(clocks=Clocks(lambda: now[0], lambda: NOW_S))
    rule = RULES["bucket and daily quota"]
    assert memory.reserve(rule, 2, 0.0).allowed
    bucket, clock_us = memory.peek(rule)
    assert isinstance(bucket, BucketState) and bucket.stored == 4.0  # 6 held, 2 taken
    assert abs(bucket.balance_us - clock_us) < 1.0  # no debt: balanced at the decision
    count, wall_us = memory.peek(rule.also[0])
    assert isinstance(count, CalendarWindow) and count.used == 2.0
    assert count.window <= NOW_S * US < count.window + 86_400 * US and wall_us == NOW_S * US
