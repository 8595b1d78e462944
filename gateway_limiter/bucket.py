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

A rate change must not reset the bucket: the state remembers the rate and capacity it
was built with. When the caller's config differs, stored permits are first brought up
to date at the old rate, then rescaled in proportion to the new capacity (half full
stays half full); the balance time (queued debt) stays as it is.

State that is missing (never made, expired, Redis flushed) is the state of a bucket
left alone for long: full (``stored = C``) and in balance. That is also why a key may
expire once the bucket would have refilled: from then on, the stored state and no
state mean the same thing.

Every number is a double in the same order of operations as the Lua script, so the
model and the script agree exactly (the property tests check this against a real Redis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MICROS = 1_000_000.0
#: A key outlives the moment its bucket would be full again by this much.
EXPIRY_GRACE_MS = 1000


@dataclass(frozen=True, slots=True)
class BucketState:
    """The shared state of one bucket, with the config it was built with."""

    stored: float
    balance: float  # microseconds on the shared clock
    rate: float
    capacity: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one decision.

    ``wait`` is in microseconds: how long the caller sleeps when ``allowed``, and how
    long it would have had to wait when refused. ``stored`` is what is left after it.
    """

    allowed: bool
    wait: float
    stored: float


def fresh(rate: float, capacity: float, now: float) -> BucketState:
    """The state of a bucket nobody has used for long: full, in balance."""
    return BucketState(stored=capacity, balance=now, rate=rate, capacity=capacity)


def resync(state: BucketState, now: float) -> BucketState:
    """Bring stored permits up to ``now`` at the state's own rate."""
    if now <= state.balance:
        return state
    interval = MICROS / state.rate
    stored = min(state.capacity, state.stored + (now - state.balance) / interval)
    return BucketState(stored, now, state.rate, state.capacity)


def reconfigure(state: BucketState, rate: float, capacity: float) -> BucketState:
    """Adopt a new rate/capacity: rescale stored permits, keep the debt (balance)."""
    if state.rate == rate and state.capacity == capacity:
        return state
    stored = state.stored * capacity / state.capacity if state.capacity > 0 else capacity
    return BucketState(stored, state.balance, rate, capacity)


def decide(
    state: BucketState | None,
    rate: float,
    capacity: float,
    permits: float,
    timeout: float | None,
    now: float,
) -> tuple[Verdict, BucketState | None]:
    """Decide a reservation of ``permits`` with a wait budget of ``timeout`` microseconds.

    ``timeout=None`` means wait as long as it takes (``acquire``). Returns the verdict
    and the state to store, or None when nothing must be written (a refusal).
    """
    # Doubles throughout, as in Lua, so both sides round alike.
    rate, capacity, permits = float(rate), float(capacity), float(permits)
    current = fresh(rate, capacity, now) if state is None else state
    current = reconfigure(resync(current, now), rate, capacity)
    interval = MICROS / rate
    spend = min(permits, current.stored)
    shortfall = permits - spend
    balance = max(current.balance, now) + shortfall * interval
    wait = balance - now
    if timeout is not None and wait > timeout:
        return Verdict(False, wait, current.stored), None
    stored = current.stored - spend
    return Verdict(True, wait, stored), BucketState(stored, balance, rate, capacity)


def expiry_ms(state: BucketState, now: float) -> int:
    """Milliseconds after which ``state`` is the same as no state (the bucket is full)."""
    interval = MICROS / state.rate
    full_at = max(state.balance, now) + (state.capacity - state.stored) * interval
    return math.ceil((full_at - now) / 1000.0) + EXPIRY_GRACE_MS
