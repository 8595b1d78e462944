"""A calendar quota's counter raised to what is known to be spent: ``quota.lua``.

Two things know better than the fleet's counter how much of a calendar quota is gone:

- **the supplier**, which counts every call it receives, the fleet's and those of
  callers outside it, and reports what is left (``X-RateLimit-Remaining``, the IETF
  ``RateLimit`` field). ``limiter.observe`` turns "``remaining`` left until
  ``reset_at``" into a floor on the count of the period the shared clock is in: the
  quota's permits less ``remaining``, for every quota whose period ends by
  ``reset_at`` (a supplier's count that renews before ours says nothing of what is left
  of ours);
- **a checkpoint** (``core/quotas.py``): the count a process read earlier in this period,
  kept in its memory and in the database, for a Redis that came back without the
  counter (a restart, a failover that lost writes, an eviction).

Either way the counter only ever goes up: a counter of the same period keeps the larger
count, one of an earlier period (or none) takes the floor's, one of a later period is
left alone, and a floor for a period already over means nothing now. So a report or a
checkpoint can only lower what is left, never give permits back; and two of them, in
any order, leave the larger.

``raise_counter`` is the model of one counter in ``quota.lua``; the property tests hold
the script to it on a real Redis. Times are epoch microseconds on the shared clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway_limiter.model.limits import CalendarWindow, calendar_end, calendar_start

#: ``w`` meaning "the period the shared clock is in" (the supplier's report speaks of now).
NOW_PERIOD = 0.0


def raise_counter(
    bounds: Sequence[float],
    state: CalendarWindow | None,
    window_us: float,
    used: float,
    until_us: float,
    now_us: float,
) -> CalendarWindow | None:
    """The counter after raising it to ``used`` permits in the period starting at
    ``window_us`` (``NOW_PERIOD``: the one ``now_us`` is in, among ``bounds`` b0..b3), or
    None when nothing is written: ``used`` is not positive, the period is over, it ends
    after ``until_us``, or the counter already holds as much (or a later period)."""
    start = calendar_start(bounds, now_us)
    window = start if window_us == NOW_PERIOD else window_us
    ends = calendar_end(bounds, window)
    if used <= 0 or window < start or ends > until_us:
        return None
    if state is not None and (
        state.window > window or (state.window == window and state.used >= used)
    ):
        return None
    if state is not None and state.window == window:  # a paced quota's bucket stays
        return state._replace(used=used)
    return CalendarWindow(window, used)


def expiry_ms(bounds: Sequence[float], window_us: float, now_us: float) -> int:
    """When a counter raised into ``window_us`` expires (ms from ``now_us``): a second
    after its period ends, as ``limits.lua`` has it (from b3 on, whose end is a guess,
    twice the length of the period before it past its start: no period is longer)."""
    _, _, b2, b3 = bounds
    ends = window_us + 2.0 * (b3 - b2) if window_us >= b3 else calendar_end(bounds, window_us)
    return max(1000, math.ceil((ends - now_us) / 1000.0) + 1000)


def left_after(rate: float, state: CalendarWindow | None, start_us: float) -> float:
    """The permits a quota of ``rate`` has left in the period starting at ``start_us``
    with ``state`` as its counter (none while reservations fill a later period)."""
    if state is None or state.window < start_us:
        return rate
    if state.window > start_us:
        return 0.0
    return max(0.0, rate - state.used)
