"""What a row's values may be: each column's check, named for what it says, shared by
the reload (``config/rules.py``, which skips a row that fails one), ``conf set``, the
console and ``gateway_limiter.admin`` (which refuse to write it).

Each ``*_problem`` answers why a value, or values that must go together, cannot be (""
when they can); the reason starts with the column it is about.
"""

from __future__ import annotations

import math
import re
import unicodedata

from gateway_limiter.config.table import ConfRow
from gateway_limiter.model.algorithms import ALGORITHMS, Algorithm
from gateway_limiter.model.calendar import (
    DEFAULT_TIME_ZONE,
    Calendar,
    RenewalError,
    load_zone,
    parse_period,
    parse_renewal,
)
from gateway_limiter.model.priority import (
    Priority,
    PriorityError,
    Reserve,
    parse_priority,
    parse_reserve,
)

MAX_URL_LENGTH = 128
MAX_CACHE = 9.99
#: The ``interfaceUrl`` of a channel row: it caps every interface of its channelType.
CHANNEL_URL = "*"
#: The longest ``callerKey`` (the column is VARCHAR(64)).
MAX_CALLER_KEY = 64
#: The longest ``channelType`` (VARCHAR(24)).
MAX_CHANNEL = 24
#: The longest ``periodSeconds``: a day (suppliers sell daily quotas; no longer ones).
MAX_PERIOD = 86_400
#: The longest ``leaseMs``: a minute (a longer lease is no longer a rate limit).
MAX_LEASE_MS = 60_000
#: The shortest warmupPeriod (s): shorter, the warm-up slope overflows a double.
MIN_WARMUP = 0.001


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Unicode categories a URL may not hold: control characters (C0, DEL, C1: newline, tab,
#: NUL, escape...) and the line and paragraph separators, which break a line as well.
BAD_URL_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def control_character(url: str) -> tuple[int, str] | None:
    """The first control character in ``url`` as (its 1-based position, it), or None.

    A caller never sends such a URL, and a newline in a row would split every line that
    shows it (``conf list``, ``status``, logs): such rows are skipped, and the command
    line and ``gateway_limiter.admin`` refuse to write them.
    """
    for position, char in enumerate(url, start=1):
        if unicodedata.category(char) in BAD_URL_CATEGORIES:
            return position, char
    return None


_SCHEME_AND_HOST = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)([^?#]*)")


def url_shape_problem(url: str) -> str:
    """Why ``url`` is not a path the integrations decide on ("" when it is, and for the
    channel cap ``*``).

    The HTTP integrations and the ASGI middleware limit a request by its path
    (``/ibe/flight/search``): a row whose interfaceUrl has a scheme and host, or does
    not start with ``/``, never matches one of their requests. It still limits callers
    that pass that exact key to the limiter themselves (``try_acquire(url)``), or that
    map requests to it with ``interface=``: the reload applies it with a warning, and
    ``conf set`` and the console refuse to write it unless told it is such a key.
    """
    if url == CHANNEL_URL or url.startswith("/"):
        return ""
    how = (
        "; to limit requests by another key, map them to it with interface= (e.g. "
        "LimiterTransport(limiter, interface=lambda request: ...)) and write that key"
    )
    full = _SCHEME_AND_HOST.match(url)
    if full is not None:
        path = full.group(2) or "/"
        return (
            f"interfaceUrl {url!r} has a scheme and host: the integrations decide on the "
            f"request's path alone ({path!r} here), so no request of theirs ever matches it" + how
        )
    return (
        f"interfaceUrl {url!r} does not start with '/': the integrations decide on the "
        f"request's path, which always does ('/{url}'), so no request of theirs ever "
        "matches it" + how
    )


def type_problem(row: ConfRow) -> str:
    """Why a value of an enabled row is not of its column's type ("" when all are).

    MySQL enforces the column types, SQLite does not: it keeps text in rateLimit or a
    blob in interfaceUrl as given. Such a row is skipped like any invalid row.
    """
    if not isinstance(row.interface_url, str | None):
        return f"interfaceUrl {row.interface_url!r} is not text"
    if not (row.rate_limit is None or _is_whole(row.rate_limit)):
        return f"rateLimit {row.rate_limit!r} is not a whole number"
    if not (row.cache is None or _is_number(row.cache)):
        return f"cache {row.cache!r} is not a number"
    if not isinstance(row.algorithm, str | None):
        return f"algorithm {row.algorithm!r} is not text"
    if not isinstance(row.channel_type, str | None):
        return f"channelType {row.channel_type!r} is not text"
    if not isinstance(row.caller_key, str | None):
        return f"callerKey {row.caller_key!r} is not text"
    if not (row.max_permits is None or _is_whole(row.max_permits)):
        return f"maxPermits {row.max_permits!r} is not a whole number"
    if not (row.warmup_period is None or _is_number(row.warmup_period)):
        return f"warmupPeriod {row.warmup_period!r} is not a number"
    if not (row.max_concurrent is None or _is_whole(row.max_concurrent)):
        return f"maxConcurrent {row.max_concurrent!r} is not a whole number"
    if not (row.lease_ms is None or _is_whole(row.lease_ms)):
        return f"leaseMs {row.lease_ms!r} is not a whole number"
    for column, value in (
        ("quotaPeriod", row.quota_period),
        ("timeZone", row.time_zone),
        ("quotaRenews", row.quota_renews),
    ):
        if not isinstance(value, str | None):
            return f"{column} {value!r} is not text"
    if row.quota_pacing not in (None, 0, 1) or isinstance(row.quota_pacing, float):
        return f"quotaPacing {row.quota_pacing!r} is not 0 or 1"
    for column, value in (("priority", row.priority), ("reserve", row.reserve)):
        if not isinstance(value, str | None):
            return f"{column} {value!r} is not text"
    return ""


def priority_problem(
    row: ConfRow, calendar: bool = False
) -> tuple[str, Priority | None, Reserve | None]:
    """Why the row's ``priority`` or ``reserve`` cannot be ("" when they can; each
    reason starts with its column), and what they are."""
    try:
        priority = None if row.priority is None else parse_priority(row.priority)
        reserve = parse_reserve(row.reserve)
    except PriorityError as e:
        return str(e), None, None
    if priority is not None and row.interface_url == CHANNEL_URL:
        return (
            f"priority {row.priority!r} on a channel row (interfaceUrl '*') names no "
            "interface's calls: set it on the interfaces' rows",
            None,
            None,
        )
    if reserve is not None and (row.algorithm or Algorithm.TOKEN_BUCKET) == Algorithm.WARM_UP:
        return (
            f"reserve {row.reserve!r} cannot go with warm_up (its stored permits cost time, "
            "so no class could go now)",
            None,
            None,
        )
    if reserve is not None and calendar:
        return (
            f"reserve {row.reserve!r} cannot go with a calendar quota (quotaPeriod "
            f"{row.quota_period}): give the reserve to a rate row of the interface",
            None,
            None,
        )
    return "", priority, reserve


def calendar_problem(
    row: ConfRow, default_time_zone: str = DEFAULT_TIME_ZONE
) -> tuple[str, Calendar | None]:
    """Why the row's calendar columns cannot be ("" when they can), and its Calendar
    (None for a row without a ``quotaPeriod``). Each reason starts with its column."""
    if row.quota_period is None:
        for column, value in (
            ("timeZone", row.time_zone),
            ("quotaRenews", row.quota_renews),
            ("quotaPacing", row.quota_pacing or None),
        ):
            if value is not None:
                return (
                    f"{column} {value!r} is for calendar quotas: it needs quotaPeriod "
                    "(day, week or month)",
                    None,
                )
        return "", None
    try:
        period = parse_period(row.quota_period)
        renewal = parse_renewal(period, row.quota_renews)
        zone = load_zone(row.time_zone if row.time_zone is not None else default_time_zone)
    except RenewalError as e:
        return str(e), None
    algorithm = row.algorithm or Algorithm.TOKEN_BUCKET
    if algorithm not in (Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW):
        return (
            f"algorithm {algorithm!r} cannot count a calendar quota (quotaPeriod "
            f"{period}): it counts permits per period (fixed_window, or the default)",
            None,
        )
    if row.period_seconds not in (None, 1):
        return (
            f"periodSeconds {row.period_seconds!r} cannot go with quotaPeriod {period}: the "
            "calendar is the period (leave periodSeconds 1, and add a row for a rate)",
            None,
        )
    if row.max_permits is not None and not row.quota_pacing:
        return (
            f"maxPermits {row.max_permits} is not used by a calendar quota without pacing "
            f"(quotaPeriod {period}: rateLimit is the period's permits; with quotaPacing 1 "
            "it is the most the pacing saves up)",
            None,
        )
    if row.max_permits is not None and row.max_permits < 1:
        return f"maxPermits {row.max_permits} of a paced quota is not at least 1", None
    return "", Calendar(renewal, zone)


def lease_range_problem(row: ConfRow) -> str:
    """Why the row's ``leaseMs`` is out of range ("" when it is not)."""
    if row.lease_ms is not None and not 0 <= row.lease_ms <= MAX_LEASE_MS:
        return f"leaseMs {row.lease_ms} is not from 0 to {MAX_LEASE_MS} ms"
    return ""


def caller_key_problem(key: str) -> str:
    """Why ``key`` cannot be a ``callerKey`` ("" when it can): empty, longer than the
    column, or holding a control character (it is shown on one line everywhere)."""
    if key == "":
        return "callerKey is empty (NULL names no caller)"
    if len(key) > MAX_CALLER_KEY:
        return f"callerKey {key[:16]!r}... is longer than {MAX_CALLER_KEY} characters"
    bad = control_character(key)
    if bad is not None:
        return f"callerKey {key!r} contains the control character {bad[1]!r} (character {bad[0]})"
    return ""


def share_problem(url: str, channel: str | None, caller: str | None, per_caller: bool) -> str:
    """Why a row's channel cap or named caller cannot be ("" when it can).

    A channel row (``interfaceUrl`` ``*``) needs the channelType it caps; a
    ``callerKey`` needs ``perCaller = 1`` (it picks which caller a per-caller row is for).
    """
    if url == CHANNEL_URL:
        if not channel:
            return "a channel row (interfaceUrl '*') needs the channelType it caps"
        bad = control_character(channel)
        if bad is not None:
            return f"channelType {channel!r} contains the control character {bad[1]!r}"
    if caller is not None:
        if not per_caller:
            return f"callerKey {caller!r} needs perCaller = 1 (it names a per-caller row's caller)"
        return caller_key_problem(caller)
    return ""


def algorithm_problem(
    algorithm: str,
    max_permits: int | None,
    warmup: float | None,
    period: object = 1,
    per_caller: bool = False,
) -> str:
    """Why these columns of one row cannot go together ("" when they can).

    Every algorithm takes any ``periodSeconds`` from 1 to MAX_PERIOD and ``perCaller``,
    except ``warm_up``: one per-second limit on the supplier as a whole.
    """
    if type(period) is not int or not 1 <= period <= MAX_PERIOD:
        return f"periodSeconds {period!r} is not a whole number from 1 to {MAX_PERIOD}"
    if algorithm not in ALGORITHMS:
        return f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}"
    if max_permits is not None and (max_permits < 1 or algorithm != Algorithm.TOKEN_BUCKET):
        return f"maxPermits {max_permits} is invalid for {algorithm} (token_bucket only, >= 1)"
    if algorithm == Algorithm.WARM_UP:
        if warmup is None or not (math.isfinite(warmup) and MIN_WARMUP <= warmup <= 3600):
            return f"warm_up needs warmupPeriod from 0.001 to 3600 seconds, got {warmup!r}"
        if period != 1:
            return f"warm_up paces per second: periodSeconds must be 1, got {period}"
        if per_caller:
            return "warm_up warms the supplier as a whole: it cannot be perCaller"
    elif warmup is not None:
        return f"warmupPeriod is for warm_up only, not {algorithm}"
    return ""
