# This file is generated from gateway_limiter/shell_async.py
# by scripts/generate_sync.py: do not edit it. Change shell_async.py
# (and the twins it uses), then run `python scripts/generate_sync.py`; CI fails while
# this file is stale (`--check`). How: docs/design.md, "One shell, two ways to wait",
# and the script's docstring.
"""``Shell``: the I/O half of the threaded limiter, below its public API.

It carries out the engine's steps (``core/steps.py``) over the backend, and runs the
background work on daemon threads (``gateway_limiter.concurrency``): the fleet's
heartbeats, the slot leases' renewals, the calendar quotas' keeper.
``gateway_limiter.limiter`` puts the public API on it.

This module is generated from ``gateway_limiter/shell_async.py`` by
``scripts/generate_sync.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from gateway_limiter.backends.base import Backend, BackendError, Clocks
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.schemes import open_backend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.slots import channel, parse_counts
from gateway_limiter.concurrency import (
    Cancelled,
    Repeating,
    blocking,
    event_loop,
    shielded,
    spawn,
)
from gateway_limiter.config.checkpoints import checkpoints_read, checkpoints_written
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.core import steps
from gateway_limiter.core.clock import microseconds
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.pipeline import LimiterCore, Outcome
from gateway_limiter.core.slots import Held, SlotState, Taking, given_up, take_slot
from gateway_limiter.core.status import (
    BucketStatus,
    bucket_status,
    has_pushback_state,
    has_shared_state,
)
from gateway_limiter.model.bucket import Verdict

__all__ = ["Shell"]

T = TypeVar("T")


class Shell(LimiterCore):
    """The I/O half of ``GatewayLimiter``, below its public API: it carries out
    the engine's steps (``core/steps.py``) over the backend, and runs the background
    work (fleet heartbeats, slot lease renewals)."""

    backend: Backend
    _heartbeats: Repeating | None
    _renewer: Repeating
    _keeper: Repeating

    def _clocks(self) -> Clocks:
        """This limiter's clock, as every backend is opened with it."""
        return Clocks(microseconds(self.clock), self.clock.time)

    def _in_process(self) -> MemoryBackend:
        return MemoryBackend(None, self._clocks())

    def _open_backend(self, settings: Settings) -> bool:
        self.backend = open_backend(settings, self._clocks())
        self._slotting = SlotState(settings)
        self._heartbeats = None
        self._renewer = Repeating(
            "gateway-limiter-leases", settings.slot_lease / 3, self._renew_slots
        )
        self._keeper = Repeating(
            "gateway-limiter-quotas", settings.quota_checkpoint_s, self._keep_quotas
        )
        return self.backend.shared

    def _ask_backend(self, step: Outcome | steps.Ask) -> Outcome:
        # A decision's one backend round trip (when ``_begin`` left one to make).
        if type(step) is not steps.Ask:
            return step  # type: ignore[return-value]
        if step.lease is None and not step.renewing:  # a plain decision: bucket.lua
            if step.rule.shares is not None:  # a class that takes nothing ahead
                return self._run(self._rechecking(step))
            return self._finish(step, self._reserve(step))
        return self._run(self._leasing(step))

    def _reserve(self, ask: steps.Ask) -> Verdict | BackendError:
        try:
            return self.backend.reserve(ask.rule, ask.permits, ask.budget_s, ask.key)
        except BackendError as e:
            return e

    def _run(self, engine: steps.Steps[T]) -> T:
        """Carry out the engine's steps (``core/steps.py``) until it answers."""
        got: Any = None
        try:
            while True:
                got = self._carry_out(engine.send(got))
        except StopIteration as done:
            answer: T = done.value
            return answer

    def _carry_out(self, step: steps.Step) -> Any:
        match step:
            case steps.Reserve(ask):
                return self._reserve(ask)
            case steps.Send(call, parse, abandoned):
                try:
                    return attempt(self._slot_script, call, parse)
                except Cancelled:
                    # the script may have run: give back what it may have taken (a
                    # lease Redis does not hold is removed as nothing)
                    if abandoned is not None:
                        spawn(self._give_back, abandoned)
                    raise
            case steps.Await(until, seconds):
                until.wait(seconds)
            case steps.Sleep(seconds):
                self.clock.sleep(seconds)
            case steps.Subscribe():  # connecting blocks (asyncio: in a worker thread)
                start = functools.partial(self.backend.subscribe, channel(self.settings.key_prefix))
                blocking(self._slotting.subscribe, start)
            case steps.StartRenewer():
                self._renewer.start()
        return None

    def _describe(self, interface: Rule, limits: list[Rule]) -> list[BucketStatus]:
        """Every limit of ``interface`` as ``status`` shows it, with what pushbacks left
        on the interface (the hold, the effective rate)."""
        pushed = (
            attempt(self.backend.peek_pushback, interface)
            if has_pushback_state(interface)
            else None
        )
        out = []
        for rule in limits:
            peeked = attempt(self.backend.peek, rule) if has_shared_state(rule) else None
            out.append(bucket_status(rule, self.backend.shared, peeked, interface, pushed))
        return out

    def _take_slot(self, rule: Rule, budget_s: float, key: str | None) -> Held:
        lease_id = self._slotting.leases.new_id()
        clock = self.clock
        taking = Taking(rule, key, lease_id, clock.monotonic() + budget_s, budget_s, clock=clock)
        waiter = self._slotting.waiter(lease_id, event_loop())
        held: Held | None = None
        try:
            held = self._run(take_slot(self, self._slotting, taking, waiter))
            if held.wait_s > 0:  # the rate permit's wait, the slot held
                self.clock.sleep(held.wait_s)
            return held
        except BaseException:
            if held is not None:  # interrupted in the rate's wait: give the slot back
                shielded(self._give_back, held)
            elif taking.placed:  # refused after waiting, or interrupted: give the place up
                shielded(self._give_back, given_up(rule, lease_id))
            raise
        finally:
            self._slotting.forget(lease_id)

    def _slot_script(self, call: ScriptCall, parse: Callable[[Any], T]) -> T:
        return parse(self.backend.script(call))

    def _in_flight_seen(self) -> dict[str, int]:
        return dict(self._slotting.seen)

    def _give_back(self, held: Held) -> None:
        """Give back a slot: one round trip; a failure leaves the lease to lapse."""
        call = self._slotting.give_back(held)
        if call is not None:
            reply = attempt(self._slot_script, call, parse_counts)
            self._slotting.counted(held.url, reply)

    def _renew_slots(self) -> None:
        """Renew every slot lease this limiter holds, one script call per interface
        (every third of ``slot_lease``, once a slot is taken: ``_renewer``)."""
        for call in self._slotting.renewals():
            attempt(self._slot_script, call, parse_counts)

    def _stop_renewer(self) -> None:
        self._renewer.stop()
        blocking(self._slotting.close)

    def _join_fleet(self) -> None:
        """One heartbeat: this process counts in the fleet from now on."""
        fleet = self._fleet
        demand = fleet.demand(self.registry.snapshot.rules)
        self._beat(attempt(self.backend.heartbeat, fleet.member, fleet.ttl_ms, demand))

    def _start_heartbeats(self, *, join: bool = False) -> None:
        """Renew this process's fleet membership every ``fleet_heartbeat`` s, never on a
        decision's path (``core/fleet.py``); ``join``: beat once at once first."""
        heartbeats = Repeating(
            "gateway-limiter-fleet",
            self._fleet.heartbeat_s,
            self._heartbeat,
            self._join_fleet if join else None,
        )
        self._heartbeats = heartbeats
        heartbeats.start()

    def _heartbeat(self) -> None:
        fleet = self._fleet
        demand = fleet.demand(self.registry.snapshot.rules)
        tallies = self._tallies()
        beat = attempt(self.backend.heartbeat, fleet.member, fleet.ttl_ms, demand, tallies)
        self._beat(beat)
        for rule, permits in self._charges():  # after an outage, off the decision path
            charged = attempt(self.backend.reserve, rule, permits, None)
            if not isinstance(charged, BackendError):
                fleet.charged += permits
        for call in self._lease_returns():  # leases a reload ended
            attempt(self.backend.script, call)

    # --- calendar quotas' floors and checkpoints (core/quotas.py) -------------------

    def _keep_quotas(self, load: bool = False) -> None:
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
            rows = blocking(checkpoints_read, engine, self.settings.key_prefix)
            keeper.loaded(rows, snapshot)
            keeper.unloaded = False
        written = []
        for key, call in keeper.calls(keeper.known(snapshot), lock=True):
            reply = attempt(self.backend.script, call)
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
        took: bool = blocking(checkpoints_written, engine, written)
        if took:
            keeper.written(written)

    def _raise_due(self) -> None:
        """Raise at once the counters a reply found below this process's floors (Redis
        lost them), rather than at the next round."""
        if self._counters is not None:
            for _, call in self._counters.calls(self._counters.take_due(), lock=False):
                attempt(self.backend.script, call)

    def _keep_quotas_from_now(self) -> None:
        """Keep the calendar quotas every ``quota_checkpoint_s`` from now, and raise a
        lost counter as soon as a reply shows it."""
        if self._counters is not None:
            self._counters.waking(functools.partial(spawn, self._raise_due))
            self._keeper.start()

    def _stop_quotas(self) -> None:
        if self._counters is not None:
            self._counters.waking(None)
        self._keeper.stop()

    def _stop_heartbeats(self) -> None:
        """Stop beating and leave the fleet at once (best effort), so N drops now rather
        than when this member would have expired."""
        heartbeats, self._heartbeats = self._heartbeats, None
        if heartbeats is None:
            return
        heartbeats.stop()  # a heartbeat in flight ends within Redis' timeouts
        if self.backend_healthy:
            attempt(self.backend.heartbeat, self._fleet.member, 0)
