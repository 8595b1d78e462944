"""What a supplier's headers say is left of its quota (``quota_report``): the IETF
``RateLimit`` field and its drafts, ``X-RateLimit-Remaining`` with ``X-RateLimit-Reset``
as epoch seconds or as seconds from now; anything else, or a count with no renewal, is
no report at all, never an error."""

from __future__ import annotations

import httpx
import pytest

from gateway_limiter.integrations.supplier import quota_report

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # the IETF field: the policy with the fewest left, t seconds from now
        ({"RateLimit": '"day";r=50;t=3600'}, (50, NOW + 3600)),
        ({"RateLimit": '"second";r=9;t=1, "day";r=4;t=7200'}, (4, NOW + 7200)),
        ({"ratelimit": '"day";r=0;t=30', "RateLimit-Policy": '"day";q=100;w=86400'}, (0, NOW + 30)),
        # its earlier drafts
        ({"RateLimit": "limit=100, remaining=7, reset=60"}, (7, NOW + 60)),
        ({"RateLimit-Remaining": "12", "RateLimit-Reset": "90"}, (12, NOW + 90)),
        # X-RateLimit-*: epoch seconds, or seconds from now
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "1800003600"}, (3, 1_800_003_600.0)),
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "120"}, (3, NOW + 120)),
        ({"X-RateLimit-Remaining": "99999999999", "X-RateLimit-Reset": "5"}, (2**31 - 1, NOW + 5)),
        # nothing usable
        ({"X-RateLimit-Remaining": "3"}, None),  # no renewal: maybe a window of a second
        ({"X-RateLimit-Remaining": "-3", "X-RateLimit-Reset": "5"}, None),
        ({"X-RateLimit-Remaining": "three", "X-RateLimit-Reset": "5"}, None),
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "soon"}, None),
        ({"RateLimit": '"day";t=30'}, None),
        ({"RateLimit": "garbage;;;=,,"}, None),
        ({}, None),
    ],
)
def test_a_report_is_read_from_the_headers(
    headers: dict[str, str], expected: tuple[int, float] | None
) -> None:
    assert quota_report(httpx.Headers(headers), now_s=NOW) == expected
