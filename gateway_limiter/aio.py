"""``AsyncGatewayLimiter``: the limiter for asyncio gateways (aiohttp, FastAPI + httpx).

The same names as ``GatewayLimiter``, as coroutines, and the same behaviour: both are
I/O shells around one ``gateway_limiter.core.pipeline.LimiterCore`` (the rules, the
snapshot, the switch, the failure policies, the circuit breaker, local refusals, shadow
rules, the metrics and the bucket). Only the I/O differs, and none of it blocks the
event loop:

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
import dataclasses
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from gateway_limiter.backends.base import AsyncBackend, Backend, BackendError
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.schemes import open_async_backend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.slot_wakeups import listen
from gateway_limiter.backends.slots import (
    parse_counts,
)
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core.decision import Decision
from gateway_limiter.core.failure import attempt_async
from gateway_limiter.core.pipeline import (
    LimiterCore,
    Outcome,
    allowed_wait_s,
    check_args,
    route,
    slot_rule,
)
from gateway_limiter.core.slots import (
    Held,
    SlotState,
    Taking,
    given_up,
    refused,
    take_slot,
)
from gateway_limiter.core.status import (
    BucketStatus,
    bucket_status,
    chosen,
    has_pushback_state,
    has_shared_state,
)
from gateway_limiter.core.steps import (
    Ask,
    Await,
    Reserve,
    Send,
    StartRenewer,
    Step,
    Steps,
    Subscribe,
)
from gateway_limiter.errors import (
    BackendUnavailable,
    InterfaceClosed,
    LimiterError,
    NotStarted,
)
from gateway_limiter.lifecycle import ASYNCIO, unwatch, watch
from gateway_limiter.model.bucket import Verdict

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
    "pushback",
    "slot",
    "try_acquire",
]

T = TypeVar("T")


class AsyncGatewayLimiter(LimiterCore):
    """Fleet-wide rate limits for one asyncio gateway process.

    ::

        async with AsyncGatewayLimiter(database_url="mysql+pymysql://u:p@h/db",
                                       redis_url="redis://127.0.0.1:6379/0") as limiter:
            if await limiter.try_acquire("/ibe/flight/search"):
                await call_supplier()

    Keywords are settings (see docs/design.md) and override the file and environment.
    Build it anywhere; use it on one event loop. Each method is its ``GatewayLimiter``
    namesake, awaited.
    """

    __slots__ = ("_heartbeats", "_renewer", "_slotting", "backend")
    backend: AsyncBackend
    _heartbeats: asyncio.Task[None] | None
    _renewer: asyncio.Task[None] | None

    _NOT_STARTED: ClassVar[str] = (
        "await start() (or use 'async with AsyncGatewayLimiter(...)') first"
    )

    @staticmethod
    def _in_process() -> Backend:
        return MemoryBackend()

    def _open_backend(self, settings: Settings) -> bool:
        self.backend = open_async_backend(settings)
        self._slotting = SlotState(settings)
        self._renewer = None
        return self.backend.shared

    async def start(self) -> ReloadSummary:
        """Load the limits now (in a thread), then reload every ``reload_interval`` s."""
        self._starting()
        failure = await attempt_async(self.backend.prepare)
        self._prepared(failure)
        self._heartbeats = None
        if self._shared:
            fleet = self._fleet
            if failure is None:  # know N from the start: one round trip, here, once
                demand = fleet.demand(self.registry.snapshot.rules)
                beat = attempt_async(self.backend.heartbeat, fleet.member, fleet.ttl_ms, demand)
                self._beat(await beat)
            self._heartbeats = asyncio.create_task(self._beating(), name="gateway-limiter-fleet")
        watch(self, ASYNCIO)  # a fork restarts it in the child (lifecycle.py)
        # The switch's source (etcd, Apollo) followed by a task on this loop; then the
        # registry's first reload and its reload thread, exactly as the sync limiter's.
        await self.registry.start_following_async()
        return self._running(await asyncio.to_thread(self.registry.start, follow_switch=False))

    async def _beating(self) -> None:
        """Renew this process's fleet membership every ``fleet_heartbeat`` s: a task of
        its own, never on a decision's path (``core/fleet.py``)."""
        fleet = self._fleet
        while True:
            await asyncio.sleep(fleet.heartbeat_s)
            demand = fleet.demand(self.registry.snapshot.rules)
            tallies = self._tallies()
            beat = attempt_async(
                self.backend.heartbeat, fleet.member, fleet.ttl_ms, demand, tallies
            )
            self._beat(await beat)
            for rule, permits in self._charges():  # after an outage, off the decision path
                charged = await attempt_async(self.backend.reserve, rule, permits, None)
                if not isinstance(charged, BackendError):
                    fleet.charged += permits
            for call in self._lease_returns():  # leases a reload ended
                await attempt_async(self.backend.script, call)

    async def _stop_heartbeats(self) -> None:
        """Stop beating and leave the fleet at once (best effort), so N drops now."""
        task, self._heartbeats = getattr(self, "_heartbeats", None), None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self.backend_healthy:
            await attempt_async(self.backend.heartbeat, self._fleet.member, 0)

    async def reload(self) -> ReloadSummary:
        """Reload the limits now, in a thread; the last good limits stay if the database fails."""
        return await asyncio.to_thread(self.registry.reload)

    async def aclose(self) -> None:
        """Stop reloading and close connections. Decisions after this raise NotStarted."""
        unwatch(self)
        self._stopping()
        for call in self._lease_returns(closing=True):  # best effort: else they expire
            await attempt_async(self.backend.script, call)
        await self._stop_heartbeats()
        await self._stop_renewer()
        await self.registry.stop_following_async()
        await asyncio.to_thread(self.registry.close)  # disposing the engine is database I/O
        await self.backend.aclose()

    def abandon(self) -> None:
        """Stop reloading and leave the metrics' gauges, with no I/O on the connections
        (for a limiter whose event loop is gone, and its connections with it, and its
        heartbeat task)."""
        unwatch(self)
        self._stopping()
        self._heartbeats = self._renewer = None
        self._slotting.close()
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

    async def _ask_backend(self, step: Outcome | Ask) -> Outcome:
        # A decision's one backend round trip, awaited (when ``_begin`` left one to make).
        if type(step) is not Ask:
            return step  # type: ignore[return-value]
        if step.lease is None and not step.renewing:  # a plain decision: bucket.lua
            return self._finish(step, await self._reserve(step))
        return await self._run(self._leasing(step))

    async def _reserve(self, ask: Ask) -> Verdict | BackendError:
        try:
            return await self.backend.reserve(ask.rule, ask.permits, ask.budget_s, ask.key)
        except BackendError as e:
            return e

    async def _run(self, steps: Steps[T]) -> T:
        """Carry out the engine's steps (``core/steps.py``) until it answers."""
        got: Any = None
        try:
            while True:
                got = await self._carry_out(steps.send(got))
        except StopIteration as done:
            answer: T = done.value
            return answer

    async def _carry_out(self, step: Step) -> Any:
        match step:
            case Reserve(ask):
                return await self._reserve(ask)
            case Send(call, parse, abandoned):
                try:
                    return await attempt_async(self._slot_script, call, parse)
                except asyncio.CancelledError:
                    # the script may have run: give back what it may have taken (a
                    # lease Redis does not hold is removed as nothing)
                    if abandoned is not None:
                        self._background_release(abandoned)
                    raise
            case Await(until, seconds):
                await until.wait_async(seconds)
            case Subscribe():  # connecting blocks, so in a thread
                start = functools.partial(listen, self.settings, self.backend.client)
                await asyncio.to_thread(self._slotting.subscribe, start)
            case StartRenewer():
                self._start_renewer()
        return None

    async def pushback(
        self, url: str, retry_after: float | None = None, key: str | None = None
    ) -> None:
        """``GatewayLimiter.pushback``, awaited: the supplier refused or failed a call on
        ``url``; every process of the fleet obeys it from its next decision on."""
        push = self._begin_pushback(url, retry_after, key)
        if push is not None:
            pushback = self.backend.pushback
            reply = await attempt_async(pushback, push.rule, push.retry_after, push.key)
            self._pushed(push, reply)

    async def reserve(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Verdict:
        """``GatewayLimiter.reserve``: the verdict, whose ``wait`` (µs) the caller honours."""
        return (await self._ask_backend(self._begin(url, permits, timeout, key)))[0]

    async def try_acquire(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> bool:
        """``GatewayLimiter.try_acquire``: True once the wait is over, or False at once.

        Cancelled while waiting: CancelledError at once; the permits stay spent.
        """
        verdict = (await self._ask_backend(self._begin(url, permits, timeout, key)))[0]
        if (wait_s := allowed_wait_s(verdict)) > 0:
            await asyncio.sleep(wait_s)
        return verdict.allowed

    async def decide(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Decision:
        """``try_acquire``, answering with the whole Decision (see ``GatewayLimiter.decide``).

        Cancelled while waiting: CancelledError at once; the permits stay spent.
        """
        outcome = await self._ask_backend(self._begin(url, permits, timeout, key))
        if (wait_s := allowed_wait_s(outcome[0])) > 0:
            await asyncio.sleep(wait_s)
        return self._decision(outcome, timeout, permits)

    async def acquire(self, url: str, permits: int = 1, key: str | None = None) -> float:
        """``GatewayLimiter.acquire``: the seconds waited, however long it takes.

        Cancelled while waiting: CancelledError at once; the permits stay spent.
        """
        wait_s = self._acquired(
            url,
            permits,
            await self._ask_backend(self._begin(url, permits, None, key, forever=True)),
        )
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        return wait_s

    async def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force (or ``url``'s) with its live state (shared buckets),
        what the supplier's pushbacks left (the hold, the effective rate) and, on an
        interface's first limit, its calls in flight."""
        states = [
            shown
            for interface, limits in chosen(self.registry, url)
            for shown in await self._describe(interface, limits)
        ]
        return [await self._with_in_flight(s) for s in states]

    async def _with_in_flight(self, state: BucketStatus) -> BucketStatus:
        """``state`` with its interface's calls in flight, on its first limit only."""
        rule = self.registry.snapshot.rules.get(state.rule.url)
        if rule is None or rule.config_id != state.rule.config_id or rule.max_concurrent is None:
            return state
        return dataclasses.replace(state, in_flight=await self.in_flight(rule.url))

    async def _describe(self, interface: Rule, limits: list[Rule]) -> list[BucketStatus]:
        # core.status.describe_interface, with the peeks awaited.
        pushed = (
            await attempt_async(self.backend.peek_pushback, interface)
            if has_pushback_state(interface)
            else None
        )
        out = []
        for rule in limits:
            peeked = (
                await attempt_async(self.backend.peek, rule) if has_shared_state(rule) else None
            )
            out.append(bucket_status(rule, self.backend.shared, peeked, interface, pushed))
        return out

    # --- concurrency: slot() (core/slots.py explains the design) ----------------------

    @asynccontextmanager
    async def slot(
        self, url: str, timeout: float | None = None, key: str | None = None
    ) -> AsyncIterator[Decision]:
        """``GatewayLimiter.slot``, awaited: hold one of ``url``'s ``maxConcurrent`` slots
        fleet-wide while the block runs; ``Refused`` when a rate permit and a slot cannot
        both be had within ``timeout`` (default: the row's ``cache``).

        The slot is given back however the block ends, cancellation included (the
        release is shielded from a second cancellation). Cancelled while waiting for a
        slot: nothing is held.
        """
        check_args(url, 1, timeout, key)
        if not self._started:
            raise NotStarted(self._NOT_STARTED)
        rule = route(self.registry.snapshot, url, key)
        if rule is None or rule.max_concurrent is None or rule.shadow or rule.closed:
            decision = await self.decide(url, 1, timeout, key)
            if not decision.allowed:
                budget = timeout if timeout is not None or rule is None else rule.cache
                raise refused(url, None, decision, budget or 0.0)
            yield decision
            return
        held = await self._take_slot(rule, rule.cache if timeout is None else timeout, key)
        try:
            yield held.decision
        finally:
            await asyncio.shield(self._give_back(held))

    async def _slot_script(self, call: ScriptCall, parse: Callable[[Any], T]) -> T:
        return parse(await self.backend.script(call))

    def _in_flight_seen(self) -> dict[str, int]:
        return dict(self._slotting.seen)

    async def _take_slot(self, rule: Rule, budget_s: float, key: str | None) -> Held:
        lease_id = self._slotting.leases.new_id()
        taking = Taking(rule, key, lease_id, time.monotonic() + budget_s, budget_s)
        waiter = self._slotting.waiter(lease_id, asyncio.get_running_loop())
        held: Held | None = None
        try:
            held = await self._run(take_slot(self, self._slotting, taking, waiter))
            if held.wait_s > 0:  # the rate permit's wait, the slot held
                await asyncio.sleep(held.wait_s)
            return held
        except BaseException:
            if held is not None:  # cancelled in the rate's wait: give the slot back
                await asyncio.shield(self._give_back(held))
            elif taking.placed:  # refused after waiting, or interrupted: give the place up
                await asyncio.shield(self._give_back(given_up(rule, lease_id)))
            raise
        finally:
            self._slotting.forget(lease_id)

    async def _give_back(self, held: Held) -> None:
        """Give back a slot: one round trip; a failure leaves the lease to lapse."""
        call = self._slotting.give_back(held)
        if call is not None:
            reply = await attempt_async(self._slot_script, call, parse_counts)
            self._slotting.counted(held.url, reply)

    def _background_release(self, held: Held) -> None:
        task = asyncio.get_running_loop().create_task(self._give_back(held))
        _RELEASES.add(task)
        task.add_done_callback(_RELEASES.discard)

    def _start_renewer(self) -> None:
        """One task renewing every lease this limiter holds, every third of
        ``slot_lease``, one script call per interface."""
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renewing(), name="gateway-limiter-leases")

    async def _renewing(self) -> None:
        lease_s, state = self.settings.slot_lease, self._slotting
        while True:
            await asyncio.sleep(lease_s / 3)
            for call in state.renewals():
                await attempt_async(self._slot_script, call, parse_counts)

    async def _stop_renewer(self) -> None:
        task, self._renewer = self._renewer, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(self._slotting.close)

    async def in_flight(self, url: str) -> int | None:
        """``GatewayLimiter.in_flight``, awaited."""
        rule = slot_rule(self.registry.snapshot, url)
        if rule is None or rule.max_concurrent is None:
            return None
        if not self._shared:
            return self._slotting.local.in_flight(url)
        call = self._slotting.count_call(rule)
        reply = await attempt_async(self._slot_script, call, parse_counts)
        counted = self._slotting.counted(url, reply)
        return self._slotting.local.in_flight(url) if counted is None else counted


#: Releases sent for a take cancelled in flight, referenced until they finish.
_RELEASES: set[asyncio.Task[None]] = set()


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


async def pushback(url: str, retry_after: float | None = None, key: str | None = None) -> None:
    """``AsyncGatewayLimiter.pushback`` on the process-wide asyncio limiter."""
    await (await default_limiter()).pushback(url, retry_after, key)


@asynccontextmanager
async def slot(
    url: str, timeout: float | None = None, key: str | None = None
) -> AsyncIterator[Decision]:
    """``AsyncGatewayLimiter.slot`` on the process-wide asyncio limiter."""
    async with (await default_limiter()).slot(url, timeout, key) as decision:
        yield decision
