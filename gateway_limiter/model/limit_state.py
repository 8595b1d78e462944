"""One limit as ``limits.lua`` is told it (``Limit``), the state each kind of limit keeps
(``LimitState``: a bucket's, a sliding window's log, a fixed window's or a calendar
quota's counter), and the arithmetic of those states that the kinds' models
(``model/limits.py``) and the decision path's status read: a sliding window's earliest
slot, a fixed window's current counter, a calendar quota's period among its boundaries.
Also the single one-second sliding window (``reserve_window``). Times and durations are
microseconds (``_us``) on the shared clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

from gateway_limiter.model.algorithms import LimitKind
from gateway_limiter.model.bucket import EXPIRY_GRACE_MS, US_PER_S, BucketState, Verdict

#: The sliding window is its period plus this, for wake-up jitter.
WINDOW_GUARD_US = 10_000.0
#: The single sliding window (``reserve_window``): one second plus the guard.
WINDOW_US = US_PER_S + WINDOW_GUARD_US


class Limit(NamedTuple):
    """One limit as ``limits.lua`` is told it."""

    kind: LimitKind
    rate: float  # token bucket: permits per second; windows: permits per window
    size: float  # token bucket: capacity; sliding: window length, µs; fixed: period, µs
    #: A calendar quota's boundaries (epoch µs): the periods ``[b0, b1)``, ``[b1, b2)``,
    #: ``[b2, b3)`` around the deciding process's clock (``CalendarLimit``).
    bounds: tuple[float, ...] = ()


class FixedWindow(NamedTuple):
    """A fixed window's counter: the latest window holding reservations, and its count."""

    window: float  # k, for the window [k * period, (k + 1) * period)
    used: float  # permits reserved in it


class CalendarWindow(NamedTuple):
    """A calendar quota's counter: the period holding reservations, and its count; a
    paced quota's also its pacing bucket (``stored`` -1: none kept, as when the quota was
    not paced: the bucket is then full)."""

    window: float  # the period's start, epoch µs
    used: float  # permits reserved in it
    stored: float = -1.0  # paced: the permits the pacing bucket holds at ``balance``
    balance: float = 0.0  # paced: when ``stored`` was last brought up to date, epoch µs


class SlidingLog(NamedTuple):
    """A sliding window's last admissions, oldest first, as runs: ``counts[i]``
    admissions at ``times[i]`` (times strictly increasing), ``total`` in all.

    ``limits.lua`` keeps one list entry per admission; the model keeps one run per
    moment, so its memory and time follow the calls, never the permits: a window of a
    billion, started full (``share``) or given a million permits at once, is one run.
    ``SlidingLog.of`` reads the script's list as runs (the tests compare the two).
    """

    times: tuple[float, ...]
    counts: tuple[int, ...]
    total: int

    @classmethod
    def of(cls, admissions: Sequence[float]) -> SlidingLog:
        """The runs of ``admissions`` (oldest first, one entry per admission)."""
        times: list[float] = []
        counts: list[int] = []
        for t in admissions:
            if times and times[-1] == t:
                counts[-1] += 1
            else:
                times.append(t)
                counts.append(1)
        return cls(tuple(times), tuple(counts), len(admissions))

    def nth(self, n: int) -> float:
        """The time of the ``n``-th admission, oldest first (1-based, ``n <= total``)."""
        for t, c in zip(self.times, self.counts, strict=True):
            if n <= c:
                return t
            n -= c
        raise IndexError(n)

    def add(self, n: int, at_us: float, keep: int) -> SlidingLog:
        """``n`` admissions at ``at_us`` (no earlier than the last), then only the last
        ``keep`` of them all kept."""
        times, counts = list(self.times), list(self.counts)
        if times and times[-1] == at_us:
            counts[-1] += n
        else:
            times.append(at_us)
            counts.append(n)
        total = self.total + n
        drop = total - keep
        if drop > 0:
            total = keep
            while drop >= counts[0]:
                drop -= counts.pop(0)
                times.pop(0)
            counts[0] -= drop
        return SlidingLog(tuple(times), tuple(counts), total)


#: The state of one limit: a bucket's, a sliding window's admissions (runs, oldest
#: first), or a fixed window's counter.
LimitState: TypeAlias = BucketState | SlidingLog | FixedWindow | CalendarWindow

EMPTY_LOG = SlidingLog((), (), 0)


# --- one sliding window of one second ----------------------------------------------------


def reserve_window(
    times: tuple[float, ...],
    rate: int,
    permits: int,
    timeout_us: float | None,
    now_us: float,
) -> tuple[Verdict, tuple[float, ...] | None]:
    """Sliding window: place ``permits`` admissions at the earliest allowed time.

    ``times`` are the last admissions, oldest first (at most ``rate`` of them).
    Returns the verdict (``stored``: the permits left in the window of the call, or of
    now when refused) and the times to store, or None on refusal. ``permits > rate``
    can never be placed.
    """
    if permits > rate:
        return Verdict(False, math.inf, 0.0), None  # next_free 0, as in limits.lua
    at_us = window_slot(times, rate, permits, now_us, WINDOW_US)
    wait_us = at_us - now_us
    if timeout_us is not None and wait_us > timeout_us:
        next_us = window_slot(times, rate, 1, now_us, WINDOW_US)
        left = window_left(times, rate, now_us, WINDOW_US)
        return Verdict(False, wait_us, left, next_us - now_us), None
    kept = (*times, *([at_us] * permits))[-rate:]
    next_us = window_slot(kept, rate, 1, now_us, WINDOW_US)
    return Verdict(True, wait_us, window_left(kept, rate, at_us, WINDOW_US), next_us - now_us), kept


def window_left(times: tuple[float, ...], cap: float, at_us: float, window_us: float) -> float:
    """Permits a sliding window of ``cap`` has left at ``at_us``: ``cap`` less the
    admissions still in the window then (never below 0)."""
    live = sum(1 for t in times if t + window_us > at_us)
    return max(0.0, cap - live)


def window_expiry_ms(times: tuple[float, ...], now_us: float) -> int:
    """Milliseconds after which the window's times no longer matter."""
    return math.ceil((times[-1] + WINDOW_US - now_us) / 1000.0) + EXPIRY_GRACE_MS


def window_slot(
    times: tuple[float, ...], rate: int, permits: int, now_us: float, window_us: float
) -> float:
    """The earliest time >= ``now_us`` at which a sliding window can place ``permits`` more.

    For one permit, also a time before which no call can be placed later on: the
    window only fills up meanwhile, and an admission leaves it no sooner than this.
    """
    at_us = now_us
    if times:
        at_us = max(at_us, times[-1])
    need = len(times) + permits - rate  # admissions that must have left the window
    if need > 0:
        at_us = max(at_us, times[need - 1] + window_us)
    return at_us


def log_slot(log: SlidingLog, rate: int, permits: int, now_us: float, window_us: float) -> float:
    """``window_slot`` on a ``SlidingLog``: the same time, from runs."""
    at_us = now_us
    if log.total:
        at_us = max(at_us, log.times[-1])
    need = log.total + permits - rate  # admissions that must have left the window
    if need > 0:
        at_us = max(at_us, log.nth(need) + window_us)
    return at_us


def fixed_window_now(state: FixedWindow | None, now_us: float, period_us: float) -> FixedWindow:
    """The counter as of ``now_us``: the stored one, or an empty current window if it ended."""
    current = float(math.floor(now_us / period_us))
    if state is None or state.window < current:
        return FixedWindow(current, 0.0)
    return state


# --- a calendar quota's periods, among its boundaries ----------------------------------


def calendar_start(bounds: Sequence[float], at_us: float) -> float:
    """The start of the period that holds ``at_us`` among ``bounds`` (b0..b3): the latest
    boundary at or before it (b0 when it is earlier than all of them)."""
    b0, b1, b2, b3 = bounds
    if at_us >= b3:
        return b3
    if at_us >= b2:
        return b2
    if at_us >= b1:
        return b1
    return b0


def calendar_end(bounds: Sequence[float], start_us: float) -> float:
    """The end of the period that starts at ``start_us``: the first boundary after it
    (past b3, b3 plus the length of the last period given)."""
    _, b1, b2, b3 = bounds
    if start_us < b1:
        return b1
    if start_us < b2:
        return b2
    if start_us < b3:
        return b3
    return start_us + (b3 - b2)
