"""Steady traffic from a sync and an asyncio limiter in this process, for failover tests.

``Traffic`` runs threads calling ``GatewayLimiter.try_acquire`` and one event loop
calling ``AsyncGatewayLimiter.try_acquire`` on one interface until stopped, and records
every call's time and outcome, and any exception a caller saw.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.clusters import wait_for

#: The rate of the interface the failover tests call.
RATE = 20


class Traffic:
    """Callers on ``url`` through both limiters; ``stop()`` returns what they saw."""

    def __init__(self, url: str, pause: float = 0.005, **settings: Any) -> None:
        self.url = url
        self.pause = pause
        self.sync = GatewayLimiter(**settings)
        self.sync.start()
        self.async_limiter: AsyncGatewayLimiter | None = None
        self.settings = settings
        self.calls: list[tuple[float, bool]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._threads = [threading.Thread(target=self._sync_caller) for _ in range(2)]
        self._threads.append(threading.Thread(target=lambda: asyncio.run(self._async_caller())))

    def start(self) -> Traffic:
        """Start the callers (the asyncio limiter is started in its loop's thread)."""
        for t in self._threads:
            t.start()
        if not self._ready.wait(30):
            raise RuntimeError("the asyncio limiter did not start")
        return self

    def _record(self, admitted: bool) -> None:
        self.calls.append((time.monotonic(), admitted))  # list.append is atomic

    def _sync_caller(self) -> None:
        while not self._stop.is_set():
            try:
                self._record(self.sync.try_acquire(self.url, timeout=0))
            except BaseException as e:  # the test asserts there are none
                self.errors.append(e)
            time.sleep(self.pause)

    async def _async_caller(self) -> None:
        async with AsyncGatewayLimiter(**self.settings) as lim:
            self.async_limiter = lim
            self._ready.set()
            while not self._stop.is_set():
                try:
                    self._record(await lim.try_acquire(self.url, timeout=0))
                except BaseException as e:
                    self.errors.append(e)
                await asyncio.sleep(self.pause)

    @property
    def fallbacks(self) -> int:
        """Decisions the failure policy made, over both limiters."""
        lim = self.async_limiter
        return self.sync.backend_fallbacks + (lim.backend_fallbacks if lim else 0)

    @property
    def healthy(self) -> bool:
        """Both limiters are deciding on Redis."""
        lim = self.async_limiter
        return self.sync.backend_healthy and lim is not None and lim.backend_healthy

    def admitted_between(self, start: float, end: float) -> int:
        """Calls admitted in [start, end) (time.monotonic())."""
        return sum(1 for t, ok in list(self.calls) if ok and start <= t < end)

    def stop(self) -> None:
        """Stop the callers and close the limiters."""
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self.sync.close()


def stat(client: redis.Redis, command: str) -> int:
    """How often ``command`` ran on this node (INFO commandstats)."""
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def flowing(traffic: Traffic, calls: int = 50, what: str = "traffic") -> None:
    """Until ``calls`` more calls were decided (by Redis or the failure policy): the
    traffic went on through whatever the test just did."""
    seen = len(traffic.calls)
    wait_for(what, lambda: len(traffic.calls) >= seen + calls, 10)


def limiting_resumes(traffic: Traffic, seconds: float = 2.0) -> None:
    """Once both limiters are back on Redis: no fallback for ``seconds``, and within
    them the rate holds and is used."""
    wait_for("both limiters to decide on Redis again", lambda: traffic.healthy, 30)
    before, start = traffic.fallbacks, time.monotonic()
    time.sleep(seconds)  # real time: the rate over these seconds, on Redis' clock
    end = time.monotonic()
    assert traffic.fallbacks == before  # Redis decided every call
    admitted = traffic.admitted_between(start, end)
    # at most a full bucket plus the rate; callers ask far more often than 20/s
    assert RATE * (end - start) * 0.7 <= admitted <= RATE + RATE * (end - start) + 1
