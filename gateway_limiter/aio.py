"""``AsyncGatewayLimiter``: the limiter for asyncio gateways (aiohttp, FastAPI + httpx).

Its public API, by concern, each class on the one before: the decisions
(``AsyncDecisions``: ``reserve``, ``try_acquire``, ``decide``, ``acquire``), the slots
and what the supplier and the fleet report (``AsyncSlotsAndReports``: ``slot``,
``in_flight``, ``pushback``, ``observe``, ``status``), and the life of the limiter
(``AsyncGatewayLimiter``: ``start``, ``reload``, ``aclose``), all on ``AsyncShell``
(``gateway_limiter.shell_async``), which carries out the engine's steps.

``gateway_limiter/limiter.py`` (``GatewayLimiter``) is generated from this module by
``scripts/generate_sync.py``: change the shell here. How it works:
docs/internals.md, section ``gateway_limiter.aio``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import ClassVar, Self

from gateway_limiter.concurrency import blocking_async, shielded_async
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.core import engine
from gateway_limiter.core.decision import Decision
from gateway_limiter.core.failure import attempt_async
from gateway_limiter.core.status import BucketStatus
from gateway_limiter.lifecycle import ASYNCIO, unwatch, watch
from gateway_limiter.model.bucket import Verdict
from gateway_limiter.model.priority import Priority
from gateway_limiter.shell_async import AsyncShell

# --- threaded only: from gateway_limiter import default_limiter

__all__ = ["AsyncGatewayLimiter"]


class AsyncDecisions(AsyncShell):
    """The decisions of ``AsyncGatewayLimiter``: a rate permit, waited for or not."""

    async def reserve(
        self,
        url: str,
        permits: int = 1,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> Verdict:
        """Decide without sleeping: the caller sleeps out the wait itself.

        Args:
            url: the interface: a row's ``interfaceUrl`` (the HTTP integrations pass
                the request's path).
            permits: permits this call takes, at least 1.
            timeout: the most this call may wait for its permits, seconds; None: the
                row's ``cache``; 0: never wait.
            key: the caller (an IP, a partner), for rows with ``perCaller = 1``; other
                rows ignore it.
            priority: the call's class (a ``Priority`` or its text); None: the row's
                ``priority``, else ``default``.

        Returns:
            The verdict: ``allowed``, and ``wait_us``, the microseconds the caller must
            wait before its call when allowed. A shadow rule's verdict is allowed, with
            no wait.

        Raises:
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument (named), or more permits than the interface can
                serve in one call; nothing is reserved.
        """
        return await self._run(engine.reserving(self, url, permits, timeout, key, priority))

    async def try_acquire(
        self,
        url: str,
        permits: int = 1,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> bool:
        """Take ``permits`` for ``url`` if the wait for them fits in ``timeout``.

        Waits its turn, then answers True; otherwise answers False at once, with nothing
        reserved. An interface with no enabled row is not limited: True at once. With
        asyncio, a caller cancelled while it waits gets ``CancelledError`` at once, and
        the permits it reserved stay spent.

        Args:
            url: the interface: a row's ``interfaceUrl`` (the HTTP integrations pass
                the request's path).
            permits: permits this call takes, at least 1.
            timeout: the most this call may wait for its permits, seconds; None: the
                row's ``cache``; 0: never wait.
            key: the caller (an IP, a partner), for rows with ``perCaller = 1``; other
                rows ignore it.
            priority: the call's class (a ``Priority`` or its text); None: the row's
                ``priority``, else ``default``.

        Returns:
            True once the call may go ahead; False when it may not. Always
            ``decide(...).allowed``.

        Raises:
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument (named), or more permits than the interface can
                serve in one call; nothing is reserved.

        Example:
            ```python
            if await limiter.try_acquire("/ibe/flight/search", key=client_ip):
                await call_supplier()
            ```
        """
        return await self._run(engine.trying(self, url, permits, timeout, key, priority))

    async def decide(
        self,
        url: str,
        permits: int = 1,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> Decision:
        """``try_acquire``, answering with the whole ``Decision``.

        Args:
            url: the interface: a row's ``interfaceUrl`` (the HTTP integrations pass
                the request's path).
            permits: permits this call takes, at least 1.
            timeout: the most this call may wait for its permits, seconds; None: the
                row's ``cache``; 0: never wait.
            key: the caller (an IP, a partner), for rows with ``perCaller = 1``; other
                rows ignore it.
            priority: the call's class (a ``Priority`` or its text); None: the row's
                ``priority``, else ``default``.

        Returns:
            The decision: ``allowed``, ``reason``, the seconds waited, when to retry,
            the permits left and the limit; ``headers()`` gives the HTTP headers.

        Raises:
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument (named), or more permits than the interface can
                serve in one call; nothing is reserved.

        Example:
            ```python
            decision = await limiter.decide("/ibe/flight/search")
            if not decision.allowed:
                return 429, decision.headers()
            ```
        """
        return await self._run(engine.deciding(self, url, permits, timeout, key, priority))

    async def acquire(
        self,
        url: str,
        permits: int = 1,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> float:
        """Take ``permits`` for ``url`` however long it takes.

        A shadow rule returns 0.0 at once (its wait and refusals are only counted).

        Args:
            url: the interface: a row's ``interfaceUrl``.
            permits: permits this call takes, at least 1.
            key: the caller, for rows with ``perCaller = 1``.
            priority: the call's class (a ``Priority`` or its text); None: the row's.

        Returns:
            The seconds waited.

        Raises:
            InterfaceClosed: the interface's ``rateLimit`` is 0 (it would never return).
            BackendUnavailable: Redis is away and the failure policy cannot grant.
            NotStarted: the limiter was not started, or was closed.
            ValueError: a bad argument, or more permits than a window of the interface
                can ever hold.
        """
        return await self._run(engine.acquiring(self, url, permits, key, priority))


class AsyncSlotsAndReports(AsyncDecisions):
    """The slots of ``AsyncGatewayLimiter`` (``slot``, ``in_flight``), and what the
    supplier reports to it (``pushback``, ``observe``) and it reports (``status``)."""

    async def pushback(
        self, url: str, retry_after: float | None = None, key: str | None = None
    ) -> None:
        """Tell the whole fleet that the supplier refused or failed a call on ``url``.

        Call it after an HTTP 429 or 503 (the integrations do). One round trip; every
        process obeys it from its next decision on. Nothing happens on an interface that
        is not limited; a Redis failure is logged, never raised.

        Args:
            url: the interface.
            retry_after: the supplier's ``Retry-After``, seconds: no call on ``url``
                goes before then (on the Redis clock), and callers whose budget cannot
                reach it are refused. None: the interface's rate halves (not below a
                tenth of the row's, once per second), then recovers by 5 % of the
                row's rate per second.
            key: the caller, for rows with ``perCaller = 1``.

        Example:
            ```python
            response = await client.get(url)
            if response.status_code == 429:
                await limiter.pushback("/ibe/flight/search", retry_after=2.0)
            ```
        """
        await self._run(engine.pushing(self, url, retry_after, key))

    async def observe(
        self,
        url: str,
        remaining: int | None = None,
        reset_at: float | None = None,
        key: str | None = None,
    ) -> int | None:
        """The supplier reports ``remaining`` calls left on ``url`` until ``reset_at``
        (epoch seconds; None: it did not say): the fleet's calendar quotas of ``url``
        follow, in one round trip, where the supplier says fewer are left than they
        count. It only ever lowers what is left: a larger ``remaining`` changes nothing.

        It speaks of the interface's own calendar quotas (else its channel's) whose
        period ends by ``reset_at`` (a report that renews sooner than a quota says
        nothing of what is left of it). ``key``: the caller, for per-caller quotas.
        Returns the permits left of those quotas after it (the least), or None when
        there is none (not limited, no calendar quota) or Redis failed (logged, never
        raised).
        """
        return await self._run(engine.observing(self, url, remaining, reset_at, key))

    async def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force, or ``url``'s, with its live state.

        Args:
            url: one interface; None: every interface.

        Returns:
            One ``BucketStatus`` per limit: the rule, the stored permits and debt of a
            shared bucket, what the supplier's pushbacks left (the hold, the effective
            rate) and, on an interface's first limit, its calls in flight.
        """
        return await self._run(engine.statuses(self, self._slotting, url))

    # --- concurrency: slot() (core/slots.py explains the design) ----------------------

    @asynccontextmanager
    async def slot(
        self,
        url: str,
        timeout: float | None = None,
        key: str | None = None,
        priority: Priority | str | None = None,
    ) -> AsyncIterator[Decision]:
        """Hold one of ``url``'s ``maxConcurrent`` slots, fleet-wide, while the block runs.

        Waits up to ``timeout`` for a rate permit and a free slot together; the slot is
        given back when the block ends, however it ends. An interface without
        ``maxConcurrent`` (or a shadow row) is decided as ``decide`` would; one that is
        not limited admits at once.

        Args:
            url: the interface.
            timeout: the most to wait, seconds; None: the row's ``cache``.
            key: the caller, for rows with ``perCaller = 1`` or a ``callerKey``.
            priority: the call's class (a ``Priority`` or its text); None: the row's.

        Yields:
            The decision; ``in_flight`` is the calls in flight, this one included.

        Raises:
            Refused: no slot or no rate permit within ``timeout``; ``.decision`` says
                which, and the calls in flight against ``maxConcurrent``.
            NotStarted: the limiter was not started, or was closed.

        Example:
            ```python
            async with limiter.slot("/ibe/flight/book"):
                await call_supplier()
            ```
        """
        rule, cls, budget_s = engine.slot_of(self, url, timeout, key, priority)
        if budget_s is None or rule is None:  # no cap to hold: decided as decide would
            yield await self._run(engine.slot_decided(self, url, timeout, key, cls, rule))
            return
        held = await self._take_slot(rule, budget_s, key)
        try:
            yield held.decision
        finally:
            await shielded_async(self._give_back, held)

    async def in_flight(self, url: str) -> int | None:
        """Calls to ``url`` in flight across the fleet now (one round trip).

        Args:
            url: the interface.

        Returns:
            The count; None when its row has no ``maxConcurrent``. While Redis cannot be
            asked, this process's own count.
        """
        return await self._run(engine.in_flight(self, self._slotting, url))


class AsyncGatewayLimiter(AsyncSlotsAndReports):
    """Fleet-wide rate limits for one gateway process: ask it before each upstream call.

    Build one per process, shared by all its callers; start it (or use it as a context
    manager), then ask it before each call to a supplier. The limits are the rows of the
    database table, reloaded every ``reload_interval``; the buckets are shared in Redis.

    Args:
        settings: a ``Settings``, or the path of a settings file; None: the settings
            file (``$GATEWAY_LIMITER_SETTINGS``, else ``./settings.toml``), the
            ``GATEWAY_LIMITER_<KEY>`` environment variables and the defaults.
        **overrides: any setting by name (``database_url``, ``redis_url``,
            ``reload_interval``, ...), applied last; and ``clock``, what every moment
            of a decision is read from and every wait slept on
            (``gateway_limiter.core.clock.Clock``; default the system clock).

    Raises:
        SettingsError: a setting is unknown or has a bad value (naming it).

    Example:
        ```python
        async with AsyncGatewayLimiter(
            database_url="mysql+pymysql://gw:secret@db/gateway", redis_url="redis://redis:6379/0"
        ) as limiter:
            if await limiter.try_acquire("/ibe/flight/search"):
                await call_supplier()
        ```
    """

    _NOT_STARTED: ClassVar[str] = (
        "call await start() (or use 'async with AsyncGatewayLimiter(...)') first"
    )

    async def start(self) -> ReloadSummary:
        """Load the limits now, then reload them every ``reload_interval`` seconds.

        Joins the fleet and starts the reload. A table that cannot be read leaves no
        limits in force (every call admitted), logged at error level, until a reload
        reads it.

        Returns:
            What the first load found: the rules, the rows skipped, the switch.
        """
        self._starting()
        failure = await attempt_async(self.backend.prepare)
        self._prepared(failure)
        if self._shared:
            if failure is None:  # know N from the start: one round trip, here, once
                await self._join_fleet()
            self._start_heartbeats()
        watch(self, ASYNCIO)  # a fork restarts it in the child (lifecycle.py)
        # The switch's source (etcd, Apollo) followed, up to its first reading; then
        # the registry's first reload and its reload thread.
        await self.registry.start_following_async()
        summary = await blocking_async(self.registry.start, follow_switch=False)
        if self._counters is not None:  # every counter raised to its checkpoint first
            await self._keep_quotas(load=True)
            self._keep_quotas_from_now()
        return self._running(summary)

    async def reload(self) -> ReloadSummary:
        """Reload the limits now, without waiting for ``reload_interval``.

        Returns:
            What changed (rules added, changed, removed; rows skipped); when the
            database fails, ``ok`` is False and the last good limits stay in force.
        """
        return await blocking_async(self.registry.reload)

    async def aclose(self) -> None:
        """Stop reloading, leave the fleet and close the connections.

        Decisions after this raise ``NotStarted``.
        """
        unwatch(self)
        self._stopping()
        await self._run(engine.returning(self))  # the leases (best effort: else they expire)
        await self._stop_heartbeats()
        await self._stop_renewer()
        await self._stop_quotas()
        await self.registry.stop_following_async()
        await blocking_async(self.registry.close)  # disposing the engine is database I/O
        await self.backend.aclose()

    # --- begin asyncio only
    def abandon(self) -> None:
        """Stop reloading and leave the metrics' gauges, with no I/O on the connections
        (for a limiter whose event loop is gone, and its connections with it, and its
        heartbeat task)."""
        unwatch(self)
        self._stopping()
        self._heartbeats = None
        self._slotting.close()
        self.registry.close()

    # --- end asyncio only
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


# --- the module-level functions: on the process-wide limiter, ``default_limiter()``


async def try_acquire(
    url: str,
    permits: int = 1,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> bool:
    """``AsyncGatewayLimiter.try_acquire`` on the process-wide limiter.

    Args:
        url: the interface (a row's ``interfaceUrl``).
        permits: permits this call takes.
        timeout: the most to wait, seconds; None: the row's ``cache``.
        key: the caller, for ``perCaller`` rows.
        priority: the call's class (``Priority`` or its text); None: the row's.

    Returns:
        True once the call may go ahead (after any wait); False at once otherwise.

    Example:
        ```python
        if await try_acquire("/ibe/flight/search"):
            await call_supplier()
        ```
    """
    limiter = await default_limiter()
    return await limiter.try_acquire(url, permits, timeout, key, priority)


async def acquire(
    url: str, permits: int = 1, key: str | None = None, priority: Priority | str | None = None
) -> float:
    """``AsyncGatewayLimiter.acquire`` on the process-wide limiter: wait as long as it takes.

    Returns:
        The seconds waited.

    Raises:
        InterfaceClosed: the interface's ``rateLimit`` is 0.
        BackendUnavailable: Redis is away and the failure policy cannot grant.
    """
    limiter = await default_limiter()
    return await limiter.acquire(url, permits, key, priority)


async def decide(
    url: str,
    permits: int = 1,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> Decision:
    """``AsyncGatewayLimiter.decide`` on the process-wide limiter.

    Returns:
        A ``Decision``: allowed or not, why, and the headers to answer with.
    """
    limiter = await default_limiter()
    return await limiter.decide(url, permits, timeout, key, priority)


async def pushback(url: str, retry_after: float | None = None, key: str | None = None) -> None:
    """``AsyncGatewayLimiter.pushback`` on the process-wide limiter: the supplier answered
    429 or 503.

    Args:
        url: the interface.
        retry_after: the seconds of the supplier's ``Retry-After``; None: lower the
            interface's rate instead.
        key: the caller, for ``perCaller`` rows.
    """
    limiter = await default_limiter()
    await limiter.pushback(url, retry_after, key)


@asynccontextmanager
async def slot(
    url: str,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> AsyncIterator[Decision]:
    """``AsyncGatewayLimiter.slot`` on the process-wide limiter.

    Example:
        ```python
        async with slot("/ibe/flight/book"):
            await call_supplier()
        ```
    """
    limiter = await default_limiter()
    async with limiter.slot(url, timeout, key, priority) as decision:
        yield decision


# --- asyncio only below: the process-wide limiter (scripts/generate_sync.py stops here) ---

import asyncio  # noqa: E402
import atexit  # noqa: E402
import threading  # noqa: E402

from gateway_limiter.errors import BackendUnavailable, InterfaceClosed, LimiterError, NotStarted  # noqa: E402

__all__ += [
    "BackendUnavailable",
    "InterfaceClosed",
    "LimiterError",
    "NotStarted",
    "aclose_default",
    "acquire",
    "decide",
    "default_limiter",
    "pushback",
    "slot",
    "try_acquire",
]


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
