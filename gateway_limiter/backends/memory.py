"""``memory://``: the reference model in this process, behind one lock.

For one process only (demos, tests, a single gateway), and the ``local`` failure
policy's stand-in when Redis is down. It decides on the clocks it is opened with, as
every backend is (``Clocks``, ``backends/schemes.py``): a limiter's own (``clock=``),
by default this process's monotonic clock.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from gateway_limiter.backends import state as keyspace
from gateway_limiter.backends.base import (
    SYSTEM_CLOCKS,
    BackendError,
    Clocks,
    Heard,
    Listener,
    PeekedPushback,
    PeekedState,
    to_us,
)
from gateway_limiter.backends.fleet import Heartbeat
from gateway_limiter.backends.schemes import register, register_async
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import US_PER_S, Verdict, expiry_ms, reserve
from gateway_limiter.model.limits import (
    CalendarWindow,
    FixedWindow,
    Limit,
    LimitKind,
    limit_expiry_ms,
    reserve_limits,
)
from gateway_limiter.model.pushback import (
    factor_at,
    push,
    pushback_expiry_ms,
    until_of,
)

#: Sweep expired state after this many writes, so idle interfaces cost no memory.
_SWEEP_EVERY = 1024
#: Per-caller states kept at most. Past this the least recently used is forgotten:
#: a forgotten caller starts again with a full bucket, as after a Redis eviction.
MAX_CALLERS = 100_000


@register("memory")
class MemoryBackend:
    """State in dicts; every decision under one lock (decisions take microseconds).

    Shared limits' state is bounded by the rules; per-caller state by ``max_callers``
    (least recently used first out, a refusal counting as a use), and both expire as
    they would in Redis.
    """

    shared = False
    __slots__ = (
        "_callers",
        "_clock",
        "_lock",
        "_max_callers",
        "_shared",
        "_wall_offset_us",
        "_writes",
    )

    def __init__(
        self,
        settings: Settings | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        *,
        max_callers: int = MAX_CALLERS,
    ) -> None:
        """``clocks``: where it decides (``clock``, µs) and the wall clock calendar
        quotas follow (``wall``, s); ``max_callers``: per-caller states kept at most."""
        clock, wall = clocks
        # key (as in Redis, without a prefix) -> (state, expires at µs); insertion order
        # of _callers is the order of last use
        self._shared: dict[str, tuple[Any, float]] = {}
        self._callers: dict[str, tuple[Any, float]] = {}
        self._max_callers = max_callers
        self._lock = threading.Lock()
        self._clock = clock
        #: Calendar quotas follow the wall clock: its distance from ``clock``, taken once,
        #: puts their periods on ``clock``'s timeline (a stepped wall clock moves them).
        self._wall_offset_us = wall() * US_PER_S - clock()
        self._writes = 0

    def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        """Decide with the model, as the Redis scripts would; state expires as in Redis."""
        with self._lock:
            now_us = self._clock()
            timeout_us = to_us(timeout)
            pushed = self._live(keyspace.pushback_key("", rule, caller), rule.keyed, now_us)
            factor = factor_at(pushed, keyspace.pushback_rate(rule), now_us)
            until_us = until_of(pushed)
            if keyspace.single_bucket(rule):  # bucket.lua
                key = self._key(rule, caller)
                state = self._live(key, rule.per_caller, now_us)
                warmup_us = rule.warmup * US_PER_S
                verdict, new = reserve(
                    state,
                    rule.per_second,
                    rule.burst,
                    permits,
                    timeout_us,
                    now_us,
                    warmup_us,
                    factor,
                    until_us,
                    None if rule.shares is None else rule.shares[0],
                )
                if new is not None:
                    until_us = now_us + expiry_ms(new, now_us) * 1000.0
                    self._store(key, rule.per_caller, new, until_us)
                    self._written(now_us)
                return verdict
            limits = rule.limits  # limits.lua
            keys = [self._key(r, caller) for r in limits]
            specs = [self._limit(r, now_us) for r in limits]
            states = [
                self._live(k, r.per_caller, now_us) for k, r in zip(keys, limits, strict=True)
            ]
            verdict, changed = reserve_limits(
                specs,
                states,
                permits,
                timeout_us,
                now_us,
                factor,
                until_us,
                keyspace.own_limits(rule),
                rule.shares,
            )
            if changed is not None:
                for k, r, spec, state in zip(keys, limits, specs, changed, strict=True):
                    until_us = now_us + limit_expiry_ms(spec, state, now_us) * 1000.0
                    self._store(k, r.per_caller, state, until_us)
                self._written(now_us)
            if verdict.quota_left >= 0:  # its period's end, back on the wall clock
                return verdict._replace(
                    quota_reset_us=verdict.quota_reset_us + self._wall_offset_us
                )
            return verdict

    def carry(self, old: Rule, new: Rule, caller: str | None = None) -> None:
        """Carry each limit's state of ``old`` to the same limit of ``new``, the same rule
        at another part of it, where their keys differ (where they are the same, the
        state is already shared), so nothing admitted at ``old`` is admitted again: a
        token bucket's moves as it is (the model rescales what it stored to the new
        capacity and keeps its debt, the time its reservations run to); a sliding
        window's admissions (their times) move as they are; a fixed window's latest
        window becomes the new period's window holding its end, full. Kept until the
        state is dropped whole (an outage's is). The old key's state goes: a part that
        comes back later (A -> B -> A) carries B's state to it again."""
        with self._lock:
            now_us = self._clock()
            for o, n in zip(old.limits, new.limits, strict=False):
                if o.closed or n.closed or o.algorithm != n.algorithm:
                    continue
                old_key, new_key = self._key(o, caller), self._key(n, caller)
                if old_key == new_key:
                    continue
                if caller is not None and not n.per_caller and self._live(new_key, False, now_us):
                    continue  # another caller's change carried this shared limit already
                state = self._live(old_key, o.per_caller, now_us)
                if isinstance(state, FixedWindow):
                    end_us = (state.window + 1.0) * o.period * US_PER_S - 1.0
                    state = FixedWindow(float(math.floor(end_us / (n.period * US_PER_S))), n.rate)
                if state is not None:
                    self._store(new_key, n.per_caller, state, math.inf)
                    # moved, not copied: a part that comes back (A -> B -> A) finds no
                    # stale state of its own to keep in place of what B admitted
                    (self._callers if o.per_caller else self._shared).pop(old_key, None)

    def hold_count(self, limit: Rule, caller: str | None, start_us: float, used: float) -> None:
        """A calendar quota's count at least ``used`` in the period that starts at
        ``start_us`` (epoch µs), where that is the period now (``share``: the part of what
        the fleet had spent; ``core/failure.py``). Nothing for another period."""
        assert limit.calendar is not None
        with self._lock:
            now_us = self._clock()
            spec = self._limit(limit, now_us)
            window = start_us - self._wall_offset_us  # on this backend's clock
            if not spec.bounds or window != spec.bounds[1]:
                return
            key = self._key(limit, caller)
            state = self._live(key, limit.per_caller, now_us)
            if isinstance(state, CalendarWindow) and (
                state.window > window or (state.window == window and state.used >= used)
            ):
                return
            self._store(key, limit.per_caller, CalendarWindow(window, used), spec.bounds[2])

    def _limit(self, rule: Rule, now_us: float) -> Limit:
        """``rule``'s limit; a calendar quota's periods moved onto this backend's clock."""
        spec = keyspace.limit(rule, (now_us + self._wall_offset_us) / US_PER_S)
        if not spec.bounds:
            return spec
        return spec._replace(bounds=tuple(b - self._wall_offset_us for b in spec.bounds))

    def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None = None
    ) -> tuple[float, float]:
        """Record a pushback with the model, as ``pushback.lua`` would."""
        with self._lock:
            now_us = self._clock()
            key = keyspace.pushback_key("", rule, caller)
            state = self._live(key, rule.keyed, now_us)
            retry_us = None if retry_after is None else retry_after * US_PER_S
            new, factor, next_free_us = push(state, keyspace.pushback_rate(rule), retry_us, now_us)
            self._store(key, rule.keyed, new, now_us + pushback_expiry_ms(new, now_us) * 1000.0)
            self._written(now_us)
            return factor, next_free_us

    def peek(self, rule: Rule) -> PeekedState:
        """The live state of ``rule``'s own shared limit, if any."""
        with self._lock:
            now_us = self._clock()
            state = self._live(keyspace.state_key("", rule), False, now_us)
            if rule.kind is not LimitKind.CALENDAR:  # a quota's periods: the wall clock's
                return state, now_us
            offset = self._wall_offset_us
            if state is not None:
                state = state._replace(window=state.window + offset)
            return state, now_us + offset

    def peek_pushback(self, rule: Rule) -> PeekedPushback:
        """What pushbacks left on ``rule``'s interface for all callers, if anything."""
        with self._lock:
            now_us = self._clock()
            return self._live(keyspace.pushback_key("", rule, None), False, now_us), now_us

    def prepare(self) -> None:
        """Nothing to prepare."""

    #: No client: the state is in this process.
    client = None

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """None: nothing is published in-process (no slot is given back through here)."""
        return None

    def script(self, call: ScriptCall) -> Any:
        """No scripts run in-process (no slot or lease call is sent to ``memory://``)."""
        raise BackendError(f"memory:// runs no scripts ({call.name})")

    def heartbeat(
        self, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
    ) -> Heartbeat:
        """This process is the whole fleet of its state."""
        return Heartbeat(1, {})

    def members(self) -> tuple[list[tuple[str, float]], float]:
        """No member is shared: the state lives in this process only."""
        return [], self._clock() / 1000.0

    def close(self) -> None:
        """Forget every bucket."""
        with self._lock:
            self._shared.clear()
            self._callers.clear()

    def __len__(self) -> int:
        return len(self._shared) + len(self._callers)

    @staticmethod
    def _key(rule: Rule, caller: str | None) -> str:
        key = keyspace.state_key("", rule)
        return key + keyspace.caller_part(caller) if rule.per_caller else key

    def _live(self, key: str, per_caller: bool, now_us: float) -> Any:
        if not per_caller:
            entry = self._shared.get(key)
        else:  # a caller refused again and again is in use too: to the end, most recent
            entry = self._callers.pop(key, None)
            if entry is not None:
                self._callers[key] = entry
        if entry is None or entry[1] <= now_us:
            return None
        return entry[0]

    def _store(self, key: str, per_caller: bool, state: Any, until_us: float) -> None:
        if not per_caller:
            self._shared[key] = (state, until_us)
            return
        callers = self._callers
        callers.pop(key, None)  # to the end: the most recently used
        callers[key] = (state, until_us)
        if len(callers) > self._max_callers:
            del callers[next(iter(callers))]

    def _written(self, now_us: float) -> None:
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 0:
            for states in (self._shared, self._callers):
                for key in [k for k, (_, until_us) in states.items() if until_us <= now_us]:
                    del states[key]


@register_async("memory")
class AsyncMemoryBackend:
    """``memory://`` for asyncio: the in-process model, called directly.

    A decision is a few microseconds of arithmetic under an uncontended lock and no
    I/O, so it runs on the event loop; handing it to a thread would cost more.
    """

    shared = False
    __slots__ = ("_memory",)

    def __init__(
        self,
        settings: Settings | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        memory: MemoryBackend | None = None,
    ) -> None:
        self._memory = MemoryBackend(settings, clocks) if memory is None else memory

    async def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        """The model's decision, made at once."""
        return self._memory.reserve(rule, permits, timeout, caller)

    async def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None = None
    ) -> tuple[float, float]:
        """The model's pushback, recorded at once."""
        return self._memory.pushback(rule, retry_after, caller)

    async def peek(self, rule: Rule) -> PeekedState:
        """The live state of ``rule``'s own shared limit, if any."""
        return self._memory.peek(rule)

    async def peek_pushback(self, rule: Rule) -> PeekedPushback:
        """What pushbacks left on ``rule``'s interface for all callers, if anything."""
        return self._memory.peek_pushback(rule)

    async def prepare(self) -> None:
        """Nothing to prepare."""

    #: No client: the state is in this process.
    client = None

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``MemoryBackend.subscribe``: none."""
        return self._memory.subscribe(channel, heard)

    async def script(self, call: ScriptCall) -> Any:
        """``MemoryBackend.script``: none run here."""
        return self._memory.script(call)

    async def heartbeat(
        self, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
    ) -> Heartbeat:
        """This process is the whole fleet of its state."""
        return Heartbeat(1, {})

    async def members(self) -> tuple[list[tuple[str, float]], float]:
        """No member is shared: the state lives in this process only."""
        return self._memory.members()

    async def aclose(self) -> None:
        """Forget every bucket."""
        self._memory.close()
