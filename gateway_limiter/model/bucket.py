"""The bucket, as a pure-Python reference model. ``backends/bucket.lua`` is the same model.

How the bucket works
====================

Config lives in each process (from the row): a rate ``r`` permits per second, so one
permit every ``interval = 1e6 / r`` microseconds, and a capacity ``C`` (default ``r``):
the most permits the bucket can save up while nobody asks.

State is shared (a Redis hash, or a dict in ``memory://``), and is two numbers:

- ``stored``: permits saved up, between 0 and C;
- ``balance``: the time (microseconds on the shared clock) at which the bucket is next
  *in balance*, i.e. owes no permits. ``balance <= now`` means nothing is owed.

Between calls, time refills the bucket: once ``now`` is past ``balance``, every
``interval`` that has elapsed adds one stored permit, up to C, and ``balance`` moves
to ``now`` (the *resync*).

A reservation of ``n`` permits spends stored permits first. Whatever stored permits
cannot cover (the *shortfall*) becomes debt: ``balance`` moves forward by
``shortfall * interval``, and the caller waits until that new balance time.

Why the caller waits for its *own* permits: a permit is a promise that the supplier
sees no more than ``r`` calls a second beyond the capacity. Guava lets a request go at
once and makes the *next* one pay for it; here the request that creates the debt is
the one that waits for it, so the admitted total can never run ahead of
``C + r * elapsed``, however callers arrive. Later callers queue behind that debt:
their shortfall is added after the current balance time.

``try_acquire`` asks "would the wait be within my timeout?". If yes, the reservation
is made and the caller sleeps for the wait; if no, the caller is refused at once and
nothing is reserved (the state is not even written). ``acquire`` has no timeout.

A rate change must not reset the bucket: the state remembers the config it was built
with. When the caller's config differs, stored permits are first brought up to date
at the old config, then rescaled in proportion to the new capacity (half full stays
half full); the balance time (queued debt) stays as it is.

State that is missing (never made, expired, Redis flushed) is the state of a bucket
left alone for long: full (``stored = C``) and in balance. That is also why a key may
expire once the bucket would have refilled: from then on, the stored state and no
state mean the same thing.

Warm-up (``warm_up``, Guava's SmoothWarmingUp, cold factor 3)
--------------------------------------------------------------
The same bucket, with one change: a stored permit is not free, it *costs time*, and
the fuller the bucket (the longer it was idle, the colder the supplier's caches), the
more. Below a threshold of stored permits each costs the stable interval; above it the
cost grows linearly up to three stable intervals at a full bucket, and taking several
stored permits costs the area under that line (a trapezoid). Idle time refills stored
permits so that an empty bucket is full (cold) again after ``warmupPeriod``. So a cold
interface is served at a third of the rate and ramps up to the full rate as the stored
permits are used up, over ``warmupPeriod``; a warm one is paced at exactly the rate,
with no burst. The numbers, all from the rate and the warm-up period W::

    stable    = 1e6 / r                      cold = 3 * stable
    threshold = 0.5 * W / stable             capacity = threshold + 2 * W / (stable + cold)
    slope     = (cold - stable) / (capacity - threshold)
    refill    = W / capacity                 (microseconds per stored permit when idle)

Sliding window (``sliding_window``)
-----------------------------------
Not a bucket: the state is the times of the last ``r`` admissions, oldest first. A
call of ``n`` permits is placed at the earliest time ``t >= now``, and not before the
latest admission (callers keep their order), such that no window of one second
ending at ``t`` holds more than ``r`` admissions with it: when ``n`` more would
exceed ``r``, ``t`` is at least one window after the admission that must drop out. The
caller waits until ``t`` if that is within its timeout, and is refused at once
otherwise. The window is one second plus ``WINDOW_GUARD`` so that the few
milliseconds by which a sleeping caller wakes late never put ``r + 1`` calls into
one real second. Memory is bounded by ``r`` times per interface.

Periods
-------
A row allows ``rateLimit`` permits per ``periodSeconds`` P. A token bucket then refills
at ``rateLimit / P`` per second and holds ``rateLimit`` (one period's worth) unless
``maxPermits`` says otherwise; a sliding window is P seconds (plus the guard) long.

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

Several limits at once
----------------------
An interface with several limits (different periods, or shared and per caller)
admits a call only when every limit admits it, all or nothing (``decide_limits``):

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

Every number is a double in the same order of operations as the Lua scripts, so the
model and the scripts agree exactly (the property tests check this against a real
Redis). ``decide`` is ``bucket.lua``; ``decide_limits`` is ``limits.lua``, which also
serves the single windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias, cast

MICROS = 1_000_000.0
#: A key outlives the moment its bucket would be full again by this much.
EXPIRY_GRACE_MS = 1000
COLD_FACTOR = 3.0
#: The sliding window is one second plus this (microseconds), for wake-up jitter.
WINDOW_GUARD = 10_000.0
WINDOW = MICROS + WINDOW_GUARD


@dataclass(frozen=True, slots=True)
class BucketState:
    """The shared state of one bucket, with the config it was built with."""

    stored: float
    balance: float  # microseconds on the shared clock
    rate: float
    capacity: float
    refill: float = 0.0  # µs per stored permit while idle (0: the stable interval)

    @property
    def refill_interval(self) -> float:
        """Microseconds per stored permit while idle."""
        return self.refill or MICROS / self.rate


class Verdict(NamedTuple):
    """The outcome of one decision.

    ``wait`` is in microseconds: how long the caller sleeps when ``allowed``, and how
    long it would have had to wait when refused. ``stored`` is what is left after it.
    ``next_free`` (µs from the decision's ``now``; the asyncio Redis backend counts from
    when the call was handed to it, which is no later) is the earliest moment any
    further call of the interface could go, whatever its permits and however many
    callers come meanwhile: only time passing brings it closer (see ``next_free_bucket``).
    Until then, a caller whose timeout cannot reach it would be refused: the limiter
    refuses it in-process, with no round trip. (A named tuple: it is built on every
    decision, and that costs a third of a frozen dataclass.)
    """

    allowed: bool
    wait: float
    stored: float
    next_free: float = 0.0


@dataclass(frozen=True, slots=True)
class Shape:
    """A bucket's config as numbers: capacity, refill, and what stored permits cost."""

    rate: float
    capacity: float
    refill: float  # µs per stored permit while idle
    threshold: float  # warm-up: stored permits above this cost more than ``stable``
    slope: float  # warm-up: extra µs per stored permit above the threshold
    warm: bool  # True: stored permits cost time (warm-up); False: they are free

    @property
    def stable(self) -> float:
        """Microseconds per permit at the full rate."""
        return MICROS / self.rate


def shape(rate: float, capacity: float, warmup: float = 0.0) -> Shape:
    """The shape of a token bucket (``warmup`` 0) or of a warm-up bucket (``warmup`` µs)."""
    rate, capacity = float(rate), float(capacity)
    stable = MICROS / rate
    if warmup <= 0:
        return Shape(rate, capacity, stable, capacity, 0.0, False)
    cold = stable * COLD_FACTOR
    threshold = 0.5 * warmup / stable
    capacity = threshold + 2.0 * warmup / (stable + cold)
    slope = (cold - stable) / (capacity - threshold)
    return Shape(rate, capacity, warmup / capacity, threshold, slope, True)


def stored_cost(sh: Shape, stored: float, take: float) -> float:
    """Microseconds that taking ``take`` of ``stored`` permits costs (0 for a token bucket)."""
    if not sh.warm:
        return 0.0
    micros = 0.0
    above = stored - sh.threshold
    if above > 0:
        part = min(above, take)
        length = (sh.stable + above * sh.slope) + (sh.stable + (above - part) * sh.slope)
        micros = part * length / 2.0
        take = take - part
    return micros + sh.stable * take


def fresh(sh: Shape, now: float) -> BucketState:
    """The state of a bucket nobody has used for long: full, in balance."""
    return BucketState(sh.capacity, now, sh.rate, sh.capacity, sh.refill)


def resync(state: BucketState, now: float) -> BucketState:
    """Bring stored permits up to ``now`` at the state's own refill rate."""
    if now <= state.balance:
        return state
    stored = min(state.capacity, state.stored + (now - state.balance) / state.refill_interval)
    return BucketState(stored, now, state.rate, state.capacity, state.refill)


def reconfigure(state: BucketState, sh: Shape) -> BucketState:
    """Adopt a new config: rescale stored permits, keep the debt (balance)."""
    if (state.rate, state.capacity, state.refill_interval) == (sh.rate, sh.capacity, sh.refill):
        return state
    stored = state.stored * sh.capacity / state.capacity if state.capacity > 0 else sh.capacity
    return BucketState(stored, state.balance, sh.rate, sh.capacity, sh.refill)


def decide(
    state: BucketState | None,
    rate: float,
    capacity: float,
    permits: float,
    timeout: float | None,
    now: float,
    warmup: float = 0.0,
) -> tuple[Verdict, BucketState | None]:
    """Decide a reservation of ``permits`` with a wait budget of ``timeout`` microseconds.

    ``timeout=None`` means wait as long as it takes (``acquire``); ``warmup`` (µs) > 0
    makes it a warm-up bucket. Returns the verdict and the state to store, or None when
    nothing must be written (a refusal).
    """
    sh = shape(rate, capacity, warmup)
    permits = float(permits)
    current = fresh(sh, now) if state is None else state
    current = reconfigure(resync(current, now), sh)
    spend = min(permits, current.stored)
    shortfall = permits - spend
    cost = stored_cost(sh, current.stored, spend) + shortfall * sh.stable
    balance = max(current.balance, now) + cost
    wait = balance - now
    if timeout is not None and wait > timeout:
        return Verdict(False, wait, current.stored, next_free_bucket(sh, current, now)), None
    stored = current.stored - spend
    new = BucketState(stored, balance, sh.rate, sh.capacity, sh.refill)
    return Verdict(True, wait, stored, next_free_bucket(sh, new, now)), new


def next_free_bucket(sh: Shape, state: BucketState, now: float) -> float:
    """Microseconds from ``now`` before which no call of one or more permits can go,
    for ``state`` as it is after a decision at ``now`` (resynced, in ``sh``'s config).

    No call goes before the balance time B = max(balance, now). A one-permit call then
    still needs what ``stored`` (the permits B holds) lacks of one permit, at one stable
    interval each, and time only adds stored permits at exactly that pace: so for a
    token bucket no call goes before B + (1 - stored) intervals. In warm-up every
    permit, stored or not, costs at least one stable interval: B + 1 interval. Other
    callers only move B later; only a config change (a rule change) could move it
    earlier, and the limiter forgets what it learnt on every rule change.
    """
    owed = sh.stable if sh.warm else max(0.0, 1.0 - state.stored) * sh.stable
    return max(state.balance, now) + owed - now  # in the order the wait is computed


def expiry_ms(state: BucketState, now: float) -> int:
    """Milliseconds after which ``state`` is the same as no state (the bucket is full)."""
    full_at = max(state.balance, now) + (state.capacity - state.stored) * state.refill_interval
    return math.ceil((full_at - now) / 1000.0) + EXPIRY_GRACE_MS


def decide_window(
    times: tuple[float, ...],
    rate: int,
    permits: int,
    timeout: float | None,
    now: float,
) -> tuple[Verdict, tuple[float, ...] | None]:
    """Sliding window: place ``permits`` admissions at the earliest allowed time.

    ``times`` are the last admissions, oldest first (at most ``rate`` of them).
    Returns the verdict (``stored`` is 0: a window stores no permits) and the times to
    store, or None on refusal. ``permits > rate`` can never be placed.
    """
    if permits > rate:
        return Verdict(False, math.inf, 0.0), None  # next_free 0, as in limits.lua
    at = window_slot(times, rate, permits, now, WINDOW)
    wait = at - now
    if timeout is not None and wait > timeout:
        return Verdict(False, wait, 0.0, window_slot(times, rate, 1, now, WINDOW) - now), None
    kept = (*times, *([at] * permits))[-rate:]
    return Verdict(True, wait, 0.0, window_slot(kept, rate, 1, now, WINDOW) - now), kept


def window_expiry_ms(times: tuple[float, ...], now: float) -> int:
    """Milliseconds after which the window's times no longer matter."""
    return math.ceil((times[-1] + WINDOW - now) / 1000.0) + EXPIRY_GRACE_MS


def window_slot(
    times: tuple[float, ...], rate: int, permits: int, now: float, window: float
) -> float:
    """The earliest time >= ``now`` at which a sliding window can place ``permits`` more.

    For one permit, also a time before which no call can be placed later on: the
    window only fills up meanwhile, and an admission leaves it no sooner than this.
    """
    at = now
    if times:
        at = max(at, times[-1])
    need = len(times) + permits - rate  # admissions that must have left the window
    if need > 0:
        at = max(at, times[need - 1] + window)
    return at


# --- several limits at once (limits.lua) -------------------------------------------------

#: The kinds of state a limit keeps (also the last part of its key).
BUCKET = "tb"
SLIDING = "sw"
FIXED = "fw"


class Limit(NamedTuple):
    """One limit as ``limits.lua`` is told it."""

    kind: str  # BUCKET, SLIDING or FIXED
    rate: float  # BUCKET: permits per second; windows: permits per window
    size: float  # BUCKET: capacity; SLIDING: window length, µs; FIXED: period, µs


class FixedWindow(NamedTuple):
    """A fixed window's counter: the latest window holding reservations, and its count."""

    window: float  # k, for the window [k * period, (k + 1) * period)
    used: float  # permits reserved in it


#: The state of one limit: BUCKET, SLIDING (admission times, oldest first), FIXED.
LimitState: TypeAlias = BucketState | tuple[float, ...] | FixedWindow


def fixed_window_now(state: FixedWindow | None, now: float, period: float) -> FixedWindow:
    """The counter as of ``now``: the stored one, or an empty current window if it ended."""
    current = float(math.floor(now / period))
    if state is None or state.window < current:
        return FixedWindow(current, 0.0)
    return state


def decide_limits(
    limits: Sequence[Limit],
    states: Sequence[LimitState | None],
    permits: int,
    timeout: float | None,
    now: float,
) -> tuple[Verdict, tuple[LimitState, ...] | None]:
    """Decide ``permits`` against every limit at once, all or nothing.

    Returns the verdict and each limit's new state (None on refusal: nothing is
    written). ``wait`` is until the latest of the limits' earliest times; ``stored`` is
    the least any token bucket among them holds (0 without one); ``next_free`` the
    latest of the limits' earliest times for one permit, after the decision (a call
    goes when every limit lets it). A window that can never hold ``permits`` refuses
    with an infinite wait (and ``next_free`` 0: not every limit was read).
    """
    n = float(permits)
    at = now
    current: list[LimitState] = []
    for limit, state in zip(limits, states, strict=True):
        if limit.kind == BUCKET:
            sh = shape(limit.rate, limit.size)
            bucket = fresh(sh, now) if state is None else cast(BucketState, state)
            bucket = reconfigure(resync(bucket, now), sh)
            spend = min(n, bucket.stored)
            earliest = max(bucket.balance, now) + (n - spend) * sh.stable
            current.append(bucket)
        elif permits > limit.rate:
            return Verdict(False, math.inf, 0.0), None
        elif limit.kind == SLIDING:
            times = cast(tuple[float, ...], state or ())
            earliest = window_slot(times, int(limit.rate), permits, now, limit.size)
            current.append(times)
        else:
            counter = fixed_window_now(cast(FixedWindow | None, state), now, limit.size)
            window = counter.window + 1.0 if counter.used + n > limit.rate else counter.window
            earliest = max(now, window * limit.size)
            current.append(counter)  # not moved on: _record does that, and a refusal keeps it
        at = max(at, earliest)
    wait = at - now
    if timeout is not None and wait > timeout:
        return Verdict(False, wait, _least_stored(current), _next_free(limits, current, now)), None
    new = tuple(_record(limit, state, n, at) for limit, state in zip(limits, current, strict=True))
    return Verdict(True, wait, _least_stored(new), _next_free(limits, new, now)), new


def _next_free(limits: Sequence[Limit], states: Sequence[LimitState], now: float) -> float:
    """Microseconds from ``now`` before which no call can go: the latest of each limit's
    earliest time for one permit (``next_free_bucket``, ``window_slot``, or the
    window a fixed counter has room in)."""
    at = now
    for limit, state in zip(limits, states, strict=True):
        if limit.kind == BUCKET:
            bucket = cast(BucketState, state)
            owed = max(0.0, 1.0 - bucket.stored) * bucket.refill_interval
            earliest = max(bucket.balance, now) + owed
        elif limit.kind == SLIDING:
            times = cast(tuple[float, ...], state)
            earliest = window_slot(times, int(limit.rate), 1, now, limit.size)
        else:
            counter = fixed_window_now(cast(FixedWindow, state), now, limit.size)
            if counter.used + 1.0 > limit.rate:
                earliest = (counter.window + 1.0) * limit.size
            else:
                earliest = max(now, counter.window * limit.size)
        at = max(at, earliest)
    return at - now


def _record(limit: Limit, state: LimitState, n: float, at: float) -> LimitState:
    """``state`` after admitting ``n`` permits at ``at`` (a time the limit allows)."""
    if limit.kind == BUCKET:
        bucket = cast(BucketState, state)
        stored = bucket.stored
        if at > bucket.balance:
            stored = min(bucket.capacity, stored + (at - bucket.balance) / bucket.refill_interval)
        return BucketState(max(0.0, stored - n), at, bucket.rate, bucket.capacity, bucket.refill)
    if limit.kind == FIXED:
        counter = cast(FixedWindow, state)
        window = float(math.floor(at / limit.size))
        if window > counter.window:
            counter = FixedWindow(window, 0.0)
        return FixedWindow(counter.window, counter.used + n)
    times = cast(tuple[float, ...], state)
    return (*times, *([at] * int(n)))[-int(limit.rate) :]


def _least_stored(states: Sequence[LimitState]) -> float:
    least: float | None = None
    for state in states:
        if isinstance(state, BucketState) and (least is None or state.stored < least):
            least = state.stored
    return 0.0 if least is None else least


def limit_expiry_ms(limit: Limit, state: LimitState, now: float) -> int:
    """Milliseconds after which ``state`` of ``limit`` is the same as no state."""
    if limit.kind == BUCKET:
        return expiry_ms(cast(BucketState, state), now)
    if limit.kind == FIXED:
        counter = cast(FixedWindow, state)
        return math.ceil(((counter.window + 1.0) * limit.size - now) / 1000.0) + EXPIRY_GRACE_MS
    times = cast(tuple[float, ...], state)
    return math.ceil((times[-1] + limit.size - now) / 1000.0) + EXPIRY_GRACE_MS
