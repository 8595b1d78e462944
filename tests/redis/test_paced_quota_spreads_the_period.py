"""A paced calendar quota on a real Redis, its clock driven through whole periods: a
caller who asks far more often than the quota allows is admitted along the even pace
line (the permits left over the time left) until the period's last minutes, not until
the quota is spent by mid-morning; across a 23- and a 25-hour day in New York, a day in
Beijing, and a leap February; with a per-second row beside it, the stricter applies."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from tests.redis.test_calendar_quota_script_matches_model import HOUR_US, US, at, quota
from tests.support.services import RedisServer


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="cal"))


def admitted_by_hour(
    backend: RedisBackend, rule: Rule, start_us: float, hours: int, every_s: float
) -> list[int]:
    """A greedy caller asks every ``every_s`` of Redis time from ``start_us`` on (never
    waiting); the calls admitted in each hour."""
    backend._commands.clock = lambda: start_us / US  # the process's clock: the period's start
    counts = [0] * hours
    now = start_us
    while now < start_us + hours * HOUR_US:
        if backend.reserve(rule, 1, 0.0, now=now).allowed:
            counts[int((now - start_us) // HOUR_US)] += 1
        now += every_s * US
    return counts


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        ("Asia/Shanghai", (2026, 11, 30), 24),
        ("America/New_York", (2026, 3, 8), 23),  # spring forward
        ("America/New_York", (2026, 11, 1), 25),  # fall back
    ],
)
def test_a_paced_day_follows_the_even_pace_line_whatever_its_length(
    backend: RedisBackend, zone: str, day: tuple[int, int, int], hours: int
) -> None:
    rate, burst = 240, 2
    start = at(zone, *day)
    paced = quota(f"/q/{uuid.uuid4().hex}", rate, "day", zone, burst=burst)
    counts = admitted_by_hour(backend, paced, start, hours, 60.0)
    assert sum(counts) <= rate
    assert sum(counts) >= rate - 2  # spent, to within the last permits' fractions
    running = 0
    for hour, count in enumerate(counts, 1):
        running += count
        line = rate * hour / hours  # the even pace line at the end of this hour
        assert line - 3 <= running <= line + burst, (hour, counts)
    assert counts[-1] >= rate / hours - 3  # still admitting in the day's last hour
    # the next day starts afresh, at the zone's midnight on the Redis clock
    assert backend.reserve(paced, burst, 0.0, now=start + hours * HOUR_US).allowed


def test_unpaced_the_same_demand_spends_the_day_in_its_first_hours(
    backend: RedisBackend,
) -> None:
    start = at("Asia/Shanghai", 2026, 11, 30)
    unpaced = quota(f"/q/{uuid.uuid4().hex}", 240, "day", "Asia/Shanghai")
    counts = admitted_by_hour(backend, unpaced, start, 24, 60.0)
    assert counts[:4] == [60, 60, 60, 60] and sum(counts[4:]) == 0


def test_a_paced_leap_february_is_spread_over_its_29_days(backend: RedisBackend) -> None:
    zone = "America/New_York"
    start, march = at(zone, 2028, 2, 1), at(zone, 2028, 3, 1)
    days = round((march - start) / (24 * HOUR_US))
    assert days == 29
    paced = quota(f"/q/{uuid.uuid4().hex}", 29 * 24, "month", zone, burst=3)
    counts = admitted_by_hour(backend, paced, start, days * 24, 600.0)
    daily = [sum(counts[d * 24 : (d + 1) * 24]) for d in range(days)]
    assert sum(daily) <= 29 * 24
    running = 0
    for d, count in enumerate(daily, 1):
        running += count
        assert 24 * d - 3 <= running <= 24 * d + 3, (d, daily)
    # March: a new period, its bucket full
    backend._commands.clock = lambda: march / US
    assert backend.reserve(paced, 3, 0.0, now=march).allowed


def test_with_a_per_second_row_beside_it_the_stricter_applies(backend: RedisBackend) -> None:
    start = at("Asia/Shanghai", 2026, 12, 1)
    backend._commands.clock = lambda: start / US

    def greedy(rule: Rule, seconds: int) -> int:
        """Calls admitted to a caller asking every 10 ms for ``seconds``."""
        return sum(
            backend.reserve(rule, 1, 0.0, now=start + step * 10_000.0).allowed
            for step in range(seconds * 100)
        )

    # the pace (86,400 a day: one a second) binds under a per-second row of 50
    daily = quota(f"/q/{uuid.uuid4().hex}", 86_400, "day", "Asia/Shanghai", burst=5)
    both = replace(Rule(daily.url, 50, 0.0, 1), also=(daily,))
    assert 5 + 10 - 1 <= greedy(both, 10) <= 5 + 10 + 1
    # the per-second row (2 a second) binds under a pace of 100 a second
    daily = quota(f"/q/{uuid.uuid4().hex}", 8_640_000, "day", "Asia/Shanghai", burst=100)
    both = replace(Rule(daily.url, 2, 0.0, 1), also=(daily,))
    assert 2 + 2 * 10 - 1 <= greedy(both, 10) <= 2 + 2 * 10 + 1
