"""A clock the test drives, for ``clock=`` on a limiter (gateway_limiter/core/clock.py).

``memory://`` and the in-process fallback policies decide on the limiter's clock, and
every wait a caller honours is slept on it: on this clock time moves only when the test
advances it or a caller sleeps, so a refill of seconds costs no real time and a count
over "one second" is exact, however loaded the host.
"""

from __future__ import annotations

import asyncio
import threading
import time

#: 2026-01-05 00:00:00 UTC: wall time starts on a Monday, at midnight.
EPOCH_S = 1_767_571_200.0


class DrivenClock:
    """Monotonic and wall time that move only by ``advance`` and by the sleeps asked of
    it (which return at once); ``slept`` adds up those sleeps. Wall time starts at
    ``wall`` (``time.time()`` for a calendar the test reads off the real date)."""

    def __init__(self, now: float = 1_000.0, wall: float | None = None) -> None:
        self.now = now
        self.slept = 0.0
        #: Wall time less monotonic: it starts at ``wall`` (``EPOCH_S`` by default).
        self._wall_s = (EPOCH_S if wall is None else wall) - now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self._wall_s + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


class WatchedClock:
    """The system's clocks and real sleeps (Redis' clock decides), telling the test when
    a caller begins to sleep out its wait: ``sleeping`` (asyncio) or ``sleeping_thread``
    is set then, and ``sleeps`` counts them."""

    def __init__(self) -> None:
        self.sleeps = 0
        self.sleeping = asyncio.Event()
        self.sleeping_thread = threading.Event()

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.sleeping_thread.set()
        time.sleep(seconds)  # real time: Redis' clock decides what the caller waits for

    async def sleep_async(self, seconds: float) -> None:
        self.sleeps += 1
        self.sleeping.set()
        await asyncio.sleep(seconds)  # real time: Redis' clock decides the wait


def let_pass(clock: object, seconds: float) -> None:
    """``seconds`` on the clock that decides: a driven clock is moved on (``memory://``,
    the fallback); on any other the limiter is on Redis, whose clock is real time."""
    if isinstance(clock, DrivenClock):
        clock.advance(seconds)
    else:
        time.sleep(seconds)  # real time: Redis' clock decides there
