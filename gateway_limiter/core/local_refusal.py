"""Local refusals: refusing hopeless callers in-process, the overload fast path.

How it works: docs/internals.md, section ``gateway_limiter.core.local_refusal``.
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
        #: quota (``Verdict.quota_left``, ``quota_reset_us``, ``quota_limit``), and, when
        #: a paced quota's pace was what kept it shut, what the other limits had left
        self._at: dict[Hashable, tuple[Rule, float, float, float, Quota, float]] = {}
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
        of a pushback's hold. Where the reply was shut by a paced quota's pace (the
        other limits had room), the refusal says so as that reply did: its ``stored``
        is what they had left, so the Decision reports the quota (``decision_of``).
        """
        entry = self._at.get(rule.url if key is None else _slot(rule, key))
        if entry is None:
            return None
        known, free_at_s, trusted_s, held_s, quota, others = entry
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
        return Verdict(False, wait_us, others, wait_us, 1.0, held_us, *quota)

    def learn(
        self,
        rule: Rule,
        key: str | None,
        asked: tuple[float, int],
        next_free_us: float,
        held_us: float = 0.0,
        quota: Quota = NO_QUOTA,
        stored: float = 0.0,
    ) -> None:
        """A reply said the interface is next free in ``next_free_us`` (and held by a
        pushback for ``held_us``) to a request that left at ``asked`` = (monotonic s, the
        ``generation`` then); ``stored``: the least its limits other than a calendar
        quota had left (``Verdict.stored``)."""
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
        # the other limits had room and the quota is not spent: its pace shut it
        paced = quota[0] >= 1.0 and stored >= 1.0 and held_us <= 0.0
        others = stored if paced else 0.0
        at[slot] = (rule, sent_s + free_s, sent_s + ahead_s, sent_s + held_s, quota, others)
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
