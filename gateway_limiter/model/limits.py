"""The windows and several limits at once, as a pure-Python reference model: ``limits.lua``.

Sliding window (``sliding_window``)
-----------------------------------
Not a bucket: the state is the times of the last ``r`` admissions, oldest first. A
call of ``n`` permits is placed at the earliest time ``t >= now``, and not before the
latest admission (callers keep their order), such that no window of one second
ending at ``t`` holds more than ``r`` admissions with it: when ``n`` more would
exceed ``r``, ``t`` is at least one window after the admission that must drop out. The
caller waits until ``t`` if that is within its timeout, and is refused at once
otherwise. The window is one second plus ``WINDOW_GUARD_US`` so that the few
milliseconds by which a sleeping caller wakes late never put ``r + 1`` calls into
one real second. Memory is bounded by ``r`` times per interface (the model keeps
them as runs, one per moment: ``SlidingLog``).

Periods
-------
A row allows ``rateLimit`` permits per ``periodSeconds`` P. A token bucket then refills
at ``rateLimit / P`` per second and holds ``rateLimit`` (one period's worth) unless
``maxPermits`` says otherwise (``model/bucket.py``); a sliding window is P seconds (plus
the guard) long.

Fixed window (``fixed_window``)
-------------------------------
Time is cut into aligned windows of P seconds (window k is ``[k P, (k + 1) P)`` on the
shared clock), and each window admits at most r permits. The state is one counter: the
latest window that holds reservations, and how many permits it holds. A call goes into
that window if it still has room and has begun, else into the next one: a caller that
waits goes at the start of its window, callers keep their order (nobody squeezes into
an earlier window than one already given out), and a refusal counts nothing. The
counter expires when its window ends. Cheap and exact per window, but two windows
meet at a boundary: up to 2 r calls can come within a moment across it.

Calendar quota (``quotaPeriod``)
--------------------------------
A fixed window whose windows are the periods of a calendar (``model/calendar.py``):
days of 23 to 25 hours, months of 28 to 31 days. The deciding process sends four
boundaries around its own clock and the shared clock picks the period among them
(``CalendarLimit``); the counter is the start of the period holding reservations and
its count. Replies then also say what is left of the quota with the fewest left, and
when its period ends (``quota_left``).

Several limits at once
----------------------
An interface with several limits (different periods, or shared and per caller)
admits a call only when every limit admits it, all or nothing (``reserve_limits``):

1. each limit says the earliest time it could let the call go (a bucket: once its
   debt and the call's shortfall are paid; a window: its earliest slot);
2. the call goes at the latest of these, T; if T - now exceeds the timeout, the call
   is refused and no limit records anything;
3. otherwise every limit records the call *at T*: a bucket refills up to T, then
   gives the permits (its balance time becomes T); a window records the admission at
   T, in the window that contains T.

Recording at T, not at each limit's own earliest time, is what keeps every limit
exact: a limit that could have served earlier must not count the call before it
really happens, or it would refill (or let its window slide past the call) while the
call still waits for the slower limit. Warm-up is never part of such a set (rules.py).

Each kind of limit (``LimitKind``: a token bucket, a sliding window, a fixed window) is
one small class that says what differs: how a row's numbers become its ``Limit``, its
earliest time for a call, what recording a call at T does to its state, and when its
state expires. ``reserve_limits`` is the same steps 1-3 for every kind.

Every number is a double in the same order of operations as ``limits.lua``, so the
model and the script agree exactly (the property tests check this against a real
Redis). ``reserve_limits`` is ``limits.lua``, which also serves the single windows;
``reserve_window`` is the single one-second sliding window on its own. Times and
durations are microseconds (``_us``) on the shared clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol, cast

from gateway_limiter.model.algorithms import WINDOW_KINDS, LimitKind
from gateway_limiter.model.bucket import (
    EXPIRY_GRACE_MS,
    US_PER_S,
    BucketState,
    TokenBucket,
    Verdict,
    expiry_ms,
    held,
    reconfigure,
    resync,
)
from gateway_limiter.model.calendar import calendar_beyond, calendar_most
from gateway_limiter.model.limit_state import (
    EMPTY_LOG,
    WINDOW_GUARD_US,
    WINDOW_US,
    CalendarWindow,
    FixedWindow,
    Limit,
    LimitState,
    SlidingLog,
    calendar_end,
    calendar_start,
    fixed_window_now,
    log_slot,
    reserve_window,
    window_expiry_ms,
    window_left,
    window_slot,
)
from gateway_limiter.model.pushback import window_limit

# One limit and the state each kind keeps are ``model/limit_state.py``; what reads them
# here (the store, the scripts' replies, status, the tests) imports them from here too.
__all__ = [
    "LIMIT_MODELS",
    "WINDOW_GUARD_US",
    "WINDOW_US",
    "BucketLimit",
    "CalendarLimit",
    "CalendarWindow",
    "FixedLimit",
    "FixedWindow",
    "Limit",
    "LimitKind",
    "LimitModel",
    "LimitState",
    "SlidingLimit",
    "SlidingLog",
    "calendar_end",
    "calendar_start",
    "fixed_window_now",
    "limit_expiry_ms",
    "log_slot",
    "quota_left",
    "reserve_limits",
    "reserve_ready",
    "reserve_window",
    "window_expiry_ms",
    "window_left",
    "window_slot",
]

# --- what differs between the kinds of limit ---------------------------------------------


class LimitModel(Protocol):
    """What one kind of limit does in ``reserve_limits`` (one class per ``LimitKind``)."""

    def limit(self, rate: int, period_s: int, capacity: int) -> Limit:
        """The limit of a row: ``rate`` permits per ``period_s``, ``capacity`` (buckets)."""

    def held(
        self, limit: Limit, state: LimitState | None, now_us: float, until_us: float
    ) -> LimitState | None:
        """``state`` under a pushback's hold until ``until_us``, before which no call goes:
        a bucket owes until then; a window's count stays as it is."""

    def earliest(
        self, limit: Limit, state: LimitState | None, permits: int, now_us: float
    ) -> tuple[float, LimitState]:
        """Step 1: the earliest time the limit lets ``permits`` go, and its state as of
        ``now_us``. A window is asked only for ``permits`` it can hold (``rate``)."""

    def next_free_at(self, limit: Limit, state: LimitState, now_us: float) -> float:
        """The earliest time a one-permit call could go, for ``state`` after a decision."""

    def record(self, limit: Limit, state: LimitState, n: float, at_us: float) -> LimitState:
        """Step 3: ``state`` after admitting ``n`` permits at ``at_us`` (a time it allows)."""

    def expiry_ms(self, limit: Limit, state: LimitState, now_us: float) -> int:
        """Milliseconds after which ``state`` is the same as no state."""

    def left(self, limit: Limit, state: LimitState, cap: float, at_us: float) -> float:
        """Permits ``state`` has left at ``at_us`` (a window: of ``cap`` per window)."""


class BucketLimit:
    """A token bucket: ``bucket.lua``'s steps 1-3 without warm-up, recorded at T."""

    def limit(self, rate: int, period_s: int, capacity: int) -> Limit:
        """Refills at ``rate / period_s`` per second, holds ``capacity``."""
        return Limit(LimitKind.TOKEN_BUCKET, rate / period_s, float(capacity))

    def held(
        self, limit: Limit, state: LimitState | None, now_us: float, until_us: float
    ) -> LimitState | None:
        """Drained until ``until_us``, as in ``bucket.reserve`` (see ``bucket.held``)."""
        sh = TokenBucket(float(limit.rate), float(limit.size))
        return held(cast(BucketState | None, state), sh, now_us, until_us)

    def earliest(
        self, limit: Limit, state: LimitState | None, permits: int, now_us: float
    ) -> tuple[float, LimitState]:
        """Once its debt and the call's shortfall are paid."""
        sh = TokenBucket(float(limit.rate), float(limit.size))
        bucket = held(cast(BucketState | None, state), sh, now_us, 0.0)  # None: full
        bucket = reconfigure(resync(bucket, now_us), sh)
        n = float(permits)
        spend = min(n, bucket.stored)
        return max(bucket.balance_us, now_us) + (n - spend) * sh.stable_us, bucket

    def next_free_at(self, limit: Limit, state: LimitState, now_us: float) -> float:
        """The balance time, plus what stored permits lack of one (``next_free_bucket``)."""
        bucket = cast(BucketState, state)
        owed_us = max(0.0, 1.0 - bucket.stored) * bucket.refill_interval_us
        return max(bucket.balance_us, now_us) + owed_us

    def record(self, limit: Limit, state: LimitState, n: float, at_us: float) -> LimitState:
        """Refill up to T, then give the permits: the balance time becomes T."""
        bucket = cast(BucketState, state)
        stored = bucket.stored
        if at_us > bucket.balance_us:
            refilled = (at_us - bucket.balance_us) / bucket.refill_interval_us
            stored = min(bucket.capacity, stored + refilled)
        return BucketState(
            max(0.0, stored - n), at_us, bucket.rate, bucket.capacity, bucket.refill_us
        )

    def expiry_ms(self, limit: Limit, state: LimitState, now_us: float) -> int:
        """Once the bucket would be full again."""
        return expiry_ms(cast(BucketState, state), now_us)

    def left(self, limit: Limit, state: LimitState, cap: float, at_us: float) -> float:
        """Its stored permits."""
        return cast(BucketState, state).stored


class _Window:
    """What every window does alike: a pushback's hold leaves its count as it is
    (``reserve_limits`` places the call no sooner than the hold's end)."""

    def held(
        self, limit: Limit, state: LimitState | None, now_us: float, until_us: float
    ) -> LimitState | None:
        """``state`` unchanged."""
        return state


class SlidingLimit(_Window):
    """A sliding window: the last ``rate`` admission times."""

    def limit(self, rate: int, period_s: int, capacity: int) -> Limit:
        """``rate`` permits in any window of ``period_s`` (plus the guard)."""
        return Limit(LimitKind.SLIDING_WINDOW, float(rate), period_s * US_PER_S + WINDOW_GUARD_US)

    def earliest(
        self, limit: Limit, state: LimitState | None, permits: int, now_us: float
    ) -> tuple[float, LimitState]:
        """Its earliest slot (``window_slot``)."""
        log = cast(SlidingLog, state or EMPTY_LOG)
        return log_slot(log, int(limit.rate), permits, now_us, limit.size), log

    def next_free_at(self, limit: Limit, state: LimitState, now_us: float) -> float:
        """Its earliest slot for one permit."""
        return log_slot(cast(SlidingLog, state), int(limit.rate), 1, now_us, limit.size)

    def record(self, limit: Limit, state: LimitState, n: float, at_us: float) -> LimitState:
        """T, once per permit (one run), and only the last ``rate`` admissions kept."""
        return cast(SlidingLog, state).add(int(n), at_us, int(limit.rate))

    def expiry_ms(self, limit: Limit, state: LimitState, now_us: float) -> int:
        """Once the latest admission has left the window."""
        log = cast(SlidingLog, state)
        return math.ceil((log.times[-1] + limit.size - now_us) / 1000.0) + EXPIRY_GRACE_MS

    def left(self, limit: Limit, state: LimitState, cap: float, at_us: float) -> float:
        """``cap`` less the admissions still in the window at ``at_us``."""
        log = cast(SlidingLog, state)
        live = sum(c for t, c in zip(log.times, log.counts, strict=True) if t + limit.size > at_us)
        return max(0.0, cap - live)


class FixedLimit(_Window):
    """A fixed window: one counter, for the latest window holding reservations."""

    def limit(self, rate: int, period_s: int, capacity: int) -> Limit:
        """``rate`` permits in each aligned window of ``period_s``."""
        return Limit(LimitKind.FIXED_WINDOW, float(rate), period_s * US_PER_S)

    def earliest(
        self, limit: Limit, state: LimitState | None, permits: int, now_us: float
    ) -> tuple[float, LimitState]:
        """Now if the counter's window has room and has begun, else the next window."""
        counter = fixed_window_now(cast(FixedWindow | None, state), now_us, limit.size)
        full = counter.used + float(permits) > limit.rate
        window = counter.window + 1.0 if full else counter.window
        # the counter is not moved on: record does that, and a refusal keeps it
        return max(now_us, window * limit.size), counter

    def next_free_at(self, limit: Limit, state: LimitState, now_us: float) -> float:
        """The window the counter has room for one more permit in."""
        counter = fixed_window_now(cast(FixedWindow, state), now_us, limit.size)
        if counter.used + 1.0 > limit.rate:
            return (counter.window + 1.0) * limit.size
        return max(now_us, counter.window * limit.size)

    def record(self, limit: Limit, state: LimitState, n: float, at_us: float) -> LimitState:
        """Count the permits in the window that contains T."""
        counter = cast(FixedWindow, state)
        window = float(math.floor(at_us / limit.size))
        if window > counter.window:
            counter = FixedWindow(window, 0.0)
        return FixedWindow(counter.window, counter.used + n)

    def expiry_ms(self, limit: Limit, state: LimitState, now_us: float) -> int:
        """When the counter's window ends."""
        counter = cast(FixedWindow, state)
        ends_us = (counter.window + 1.0) * limit.size
        return math.ceil((ends_us - now_us) / 1000.0) + EXPIRY_GRACE_MS

    def left(self, limit: Limit, state: LimitState, cap: float, at_us: float) -> float:
        """``cap`` less the permits counted in the counter's window."""
        return max(0.0, cap - cast(FixedWindow, state).used)


class CalendarLimit(_Window):
    """A calendar quota: a fixed window whose windows are the periods of a calendar
    (``model/calendar.py``), so they may be 23, 24 or 25 hours, or 28 to 31 days.

    The deciding process computes, from its own clock, the start of the period before
    the current one, the current one's start and end, and the next one's end (b0..b3),
    and the script picks among them by the shared clock: a process whose clock is off by
    less than a whole period still counts in the period the shared clock is in. The
    counter is the start of the period holding reservations (µs) and its count; a
    pushback neither scales nor holds a quota's count (the call still goes no sooner
    than the hold's end)."""

    def limit(self, rate: int, period_s: int, capacity: int) -> Limit:
        """Without bounds: ``state.limit`` adds them for the moment of the decision, and
        a paced quota's burst as its size (0: not paced)."""
        return Limit(LimitKind.CALENDAR, float(rate), 0.0)

    def _counter(self, limit: Limit, state: LimitState | None, now_us: float) -> CalendarWindow:
        start = calendar_start(limit.bounds, now_us)
        counter = cast(CalendarWindow | None, state)
        if counter is None or counter.window < start:
            if limit.size > 0.0:  # paced: a new period starts with a full bucket
                return CalendarWindow(start, 0.0, limit.size, now_us)
            return CalendarWindow(start, 0.0)
        if limit.size > 0.0 and counter.stored < 0.0:  # a count kept without pacing
            return CalendarWindow(counter.window, counter.used, limit.size, now_us)
        return counter

    def _paced_now(self, limit: Limit, counter: CalendarWindow, now_us: float) -> CalendarWindow:
        """A paced counter's bucket brought up to ``now_us``: it has refilled at the
        pace its last decision set, the permits left over the time left of its period."""
        if not now_us > counter.balance:
            return counter
        return CalendarWindow(
            counter.window, counter.used, self._refilled(limit, counter, now_us), now_us
        )

    def _refilled(self, limit: Limit, counter: CalendarWindow, at_us: float) -> float:
        span = calendar_end(limit.bounds, counter.window) - counter.balance
        if span > 0.0:
            stored = counter.stored + (at_us - counter.balance) * (limit.rate - counter.used) / span
        else:  # its period is over
            stored = limit.size
        return limit.size if not stored < limit.size else stored

    def _paced_earliest(self, limit: Limit, counter: CalendarWindow, permits: float) -> float:
        """When a paced counter's bucket has ``permits`` (from its balance, at its pace),
        at the latest the end of its period (the next one starts with a full bucket)."""
        ends = calendar_end(limit.bounds, counter.window)
        spend = counter.stored if counter.stored < permits else permits
        paced = counter.balance + (permits - spend) * (ends - counter.balance) / (
            limit.rate - counter.used
        )
        return ends if paced > ends else paced

    def earliest(
        self, limit: Limit, state: LimitState | None, permits: int, now_us: float
    ) -> tuple[float, LimitState]:
        """Now if the counter's period has room and has begun, else the next period."""
        counter = self._counter(limit, state, now_us)
        if counter.used + float(permits) > limit.rate:
            return max(now_us, calendar_end(limit.bounds, counter.window)), counter
        if limit.size > 0.0:  # paced: also once its bucket has the permits
            counter = self._paced_now(limit, counter, now_us)
            paced = self._paced_earliest(limit, counter, float(permits))
            return max(now_us, counter.window, paced), counter
        return max(now_us, counter.window), counter

    def next_free_at(self, limit: Limit, state: LimitState, now_us: float) -> float:
        """The period the counter has room for one more permit in (paced: once its bucket
        has one); no later than the end of the next period (b3) while the clock is
        before it: past it the period's end is a guess, and this a moment before which
        no call can go."""
        counter = self._counter(limit, state, now_us)
        if counter.used + 1.0 > limit.rate:
            free = calendar_end(limit.bounds, counter.window)
        elif limit.size > 0.0:
            free = max(now_us, counter.window, self._paced_earliest(limit, counter, 1.0))
        else:
            free = max(now_us, counter.window)
        b3 = limit.bounds[3]
        return b3 if free > b3 > now_us else free

    def record(self, limit: Limit, state: LimitState, n: float, at_us: float) -> LimitState:
        """Count the permits in the period that contains T (paced: and take them from
        the bucket, refilled up to T; a new period's bucket is full)."""
        counter = cast(CalendarWindow, state)
        window = calendar_start(limit.bounds, at_us)
        if limit.size <= 0.0:
            if window > counter.window:
                counter = CalendarWindow(window, 0.0)
            return CalendarWindow(counter.window, counter.used + n)
        if window > counter.window:
            counter = CalendarWindow(window, 0.0, limit.size, at_us)
        elif at_us > counter.balance:
            counter = CalendarWindow(
                counter.window, counter.used, self._refilled(limit, counter, at_us), at_us
            )
        stored = counter.stored - n
        return CalendarWindow(
            counter.window, counter.used + n, stored if stored > 0.0 else 0.0, counter.balance
        )

    def expiry_ms(self, limit: Limit, state: LimitState, now_us: float) -> int:
        """When the counter's period ends; from b3 on, whose end is a guess, twice the
        length of the period before it past its start (no period is longer)."""
        window = cast(CalendarWindow, state).window
        _, _, b2, b3 = limit.bounds
        ends_us = window + 2.0 * (b3 - b2) if window >= b3 else calendar_end(limit.bounds, window)
        return max(EXPIRY_GRACE_MS, math.ceil((ends_us - now_us) / 1000.0) + EXPIRY_GRACE_MS)

    def left(self, limit: Limit, state: LimitState, cap: float, at_us: float) -> float:
        """None counted here: a quota's count is told apart (``period_left``), so the
        least permits left stay the interface's rate limits'."""
        return math.inf

    def period_left(
        self, limit: Limit, state: LimitState | None, now_us: float
    ) -> tuple[float, float]:
        """The permits left in the period the shared clock is in, and when it ends (µs):
        none while reservations already fill it into the next one."""
        start = calendar_start(limit.bounds, now_us)
        ends = calendar_end(limit.bounds, start)
        counter = cast(CalendarWindow | None, state)
        if counter is None or counter.window < start:
            return limit.rate, ends
        if counter.window > start:
            return 0.0, ends
        return max(0.0, limit.rate - counter.used), ends


#: Each kind of limit's model.
LIMIT_MODELS: dict[LimitKind, LimitModel] = {
    LimitKind.TOKEN_BUCKET: BucketLimit(),
    LimitKind.SLIDING_WINDOW: SlidingLimit(),
    LimitKind.FIXED_WINDOW: FixedLimit(),
    LimitKind.CALENDAR: CalendarLimit(),
}
_CALENDAR = CalendarLimit()


def quota_left(
    limits: Sequence[Limit], states: Sequence[LimitState | None], now_us: float
) -> tuple[float, float, float]:
    """The calendar quota with the fewest permits left after a decision: (left, the end
    of its period, µs, its permits per period); (-1, 0, 0) when no limit is a calendar
    quota. On a tie, the later end (it binds longer)."""
    best = (-1.0, 0.0, 0.0)
    for limit, state in zip(limits, states, strict=True):
        if limit.kind is LimitKind.CALENDAR:
            left, ends = _CALENDAR.period_left(limit, state, now_us)
            if best[0] < 0 or left < best[0] or (left == best[0] and ends > best[1]):
                best = (left, ends, limit.rate)
    return best


# --- several limits at once (limits.lua) -------------------------------------------------


#: Kinds whose count a pushback's factor does not cap (a bucket scales its rate instead).
_NOT_CAPPED = frozenset({LimitKind.TOKEN_BUCKET, LimitKind.CALENDAR})


def reserve_limits(
    limits: Sequence[Limit],
    states: Sequence[LimitState | None],
    permits: int,
    timeout_us: float | None,
    now_us: float,
    factor: float = 1.0,
    until_us: float = 0.0,
    own: int | None = None,
    shares: Sequence[float] | None = None,
) -> tuple[Verdict, tuple[LimitState, ...] | None]:
    """Decide ``permits`` against every limit at once, all or nothing.

    Returns the verdict and each limit's new state (None on refusal: nothing is
    written). ``wait_us`` is until the latest of the limits' earliest times; ``stored``
    is the least permits any limit has left (``_least_left``); ``next_free_us`` the
    latest of the limits' earliest times for one permit, after the decision (a call
    goes when every limit lets it). A window that can never hold ``permits`` refuses
    with an infinite wait (and ``next_free_us`` 0: not every limit was read). So does a
    calendar quota that can never give them (``calendar_most``: more than its permits
    per period, or than a paced one's burst), every limit read as for any refusal, and
    the quota figures then are that quota's: it is the limit that binds.

    Pushback (``model/pushback.py``): token buckets run at ``factor`` times their rate
    and capacity, windows admit at most ``window_limit`` of their rate per window, and no
    call goes before ``until_us``.

    Capacity shares: only the first ``own`` limits (None: all) are the interface's;
    the rest are its channel's, shared with other interfaces, so the pushback neither
    slows them nor makes them owe until ``until_us`` (the call still goes no sooner).

    Priority classes (``model/priority.py``): ``shares`` (None: none in play) is each
    limit's share for a call of a class below ``critical``. Such a call goes now,
    leaving every limit its share (``reserve_ready``), or is refused with the wait
    until it could (``reserved`` unless the limits alone refuse it), recording nothing;
    a call the class can never get (``reserve_ready`` infinite) is refused ``reserved``
    with an infinite wait, whatever the limits alone would say.
    """
    own = len(limits) if own is None else own
    capped = limits
    if factor != 1.0:
        limits = [
            Limit(x.kind, x.rate * factor, x.size * factor)
            if x.kind is LimitKind.TOKEN_BUCKET and i < own
            else x
            for i, x in enumerate(limits)
        ]
        # A window counts at most its slowed limit (step 1 only: next free and the trim
        # keep its own rate, since the factor only recovers).
        capped = [
            x
            if x.kind in _NOT_CAPPED or permits > x.rate or i >= own
            else Limit(x.kind, window_limit(x.rate, factor, permits), x.size)
            for i, x in enumerate(limits)
        ]
    held_us = until_us - now_us if until_us > now_us else 0.0
    at_us = max(now_us, until_us)
    current: list[LimitState] = []
    never: int | None = None  # the first calendar quota that can never give the permits
    beyond = False  # a calendar quota would let it go only past the periods it knows
    horizon = math.inf  # the earliest b3 of the calendar quotas: no T past it but now
    for i, (limit, state) in enumerate(zip(capped, states, strict=True)):
        if limit.kind is LimitKind.CALENDAR:
            if never is None and permits > calendar_most(limit):
                never = i  # refused, and its figures told: read on
        elif permits > limit.rate and limit.kind in WINDOW_KINDS:  # more than it ever holds
            # the factor as limits.lua has it there: a channel's is 1
            return Verdict(False, math.inf, 0.0, 0.0, factor if i < own else 1.0, held_us), None
        model = LIMIT_MODELS[limit.kind]
        # the interface's own limits owe until a hold's end; its channel's do not
        owing = model.held(limit, state, now_us, until_us) if until_us > 0.0 and i < own else state
        earliest_us, as_of_now = model.earliest(limit, owing, permits, now_us)
        if limit.kind is LimitKind.CALENDAR:
            horizon = min(horizon, limit.bounds[3])
            past, earliest_us = calendar_beyond(limit, earliest_us, now_us)
            beyond = beyond or past
        current.append(as_of_now)
        at_us = max(at_us, earliest_us)
    wait_us = at_us - now_us
    limited = timeout_us is not None and wait_us > timeout_us
    # past the periods a quota knows: refused whatever the budget (calendar_beyond)
    limited = limited or beyond or (at_us > horizon and at_us > now_us)
    if never is not None:  # no wait would ever do: refused, that quota's figures told
        next_us = _next_free_us(limits, current, now_us, until_us)
        left = _least_left(limits, current, now_us, factor, own)
        binds = limits[never]
        quota_now, ends_us = _CALENDAR.period_left(binds, current[never], now_us)
        verdict = Verdict(False, math.inf, left, next_us, factor, held_us, quota_now, ends_us)
        return verdict._replace(quota_limit=binds.rate), None
    if shares is not None:
        ready_us = at_us
        for limit, state, share in zip(capped, current, shares, strict=True):
            ready_us = max(ready_us, reserve_ready(limit, state, permits, share, now_us))
        if ready_us > now_us:
            # the class never gets it: reserved, whatever the wait (no wait would do)
            if ready_us == math.inf:
                limited = False
            next_us = _next_free_us(limits, current, now_us, until_us)
            left = _least_left(limits, current, now_us, factor, own)
            quota = quota_left(limits, current, now_us)
            verdict = Verdict(False, ready_us - now_us, left, next_us, factor, held_us, *quota)
            return verdict._replace(reserved=not limited), None
    if limited:
        next_us = _next_free_us(limits, current, now_us, until_us)
        left = _least_left(limits, current, now_us, factor, own)
        quota = quota_left(limits, current, now_us)
        return Verdict(False, wait_us, left, next_us, factor, held_us, *quota), None
    n = float(permits)
    new = tuple(
        LIMIT_MODELS[limit.kind].record(limit, state, n, at_us)
        for limit, state in zip(limits, current, strict=True)
    )
    next_us = _next_free_us(limits, new, now_us, until_us)
    left = _least_left(limits, new, at_us, factor, own)
    quota = quota_left(limits, new, now_us)
    return Verdict(True, wait_us, left, next_us, factor, held_us, *quota), new


def reserve_ready(
    limit: Limit, state: LimitState, permits: int, share: float, now_us: float
) -> float:
    """The earliest time ``limit`` (a window's count capped by a pushback) could give
    ``permits`` and still have ``share`` of its capacity left, from ``state`` as of
    ``now_us``; infinite when it never could. A bucket: once it stores the permits and
    the share; a window: once it counts no more than the permits leave of its limit
    less the share (whole permits). A calendar quota keeps no reserve.

    A bucket with no share still never gives more permits at once than it holds, and
    such a call takes no debt: infinite, as a window's more than it ever holds."""
    if limit.kind is LimitKind.CALENDAR:
        return now_us
    if limit.kind is LimitKind.TOKEN_BUCKET:
        bucket = cast(BucketState, state)
        need = permits + share * limit.size
        if need > limit.size:
            return math.inf
        if share <= 0.0:
            return now_us
        return bucket.balance_us + max(0.0, need - bucket.stored) * (US_PER_S / limit.rate)
    if share <= 0.0:
        return now_us
    most = math.floor(limit.rate - share * limit.rate)
    if permits > most:
        return math.inf
    if limit.kind is LimitKind.SLIDING_WINDOW:
        log = cast(SlidingLog, state)
        need = log.total + permits - most
        return log.nth(need) + limit.size if need > 0 else now_us
    counter = cast(FixedWindow, state)
    if counter.used + permits > most:
        return (counter.window + 1.0) * limit.size
    return now_us


def _next_free_us(
    limits: Sequence[Limit], states: Sequence[LimitState], now_us: float, until_us: float
) -> float:
    """Microseconds from ``now_us`` before which no call can go: the latest of each
    limit's earliest time for one permit, and a pushback's moment."""
    at_us = max(now_us, until_us)
    for limit, state in zip(limits, states, strict=True):
        at_us = max(at_us, LIMIT_MODELS[limit.kind].next_free_at(limit, state, now_us))
    return at_us - now_us


def _least_left(
    limits: Sequence[Limit], states: Sequence[LimitState], at_us: float, factor: float, own: int
) -> float:
    """The permits the limit that binds has left: the least of a bucket's stored permits
    and a window's count (slowed by a pushback's ``factor``, on the interface's own
    limits) less what its window holds at ``at_us`` (the call's T; now when refused)."""
    least = math.inf
    for i, (limit, state) in enumerate(zip(limits, states, strict=True)):
        cap = window_limit(limit.rate, factor) if i < own else limit.rate
        least = min(least, LIMIT_MODELS[limit.kind].left(limit, state, cap, at_us))
    return 0.0 if least == math.inf else least


def limit_expiry_ms(limit: Limit, state: LimitState, now_us: float) -> int:
    """Milliseconds after which ``state`` of ``limit`` is the same as no state."""
    return LIMIT_MODELS[limit.kind].expiry_ms(limit, state, now_us)


class WindowCount(NamedTuple):
    """A sliding or fixed window as it counts at a moment (``window_count``)."""

    #: the permits it holds
    used: float
    #: when its count is back to 0, µs (None: it holds none)
    reset_us: float | None
    #: when one permit could go (a pushback's factor counted, its hold not), µs
    next_free_us: float


def window_count(
    limit: Limit, state: LimitState | None, factor: float, now_us: float
) -> WindowCount:
    """``limit``'s window (sliding or fixed) as it counts at ``now_us`` from ``state``
    (None: nothing stored), its rate lowered by a pushback's ``factor``."""
    capped = Limit(limit.kind, window_limit(limit.rate, factor), limit.size)
    counted: LimitState
    if limit.kind is LimitKind.FIXED_WINDOW:
        fixed = state if isinstance(state, FixedWindow) else None
        counter = fixed_window_now(fixed, now_us, limit.size)
        used = counter.used
        reset_us = (counter.window + 1.0) * limit.size if used else None
        counted = counter
    else:
        log = state if isinstance(state, SlidingLog) else SlidingLog((), (), 0)
        live = [
            (t, c) for t, c in zip(log.times, log.counts, strict=True) if t + limit.size > now_us
        ]
        used = float(sum(c for _, c in live))
        reset_us = live[-1][0] + limit.size if live else None
        counted = log
    return WindowCount(
        used, reset_us, LIMIT_MODELS[limit.kind].next_free_at(capped, counted, now_us)
    )
