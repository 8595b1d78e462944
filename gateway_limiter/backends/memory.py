"""``memory://``: the reference model in this process, behind one lock.

For one process only (demos, tests, a single gateway), and the ``local`` failure
policy's stand-in when Redis is down. The clock is this process's monotonic clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..bucket import (
    MICROS,
    BucketState,
    Verdict,
    decide,
    decide_window,
    expiry_ms,
    window_expiry_ms,
)
from ..rules import SLIDING_WINDOW, Rule
from ..settings import Settings
from . import register, to_micros

#: Sweep expired buckets after this many writes, so idle interfaces cost no memory.
_SWEEP_EVERY = 1024


def monotonic_micros() -> float:
    """This process's monotonic clock in microseconds."""
    return time.monotonic_ns() / 1000.0


@register("memory")
class MemoryBackend:
    """Buckets in a dict; every decision under one lock (decisions take microseconds)."""

    shared = False
    __slots__ = ("_buckets", "_clock", "_lock", "_writes")

    def __init__(
        self, settings: Settings | None = None, *, clock: Callable[[], float] = monotonic_micros
    ) -> None:
        # (kind, url) -> (state, expires at µs); kind "tb" bucket state, "sw" window times
        self._buckets: dict[tuple[str, str], tuple[Any, float]] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._writes = 0

    def reserve(self, rule: Rule, permits: int, timeout: float | None) -> Verdict:
        """Decide with the model; the state expires as it would in Redis."""
        with self._lock:
            now = self._clock()
            budget = to_micros(timeout)
            new: Any
            if rule.algorithm == SLIDING_WINDOW:
                key = ("sw", rule.url)
                times = self._live(key, now) or ()
                verdict, new = decide_window(times, rule.rate, permits, budget, now)
                lifetime = 0 if new is None else window_expiry_ms(new, now)
            else:
                key = ("tb", rule.url)
                warmup = rule.warmup * MICROS
                state = self._live(key, now)
                verdict, new = decide(state, rule.rate, rule.burst, permits, budget, now, warmup)
                lifetime = 0 if new is None else expiry_ms(new, now)
            if new is not None:
                self._buckets[key] = (new, now + lifetime * 1000.0)
                self._writes += 1
                if self._writes % _SWEEP_EVERY == 0:
                    self._sweep(now)
            return verdict

    def peek(self, rule: Rule) -> tuple[BucketState | None, float]:
        """The live state of ``rule``'s bucket, if any."""
        with self._lock:
            now = self._clock()
            return self._live(("tb", rule.url), now), now

    def prepare(self) -> None:
        """Nothing to prepare."""

    def close(self) -> None:
        """Forget every bucket."""
        with self._lock:
            self._buckets.clear()

    def __len__(self) -> int:
        return len(self._buckets)

    def _live(self, key: tuple[str, str], now: float) -> Any:
        entry = self._buckets.get(key)
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    def _sweep(self, now: float) -> None:
        for key in [k for k, (_, until) in self._buckets.items() if until <= now]:
            del self._buckets[key]
