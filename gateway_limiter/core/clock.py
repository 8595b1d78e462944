"""The clock the engine is given: monotonic seconds, wall time, and the waits.

Every moment on the decision path (the breaker's window, a local refusal's moment,
the fleet's demand, a lease's age, a slot's budget) and every wait a shell sleeps out
is read from one ``Clock``, passed to the limiter's constructor (``clock=``). The
default, ``SYSTEM_CLOCK``, is this process's own clocks and sleeps: a limiter built
without one behaves as it always has. A test gives a clock of its own to run many
processes' engines on one simulated timeline, each with its own skew, and no real
sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic as _monotonic
from time import monotonic_ns as _monotonic_ns
from time import sleep as _sleep
from time import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Where a limiter reads the time and how it waits."""

    def monotonic(self) -> float:
        """Seconds on a clock that never steps back (as ``time.monotonic``)."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (as ``time.time``)."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` (a caller honouring its wait)."""

    async def sleep_async(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` (an asyncio caller's wait)."""


class SystemClock:
    """This process's clocks, and real sleeps."""

    __slots__ = ()

    monotonic = staticmethod(_monotonic)
    time = staticmethod(_time)
    sleep = staticmethod(_sleep)

    async def sleep_async(self, seconds: float) -> None:
        """``asyncio.sleep``."""
        await asyncio.sleep(seconds)

    def monotonic_us(self) -> float:
        """``monotonic`` in microseconds, as the in-process backend counts."""
        return _monotonic_ns() / 1000.0


#: The clock of every limiter that is not given one.
SYSTEM_CLOCK = SystemClock()


def microseconds(clock: Clock) -> Callable[[], float]:
    """``clock``'s monotonic time in microseconds, as a function (the in-process
    backend's clock)."""
    if isinstance(clock, SystemClock):
        return clock.monotonic_us
    return lambda: clock.monotonic() * 1_000_000.0
