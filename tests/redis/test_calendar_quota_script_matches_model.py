"""Calendar quotas on a real Redis: ``limits.lua`` and the Python model
(``model/limits.py``, ``CalendarLimit``) decide alike to the last bit, with the Redis
clock driven across DST changes, month ends and leap days, and the process's clock
skewed; a day renews at the zone's midnight on the Redis clock, whatever the process's.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from dataclasses import replace
from zoneinfo import ZoneInfo

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_limiter.backends.redis import RedisBackend
from gateway_limiter.backends.scripts import IN_PAIR, count_size, parse_state
from gateway_limiter.backends.state import limit, state_key
from gateway_limiter.config.rules import CALENDAR_SECONDS, Rule, build_rules
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import ConfRow
from gateway_limiter.core.decision import Reason, decision_of
from gateway_limiter.model.bucket import Verdict
from gateway_limiter.model.calendar import Calendar
from gateway_limiter.model.limits import CalendarWindow, LimitState, reserve_limits
from tests.support.services import RedisServer

US = 1_000_000.0
HOUR_US = 3600 * US


def at(zone: str, *when: int) -> float:
    """Epoch µs of a local time in ``zone``: (year, month, day, hour=0, minute=0)."""
    year, month, day, *rest = when
    hour, minute = ([*rest, 0, 0])[:2]
    moment = dt.datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone))
    return moment.timestamp() * US


def quota(
    url: str, rate: int, period: str, zone: str, renews: str | None = None, burst: int = 0
) -> Rule:
    """A calendar quota; paced with ``burst`` when that is not 0."""
    calendar = Calendar.of(period, zone, renews)
    return Rule(
        url,
        rate,
        0.0,
        2,
        algorithm="fixed_window",
        period=CALENDAR_SECONDS[calendar.renewal.period],
        calendar=calendar,
        pacing=burst > 0,
        pace_burst=burst or 10,
    )


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer) -> RedisBackend:
    return RedisBackend(Settings(redis_url=redis_server.url, redis_timeout=5.0, key_prefix="cal"))


def stored(client: redis.Redis, rule: Rule) -> CalendarWindow | None:
    raw = client.get(state_key("cal", rule))
    if not isinstance(raw, bytes):
        return None
    # a paced quota's bucket after its count, and the bucket beside it after that
    size = count_size(raw)
    assert size in (16, 32), raw
    return CalendarWindow(*struct.unpack_from(f"<{size // 8}d", raw))


def decide(
    backend: RedisBackend,
    rule: Rule,
    permits: int,
    timeout_s: float | None,
    now: float,
    skew: float,
) -> tuple[Verdict, float]:
    """One decision at Redis time ``now`` (µs) by a process whose clock is ``skew`` µs off."""
    backend._commands.clock = lambda: (now + skew) / US
    return backend.reserve(rule, permits, timeout_s, now=now), (now + skew) / US


STARTS = {
    # the night New York springs forward, the one it falls back, a month end in Beijing,
    # a leap day in London
    "America/New_York": [
        at("America/New_York", 2026, 3, 7, 20),
        at("America/New_York", 2026, 10, 31, 20),
    ],
    "Asia/Shanghai": [at("Asia/Shanghai", 2026, 1, 31, 20), at("Asia/Shanghai", 2026, 2, 28, 20)],
    "Europe/London": [at("Europe/London", 2028, 2, 28, 20), at("Europe/London", 2026, 3, 28, 20)],
}
starts = st.sampled_from([(zone, start) for zone, ss in STARTS.items() for start in ss])
steps = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 5_000_000), st.integers(0, int(6 * HOUR_US))),  # dt µs
        st.integers(1, 4),  # permits
        st.one_of(st.none(), st.just(0.0), st.floats(0, 10 * US)),  # timeout µs
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=starts,
    period=st.sampled_from(["day", "day", "week", "month"]),
    rate=st.integers(1, 12),
    with_rate=st.booleans(),
    burst=st.sampled_from([0, 0, 1, 2, 5]),  # 0: not paced
    # ten minutes, most of a day, and (beyond what the boundaries cover) three days
    skew=st.sampled_from(
        [0.0, 600 * US, -600 * US, 20 * HOUR_US, -20 * HOUR_US, 72 * HOUR_US, -72 * HOUR_US]
    ),
    sequence=steps,
)
def test_script_and_model_agree_on_every_decision_and_count(
    backend: RedisBackend,
    start: tuple[str, float],
    period: str,
    rate: int,
    with_rate: bool,
    burst: int,
    skew: float,
    sequence: list[tuple[int, int, float | None]],
) -> None:
    zone, now = start
    url = f"/q/{uuid.uuid4().hex}"
    rule = quota(url, rate, period, zone, burst=burst)
    if with_rate:  # a per-second bucket beside the quota, decided with it
        rule = replace(Rule(url, 3, 0.0, 1), also=(rule,))
    model: list[LimitState | None] = [None] * len(rule.limits)
    for step, permits, timeout in sequence:
        now += step
        timeout_s = None if timeout is None else timeout / US
        got, process_s = decide(backend, rule, permits, timeout_s, now, skew)
        specs = [limit(r, process_s) for r in rule.limits]
        expected, new = reserve_limits(specs, model, permits, timeout, now)
        assert got == expected
        if new is not None:
            model = list(new)
        assert stored(backend.client, rule.limits[-1]) == model[-1]
        if with_rate:  # bucket.lua decides the pair: its bucket is the model's too
            # in the quota's key, after the count
            raw = backend.client.get(state_key("cal", rule.limits[-1]))
            assert parse_state(raw, IN_PAIR) == model[0]


@pytest.mark.parametrize("skew_s", [0.0, 600.0, -600.0])
def test_a_day_renews_at_beijing_midnight_on_the_redis_clock(
    backend: RedisBackend, skew_s: float
) -> None:
    rule = quota(f"/q/{uuid.uuid4().hex}", 3, "day", "Asia/Shanghai")
    midnight = at("Asia/Shanghai", 2026, 11, 30)
    now = midnight - 300 * US  # 23:55 in Beijing; the process may think it is 00:05
    verdicts = [decide(backend, rule, 1, 0.0, now, skew_s * US)[0] for _ in range(4)]
    assert [v.allowed for v in verdicts] == [True, True, True, False]
    refused = verdicts[-1]
    assert refused.quota_left == 0 and refused.quota_reset_us == midnight
    assert refused.wait_us == 300 * US
    decision = decision_of(refused, Reason.LIMITED, rule, 0.0, 1.0)
    assert decision.reset_at == midnight / US
    assert decision.retry_after == 300.0
    assert (decision.limit, decision.remaining) == (3, 0)
    headers = decision.headers()
    assert headers["X-RateLimit-Reset"] == str(int(midnight / US))
    assert headers["Retry-After"] == "300"
    assert headers["RateLimit-Policy"] == '"quota";q=3'
    # one second before midnight: still spent; at midnight on the Redis clock: renewed
    assert not decide(backend, rule, 1, 0.0, midnight - US, skew_s * US)[0].allowed
    again = decide(backend, rule, 1, 0.0, midnight, skew_s * US)[0]
    assert again.allowed and again.quota_left == 2
    assert again.quota_reset_us == at("Asia/Shanghai", 2026, 12, 1)


def test_new_york_days_across_dst_hold_exactly_their_quota(backend: RedisBackend) -> None:
    rule = quota(f"/q/{uuid.uuid4().hex}", 2, "day", "America/New_York")
    for day, hours in ((dt.date(2026, 3, 8), 23), (dt.date(2026, 11, 1), 25)):
        start = at("America/New_York", day.year, day.month, day.day)
        end = start + hours * HOUR_US
        assert decide(backend, rule, 2, 0.0, start, 0.0)[0].allowed
        last = decide(backend, rule, 1, 0.0, end - US, 0.0)[0]  # the day's last second
        assert not last.allowed and last.quota_reset_us == end
        assert decide(backend, rule, 1, 0.0, end, 0.0)[0].allowed


def test_a_month_from_the_15th_and_a_leap_february(backend: RedisBackend) -> None:
    rule = quota(f"/q/{uuid.uuid4().hex}", 5, "month", "America/New_York", "30 00:00")
    feb = at("America/New_York", 2028, 2, 29)  # February's last day is its renewal
    jan = at("America/New_York", 2028, 1, 30)
    assert decide(backend, rule, 5, 0.0, jan + HOUR_US, 0.0)[0].allowed
    refused = decide(backend, rule, 1, 0.0, feb - US, 0.0)[0]
    assert not refused.allowed and refused.quota_reset_us == feb
    renewed = decide(backend, rule, 5, 0.0, feb, 0.0)[0]
    assert renewed.allowed
    assert renewed.quota_reset_us == at("America/New_York", 2028, 3, 30)


def test_a_daily_channel_cap_holds_over_every_interface_of_the_supplier(
    backend: RedisBackend,
) -> None:
    channel = f"S{uuid.uuid4().hex[:8]}"

    def row(config_id: int, url: str, rate: int, quota_period: str | None) -> ConfRow:
        return ConfRow(
            config_id,
            channel,
            None,
            url,
            rate,
            0.0,
            1,
            period_seconds=1,
            quota_period=quota_period,
            time_zone="Asia/Shanghai" if quota_period else None,
        )

    rows = [row(1, "/a", 100, None), row(2, "/b", 100, None), row(3, "*", 3, "day")]
    rules = build_rules(rows, 0.0).rules
    midnight = at("Asia/Shanghai", 2026, 12, 1)
    now = midnight - HOUR_US
    assert decide(backend, rules["/a"], 2, 0.0, now, 0.0)[0].allowed
    assert decide(backend, rules["/b"], 1, 0.0, now, 0.0)[0].allowed
    refused = decide(backend, rules["/b"], 1, 0.0, now + US, 0.0)[0]
    assert not refused.allowed and refused.quota_reset_us == midnight
    assert not decide(backend, rules["/a"], 1, 0.0, now + 2 * US, 0.0)[0].allowed
    assert decide(backend, rules["/a"], 1, 0.0, midnight, 0.0)[0].allowed  # renewed for all
