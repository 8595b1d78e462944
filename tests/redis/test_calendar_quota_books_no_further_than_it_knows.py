"""A calendar quota on a real Redis books no call past the periods it knows: the
process sends the ends of this period and the next (b2, b3), so a call goes at b3 at the
latest (the start of the period after them) or now, and one whose permit would fall
later is refused whatever its wait budget, told the wait to b3, never booked at a
guessed moment. ``limits.lua`` (a quota alone) and ``bucket.lua`` (beside a per-second
bucket) alike, each to the last bit as the Python model."""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from dataclasses import replace
from zoneinfo import ZoneInfo

import pytest

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.state import limit, state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import Verdict
from gateway_limiter.model.calendar import Calendar
from gateway_limiter.model.limits import LimitState, reserve_limits
from tests.support.services import RedisServer

US = 1_000_000.0
DAY_US = 86_400 * US
YEAR_S = 365 * 86_400.0


def at(zone: str, year: int, month: int, day: int, hour: int = 0) -> float:
    """Epoch µs of a local time in ``zone``."""
    return dt.datetime(year, month, day, hour, tzinfo=ZoneInfo(zone)).timestamp() * US


def quota(url: str, rate: int, period: str, zone: str) -> Rule:
    calendar = Calendar.of(period, zone, None)
    return Rule(
        url,
        rate,
        0.0,
        2,
        algorithm="fixed_window",
        period=CALENDAR_SECONDS[calendar.renewal.period],
        calendar=calendar,
    )


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="hz"))


class Both:
    """Decisions on Redis at a driven clock (the process's the same), each checked
    against the model's."""

    def __init__(self, backend: RedisBackend, rule: Rule) -> None:
        self.backend, self.rule = backend, rule
        self.model: list[LimitState | None] = [None] * len(rule.limits)

    def __call__(self, now: float, timeout_s: float | None = YEAR_S) -> Verdict:
        self.backend._commands.clock = lambda: now / US
        got = self.backend.reserve(self.rule, 1, timeout_s, now=now)
        specs = [limit(r, now / US) for r in self.rule.limits]
        timeout_us = None if timeout_s is None else timeout_s * US
        expected, new = reserve_limits(specs, self.model, 1, timeout_us, now)
        assert got == expected
        if new is not None:
            self.model = list(new)
        return got

    def counter(self) -> tuple[float, ...]:
        raw = self.backend.client.get(state_key("hz", self.rule.limits[-1]))
        assert isinstance(raw, bytes)
        return struct.unpack_from("<dd", raw)  # the count first, a bucket beside it after


def test_a_quota_alone_books_at_the_end_of_the_next_period_and_no_later(
    backend: RedisBackend,
) -> None:
    """1 a day in Beijing, at noon on 30 November: the day's permit now, then 1 December's
    at its start, then 2 December's at its start (b3, the end of the next period), and
    the next caller, whose permit would fall on 3 December, is refused with a year to
    wait, told the wait to 2 December (the old script booked it on 3 December and counted
    it in 2 December's period: two in one day)."""
    both = Both(backend, quota(f"/q/{uuid.uuid4().hex}", 1, "day", "Asia/Shanghai"))
    now = at("Asia/Shanghai", 2026, 11, 30, 12)
    dec1, dec2 = at("Asia/Shanghai", 2026, 12, 1), at("Asia/Shanghai", 2026, 12, 2)
    waits = []
    for _ in range(3):
        verdict = both(now)
        assert verdict.allowed
        waits.append(verdict.wait_us)
    assert waits == [0.0, dec1 - now, dec2 - now]
    beyond = both(now)
    assert not beyond.allowed and beyond.wait_us == dec2 - now
    assert not both(now, None).allowed  # no budget at all: the same
    assert both.counter() == (dec2, 1.0)  # nothing booked past 2 December's start
    # Once the process's periods move on, 3 December is a period it knows: booked there.
    later = both(dec1 + US)
    assert later.allowed and later.wait_us == at("Asia/Shanghai", 2026, 12, 3) - dec1 - US


def test_beside_a_bucket_a_permit_just_past_the_next_period_is_refused(
    backend: RedisBackend,
) -> None:
    """2 a day in Beijing beside 1 a second (bucket.lua): the bucket spaces the calls a
    second apart, so the fifth goes at the very end of the next period (2 December's
    start: booked) and the sixth a second after it, past the periods the script knows:
    refused, however long it would wait, told that second."""
    url = f"/q/{uuid.uuid4().hex}"
    rule = replace(Rule(url, 1, 0.0, 1, capacity=1), also=(quota(url, 2, "day", "Asia/Shanghai"),))
    both = Both(backend, rule)
    now = at("Asia/Shanghai", 2026, 11, 30, 12)
    dec1, dec2 = at("Asia/Shanghai", 2026, 12, 1), at("Asia/Shanghai", 2026, 12, 2)
    goes = []
    for _ in range(5):
        verdict = both(now)
        assert verdict.allowed
        goes.append(now + verdict.wait_us)
    assert goes == [now, now + US, dec1, dec1 + US, dec2]
    sixth = both(now)
    assert not sixth.allowed and sixth.wait_us == dec2 + US - now
    assert both.counter() == (dec2, 1.0)


def test_a_count_past_the_next_period_outlives_a_longer_period_than_the_last(
    backend: RedisBackend,
) -> None:
    """1 a month in UTC from 15 January: February's permit at its start, March's at its
    start (b3). March is 31 days, February 28: the counter must not expire at 29 March
    (b3 plus February's length), which would give March's quota again."""
    both = Both(backend, quota(f"/q/{uuid.uuid4().hex}", 1, "month", "UTC"))
    now = at("UTC", 2027, 1, 15)
    march, april = at("UTC", 2027, 3, 1), at("UTC", 2027, 4, 1)
    for _ in range(3):
        assert both(now).allowed
    assert both.counter() == (march, 1.0)
    ttl_ms = backend.client.pttl(state_key("hz", both.rule.limits[-1]))
    assert isinstance(ttl_ms, int)
    assert ttl_ms > (april - now) / 1000.0
