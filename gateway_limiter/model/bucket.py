"""The bucket and warm-up, as a pure-Python reference model: ``backends/bucket.lua``.

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

Periods: a row allows ``rateLimit`` permits per ``periodSeconds`` P, so a token bucket
refills at ``rateLimit / P`` per second and holds ``rateLimit`` (one period's worth)
unless ``maxPermits`` says otherwise. The windows, and several limits decided at once
(``limits.lua``), are in ``model/limits.py``.

The two shapes of bucket are two small classes, as Guava's SmoothBursty and
SmoothWarmingUp: ``TokenBucket`` and ``WarmingUp`` differ only in their capacity and
refill (from the row, or from the warm-up period) and in what stored permits cost
(``stored_cost_us``), hence in what a one-permit call still owes (``owed_us``).

Every number is a double in the same order of operations as ``bucket.lua``, so the
model and the script agree exactly (the property tests check this against a real
Redis). Times and durations are microseconds (``_us``) on the shared clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

#: Microseconds in a second: times here are µs, settings and rows say seconds.
US_PER_S = 1_000_000.0
#: A key outlives the moment its bucket would be full again by this much.
EXPIRY_GRACE_MS = 1000
#: Warm-up: a stored permit of a full (cold) bucket costs this many stable intervals.
COLD_FACTOR = 3.0


@dataclass(frozen=True, slots=True)
class BucketState:
    """The shared state of one bucket, with the config it was built with."""

    stored: float
    balance_us: float  # on the shared clock
    rate: float
    capacity: float
    refill_us: float = 0.0  # per stored permit while idle (0: the stable interval)

    @property
    def refill_interval_us(self) -> float:
        """Microseconds per stored permit while idle."""
        return self.refill_us or US_PER_S / self.rate


class Verdict(NamedTuple):
    """The outcome of one decision.

    ``wait_us``: how long the caller sleeps when ``allowed``, and how long it would have
    had to wait when refused. ``stored`` is what is left after it. ``next_free_us``
    (from the decision's ``now``; the asyncio Redis backend counts from when the call
    was handed to it, which is no later) is the earliest moment any further call of the
    interface could go, whatever its permits and however many callers come meanwhile:
    only time passing brings it closer (see ``next_free_bucket``). Until then, a caller
    whose timeout cannot reach it would be refused: the limiter refuses it in-process,
    with no round trip. (A named tuple: it is built on every decision, and that costs a
    third of a frozen dataclass.) ``factor``: the effective rate as a fraction of the
    row's, what pushbacks left of it (1: none); ``held_us``: how much longer a
    pushback's ``retry_after`` holds every call back (0: none).
    """

    allowed: bool
    wait_us: float
    stored: float
    next_free_us: float = 0.0
    #: The effective rate as a fraction of the row's, after pushbacks (model/pushback.py).
    factor: float = 1.0
    #: µs from the decision's ``now`` until a pushback's ``retry_after`` ends (0: no hold).
    held_us: float = 0.0
    #: Calendar quotas (``model/limits.py``, ``CalendarLimit``): the permits left in the
    #: current period of the one with the fewest left (-1: the interface has none), and
    #: when that period ends (epoch µs on the shared clock), and its permits per period.
    quota_left: float = -1.0
    quota_reset_us: float = 0.0
    quota_limit: float = 0.0
    #: Priority classes (``model/priority.py``): refused for want of a reserve (the
    #: limits alone would have admitted the call within its budget).
    reserved: bool = False
    #: µs a call of a class below critical already slept re-checking before this
    #: decision admitted it (``LimiterCore._rechecking``): part of ``Decision.waited``,
    #: never slept again.
    slept_us: float = 0.0


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """A token bucket (Guava's SmoothBursty): stored permits are free."""

    rate: float  # permits per second
    capacity: float  # most permits saved up

    @property
    def stable_us(self) -> float:
        """Microseconds per permit at the full rate."""
        return US_PER_S / self.rate

    @property
    def refill_us(self) -> float:
        """Microseconds per stored permit while idle: the stable interval."""
        return US_PER_S / self.rate

    @property
    def threshold(self) -> float:
        """Stored permits above this cost more than the stable interval: none do."""
        return self.capacity

    def stored_cost_us(self, stored: float, take: float) -> float:
        """What taking ``take`` of ``stored`` permits costs: nothing."""
        return 0.0

    def owed_us(self, stored: float) -> float:
        """What a one-permit call owes beyond the balance time: what ``stored`` lacks of
        one permit, at the stable interval."""
        return max(0.0, 1.0 - stored) * self.stable_us


@dataclass(frozen=True, slots=True)
class WarmingUp:
    """A warm-up bucket (Guava's SmoothWarmingUp): stored permits cost time, the more
    the fuller the bucket. Build it with ``WarmingUp.of``."""

    rate: float  # permits per second
    capacity: float  # from the rate and the warm-up period
    refill_us: float  # per stored permit while idle
    threshold: float  # stored permits above this cost more than ``stable_us``
    slope_us: float  # extra µs per stored permit, per stored permit above the threshold

    @classmethod
    def of(cls, rate: float, warmup_us: float) -> WarmingUp:
        """The warm-up bucket of ``rate`` permits/s, cold to full rate in ``warmup_us``."""
        stable_us = US_PER_S / rate
        cold_us = stable_us * COLD_FACTOR
        threshold = 0.5 * warmup_us / stable_us
        capacity = threshold + 2.0 * warmup_us / (stable_us + cold_us)
        slope_us = (cold_us - stable_us) / (capacity - threshold)
        return cls(rate, capacity, warmup_us / capacity, threshold, slope_us)

    @property
    def stable_us(self) -> float:
        """Microseconds per permit at the full rate."""
        return US_PER_S / self.rate

    def stored_cost_us(self, stored: float, take: float) -> float:
        """What taking ``take`` of ``stored`` permits costs: the area under the cost line
        (a trapezoid above the threshold, the stable interval below it)."""
        stable_us, cost_us = self.stable_us, 0.0
        above = stored - self.threshold
        if above > 0:
            part = min(above, take)
            length_us = (stable_us + above * self.slope_us) + (
                stable_us + (above - part) * self.slope_us
            )
            cost_us = part * length_us / 2.0
            take = take - part
        return cost_us + stable_us * take

    def owed_us(self, stored: float) -> float:
        """What a one-permit call owes beyond the balance time: every permit, stored or
        not, costs at least the stable interval."""
        return self.stable_us


#: A bucket's config as numbers: capacity, refill, and what stored permits cost.
Shape: TypeAlias = TokenBucket | WarmingUp


def shape(rate: float, capacity: float, warmup_us: float = 0.0) -> Shape:
    """A token bucket (``warmup_us`` 0; ``capacity`` from the row) or a warm-up bucket."""
    if warmup_us <= 0:
        return TokenBucket(float(rate), float(capacity))
    return WarmingUp.of(float(rate), warmup_us)


def fresh(sh: Shape, now_us: float) -> BucketState:
    """The state of a bucket nobody has used for long: full, in balance."""
    return BucketState(sh.capacity, now_us, sh.rate, sh.capacity, sh.refill_us)


def held(state: BucketState | None, sh: Shape, now_us: float, until_us: float) -> BucketState:
    """The state to decide from, after a pushback's hold until ``until_us`` (0: none).

    A hold drains the bucket: it is empty at the hold's end and refills from there, so
    the permits saved before it do not burst out the moment it ends, at a supplier
    that has just said to stop. Until a decision absorbs the hold (writes a balance
    time at or past its end), a stored balance before ``until_us`` means the hold came
    after it. A bucket with no state (full, left alone) counts as drained at the hold's
    end too: if it had absorbed the hold and then filled up and expired, the time since
    the hold has refilled it completely anyway.
    """
    current = fresh(sh, now_us) if state is None else state
    if until_us > 0 and (state is None or current.balance_us < until_us):
        current = BucketState(0.0, until_us, current.rate, current.capacity, current.refill_us)
    return current


def resync(state: BucketState, now_us: float) -> BucketState:
    """Bring stored permits up to ``now_us`` at the state's own refill rate."""
    if now_us <= state.balance_us:
        return state
    refilled = (now_us - state.balance_us) / state.refill_interval_us
    stored = min(state.capacity, state.stored + refilled)
    return BucketState(stored, now_us, state.rate, state.capacity, state.refill_us)


def reconfigure(state: BucketState, sh: Shape) -> BucketState:
    """Adopt a new config: rescale stored permits, keep the debt (balance)."""
    old = (state.rate, state.capacity, state.refill_interval_us)
    if old == (sh.rate, sh.capacity, sh.refill_us):
        return state
    stored = state.stored * sh.capacity / state.capacity if state.capacity > 0 else sh.capacity
    return BucketState(stored, state.balance_us, sh.rate, sh.capacity, sh.refill_us)


def reserve(
    state: BucketState | None,
    rate: float,
    capacity: float,
    permits: float,
    timeout_us: float | None,
    now_us: float,
    warmup_us: float = 0.0,
    factor: float = 1.0,
    until_us: float = 0.0,
    share: float | None = None,
) -> tuple[Verdict, BucketState | None]:
    """Decide a reservation of ``permits`` with a wait budget of ``timeout_us``.

    ``timeout_us=None`` means wait as long as it takes (``acquire``); ``warmup_us`` > 0
    makes it a warm-up bucket. Returns the verdict and the state to store, or None when
    nothing must be written (a refusal).

    Pushback (``model/pushback.py``): the bucket runs at ``factor`` times the row's
    rate and capacity, and no call goes before ``until_us`` (see ``held``).

    ``share`` (priority classes, ``model/priority.py``; None: none in play): a call of
    a class below ``critical`` on a bucket with a reserve goes now, leaving at least
    ``share`` of the capacity stored, or is refused (``reserved`` unless the bucket
    alone refuses it) with the wait until it could, reserving nothing. A call the
    class can never get (more than the capacity less the share: it takes no debt) is
    refused ``reserved`` with an infinite wait, whatever the bucket alone would say.
    """
    sh = shape(rate * factor, capacity * factor, warmup_us)
    permits = float(permits)
    current = reconfigure(resync(held(state, sh, now_us, until_us), now_us), sh)
    spend = min(permits, current.stored)
    shortfall = permits - spend
    cost_us = sh.stored_cost_us(current.stored, spend) + shortfall * sh.stable_us
    balance_us = max(current.balance_us, now_us) + cost_us
    wait_us = balance_us - now_us
    held_us = until_us - now_us if until_us > now_us else 0.0
    if share is not None:
        need = permits + share * sh.capacity
        ready_us = math.inf
        if need <= sh.capacity:
            ready_us = max(current.balance_us, now_us) + max(0.0, need - current.stored) * (
                sh.stable_us
            )
        if ready_us > now_us:
            # over the budget, unless the class never gets it: no wait would ever do,
            # and it is the class's limit (no debt, its share left) that refuses
            limited = timeout_us is not None and wait_us > timeout_us and ready_us < math.inf
            next_free_us = next_free_bucket(sh, current, now_us)
            verdict = Verdict(
                False, ready_us - now_us, current.stored, next_free_us, factor, held_us
            )
            return verdict._replace(reserved=not limited), None
    if timeout_us is not None and wait_us > timeout_us:
        next_free_us = next_free_bucket(sh, current, now_us)
        return Verdict(False, wait_us, current.stored, next_free_us, factor, held_us), None
    stored = current.stored - spend
    new = BucketState(stored, balance_us, sh.rate, sh.capacity, sh.refill_us)
    next_free_us = next_free_bucket(sh, new, now_us)
    return Verdict(True, wait_us, stored, next_free_us, factor, held_us), new


def next_free_bucket(sh: Shape, state: BucketState, now_us: float) -> float:
    """Microseconds from ``now_us`` before which no call of one or more permits can go,
    for ``state`` as it is after a decision at ``now_us`` (resynced, in ``sh``'s config).

    No call goes before the balance time B = max(balance, now). A one-permit call then
    still needs what ``stored`` (the permits B holds) lacks of one permit, at one stable
    interval each, and time only adds stored permits at exactly that pace: so for a
    token bucket no call goes before B + (1 - stored) intervals. In warm-up every
    permit, stored or not, costs at least one stable interval: B + 1 interval (see
    ``owed_us``). Other callers only move B later; only a config change (a rule change)
    could move it earlier, and the limiter forgets what it learnt on every rule change.
    """
    # in the order the wait is computed, as bucket.lua does
    return max(state.balance_us, now_us) + sh.owed_us(state.stored) - now_us


def expiry_ms(state: BucketState, now_us: float) -> int:
    """Milliseconds after which ``state`` is the same as no state (the bucket is full)."""
    missing = state.capacity - state.stored
    full_at_us = max(state.balance_us, now_us) + missing * state.refill_interval_us
    return math.ceil((full_at_us - now_us) / 1000.0) + EXPIRY_GRACE_MS
