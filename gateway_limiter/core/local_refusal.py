"""Local refusals: refusing hopeless callers in-process, the overload fast path.

Under overload most calls are refused, and a refusal that costs a Redis round trip
costs as much as an admission. But every reply of the scripts says when the interface
is next free (``Verdict.next_free_us``): the earliest moment any later call could go,
whoever makes it. Only time passing brings that moment closer; other callers, in this
process or any other, can only push it later. So a caller whose timeout cannot reach
it would be refused by Redis too, and is refused here, at once, with no round trip:
the refusal is exact, nothing is reserved, and the shared state is untouched.

The moment is kept on this process's monotonic clock, counted from when the request
that learnt it was *sent*: the script ran later than that, so the moment kept is never
later than the real one (it errs by the round trip, towards asking Redis).

What is kept, per interface (and per caller key for per-caller limits), is the rule it
was learnt under, the moment, and how long it is trusted: at most ``AHEAD_S`` seconds
on, since a window's next slot can lie hours away, and a moment kept that long would
outlive anything that changed it unseen (below); one round trip a second renews it. A
pushback's hold (``retry_after``: the reply's ``held_us``) is trusted longer, up to
``HOLD_AHEAD_S``: the supplier said when, a hold only ever grows, and a fleet asking
Redis every second through a 30 s hold is what the hold is there to spare. A refusal
reports the real moment, not the trusted one, so ``Retry-After`` says how long is left.
It is forgotten when it could stop being true or useful: a different rule (a reload
changed the row: another rate moves the moment), a reload that changed any rule or the
switch, and a backend failure (the failure policy decides meanwhile, and Redis may come
back without its state). A reply that was in flight when everything was forgotten is not
learnt (``generation``).
Memory is bounded: past ``LIMIT`` entries the whole map starts over.

Redis losing its state without an error this process sees (``FLUSHALL``, a key
deleted by hand) makes the shared bucket full again while the moment kept here still
lies ahead: until it passes, this process refuses what the empty Redis would admit.
That errs on the strict side only, and for at most ``AHEAD_S`` seconds (``HOLD_AHEAD_S``
for a hold: a hold deleted by hand reaches every process within that). A restart or
failover that breaks connections is a backend failure, and forgets everything.

Only backends whose state is shared (Redis) get this: ``memory://`` decides in-process
already.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, TypeAlias

from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import US_PER_S, Verdict

#: A reply's calendar quota: permits left, when its period ends (epoch µs), its limit.
Quota: TypeAlias = tuple[float, float, float]
#: An interface without a calendar quota.
NO_QUOTA: Final[Quota] = (-1.0, 0.0, 0.0)


class LocalRefusals:
    """When each interface is next free, as the last reply about it said, and the
    refusals that follow from it."""

    __slots__ = ("_at", "_switch", "generation", "refused")

    #: Interfaces (and caller keys) kept at most; past this the map starts over.
    LIMIT = 16_384
    #: The furthest ahead a moment is trusted.
    AHEAD_S = 1.0
    #: The furthest ahead a pushback's hold is trusted.
    HOLD_AHEAD_S = 60.0

    def __init__(self) -> None:
        #: interface (or (interface, key)) -> (its rule, next free, trusted until, the
        #: hold's end), in s on time.monotonic(), and what the reply said of its calendar
        #: quota (``Verdict.quota_left``, ``quota_reset_us``, ``quota_limit``)
        self._at: dict[Hashable, tuple[Rule, float, float, float, Quota]] = {}
        self._switch: bool | None = None
        #: bumped by every ``forget``: a reply asked for before that is not learnt
        self.generation = 0
        #: calls refused here, without a round trip (read by tests and the bench)
        self.refused = 0

    def __len__(self) -> int:
        return len(self._at)

    def refusal(
        self, rule: Rule, key: str | None, timeout_s: float, now_s: float
    ) -> Verdict | None:
        """A refusal for a caller at ``now_s`` (monotonic) who can wait ``timeout_s``,
        when the interface is not free before then; None: ask the backend.

        The refusal's wait (µs) is until the interface is next free: no sooner could
        this caller go (a lower bound, as ``Retry-After``); its ``held_us``, what is left
        of a pushback's hold.
        """
        entry = self._at.get(rule.url if key is None else _slot(rule, key))
        if entry is None:
            return None
        known, free_at_s, trusted_s, held_s, quota = entry
        if now_s + timeout_s >= free_at_s or now_s >= trusted_s:
            return None
        # A reload builds new Rule objects: the same limits? (Until the next reply about
        # this interface stores the new object; not written back here, where it could
        # undo a concurrent forget.)
        if known is not rule and known != rule:
            return None
        self.refused += 1
        wait_us = (free_at_s - now_s) * US_PER_S
        held_us = (held_s - now_s) * US_PER_S if held_s > now_s else 0.0
        return Verdict(False, wait_us, 0.0, wait_us, 1.0, held_us, *quota)

    def learn(
        self,
        rule: Rule,
        key: str | None,
        asked: tuple[float, int],
        next_free_us: float,
        held_us: float = 0.0,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """A reply said the interface is next free in ``next_free_us`` (and held by a
        pushback for ``held_us``) to a request that left at ``asked`` = (monotonic s, the
        ``generation`` then)."""
        sent_s, generation = asked
        if generation != self.generation:
            return  # everything was forgotten while the request was out
        at = self._at
        if len(at) >= self.LIMIT:
            at.clear()
        slot = rule.url if key is None else _slot(rule, key)
        free_s = next_free_us / US_PER_S
        ahead_s = min(free_s, self.AHEAD_S)
        held_s = held_us / US_PER_S
        if held_s > ahead_s:  # the hold is what keeps it shut: trusted longer
            ahead_s = min(held_s, self.HOLD_AHEAD_S)
        at[slot] = (rule, sent_s + free_s, sent_s + ahead_s, sent_s + held_s, quota)
        if generation != self.generation:  # a forget came in between: undo, no lock needed
            at.pop(slot, None)

    def forget(self) -> None:
        """Drop everything learnt (the backend failed, or the limits changed)."""
        self.generation += 1  # first: a learn in progress sees it, and undoes itself
        self._at.clear()

    def reloaded(self, summary: ReloadSummary) -> None:
        """A registry listener: forget after a reload that changed a rule or the switch."""
        if not summary.ok:
            return
        switched = self._switch is not None and summary.switch != self._switch
        self._switch = summary.switch
        if switched or summary.added or summary.changed or summary.removed:
            self.forget()


def _slot(rule: Rule, key: str) -> Hashable:
    """What a caller's next free moment is kept under: per key only where a limit is
    per caller."""
    return (rule.url, key) if rule.keyed else rule.url
