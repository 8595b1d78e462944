"""What the limiters do while the backend fails: the circuit breaker and the failure policy.

When a backend call fails, ``on_backend_error`` decides (``FailurePolicy``: ``share``,
the rules in this process at its share of the fleet, ``core/fleet.py``; ``local``, the
same rules in this process; ``allow``; ``deny``), and the ``Breaker`` keeps every
following call off the backend for ``breaker_seconds``, after which one caller probes
and the rest follow it back.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from enum import StrEnum
from typing import ParamSpec, Protocol, TypeVar, runtime_checkable

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from gateway_limiter.core.decision import ADMIT, REFUSE
from gateway_limiter.errors import BackendUnavailable
from gateway_limiter.model.bucket import Verdict
from gateway_limiter.observe.logs import OUTAGE_REPORT_SECONDS, Throttle, held_back, log, one_line

P = ParamSpec("P")
T = TypeVar("T")


def attempt(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | BackendError:
    """``call``'s result, or the BackendError it raised: a backend call whose failure the
    core handles (the sync limiter's one way of doing backend I/O)."""
    try:
        return call(*args, **kwargs)
    except BackendError as e:
        return e


async def attempt_async(
    call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
) -> T | BackendError:
    """``attempt``, awaited (the asyncio limiter's)."""
    try:
        return await call(*args, **kwargs)
    except BackendError as e:
        return e


class FailurePolicy(StrEnum):
    """``on_backend_error``: how a call is decided when the backend cannot be asked."""

    #: The rules in this process at 1/N of their rate and capacity (the default).
    SHARE = "share"
    #: The same rules, in this process (every limit, per caller too).
    LOCAL = "local"
    #: Every call goes ahead at once.
    ALLOW = "allow"
    #: Every call is refused at once (``acquire`` raises ``BackendUnavailable``).
    DENY = "deny"


class Breaker:
    """Keeps calls off a failing backend for ``open_s`` seconds, then lets one caller probe.

    Closed (healthy) costs one attribute read per call; a lock is taken only while
    the backend is failing. Each outage is logged once, and a backend that comes and
    goes at most once per ``OUTAGE_REPORT_SECONDS`` (with a count of the others).
    """

    __slots__ = ("_clock", "_lock", "_open_s", "_open_until_s", "_outages", "_reported")

    def __init__(self, open_s: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._open_s = open_s
        #: Monotonic seconds until which calls stay off the backend; 0.0: closed.
        self._open_until_s = 0.0
        self._lock = threading.Lock()
        self._outages = Throttle(OUTAGE_REPORT_SECONDS, clock.monotonic)
        self._reported = False

    @property
    def is_open(self) -> bool:
        """True while calls go to the failure policy instead of the backend."""
        return self._open_until_s != 0.0

    def allows(self) -> bool:
        """Should this call try the backend? (True for exactly one prober per window.)"""
        if self._open_until_s == 0.0:
            return True
        now_s = self._clock.monotonic()
        with self._lock:
            if now_s < self._open_until_s:
                return False
            self._open_until_s = now_s + self._open_s  # this caller probes; others wait
            return True

    def failed(self, error: BaseException) -> None:
        """The backend failed: open (log once per outage)."""
        with self._lock:
            if self._open_until_s == 0.0:
                held = self._outages.ready("backend")
                self._reported = held is not None
                if held is not None:
                    log.error(
                        "Redis unreachable (%s); deciding by on_backend_error%s",
                        one_line(str(error)),
                        held_back(held),
                    )
            self._open_until_s = self._clock.monotonic() + self._open_s

    def succeeded(self) -> bool:
        """The backend answered: close (log once). True for the one call that closed it."""
        if self._open_until_s != 0.0:
            with self._lock:
                if self._open_until_s != 0.0:
                    self._open_until_s = 0.0
                    if self._reported:
                        log.warning("Redis reachable again; back to shared limits")
                    return True
        return False


#: What an error reply names when Redis itself is in trouble (out of memory, loading, a
#: replica, a cluster reconfiguring), even from inside a script.
_REDIS_CONDITIONS = (
    "OOM ",
    "BUSY",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "MISCONF",
    "NOREPLICAS",
    "CLUSTERDOWN",
    "TRYAGAIN",
)
_SCRIPT_FAULTS = Throttle(60.0)


def script_fault(error: BaseException) -> bool:
    """True when ``error`` is a decision script failing on what it was given (an error
    reply raised inside the script: the call's arguments or its row's values), not
    Redis failing: Redis answered, so the breaker stays closed. Logged, at most once a
    minute."""
    text = str(error)
    if "ResponseError: " not in text or "user_script" not in text:
        return False
    if any(condition in text for condition in _REDIS_CONDITIONS):
        return False
    held = _SCRIPT_FAULTS.ready("script")
    if held is not None:
        log.error(
            "a limiter script failed on the values of one call (%s): that call is decided "
            "by on_backend_error, the breaker stays closed%s",
            one_line(text),
            held_back(held),
        )
    return True


#: Buckets ``share`` has started empty in one outage, kept at most (past this the record
#: starts over: emptying a bucket already in use again is refused and changes nothing).
_STARTED_KEPT = 100_000


@runtime_checkable
class Carries(Protocol):
    """In-process state that can carry a rule's buckets to the same rule at another part
    (``MemoryBackend.carry``)."""

    def carry(self, old: Rule, new: Rule, caller: str | None = None) -> None: ...


@runtime_checkable
class HoldsCounts(Protocol):
    """In-process state whose calendar quota counts can be set at least to a count
    (``MemoryBackend.hold_count``)."""

    def hold_count(self, limit: Rule, caller: str | None, start_us: float, used: float) -> None: ...


def same_limits(old: Rule, new: Rule) -> Iterator[tuple[Rule, Rule]]:
    """Each limit of ``new`` with the limit of ``old`` that is the same row's (its
    configId, URL, channel and caller), perhaps at another part, each alone (what
    ``Carries.carry`` is given). Two Rules of one interface may hold different limits
    (a named caller's has its row besides the interface's; a reload adds or drops
    rows), so their limits are never paired by position: the channel's state would go
    to a named caller's row, and the channel start afresh."""
    left = list(old.limits)
    for limit in new.limits:
        row = (limit.config_id, limit.url, limit.channel, limit.caller, limit.per_caller)
        for i, was in enumerate(left):
            if (was.config_id, was.url, was.channel, was.caller, was.per_caller) == row:
                del left[i]
                yield replace(was, also=()), replace(limit, also=())
                break


class Policy:
    """The failure policy at work: the verdict of a call the backend cannot be asked about.

    ``share`` starts each outage on fresh in-process buckets, each EMPTY (its first
    use takes the whole of its shared-out capacity): when Redis goes away the fleet may
    just have spent the rule's burst, and N full parts would let it spend it again. So
    the fleet admits at most R x D over an outage of D seconds, from its first second.

    A heartbeat may answer while the breaker is still open and change this process's
    part: the rule then comes at the new part, and its limits carry on from the old
    part's state, rescaled (``MemoryBackend.carry``: a bucket's stored permits to the
    new capacity, its debt kept; a window's admissions kept), never started afresh; a
    channel's cap carries on from the part any of its interfaces last decided it at.
    So the process admits at most the largest part it held in the outage, never the sum.

    A calendar quota is not a bucket that refills in a second: started empty, its part
    would be a part of the whole period, given again whatever the fleet had spent. So
    ``share`` starts it at this process's part of what was left: the count the fleet had
    reached as this process last knew it (``quota_floor``: a reply, the counters read
    every ``quota_checkpoint_s``, the checkpoints loaded at start), and the fleet's parts
    add up to no more than what was left.
    """

    __slots__ = (
        "_channels",
        "_empty_first",
        "_fresh",
        "_parts",
        "_share_lock",
        "_shared_parts",
        "_started",
        "kind",
        "local",
        "quota_floor",
    )

    def __init__(self, kind: FailurePolicy | str, fresh: Callable[[], Backend]) -> None:
        """``fresh()``: new in-process state for ``local`` and ``share`` to decide on (the
        shell's ``memory://`` backend: the model, in this process)."""
        # Settings keep ``on_backend_error`` a validated string; it becomes the enum here.
        self.kind = FailurePolicy(kind)
        self._fresh = fresh
        # ``share`` decides like ``local``, on the rule the core has shared out.
        in_process = (FailurePolicy.LOCAL, FailurePolicy.SHARE)
        self.local = fresh() if self.kind in in_process else None
        #: (rule, caller) whose bucket ``share`` has emptied in this outage
        self._started: set[tuple[Rule, str | None]] = set()
        #: (url, caller: None unless a limit is per caller) -> the rule at the part
        #: ``share`` last decided it at, in this outage
        self._parts: dict[tuple[str, str | None], Rule] = {}
        #: url -> the rule at the part ``share`` last decided it at, any caller: what
        #: its limits shared by every caller carry on from
        self._shared_parts: dict[str, Rule] = {}
        #: channel -> its cap's limit at the part ``share`` last decided it at, by any
        #: of its interfaces: what the cap carries on from
        self._channels: dict[str, Rule] = {}
        self._empty_first = True
        #: ``share`` decides one call at a time: a carry (a part or a channel's cap moved
        #: to the key it is decided at now) and the reserve on that key are one step, or
        #: another thread's carry between them empties the key this one then takes a
        #: full bucket from. Taken only during an outage, and held for no I/O.
        self._share_lock = threading.Lock()
        #: A calendar quota's count in its period as this process last knew it, by the
        #: (whole) limit and the caller: (the period's start, epoch µs; used), or None.
        self.quota_floor: Callable[[Rule, str | None], tuple[float, float] | None] | None = None

    def outage_began(self, start_empty: bool = True) -> None:
        """The backend just failed after answering (or never has): ``share`` starts
        afresh on fresh buckets, empty unless ``start_empty`` is False (a fleet of
        unknown size decides as ``local``); ``local`` keeps its buckets, as always."""
        if self.kind is FailurePolicy.SHARE:
            self.local = self._fresh()
            self._started = set()
            self._parts = {}
            self._shared_parts = {}
            self._channels = {}
            self._empty_first = start_empty

    def _start_empty(self, local: Backend, rule: Rule, key: str | None) -> None:
        """Take the whole capacity of a bucket ``share`` has not used in this outage."""
        started = self._started
        if (rule, key) in started:
            return
        if len(started) >= _STARTED_KEPT:
            started.clear()
        started.add((rule, key))
        # every limit's capacity is at least this; all or nothing, as any reservation
        whole = min(r.most for r in rule.limits)
        if whole >= 1:
            local.reserve(rule, whole, 0.0, key)

    def _part_changed(self, local: Backend, old: Rule | None, new: Rule, key: str | None) -> None:
        """``share`` decides ``new`` for the first time in this outage (``old`` None), or
        at another part than ``old``: its limits then carry on from the old part's
        state, rescaled, and are not started empty again."""
        parts = self._parts
        if len(parts) >= _STARTED_KEPT:
            parts.clear()
        caller = key if new.keyed else None  # a state per caller only where one is kept
        parts[(new.url, caller)] = new
        shared = self._shared_parts
        before = shared.get(new.url)
        if len(shared) >= _STARTED_KEPT:
            shared.clear()
        shared[new.url] = new
        if (
            caller is not None
            and before is not None
            and before not in (new, old)
            and isinstance(local, Carries)
        ):
            # a caller deciding at this part first, after another moved the interface
            # to it: the limits every caller shares carry on from the part they were at
            for was, now in same_limits(before, new):
                local.carry(was, now, None)
        if old is not None and isinstance(local, Carries):
            self._started.add((new, key))
            for was, now in same_limits(old, new):
                local.carry(was, now, caller)

    def _channel_caps(self, local: Backend, rule: Rule) -> None:
        """Each channel cap of ``rule`` carries on from the cap its channel was last
        decided at, by any of its interfaces. Checked at every decision, not only when
        ``rule``'s own part changes: a cap spans interfaces, and while this one's part
        stood still another may have moved the channel's state to its own cap (a part
        1/N that changed, or the same 1/N written otherwise: an interface with a claim
        has its channel at ``rate x S`` per ``S`` periods, one without at ``rate`` per
        ``N`` periods; another key either way). Deciding on the key it had left, this
        interface would find the channel gone and start it afresh, full, beside what
        the other booked (seed 20703)."""
        channels = self._channels
        for limit in rule.limits:
            if not limit.caps_channel or limit.channel is None or limit.per_caller:
                continue
            last = channels.get(limit.channel)
            if last is limit:
                continue
            cap = replace(limit, also=()) if limit.also else limit
            if len(channels) >= _STARTED_KEPT:
                channels.clear()
            channels[limit.channel] = cap
            if last is not None and last != cap and isinstance(local, Carries):
                local.carry(last, cap, None)

    def _hold_counts(self, local: Backend, whole: Rule, part: Rule, key: str | None) -> None:
        """Start each calendar quota of ``part`` (``whole`` at this process's part) at
        its part of what the fleet had left of the period, where that is known."""
        floor = self.quota_floor
        if floor is None or not isinstance(local, HoldsCounts):
            return
        for full, mine in zip(whole.limits, part.limits, strict=False):
            if full.calendar is None or mine.closed or full.rate <= 0:
                continue
            known = floor(full, key)
            if known is None:
                continue
            start_us, used = known
            left = max(0.0, full.rate - used)
            # floor(Q x part) <= Q x part: the fleet's shares add up to at most 1
            mine_left = math.floor(left * mine.rate / full.rate + 1e-9)
            caller = key if mine.per_caller else None
            local.hold_count(mine, caller, start_us, float(max(0, mine.rate - mine_left)))

    def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout_s: float | None,
        key: str | None = None,
        whole: Rule | None = None,
    ) -> Verdict:
        """What the backend's ``reserve`` would have answered, as the policy says:
        ``local`` and ``share`` (given the rule at this process's share, and ``whole``,
        the rule it is a part of): the model in this process; ``allow``/``deny``: at once.

        Raises BackendUnavailable for ``deny`` with no timeout (an ``acquire``).
        """
        local = self.local
        if rule.closed and self.kind is FailurePolicy.SHARE:
            # a part of 0: the other members' claims hold all of the rule
            if timeout_s is None:
                raise BackendUnavailable(
                    f"Redis is unreachable and this process holds no part of {rule.url!r} "
                    "(on_backend_error is 'share')"
                )
            return REFUSE
        if local is not None:
            if self.kind is not FailurePolicy.SHARE:
                return local.reserve(rule, permits, timeout_s, key)
            with self._share_lock:
                last = self._parts.get((rule.url, key if rule.keyed else None))
                if last is not rule and (last is None or last != rule):
                    if last is None and whole is not None:
                        self._hold_counts(local, whole, rule, key)
                    self._part_changed(local, last, rule, key)
                if rule.channel is not None:
                    self._channel_caps(local, rule)
                if self._empty_first:
                    self._start_empty(local, rule, key)
                return local.reserve(rule, permits, timeout_s, key)
        if self.kind is FailurePolicy.ALLOW:
            return ADMIT
        if timeout_s is None:
            raise BackendUnavailable("Redis is unreachable and on_backend_error is 'deny'")
        return REFUSE
