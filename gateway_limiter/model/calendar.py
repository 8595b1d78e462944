"""Calendar quotas: days, weeks and months in a time zone, as periods of epoch seconds.

A calendar row (``quotaPeriod`` day, week or month) allows ``rateLimit`` permits per
period of the supplier's calendar: from one renewal to the next, where a renewal is a
moment of local time in the row's ``timeZone`` (``quotaRenews``). This module turns that
into the one thing a counter needs: the period ``[start, end)`` that contains an
instant, in whole Unix epoch seconds. It reads no clock and does no I/O: the instant is
given (the Redis server's, on the decision path), and the zone rules come from the IANA
database through ``zoneinfo`` (the ``tzdata`` package where the system has none).

``quotaRenews`` (the column's text; NULL: the default)
------------------------------------------------------
- day: ``HH:MM`` (default ``00:00``, midnight);
- week: ``ddd HH:MM``, ``ddd`` one of ``mon tue wed thu fri sat sun`` (default
  ``mon 00:00``);
- month: ``DD HH:MM``, ``DD`` from 1 to 30 (default ``1 00:00``, the 1st at midnight).

Hours are 0 to 23 (one or two digits), minutes two digits. The 31st is refused: most
months have none, and "the first moment after the 30th" is the 1st at 00:00, which says
what is meant. ``RenewalError`` (a ValueError) names the field and the value.

The rules for odd local times (docs/algorithms.md, "Calendar quotas")
--------------------------------------------------------------------
A renewal happens at the renewal time on the renewal date, read as iCalendar (RFC
5545) reads a local time:

- **A time the clocks skip** (02:30 on a spring-forward night, where 02:00 jumps to
  03:00) is read with the offset in force before the jump: the renewal happens at 03:30
  new time, as if the clocks had not changed yet. The day that ends then is 24 hours
  long, the day after it 23 (the hour the night lost).
- **A time that happens twice** (01:30 on a fall-back night in New York) is its first
  occurrence (summer time): the day that ends then is 24 hours, the one that starts
  then 25 (it holds the repeated hour).
- A day is the time between two renewals: 23, 24 or 25 hours across the usual one-hour
  DST changes, whatever the renewal time.
- **Months** run from the renewal day of one month to that of the next: 28 to 31 days
  (plus or minus a DST hour). A renewal day the month does not have (29 or 30 in
  February) is the month's last day: ``30 00:00`` renews on 28 February (29 in a leap
  year), then on 30 March.
- A whole skipped day (a zone that moved across the date line) can put two renewals on
  one moment: they make one, so a period never has zero length.

Periods tile time: each instant is in exactly one period, each period's end is the next
one's start (property tests in tests/model/test_calendar.py hold this in several zones).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if TYPE_CHECKING:  # a quota's limit, as limits.lua is told it
    from gateway_limiter.model.limit_state import Limit

#: The longest ``timeZone`` (the column is VARCHAR(64)).
MAX_ZONE_NAME = 64
#: The longest ``quotaRenews`` (VARCHAR(16)).
MAX_RENEWS = 16
#: The last day of the month a renewal may name: the 31st is refused (module docstring).
MAX_RENEWAL_DAY = 30
#: The ``default_time_zone`` setting's default.
DEFAULT_TIME_ZONE = "UTC"
#: The ``quota_pacing_burst`` setting's default: the most permits a paced quota saves up
#: when its row has no ``maxPermits``.
DEFAULT_PACING_BURST = 10

WEEKDAYS: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class QuotaPeriod(StrEnum):
    """The ``quotaPeriod`` column's values."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"


QUOTA_PERIODS: tuple[str, ...] = tuple(p.value for p in QuotaPeriod)

#: What each period's ``quotaRenews`` looks like, for messages.
RENEWS_FORMS = {
    QuotaPeriod.DAY: "HH:MM (e.g. 02:00)",
    QuotaPeriod.WEEK: "ddd HH:MM (e.g. mon 00:00)",
    QuotaPeriod.MONTH: "DD HH:MM, DD from 1 to 30 (e.g. 15 00:00)",
}

_TIME = r"(?P<hour>\d{1,2}):(?P<minute>\d{2})"
_FORMS = {
    QuotaPeriod.DAY: re.compile(_TIME),
    QuotaPeriod.WEEK: re.compile(r"(?P<weekday>[A-Za-z]{3})\s+" + _TIME),
    QuotaPeriod.MONTH: re.compile(r"(?P<day>\d{1,2})\s+" + _TIME),
}


class RenewalError(ValueError):
    """A ``quotaPeriod``, ``quotaRenews`` or ``timeZone`` that cannot be used; the
    message names the field and the value."""


@dataclass(frozen=True, slots=True)
class Renewal:
    """When a calendar period turns over, in local time.

    ``weekday`` (0 = Monday) is used by weeks only, ``day`` (1-30) by months only.
    """

    period: QuotaPeriod
    hour: int = 0
    minute: int = 0
    weekday: int = 0
    day: int = 1

    @property
    def text(self) -> str:
        """The canonical ``quotaRenews`` text: ``02:00``, ``mon 00:00``, ``15 00:00``."""
        clock = f"{self.hour:02d}:{self.minute:02d}"
        if self.period is QuotaPeriod.WEEK:
            return f"{WEEKDAYS[self.weekday]} {clock}"
        if self.period is QuotaPeriod.MONTH:
            return f"{self.day} {clock}"
        return clock


def parse_period(period: object) -> QuotaPeriod:
    """The ``quotaPeriod`` value as a QuotaPeriod; RenewalError naming it otherwise."""
    if not isinstance(period, str) or period not in QUOTA_PERIODS:
        raise RenewalError(f"quotaPeriod {period!r} is not one of {', '.join(QUOTA_PERIODS)}")
    return QuotaPeriod(period)


def parse_renewal(period: QuotaPeriod | str, renews: object) -> Renewal:
    """``quotaRenews`` for ``period`` (None: midnight, Monday, the 1st).

    Raises RenewalError naming ``quotaRenews`` and its value when it does not parse, is
    out of range, or names the 31st.
    """
    period = parse_period(period)
    if renews is None:
        return Renewal(period)
    if not isinstance(renews, str):
        raise RenewalError(f"quotaRenews {renews!r} is not text")
    match = _FORMS[period].fullmatch(renews.strip())
    if len(renews) > MAX_RENEWS or match is None:
        raise RenewalError(
            f"quotaRenews {renews!r} is not a {period} renewal: {RENEWS_FORMS[period]}"
        )
    hour, minute = int(match["hour"]), int(match["minute"])
    if hour > 23 or minute > 59:
        raise RenewalError(f"quotaRenews {renews!r}: the time must be from 00:00 to 23:59")
    if period is QuotaPeriod.WEEK:
        name = match["weekday"].lower()
        if name not in WEEKDAYS:
            raise RenewalError(
                f"quotaRenews {renews!r}: {match['weekday']!r} is not one of {' '.join(WEEKDAYS)}"
            )
        return Renewal(period, hour, minute, weekday=WEEKDAYS.index(name))
    if period is QuotaPeriod.MONTH:
        day = int(match["day"])
        if day == 31:
            raise RenewalError(
                f"quotaRenews {renews!r} names the 31st, which most months lack: renew on "
                "the 1st at 00:00 (the moment the last day ends), or name a day from 1 to 30 "
                "(a day a month lacks is its last day)"
            )
        if not 1 <= day <= MAX_RENEWAL_DAY:
            raise RenewalError(
                f"quotaRenews {renews!r}: the day must be from 1 to {MAX_RENEWAL_DAY}"
            )
        return Renewal(period, hour, minute, day=day)
    return Renewal(period, hour, minute)


@lru_cache(maxsize=256)
def load_zone(name: object) -> ZoneInfo:
    """The IANA zone ``name``; RenewalError naming ``timeZone`` when there is none."""
    if not isinstance(name, str) or not name or len(name) > MAX_ZONE_NAME:
        raise RenewalError(f"timeZone {name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise RenewalError(
            f"timeZone {name!r} is not an IANA time zone (e.g. Asia/Shanghai, UTC)"
        ) from None


def _local(instant: int, zone: ZoneInfo) -> dt.datetime:
    """The local wall-clock time of ``instant``, naive."""
    return dt.datetime.fromtimestamp(instant, zone).replace(tzinfo=None)


def renewal_instant(local: dt.datetime, zone: ZoneInfo) -> int:
    """The instant (epoch s) of the local wall-clock time ``local`` in ``zone``, read as
    iCalendar (RFC 5545) reads it: a time that happens twice is its first occurrence, a
    time the clocks skip is read with the offset in force before the jump (02:30 on a
    night when 02:00 jumps to 03:00 is 03:30 new time). PEP 495's ``fold=0`` is both."""
    return int(local.replace(tzinfo=zone, fold=0).timestamp())


def _month_date(index: int, day: int) -> dt.date:
    year, month0 = divmod(index, 12)
    last = 31 if month0 == 11 else (dt.date(year, month0 + 2, 1) - dt.timedelta(days=1)).day
    return dt.date(year, month0 + 1, min(day, last))


@dataclass(frozen=True, slots=True)
class Calendar:
    """A calendar quota's periods: ``renewal`` in ``zone``."""

    renewal: Renewal
    zone: ZoneInfo

    @classmethod
    def of(cls, period: str, zone: str, renews: str | None = None) -> Calendar:
        """From column values; RenewalError naming the bad one."""
        return cls(parse_renewal(period, renews), load_zone(zone))

    def _renewal_date(self) -> tuple[Callable[[dt.date], int], Callable[[int], dt.date], int]:
        """(the index of a local date's period, the renewal date of an index, step)."""
        renewal = self.renewal
        if renewal.period is QuotaPeriod.DAY:
            return dt.date.toordinal, dt.date.fromordinal, 1
        if renewal.period is QuotaPeriod.WEEK:

            def week_index(date: dt.date) -> int:
                return date.toordinal() - (date.weekday() - renewal.weekday) % 7

            return week_index, dt.date.fromordinal, 7

        def month_index(date: dt.date) -> int:
            return date.year * 12 + date.month - 1

        return month_index, lambda index: _month_date(index, renewal.day), 1

    def renewal_moment(self, date: dt.date) -> int:
        """When the period renewing on local ``date`` starts (epoch s)."""
        local = dt.datetime.combine(date, dt.time(self.renewal.hour, self.renewal.minute))
        return renewal_instant(local, self.zone)

    def period_at(self, instant: float) -> tuple[int, int]:
        """The period ``[start, end)`` (epoch s) that holds ``instant`` (epoch s)."""
        now = int(instant // 1)
        index_of, date_of, step = self._renewal_date()
        index = index_of(_local(now, self.zone).date())
        while self.renewal_moment(date_of(index)) > now:
            index -= step
        while self.renewal_moment(date_of(index + step)) <= now:
            index += step
        return self.renewal_moment(date_of(index)), self.renewal_moment(date_of(index + step))

    def periods(self, instant: float, count: int) -> list[tuple[int, int]]:
        """The period holding ``instant`` and the ``count - 1`` after it."""
        out = [self.period_at(instant)]
        while len(out) < count:
            out.append(self.period_at(out[-1][1]))
        return out


# --- a calendar quota as a limit (``model/limits.py``, ``CalendarLimit``) ---------------


def calendar_beyond(limit: Limit, earliest_us: float, now_us: float) -> tuple[bool, float]:
    """Whether a calendar quota would let a call go only past the periods it knows (a
    moment later than b3, the end of the next period, but now: the period from b3 has a
    guessed end), and its earliest time as told then: b3, before which the call surely
    cannot go (while the clock is past b3, the guess). Such a call is refused whatever
    its budget; so is one whose T another limit sets past b3 (``reserve_limits``)."""
    b3 = limit.bounds[3]
    if earliest_us > b3 and earliest_us > now_us:
        return True, b3 if b3 > now_us else earliest_us
    return False, earliest_us


def calendar_most(limit: Limit) -> float:
    """The most permits a calendar quota ever lets one call have: its permits per
    period, and a paced one's no more than its burst (its bucket never holds more)."""
    if limit.size > 0.0 and limit.size < limit.rate:
        return limit.size
    return limit.rate
