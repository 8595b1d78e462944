"""``lease.lua`` in Python: one lease call on a token bucket, decided as the script
decides it (``backends/lease.lua`` explains the steps; ``core/leases.py`` is the
process's side). Tests pin the two together on a real Redis, bit for bit, for buckets
no pushback holds (a held bucket's lease is the script's alone).

  1. hand back what the previous lease left unused, less what the bucket can have
     refilled since that lease was taken;
  2. the caller's own permits, as ``model.bucket.reserve`` decides a plain call of its
     class (``share``: what its class must leave; None: critical, or no reserve);
  3. if that took stored permits with no wait: up to ``size`` in all from stored ones,
     and on a row with a reserve only from above every class's (``floor``: the
     lowest class's share), so any class may spend them;
  4. on a row without a reserve, if that left the lease short and the caller may wait:
     the rest as debt, one stable interval apart, within ``span_us`` and the budget.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from gateway_limiter.model.bucket import US_PER_S, BucketState, Verdict, reserve, resync


class LeaseReply(NamedTuple):
    """What a lease call answers: the caller's Verdict (the stored and next free ones as
    left after the lease), the permits granted from stored ones in all (the caller's
    included; 0 when it was refused), and the debt lease: the permits scheduled, the
    first one's moment (µs from now) and the interval between them (µs)."""

    verdict: Verdict
    granted: int
    owed: int = 0
    first_us: float = 0.0
    interval_us: float = 0.0


def lease(
    state: BucketState | None,
    rate: float,
    capacity: float,
    permits: int,
    timeout_us: float | None,
    now_us: float,
    size: int,
    unused: int = 0,
    taken_us: float | None = None,
    span_us: float = 0.0,
    share: float | None = None,
    floor: float = 0.0,
) -> tuple[LeaseReply, BucketState | None]:
    """One lease call at ``now_us`` on a bucket in ``state`` (None: none, full): the
    reply, and the state it leaves (None: none written, or as it was)."""
    # 1. hand back
    if unused > 0 and taken_us is not None and taken_us <= now_us and state is not None:
        back = unused - (now_us - taken_us) / min(state.refill_interval_us, US_PER_S / rate)
        if state.stored >= 0 and back > 0:
            current = resync(state, now_us)
            state = replace(current, stored=min(current.capacity, current.stored + back))
    if permits <= 0:
        return LeaseReply(Verdict(True, 0.0, 0.0, 0.0, 1.0, 0.0), 0), state
    # 2. the caller's permits, as a plain call of its class
    verdict, new = reserve(state, rate, capacity, permits, timeout_us, now_us, share=share)
    state = new if new is not None else state
    if not verdict.allowed:
        return LeaseReply(verdict, 0), state
    granted, owed, first_us, interval_us = permits, 0, 0.0, 0.0
    stored, next_free_us = verdict.stored, verdict.next_free_us
    # 3. the rest of the lease, from stored permits only (above every class's reserve)
    more = min(size - permits, math.floor(stored))
    if floor > 0:
        more = min(more, math.floor(stored - floor * capacity * verdict.factor))
    if verdict.wait_us == 0 and more >= 1:
        took, after = reserve(state, rate, capacity, more, 0.0, now_us, share=share)
        if took.allowed:
            granted += more
            stored, next_free_us, state = took.stored, took.next_free_us, after
    # 4. the rest, the bucket dry, as debt for callers who wait
    if span_us > 0 and timeout_us != 0 and stored < 1:
        stable = US_PER_S / (rate * verdict.factor)
        more = min(size - granted, math.floor(span_us / stable) + 1)
        limit: float | None = None
        if timeout_us is not None:
            more = min(more, math.floor((timeout_us - next_free_us) / stable) + 1)
            limit = timeout_us + 1
        if more >= 1:
            took, after = reserve(state, rate, capacity, more, limit, now_us, share=share)
            if took.allowed:
                owed, first_us, interval_us = more, took.wait_us - (more - 1) * stable, stable
                stored, next_free_us, state = took.stored, took.next_free_us, after
    verdict = verdict._replace(stored=stored, next_free_us=next_free_us)
    return LeaseReply(verdict, granted, owed, first_us, interval_us), state
