"""Getting a Redis backend ready, at start or whenever Redis first answers.

A backend starts whether or not Redis answers (the failure policy decides meanwhile,
docs/cluster.md). Getting ready is done once, on the first connection that works: at
``prepare()`` when Redis is up at start, else on the first decision that reaches it.
It loads the scripts (so decisions are one round trip, not NOSCRIPT + load) and checks
that Redis will not drop the limiter's keys to make room (``eviction_warning``).

What is here has no I/O: the backends (``redis.py``, ``redis_async.py``,
``cluster.py``, ``cluster_async.py``) ask Redis, and hand the answers in.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable

from gateway_limiter.backends.base import BackendError
from gateway_limiter.observe.logs import log

#: ``maxmemory-policy`` values under which Redis may delete a limiter key to make room.
#: The keys carry a TTL (a bucket expires once it would be full anyway), so the
#: ``volatile-*`` policies, which evict keys with a TTL, reach them too.
EVICTING_POLICIES = frozenset(
    {
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
    }
)


def eviction_warning(policies: Iterable[str | None]) -> str | None:
    """The warning to log when a ``maxmemory-policy`` (one per server asked; None: not
    told) lets Redis evict the limiter's keys, else None."""
    evicting = sorted({p for p in policies if p is not None and p.lower() in EVICTING_POLICIES})
    if not evicting:
        return None
    return (
        f"Redis maxmemory-policy is {', '.join(evicting)}: when Redis reaches maxmemory it "
        "may evict the limiter's keys, and an evicted bucket is a full bucket (a burst of "
        "the whole capacity is admitted at once); set maxmemory-policy noeviction on the "
        "Redis that keeps the buckets"
    )


class Readiness:
    """Whether a backend got ready, and the one-time work of getting there.

    ``ready`` is read on every decision without a lock (a bool); ``claim()`` lets one
    thread do the work while the others go on with their decision (a script missing
    meanwhile costs them a NOSCRIPT and a load, never an error), and ``done()`` or
    ``release()`` end it.
    """

    __slots__ = ("_lock", "_task", "ready")

    def __init__(self) -> None:
        self.ready = False
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None

    def claim(self) -> bool:
        """True when this caller is to get the backend ready now (nobody else is)."""
        return not self.ready and self._lock.acquire(blocking=False)

    def done(self, policies: Iterable[str | None]) -> None:
        """Ready: the scripts are loaded; warn (once: this is the last time) when one of
        the ``maxmemory-policy`` values Redis gave can evict the limiter's keys."""
        self.ready = True
        self._lock.release()
        warning = eviction_warning(policies)
        if warning is not None:
            log.warning(warning)

    def release(self) -> None:
        """Not ready after all (Redis failed): the next caller tries again."""
        self._lock.release()

    def get_ready(self, load: Callable[[], Iterable[str | None]]) -> None:
        """Once, unless done or another caller is on it: ``load()`` (SCRIPT LOAD, and the
        ``maxmemory-policy`` values it read); what it raises, the next caller retries."""
        if not self.claim():
            return
        try:
            policies = load()
        except BaseException:
            self.release()
            raise
        self.done(policies)

    async def get_ready_async(self, load: Callable[[], Awaitable[Iterable[str | None]]]) -> None:
        """``get_ready``, awaited."""
        if not self.claim():
            return  # done, or another caller is on it: decide meanwhile (NOSCRIPT loads)
        try:
            policies = await load()
        except BaseException:
            self.release()
            raise
        self.done(policies)

    def in_background(self, prepare: Callable[[], Awaitable[None]]) -> None:
        """asyncio: run ``prepare`` in a task of its own unless one runs, so that no
        decision waits for it or loses its place in the queue. Its failure is the
        decisions' to report (they fail alike); the next decision tries again."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._prepare(prepare))

    async def _prepare(self, prepare: Callable[[], Awaitable[None]]) -> None:
        try:
            await prepare()
        except BackendError:
            pass
        finally:
            self._task = None

    async def cancel(self) -> None:
        """asyncio: stop a ``prepare`` still running (the backend is closing)."""
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
