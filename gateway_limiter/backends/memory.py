"""``memory://``: the operations every Redis backend is, over a transport in this process.

For one process only (demos, tests, a single gateway), and the ``local`` failure
policy's stand-in when Redis is down. ``MemoryBackend`` is ``Operations``
(``backends/operations.py``) like the Redis backends, and its transport sends nowhere:
each script call and batch is answered by ``ScriptModels`` (``backends/script_models.py``),
the scripts' Python models on a dict that expires as Redis does. It decides on the
clocks it is opened with, as every backend is (``Clocks``, ``backends/schemes.py``): a
limiter's own (``clock=``), by default this process's monotonic clock.
"""

from __future__ import annotations

import math
from typing import Any

from gateway_limiter.backends.base import SYSTEM_CLOCKS, Clocks, Heard, Listener
from gateway_limiter.backends.calls import Batch
from gateway_limiter.backends.operations import Operations
from gateway_limiter.backends.operations_async import AsyncOperations
from gateway_limiter.backends.schemes import register, register_async
from gateway_limiter.backends.script_models import MAX_CALLERS, PAIRED, ScriptModels
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.state import bucket_and_quota, caller_part, limit, state_key
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.model.limits import CalendarWindow, FixedWindow, Limit

__all__ = ["MAX_CALLERS", "AsyncMemoryBackend", "MemoryBackend"]


@register("memory")
class MemoryBackend(Operations):
    """State in dicts; every decision under one lock (decisions take microseconds).

    Shared limits' state is bounded by the rules; per-caller state by ``max_callers``
    (least recently used first out, a refusal counting as a use), and both expire as
    they would in Redis.
    """

    #: False: the state is this process's alone.
    shared = False
    #: No client: the state is in this process.
    client = None
    __slots__ = ("models",)

    def __init__(
        self,
        settings: Settings | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        *,
        max_callers: int = MAX_CALLERS,
        models: ScriptModels | None = None,
    ) -> None:
        """``clocks``: where it decides (``clock``, µs) and the wall clock calendar
        quotas follow (``wall``, s); ``max_callers``: per-caller states kept at most;
        ``models``: the store (another backend's, to share its state)."""
        self._use(Settings() if settings is None else settings, clocks)
        #: the store: every script call and batch is answered there
        self.models = ScriptModels(clocks, max_callers) if models is None else models

    def call(self, call: ScriptCall) -> tuple[Any, float]:
        """``call`` answered by its model, at once."""
        return self.models.call(call), 0.0

    def batch(self, batch: Batch) -> list[Any]:
        """``batch``'s commands answered off the store."""
        return self.models.commands(batch.commands)

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """None: nothing is published in-process (no slot is given back through here)."""
        return None

    def prepare(self) -> None:
        """Nothing to prepare."""

    def close(self) -> None:
        """Forget every bucket."""
        self.models.clear()

    def __len__(self) -> int:
        return len(self.models)

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
        models = self.models
        with models.lock:
            now_us = models.now()
            keys = zip(self._keys(old, caller), self._keys(new, caller), strict=True)
            pairs = zip(old.limits, new.limits, keys, strict=False)
            for o, n, (old_key, new_key) in pairs:
                if o.closed or n.closed or o.algorithm != n.algorithm:
                    continue
                if old_key == new_key:
                    continue
                if caller is not None and not n.per_caller and models.live(new_key, now_us):
                    continue  # another caller's change carried this shared limit already
                state = models.live(old_key, now_us)
                if isinstance(state, FixedWindow):
                    end_us = (state.window + 1.0) * o.period * US_PER_S - 1.0
                    state = FixedWindow(float(math.floor(end_us / (n.period * US_PER_S))), n.rate)
                if state is not None:
                    models.put(new_key, state, math.inf)
                    # moved, not copied: a part that comes back (A -> B -> A) finds no
                    # stale state of its own to keep in place of what B admitted
                    models.drop(old_key)

    def hold_count(self, limit: Rule, caller: str | None, start_us: float, used: float) -> None:
        """A calendar quota's count at least ``used`` in the period that starts at
        ``start_us`` (epoch µs), where that is the period now (``share``: the part of what
        the fleet had spent; ``core/failure.py``). Nothing for another period."""
        assert limit.calendar is not None
        models = self.models
        with models.lock:
            now_us = models.now()
            spec = self._limit(limit, now_us)
            window = start_us - models.wall_offset_us  # on this backend's clock
            if not spec.bounds or window != spec.bounds[1]:
                return
            key = self._key(limit, caller)
            state = models.live(key, now_us)
            if isinstance(state, CalendarWindow) and (
                state.window > window or (state.window == window and state.used >= used)
            ):
                return
            models.put(key, CalendarWindow(window, used), spec.bounds[2])

    def _limit(self, rule: Rule, now_us: float) -> Limit:
        """``rule``'s limit; a calendar quota's periods moved onto this backend's clock."""
        offset = self.models.wall_offset_us
        spec = limit(rule, (now_us + offset) / US_PER_S)
        if not spec.bounds:
            return spec
        return spec._replace(bounds=tuple(b - offset for b in spec.bounds))

    def _key(self, rule: Rule, caller: str | None) -> str:
        key = state_key(self._prefix, rule)
        return key + caller_part(caller) if rule.per_caller else key

    def _keys(self, rule: Rule, caller: str | None) -> list[str]:
        """Where each of ``rule.limits`` keeps its state here: its key; the bucket of a
        pair (``state.bucket_and_quota``), the quota's key and ``PAIRED``."""
        keys = [self._key(r, caller) for r in rule.limits]
        if bucket_and_quota(rule):
            keys[0] = keys[1] + PAIRED
        return keys


@register_async("memory")
class AsyncMemoryBackend(AsyncOperations):
    """``memory://`` for asyncio: the same store, answered at once.

    A decision is a few microseconds of arithmetic under an uncontended lock and no
    I/O, so it runs on the event loop; handing it to a thread would cost more.
    """

    shared = False
    client = None
    __slots__ = ("_memory",)

    def __init__(
        self,
        settings: Settings | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        memory: MemoryBackend | None = None,
    ) -> None:
        self._memory = MemoryBackend(settings, clocks) if memory is None else memory
        self._use(Settings() if settings is None else settings, clocks)

    async def call(self, call: ScriptCall) -> tuple[Any, float]:
        """``MemoryBackend.call``."""
        return self._memory.models.call(call), 0.0

    async def batch(self, batch: Batch) -> list[Any]:
        """``MemoryBackend.batch``."""
        return self._memory.models.commands(batch.commands)

    def subscribe(self, channel: str, heard: Heard) -> Listener | None:
        """``MemoryBackend.subscribe``: none."""
        return None

    async def prepare(self) -> None:
        """Nothing to prepare."""

    async def aclose(self) -> None:
        """Forget every bucket."""
        self._memory.close()
