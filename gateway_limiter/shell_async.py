"""``AsyncShell``: the I/O half of the asyncio limiter, below its public API.

It carries out the engine's steps (``core/steps.py``) over the backend, awaited, and runs
the background work as tasks: the fleet's heartbeats, the slot leases' renewals, the
calendar quotas' keeper. ``gateway_limiter.aio`` puts the public API on it.

``gateway_limiter/shell.py`` (``Shell``, under ``GatewayLimiter``) is generated from this
module by ``scripts/generate_sync.py``: change the shell here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from gateway_limiter.backends.base import AsyncBackend, BackendError, Clocks
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.schemes import open_async_backend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.slots import channel
from gateway_limiter.concurrency import (
    AsyncCancelled,
    AsyncRepeating,
    blocking_async,
    event_loop_async,
    shielded_async,
    spawn_async,
)
from gateway_limiter.config.checkpoints import checkpoints_read, checkpoints_written
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core import engine, steps
from gateway_limiter.core.clock import microseconds
from gateway_limiter.core.failure import attempt_async
from gateway_limiter.core.pipeline import LimiterCore
from gateway_limiter.core.slot_steps import giving_back, holding, renewing
from gateway_limiter.core.slots import Held, SlotState

__all__ = ["AsyncShell"]

T = TypeVar("T")


class AsyncShell(LimiterCore):
    """The I/O half of ``AsyncGatewayLimiter``, below its public API: it carries out
    the engine's steps (``core/steps.py``) over the backend, and runs the background
    work (fleet heartbeats, slot lease renewals)."""

    backend: AsyncBackend
    _heartbeats: AsyncRepeating | None
    _renewer: AsyncRepeating
    _keeper: AsyncRepeating

    def _clocks(self) -> Clocks:
        """This limiter's clock, as every backend is opened with it."""
        return Clocks(microseconds(self.clock), self.clock.time)

    def _in_process(self) -> MemoryBackend:
        return MemoryBackend(None, self._clocks())

    def _open_backend(self, settings: Settings) -> bool:
        self.backend = open_async_backend(settings, self._clocks())
        self._slotting = SlotState(settings)
        self._heartbeats = None
        self._renewer = AsyncRepeating(
            "gateway-limiter-leases", settings.slot_lease / 3, self._renew_slots
        )
        self._keeper = AsyncRepeating(
            "gateway-limiter-quotas", settings.quota_checkpoint_s, self._keep_quotas
        )
        return self.backend.shared

    async def _run(self, engine: steps.Steps[T]) -> T:
        """Carry out the engine's steps (``core/steps.py``) until it answers; what
        stops a step (cancelled, interrupted) is thrown into the engine."""
        got: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                step = engine.send(got) if thrown is None else engine.throw(thrown)
            except StopIteration as done:
                answer: T = done.value
                return answer
            thrown = None
            try:
                if type(step) is steps.Reserve:  # a decision's one round trip
                    ask = step.ask
                    try:
                        got = await self.backend.reserve(
                            ask.rule, ask.permits, ask.budget_s, ask.key
                        )
                    except BackendError as e:
                        got = e
                else:
                    got = await self._carry_out(step)
            except BaseException as e:  # the engine decides what it means
                thrown = e

    async def _carry_out(self, step: steps.Step) -> Any:
        # Every step but ``Reserve`` (carried out in ``_run``).
        match step:
            case steps.Send(call, parse, abandoned):
                try:
                    return await attempt_async(self._script, call, parse)
                except AsyncCancelled:
                    # the script may have run: give back what it may have taken (a
                    # lease Redis does not hold is removed as nothing)
                    if abandoned is not None:
                        spawn_async(self._run, abandoned)
                    raise
            case steps.Shield(work):
                return await shielded_async(self._run, work)
            case steps.PushBack(rule, retry_after, key):
                return await attempt_async(self.backend.pushback, rule, retry_after, key)
            case steps.Peek(rule):
                return await attempt_async(self.backend.peek, rule)
            case steps.PeekPushback(rule):
                return await attempt_async(self.backend.peek_pushback, rule)
            case steps.Beat(args):
                return await attempt_async(self.backend.heartbeat, *args)
            case steps.Await(until, seconds):
                await until.wait_async(seconds)
            case steps.Sleep(seconds):
                await self.clock.sleep_async(seconds)
            case steps.Subscribe():  # connecting blocks (asyncio: in a worker thread)
                start = functools.partial(self.backend.subscribe, channel(self.settings.key_prefix))
                await blocking_async(self._slotting.subscribe, start)
            case steps.StartRenewer():
                self._renewer.start()
        return None

    async def _script(self, call: ScriptCall, parse: Callable[[Any], T]) -> T:
        return parse(await self.backend.script(call))

    # --- slots (core/slots.py): the steps, run -------------------------------------

    async def _take_slot(self, rule: Rule, budget_s: float, key: str | None) -> Held:
        """``slot()``'s slot of ``rule`` (``core.slot_steps.holding``)."""
        loop = event_loop_async()
        return await self._run(holding(self, self._slotting, rule, budget_s, key, loop))

    async def _give_back(self, held: Held) -> None:
        """Give back a slot (``core.slot_steps.giving_back``)."""
        await self._run(giving_back(self._slotting, held))

    async def _renew_slots(self) -> None:
        """Renew every slot lease this limiter holds (``core.slot_steps.renewing``; every
        third of ``slot_lease``, once a slot is taken: ``_renewer``)."""
        await self._run(renewing(self._slotting))

    def _in_flight_seen(self) -> dict[str, int]:
        return dict(self._slotting.seen)

    async def _stop_renewer(self) -> None:
        await self._renewer.stop()
        await blocking_async(self._slotting.close)

    async def _join_fleet(self) -> None:
        """One heartbeat: this process counts in the fleet from now on."""
        await self._run(engine.joining(self))

    def _start_heartbeats(self, *, join: bool = False) -> None:
        """Renew this process's fleet membership every ``fleet_heartbeat`` s, never on a
        decision's path (``core/fleet.py``); ``join``: beat once at once first."""
        heartbeats = AsyncRepeating(
            "gateway-limiter-fleet",
            self._fleet.heartbeat_s,
            self._heartbeat,
            self._join_fleet if join else None,
        )
        self._heartbeats = heartbeats
        heartbeats.start()

    async def _heartbeat(self) -> None:
        await self._run(engine.beating(self))

    # --- calendar quotas' floors and checkpoints (core/quotas.py) -------------------

    async def _keep_quotas(self, load: bool = False) -> None:
        """One round of the calendar quotas' keeper: (``load``: the database's checkpoints
        as floors first) every counter raised to its floor and read, its lock taken, and
        the counts whose lock this process holds written to the database."""
        keeper = self._counters
        if keeper is None:
            return
        snapshot, engine = self.registry.snapshot, self.registry.engine
        if not keeper.any_quota(snapshot):
            return  # nothing to keep: no read of a checkpoint table that may not exist
        if load or keeper.unloaded:
            rows = await blocking_async(checkpoints_read, engine, self.settings.key_prefix)
            keeper.loaded(rows, snapshot)
            keeper.unloaded = False
        written = []
        for key, call in keeper.calls(keeper.known(snapshot), lock=True):
            reply = await attempt_async(self.backend.script, call)
            try:
                if isinstance(reply, BackendError):
                    raise reply
                row = keeper.read(key, reply)
            except BackendError:
                return  # Redis is away (or answered nonsense): the next round tries again
            if row is not None:
                written.append(row)
        if not written:
            return
        took: bool = await blocking_async(checkpoints_written, engine, written)
        if took:
            keeper.written(written)

    async def _raise_due(self) -> None:
        """Raise at once the counters a reply found below this process's floors (Redis
        lost them), rather than at the next round."""
        if self._counters is not None:
            for _, call in self._counters.calls(self._counters.take_due(), lock=False):
                await attempt_async(self.backend.script, call)

    def _keep_quotas_from_now(self) -> None:
        """Keep the calendar quotas every ``quota_checkpoint_s`` from now, and raise a
        lost counter as soon as a reply shows it."""
        if self._counters is not None:
            self._counters.waking(functools.partial(spawn_async, self._raise_due))
            self._keeper.start()

    async def _stop_quotas(self) -> None:
        if self._counters is not None:
            self._counters.waking(None)
        await self._keeper.stop()

    async def _stop_heartbeats(self) -> None:
        """Stop beating and leave the fleet at once (best effort), so N drops now rather
        than when this member would have expired."""
        heartbeats, self._heartbeats = self._heartbeats, None
        if heartbeats is None:
            return
        await heartbeats.stop()  # a heartbeat in flight ends within Redis' timeouts
        await self._run(engine.leaving(self))
