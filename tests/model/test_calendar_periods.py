"""Calendar quotas' periods (model/calendar.py; docs/algorithms.md, "Calendar quotas"):
renewals parsed and refused, DST days of 23 and 25 hours, odd renewal times, month
ends and leap days, and periods that tile time in several zones."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_limiter.model.calendar import (
    Calendar,
    QuotaPeriod,
    Renewal,
    RenewalError,
    load_zone,
    parse_period,
    parse_renewal,
)

HOUR = 3600
UTC = dt.UTC
ZONES = ("Asia/Shanghai", "America/New_York", "Europe/London")


def epoch(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """An instant given in UTC."""
    return int(dt.datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp())


def local(instant: int, zone: str) -> str:
    return dt.datetime.fromtimestamp(instant, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")


# -- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "text", "expected", "canonical"),
    [
        ("day", None, Renewal(QuotaPeriod.DAY), "00:00"),
        ("day", "02:00", Renewal(QuotaPeriod.DAY, 2, 0), "02:00"),
        ("day", "2:30", Renewal(QuotaPeriod.DAY, 2, 30), "02:30"),
        ("day", "23:59", Renewal(QuotaPeriod.DAY, 23, 59), "23:59"),
        ("week", None, Renewal(QuotaPeriod.WEEK), "mon 00:00"),
        ("week", "sun 18:00", Renewal(QuotaPeriod.WEEK, 18, 0, weekday=6), "sun 18:00"),
        ("week", "Fri 09:15", Renewal(QuotaPeriod.WEEK, 9, 15, weekday=4), "fri 09:15"),
        ("month", None, Renewal(QuotaPeriod.MONTH), "1 00:00"),
        ("month", "15 00:00", Renewal(QuotaPeriod.MONTH, day=15), "15 00:00"),
        ("month", "30 06:00", Renewal(QuotaPeriod.MONTH, 6, 0, day=30), "30 06:00"),
    ],
)
def test_renewals_parse_to_their_local_time(
    period: str, text: str | None, expected: Renewal, canonical: str
) -> None:
    renewal = parse_renewal(period, text)
    assert renewal == expected
    assert renewal.text == canonical
    assert parse_renewal(period, renewal.text) == renewal


@pytest.mark.parametrize(
    ("period", "text", "says"),
    [
        ("day", "24:00", "00:00 to 23:59"),
        ("day", "12:60", "00:00 to 23:59"),
        ("day", "noon", "HH:MM"),
        ("day", "mon 00:00", "HH:MM"),
        ("day", "", "HH:MM"),
        ("week", "02:00", "ddd HH:MM"),
        ("week", "xyz 02:00", "'xyz' is not one of mon"),
        ("month", "31 00:00", "names the 31st"),
        ("month", "0 00:00", "from 1 to 30"),
        ("month", "32 00:00", "from 1 to 30"),
        ("month", "mon 00:00", "DD HH:MM"),
        ("month", "15 00:00 " + "x" * 20, "DD HH:MM"),
    ],
)
def test_bad_renewals_are_refused_naming_the_field(period: str, text: str, says: str) -> None:
    with pytest.raises(RenewalError, match="quotaRenews") as info:
        parse_renewal(period, text)
    assert says in str(info.value)


def test_bad_periods_and_zones_are_refused_naming_the_field() -> None:
    with pytest.raises(RenewalError, match="quotaPeriod 'year' is not one of day, week, month"):
        parse_period("year")
    for zone in ("Mars/Olympus", "", "../../etc/passwd", "A" * 65, 8):
        with pytest.raises(RenewalError, match="timeZone"):
            load_zone(zone)
    assert load_zone("Asia/Shanghai") == ZoneInfo("Asia/Shanghai")


# -- days, weeks and months in zones ---------------------------------------------------


def test_a_day_in_beijing_runs_from_midnight_beijing_time() -> None:
    day = Calendar.of("day", "Asia/Shanghai")
    # 18:53 UTC on 28 November is 02:53 on the 29th in Beijing
    start, end = day.period_at(epoch(2026, 11, 28, 18, 53))
    assert (start, end) == (epoch(2026, 11, 28, 16), epoch(2026, 11, 29, 16))
    assert local(start, "Asia/Shanghai") == "2026-11-29 00:00 CST"
    # the last second of the day and the first of the next
    assert day.period_at(end - 1) == (start, end)
    assert day.period_at(end) == (end, end + 24 * HOUR)


def test_new_york_days_are_23_and_25_hours_across_dst() -> None:
    day = Calendar.of("day", "America/New_York")
    spring = day.period_at(epoch(2026, 3, 8, 12))
    assert spring == (epoch(2026, 3, 8, 5), epoch(2026, 3, 9, 4))  # EST midnight to EDT
    assert spring[1] - spring[0] == 23 * HOUR
    autumn = day.period_at(epoch(2026, 11, 1, 12))
    assert autumn == (epoch(2026, 11, 1, 4), epoch(2026, 11, 2, 5))
    assert autumn[1] - autumn[0] == 25 * HOUR


def test_london_days_are_23_and_25_hours_across_dst() -> None:
    day = Calendar.of("day", "Europe/London")
    spring = day.period_at(epoch(2026, 3, 29, 12))
    assert spring[1] - spring[0] == 23 * HOUR
    autumn = day.period_at(epoch(2026, 10, 25, 12))
    assert autumn[1] - autumn[0] == 25 * HOUR


def test_a_renewal_at_a_skipped_time_happens_an_hour_later_new_time() -> None:
    # 8 March 2026, New York: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist
    day = Calendar.of("day", "America/New_York", "02:30")
    before = day.period_at(epoch(2026, 3, 8, 6))  # 01:00 EST on the 8th
    assert local(before[0], "America/New_York") == "2026-03-07 02:30 EST"
    assert local(before[1], "America/New_York") == "2026-03-08 03:30 EDT"
    assert before[1] - before[0] == 24 * HOUR
    after = day.period_at(before[1])
    assert local(after[1], "America/New_York") == "2026-03-09 02:30 EDT"
    assert after[1] - after[0] == 23 * HOUR
    # an instant in the lost hour's wake (03:10 EDT) still belongs to the day before
    assert day.period_at(epoch(2026, 3, 8, 7, 10)) == before


def test_a_renewal_at_a_repeated_time_happens_at_its_first_occurrence() -> None:
    # 1 November 2026, New York: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice
    day = Calendar.of("day", "America/New_York", "01:30")
    first = epoch(2026, 11, 1, 5, 30)  # 01:30 EDT
    assert local(first, "America/New_York") == "2026-11-01 01:30 EDT"
    ending = day.period_at(first - 1)
    assert ending[1] == first and ending[1] - ending[0] == 24 * HOUR
    starting = day.period_at(first + HOUR)  # the second 01:30 (EST): same period
    assert starting[0] == first
    assert starting[1] - starting[0] == 25 * HOUR


def test_london_renewal_in_the_skipped_hour() -> None:
    # 29 March 2026, London: 01:00 GMT jumps to 02:00 BST
    day = Calendar.of("day", "Europe/London", "01:30")
    start, end = day.period_at(epoch(2026, 3, 29, 3))
    assert local(start, "Europe/London") == "2026-03-29 02:30 BST"
    assert end - start == 23 * HOUR


def test_weeks_renew_on_their_weekday_in_local_time() -> None:
    week = Calendar.of("week", "Asia/Shanghai")
    start, end = week.period_at(epoch(2026, 11, 28, 18, 53))  # Sunday 29th, 02:53 CST
    assert local(start, "Asia/Shanghai") == "2026-11-23 00:00 CST"  # Monday
    assert end - start == 7 * 24 * HOUR
    sunday = Calendar.of("week", "America/New_York", "sun 18:00")
    start, end = sunday.period_at(epoch(2026, 3, 10))
    assert local(start, "America/New_York") == "2026-03-08 18:00 EDT"
    assert local(end, "America/New_York") == "2026-03-15 18:00 EDT"
    across = sunday.period_at(start - 1)  # the week that holds the spring-forward night
    assert across[1] - across[0] == 7 * 24 * HOUR - HOUR


@pytest.mark.parametrize(
    ("instant", "start", "end", "days"),
    [
        (epoch(2026, 1, 20), "2026-01-01 00:00 EST", "2026-02-01 00:00 EST", 31),
        (epoch(2026, 2, 20), "2026-02-01 00:00 EST", "2026-03-01 00:00 EST", 28),
        (epoch(2028, 2, 20), "2028-02-01 00:00 EST", "2028-03-01 00:00 EST", 29),
        (epoch(2026, 4, 20), "2026-04-01 00:00 EDT", "2026-05-01 00:00 EDT", 30),
        # the first hours of 1 May in UTC are still April in New York
        (epoch(2026, 5, 1, 3), "2026-04-01 00:00 EDT", "2026-05-01 00:00 EDT", 30),
        (epoch(2026, 12, 31, 23), "2026-12-01 00:00 EST", "2027-01-01 00:00 EST", 31),
    ],
)
def test_months_are_28_to_31_days(instant: int, start: str, end: str, days: int) -> None:
    month = Calendar.of("month", "America/New_York")
    period = month.period_at(instant)
    assert (local(period[0], "America/New_York"), local(period[1], "America/New_York")) == (
        start,
        end,
    )
    assert round((period[1] - period[0]) / (24 * HOUR)) == days


def test_march_in_new_york_is_an_hour_short_and_november_an_hour_long() -> None:
    month = Calendar.of("month", "America/New_York")
    march = month.period_at(epoch(2026, 3, 15))
    assert march[1] - march[0] == 31 * 24 * HOUR - HOUR
    november = month.period_at(epoch(2026, 11, 15))
    assert november[1] - november[0] == 30 * 24 * HOUR + HOUR


def test_a_renewal_day_a_month_lacks_is_its_last_day() -> None:
    month = Calendar.of("month", "Asia/Shanghai", "30 00:00")
    shown = [
        local(start, "Asia/Shanghai")
        for start, _ in month.periods(epoch(2027, 12, 31), 4) + month.periods(epoch(2028, 1, 31), 3)
    ]
    assert shown == [
        "2027-12-30 00:00 CST",
        "2028-01-30 00:00 CST",
        "2028-02-29 00:00 CST",  # leap year: the 29th is February's last day
        "2028-03-30 00:00 CST",
        "2028-01-30 00:00 CST",
        "2028-02-29 00:00 CST",
        "2028-03-30 00:00 CST",
    ]
    plain = Calendar.of("month", "Asia/Shanghai", "29 12:00")
    starts = [local(s, "Asia/Shanghai") for s, _ in plain.periods(epoch(2027, 2, 1), 3)]
    assert starts == ["2027-01-29 12:00 CST", "2027-02-28 12:00 CST", "2027-03-29 12:00 CST"]


def test_a_leap_day_is_a_whole_day() -> None:
    day = Calendar.of("day", "Europe/London")
    start, end = day.period_at(epoch(2028, 2, 29, 12))
    assert (start, end) == (epoch(2028, 2, 29), epoch(2028, 3, 1))


def test_a_month_from_the_15th_in_beijing() -> None:
    month = Calendar.of("month", "Asia/Shanghai", "15 00:00")
    start, end = month.period_at(epoch(2026, 11, 28, 18, 53))
    assert local(start, "Asia/Shanghai") == "2026-11-15 00:00 CST"
    assert local(end, "Asia/Shanghai") == "2026-12-15 00:00 CST"


def test_a_whole_skipped_day_makes_no_empty_period() -> None:
    # Samoa skipped 30 December 2011 when it moved across the date line
    day = Calendar.of("day", "Pacific/Apia")
    periods = day.periods(epoch(2011, 12, 29, 12), 4)
    assert all(end > start for start, end in periods)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(periods))
    assert [local(s, "Pacific/Apia")[:10] for s, _ in periods][1:3] == [
        "2011-12-31",
        "2012-01-01",
    ]


# -- properties ------------------------------------------------------------------------

instants = st.integers(min_value=epoch(2000, 1, 1), max_value=epoch(2060, 1, 1))
day_renewals = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59))
renewals = st.one_of(
    day_renewals.map(lambda t: ("day", t)),
    st.builds(
        lambda d, h, m: f"{d} {h:02d}:{m:02d}",
        st.sampled_from(("mon", "tue", "wed", "thu", "fri", "sat", "sun")),
        st.integers(0, 23),
        st.sampled_from((0, 30, 59)),
    ).map(lambda t: ("week", t)),
    st.builds(
        lambda d, h, m: f"{d} {h:02d}:{m:02d}",
        st.integers(1, 30),
        st.integers(0, 23),
        st.sampled_from((0, 30, 59)),
    ).map(lambda t: ("month", t)),
)
BOUNDS = {
    "day": (23 * HOUR, 25 * HOUR),
    "week": (7 * 24 * HOUR - HOUR, 7 * 24 * HOUR + HOUR),
    "month": (28 * 24 * HOUR - HOUR, 31 * 24 * HOUR + HOUR),
}


@settings(max_examples=300, deadline=None)
@given(zone=st.sampled_from(ZONES), renewal=renewals, instant=instants)
def test_periods_tile_time_and_hold_their_instant(
    zone: str, renewal: tuple[str, str], instant: int
) -> None:
    period, renews = renewal
    calendar = Calendar.of(period, zone, renews)
    start, end = calendar.period_at(instant)
    assert start <= instant < end
    low, high = BOUNDS[period]
    assert low <= end - start <= high
    # no gap, no overlap: the next period starts where this one ends, the one before
    # ends where this one starts, and every instant inside maps to this very period
    assert calendar.period_at(end)[0] == end
    assert calendar.period_at(start - 1)[1] == start
    assert calendar.period_at(start) == (start, end)
    assert calendar.period_at(end - 1) == (start, end)


@settings(max_examples=200, deadline=None)
@given(zone=st.sampled_from(ZONES), renews=day_renewals, i=instants)
def test_a_day_renews_at_its_local_time_when_that_time_exists(
    zone: str, renews: str, i: int
) -> None:
    calendar = Calendar.of("day", zone, renews)
    start, _ = calendar.period_at(i)
    shown = dt.datetime.fromtimestamp(start, ZoneInfo(zone))
    hour, minute = calendar.renewal.hour, calendar.renewal.minute
    exists = dt.datetime.combine(shown.date(), dt.time(hour, minute), ZoneInfo(zone)).astimezone(
        UTC
    ).astimezone(ZoneInfo(zone)).time() == dt.time(hour, minute)
    if exists:
        assert (shown.hour, shown.minute) == (hour, minute)
    else:  # a skipped time: an hour later, new time
        assert (shown.hour, shown.minute) == (hour + 1, minute)


@settings(max_examples=100, deadline=None)
@given(zone=st.sampled_from(ZONES), i=instants)
def test_days_are_23_to_25_hours_and_24_in_beijing(zone: str, i: int) -> None:
    start, end = Calendar.of("day", zone).period_at(i)
    assert end - start in (23 * HOUR, 24 * HOUR, 25 * HOUR)
    if zone == "Asia/Shanghai":
        assert end - start == 24 * HOUR
