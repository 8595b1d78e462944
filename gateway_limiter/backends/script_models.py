"""The decision scripts run on their Python models, in this process: ``memory://``'s store.

A Redis backend sends every decision as a script call (``backends/scripts.py``):
``bucket.lua``, ``limits.lua``, ``pushback.lua``. ``ScriptModels`` answers the same
calls, given their KEYS and ARGV exactly as the scripts receive them, by running the
model the suite pins to each script bit for bit (``model/bucket.py``, ``limits.py``,
``pushback.py``) on a dict of keys that expire as Redis keys do, and packs the reply as
the script packs it; it reads the few plain commands of the batches (GET, LRANGE, TIME,
the fleet's) off the same dict. So ``memory://`` is the operations every Redis backend
is (``backends/operations.py``) over a transport that never leaves the process.

What is this process's, not Redis's:

- the clock: it decides on the limiter's (``Clocks.clock``, µs), not on Redis's TIME. A
  calendar quota's boundaries, sent in epoch µs, are moved onto that clock by the
  distance to the wall clock taken once, and the end of its period in a reply (and a
  peek) moved back;
- the keys: per-caller state (a key that ends in a caller part, ``state.per_caller_key``)
  is kept for at most ``max_callers`` callers, the least recently used forgotten first
  (a refusal counts as a use; a forgotten caller starts again with a full bucket, as
  after a Redis eviction); expired state is swept every ``SWEEP_EVERY`` writes;
- the replies: a sliding window's LRANGE answers the model's runs (``SlidingLog``), not
  one entry per admission, so a window of a billion costs what its calls cost;
- a pushback on a bucket lives beside the bucket's key (``IN_BUCKET``), not in it.

Every call runs under one lock: a decision is a few microseconds of arithmetic.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gateway_limiter.backends.base import BackendError, Clocks
from gateway_limiter.backends.calls import Command
from gateway_limiter.backends.scripts import (
    FIXED,
    OWN_KEY,
    PACED,
    PUSHBACK,
    PUSHBACK_REPLY,
    QUOTA_REPLY,
    REPLY,
    STATE,
    ScriptCall,
)
from gateway_limiter.backends.state import per_caller_key
from gateway_limiter.model.algorithms import KIND_CODES, PACED_CALENDAR_CODE
from gateway_limiter.model.bucket import US_PER_S, BucketState, Verdict, expiry_ms, reserve
from gateway_limiter.model.limits import (
    CalendarWindow,
    FixedWindow,
    Limit,
    LimitKind,
    limit_expiry_ms,
    reserve_limits,
)
from gateway_limiter.model.pushback import (
    PushbackState,
    factor_at,
    push,
    pushback_expiry_ms,
    until_of,
)

__all__ = ["IN_BUCKET", "MAX_CALLERS", "PAIRED", "SWEEP_EVERY", "ScriptModels"]

#: Sweep expired state after this many writes, so idle interfaces cost no memory.
SWEEP_EVERY = 1024
#: Per-caller states kept at most. Past this the least recently used is forgotten:
#: a forgotten caller starts again with a full bucket, as after a Redis eviction.
MAX_CALLERS = 100_000
#: Where a bucket's pushback state lives: its key and this (no key of the keyspace ends
#: so). ``bucket.lua`` keeps it in the bucket's own string, after its five doubles.
IN_BUCKET = "\x00pb"
#: Where the bucket of a pair (a bucket and a calendar quota, ``state.bucket_and_quota``)
#: lives: the quota's key and this. ``bucket.lua`` keeps it in the quota's string,
#: after the count.
PAIRED = "\x00tb"
#: ``pair_config``: the bucket's two, the quota's six, a class's share.
PAIR_CONFIG = struct.Struct("<9d")
#: Decoded configs (a row's packed doubles) kept at most; past this they start over.
#: One dict for the three kinds: their lengths differ (bucket.lua's 3 or 4 doubles, a
#: quota's 5 or 6, limits.lua's at least 7).
DECODED = 4096

_KINDS = {code: kind for kind, code in KIND_CODES.items()}
#: The shares of a bucket and a calendar quota decided together: a quota keeps none.
_NO_SHARE = 0.0
_EMPTY_BUCKET = (-1.0, 0.0, 0.0, 0.0, 0.0)  # pushback state alone (bucket.lua)
_CALENDAR_TAILS = tuple(f":{LimitKind.CALENDAR}:{p}" for p in ("day", "week", "month"))


def _timeout(arg: Any) -> float | None:
    """A decision script's timeout argument (µs; negative: none) as the model takes it."""
    if arg == "-1":
        return None
    if arg == "0":
        return 0.0
    timeout = float(arg)
    return None if timeout < 0 else timeout


class _LimitsConfig:
    """``limits.lua``'s ARGV[5], decoded once per packed value: the limits as the model
    takes them (a calendar quota's boundaries on this process's clock), how many are
    the interface's own, each limit's share (None: no class reserve in play)."""

    __slots__ = ("limits", "own", "rate", "shares")

    def __init__(self, packed: bytes, layout: bytes | str, count: int, offset_us: float) -> None:
        fmt = layout.decode("ascii") if isinstance(layout, bytes) else layout
        fields = struct.unpack(fmt, packed)
        self.own = int(fields[0])
        paced = sum(1 for i in range(count) if fields[1 + 6 * i] == PACED_CALENDAR_CODE)
        bursts = iter(fields[1 + 6 * count : 1 + 6 * count + paced])
        limits: list[Limit] = []
        for i in range(count):
            code, rate, a, b, c, d = fields[1 + 6 * i : 7 + 6 * i]
            if code == PACED_CALENDAR_CODE or _KINDS[code] is LimitKind.CALENDAR:
                size = next(bursts) if code == PACED_CALENDAR_CODE else 0.0
                bounds = (a - offset_us, b - offset_us, c - offset_us, d - offset_us)
                limits.append(Limit(LimitKind.CALENDAR, rate, size, bounds))
            else:
                limits.append(Limit(_KINDS[code], rate, a))
        rest = fields[1 + 6 * count + paced :]
        self.limits = limits
        self.shares: Sequence[float] | None = rest if rest else None
        #: the rate a pushback's factor is recorded under: the first limit's
        self.rate = limits[0].rate


class ScriptModels:
    """The decision scripts and the batches' commands, answered on the models in a dict.

    ``call`` answers a ``ScriptCall`` as its script would (its raw reply); ``commands``
    a batch's plain commands (the replies in order). State is kept as the models' own
    objects (a key -> the state and when it expires, µs on this store's clock).
    """

    __slots__ = (
        "_callers",
        "_clock",
        "_decoded",
        "_max_callers",
        "_shared",
        "_writes",
        "lock",
        "wall_offset_us",
    )

    def __init__(self, clocks: Clocks, max_callers: int = MAX_CALLERS) -> None:
        """``clocks``: where it decides (``clock``, µs) and the wall clock calendar
        quotas follow (``wall``, s); ``max_callers``: per-caller states kept at most."""
        clock, wall = clocks
        # key -> (state, expires at µs); insertion order of _callers is the order of
        # last use
        self._shared: dict[str, tuple[Any, float]] = {}
        self._callers: dict[str, tuple[Any, float]] = {}
        self._max_callers = max_callers
        self._clock: Callable[[], float] = clock
        self._decoded: dict[Any, Any] = {}
        self._writes = 0
        #: held by every call, and by whoever changes the state directly (``memory.py``)
        self.lock = threading.Lock()
        #: Calendar quotas follow the wall clock: its distance from ``clock``, taken once,
        #: puts their periods on ``clock``'s timeline (a stepped wall clock moves them).
        self.wall_offset_us = wall() * US_PER_S - clock()

    def now(self) -> float:
        """This store's clock, µs."""
        return self._clock()

    # --- script calls ------------------------------------------------------------------

    def call(self, call: ScriptCall) -> Any:
        """``call``'s reply, as its script would answer it. BackendError for a script no
        model answers here (the slots' and leases' are Redis's alone)."""
        name = call.name
        with self.lock:
            if name == "bucket":
                return self._bucket(call.args)
            if name == "limits":
                return self._limits(call.args)
            if name == "pushback":
                return self._pushback(call.args)
        raise BackendError(f"memory:// runs no {name} script: it is shared state's alone")

    def _bucket(self, args: list[Any]) -> bytes:
        """``bucket.lua``: KEYS[1] the bucket's (a calendar quota's beside it: the
        quota's, the bucket's state kept after its count, ``PAIRED``); ARGV its config
        (a pair's: nine doubles), permits, timeout, now."""
        key, config, permits, timeout = args[1:5]
        now = args[5] if len(args) > 5 else ""
        now_us = self._clock() if now == "" else float(now)
        paired = len(config) == PAIR_CONFIG.size
        if paired:
            rate, capacity, quota, share = self._pair_config(config)
        else:
            rate, capacity, warmup_us, share = self._bucket_config(config)
        pushed = self.live(key + IN_BUCKET, now_us)
        factor = factor_at(pushed, rate, now_us)
        until_us = until_of(pushed)
        if not paired:
            verdict, new = reserve(
                self.live(key, now_us),
                rate,
                capacity,
                int(permits),
                _timeout(timeout),
                now_us,
                warmup_us,
                factor,
                until_us,
                share,
            )
            if new is not None:
                self.put(key, new, now_us + expiry_ms(new, now_us) * 1000.0)
                self._written(now_us)
            return _reply(verdict)
        limits = [Limit(LimitKind.TOKEN_BUCKET, rate, capacity), quota]
        keys = (key + PAIRED, key)
        shares = None if share is None else (share, _NO_SHARE)
        return self._decide(keys, limits, 2, shares, permits, timeout, now_us, factor, until_us)

    def _limits(self, args: list[Any]) -> bytes:
        """``limits.lua``: KEYS the limits' and last the pushback's; ARGV permits,
        timeout, now, the struct format of ARGV[5] and the limits."""
        count = args[0] - 1
        keys = args[1 : 1 + count]
        pushed_key, permits, timeout, now, layout, packed = args[1 + count :]
        now_us = self._clock() if now == "" else float(now)
        config = self._decoded.get(packed)
        if config is None:
            if len(self._decoded) >= DECODED:
                self._decoded.clear()
            config = _LimitsConfig(packed, layout, count, self.wall_offset_us)
            self._decoded[packed] = config
        pushed = self.live(pushed_key, now_us)
        factor = factor_at(pushed, config.rate, now_us)
        until_us = until_of(pushed)
        return self._decide(
            keys,
            config.limits,
            config.own,
            config.shares,
            permits,
            timeout,
            now_us,
            factor,
            until_us,
        )

    def _decide(
        self,
        keys: Sequence[str],
        limits: Sequence[Limit],
        own: int,
        shares: Sequence[float] | None,
        permits: Any,
        timeout: Any,
        now_us: float,
        factor: float,
        until_us: float,
    ) -> bytes:
        """Several limits at once (``reserve_limits``), written all or nothing."""
        states = [self.live(k, now_us) for k in keys]
        verdict, changed = reserve_limits(
            limits, states, int(permits), _timeout(timeout), now_us, factor, until_us, own, shares
        )
        if changed is not None:
            for key, limit, state in zip(keys, limits, changed, strict=True):
                self.put(key, state, now_us + limit_expiry_ms(limit, state, now_us) * 1000.0)
            self._written(now_us)
        if verdict.quota_left >= 0:  # its period's end, back on the wall clock
            reset_us = verdict.quota_reset_us + self.wall_offset_us
            return QUOTA_REPLY.pack(
                *_six(verdict), verdict.quota_left, reset_us, verdict.quota_limit
            )
        return _reply(verdict)

    def _pushback(self, args: list[Any]) -> bytes:
        """``pushback.lua``: KEYS[1] where it lives; ARGV the rate it is recorded under,
        retry_after (µs, "" none), now, and "1" when KEYS[1] is a bucket's key."""
        _, key, rate, retry, now, in_bucket = args
        now_us = self._clock() if now == "" else float(now)
        if in_bucket != OWN_KEY:  # a bucket's key, or a pair's (its quota's)
            key += IN_BUCKET
        retry_us = None if retry == "" else float(retry)
        new, factor, next_free_us = push(self.live(key, now_us), float(rate), retry_us, now_us)
        self.put(key, new, now_us + pushback_expiry_ms(new, now_us) * 1000.0)
        self._written(now_us)
        return PUSHBACK_REPLY.pack(factor, next_free_us)

    def _bucket_config(self, config: bytes) -> tuple[float, float, float, float | None]:
        """``bucket_config``'s doubles: rate, capacity, warm-up, a class's share (None)."""
        decoded = self._decoded.get(config)
        if decoded is None:
            if len(self._decoded) >= DECODED:
                self._decoded.clear()
            fields = struct.unpack(f"<{len(config) // 8}d", config)
            decoded = (*fields[:3], fields[3] if len(fields) > 3 else None)
            self._decoded[config] = decoded
        return decoded

    def _pair_config(self, config: bytes) -> tuple[float, float, Limit, float | None]:
        """``pair_config``'s doubles: the bucket's rate and capacity, the quota as its
        Limit (on this store's clock), a class's share of the bucket (None: none)."""
        decoded = self._decoded.get(config)
        if decoded is None:
            if len(self._decoded) >= DECODED:
                self._decoded.clear()
            rate, capacity, qrate, *bounds, size, share = PAIR_CONFIG.unpack(config)
            off = self.wall_offset_us
            quota = Limit(LimitKind.CALENDAR, qrate, size, tuple(b - off for b in bounds))
            decoded = (rate, capacity, quota, None if share < 0 else share)
            self._decoded[config] = decoded
        return decoded

    # --- the batches' commands ---------------------------------------------------------

    def commands(self, commands: Sequence[Command]) -> list[Any]:
        """The replies of a batch's commands, in order, as Redis would give them: GET
        (packed as the scripts pack it), LRANGE (a sliding window's runs), TIME, and
        the fleet's (this process is the whole fleet of its state: one member, none
        stored)."""
        with self.lock:
            now_us = self._clock()
            replies: list[Any] = []
            # a calendar quota's peek is on the wall clock (its periods' and the time)
            offset = 0.0
            for name, args, _ in commands:
                if name == "get":
                    key = args[0]
                    if key.endswith(_CALENDAR_TAILS):
                        offset = self.wall_offset_us
                    replies.append(self._get(key, now_us, offset))
                elif name == "lrange":
                    replies.append(self.live(args[0], now_us))
                elif name == "time":  # all in the µs: ``clock_us`` sums them exactly
                    replies.append((0, now_us + offset))
                elif name == "zrange":
                    replies.append([])
                elif name == "hgetall":
                    replies.append({})
                elif name == "eval":  # the fleet's heartbeat: alone, no claims
                    replies.append([1, int(now_us // 1000), []])
                else:
                    replies.append(BackendError(f"memory:// answers no {name.upper()}"))
            return replies

    def _get(self, key: str, now_us: float, offset: float) -> bytes | BackendError | None:
        """GET of ``key``, packed as the scripts pack its state (a calendar quota's key:
        its count, a pair's bucket and pushback after it), its moments ``offset`` later
        (a calendar quota's key is read on the wall clock)."""
        state = self.live(key, now_us)
        if isinstance(state, BucketState) or state is None:
            return _bucket_and_pushback(b"", state, self.live(key + IN_BUCKET, now_us), offset)
        if isinstance(state, PushbackState):
            return PUSHBACK.pack(*state)
        if isinstance(state, CalendarWindow):
            window = state.window + offset
            if state.stored < 0:
                count = FIXED.pack(window, state.used)
            else:
                count = PACED.pack(window, state.used, state.stored, state.balance)
            bucket = self.live(key + PAIRED, now_us)
            pushed = self.live(key + IN_BUCKET, now_us)
            return _bucket_and_pushback(count, bucket, pushed, offset) or count
        if isinstance(state, FixedWindow):
            return FIXED.pack(*state)
        return BackendError(f"WRONGTYPE {key} holds a list")  # an error reply, not raised

    # --- the keys ----------------------------------------------------------------------

    def live(self, key: str, now_us: float) -> Any:
        """``key``'s state, None when there is none or it expired (a caller's: now the
        most recently used)."""
        entry = self._shared.get(key)
        if entry is None:
            entry = self._callers.pop(key, None)
            if entry is None:
                return None
            self._callers[key] = entry  # a caller refused again and again is in use too
        if entry[1] <= now_us:
            return None
        return entry[0]

    def put(self, key: str, state: Any, until_us: float) -> None:
        """Store ``state`` at ``key`` until ``until_us``; a caller's as the most recently
        used, the least recently used forgotten past ``max_callers``."""
        if key in self._shared or (key not in self._callers and not _is_callers(key)):
            self._shared[key] = (state, until_us)
            return
        callers = self._callers
        callers.pop(key, None)  # to the end: the most recently used
        callers[key] = (state, until_us)
        if len(callers) > self._max_callers:
            del callers[next(iter(callers))]

    def drop(self, key: str) -> None:
        """Forget ``key``'s state."""
        self._shared.pop(key, None)
        self._callers.pop(key, None)

    def clear(self) -> None:
        """Forget every key."""
        with self.lock:
            self._shared.clear()
            self._callers.clear()

    def __len__(self) -> int:
        return len(self._shared) + len(self._callers)

    def _written(self, now_us: float) -> None:
        self._writes += 1
        if self._writes % SWEEP_EVERY == 0:
            for states in (self._shared, self._callers):
                for key in [k for k, (_, until_us) in states.items() if until_us <= now_us]:
                    del states[key]


def _is_callers(key: str) -> bool:
    """True when ``key`` is a caller's (its pushback's beside a bucket's too)."""
    return per_caller_key(key[: -len(IN_BUCKET)] if key.endswith(IN_BUCKET) else key)


def _bucket_and_pushback(
    count: bytes, bucket: BucketState | None, pushed: PushbackState | None, offset: float
) -> bytes | None:
    """``count`` (a pair's), then a bucket's five doubles and what pushbacks left after
    them, as ``bucket.lua`` and ``pushback.lua`` lay them in one string; None when
    neither is there. Moments ``offset`` later (a calendar quota's key: the wall clock)."""
    if bucket is None and pushed is None:
        return None
    if bucket is None:
        fields = _EMPTY_BUCKET
    else:
        fields = (
            bucket.stored,
            bucket.balance_us + offset,
            bucket.rate,
            bucket.capacity,
            bucket.refill_us,
        )
    if pushed is None:
        return count + STATE.pack(*fields)
    until_us, factor, since_us, rate = pushed
    moved = (until_us + offset if until_us else until_us, factor, since_us + offset, rate)
    return count + STATE.pack(*fields) + PUSHBACK.pack(*moved)


def _allowed(verdict: Verdict) -> float:
    """The reply's first double: 1 allowed, -1 refused for want of a reserve, else 0."""
    if verdict.allowed:
        return 1.0
    return -1.0 if verdict.reserved else 0.0


def _reply(verdict: Verdict) -> bytes:
    """A decision script's reply of six doubles."""
    return REPLY.pack(*_six(verdict))


def _six(verdict: Verdict) -> tuple[float, float, float, float, float, float]:
    """The six doubles every decision script's reply starts with (a calendar quota's
    three follow them)."""
    return (
        _allowed(verdict),
        verdict.wait_us,
        verdict.stored,
        verdict.next_free_us,
        verdict.factor,
        verdict.held_us,
    )
