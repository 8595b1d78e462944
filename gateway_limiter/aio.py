"""``AsyncGatewayLimiter``: the limiter for asyncio gateways (aiohttp, FastAPI + httpx).

The same names as ``GatewayLimiter``, as coroutines, and the same behaviour: the rules,
the snapshot, the switch, the failure policies, the circuit breaker, shadow rules, the
metrics and the bucket are the sync limiter's own objects (imported, not copied). Only
the I/O differs, and none of it blocks the event loop:

- a decision is one EVALSHA on ``redis.asyncio`` (``memory://``: the model, in-process);
- a wait is ``asyncio.sleep``;
- a reload (``start``, ``reload``, and every ``reload_interval`` after ``start``) runs in
  a thread, and the loop only ever reads the snapshot the reload swaps in, lock-free,
  so a slow or unreachable database never delays a request.

A runnable example (``memory://`` and a throw-away SQLite file, no servers)::

    import asyncio, tempfile
    from gateway_limiter.aio import AsyncGatewayLimiter
    from gateway_limiter.config.migrate import upgrade
    from gateway_limiter.config.table import make_engine, upsert_conf

    async def main() -> None:
        db = f"sqlite:///{tempfile.mkdtemp()}/limits.db"
        engine = make_engine(db)
        upgrade(engine)
        upsert_conf(engine, "/ibe/flight/search", rate_limit=5, cache=0.5, status=1)
        async with AsyncGatewayLimiter(database_url=db, redis_url="memory://") as limiter:
            admitted = [await limiter.try_acquire("/ibe/flight/search", timeout=0)
                        for _ in range(8)]
            print(admitted)  # 5 stored permits, then refusals: the wait would exceed 0
            print(round(await limiter.acquire("/ibe/flight/search"), 1))  # 0.2: waits its turn

    asyncio.run(main())

Cancellation: what happens to reserved permits
==============================================

A caller cancelled while it waits (``try_acquire`` or ``acquire`` sleeping out its
reservation) gets ``CancelledError`` at once: the wait is a plain ``asyncio.sleep``.
**The permits it reserved stay spent.** The reservation already moved the shared
bucket's balance time forward, and callers in any process may have queued behind it
and computed their own wake-up times from it; handing the permits back would let a
newcomer take a slot that overlaps theirs, and the supplier could then see more calls
than the bucket allows (``capacity + rateLimit x seconds``). Keeping them spent errs
the safe way: the supplier never gets more than that, and the cost is that callers
after the cancelled one wait up to ``permits / rateLimit`` seconds longer than they had
to (or are refused by a ``try_acquire`` whose budget that wait no longer fits). The
same holds when the cancellation lands while the decision itself is in flight: if the
script ran, its permits are spent; if not, nothing was reserved.

``reload()`` is not interrupted by cancelling its caller: the thread finishes the
reload and swaps the snapshot in; only the caller stops waiting for the summary.

Event loops
===========

An ``AsyncGatewayLimiter`` serves the event loop it is first used on (redis.asyncio
connections belong to one loop). The module-level ``try_acquire``/``acquire`` keep one
process-wide limiter for the running loop (see ``default_limiter``); an application
that uses them closes it at shutdown with ``await gateway_limiter.aio.aclose_default()``.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gateway_limiter.backends.base import AsyncBackend, BackendError
from gateway_limiter.backends.schemes import open_async_backend
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings, load_settings
from gateway_limiter.core.decision import (
    BACKEND_FALLBACK,
    CLOSED,
    LIMITED,
    REFUSE,
    Decision,
    decision_of,
)
from gateway_limiter.limiter import (
    BackendUnavailable,
    BucketStatus,
    InterfaceClosed,
    LimiterCore,
    LimiterError,
    NotStarted,
    Outcome,
    bucket_status,
    check_args,
    chosen_limits,
    has_shared_bucket,
    route,
    settings_from,
    waited_seconds,
)
from gateway_limiter.model.bucket import MICROS, Verdict
from gateway_limiter.observe.logs import log

__all__ = [
    "AsyncGatewayLimiter",
    "BackendUnavailable",
    "InterfaceClosed",
    "LimiterError",
    "NotStarted",
    "aclose_default",
    "acquire",
    "decide",
    "default_limiter",
    "try_acquire",
]

_NOT_STARTED = "await start() (or use 'async with AsyncGatewayLimiter(...)') first"


class AsyncGatewayLimiter(LimiterCore):
    """Fleet-wide rate limits for one asyncio gateway process.

    ::

        async with AsyncGatewayLimiter(database_url="mysql+pymysql://u:p@h/db",
                                       redis_url="redis://127.0.0.1:6379/0") as limiter:
            if await limiter.try_acquire("/ibe/flight/search"):
                await call_supplier()

    Keywords are settings (DESIGN.md section 4) and override the file and environment.
    Build it anywhere; use it on one event loop.
    """

    __slots__ = ("backend",)

    def __init__(self, settings: Settings | str | Path | None = None, **overrides: Any) -> None:
        chosen = settings_from(settings, overrides)
        self.backend: AsyncBackend = open_async_backend(chosen)
        super().__init__(chosen, self.backend.shared)

    @classmethod
    def from_settings(cls, path: str | Path | None = None, **overrides: Any) -> Self:
        """A limiter from a settings file (None: $GATEWAY_LIMITER_SETTINGS, ./settings.toml)."""
        return cls(load_settings(path, **overrides))

    async def start(self) -> ReloadSummary:
        """Load the limits now (in a thread), then reload every ``reload_interval`` s."""
        if not self.backend.shared:
            log.warning(
                "redis_url is memory://: limits hold in this process only "
                "(N processes admit N x the rate)"
            )
        try:
            await self.backend.prepare()
        except BackendError as e:
            self._backend_failed(e)  # start anyway: the failure policy decides meanwhile
        # The registry's first reload and its reload thread, exactly as the sync limiter's.
        summary = await asyncio.to_thread(self.registry.start)
        self._started = True
        if self._metrics is not None and self._source is not None:
            self._metrics.attach(self._source)
        return summary

    async def reload(self) -> ReloadSummary:
        """Reload the limits now, in a thread; the last good limits stay if the database fails."""
        return await asyncio.to_thread(self.registry.reload)

    async def aclose(self) -> None:
        """Stop reloading and close connections. Decisions after this raise NotStarted."""
        self._started = False
        if self._metrics is not None and self._source is not None:
            self._metrics.detach(self._source)
        await asyncio.to_thread(self.registry.close)  # disposing the engine is database I/O
        await self.backend.aclose()

    def abandon(self) -> None:
        """Stop reloading and leave the metrics' gauges, with no I/O on the connections
        (for a limiter whose event loop is gone, and its connections with it)."""
        self._started = False
        if self._metrics is not None and self._source is not None:
            self._metrics.detach(self._source)
        self.registry.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def reserve(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Verdict:
        """Decide without sleeping: the verdict, whose ``wait`` (µs) the caller must honour.

        ``timeout=None`` here means the row's ``cache``; ``key`` is the caller, for
        per-caller limits. A shadow rule's verdict is always allowed, with no wait.
        """
        return (await self._reserve(url, permits, timeout, key))[0]

    async def _reserve(
        self, url: str, permits: int, timeout: float | None, key: str | None
    ) -> Outcome:
        check_args(url, permits, timeout, key)
        if not self._started:
            raise NotStarted(_NOT_STARTED)
        snapshot = self.registry.snapshot
        rule = route(snapshot, url)
        if rule is None:
            return self._outcomes.unlimited(snapshot, url)
        if rule.closed:
            verdict, reason = REFUSE, CLOSED
        else:
            budget = rule.cache if timeout is None else timeout
            verdict, reason = await self._decide(rule, permits, budget, key)
        if rule.shadow or self._metrics is not None:
            return self._outcomes.settle(rule, verdict, reason)
        return verdict, reason, rule

    async def _decide(
        self, rule: Rule, permits: int, timeout: float | None, key: str | None
    ) -> tuple[Verdict, str]:
        asked, refused = self._refused_here(rule, key, timeout)
        if refused is not None:  # Redis would refuse too: no round trip
            return refused, LIMITED
        if self._breaker.allows():
            try:
                verdict = await self.backend.reserve(rule, permits, timeout, key)
            except BackendError as e:
                self._backend_failed(e)
            else:
                return self._answered(rule, key, asked, verdict)
        return self._fall_back(rule, permits, timeout, key)

    async def try_acquire(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> bool:
        """Take ``permits`` for ``url`` if the wait fits in ``timeout`` (default: the row's
        ``cache``): wait, then True. Otherwise False at once, with nothing reserved.

        ``key`` names the caller: rows with ``perCaller = 1`` give each key its own
        limits; other rows ignore it. Always ``(await decide(...)).allowed``.
        Cancelled while waiting: CancelledError at once; the permits stay spent.
        """
        verdict = (await self._reserve(url, permits, timeout, key))[0]
        if verdict.allowed and verdict.wait > 0:
            await asyncio.sleep(verdict.wait / MICROS)
        return verdict.allowed

    async def decide(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Decision:
        """``try_acquire``, answering with the whole Decision (see ``GatewayLimiter.decide``).

        Cancelled while waiting: CancelledError at once; the permits stay spent.
        """
        verdict, reason, rule = await self._reserve(url, permits, timeout, key)
        if verdict.allowed and verdict.wait > 0:
            await asyncio.sleep(verdict.wait / MICROS)
        if rule is None:
            return decision_of(verdict, reason, None, 0.0, 0.0)
        budget = rule.cache if timeout is None else timeout
        return decision_of(verdict, reason, rule, budget, self.settings.breaker_seconds)

    async def acquire(self, url: str, permits: int = 1, key: str | None = None) -> float:
        """Take ``permits`` for ``url`` however long it takes; returns the seconds waited.

        Raises InterfaceClosed for a closed interface (it would never return), and
        ValueError for more permits than a window of the interface can ever hold. A
        shadow rule returns 0.0 at once. Cancelled while waiting: CancelledError at
        once; the permits stay spent.
        """
        check_args(url, permits, None, key)
        if not self._started:
            raise NotStarted(_NOT_STARTED)
        snapshot = self.registry.snapshot
        rule = route(snapshot, url)
        if rule is None:
            self._outcomes.unlimited(snapshot, url)
            return 0.0
        if rule.closed:
            verdict, reason = REFUSE, CLOSED
        else:
            try:
                verdict, reason = await self._decide(rule, permits, None, key)
            except BackendUnavailable:
                if not rule.shadow:
                    raise
                verdict, reason = REFUSE, BACKEND_FALLBACK  # a shadow rule never stops a call
        verdict, reason, _ = self._outcomes.settle(rule, verdict, reason)
        if reason == CLOSED:
            raise InterfaceClosed(f"interface {url!r} is closed (rateLimit 0)")
        seconds = waited_seconds(verdict, rule, permits)  # ValueError: more than a window
        if seconds > 0:
            await asyncio.sleep(seconds)
        return seconds

    async def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force (or ``url``'s) with its live state (shared buckets)."""
        return [await self._describe(rule) for rule in chosen_limits(self.registry, url)]

    async def _describe(self, rule: Rule) -> BucketStatus:
        # limiter.describe_state, with the peek awaited.
        shared = self.backend.shared
        if not has_shared_bucket(rule):
            return BucketStatus(rule, None, 0.0, shared)
        try:
            state, now = await self.backend.peek(rule)
        except BackendError as e:
            return BucketStatus(rule, None, 0.0, shared, str(e))
        return bucket_status(rule, state, now, shared)


# --- the process-wide limiter ------------------------------------------------------


class _ProcessWide:
    """The module-level limiter, the loop it serves, and that loop's start-up lock."""

    __slots__ = ("guard", "limiter", "lock", "loop")

    def __init__(self) -> None:
        self.limiter: AsyncGatewayLimiter | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock: asyncio.Lock | None = None
        #: Guards the three above against loops in other threads; never held across an await.
        self.guard = threading.Lock()

    def claim(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Lock, AsyncGatewayLimiter | None]:
        """``loop``'s start-up lock, moving the limiter to ``loop`` if its old loop is done.

        Also returns the limiter a finished loop left behind, whose reloads must stop.
        """
        with self.guard:
            if self.loop is loop and self.lock is not None:
                return self.lock, None
            if self.loop is not None and self.loop.is_running():
                raise RuntimeError(
                    "gateway_limiter.aio's process-wide limiter already serves an event loop "
                    "running in another thread; build an AsyncGatewayLimiter for each loop"
                )
            left_behind, self.limiter = self.limiter, None
            self.loop, self.lock = loop, asyncio.Lock()
            return self.lock, left_behind


_process = _ProcessWide()


async def default_limiter() -> AsyncGatewayLimiter:
    """The process-wide asyncio limiter, built and started on first use on this loop.

    Built from settings ($GATEWAY_LIMITER_SETTINGS, else ./settings.toml, else the
    defaults), like ``gateway_limiter.default_limiter``. It belongs to the event loop
    that first asked for it: once that loop has stopped (``asyncio.run`` returned), the
    next loop to ask gets a new one; a second loop running at the same time in another
    thread gets RuntimeError (build an ``AsyncGatewayLimiter`` per loop instead). Call
    ``aclose_default()`` at shutdown to close its connections cleanly.
    """
    loop = asyncio.get_running_loop()
    limiter = _process.limiter
    if limiter is not None and _process.loop is loop:
        return limiter
    lock, left_behind = _process.claim(loop)
    if left_behind is not None:
        # Its loop is gone, and its connections with it; stop its reloads.
        await asyncio.to_thread(left_behind.abandon)
    async with lock:  # concurrent first callers build it once
        limiter = _process.limiter
        if limiter is None:
            limiter = AsyncGatewayLimiter()
            await limiter.start()
            atexit.register(limiter.registry.close)  # the loop may be gone by then
            _process.limiter = limiter
        return limiter


async def aclose_default() -> None:
    """Close the process-wide asyncio limiter, if this loop has one (e.g. at shutdown)."""
    limiter = _process.limiter
    if limiter is None or _process.loop is not asyncio.get_running_loop():
        return
    _process.limiter = None
    await limiter.aclose()


async def try_acquire(
    url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
) -> bool:
    """``AsyncGatewayLimiter.try_acquire`` on the process-wide asyncio limiter."""
    return await (await default_limiter()).try_acquire(url, permits, timeout, key)


async def acquire(url: str, permits: int = 1, key: str | None = None) -> float:
    """``AsyncGatewayLimiter.acquire`` on the process-wide asyncio limiter."""
    return await (await default_limiter()).acquire(url, permits, key)


async def decide(
    url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
) -> Decision:
    """``AsyncGatewayLimiter.decide`` on the process-wide asyncio limiter."""
    return await (await default_limiter()).decide(url, permits, timeout, key)
