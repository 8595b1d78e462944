"""Leases: permits of a hot interface taken ahead in one round trip and spent in this
process (a row's ``leaseMs``; docs/algorithms.md, "Leases", has the bound they keep).

How it works: docs/internals.md, section ``gateway_limiter.core.leases``.
"""

from __future__ import annotations

import math
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import (
    REPLY,
    ScriptCall,
    bucket_config,
    parse_reply,
    timeout_arg,
)
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from gateway_limiter.core.decision import Reason
from gateway_limiter.core.steps import Ask, Await, Reserve, Send, Sleep, Steps, Woken, raw
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.priority import Priority

if TYPE_CHECKING:  # core/pipeline.py imports this module
    from gateway_limiter.core.pipeline import LimiterCore, Outcome

#: A refill whose reply never came (its caller cancelled) stops blocking others after this.
REFILL_FORGOTTEN_S: Final = 5.0


def lease_size(rule: Rule, permits: int) -> int:
    """The most permits one lease of ``rule`` takes: ``leaseMs`` of its rate, at least
    the caller's ``permits``."""
    return max(permits, math.floor(rule.per_second * rule.lease_ms / 1000.0 + 1e-9), 1)


def lease_call(
    key: str,
    rule: Rule,
    permits: int,
    budget_s: float | None,
    size: int,
    unused: int,
    now_us: float | None = None,
    taken_us: float = 0.0,
) -> ScriptCall:
    """``lease.lua``'s call: hand back ``unused`` of a lease taken at ``taken_us`` (its
    reply's moment), decide ``permits`` within ``budget_s`` (None: any wait), take up to
    ``size`` in all (``permits`` 0: hand back only)."""
    now = "" if now_us is None else repr(now_us)
    args: list[str | int | bytes] = [1, key, bucket_config(rule), str(permits)]
    args += [timeout_arg(budget_s), now, str(size), str(unused), repr(taken_us)]
    floor = lease_floor(rule)
    if floor:  # priority classes: no debt lease, the rest from above every reserve
        args += ["0", repr(floor)]
    else:
        args.append(str(rule.lease_ms * 1000))
    return ScriptCall("lease", args)


def lease_floor(rule: Rule) -> float:
    """The share of ``rule``'s capacity a lease's permits beyond its caller's leave
    stored: on a row with a reserve, the lowest class's (the largest), so the lease
    holds none of any class's reserve and serves every class; else 0."""
    reserve = rule.reserve
    return 0.0 if reserve is None else reserve.share(Priority.SHEDDABLE)


def same_row(a: Rule, b: Rule) -> bool:
    """Whether ``a`` and ``b`` are one row's limit as the reload made it: the same Rule,
    or two classes' Rules of it (``Rule.classed``, which share its parsed reserve). A
    process holds one lease per row, spent by every class."""
    return a is b or (a.reserve is not None and a.reserve is b.reserve and a.url == b.url)


#: ``lease.lua``'s seventh and eighth doubles, after a decision's six: the permits
#: granted from stored ones in all, and the moment of the lease (µs, Redis's clock), for
#: its hand-back; then the debt lease: the permits scheduled, the first one's moment (µs
#: from the lease's) and the interval between them (µs).
GRANTED: Final = struct.Struct("<dd")
DEBT: Final = struct.Struct("<ddd")


class Debt(NamedTuple):
    """Permits a lease call scheduled as debt: ``permits`` of them, the first due
    ``first_us`` after the lease's moment, the others ``interval_us`` apart."""

    permits: int
    first_us: float
    interval_us: float


def _unpack_lease(reply: Any) -> tuple[float, float, float, float, float]:
    try:
        granted, taken_us = GRANTED.unpack_from(reply, REPLY.size)
        count, first_us, interval_us = DEBT.unpack_from(reply, REPLY.size + GRANTED.size)
    except (TypeError, struct.error) as e:
        raise BackendError(f"unexpected reply from the lease script: {reply!r}") from e
    if len(reply) != REPLY.size + GRANTED.size + DEBT.size:
        raise BackendError(f"unexpected reply from the lease script: {reply!r}")
    return granted, taken_us, count, first_us, interval_us


def parse_lease(reply: Any) -> tuple[Verdict, int, float]:
    """``lease.lua``'s reply: the caller's Verdict, the permits granted from stored ones
    in all and the lease's moment."""
    granted, taken_us, _, _, _ = _unpack_lease(reply)
    return parse_reply(reply[: REPLY.size]), int(granted), taken_us


def parse_debt(reply: Any) -> Debt:
    """``lease.lua``'s reply: the permits it scheduled as debt."""
    _, _, count, first_us, interval_us = _unpack_lease(reply)
    return Debt(int(count), first_us, interval_us)


class Unused(NamedTuple):
    """What a lease left unused, to hand back: its rule, the permits, when its request
    left (monotonic s) and when Redis took it (µs, Redis's clock)."""

    rule: Rule
    left: int
    since: float
    taken_us: float

    def returns_some(self, now_s: float) -> bool:
        """Whether a hand-back sent now may return any of it: not when what the bucket
        can refill at the rule's rate since the request left covers it. An estimate
        (Redis judges the age on its own clock), and dropping never admits more."""
        return self.left > self.rule.per_second * (now_s - self.since)


class Lease:
    """One interface's lease in this process."""

    __slots__ = (
        "dry_reserved",
        "dry_share",
        "dry_until",
        "factor",
        "left",
        "refilling",
        "rule",
        "scheduled",
        "since",
        "taken_us",
        "waiters",
    )

    def __init__(self, rule: Rule, since: float) -> None:
        self.rule = rule
        self.left = 0  # permits not yet spent
        self.since = since  # monotonic s when the request for it left
        self.taken_us = 0.0  # when Redis took it (µs, Redis's clock; its reply says)
        self.refilling = True  # a lease.lua call is in flight for it
        self.factor = 1.0  # the effective rate's factor its reply said
        #: monotonic s before which the bucket cannot have refilled what the last lease
        #: lacked (it came back short: the bucket ran dry); 0.0: it came back full
        self.dry_until = 0.0
        #: a row with a reserve: the share the class refused then must leave (only a
        #: class leaving as much or more is refused in-process), and whether it was
        #: refused for want of its reserve
        self.dry_share = 0.0
        self.dry_reserved = False
        #: what wakes the callers waiting for the renewal in flight
        self.waiters: list[Callable[[], None]] = []
        #: permits scheduled as debt, in order: (monotonic s from which, until which,
        #: each may be used); kept across renewals of the same rule
        self.scheduled: deque[tuple[float, float]] = deque()


class Leases:
    """This process's leases, shared by its threads (one lock) and coroutines."""

    __slots__ = (
        "_carried",
        "_clock",
        "_held",
        "_lock",
        "_prefix",
        "_returns",
        "dropped",
        "handed_back",
        "owed",
        "owed_lost",
        "refills",
    )

    def __init__(self, prefix: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._prefix = prefix
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        #: url -> (its new rule, what the lease a reload replaced left): handed back with
        #: the next lease of the url (the same bucket key)
        self._carried: dict[str, tuple[Rule, Unused]] = {}
        #: what to hand back off the decision path (the heartbeat, close)
        self._returns: list[Unused] = []
        #: lease.lua calls sent, permits handed back in them, and permits dropped
        #: in-process as too old to return any (for tests and benches)
        self.refills = 0
        self.handed_back = 0
        self.dropped = 0
        #: permits scheduled as debt, and those of them never used (too late, dropped)
        self.owed = 0
        self.owed_lost = 0

    def _due(self, unused: Unused | None, now_s: float) -> Unused | None:
        """``unused`` if a hand-back sent now can return some of it, else None (counted
        as dropped). Under the lock."""
        if unused is None or unused.left <= 0:
            return None
        if unused.returns_some(now_s):
            return unused
        self.dropped += unused.left
        return None

    def take(
        self, rule: Rule, permits: int, budget_s: float | None, now_s: float
    ) -> Verdict | None:
        """``permits`` from the lease of ``rule`` (admitted, no wait); a refusal when the
        last lease came back short and the caller cannot wait for the bucket to refill
        it; or None: ask Redis (too few left, too old, or none)."""
        lease = self._held.get(rule.url)
        if lease is None or not same_row(lease.rule, rule):
            return None
        stale = now_s - lease.since > rule.lease_ms / 1000.0
        if lease.left < permits or stale:
            if lease.scheduled:  # the permits scheduled as debt, in order
                with self._lock:
                    wait_s = self._owed_wait(lease, permits, budget_s, now_s)
                    if wait_s is not None:
                        for _ in range(permits):
                            lease.scheduled.popleft()
                        return Verdict(True, wait_s * US_PER_S, 0.0, 0.0, lease.factor, 0.0)
            dry_s = lease.dry_until - now_s
            if lease.left < permits and dry_s > 0.0 and budget_s is not None and budget_s < dry_s:
                if rule.reserve is not None and (
                    rule.shares is None or rule.shares[0] < lease.dry_share
                ):
                    return None  # critical, or a class above the one refused: ask Redis
                dry_us = dry_s * US_PER_S
                verdict = Verdict(False, dry_us, 0.0, dry_us, lease.factor, 0.0)
                return verdict._replace(reserved=True) if lease.dry_reserved else verdict
            return None
        with self._lock:
            if lease.left < permits or lease.refilling:
                return None
            lease.left -= permits
            return Verdict(True, 0.0, float(lease.left), 0.0, lease.factor, 0.0)

    def _owed_wait(
        self, lease: Lease, permits: int, budget_s: float | None, now_s: float
    ) -> float | None:
        """How long a caller wanting ``permits`` now waits for the next of ``lease``'s
        scheduled permits, or None when they cannot serve it (too few, beyond its budget,
        or the first would be used too late). Drops those too late for anyone. Under
        the lock."""
        scheduled = lease.scheduled
        while scheduled and scheduled[0][1] < now_s:
            scheduled.popleft()
            self.owed_lost += 1
        if len(scheduled) < permits:
            return None
        wait_s = max(0.0, scheduled[permits - 1][0] - now_s)
        if budget_s is not None and wait_s > budget_s:
            return None
        if scheduled[0][1] < now_s + wait_s:
            return None
        return wait_s

    def wait(self, rule: Rule, wake: Callable[[], None]) -> bool:
        """Call ``wake`` (from any thread) once the renewal of ``rule``'s lease in flight
        ends; False when none is in flight any more (then do not wait)."""
        with self._lock:
            lease = self._held.get(rule.url)
            if lease is None or not same_row(lease.rule, rule) or not lease.refilling:
                return False
            lease.waiters.append(wake)
            return True

    @staticmethod
    def _wake(waiters: list[Callable[[], None]]) -> None:
        for wake in waiters:
            wake()

    def refill(
        self, rule: Rule, permits: int, budget_s: float | None, now_s: float
    ) -> ScriptCall | None:
        """The ``lease.lua`` call that renews ``rule``'s lease for a caller wanting
        ``permits``, or None when another thread or coroutine is renewing it, or has
        renewed it since the caller looked (then the caller waits for that, ``wait``,
        at once when it is done, and takes from the lease; or is decided the plain
        way): a fresh lease is not handed back for a new one."""
        url = rule.url
        woken: list[Callable[[], None]] = []
        with self._lock:
            lease = self._held.get(url)
            if lease is not None and same_row(lease.rule, rule):
                age_s = now_s - lease.since
                if lease.refilling and age_s < REFILL_FORGOTTEN_S:
                    return None
                if not lease.refilling and lease.left >= permits and age_s <= rule.lease_ms / 1e3:
                    return None
                if lease.scheduled and self._owed_wait(lease, permits, budget_s, now_s) is not None:
                    return None  # its scheduled permits serve the caller: it asks again
            own = None
            if lease is not None and same_row(lease.rule, rule):
                own = Unused(rule, lease.left, lease.since, lease.taken_us)
            back = self._due(own, now_s)
            carried = self._due(self._carried.pop(url, (rule, None))[1], now_s)
            if back is None:
                back = carried
            elif carried is not None:  # one lease per call: the other on the heartbeat
                self._returns.append(carried)
            if lease is not None:  # a renewal forgotten (REFILL_FORGOTTEN_S): its waiters go
                woken = lease.waiters
            renewed = self._held[url] = Lease(rule, now_s)
            if lease is not None and same_row(lease.rule, rule):  # still due: kept, in order
                renewed.scheduled = lease.scheduled
            self.refills += 1
            unused, taken_us = (0, 0.0) if back is None else (back.left, back.taken_us)
            self.handed_back += unused
        self._wake(woken)
        key = state_key(self._prefix, rule)
        size = lease_size(rule, permits)
        return lease_call(key, rule, permits, budget_s, size, unused, None, taken_us)

    def filled(self, rule: Rule, permits: int, reply: Any) -> Verdict:
        """The lease call for ``rule`` answered: the caller's Verdict (its ``stored``:
        the permits left in the lease). BackendError when the reply is not one."""
        try:
            verdict, granted, taken_us = parse_lease(reply)
            debt = parse_debt(reply)
        except BackendError:
            self.failed(rule)
            raise
        arrived_s = self._clock.monotonic()
        left = max(0, granted - permits) if verdict.allowed else 0
        size = lease_size(rule, permits)
        woken: list[Callable[[], None]] = []
        with self._lock:
            lease = self._held.get(rule.url)
            if lease is not None and same_row(lease.rule, rule) and lease.refilling:
                lease.left = left
                lease.taken_us = taken_us
                lease.factor = verdict.factor
                lease.refilling = False
                woken, lease.waiters = lease.waiters, []
                if rule.reserve is not None:  # the rest stops at every class's reserve
                    if not verdict.allowed:  # until the class refused could go
                        lease.dry_until = lease.since + verdict.wait_us / US_PER_S
                        lease.dry_share = 0.0 if rule.shares is None else rule.shares[0]
                        lease.dry_reserved = verdict.reserved
                elif granted < size:  # the bucket ran dry: refill what it lacked first
                    short_s = (size - granted) / (rule.per_second * verdict.factor)
                    lease.dry_until = lease.since + max(short_s, verdict.next_free_us / US_PER_S)
                self._schedule(lease, debt, arrived_s)
            else:  # dropped meanwhile (a pushback, a reload): the rest expires unspent
                left = 0
                self.owed_lost += debt.permits
        self._wake(woken)
        return verdict._replace(stored=float(left)) if verdict.allowed else verdict

    def _schedule(self, lease: Lease, debt: Debt, arrived_s: float) -> None:
        """Queue the permits ``debt`` scheduled: each usable from its moment after the
        reply arrived (never before the bucket's moment) until ``leaseMs`` after its
        moment after the request left (never later). Under the lock."""
        self.owed += debt.permits
        late_s = lease.rule.lease_ms / 1000.0
        for i in range(debt.permits):
            due_s = (debt.first_us + i * debt.interval_us) / US_PER_S
            lease.scheduled.append((arrived_s + due_s, lease.since + due_s + late_s))

    def failed(self, rule: Rule) -> None:
        """The lease call for ``rule`` failed: what it handed back is lost (under-admits)."""
        woken: list[Callable[[], None]] = []
        with self._lock:
            lease = self._held.get(rule.url)
            if lease is not None and same_row(lease.rule, rule):
                lease.refilling = False
                lease.left = 0
                woken, lease.waiters = lease.waiters, []
        self._wake(woken)

    def drop(self, url: str) -> None:
        """The supplier pushed back on ``url``: this process stops spending its lease now."""
        with self._lock:
            lease = self._held.get(url)
            if lease is not None:
                lease.left = 0
                self.owed_lost += len(lease.scheduled)
                lease.scheduled.clear()

    def reloaded(self, snapshot: Snapshot, now_s: float | None = None) -> None:
        """A reload: leases of rules it replaced are carried to the next lease of the
        same bucket, or queued to be handed back (dropped when too old for either)."""
        now_s = self._clock.monotonic() if now_s is None else now_s
        woken: list[Callable[[], None]] = []
        with self._lock:
            for url, lease in list(self._held.items()):
                new = snapshot.rules.get(url) if snapshot.switch else None
                if new is not None and same_row(new, lease.rule):
                    continue
                del self._held[url]
                woken.extend(lease.waiters)
                self.owed_lost += len(lease.scheduled)  # debt: never handed back
                unused = Unused(lease.rule, lease.left, lease.since, lease.taken_us)
                if self._due(unused, now_s) is None:
                    continue
                old_key = state_key(self._prefix, lease.rule)
                if new is not None and new.lease_ms and state_key(self._prefix, new) == old_key:
                    earlier = self._carried.get(url)
                    if earlier is not None:  # one lease per call: that one on the heartbeat
                        self._returns.append(earlier[1])
                    self._carried[url] = (new, unused)
                else:
                    self._returns.append(unused)
        self._wake(woken)

    def returns(self, closing: bool = False, now_s: float | None = None) -> Sequence[ScriptCall]:
        """The ``lease.lua`` calls that hand back what is waiting to be (``closing``:
        every lease held too, which ends them); what is too old by now is dropped."""
        now_s = self._clock.monotonic() if now_s is None else now_s
        woken: list[Callable[[], None]] = []
        with self._lock:
            waiting, self._returns = self._returns, []
            if closing:
                waiting.extend(
                    Unused(lease.rule, lease.left, lease.since, lease.taken_us)
                    for lease in self._held.values()
                )
                waiting.extend(unused for _, unused in self._carried.values())
                for lease in self._held.values():
                    woken.extend(lease.waiters)
                    self.owed_lost += len(lease.scheduled)  # debt: never handed back
                self._held.clear()
                self._carried.clear()
            due = [back for unused in waiting if (back := self._due(unused, now_s))]
            self.handed_back += sum(back.left for back in due)
        self._wake(woken)
        return [
            lease_call(state_key(self._prefix, b.rule), b.rule, 0, 0.0, 0, b.left, None, b.taken_us)
            for b in due
        ]


# --- a lease row's decision, as steps for the shell (core/steps.py) -----------------

#: Renewals a caller waits for in a row before it is decided the plain way (bucket.lua).
LEASE_WAITS: Final = 3


def from_lease(
    core: LimiterCore,
    leases: Leases,
    rule: Rule,
    permits: int,
    budget_s: float | None,
    *,
    wait: bool,
) -> Outcome | Ask:
    """A lease row's decision: from this process's lease, refused in-process while the
    bucket refills what the last lease lacked, or the lease call to send (``wait``: a
    caller who finds another renewing waits for that renewal, ``leasing``).

    The local refusals of plain rows do not apply: another process handing back its
    lease makes the interface free sooner than a reply said.
    """
    now_s = core.clock.monotonic()
    verdict = leases.take(rule, permits, budget_s, now_s)
    if verdict is not None:
        reason = Reason.ADMITTED if verdict.allowed else Reason.LIMITED
        return core._settled(rule, verdict, Reason.RESERVED if verdict.reserved else reason)
    if not core._breaker.allows():  # the lease is spent: the failure policy decides
        return core._settled(rule, *core._fall_back(rule, permits, budget_s, None))
    call = leases.refill(rule, permits, budget_s, now_s)
    ask = Ask(rule, permits, budget_s, None, None, call)
    ask.renewing = call is None and wait  # else: the plain way (``bucket.lua``)
    return ask


def leasing(core: LimiterCore, leases: Leases, ask: Ask) -> Steps[Outcome]:
    """A lease row's decision as steps for the shell: ``leased``; for a class below
    critical on a row with a reserve, ``rechecking_lease``."""
    if ask.rule.shares is None:
        return leased(core, leases, ask)
    return rechecking_lease(core, leases, ask)


def rechecking_lease(core: LimiterCore, leases: Leases, ask: Ask) -> Steps[Outcome]:
    """A class below critical on a lease row with a reserve: ``leased``; refused for
    want of its reserve, as ``LimiterCore._rechecking``: while its budget allows it
    sleeps, reserving nothing, until the reply said its class could go, and is decided
    again (from the lease, or by a lease call). The Outcome, with what it slept."""
    began = core.clock.monotonic()
    slept_s = 0.0
    while True:
        outcome = yield from leased(core, leases, ask)
        verdict = outcome[0]
        if verdict.allowed or not verdict.reserved:
            return core._slept(outcome, slept_s)
        wait_s = verdict.wait_us / US_PER_S
        spent_s = core.clock.monotonic() - began
        if math.isinf(wait_s) or (ask.budget_s is not None and wait_s > ask.budget_s - spent_s):
            return outcome
        before_s = core.clock.monotonic()
        yield Sleep(wait_s)
        slept_s += max(0.0, core.clock.monotonic() - before_s)
        budget_s = None
        if ask.budget_s is not None:
            budget_s = max(0.0, ask.budget_s - (core.clock.monotonic() - began))
        again = from_lease(core, leases, ask.rule, ask.permits, budget_s, wait=True)
        if not isinstance(again, Ask):
            return core._slept(again, slept_s)
        ask = again


def leased(core: LimiterCore, leases: Leases, ask: Ask) -> Steps[Outcome]:
    """A lease row's round trip, after any waits for another caller's renewal (each at
    most ``redis_timeout_ceiling`` twice over, at most ``LEASE_WAITS`` in a row), as
    steps for the shell: the Outcome."""
    waited = 0
    while ask.renewing:  # another caller renews the lease: wait for it
        waited += 1
        renewed = Woken()
        if leases.wait(ask.rule, renewed.wake):  # else it has ended: ask again at once
            yield Await(renewed, 2 * core.settings.redis_timeout_ceiling)
        again = from_lease(
            core, leases, ask.rule, ask.permits, ask.budget_s, wait=waited < LEASE_WAITS
        )
        if not isinstance(again, Ask):
            return again
        ask = again
    if ask.lease is None:  # the plain way after all (bucket.lua)
        return core._finish(ask, (yield Reserve(ask)))
    reply = yield Send(ask.lease, raw)
    if isinstance(reply, BackendError):
        leases.failed(ask.rule)
        return core._finish(ask, reply)
    try:
        verdict = leases.filled(ask.rule, ask.permits, reply)
    except BackendError as e:
        return core._finish(ask, e)
    return core._finish(ask, verdict)
