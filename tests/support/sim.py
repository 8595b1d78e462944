"""A simulated fleet: many processes' real engines against one simulated store.

Each process is a real ``GatewayLimiter`` (its ``LimiterCore``, its failure policy and
breaker, its fleet membership, its local refusals, its shell) given a ``SimClock``: one
timeline for the whole world, each process's clocks skewed by its own amount, and no
real sleep (a wait a caller honours is recorded: the call goes ahead at its moment). The
store is ``memory://``'s (``backends/script_models.py``: each script call answered by
the Python model the suite pins to its Lua bit for bit) on the world's clock, shared by
every process, with the fleet's heartbeat script ported beside it. Nothing runs on a thread: the
scenario is a list of steps carried out in order, so a seed reproduces it exactly.

Faults: the store unreachable (refused at once), slow (the reply comes after the read
deadline: the script ran, the caller fell back), paused (every call times out),
restarted empty, a failover that loses the writes of its last ``lag`` seconds, the
database away (reloads keep the last good snapshot), rows and the switch edited.

``check`` holds the promises of docs/design.md over what happened: see ``Checker``.
A failing scenario is shrunk (``shrink``) and printed as a test to paste (``as_test``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, cast

from sqlalchemy import Engine, Table, create_engine, delete, insert
from sqlalchemy.pool import StaticPool

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.base import BackendError, Clocks
from gateway_limiter.backends.fleet import Heartbeat
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.backends.slots import SLOT_KEYS
from gateway_limiter.backends.state import (
    bucket_and_quota,
    bucket_home,
    caller_part,
    own_limits,
    state_key,
)
from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.rules import Rule, build_rules
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import (
    _ROW_FIELDS,
    SWITCH_ROW_ID,
    Base,
    ConfRow,
    LimiterSwitch,
    RateLimitConf,
)
from gateway_limiter.core.decision import Reason
from gateway_limiter.core.failure import attempt
from gateway_limiter.core.pipeline import call_class
from gateway_limiter.core.slot_steps import take_slot
from gateway_limiter.core.slots import ASK_AGAIN_S, Held, Taking, Waiter, fallback_cap, given_up
from gateway_limiter.core.steps import Await
from gateway_limiter.errors import BackendUnavailable, InterfaceClosed, Refused
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.bucket import expiry_ms as bucket_expiry_ms
from gateway_limiter.model.lease import lease
from gateway_limiter.model.limits import LimitState
from gateway_limiter.model.priority import Priority
from gateway_limiter.model.pushback import PushbackState
from tests.support.slot_model import SlotModel

#: The limits table and the switch's (Core tables), and each row field's column.
CONF = cast(Table, RateLimitConf.__table__)
SWITCH = cast(Table, LimiterSwitch.__table__)
COLUMNS = {field: column for column, field in _ROW_FIELDS.items()}
#: ``lease.lua``'s reply: eleven doubles.
LEASE_REPLY = struct.Struct("<11d")
#: The world's wall clock at its time 0 (a Monday, 00:00 UTC).
EPOCH_S = 1_767_571_200.0
#: What Redis takes as a key's expiry: the scripts pass it as a Lua number, printed
#: with 14 significant digits; a larger one is no integer to PEXPIRE.
REDIS_EXPIRY_MS = 1e14
#: The most list entries one script call may write before it costs Redis more than a
#: few milliseconds (a sliding window writes one per permit).
SCRIPT_ENTRIES = 10_000
#: A decision that takes more CPU time than this costs the process too much (CPU time,
#: this thread's: a loaded host's waits for a core are not the call's cost).
CALL_REAL_S = 1.0
#: ``time.sleep`` refuses a wait it cannot convert (OverflowError).
SLEEP_MOST_S = 9.2e9
#: The processes' ``slot_lease`` (s): short, so a killed holder's slots lapse within a
#: scenario, and a 2 s hold needs its renewals.
SLOT_LEASE_S = 1.0


class SimClock:
    """A process's clocks on the world's timeline: ``skew_s`` ahead (or behind); a
    sleep is recorded on the call in progress, never slept."""

    __slots__ = ("_world", "skew_s", "slept")

    def __init__(self, world: World, skew_s: float) -> None:
        self._world = world
        self.skew_s = skew_s
        self.slept = 0.0

    # within a call, its own sleeps so far: a lower class that waits out its reply's
    # wait asks again that much later (the store sees it then too: ``World.lag``)
    def monotonic(self) -> float:
        return 1_000.0 + self._world.now + self.skew_s + self.slept

    def time(self) -> float:
        return self._world.epoch_s + self._world.now + self.skew_s + self.slept

    def sleep(self, seconds: float) -> None:
        if not 0 <= seconds <= SLEEP_MOST_S:  # as time.sleep would
            raise OverflowError("sleep length is too large")
        self.slept += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


class Unreachable(BackendError):
    """The simulated store cannot be reached (as a refused connection or a timeout)."""


@dataclass
class Fleet:
    """The state ``HEARTBEAT_LUA`` keeps (``backends/fleet.py``), ported."""

    members: dict[str, float] = field(default_factory=dict)  # member -> dies at ms
    claims: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def copy(self) -> Fleet:
        return Fleet(
            dict(self.members),
            {m: dict(c) for m, c in self.claims.items()},
            defaultdict(float, self.totals),
        )

    def _release(self, member: str) -> None:
        for url, (d, c) in self.claims.pop(member, {}).items():
            self.totals["d:" + url] -= d
            self.totals["c:" + url] -= c

    def beat(self, now_ms: float, member: str, ttl_ms: int, demand: str) -> Heartbeat:
        for m in [m for m, dies in self.members.items() if dies <= now_ms]:
            self._release(m)
            del self.members[m]
        self._release(member)
        if ttl_ms <= 0:
            self.members.pop(member, None)
            return Heartbeat(len(self.members), {})
        self.members[member] = now_ms + ttl_ms
        claims: dict[str, float] = {}
        if demand:
            wanted: dict[str, float] = json.loads(demand)
            reporters = len(self.claims) + 1
            scale = max(1.0, len(self.members) / reporters)
            total = {}
            for url, d in wanted.items():
                self.totals["d:" + url] += d
                total[url] = self.totals["d:" + url] * scale
            mine = {}
            for url, d in wanted.items():
                taken = self.totals["c:" + url]
                want = 0.95 * d / total[url] if total[url] > 0 else 0.0
                c = max(0.0, math.floor(min(want, 1 - taken - 1e-9) * 1e6) / 1e6)
                self.totals["c:" + url] += c
                mine[url] = (d, c)
                claims[url] = c
            self.claims[member] = mine
        return Heartbeat(len(self.members), claims)


def key_slot(key: str) -> int:
    """The Redis Cluster slot of ``key`` (CRC16 of its hash tag, as Redis picks it)."""
    raw = key.encode("utf-8", "surrogatepass")
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    crc = 0
    for byte in raw:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc % 16384


class Leased(NamedTuple):
    """A slot lease as the store gave it (taken, or handed over by a release)."""

    at: float  # when (world time)
    until: float  # until when (ms: the rate's wait and a lease)
    key: str  # its interface's leases key
    epoch: int  # the store's epoch then (a slot heard of later is of that store)


@dataclass
class Place:
    """A caller's place in an interface's slot queue, as the store gave it."""

    ticket: int
    process: int
    asked: float  # when it last asked (world time): its place lapses 2 s later


class QueueOrder:
    """The callers waiting for a slot with a place in the store's queue, and the order
    they get slots in (docs/concurrency.md, "Waiting"): a caller takes a slot through
    the store, by its own take or handed over by a release, only while fewer callers
    still waiting are queued ahead of it (all of them, for a caller with no place: a
    newcomer, or a class below critical, which takes none) than slots are free; and a
    live waiter keeps its place while it waits. Excused: places lost with the store
    (restart, failover), lapsed while the store was away (the waiter's asks failed)
    or in a clock jump, and a killed process's waiters. Kept from each slot script
    call's effect on the store's model, whether or not its reply reached the caller."""

    def __init__(self, world: World) -> None:
        self.world = world
        #: leases key (one interface's queue) -> lease id -> its place
        self.waiting: dict[str, dict[str, Place]] = defaultdict(dict)
        #: when the store last came back (world time): places may have lapsed before
        self.back_at = -math.inf

    def forget(self) -> None:
        """Every place is gone: the store lost them, or the clock jumped past them."""
        self.waiting.clear()

    def killed(self, process: int) -> None:
        """``process`` vanished: its waiters wait no more (their places lapse)."""
        for places in self.waiting.values():
            for who in [w for w, place in places.items() if place.process == process]:
                del places[who]

    def done(self, who: str) -> None:
        """``who``'s ``slot()`` is no longer waiting (it has its slot, or gave up)."""
        for places in self.waiting.values():
            places.pop(who, None)

    def _excused(self, place: Place) -> bool:
        """A place that may have lapsed without a fault of the engine or the store."""
        return not self.world.reachable or self.back_at >= place.asked

    def _ahead(self, key: str, who: str, ticket: int | None, queue: dict[str, int]) -> int:
        """The callers still waiting queued before ``who`` (``ticket`` its place; None:
        it has none): each should still hold its place in ``queue`` (the store's, as
        the call found it)."""
        ahead = 0
        for other, place in self.waiting[key].items():
            if other == who or (ticket is not None and place.ticket >= ticket):
                continue
            if queue.get(other) != place.ticket:
                if self._excused(place):
                    continue
                self.world.violations.append(
                    f"at {self.world.now:.3f}: {key}: the place of {other} (process "
                    f"{place.process}, ticket {place.ticket}, asked at {place.asked:.3f}), "
                    f"still waiting, is gone from the store's queue"
                )
            ahead += 1
        return ahead

    def _took(self, key: str, who: str, ahead: int, held: int, cap: float, how: str) -> None:
        # with none ahead, a slot beyond the cap is maxConcurrent's to name (Checker.step)
        if ahead > 0 and held + ahead >= cap:
            self.world.violations.append(
                f"at {self.world.now:.3f}: {key}: {who} {how} a slot with {held} held "
                f"of {cap:g} and {ahead} still waiting ahead of it"
            )

    def ran(
        self,
        key: str,
        argv: list[str],
        process: int,
        queue: dict[str, int],
        leases: set[str],
        published: int,
        reply: Any,
    ) -> None:
        """A ``slot.lua`` call (``argv``: its first five) on the queue ``key`` ran on the
        store's model, by ``process``: ``queue``, the places it counted, and ``leases``,
        the leases it found; ``published``, the grants published before it."""
        op, who = argv[0], argv[3]
        places = self.waiting[key]
        if op == "take":
            state, held = int(reply[0]), int(reply[1])
            if state == 1 and who not in leases:  # taken by asking, not handed over
                mine = places.get(who)
                ahead = self._ahead(key, who, None if mine is None else mine.ticket, queue)
                self._took(key, who, ahead, held - 1, float(argv[1]), "took")
            if state != 2:
                places.pop(who, None)
                return
            ticket = self.world.slots.interfaces[key].queue.get(who)
            if ticket is None:  # no place taken (no time to wait, or a lower class)
                places.pop(who, None)
                return
            mine = places.get(who)
            if mine is not None and float(argv[4]) <= 0:
                return  # asked with no time left: its place kept, not renewed
            if mine is not None and mine.ticket != ticket and not self._excused(mine):
                self.world.violations.append(
                    f"at {self.world.now:.3f}: {key}: {who} (process {process}) lost its "
                    f"place (ticket {mine.ticket}, asked at {mine.asked:.3f}) while it "
                    f"waited, and queued again at the back (ticket {ticket})"
                )
            if who not in queue:  # a new place (one a failover kept is not new)
                last = max((p.ticket for p in places.values()), default=0)
                if ticket <= last:
                    self.world.violations.append(
                        f"at {self.world.now:.3f}: {key}: {who} queued with ticket "
                        f"{ticket}, ahead of a caller already waiting (ticket {last})"
                    )
            places[who] = Place(ticket, process, self.world.now)
            return
        # a release: its caller leaves, and the grants it published in ticket order
        places.pop(who, None)
        for _, message in self.world.slots.published[published:]:
            head, granted, after, _ = message.split(b"\n", 3)
            taker = head.decode("utf-8", "surrogateescape")
            if granted == b"1":
                ticket = queue.get(taker)
                ahead = self._ahead(key, taker, ticket, queue)
                self._took(key, taker, ahead, int(after) - 1, float(argv[1]), "was handed")
            places.pop(taker, None)


class World:
    """The timeline, the shared store and its faults, and what the checker needs."""

    def __init__(self, prefix: str = "sim", epoch_s: float = EPOCH_S) -> None:
        self.now = 0.0
        #: the wall clock at time 0 (a scenario may start near a DST change or a
        #: month's end)
        self.epoch_s = epoch_s
        self.prefix = prefix
        #: the sleeps so far of the call now asking the store (its moment is that much
        #: after the world's)
        self.lag = 0.0
        self.store = MemoryBackend(
            Settings(key_prefix=prefix),
            clocks=Clocks(lambda: (self.now + self.lag) * US_PER_S, lambda: epoch_s + self.now),
        )
        self.fleet = Fleet()
        #: slot.lua's and slot_renew.lua's keys (the Python model, pinned to the Lua)
        self.slots = SlotModel()
        #: every lease.lua call that asked for permits: (process, key, its moment)
        self.leased: list[tuple[int, str, float]] = []
        #: lease id -> the process that took it
        self.owners: dict[str, int] = {}
        #: slot lease id -> when the store leased it (taken or handed over), until when
        #: (ms: the rate's wait and a lease), and its interface's leases key
        self.leased_slots: dict[str, Leased] = {}
        #: how many times the store lost its state (restart, failover)
        self.epoch = 0
        self.down = False  # refused at once
        self.paused = False  # every call times out (the script does not run)
        self.slow = False  # replies come after the read deadline (the script ran)
        #: (time, store dicts, fleet) a few moments back: what a replica holds
        self.history: list[tuple[float, dict[str, Any], dict[str, Any], Fleet, SlotModel]] = []
        #: promises the store itself sees broken (a script error, keys in two slots)
        self.violations: list[str] = []
        #: (time, what) of every fault, for the checker's allowances
        self.events: list[tuple[float, str]] = []
        #: (time, the epoch from then on) where the store lost its state: a restart,
        #: and a failover (from the replica's moment, and from the promotion)
        self.cuts: list[tuple[float, int]] = []
        #: the callers queued for slots, and the order they get them in
        self.order = QueueOrder(self)

    @property
    def reachable(self) -> bool:
        return not (self.down or self.paused or self.slow)

    def remember(self) -> None:
        """Keep the store as a replica might hold it now (for a failover later)."""
        self.history.append(
            (
                self.now,
                dict(self.store.models._shared),
                dict(self.store.models._callers),
                self.fleet.copy(),
                self.slots.copy(),
            )
        )
        if len(self.history) > 64:
            del self.history[:32]

    def restart_empty(self) -> None:
        self.store.close()
        self.fleet = Fleet()
        self.slots = SlotModel()
        self.order.forget()
        self.epoch += 1
        self.events.append((self.now, "restart"))
        self.cuts.append((self.now, self.epoch))

    def failover(self, lag_s: float) -> None:
        """A replica promoted with what it had ``lag_s`` ago: later writes are lost."""
        older = [h for h in self.history if h[0] <= self.now - lag_s]
        if not older:
            return self.restart_empty()
        at, shared, callers, fleet, slots = older[-1]
        models = self.store.models
        models._shared, models._callers, self.fleet, self.slots = (
            dict(shared),
            dict(callers),
            fleet.copy(),
            slots.copy(),
        )
        self.order.forget()
        self.epoch += 1
        self.events.append((at, "failover"))
        self.events.append((self.now, "promoted"))
        self.cuts += [(at, self.epoch), (self.now, self.epoch)]
        return None

    def rate(self, kind: str, keys: list[str], argv: list[Any]) -> bytes:
        """slot.lua's rate part: the decision script ``kind`` on the keys and ARGV the
        take left (its budget as the release rewrote it), answered by the store's
        models (``memory://``'s, the same interpreter of the same calls)."""
        reply: bytes = self.store.models.call(ScriptCall(kind, [len(keys), *keys, *argv]))
        return reply

    def lease(self, key: str, argv: list[Any]) -> bytes:
        """``lease.lua`` on ``key`` (the prefixed bucket key; ARGV as sent), decided by
        its Python model (``model/lease.py``, pinned to the Lua bit for bit on a bucket
        no pushback holds) on the store's state. A pushback's hold and factor are not
        applied: the lease admits no fewer than the script would, so the checks are no
        easier to pass."""
        models = self.store.models
        now_us = (self.now + self.lag) * US_PER_S
        config = bytes(argv[0]) if not isinstance(argv[0], str) else argv[0].encode()
        rate, capacity = struct.unpack_from("<dd", config)
        share = struct.unpack_from("<d", config, 24)[0] if len(config) == 32 else None
        permits = int(argv[1])
        budget = float(argv[2])
        if argv[3] not in ("", None):
            now_us = float(argv[3])
        size, unused = int(argv[4]), int(argv[5])
        taken_us = float(argv[6]) if argv[6] not in ("", None) else None
        span_us = float(argv[7]) if len(argv) > 7 else 0.0
        floor = float(argv[8]) if len(argv) > 8 else 0.0
        state = models.live(key, now_us)
        reply, after = lease(
            state,
            rate,
            capacity,
            permits,
            None if budget < 0 else budget,
            now_us,
            size,
            unused,
            taken_us,
            span_us,
            share,
            floor,
        )
        if after is not None and after is not state:
            models.put(key, after, now_us + bucket_expiry_ms(after, now_us) * 1000.0)
        v = reply.verdict
        allowed = 1.0 if v.allowed else (-1.0 if v.reserved else 0.0)
        if permits <= 0:
            return LEASE_REPLY.pack(1, 0, 0, 0, 1, 0, 0, now_us, 0, 0, 0)
        return LEASE_REPLY.pack(
            allowed,
            v.wait_us,
            v.stored,
            v.next_free_us,
            v.factor,
            v.held_us,
            reply.granted,
            now_us,
            reply.owed,
            reply.first_us,
            reply.interval_us,
        )

    def call(self, keys: list[str], run: Callable[[], Any]) -> Any:
        """One script call on ``keys``: faults first, then the model, then what Redis
        would refuse of what it wrote."""
        if self.down or self.paused:
            raise Unreachable("simulated store unreachable")
        if len({key_slot(k) for k in keys}) > 1:
            self.violations.append(
                f"at {self.now:.3f}: one call's keys in two Cluster slots: {keys}"
            )
            raise BackendError(
                "ResponseError: CROSSSLOT Keys in request don't hash to the same slot"
            )
        store = self.store.models
        before = (dict(store._shared), dict(store._callers))
        try:
            answer = run()
        except Exception as e:  # the script failed on what it was given
            store._shared, store._callers = before
            self.violations.append(f"at {self.now:.3f}: a script failed: {e!r}")
            raise BackendError(f"ResponseError: Error running script: @user_script:1: {e!r}") from e
        now_us = self.now * US_PER_S
        for states, old in zip((store._shared, store._callers), before, strict=True):
            for key, (state, until_us) in states.items():
                if old.get(key, (None,))[0] is state:
                    continue
                if (until_us - now_us) / 1000.0 >= REDIS_EXPIRY_MS:
                    store._shared, store._callers = before
                    self.violations.append(
                        f"at {self.now:.3f}: an expiry Redis refuses ({until_us - now_us:.3g} µs)"
                    )
                    raise BackendError(
                        "ResponseError: Error running script: @user_script:1: "
                        "ERR value is not an integer or out of range"
                    )
                written = getattr(state, "total", 0) - getattr(old.get(key, (None,))[0], "total", 0)
                if written > SCRIPT_ENTRIES:
                    self.violations.append(
                        f"at {self.now:.3f}: one call wrote {written} window entries"
                    )
        if self.slow:  # it ran, but the reply comes too late
            raise Unreachable("simulated store: read timed out")
        return answer


def _keys(world: World, rule: Rule, caller: str | None) -> list[str]:
    """The decision's keys: each limit's, or a bucket and its calendar quota in one key,
    the quota's (``bucket_and_quota``)."""
    limits = [bucket_home(rule)] if bucket_and_quota(rule) else rule.limits
    return [
        state_key(world.prefix, r) + (caller_part(caller) if r.per_caller else "") for r in limits
    ]


class SimBackend:
    """One process's view of the world's store (``Backend``)."""

    shared = True
    client = None

    def __init__(self, world: World, process: int = 0, clock: SimClock | None = None) -> None:
        self.world = world
        self.process = process
        self.clock = clock
        #: the Rule and caller of the slot this process is taking (``SimLimiter``)
        self.taking: tuple[Rule, str | None] | None = None

    def reserve(
        self, rule: Rule, permits: int, timeout: float | None, caller: str | None = None
    ) -> Verdict:
        world = self.world
        world.lag = 0.0 if self.clock is None else self.clock.slept
        try:
            verdict: Verdict = world.call(
                _keys(world, rule, caller),
                lambda: world.store.reserve(rule, permits, timeout, caller),
            )
        finally:
            world.lag = 0.0
        return verdict

    def pushback(
        self, rule: Rule, retry_after: float | None, caller: str | None = None
    ) -> tuple[float, float]:
        world = self.world
        answer: tuple[float, float] = world.call(
            _keys(world, rule, caller), lambda: world.store.pushback(rule, retry_after, caller)
        )
        return answer

    def peek(self, rule: Rule) -> tuple[LimitState | None, float]:
        return self.world.store.peek(rule)

    def peek_pushback(self, rule: Rule) -> tuple[PushbackState | None, float]:
        return self.world.store.peek_pushback(rule)

    def subscribe(self, channel: str, heard: Callable[[bytes | None], None]) -> None:
        """No grant is heard here (``SimLimiter`` asks instead)."""

    def prepare(self) -> None:
        if not self.world.reachable:
            raise Unreachable("simulated store unreachable")

    def script(self, call: ScriptCall) -> Any:
        world = self.world
        numkeys = int(call.args[0])
        keys = [str(k) for k in call.args[1 : 1 + numkeys]]
        if call.name == "lease":
            world.lag = 0.0 if self.clock is None else self.clock.slept
            try:
                reply: bytes = world.call(keys, lambda: world.lease(keys[0], call.args[2:]))
            finally:
                world.lag = 0.0
            if int(call.args[3]) > 0:
                world.leased.append((self.process, keys[0], world.now + world.lag))
            return reply
        if call.name not in ("slot", "slot_renew"):
            raise Unreachable(f"simulated store: no model of {call.name}")
        if call.name == "slot" and call.args[1 + numkeys] == "take":
            decision = keys[SLOT_KEYS:]
            assert self.taking is not None, "a take outside SimLimiter._take_slot"
            rule, caller = self.taking
            expected = _keys(world, rule, caller)
            if decision[: len(expected)] != expected:
                world.violations.append(
                    f"at {world.now:.3f}: a take's keys {decision} are not its rule's {expected}"
                )
            world.owners[str(call.args[1 + numkeys + 3])] = self.process
        return world.call(keys, lambda: self._slot(call, keys))

    def _slot(self, call: ScriptCall, keys: list[str]) -> Any:
        """A slot script call on the store's model; the queue's order kept beside it."""
        world = self.world
        now_ms = world.now * 1000.0
        found = world.slots.interfaces.get(keys[0])
        # the places the call counts (those lapsed by now it drops first) and the leases
        queue = (
            {}
            if found is None
            else {w: t for w, t in found.queue.items() if found.lapses.get(w, 0.0) > now_ms}
        )
        leases = set() if found is None else set(found.leases)
        published = len(world.slots.published)
        reply = world.slots.run(call, now_ms, world.rate)
        after = world.slots.interfaces.get(keys[0])
        for who, until in () if after is None else after.leases.items():
            if who not in leases:  # leased now (taken, or handed over): when, how long
                world.leased_slots[who] = Leased(world.now, until, keys[0], world.epoch)
        if call.name == "slot":
            argv = [str(a) for a in call.args[1 + len(keys) : 1 + len(keys) + 5]]
            world.order.ran(keys[0], argv, self.process, queue, leases, published, reply)
        return reply

    def heartbeat(
        self, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
    ) -> Heartbeat:
        world = self.world
        if not world.reachable:
            raise Unreachable("simulated store unreachable")
        return world.fleet.beat(world.now * 1000.0, member, ttl_ms, demand)

    def members(self) -> tuple[list[tuple[str, float]], float]:
        return list(self.world.fleet.members.items()), self.world.now * 1000.0

    def close(self) -> None:
        pass


class _Listening:
    """The subscriber of a simulated process: it hears every grant (``Run._resume``)."""

    listening = True

    def stop(self) -> None:
        pass


class _Renewer:
    """No renewer thread: the run renews every process's leases at their moments."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class SimLimiter(GatewayLimiter):
    """The threaded shell, on the world's store and a clock of its own."""

    world: World
    process: int = 0
    #: the slot the last ``slot()`` took through the store (None: none)
    last_held: Held | None = None

    def _open_backend(self, settings: Settings) -> bool:
        super()._open_backend(settings)  # memory://: nothing opened
        self.backend = SimBackend(self.world, self.process, cast(SimClock, self.clock))
        self._renewer = _Renewer()  # type: ignore[assignment]
        # the grants the store publishes are handed to every process (Run._resume)
        self._slotting.subscribe(lambda heard: _Listening())
        return True

    def _take_slot(self, rule: Rule, budget_s: float, key: str | None) -> Held:
        backend = cast(SimBackend, self.backend)
        backend.taking = (rule, key)
        try:
            held = super()._take_slot(rule, budget_s, key)
        finally:
            backend.taking = None
        self.last_held = held
        return held


# --- scenarios ------------------------------------------------------------------------

URLS = ("/a", "/b", "}c{", "/d")
CHANNEL = "SUP"
KEYS = (None, "bad", "vip", "k1", "{x}", "ü\x00")
PRIORITIES = ("critical", "default", "sheddable_plus", "sheddable")
RESERVES = (
    "sheddable=0.5",
    "default=0.1,sheddable_plus=0.3,sheddable=0.5",
    "default=0.9",
    "sheddable_plus=0.25",
)


#: The interface the calendar quotas are drawn on. Its calls have bounded budgets: a
#: call that may wait beyond the next two periods is counted in the last period the
#: store is told of, and after a quota's worth of such calls every later one is
#: admitted at one moment (``limits.lua``, ``bucket.lua`` and their model; shown by
#: ``tests/sim/test_sim_calendar.py``).
CALENDAR_URL = "/q"
#: Calendar quotas' zones: none, a US and a European DST, a half-hour DST.
ZONES = ("UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe")
#: A renewal other than the default, per period: 02:30 is skipped on a spring-forward
#: night in New York and Berlin; the 30th is February's last day.
RENEWS = {"day": "02:30", "week": "sun 02:30", "month": "30 00:00"}
#: Moments a scenario's world may start just before (epoch s, 2026): DST starts and
#: ends (New York, Berlin, Lord Howe), New York's 02:30 skipped, and months' ends
#: (UTC, and midnight in New York).
TURNS = (
    1_772_953_200.0,  # 2026-03-08 07:00 UTC: New York springs forward
    1_772_955_000.0,  # 07:30 UTC: 02:30 that night, read as 03:30 EDT
    1_793_512_800.0,  # 2026-11-01 06:00 UTC: New York falls back
    1_774_746_000.0,  # 2026-03-29 01:00 UTC: Berlin springs forward
    1_792_890_000.0,  # 2026-10-25 01:00 UTC: Berlin falls back
    1_775_314_800.0,  # 2026-04-04 15:00 UTC: Lord Howe goes back half an hour
    1_769_904_000.0,  # 2026-02-01 00:00 UTC: January's end
    1_772_341_200.0,  # 2026-03-01 05:00 UTC: February's end in New York
    1_798_761_600.0,  # 2027-01-01 00:00 UTC: the year's end
)
#: How far the clock may jump (s).
JUMPS = (3_600.0, 86_399.0, 604_800.0, 2_678_400.0)


@dataclass
class Step:
    """One thing that happens at ``at`` seconds: a call, a fault, an edit, a tick."""

    at: float
    what: str
    args: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Step({self.at!r}, {self.what!r}, {self.args!r})"


@dataclass
class Scenario:
    seed: int
    processes: list[float]  # each process's clock skew (s)
    policy: str
    rows: list[dict[str, Any]]
    steps: list[Step]
    breaker_s: float = 1.0
    heartbeat_s: float = 1.0
    reload_s: float = 1.0
    epoch_s: float = EPOCH_S  # the wall clock at time 0
    #: the reloads read a table (``Registry.reload``), not the rows as they are
    table: bool = False


def _row(rnd: random.Random, config_id: int, url: str) -> dict[str, Any]:
    algorithm = rnd.choice(
        ("token_bucket", "token_bucket", "warm_up", "sliding_window", "fixed_window")
    )
    rate = rnd.choice((1, 2, 3, 5, 10, 25, 100, 1000, 1_000_000))
    row: dict[str, Any] = {
        "config_id": config_id,
        "interface_url": url,
        "rate_limit": rate,
        "cache": rnd.choice((None, 0.0, 0.5, 2.0)),
        "status": rnd.choice((1, 1, 1, 1, 0)),
        "algorithm": algorithm,
        "period_seconds": rnd.choice((1, 1, 1, 2, 10)),
    }
    if algorithm == "token_bucket" and rnd.random() < 0.3:
        row["max_permits"] = rnd.choice((1, rate, 3 * rate))
    if algorithm == "warm_up":
        row["warmup_period"] = rnd.choice((0.5, 3.0, 1e-305))
    if rnd.random() < 0.25:
        row["per_caller"] = 1
        if rnd.random() < 0.5:
            row["caller_key"] = rnd.choice(KEYS[1:])
    if rnd.random() < 0.1:
        row["shadow"] = 1
    if rnd.random() < 0.2:
        row["max_concurrent"] = rnd.choice((1, 2, 5))
    return row


def scenario(seed: int, length_s: float = 3.0) -> Scenario:
    """A random scenario: rows over every column, calls over every argument, faults."""
    rnd = random.Random(seed)
    side = random.Random(~seed)
    processes = [rnd.choice((0.0, 0.0, rnd.uniform(-3, 3))) for _ in range(rnd.randint(1, 4))]
    policy = rnd.choice(("share", "share", "share", "local", "allow", "deny"))
    urls = rnd.sample(URLS, rnd.randint(1, len(URLS)))
    rows: list[dict[str, Any]] = []
    for url in urls:
        for _ in range(rnd.choice((1, 1, 1, 2))):
            rows.append(_row(rnd, len(rows) + 1, url))
    if rnd.random() < 0.4:  # a channel cap over some of them
        rows.append(
            {
                "config_id": len(rows) + 1,
                "interface_url": "*",
                "channel_type": CHANNEL,
                "rate_limit": rnd.choice((2, 5, 30)),
                "cache": 0.5,
                "status": 1,
            }
        )
        for row in rows:
            if row["interface_url"] != "*" and rnd.random() < 0.8:
                row["channel_type"] = CHANNEL
    steps: list[Step] = []
    t = 0.0
    faults = 0
    while t < length_s:
        t = round(t + rnd.expovariate(40.0), 4)
        roll = rnd.random()
        if roll < 0.03 and faults < 3:
            faults += 1
            kind = rnd.choice(("down", "down", "paused", "slow", "restart", "failover", "db"))
            span = rnd.choice((0.3, 1.5, 4.0))
            steps.append(Step(t, kind, {"for": span, "lag": rnd.choice((0.05, 0.5))}))
        elif roll < 0.05:
            row = rnd.choice(rows)
            change = rnd.choice(("rate_limit", "status", "algorithm", "switch"))
            value: Any = {
                "rate_limit": rnd.choice((0, 1, 5, 50)),
                "status": rnd.choice((0, 1)),
                "algorithm": rnd.choice(("token_bucket", "sliding_window", "fixed_window")),
                "switch": rnd.choice((True, False, True)),
            }[change]
            steps.append(Step(t, "edit", {"id": row["config_id"], change: value}))
        elif roll < 0.07:
            steps.append(
                Step(
                    t,
                    "pushback",
                    {
                        "p": rnd.randrange(len(processes)),
                        "url": rnd.choice(urls),
                        "retry": rnd.choice((None, 0.2, 1.0)),
                    },
                )
            )
        elif roll < 0.12:
            steps.append(
                Step(
                    t,
                    "slot",
                    {
                        "p": rnd.randrange(len(processes)),
                        "url": rnd.choice(urls),
                        "key": rnd.choice(KEYS),
                        "hold": rnd.choice((0.05, 0.5, 2.0)),
                    },
                )
            )
            # drawn on a second stream, so the scenarios of a seed stay as they were:
            # several slots at once, and often as a caller some row names
            slot = steps[-1].args
            slot["n"] = side.choice((1, 2, 3))
            named = [r["caller_key"] for r in rows if r.get("caller_key") is not None]
            if named and side.random() < 0.6:
                slot["key"] = side.choice(named)
        else:
            steps.append(
                Step(
                    t,
                    "call",
                    {
                        "p": rnd.randrange(len(processes)),
                        "op": rnd.choice(("try_acquire", "decide", "decide", "reserve", "acquire")),
                        "url": rnd.choice((*urls, "/unlimited")),
                        "permits": rnd.choice((1, 1, 1, 1, 2, 7, 1_000_000, 2**31 - 1)),
                        "timeout": rnd.choice((None, None, 0, 0.05, 1.0, 1e16)),
                        "key": rnd.choice(KEYS),
                        "n": rnd.choice((1, 1, 2, 5)),
                    },
                )
            )
    # drawn on a third stream, so the scenarios of a seed stay as they were: priority
    # classes (rows' reserves and classes, calls' priorities), and a process killed
    # (SIGKILL: it vanishes with the slots it holds)
    extra = random.Random(seed * 7919 + 1)
    for row in rows:
        if extra.random() < 0.3:
            row["reserve"] = extra.choice(RESERVES)
        if extra.random() < 0.15:
            row["priority"] = extra.choice(("critical", "default", "sheddable"))
    if any("reserve" in row or "priority" in row for row in rows):
        for step in steps:
            if step.what in ("call", "slot"):
                # a class below critical waits out its reply's wait and asks again, on
                # any budget (acquire's too): a call of more than its class can ever get
                # at once is refused at once
                step.args["priority"] = extra.choice((None, None, *PRIORITIES))
    if len(processes) > 1 and extra.random() < 0.3:
        kill = Step(
            round(extra.uniform(0.2, length_s), 4), "kill", {"p": extra.randrange(len(processes))}
        )
        steps.append(kill)
    # drawn on a fourth stream, so the scenarios of a seed stay as they were: rate
    # leases (``leaseMs``) on token buckets (the reload ignores one elsewhere, with a
    # warning), and, where a row has one, a process killed while it holds a lease; not
    # on the fastest rows (a debt lease queues a permit at a time: up to R x leaseMs)
    more = random.Random(seed * 104_729 + 3)
    for row in rows:
        if row.get("algorithm") == "token_bucket" and more.random() < 0.4:
            lease_ms = more.choice((20, 200, 500, 1000))
            if row["rate_limit"] <= 1000:
                row["lease_ms"] = lease_ms
    leases = any("lease_ms" in row for row in rows) and len(processes) > 1
    if leases and more.random() < 0.3 and not any(s.what == "kill" for s in steps):
        at = round(more.uniform(0.2, length_s), 4)
        steps.append(Step(at, "kill", {"p": more.randrange(len(processes))}))
    # drawn on a fifth stream: calendar quotas (a day, a week or a month in a time
    # zone) on an interface of their own, with calls on it of bounded budgets (a call
    # waiting beyond the next two periods breaks the quota: CALENDAR_URL); the world
    # starting just before a DST change or a month's end, and the clock jumping ahead
    # (an hour, a day less a second, a week, a month)
    cal = random.Random(seed * 15_485_863 + 5)
    epoch_s = EPOCH_S
    if cal.random() < 0.3:
        if cal.random() < 0.5:  # a rate limit beside the quotas
            rows.append(
                {
                    **_row(cal, len(rows) + 1, CALENDAR_URL),
                    "algorithm": "token_bucket",
                    "status": 1,
                    "rate_limit": cal.choice((1, 5, 100)),
                }
            )
        for _ in range(cal.choice((1, 1, 2))):
            period = cal.choice(("day", "week", "month"))
            rows.append(
                {
                    "config_id": len(rows) + 1,
                    "interface_url": CALENDAR_URL,
                    "rate_limit": cal.choice((1, 3, 10, 50)),
                    "cache": cal.choice((None, 0.0, 0.5)),
                    "status": 1,
                    "quota_period": period,
                    "time_zone": cal.choice(ZONES),
                    "quota_renews": cal.choice((None, RENEWS[period])),
                }
            )
            if cal.random() < 0.25:
                rows[-1]["per_caller"] = 1
        epoch_s = cal.choice(TURNS) - round(cal.uniform(0.0, 2.5), 3)
        if cal.random() < 0.6:
            at = round(cal.uniform(0.3, length_s), 4)
            steps.append(Step(at, "jump", {"by": cal.choice(JUMPS)}))
        for _ in range(cal.randint(3, 15)):
            args = {
                "p": cal.randrange(len(processes)),
                "op": cal.choice(("try_acquire", "decide", "reserve")),
                "url": CALENDAR_URL,
                "permits": cal.choice((1, 1, 1, 2, 7)),
                "timeout": cal.choice((0, 0.05, 1.0)),
                "key": cal.choice((None, None, "k1", "bad")),
                "n": cal.choice((1, 1, 2, 4)),
            }
            steps.append(Step(round(cal.uniform(0.0, length_s), 4), "call", args))
    # a sixth: the reloads read the rows from a table, with the real reload (the
    # read costs several times the rest of a scenario: one in sixteen)
    table = random.Random(seed * 32_452_843 + 6).random() < 1 / 16
    # a seventh: callers queued for a slot (a wait budget), where a row has a cap
    queue = random.Random(seed * 49_979_687 + 7)
    capped = sorted({r["interface_url"] for r in rows if r.get("max_concurrent")})
    if capped and queue.random() < 0.5:
        for _ in range(queue.randint(2, 8)):
            args = {
                "p": queue.randrange(len(processes)),
                "url": queue.choice(capped),
                "key": None,
                "hold": queue.choice((0.2, 0.5, 1.0)),
                "budget": queue.choice((0.3, 1.0, 2.0)),
                "n": queue.choice((2, 3, 4)),  # callers at once: some wait in the queue
            }
            steps.append(Step(round(queue.uniform(0.0, length_s), 4), "queue", args))
    # an eighth: where a row holds a reserve or a class, the queued callers' classes
    # (critical takes a place in the queue, the classes below it none)
    classes = random.Random(seed * 86_028_121 + 8)
    if any("reserve" in row or "priority" in row for row in rows):
        for step in steps:
            if step.what == "queue":
                step.args["priority"] = classes.choice((None, "critical", *PRIORITIES))
    return Scenario(seed, processes, policy, rows, steps, epoch_s=epoch_s, table=table)


# --- running one ----------------------------------------------------------------------


@dataclass
class Admission:
    """A call that went ahead: when, where, and who decided it."""

    at: float
    decided: float  # when its permits left the store (a lease row: its lease's moment)
    process: int
    url: str
    key: str | None
    permits: int
    rule: Rule
    by_store: bool
    outage: int  # the world's outage it fell in (-1: none)
    parts: tuple[float, float]  # the process's claim (or 1/N) and 1/N, then
    rank: int = 0  # its class (Priority.rank: 0 critical ... 3 sheddable)
    #: from when its permits count as given out one by one (``_most_over``); a
    #: lease's stored permits spent in-process: all at once, when they went ahead
    given: float | None = None
    #: the store's epoch its permits left (a restart at the moment it was decided
    #: comes before it or after it)
    epoch: int = 0


@dataclass
class Queued:
    """A ``slot()`` call waiting in the queue: its engine's steps, parked at a wait
    until ``until`` (world time) or a grant wakes its waiter."""

    process: int
    step: Step
    steps: Any  # the engine's generator (core/slot_steps.py, take_slot)
    waiter: Waiter
    taking: Taking
    rule: Rule
    since: float  # when it asked
    until: float = 0.0
    rank: int = 0  # its class (Priority.rank)


@dataclass
class Hold:
    """A slot a process holds until ``until``."""

    until: float
    process: int
    url: str
    stack: ExitStack
    cap: int | None  # the maxConcurrent it was taken under (None: no cap then)
    by_store: bool  # taken through the store (not the failure policy)
    lease_id: str | None  # its lease in the store (None: none, as decide's)
    taken: float
    epoch: int  # the store's epoch it was taken in

    def keys(self, world: World) -> str | None:
        """The leases key of the slots it was taken among (None: no lease). A channel
        row added or removed moves an interface's keys (docs/cluster.md): slots held
        under the old ones are not counted under the new, as after a restart."""
        leased = None if self.lease_id is None else world.leased_slots.get(self.lease_id)
        return None if leased is None else leased.key


class Violation(AssertionError):
    """A promise broken; the message says which, where and when."""


def _documented(error: BaseException, step: Step) -> bool:
    """An exception the docs name for this call."""
    text = str(error)
    if isinstance(error, (InterfaceClosed, Refused)):
        return True
    if isinstance(error, BackendUnavailable):
        return True  # deny, and an acquire beyond this process's part during an outage
    if isinstance(error, (TypeError, ValueError)) and type(error) in (TypeError, ValueError):
        return any(text.startswith(f"{arg} must") for arg in ("url", "permits", "timeout", "key"))
    return False


class Run:
    """One scenario carried out: the world, the processes, what happened."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.world = World(epoch_s=sc.epoch_s)
        self.rows = [dict(r) for r in sc.rows]
        self.switch = True
        self.db_away_until = -1.0
        self.admissions: list[Admission] = []
        #: keep the replica's history only where a failover may read it
        self.failovers = any(s.what == "failover" for s in sc.steps)
        self.outages: list[list[float]] = []  # [start, end] of each time the store was away
        self.reloads: list[tuple[float, int, tuple[Any, ...]]] = []
        self.held: list[Hold] = []  # slots held now
        #: process -> when it was killed (it vanished: no release, no renewal, no beat)
        self.killed: dict[int, float] = {}
        self.corpses: list[Hold] = []  # what the killed processes held, never given back
        #: callers queued for a slot (a budget above 0), their ``slot()`` parked at a wait
        self.queued: list[Queued] = []
        #: grants the store published that the processes have heard (of this model)
        self.heard = 0
        self.heard_from: SlotModel | None = None
        #: (process, bucket key) -> the moment of its latest lease call that asked for
        #: permits: when the permits its lease holds left the store
        self.lease_taken: dict[tuple[int, str], float] = {}
        #: id of a permit a lease scheduled as debt -> (that entry, its lease call's moment)
        self.debt_taken: dict[int, tuple[tuple[float, float], float]] = {}
        self.limiters: list[SimLimiter] = []
        #: the limits table and the switch, one in-memory database the fleet reads (in
        #: a scenario drawn to; the others hand the rows to the reload's rules)
        self.table: Engine | None = None
        if sc.table:
            self.table = create_engine(
                "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
            )
            Base.metadata.create_all(self.table, tables=[CONF, SWITCH])
            self._write_table()
        for i, skew in enumerate(sc.processes):
            SimLimiter.world = self.world
            SimLimiter.process = i
            lim = SimLimiter(
                Settings(
                    redis_url="memory://",
                    database_url="sqlite://",
                    on_backend_error=sc.policy,
                    breaker_seconds=sc.breaker_s,
                    fleet_heartbeat=sc.heartbeat_s,
                    reload_interval=sc.reload_s,
                    metrics=False,
                    key_prefix=self.world.prefix,
                    audit_sql_changes=False,
                    slot_lease=SLOT_LEASE_S,
                ),
                clock=SimClock(self.world, skew),
            )
            lim._fleet.member = f"p{i}"
            if self.table is not None:
                lim.registry._engine = self.table
            self.limiters.append(lim)
        for lim in self.limiters:
            self._start(lim)

    def _start(self, lim: SimLimiter) -> None:
        lim._starting()
        failure = attempt(lim.backend.prepare)
        lim._prepared(failure)
        if failure is None:
            self._beat(lim)
        lim._running(self._reload(lim))

    # the background work of a started limiter, carried out at its moments
    def _beat(self, lim: SimLimiter) -> None:
        fleet = lim._fleet
        demand = fleet.demand(lim.registry.snapshot.rules)
        tallies = lim._tallies()
        lim._beat(attempt(lim.backend.heartbeat, fleet.member, fleet.ttl_ms, demand, tallies))
        for rule, permits in lim._charges():
            if not isinstance(attempt(lim.backend.reserve, rule, permits, None), BackendError):
                fleet.charged += permits
        for call in lim._lease_returns():  # leases a reload ended
            attempt(lim.backend.script, call)

    def _reload(self, lim: SimLimiter) -> Any:
        """The process's reload: the real one (``Registry.reload``: the table read and
        each value converted as the driver gives it, the rules built, the switch read,
        the snapshot swapped, the listeners told) on the world's table; the database
        away: a failed read, the last good snapshot kept."""
        registry = lim.registry
        if self.world.now < self.db_away_until:
            summary = registry._failed(ConnectionError("simulated database away"))
            for listener in registry.listeners:
                listener(summary)
            return summary
        if self.table is not None:
            return registry.reload()
        # the rows handed to the reload's rules as they are: the same swap, no read
        rows = [ConfRow(**{"channel_type": None, "interface_no": None, **r}) for r in self.rows]
        ruleset = build_rules(rows, lim.settings.default_cache, lim.settings.default_time_zone)
        old = registry.snapshot
        new = Snapshot(
            rules=MappingProxyType(dict(ruleset.rules)),
            switch=self.switch,
            switch_source="database",
            skipped=ruleset.skipped,
            loaded_at=lim.clock.time(),
            disabled=ruleset.disabled,
            named=ruleset.named,
            warnings=ruleset.warnings,
        )
        registry.snapshot = new
        summary = registry._succeeded(old, new)
        for listener in registry.listeners:
            listener(summary)
        return summary

    def _write_table(self) -> None:
        """The rows and the switch, written to the world's table as an operator's SQL
        would (the columns named as in the table)."""
        if self.table is None:
            return
        with self.table.begin() as conn:
            conn.execute(delete(CONF))
            for r in self.rows:  # a column a row leaves out: the table's default
                conn.execute(insert(CONF).values({COLUMNS[k]: v for k, v in r.items()}))
            conn.execute(delete(SWITCH))
            conn.execute(insert(SWITCH).values(switchId=SWITCH_ROW_ID, enabled=int(self.switch)))

    def _applied(self) -> None:
        """A reload applies the table: every live process whose reload read it decides on
        the rules its rows make now (as ``build_rules`` makes them from the values
        written) and on the switch as written."""
        if self.world.now < self.db_away_until or self.table is None:
            return  # (without a table the reload's rules are made from the rows as they are)
        rows = [ConfRow(**{"channel_type": None, "interface_no": None, **r}) for r in self.rows]
        settings = self.limiters[0].settings
        expected = build_rules(rows, settings.default_cache, settings.default_time_zone).rules
        for p, lim in enumerate(self.limiters):
            snapshot = lim.registry.snapshot
            if p in self.killed:
                continue
            if dict(snapshot.rules) != dict(expected) or snapshot.switch != self.switch:
                changed = sorted(
                    url
                    for url in expected.keys() | snapshot.rules.keys()
                    if expected.get(url) != snapshot.rules.get(url)
                )
                raise Violation(
                    f"at {self.world.now:.3f}: process {p}'s reload did not apply the table "
                    f"(rules of {changed} differ; switch {snapshot.switch}, written "
                    f"{self.switch})"
                )

    def _table_now(self) -> tuple[Any, ...]:
        return (tuple(tuple(sorted(r.items())) for r in self.rows), self.switch)

    # --- the steps ----------------------------------------------------------------------

    def run(self, check: Checker) -> None:
        steps = sorted(self.sc.steps, key=lambda s: s.at)
        ends: list[tuple[float, str]] = []
        next_beat = self.sc.heartbeat_s
        next_reload = self.sc.reload_s
        renew_s = SLOT_LEASE_S / 3
        next_renew = renew_s
        # a killed holder's leases lapse within a lease of its death: watched that long
        watch = max((t + SLOT_LEASE_S + renew_s for t in self.killed_at()), default=0.0)
        i = 0
        while i < len(steps) or self.held or ends or self.queued or self.world.now < watch:
            at = steps[i].at if i < len(steps) else math.inf
            # background moments and fault ends due before the next step
            due = min(
                next_beat,
                next_reload,
                next_renew,
                *(e[0] for e in ends),
                *(h.until for h in self.held),
                *(q.until for q in self.queued),
                at,
            )
            if due < at:
                self._advance(due)
                live = [lim for p, lim in enumerate(self.limiters) if p not in self.killed]
                if due == next_beat:
                    next_beat += self.sc.heartbeat_s
                    for lim in live:
                        self._beat(lim)
                    if self.failovers:
                        self.world.remember()
                if due == next_reload:
                    next_reload += self.sc.reload_s
                    table = self._table_now()
                    for lim in live:
                        self._reload(lim)
                    self._applied()
                    self.reloads.append((due, 0, table))
                if due == next_renew:
                    next_renew += renew_s
                    for lim in live:
                        lim._renew_slots()
                for end in [e for e in ends if e[0] <= due]:
                    ends.remove(end)
                    self._end_fault(end[1])
                for held in [h for h in self.held if h.until <= due]:
                    self._give_back(held)
                self._resume()
                check.step(self)
                continue
            step = steps[i]
            i += 1
            self._advance(step.at)
            if step.what == "jump":
                # the whole timeline jumps ahead (a fleet frozen, then thawed), the
                # steps and faults still to come with it; not while a slot is held
                # (its renewals would have lapsed: the check of slots says so)
                if self.held:
                    continue
                by = step.args["by"]
                self.world.now += by
                self.world.events.append((self.world.now, "jump"))
                self.world.order.forget()  # every place lapses with the jump
                steps[i:] = [dataclasses.replace(s, at=s.at + by) for s in steps[i:]]
                ends[:] = [(t + by, what) for t, what in ends]
                next_beat, next_reload, next_renew = (
                    next_beat + by,
                    next_reload + by,
                    next_renew + by,
                )
                self.db_away_until += by
                watch += by
                check.step(self)
                continue
            self._do(step, ends)
            self._resume()
            check.step(self)
        check.step(self)

    def killed_at(self) -> list[float]:
        return [s.at for s in self.sc.steps if s.what == "kill"]

    def _advance(self, to: float) -> None:
        to = max(to, self.world.now)
        while self.failovers and self.world.now < to:  # the replica's history, every 0.05 s
            self.world.now = min(to, (math.floor(self.world.now * 20 + 1e-9) + 1) / 20)
            self.world.remember()
        self.world.now = to
        self._mark_outage()

    def _mark_outage(self) -> None:
        away = not self.world.reachable
        if away and (not self.outages or self.outages[-1][1] >= 0):
            self.outages.append([self.world.now, -1.0])
        if not away and self.outages and self.outages[-1][1] < 0:
            self.outages[-1][1] = self.world.now
            self.world.order.back_at = self.world.now

    def _end_fault(self, what: str) -> None:
        world = self.world
        if what == "db":
            return
        setattr(world, what, False)
        self._mark_outage()

    def _do(self, step: Step, ends: list[tuple[float, str]]) -> None:
        w, a = step.what, step.args
        world = self.world
        if a.get("p") in self.killed:  # a killed process does nothing more
            return
        if w == "kill":
            # SIGKILL: the process vanishes with what it holds; nothing is given back
            self.killed[a["p"]] = world.now
            # kept referenced: a slot's generator, collected, would give its slot back
            self.corpses += [h for h in self.held if h.process == a["p"]]
            self.held = [h for h in self.held if h.process != a["p"]]
            world.order.killed(a["p"])
            world.events.append((world.now, "kill"))
            return
        if w in ("down", "paused", "slow"):
            if not world.reachable:
                return
            setattr(world, w, True)
            world.events.append((world.now, w))
            ends.append((world.now + a["for"], w))
            self._mark_outage()
        elif w == "restart":
            world.restart_empty()
        elif w == "failover":
            world.failover(a["lag"])
        elif w == "db":
            self.db_away_until = world.now + a["for"]
        elif w == "edit":
            if "switch" in a:
                self.switch = a["switch"]
            else:
                for row in self.rows:
                    if row["config_id"] == a["id"]:
                        row.update({k: v for k, v in a.items() if k != "id"})
            self._write_table()
        elif w == "pushback":
            lim = self.limiters[a["p"]]
            lim.pushback(a["url"], a["retry"])
        elif w == "slot":
            for _ in range(a.get("n", 1)):
                self._slot(step)
        elif w == "queue":
            for _ in range(a.get("n", 1)):
                self._queue(step)
        elif w == "call":
            for _ in range(a.get("n", 1)):
                self._call(step)

    def _route(self, lim: SimLimiter, url: str, key: str | None) -> Rule | None:
        snapshot = lim.registry.snapshot
        if not snapshot.switch:
            return None
        if key is not None and snapshot.named:
            return snapshot.named.get((url, key)) or snapshot.rules.get(url)
        return snapshot.rules.get(url)

    def _parts(self, lim: SimLimiter, rule: Rule) -> tuple[float, float]:
        n = lim._fleet.size
        whole = 1.0 if n <= 1 else 1.0 / n
        claim = lim._fleet.claims.get(rule.url)
        if self.sc.policy != "share":
            return 1.0, 1.0
        return (whole if claim is None else claim), whole

    def _call(self, step: Step) -> None:
        a = step.args
        p = a["p"]
        lim = self.limiters[p]
        clock = cast(SimClock, lim.clock)
        clock.slept = 0.0
        fallbacks = lim.backend_fallbacks
        rule = self._route(lim, a["url"], a["key"])
        leased = len(self.world.leased)
        queued = list(self._debt(lim, rule))
        began = time.thread_time()
        allowed = False
        cls = a.get("priority")
        try:
            if a["op"] == "try_acquire":
                allowed = lim.try_acquire(a["url"], a["permits"], a["timeout"], a["key"], cls)
                reason = None
            elif a["op"] == "decide":
                d = lim.decide(a["url"], a["permits"], a["timeout"], a["key"], cls)
                allowed, reason = d.allowed, d.reason
            elif a["op"] == "reserve":
                v = lim.reserve(a["url"], a["permits"], a["timeout"], a["key"], cls)
                allowed = v.allowed
                if allowed:
                    clock.sleep(v.wait_us / US_PER_S)
                reason = None
            else:
                lim.acquire(a["url"], a["permits"], a["key"], cls)
                allowed, reason = True, None
        except Exception as e:
            if not _documented(e, step):
                raise Violation(f"at {self.world.now:.3f}: {a['op']}{_args(a)} raised {e!r}") from e
            return
        finally:
            spent = time.thread_time() - began
            if spent > CALL_REAL_S:
                raise Violation(
                    f"at {self.world.now:.3f}: {a['op']}{_args(a)} took {spent:.2f} s of CPU time"
                )
        if not allowed or rule is None or rule.closed:
            return
        by_fallback = lim.backend_fallbacks > fallbacks
        if reason is not None:
            by_fallback = reason == Reason.BACKEND_FALLBACK
            if reason == Reason.SHADOW or rule.shadow:
                return
        if rule.shadow:
            return
        taken, spent = self._lease_taken(p, lim, rule, a["permits"], leased, queued)
        self._admitted(
            p,
            a["url"],
            a["key"],
            a["permits"],
            rule,
            not by_fallback,
            clock.slept,
            _rank(rule, cls),
            taken,
            spent,
        )

    @staticmethod
    def _debt(lim: SimLimiter, rule: Rule | None) -> list[tuple[float, float]]:
        """The permits ``lim``'s lease of ``rule``'s interface holds as debt, in order."""
        leases = lim._leases
        if rule is None or not rule.lease_ms or leases is None:
            return []
        lease = leases._held.get(rule.url)
        return [] if lease is None else list(lease.scheduled)

    def _lease_taken(
        self,
        p: int,
        lim: SimLimiter,
        rule: Rule,
        permits: int,
        leased: int,
        queued: list[tuple[float, float]],
    ) -> tuple[float | None, bool]:
        """When the permits a call on a lease row just went ahead with left the store:
        its own lease call's moment; or that of the lease call that scheduled the debt
        permits it took; or that of the lease its stored permits came from. None: not
        a lease row (decided now). And whether they were a lease's stored permits."""
        if not rule.lease_ms or lim._leases is None:
            return None, False
        key = state_key(self.world.prefix, rule)
        for q, k, at in self.world.leased[leased:]:
            self.lease_taken[(q, k)] = at
        after = self._debt(lim, rule)
        latest = self.lease_taken.get((p, key))
        for entry in after:  # scheduled by the lease call just made, if new
            if id(entry) not in self.debt_taken and latest is not None:
                self.debt_taken[id(entry)] = (entry, latest)
        mine = [at for q, k, at in self.world.leased[leased:] if q == p and k == key]
        if mine:
            return mine[-1], False
        kept = {id(e) for e in after}
        popped = [e for e in queued if id(e) not in kept]
        if popped:  # the last of them served it (the others were too late for anyone)
            debts = self.debt_taken
            used = [debts[id(e)][1] for e in popped[-permits:] if id(e) in debts]
            for e in popped:
                self.debt_taken.pop(id(e), None)
            if used:
                return min(used), False
        return latest, latest is not None

    def _admitted(
        self,
        p: int,
        url: str,
        key: str | None,
        permits: int,
        rule: Rule,
        by_store: bool,
        wait: float,
        rank: int = 0,
        taken: float | None = None,
        spent: bool = False,
        epoch: int | None = None,
    ) -> None:
        outage = len(self.outages) - 1 if self.outages else -1
        self.admissions.append(
            Admission(
                self.world.now + wait,
                self.world.now if taken is None else taken,
                p,
                url,
                key,
                permits,
                rule,
                by_store,
                outage,
                self._parts(self.limiters[p], rule),
                rank,
                self.world.now + wait if spent else None,
                self.world.epoch if epoch is None else epoch,
            )
        )

    def _queue(self, step: Step) -> None:
        """A ``slot()`` with a wait budget: the shell's steps for it (``take_slot``)
        carried out here, parked at each wait (a queued caller) while the world goes on,
        and resumed when a grant wakes it or its wait ends."""
        a = step.args
        lim = self.limiters[a["p"]]
        rule = self._route(lim, a["url"], a["key"])
        cls = a.get("priority")
        rank = 0 if rule is None else _rank(rule, cls)
        if rule is not None and rule.classed:  # as slot() routes it
            rule = rule.for_class(call_class(rule, None if cls is None else Priority(cls)))
        if rule is None or rule.max_concurrent is None or rule.shadow or rule.closed:
            return self._slot(step)
        clock = cast(SimClock, lim.clock)
        clock.slept = 0.0
        lease_id = lim._slotting.leases.new_id()
        budget = a["budget"]
        taking = Taking(rule, a["key"], lease_id, clock.monotonic() + budget, budget, clock=clock)
        waiter = lim._slotting.waiter(lease_id, None)
        steps = take_slot(lim, lim._slotting, taking, waiter)
        self._drive(
            Queued(a["p"], step, steps, waiter, taking, rule, self.world.now, rank=rank), None
        )
        return None

    def _drive(self, q: Queued, got: Any) -> None:
        lim = self.limiters[q.process]
        backend = cast(SimBackend, lim.backend)
        cast(SimClock, lim.clock).slept = 0.0
        a = q.step.args
        backend.taking = (q.rule, a["key"])
        try:
            while True:
                step = q.steps.send(got)
                if isinstance(step, Await):  # queued: parked until woken or its wait ends
                    q.until = self.world.now + step.seconds
                    self.queued.append(q)
                    return
                got = lim._carry_out(step)
        except StopIteration as done:
            lim._slotting.forget(q.taking.lease_id)
            self.world.order.done(q.taking.lease_id)
            self._queued_held(q, done.value)
        except Exception as e:
            lim._slotting.forget(q.taking.lease_id)
            self.world.order.done(q.taking.lease_id)
            if q.taking.placed:  # as the shell does: leave the queue
                lim._give_back(given_up(q.rule, q.taking.lease_id))
            if not _documented(e, q.step):
                raise Violation(
                    f"at {self.world.now:.3f}: queued slot{_args(a)} raised {e!r}"
                ) from e
        finally:
            backend.taking = None

    def _queued_held(self, q: Queued, held: Held) -> None:
        a = q.step.args
        lim = self.limiters[q.process]
        stack = ExitStack()
        stack.callback(lim._give_back, held)
        by_store = held.decision.reason != Reason.BACKEND_FALLBACK
        self.held.append(
            Hold(
                self.world.now + held.wait_s + a["hold"],
                q.process,
                a["url"],
                stack,
                q.rule.max_concurrent,
                by_store,
                None if held.local else held.lease_id,
                self.world.now,
                self._epoch(None if held.local else held.lease_id),
            )
        )
        if by_store and not held.local and q.rank > 0 and q.rule.max_concurrent is not None:
            self._within_room(a["url"], q.rule.max_concurrent, q.rule, a.get("priority"))
        # its permit left the store when its slot was leased: a grant heard earlier (a
        # waiter the breaker kept from asking) may be claimed later
        leased = None if held.local else self.world.leased_slots.get(held.lease_id or "")
        taken = None if leased is None else leased.at
        epoch = None if leased is None else leased.epoch
        self._admitted(
            q.process,
            a["url"],
            a["key"],
            1,
            q.rule,
            by_store,
            held.wait_s,
            q.rank,
            taken,
            epoch=epoch,
        )

    def _resume(self) -> None:
        """The grants the store published, heard by every live process; then each
        queued caller woken by one, or whose wait ended, goes on."""
        slots = self.world.slots
        if slots is not self.heard_from:
            self.heard_from, self.heard = slots, 0
        news = slots.published[self.heard :]
        self.heard = len(slots.published)
        for _, message in news:
            for p, lim in enumerate(self.limiters):
                if p not in self.killed:
                    lim._slotting.heard(message)
        for q in list(self.queued):
            if q.process in self.killed:
                self.queued.remove(q)
                continue
            woken = q.waiter._event.is_set()
            if woken or q.until <= self.world.now:
                q.waiter._event.clear()
                self.queued.remove(q)
                self._drive(q, None)

    def _slot(self, step: Step) -> None:
        a = step.args
        lim = self.limiters[a["p"]]
        clock = cast(SimClock, lim.clock)
        clock.slept = 0.0
        lim.last_held = None
        rule = self._route(lim, a["url"], a["key"])
        stack = ExitStack()
        try:
            decision = stack.enter_context(lim.slot(a["url"], 0.0, a["key"], a.get("priority")))
        except Exception as e:
            stack.close()
            if not _documented(e, step):
                raise Violation(f"at {self.world.now:.3f}: slot{_args(a)} raised {e!r}") from e
            return
        cap = None if rule is None or rule.shadow else rule.max_concurrent
        by_store = decision.reason != Reason.BACKEND_FALLBACK
        held = lim.last_held
        self.held.append(
            Hold(
                self.world.now + a["hold"],
                a["p"],
                a["url"],
                stack,
                cap,
                by_store,
                None if held is None or held.local else held.lease_id,
                self.world.now,
                self._epoch(None if held is None or held.local else held.lease_id),
            )
        )
        if not by_store and rule is not None and cap is not None:
            # taken by the failure policy: the process's part of the cap, counting the
            # slots it still holds through the store
            part = fallback_cap(lim.policy.kind, rule, lim._fleet.size)
            mine = [
                h
                for h in self.held
                if h.process == a["p"] and h.url == a["url"] and h.cap is not None
            ]
            if part is not None and len(mine) > part:
                raise Violation(
                    f"at {self.world.now:.3f}: process {a['p']} holds {len(mine)} slots of "
                    f"{a['url']} while the store is away, its part {part}"
                )
        rank = 0 if rule is None else _rank(rule, a.get("priority"))
        if by_store and held is not None and not held.local and rule is not None and rank > 0:
            # a class below critical leaves its share of the slots: it takes one only
            # while the slots held, its own included, are within the rest
            crule = rule.for_class(call_class(rule, Priority(a.get("priority") or "default")))
            if cap is not None:
                self._within_room(a["url"], cap, crule, a.get("priority"))
        if rule is not None and not rule.shadow and not rule.closed and decision.allowed:
            self._admitted(a["p"], a["url"], a["key"], 1, rule, by_store, clock.slept, rank)

    def _epoch(self, lease_id: str | None) -> int:
        """The store's epoch a slot was leased in: a grant heard before a restart may be
        claimed after it (a waiter the breaker kept from asking), of the store before."""
        leased = None if lease_id is None else self.world.leased_slots.get(lease_id)
        return self.world.epoch if leased is None else leased.epoch

    def _within_room(self, url: str, cap: int, crule: Rule, cls: str | None) -> None:
        """A slot just taken (the last held) by a class below critical, decided by its
        class's Rule ``crule``: it leaves its share of the slots, so the slots held
        through the store, its own included, are within the rest."""
        if crule.shares is None:
            return
        share = max(crule.shares[: own_limits(crule)], default=0.0)
        room = math.floor(cap - share * cap)
        among = self.held[-1].keys(self.world)
        counted = [
            h
            for h in self.held
            if h.url == url
            and h.by_store
            and h.epoch == self.world.epoch
            and h.keys(self.world) == among
        ]
        if len(counted) > room:
            raise Violation(
                f"at {self.world.now:.3f}: a {cls or 'default'} slot of {url} taken with "
                f"{len(counted)} held, its room {room} of {cap}"
            )

    def _give_back(self, held: Hold) -> None:
        self.held.remove(held)
        held.stack.close()

    def close(self) -> None:
        for held in list(self.held):
            with contextlib.suppress(Exception):
                held.stack.close()
        for lim in self.limiters:
            lim.registry.close()


def _rank(rule: Rule, cls: str | None) -> int:
    """The rank of the class a call on ``rule`` is decided in."""
    return call_class(rule, None if cls is None else Priority(cls)).rank


def _args(a: dict[str, Any]) -> str:
    shown = {k: v for k, v in a.items() if k not in ("p", "op", "n")}
    return "(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


# --- the checker ----------------------------------------------------------------------


Apart = tuple[float, int, int, float, float]
Stored = tuple[tuple[float, int], float, int, int, float]


def _limit_keys(world: World, rule: Rule, key: str | None) -> Iterator[tuple[str, Rule]]:
    for r in rule.limits:
        yield state_key(world.prefix, r) + (caller_part(key) if r.per_caller else ""), r


class Checker:
    """The promises of docs/design.md, held after each step (``step``) and over the
    whole run (``finish``)."""

    def __init__(self) -> None:
        self.checked = 0

    @staticmethod
    def _kept(run: Run, held: Hold) -> bool:
        """Whether the store still counts ``held``'s slot: a lease lapses only when its
        renewals could not reach the store for a lease's length (docs/concurrency.md);
        a slot taken without a lease (no cap on the row it was decided by) counts."""
        world = run.world
        if held.lease_id is None:
            return True
        leases_live = any(
            held.lease_id in iface.leases and iface.leases[held.lease_id] > world.now * 1000.0
            for iface in world.slots.interfaces.values()
        )
        if leases_live:
            return True
        since = world.now - SLOT_LEASE_S - SLOT_LEASE_S / 3 - 1e-6
        away = any(end < 0 or end >= since for _, end in run.outages)
        if not away:
            raise Violation(
                f"at {world.now:.3f}: the slot {held.lease_id} of process {held.process} on "
                f"{held.url}, held since {held.taken:.3f}, lost its lease with the store there"
            )
        return False

    def step(self, run: Run) -> None:
        if run.world.violations:
            raise Violation(run.world.violations[0])
        # the breaker opens only for a store that is away
        for p, lim in enumerate(run.limiters):
            if not lim.backend_healthy and run.world.reachable and not run.outages:
                raise Violation(
                    f"at {run.world.now:.3f}: process {p}'s breaker open, the store never away"
                )
        world = run.world
        now_ms = world.now * 1000.0
        lease_ms = SLOT_LEASE_S * 1000.0
        in_flight: dict[str, list[Hold]] = defaultdict(list)
        for held in run.held:
            in_flight[held.url].append(held)
        for url, holds in in_flight.items():
            # the failure policy's: per interface at most maxConcurrent in each process
            # (the policy's part, at least one); they are not counted in the store
            # when it answers again, so the store's below are checked apart
            caps = [h.cap for h in holds if h.cap is not None and not h.by_store]
            if caps and len(caps) > max(caps) * len(run.limiters) and run.sc.policy != "allow":
                raise Violation(
                    f"at {world.now:.3f}: {len(caps)} slots of {url} held, "
                    f"maxConcurrent {max(caps)}"
                )
            # the store's: at most maxConcurrent across the fleet, counting each slot
            # until the store may have lost it (restarted, failed over, or its lease
            # lapsed while the store was away for its renewals)
            among: dict[str | None, list[Hold]] = defaultdict(list)
            for h in holds:
                if (
                    h.by_store
                    and h.cap is not None
                    and h.epoch == world.epoch
                    and self._kept(run, h)
                ):
                    among[h.keys(world)].append(h)
            for counted in among.values():
                if len(counted) <= max(h.cap or 0 for h in counted):
                    continue
                raise Violation(
                    f"at {world.now:.3f}: {len(counted)} slots of {url} held through the "
                    f"store, maxConcurrent {max(h.cap or 0 for h in counted)} "
                    f"(processes {[h.process for h in counted]}, leases "
                    f"{[h.lease_id for h in counted]})"
                )
        # a killed holder's slots are free within its lease (docs/concurrency.md): no
        # live lease of a dead process runs past its death plus one lease, or past
        # what it was leased for (a slot is leased for the rate's wait and a lease from
        # when it is taken: the holder may die during that wait); a dead waiter's place
        # lapses within 2 x ASK_AGAIN_S of its last ask, so no slot is handed to it later
        for key, iface in world.slots.interfaces.items():
            for lease_id, until in iface.leases.items():
                owner = world.owners.get(lease_id, -1)
                died = run.killed.get(owner)
                if died is None or until <= now_ms:
                    continue
                leased_at, leased_until, _, _ = world.leased_slots.get(
                    lease_id, Leased(-math.inf, 0.0, key, world.epoch)
                )
                if leased_at > died + 2 * ASK_AGAIN_S + 1e-6:
                    raise Violation(
                        f"at {world.now:.3f}: {key}: lease {lease_id} handed to a waiter of "
                        f"process {owner} at {leased_at:.3f}, killed at {died:.3f}: its "
                        f"place outlived {2 * ASK_AGAIN_S:g} s without an ask"
                    )
                if until > max(died * 1000 + lease_ms, leased_until):
                    raise Violation(
                        f"at {world.now:.3f}: {key}: lease {lease_id} of process {owner}, "
                        f"killed at {died:.3f}, runs to {until / 1000:.3f} (leased at "
                        f"{leased_at:.3f} until {leased_until / 1000:.3f})"
                    )
        self.checked += 1

    def finish(self, run: Run) -> None:
        """Every span of every limit: the store's admissions, and each outage's."""
        world = run.world
        # ((decided, epoch), went ahead, permits, class, given from)
        store: dict[tuple[str, tuple[Any, ...]], list[Stored]] = defaultdict(list)
        # (went ahead, permits, process, its part, decided)
        alone: dict[tuple[str, int, tuple[Any, ...]], list[Apart]] = defaultdict(list)
        specs: dict[tuple[Any, ...], Rule] = {}
        for adm in run.admissions:
            for key, r in _limit_keys(world, adm.rule, adm.key):
                spec = (r.rate, r.period, r.burst, r.algorithm, r.warmup, r.calendar, r.lease_ms)
                specs[(key, spec)] = r
                if adm.by_store:
                    given = adm.decided if adm.given is None else adm.given
                    decided = (adm.decided, adm.epoch)
                    store[(key, spec)].append((decided, adm.at, adm.permits, adm.rank, given))
                else:
                    part = adm.parts[1] if r.caps_channel else adm.parts[0]
                    alone[(key, adm.outage, spec)].append(
                        (adm.at, adm.permits, adm.process, part, adm.decided)
                    )
        allowance = world.cuts
        for (key, spec), seen in store.items():
            r = specs[(key, spec)]
            seen.sort()
            if r.calendar is not None:
                _hold_calendar(r, seen, allowance, world.epoch_s, key)
                continue
            # a lease row: what a lease takes is spent within leaseMs of its moment, so
            # every span T holds at most C + R x (T + leaseMs) (docs/algorithms.md)
            ahead = r.per_second * r.lease_ms / 1000.0
            for segment in _split(seen, allowance):
                what = f"{key} by the store" + (f" (leaseMs {r.lease_ms})" if ahead else "")
                _hold(r, sorted((t, n, d) for t, n, _, d in segment), 1.0, ahead, what)
                # the classes below critical never into the reserve: each class and
                # those below it leave its share
                if r.reserve is None or r.warmup > 0:
                    continue
                for rank in (1, 2, 3):
                    leave = r.reserve[rank]
                    lower = sorted((t, n, d) for t, n, c, d in segment if c >= rank)
                    if leave > 0 and lower:
                        what = f"{key} by the store, classes from {list(Priority)[rank]}"
                        _hold(r, lower, 1.0, ahead, what, leave=leave)
        policy = run.sc.policy
        for (key, outage, spec), apart in alone.items():
            r = specs[(key, spec)]
            apart.sort()
            if policy == "deny":
                raise Violation(f"{key}: {len(apart)} admitted under deny while the store was away")
            if policy == "allow":
                continue
            # a heartbeat answered while the breaker is still open may change a process's
            # part: the process is held to the largest part it had in the outage
            procs: dict[int, float] = {}
            for _, _, p, part, _ in apart:
                procs[p] = max(part, procs.get(p, 0.0))
            if policy == "local":
                for p in procs:
                    _hold(
                        r,
                        [(t, n, d) for t, n, q, _, d in apart if q == p],
                        1.0,
                        0.0,
                        f"{key} process {p} alone",
                    )
                continue
            rate_part = sum(procs.values()) if procs else 1.0
            # every process's bucket holds at least one permit, and starts empty
            extra = sum(max(1.0, math.floor(r.most * part + 1e-9)) for part in procs.values())
            _hold(
                r,
                [(t, n, d, r.per_second * part) for t, n, _, part, d in apart],
                max(rate_part, 1e-9),
                extra,
                f"{key} shared out during outage {outage} (parts {procs})",
                shared=True,
            )


def _split(
    seen: list[Stored], cuts: list[tuple[float, int]]
) -> Iterator[list[tuple[float, int, int, float]]]:
    """``seen`` ((decided, the store's epoch then), went ahead, permits, class, given
    from) cut where the store lost its state (``cuts``: when, and the epoch from then
    on; at one moment the epoch says which side): each part's admissions (went ahead,
    permits, class, given from), decided between two cuts."""
    segment: list[tuple[float, int, int, float]] = []
    cut = iter(sorted(cuts))
    nxt = next(cut, (math.inf, 0))
    for decided, t, n, c, given in seen:
        while decided >= nxt:
            if segment:
                yield segment
            segment = []
            nxt = next(cut, (math.inf, 0))
        segment.append((t, n, c, given))
    if segment:
        yield segment


def _most_over(seen: Sequence[tuple[float, ...]], rate: float) -> tuple[float, float]:
    """The most the admissions ``seen`` (time, permits) put beyond R x T over any span,
    and where that span ends: max over spans [a, b] of (admitted in [a, b]) - R (b - a).

    A call of n permits that went ahead at t, decided at d (``seen``'s third, if any;
    else t), is counted as the bucket gives them out: what it had stored at d, the rest
    one stable interval apart, as n one-permit calls made one after another would be,
    the last due at t (the call goes ahead then). So the k-th (k = 1 ... n) at
    max(d, t - (n - k) / R), and those after the first from d on as flowing evenly at R
    (at most one more than the permits themselves in any span, never fewer); at the
    rate of the bucket that gave them (``seen``'s fourth: a process's part during an
    outage; else R). So with
    S(x) the permits counted by time x, f(x) = S(x) - R x is linear
    between the moments where something starts or ends, and the most is
    max over b of f(b) - min over a <= b of f(a-), taken at those moments."""
    mass: dict[float, float] = defaultdict(float)
    slope: dict[float, float] = defaultdict(float)
    for t, n, *rest in seen:
        # its own bucket's rate (a process's part of it, while the store is away)
        own = rest[1] if len(rest) > 1 else rate
        if n <= 1 or own <= 0:
            mass[t] += n
            continue
        d = min(rest[0], t) if rest else -math.inf
        first = t - (n - 1) / own
        if first < d:  # what the bucket had stored at d, at once
            mass[d] += 1 + (d - first) * own
            first = d
        else:
            mass[first] += 1
        slope[first] += own
        slope[t] -= own
    f, lowest, steep, prev = 0.0, math.inf, -rate, None
    most, at = -math.inf, -math.inf
    for x in sorted(mass.keys() | slope.keys()):
        if prev is not None:
            f += steep * (x - prev)
        lowest = min(lowest, f)  # f just before x: a span may start here
        f += mass[x]
        steep += slope[x]
        if f - lowest > most:
            most, at = f - lowest, x
        prev = x
    return most, at


def _hold(
    r: Rule,
    seen: Sequence[tuple[float, ...]],
    part: float,
    extra: float,
    what: str,
    shared: bool = False,
    leave: float = 0.0,
) -> None:
    """The admissions ``seen`` (time, permits, and when decided if known) of limit ``r``
    at ``part`` of its rate:
    a bucket's at most C + R x T over every span; a window's at most its limit per window.
    ``leave``: the share of the capacity (a bucket's C, a window's limit) the calls in
    ``seen`` had to leave (priority classes): at most (1 - leave) C + R x T, or the limit
    less the share (whole permits). ``extra``: shared, the whole allowance beyond R x T;
    else permits beyond C (a lease row's R x leaseMs)."""
    if not seen:
        return
    if r.calendar is not None:
        return
    if not r.spec.window:
        rate = r.per_second * part
        cap = (extra if shared else r.burst * (1.0 - leave) + extra) + 1e-6
        # float error: f's terms are as large as R x t
        slack = 1e-9 * rate * max(abs(seen[0][0]), abs(seen[-1][0]), 1.0)
        most, t = _most_over(seen, rate)
        if most > cap + slack:
            raise Violation(
                f"{what}: {r.algorithm} {r.rate}/{r.period}s (C={r.burst}): more than "
                f"C + R x T: {most:.6g} beyond R x T, at most {cap - 1e-6:.6g}, in a span "
                f"ending at {t:.3f} (admitted {seen[:12]}...)"
            )
        return
    limit = extra if shared else r.rate - math.floor(leave * r.rate + 1e-9)
    if r.algorithm == "fixed_window":
        limit *= 2  # a span of one period may straddle two windows
    span = r.period - 1e-6
    lo = 0
    count = 0.0
    for t, n, *_ in seen:
        count += n
        while seen[lo][0] <= t - span:
            count -= seen[lo][1]
            lo += 1
        if count > limit + 1e-6:
            raise Violation(
                f"{what}: {r.algorithm} {r.rate}/{r.period}s: {count} admitted in one "
                f"window ending at {t:.3f} (at most {limit:g})"
            )


def _hold_calendar(
    r: Rule,
    seen: list[Stored],
    cuts: list[tuple[float, int]],
    epoch_s: float,
    key: str,
) -> None:
    """A calendar quota: the permits the store admitted in each of its periods (the
    period that holds the moment they went ahead, after any wait for a renewal, on the
    wall clock: ``Calendar.period_at``,
    pinned to the scripts' periods by tests/model/) at most the quota, across the
    fleet; counted apart where the store lost its state (a restart, a failover: the
    count's checkpoints in the database are not simulated)."""
    assert r.calendar is not None
    for segment in _split(seen, cuts):
        used: dict[tuple[int, int], int] = defaultdict(int)
        for t, n, _, _ in segment:
            period = r.calendar.period_at(epoch_s + t)
            used[period] += n
            if used[period] > r.rate:
                start, end = period
                raise Violation(
                    f"{key}: calendar quota {r.rate} a {r.calendar.renewal.period} in "
                    f"{r.calendar.zone.key}: {used[period]} admitted in the period "
                    f"[{start}, {end}) (one going ahead at {epoch_s + t:.3f})"
                )


def run_scenario(sc: Scenario) -> int:
    """Carry ``sc`` out and check it; the steps checked. Violation when a promise broke."""
    run = Run(sc)
    checker = Checker()
    try:
        run.run(checker)
        checker.finish(run)
    finally:
        run.close()
    return checker.checked


def fails(sc: Scenario) -> str | None:
    try:
        run_scenario(sc)
    except Violation as v:
        return str(v)
    return None


def shrink(sc: Scenario, budget: int = 300) -> Scenario:
    """A smaller scenario that still fails: fewer steps, rows and processes."""
    tries = 0

    def still(candidate: Scenario) -> bool:
        nonlocal tries
        tries += 1
        return fails(candidate) is not None

    changed = True
    while changed and tries < budget:
        changed = False
        chunk = max(1, len(sc.steps) // 2)
        while chunk >= 1 and tries < budget:
            i = 0
            while i < len(sc.steps) and tries < budget:
                candidate = dataclasses.replace(sc, steps=sc.steps[:i] + sc.steps[i + chunk :])
                if still(candidate):
                    sc, changed = candidate, True
                else:
                    i += chunk
            chunk //= 2
        for i in range(len(sc.rows)):
            if tries >= budget or i >= len(sc.rows):
                break
            candidate = dataclasses.replace(sc, rows=sc.rows[:i] + sc.rows[i + 1 :])
            if still(candidate):
                sc, changed = candidate, True
        while len(sc.processes) > 1 and tries < budget:  # the last, while no step names it
            last = len(sc.processes) - 1
            if any(s.args.get("p") == last for s in sc.steps):
                break
            candidate = dataclasses.replace(sc, processes=sc.processes[:last])
            if not still(candidate):
                break
            sc, changed = candidate, True
    return sc


def as_test(sc: Scenario, message: str) -> str:
    """``sc`` as a test to paste into tests/sim/."""
    steps = ",\n".join(f"            {s!r}" for s in sc.steps)
    return f'''
# paste into tests/sim/test_simulated_fleet.py: it uses that module's imports
def test_simulated_fleet_seed_{sc.seed}() -> None:
    """Found by the simulated fleet (seed {sc.seed}): {message.splitlines()[0][:200]}"""
    sc = Scenario(
        seed={sc.seed},
        processes={sc.processes!r},
        policy={sc.policy!r},
        rows={sc.rows!r},
        steps=[
{steps}
        ],
        reload_s={sc.reload_s!r},
        epoch_s={sc.epoch_s!r},
        table={sc.table!r},
    )
    run_scenario(sc)
'''
