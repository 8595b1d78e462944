"""Leases: permits of a hot interface taken ahead in one round trip and spent in this
process (a row's ``leaseMs``; docs/algorithms.md, "Leases", has the bound they keep).

A lease row is one shared, enforced token bucket (``config.rules.lease_problem``). Each
process holds at most one lease per such interface: up to ``n = max(permits,
floor(rate x leaseMs / 1000))`` permits, usable for ``leaseMs`` from the moment the
request for it left. A decision takes its permits from the lease without any I/O; when
the lease has too few left or is older than ``leaseMs``, one ``lease.lua`` call hands
back what is left of it, decides the caller's permits as a plain call would (wait
budget, debt, pushback), and only if that took stored permits without a wait takes up
to ``n`` in all. Threads and coroutines of a process share its leases: one of them
renews it while the others wait for that renewal (``wait``; each wait at most
``redis_timeout_ceiling`` twice over), then take from it; one that has waited for
``pipeline.LEASE_WAITS`` renewals in a row is decided the plain way (``bucket.lua``).

What happens to a lease besides being spent:

- a pushback on the interface drops this process's lease at once (not handed back: the
  supplier just said stop); other processes' leases end within ``leaseMs``;
- a reload that changes the row (same bucket key, still leased): what is left is handed
  back with the next lease of the interface; the switch turning off, the lease turned
  off, the row going shadow or moving to another key: handed back by the next heartbeat;
  the limiter closing: every lease handed back. All best effort: a lease that cannot be
  handed back expires unspent, which only under-admits;
- Redis failing: a lease already held is spent (its permits were granted); a refill
  that fails is decided by the failure policy, and the lease it handed back is lost.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.scripts import REPLY, ScriptCall, parse_reply
from gateway_limiter.backends.state import state_key
from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import US_PER_S, Verdict

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
) -> ScriptCall:
    """``lease.lua``'s call: hand back ``unused``, decide ``permits`` within ``budget_s``
    (None: any wait), take up to ``size`` in all (``permits`` 0: hand back only)."""
    rate = str(rule.rate) if rule.period == 1 else repr(rule.per_second)
    timeout_us = "-1" if budget_s is None else repr(budget_s * US_PER_S)
    now = "" if now_us is None else repr(now_us)
    return ScriptCall(
        "lease",
        [1, key, rate, str(rule.burst), str(permits), timeout_us, now, str(size), str(unused)],
    )


#: ``lease.lua``'s seventh double, after a decision's six: the permits granted in all.
GRANTED: Final = struct.Struct("<d")


def parse_lease(reply: Any) -> tuple[Verdict, int]:
    """``lease.lua``'s reply: the caller's Verdict and the permits granted in all."""
    try:
        (granted,) = GRANTED.unpack_from(reply, REPLY.size)
    except (TypeError, struct.error) as e:
        raise BackendError(f"unexpected reply from the lease script: {reply!r}") from e
    if len(reply) != REPLY.size + GRANTED.size:
        raise BackendError(f"unexpected reply from the lease script: {reply!r}")
    return parse_reply(reply[: REPLY.size]), int(granted)


class Lease:
    """One interface's lease in this process."""

    __slots__ = ("dry_until", "factor", "left", "refilling", "rule", "since", "waiters")

    def __init__(self, rule: Rule, since: float) -> None:
        self.rule = rule
        self.left = 0  # permits not yet spent
        self.since = since  # monotonic s when the request for it left
        self.refilling = True  # a lease.lua call is in flight for it
        self.factor = 1.0  # the effective rate's factor its reply said
        #: monotonic s before which the bucket cannot have refilled what the last lease
        #: lacked (it came back short: the bucket ran dry); 0.0: it came back full
        self.dry_until = 0.0
        #: what wakes the callers waiting for the renewal in flight
        self.waiters: list[Callable[[], None]] = []


class Leases:
    """This process's leases, shared by its threads (one lock) and coroutines."""

    __slots__ = ("_carried", "_held", "_lock", "_prefix", "_returns", "handed_back", "refills")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        #: url -> (its new rule, permits left by the lease a reload replaced): handed back
        #: with the next lease of the url (the same bucket key)
        self._carried: dict[str, tuple[Rule, int]] = {}
        #: (rule, permits) to hand back off the decision path (the heartbeat, close)
        self._returns: list[tuple[Rule, int]] = []
        #: lease.lua calls sent, and permits handed back in them (for tests and benches)
        self.refills = 0
        self.handed_back = 0

    def take(
        self, rule: Rule, permits: int, budget_s: float | None, now_s: float
    ) -> Verdict | None:
        """``permits`` from the lease of ``rule`` (admitted, no wait); a refusal when the
        last lease came back short and the caller cannot wait for the bucket to refill
        it; or None: ask Redis (too few left, too old, or none)."""
        lease = self._held.get(rule.url)
        if lease is None or lease.rule is not rule:
            return None
        if lease.left < permits:
            dry_s = lease.dry_until - now_s
            if dry_s > 0.0 and budget_s is not None and budget_s < dry_s:
                return Verdict(False, dry_s * US_PER_S, 0.0, dry_s * US_PER_S, lease.factor, 0.0)
            return None
        if now_s - lease.since > rule.lease_ms / 1000.0:
            return None
        with self._lock:
            if lease.left < permits or lease.refilling:
                return None
            lease.left -= permits
            return Verdict(True, 0.0, float(lease.left), 0.0, lease.factor, 0.0)

    def wait(self, rule: Rule, wake: Callable[[], None]) -> bool:
        """Call ``wake`` (from any thread) once the renewal of ``rule``'s lease in flight
        ends; False when none is in flight any more (then do not wait)."""
        with self._lock:
            lease = self._held.get(rule.url)
            if lease is None or lease.rule is not rule or not lease.refilling:
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
        ``permits``, or None when another thread or coroutine is renewing it (then the
        caller waits for that, ``wait``, or is decided the plain way)."""
        url = rule.url
        woken: list[Callable[[], None]] = []
        with self._lock:
            lease = self._held.get(url)
            if (
                lease is not None
                and lease.refilling
                and now_s - lease.since < REFILL_FORGOTTEN_S
                and lease.rule is rule
            ):
                return None
            unused = lease.left if lease is not None and lease.rule is rule else 0
            unused += self._carried.pop(url, (rule, 0))[1]
            if lease is not None:  # a renewal forgotten (REFILL_FORGOTTEN_S): its waiters go
                woken = lease.waiters
            self._held[url] = Lease(rule, now_s)
            self.refills += 1
            self.handed_back += unused
        self._wake(woken)
        key = state_key(self._prefix, rule)
        return lease_call(key, rule, permits, budget_s, lease_size(rule, permits), unused)

    def filled(self, rule: Rule, permits: int, reply: Any) -> Verdict:
        """The lease call for ``rule`` answered: the caller's Verdict (its ``stored``:
        the permits left in the lease). BackendError when the reply is not one."""
        try:
            verdict, granted = parse_lease(reply)
        except BackendError:
            self.failed(rule)
            raise
        left = max(0, granted - permits) if verdict.allowed else 0
        size = lease_size(rule, permits)
        woken: list[Callable[[], None]] = []
        with self._lock:
            lease = self._held.get(rule.url)
            if lease is not None and lease.rule is rule and lease.refilling:
                lease.left = left
                lease.factor = verdict.factor
                lease.refilling = False
                woken, lease.waiters = lease.waiters, []
                if granted < size:  # the bucket ran dry: refill what it lacked first
                    short_s = (size - granted) / (rule.per_second * verdict.factor)
                    lease.dry_until = lease.since + max(short_s, verdict.next_free_us / US_PER_S)
            else:  # dropped meanwhile (a pushback, a reload): the rest expires unspent
                left = 0
        self._wake(woken)
        return verdict._replace(stored=float(left)) if verdict.allowed else verdict

    def failed(self, rule: Rule) -> None:
        """The lease call for ``rule`` failed: what it handed back is lost (under-admits)."""
        woken: list[Callable[[], None]] = []
        with self._lock:
            lease = self._held.get(rule.url)
            if lease is not None and lease.rule is rule:
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

    def reloaded(self, snapshot: Snapshot) -> None:
        """A reload: leases of rules it replaced are carried to the next lease of the
        same bucket, or queued to be handed back."""
        woken: list[Callable[[], None]] = []
        with self._lock:
            for url, lease in list(self._held.items()):
                new = snapshot.rules.get(url) if snapshot.switch else None
                if new is lease.rule:
                    continue
                del self._held[url]
                woken.extend(lease.waiters)
                if lease.left <= 0:
                    continue
                old_key = state_key(self._prefix, lease.rule)
                if new is not None and new.lease_ms and state_key(self._prefix, new) == old_key:
                    carried = self._carried.get(url, (new, 0))[1]
                    self._carried[url] = (new, carried + lease.left)
                else:
                    self._returns.append((lease.rule, lease.left))
        self._wake(woken)

    def returns(self, closing: bool = False) -> Sequence[ScriptCall]:
        """The ``lease.lua`` calls that hand back what is waiting to be (``closing``:
        every lease held too, which ends them)."""
        woken: list[Callable[[], None]] = []
        with self._lock:
            due, self._returns = self._returns, []
            if closing:
                due.extend((lease.rule, lease.left) for lease in self._held.values() if lease.left)
                due.extend(self._carried.values())
                for lease in self._held.values():
                    woken.extend(lease.waiters)
                self._held.clear()
                self._carried.clear()
            self.handed_back += sum(left for _, left in due)
        self._wake(woken)
        return [
            lease_call(state_key(self._prefix, rule), rule, 0, 0.0, 0, left) for rule, left in due
        ]
