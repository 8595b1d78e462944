"""How long a read from Redis may take before Redis counts as away: a deadline that
follows the round trips actually seen, between ``redis_timeout`` and
``redis_timeout_ceiling``.

A fixed 50 ms read timeout mistakes a busy host for a dead Redis: with more runnable
threads than cores, a reply that Redis sent in a millisecond can wait tens of
milliseconds for the reading thread to run, the read times out, and the process decides
by the failure policy for ``breaker_seconds`` while Redis is fine (docs/reliability.md,
"A slow host is not an outage"). So the deadline is ``FACTOR`` x the slowest round trip
of the last ``WINDOW_S`` to ``2 x WINDOW_S`` seconds, never below ``redis_timeout`` (on
a quiet host a hung Redis is seen as fast as before) and never above
``redis_timeout_ceiling`` (a hung Redis is always seen within it). A refused or reset
connection is an error at once, whatever the deadline.

No I/O here, and nothing costly on the decision path: ``observe`` is a comparison and
an assignment or two; the deadline changes only when the slowest round trip does, and
is kept in steps of ``STEP_S`` so that a socket's timeout is set (a system call) only
when it moves a step. Threads update it without a lock: a lost update loses one sample.
"""

from __future__ import annotations

import math
import time

#: The deadline is this many times the slowest recent round trip.
FACTOR = 3.0
#: The slowest round trip is remembered for between one and two windows of this many s.
WINDOW_S = 10.0
#: The deadline moves in steps of this many s (the socket timeout is set only then).
STEP_S = 0.01


class RoundTrips:
    """The round trips seen on one backend's connections, and the read deadline they
    give (``timeout_s``)."""

    __slots__ = ("_ceiling_s", "_floor_s", "_previous_s", "_slowest_s", "_window_end", "timeout_s")

    def __init__(self, floor_s: float, ceiling_s: float) -> None:
        self._floor_s = floor_s
        self._ceiling_s = max(floor_s, ceiling_s)
        self._slowest_s = 0.0  # in the window now
        self._previous_s = 0.0  # in the window before
        self._window_end = 0.0
        #: The read deadline now, in s.
        self.timeout_s = floor_s

    def observe(self, rtt_s: float, now: float | None = None) -> None:
        """A round trip took ``rtt_s`` (from writing the command to its reply read);
        ``now``: ``time.monotonic()``, for tests that drive the clock."""
        now = time.monotonic() if now is None else now
        if now >= self._window_end:  # every WINDOW_S: the older window is forgotten
            self._previous_s, self._slowest_s = self._slowest_s, rtt_s
            self._window_end = now + WINDOW_S
        elif rtt_s > self._slowest_s:
            self._slowest_s = rtt_s
        else:
            return
        self.timeout_s = self.deadline_s(max(self._slowest_s, self._previous_s))

    def deadline_s(self, slowest_s: float) -> float:
        """The read deadline when the slowest recent round trip took ``slowest_s``."""
        wanted_s = math.ceil(FACTOR * slowest_s / STEP_S) * STEP_S
        return min(self._ceiling_s, max(self._floor_s, wanted_s))
