"""``Retry-After`` as suppliers send it: seconds or an HTTP date; anything unreadable, or
longer than pushback takes (a day), is no value (a plain pushback), never an error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from gateway_limiter.integrations.supplier import retry_after_seconds

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2", 2.0), (" 7 ", 7.0), ("0", 0.0), ("1.5", 1.5), ("86400", 86_400.0)],
)
def test_seconds_are_read_as_seconds(value: str, seconds: float) -> None:
    assert retry_after_seconds(value, NOW) == seconds


def test_an_http_date_is_the_seconds_until_it() -> None:
    later = format_datetime(NOW + timedelta(seconds=30), usegmt=True)
    assert later.endswith("GMT")
    assert retry_after_seconds(later, NOW) == 30.0


def test_an_http_date_in_the_past_is_now() -> None:
    earlier = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
    assert retry_after_seconds(earlier, NOW) == 0.0


def test_an_http_date_without_a_zone_is_gmt() -> None:
    assert retry_after_seconds("Mon, 23 Nov 2026 12:00:10 -0000", NOW) == 10.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "soon",
        "-1",
        "+3",
        "1e3",
        "inf",
        "nan",
        "0x10",
        "2 s",
        "86401",
        "Mon, 99 Foo 2026 12:00:00 GMT",
        "Tue, 24 Nov 2026 12:00:01 GMT",
    ],
)
def test_an_unusable_value_is_none(value: str | None) -> None:
    # The last one is a day and a second after NOW: more than pushback accepts.
    assert retry_after_seconds(value, NOW) is None
