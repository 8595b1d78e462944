"""Pushback: what the supplier said, as a pure-Python reference model of ``pushback.lua``.

A row says what the contract allows; the supplier says, call by call, what it can take.
``limiter.pushback(url, retry_after=None)`` records what it said beside the interface's
limits (same ``{hash tag}``), and every decision script reads it in the same call that
decides, so every process of the fleet obeys it from its next decision on.

State (four packed doubles, ``PUSHBACK``):

- ``until_us``: no call of the interface goes before this moment (the shared clock):
  the latest ``now + retry_after`` any pushback gave. 0: none.
- ``factor``, ``since_us``: the effective rate is ``factor`` times the row's rate as of
  ``since_us`` (the last decrease), and recovers from there by ``RECOVERY_PER_S`` of
  the row's rate per second, up to the row's rate itself (additive increase).
- ``rate``: the row's rate the factor was recorded under. A reload that changes the
  row's rate makes the factor void (the operator said what the supplier takes now);
  one that leaves the rate alone keeps it. ``until_us`` holds whatever the row says.

A pushback without ``retry_after`` multiplies the effective rate by ``DECREASE``, not
below ``FLOOR``, and only once per ``WINDOW_US``: the 429s of one burst (every call in
flight when the supplier started refusing) count once. A pushback with ``retry_after``
only moves ``until_us``: the supplier said when, not how fast.

The constants, and why (measured: docs/algorithms.md, "Pushback"): halving is the
classic AIMD decrease; it reaches the floor from the full rate in four bursts. The
floor keeps an interface from being starved to nothing by a supplier that refuses for
another reason. Recovery at 5 % of the row's rate per second takes 10 s from half rate
back to the full rate: slow enough that a supplier at half the row's rate sees a 429
burst about every 10 s, fast enough that a supplier's short bad spell is forgotten in
well under a minute.

Every number is a double computed in the same order as ``pushback.lua`` and the
decision scripts, so model and scripts agree to the last bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gateway_limiter.model.algorithms import WINDOW_ALGORITHMS
from gateway_limiter.model.bucket import EXPIRY_GRACE_MS

#: A pushback without retry_after multiplies the effective rate by this.
DECREASE = 0.5
#: The effective rate never drops below this fraction of the row's rate.
FLOOR = 0.1
#: Pushbacks without retry_after closer than this to the last decrease count as one.
WINDOW_US = 1_000_000.0
#: The effective rate recovers by this fraction of the row's rate per second.
RECOVERY_PER_S = 0.05
#: The same per microsecond (what the scripts compute with).
RECOVERY_PER_US = RECOVERY_PER_S / 1_000_000.0


class PushbackState(NamedTuple):
    """What pushbacks left for one interface (or one caller of a per-caller limit)."""

    until_us: float  # no call before this (shared clock); 0: none
    factor: float  # effective rate / the row's rate at ``since_us``
    since_us: float  # when ``factor`` was set (the last decrease)
    rate: float  # the row's rate ``factor`` was recorded under


def factor_at(state: PushbackState | None, rate: float, now_us: float) -> float:
    """The effective rate as a fraction of the row's ``rate`` at ``now_us``: 1 without
    state, or with state recorded under another rate."""
    if state is None or state.rate != rate:
        return 1.0
    return min(1.0, state.factor + max(0.0, now_us - state.since_us) * RECOVERY_PER_US)


def window_limit(rate: float, factor: float, permits: int = 1) -> float:
    """What a window of ``rate`` permits admits per window at the effective ``factor``:
    whole permits, so ``floor(rate * factor)``, but at least ``permits`` (a call larger
    than the slowed limit needs a window to itself, else it could never go). With
    ``permits`` 1, the effective rate a window reports."""
    if factor == 1.0:
        return rate
    return max(float(permits), float(math.floor(rate * factor)))


def effective_rate(rate: float, factor: float, algorithm: str) -> float:
    """A row's ``rate`` (permits per period) at the pushback ``factor``, as enforced: a
    bucket's rate times it; a window's in whole permits (``window_limit``)."""
    if factor == 1.0:
        return float(rate)
    if algorithm in WINDOW_ALGORITHMS:
        return window_limit(float(rate), factor)
    return rate * factor


def until_of(state: PushbackState | None) -> float:
    """The moment before which no call goes (0: none)."""
    return 0.0 if state is None else state.until_us


def push(
    state: PushbackState | None, rate: float, retry_after_us: float | None, now_us: float
) -> tuple[PushbackState, float, float]:
    """Record one pushback at ``now_us`` for an interface whose row's rate is ``rate``.

    Returns the new state, the effective factor after it, and the microseconds from
    ``now_us`` before which no call goes (0: none).
    """
    until_us = 0.0 if state is None else state.until_us
    if state is None or state.rate != rate:
        factor, since_us = 1.0, now_us
    else:
        factor, since_us = state.factor, state.since_us
    current = min(1.0, factor + max(0.0, now_us - since_us) * RECOVERY_PER_US)
    if retry_after_us is not None:
        until_us = max(until_us, now_us + retry_after_us)
    elif current >= 1.0 or now_us - since_us >= WINDOW_US:
        factor = max(FLOOR, current * DECREASE)
        since_us = now_us
        current = factor
    return PushbackState(until_us, factor, since_us, rate), current, max(0.0, until_us - now_us)


def pushback_expiry_ms(state: PushbackState, now_us: float) -> int:
    """Milliseconds after which ``state`` is the same as no state: its moment has passed
    and its rate has recovered."""
    recovered_us = state.since_us + (1.0 - state.factor) / RECOVERY_PER_US
    left_ms = math.ceil((max(state.until_us, recovered_us) - now_us) / 1000.0)
    return max(1, left_ms + EXPIRY_GRACE_MS)
