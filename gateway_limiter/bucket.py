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

Every number is a double in the same order of operations as the Lua script, so the
model and the script agree exactly (the property tests check this against a real Redis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

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
    (A named tuple: it is built on every decision, and that costs a third of a frozen
    dataclass.)
    """

    allowed: bool
    wait: float
    stored: float


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
        return Verdict(False, wait, current.stored), None
    stored = current.stored - spend
    return Verdict(True, wait, stored), BucketState(
        stored, balance, sh.rate, sh.capacity, sh.refill
    )


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
        return Verdict(False, math.inf, 0.0), None
    at = now
    if times:
        at = max(at, times[-1])
    need = len(times) + permits - rate  # admissions that must have left the window
    if need > 0:
        at = max(at, times[need - 1] + WINDOW)
    wait = at - now
    if timeout is not None and wait > timeout:
        return Verdict(False, wait, 0.0), None
    kept = (*times, *([at] * permits))[-rate:]
    return Verdict(True, wait, 0.0), kept


def window_expiry_ms(times: tuple[float, ...], now: float) -> int:
    """Milliseconds after which the window's times no longer matter."""
    return math.ceil((times[-1] + WINDOW - now) / 1000.0) + EXPIRY_GRACE_MS
