"""Calendar quotas that outlive Redis, and that follow the supplier: ``QuotaKeeper``.

A per-second bucket lost with Redis is harmless: it refills within a second. A day's
count lost is a day's quota given again. So every process keeps, for each calendar
quota counter it knows of, the highest count it has seen in the current period (its
floor), and the fleet keeps the same in the database:

- **Floors.** Every reply of a decision on a calendar quota says what is left of it
  (``Verdict.quota_left``): the count then. A process also reads every counter it
  knows once per ``quota_checkpoint_s`` (one ``quota.lua`` call per counter), and
  loads the database's checkpoints when it starts.
- **Checkpoints.** That same call takes (or renews) the counter's lock for this
  process, for three intervals: the one process holding it writes the count to
  ``t_ratelimite_quota`` when it has changed, off the decision path, at most once per
  interval. A process that dies leaves the lock to lapse, and another takes over.
- **Restored.** A reply that says a counter holds less than this process's floor for
  the same period means Redis lost it (a restart, a failover that lost writes, an
  eviction): the shell raises it back to the floor at once (a thread or a task)
  (``quota.lua``: a count is only ever raised). A process that starts raises every
  counter to the database's checkpoint before its first decision, and every tick
  raises any counter found below its floor.

What can be given again is what the fleet admitted after the newest floor: each busy
process learns the count from every reply, and every process reads it at least once an
interval, so after a Redis restart the fleet admits at most what it admitted in one
checkpoint interval beyond the quota (tests/faults/test_quota_outlives_redis.py).

``observe``: the supplier's report of what is left (``model/quota_floor.py`` says which
quotas it speaks of) as one ``quota.lua`` call, fleet-wide in one round trip.

This module does no I/O: the shells send the ``ScriptCall`` it builds and write the
``Checkpoint`` rows it hands back (``config/checkpoints.py``).
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.state import calendar_bounds, caller_part, state_key
from gateway_limiter.config.checkpoints import Checkpoint
from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.limits import CalendarWindow, calendar_start
from gateway_limiter.model.quota_floor import NOW_PERIOD, left_after

#: A counter's lock: its key and this (no caller part or kind contains ``#`` there).
LOCK_SUFFIX = "#ck"
#: Counters a process keeps floors for, at most (per-caller quotas: one per caller).
MAX_COUNTERS = 100_000
#: A supplier's reset time may be this far (s) before the end of our period and still
#: speak of it: the supplier's clock and ours differ by a little.
RESET_SLACK_S = 300.0


class Counter(NamedTuple):
    """A calendar quota counter this process knows: its key's part without the caller,
    and the limit (for its calendar)."""

    base: str
    limit: Rule


class Observed(NamedTuple):
    """A supplier's report as one script call: the call, and each counter's limit."""

    call: ScriptCall
    limits: tuple[Rule, ...]


def calendar_limits(rule: Rule) -> tuple[Rule, ...]:
    """``rule``'s calendar quotas (its interface's, then its channel's)."""
    return tuple(r for r in rule.limits if r.calendar is not None)


def counter_key(prefix: str, limit: Rule, caller: str | None) -> str:
    """The Redis key of ``limit``'s counter for ``caller`` (ignored when shared)."""
    base = state_key(prefix, limit)
    return base + caller_part(caller) if limit.per_caller else base


def _fields(
    limit: Rule, now_s: float, window_us: float, used: float, until_us: float
) -> list[float]:
    assert limit.calendar is not None
    return [*calendar_bounds(limit.calendar, now_s), window_us, used, until_us]


def quota_call(
    keys: list[str],
    fields: list[float],
    member: str = "",
    ttl_ms: int = 0,
    now_us: float | None = None,
) -> ScriptCall:
    """``quota.lua`` on ``keys`` (seven ``fields`` each), taking their locks for
    ``member`` when one is given."""
    layout = "<" + "d" * len(fields)
    locks = [k + LOCK_SUFFIX for k in keys] if member else []
    args: list[object] = [len(keys) + len(locks), *keys, *locks]
    args += ["" if now_us is None else repr(now_us), member, str(ttl_ms)]
    args += [layout.encode("ascii"), struct.pack(layout, *fields)]
    return ScriptCall("quota", args)


def parse_quota(reply: object, n: int) -> tuple[float, list[tuple[float, float, bool]]]:
    """``quota.lua``'s reply for ``n`` counters: the server's clock (µs), and each
    counter's period start, count and whether this member holds its lock."""
    try:
        assert isinstance(reply, bytes)
        values = struct.unpack("<" + "d" * (1 + 3 * n), reply)
    except (AssertionError, struct.error) as e:
        raise BackendError(f"unexpected reply from the quota script: {reply!r}") from e
    return values[0], [
        (values[1 + 3 * i], values[2 + 3 * i], values[3 + 3 * i] == 1.0) for i in range(n)
    ]


def _nothing() -> None:
    pass


def _base_of(key: str, bases: Mapping[str, Rule]) -> str:
    """The base of a per-caller counter's ``key`` (its key without the caller part)."""
    found = [b for b, r in bases.items() if r.per_caller and key.startswith(b + ":k")]
    return max(found, key=len, default="")


class QuotaKeeper:
    """One process's floors and checkpoints of calendar quota counters (module docstring).

    ``learn`` is on the decision path (calendar quotas only: a few dict lookups);
    everything else runs on the keeper's thread or task, or in ``observe``.
    """

    __slots__ = (
        "_plans",
        "_spans",
        "_wake",
        "_written",
        "counters",
        "due",
        "floors",
        "member",
        "prefix",
        "ttl_ms",
        "unloaded",
    )

    def __init__(self, prefix: str, member: str, interval_s: float) -> None:
        self.prefix = prefix
        self.member = member
        #: a lock outlives two late ticks of its holder
        self.ttl_ms = max(1000, math.ceil(interval_s * 3000))
        #: counter key -> (period start µs, count): the highest count seen in it
        self.floors: dict[str, tuple[float, float]] = {}
        #: counter key -> what it counts
        self.counters: dict[str, Counter] = {}
        #: counters a reply found below their floor: raise them now
        self.due: dict[str, Counter] = {}
        #: what this process last wrote to the database, per counter
        self._written: dict[str, tuple[float, float]] = {}
        #: url -> (the Rule, its calendar limits with their keys' base)
        self._plans: dict[str, tuple[Rule, tuple[tuple[Rule, str], ...]]] = {}
        #: a counter's base -> (period start, end) µs last matched to a reply
        self._spans: dict[str, tuple[float, float]] = {}
        self._wake: Callable[[], None] = _nothing
        #: the database's checkpoints not read yet (none was while no quota was in force)
        self.unloaded = True

    def waking(self, wake: Callable[[], None] | None) -> None:
        """What ``learn`` calls when a counter must be raised now (the shell's: it
        raises every counter due; None: nothing, the limiter is closing)."""
        self._wake = wake if wake is not None else _nothing

    # --- the decision path -----------------------------------------------------------

    def learn(self, rule: Rule, caller: str | None, verdict: Verdict) -> None:
        """A reply on ``rule`` said what is left of its binding calendar quota: a floor,
        or, when Redis holds less than the floor of the same period, a counter to raise."""
        plan = self._plans.get(rule.url)
        if plan is None or plan[0] is not rule:
            plan = self._plans[rule.url] = (
                rule,
                tuple((r, state_key(self.prefix, r)) for r in calendar_limits(rule)),
            )
        left, reset_us, rate = verdict.quota_left, verdict.quota_reset_us, verdict.quota_limit
        for limit, base in plan[1]:
            if limit.rate != rate:
                continue
            span = self._spans.get(base)
            if span is None or span[1] != reset_us:
                assert limit.calendar is not None
                start, end = limit.calendar.period_at(reset_us / US_PER_S - 1.0)
                if end * US_PER_S != reset_us:
                    continue
                span = self._spans[base] = (start * US_PER_S, reset_us)
            key = base + caller_part(caller) if limit.per_caller else base
            used = rate - left
            floor = self.floors.get(key)
            if floor is not None and floor[0] == span[0] and floor[1] > used:
                if left > 0:  # Redis lost it: raise it back now
                    first = not self.due
                    self.due[key] = Counter(base, limit)
                    if first:  # one raise at a time takes every counter due
                        self._wake()
            elif (floor is not None or len(self.floors) < MAX_COUNTERS) and (
                floor is None or span[0] > floor[0] or used > floor[1]
            ):
                self.floors[key] = (span[0], used)
                if key not in self.counters:
                    self.counters[key] = Counter(base, limit)
            return

    # --- the keeper's thread or task ---------------------------------------------------

    def known(self, snapshot: Snapshot) -> dict[str, Counter]:
        """Every counter to keep: the shared ones of every calendar quota in force, and
        the per-caller ones this process has seen; forgets those no rule counts now."""
        bases: dict[str, Rule] = {}
        for rule in (*snapshot.rules.values(), *snapshot.named.values()):
            for limit in calendar_limits(rule):
                bases[state_key(self.prefix, limit)] = limit
        known = {
            base: Counter(base, limit) for base, limit in bases.items() if not limit.per_caller
        }
        for key, counter in list(self.counters.items()):
            current = bases.get(counter.base)
            if current is None:
                self.counters.pop(key, None)
                self.floors.pop(key, None)
            else:
                known[key] = Counter(counter.base, current)
        self.counters.update(known)
        return known

    def any_quota(self, snapshot: Snapshot) -> bool:
        """Whether any rule in force counts a calendar quota (else there is nothing to
        checkpoint, and a table from before the checkpoints is no concern)."""
        rules = (*snapshot.rules.values(), *snapshot.named.values())
        return any(calendar_limits(rule) for rule in rules)

    def loaded(self, rows: Iterable[Checkpoint], snapshot: Snapshot) -> None:
        """The database's checkpoints (at start): floors for the counters rules count."""
        bases: dict[str, Rule] = {}
        for rule in (*snapshot.rules.values(), *snapshot.named.values()):
            for limit in calendar_limits(rule):
                bases[state_key(self.prefix, limit)] = limit
        for row in rows:
            base = row.key if row.key in bases else _base_of(row.key, bases)
            found = bases.get(base)
            if found is None or (base != row.key and not found.per_caller):
                continue
            self._raise_floor(row.key, row.window_us, row.used)
            self.counters[row.key] = Counter(base, found)
            self._written[row.key] = (row.window_us, row.used)

    def _raise_floor(self, key: str, window_us: float, used: float) -> None:
        floor = self.floors.get(key)
        if floor is None or window_us > floor[0] or (window_us == floor[0] and used > floor[1]):
            self.floors[key] = (window_us, used)

    def calls(
        self, counters: Mapping[str, Counter], lock: bool, now_s: float | None = None
    ) -> list[tuple[str, ScriptCall]]:
        """One ``quota.lua`` call per counter: raise it to its floor and read it (and,
        with ``lock``, take its lock for this process)."""
        now_s = time.time() if now_s is None else now_s
        out = []
        for key, counter in counters.items():
            window_us, used = self.floors.get(key, (NOW_PERIOD, 0.0))
            fields = _fields(counter.limit, now_s, window_us, used, math.inf)
            member = self.member if lock else ""
            out.append((key, quota_call([key], fields, member, self.ttl_ms)))
        return out

    def read(self, key: str, reply: object) -> Checkpoint | None:
        """``quota.lua`` answered for ``key``: the floor follows, and the row to write
        when this process holds the lock and the count changed since it last wrote."""
        _, [(window_us, used, held)] = parse_quota(reply, 1)
        if window_us <= 0:
            return None
        self._raise_floor(key, window_us, used)
        if not held or self._written.get(key) == (window_us, used):
            return None
        return Checkpoint(key, window_us, used)

    def written(self, rows: Iterable[Checkpoint]) -> None:
        """The database took ``rows``."""
        for row in rows:
            self._written[row.key] = (row.window_us, row.used)

    def take_due(self) -> dict[str, Counter]:
        """The counters replies found below their floors, once each."""
        due, self.due = self.due, {}
        return due

    # --- observe -----------------------------------------------------------------------

    def observe(
        self,
        rule: Rule,
        caller: str | None,
        remaining: int,
        reset_at: float | None,
        now_s: float | None = None,
    ) -> Observed | None:
        """The supplier says ``remaining`` calls are left until ``reset_at`` (epoch s;
        None: it did not say): one call raising the count of every quota it speaks of to
        its permits less ``remaining``. Its interface's own quotas, else its channel's;
        of those, every one whose period ends by ``reset_at`` (a little after, for the
        clocks' difference). None when the interface has no calendar quota."""
        limits = [r for r in calendar_limits(rule) if not r.caps_channel] or list(
            calendar_limits(rule)
        )
        until_us = math.inf if reset_at is None else (reset_at + RESET_SLACK_S) * US_PER_S
        now_s = time.time() if now_s is None else now_s
        keys: list[str] = []
        fields: list[float] = []
        chosen: list[Rule] = []
        for limit in limits:  # a count of 0 or less: read, nothing written
            keys.append(counter_key(self.prefix, limit, caller))
            fields += _fields(limit, now_s, NOW_PERIOD, float(limit.rate - remaining), until_us)
            chosen.append(limit)
        if not keys:
            return None
        return Observed(quota_call(keys, fields), tuple(chosen))

    def observed(self, observed: Observed, reply: object) -> int:
        """The permits left after a report: the least of the quotas it was put to."""
        now_us, counters = parse_quota(reply, len(observed.limits))
        least = math.inf
        for limit, (window_us, used, _) in zip(observed.limits, counters, strict=True):
            assert limit.calendar is not None
            start = calendar_start(calendar_bounds(limit.calendar, now_us / US_PER_S), now_us)
            state = CalendarWindow(window_us, used) if window_us > 0 else None
            least = min(least, left_after(float(limit.rate), state, start))
        return int(least)
