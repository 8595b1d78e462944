"""The public API's arguments checked at the edge, before anything is decided: a bad
argument raises TypeError or ValueError naming it, never reaches a script, and never
counts as an outage. ``LimiterCore`` calls these first (``core/pipeline.py``); the
integrations and the rate limit service share the bounds.
"""

from __future__ import annotations

import math
import sys

from gateway_limiter.config.rules import Algorithm, Rule
from gateway_limiter.model.priority import Priority, PriorityError, parse_priority

#: The most permits one call may ask for: a row's rateLimit is an INT(11), and beyond
#: this a reservation's debt stops being exact in the script's doubles.
MAX_PERMITS = 2**31 - 1
#: The largest timeout: a finite float (an int beyond it would overflow converting).
_MAX_TIMEOUT_S = sys.float_info.max
#: The longest wait a reservation may take: a year. A longer budget counts as a year,
#: and ``permits`` that a limit refills in more than a year are refused (a wait beyond
#: it overflows what Redis takes as a key's expiry, and what ``time.sleep`` takes).
MAX_WAIT_S = 365 * 86_400.0
#: The most permits one call may ask of an interface with a sliding window: each
#: permit is one entry of its log, written in the one script call.
MAX_WINDOW_PERMITS = 1_000


def _shown(value: object) -> str:
    # repr of an int of thousands of digits raises ValueError (int_max_str_digits).
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def check_args(url: object, permits: object, timeout: object, key: object = None) -> None:
    """Raise TypeError/ValueError naming the bad argument (``timeout`` in seconds)."""
    if (
        type(url) is str
        and type(permits) is int
        and 1 <= permits <= MAX_PERMITS
        and (timeout is None or (type(timeout) in (float, int) and 0 <= timeout <= _MAX_TIMEOUT_S))  # type: ignore[operator]
        and (key is None or type(key) is str)
    ):
        return  # the common case, in a few type checks; the rest explains what is wrong
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string or None, got {type(key).__name__}")
    if not isinstance(url, str):
        raise TypeError(f"url must be a string, got {type(url).__name__}")
    if not isinstance(permits, int) or isinstance(permits, bool):
        raise TypeError(f"permits must be an int, got {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {_shown(permits)}")
    if permits > MAX_PERMITS:
        raise ValueError(f"permits must be at most {MAX_PERMITS}, got {_shown(permits)}")
    if timeout is not None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
        # NaN, infinity and ints too large for a float all fail this comparison.
        if not 0 <= timeout <= _MAX_TIMEOUT_S:
            raise ValueError(
                f"timeout must be a finite number of seconds >= 0, got {_shown(timeout)}"
            )


def check_permits(rule: Rule, url: str, permits: int) -> None:
    """Raise ValueError naming ``permits`` when ``rule`` cannot serve that many in one
    call: more than ``MAX_WINDOW_PERMITS`` on a sliding window (more than the window
    holds is refused as ever: nothing is written), or more than a limit refills in
    ``MAX_WAIT_S``. Only for ``permits`` > 1: one permit always fits."""
    for r in rule.limits:
        if r.algorithm == Algorithm.SLIDING_WINDOW and MAX_WINDOW_PERMITS < permits <= r.rate:
            raise ValueError(
                f"permits must be at most {MAX_WINDOW_PERMITS} for {url!r} (a sliding "
                f"window records each permit), got {_shown(permits)}"
            )
        if r.rate > 0 and not r.spec.window and permits * r.period > MAX_WAIT_S * r.rate:
            most = math.floor(MAX_WAIT_S * r.rate / r.period)
            raise ValueError(
                f"permits must be at most {most} for {url!r} (what it refills in a year), "
                f"got {_shown(permits)}"
            )


#: The longest hold a pushback may ask for: a day. A Retry-After read in the wrong unit
#: (milliseconds) or a misparsed date would otherwise close an interface fleet-wide until
#: someone deletes its Redis key by hand.
MAX_RETRY_AFTER_S = 86_400.0


def check_pushback_args(url: object, retry_after: object, key: object) -> None:
    """Raise TypeError/ValueError naming the bad argument of ``pushback``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a string, got {type(url).__name__}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string or None, got {type(key).__name__}")
    if retry_after is None:
        return
    if not isinstance(retry_after, (int, float)) or isinstance(retry_after, bool):
        raise TypeError(f"retry_after must be a number of seconds or None, got {retry_after!r}")
    if not 0 <= retry_after <= MAX_RETRY_AFTER_S:  # NaN and infinity fail this too
        raise ValueError(
            f"retry_after must be a number of seconds from 0 to {MAX_RETRY_AFTER_S:g} "
            f"(a day), got {_shown(retry_after)}"
        )


def check_priority(priority: object) -> Priority:
    """``priority`` (a Priority or its text) as a Priority; ValueError/TypeError naming
    the argument when it is not one."""
    if not isinstance(priority, str):
        raise TypeError(f"priority must be a Priority or its text, got {type(priority).__name__}")
    try:
        return parse_priority(priority)
    except PriorityError as e:
        raise ValueError(str(e)) from None


def check_observe_args(url: object, remaining: object, reset_at: object, key: object) -> None:
    """Raise TypeError/ValueError naming the bad argument of ``observe``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a string, got {type(url).__name__}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string or None, got {type(key).__name__}")
    if remaining is not None:
        if not isinstance(remaining, int) or isinstance(remaining, bool):
            raise TypeError(f"remaining must be an int or None, got {type(remaining).__name__}")
        if not 0 <= remaining <= MAX_PERMITS:
            raise ValueError(f"remaining must be from 0 to {MAX_PERMITS}, got {_shown(remaining)}")
    if reset_at is not None:
        if not isinstance(reset_at, (int, float)) or isinstance(reset_at, bool):
            raise TypeError(
                f"reset_at must be epoch seconds (a number) or None, got {type(reset_at).__name__}"
            )
        if not 0 <= reset_at <= MAX_RESET_AT:  # NaN and infinity fail this too
            raise ValueError(
                f"reset_at must be epoch seconds from 0 to {MAX_RESET_AT}, got {_shown(reset_at)}"
            )


#: The latest ``reset_at`` taken (epoch s): the year 9999.
MAX_RESET_AT = 253_402_300_799
