"""Which rule limits a call, and how a decision ends, the same for both limiters: the
class a call is decided in, the unlimited calls, the waits a verdict means, a shadow
rule letting the call go, and the metrics counting every decision.
"""

from __future__ import annotations

import math
from typing import Final

from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.decision import ADMIT, REFUSE, Reason
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.priority import Priority
from gateway_limiter.observe.logs import SHADOW_REPORT_SECONDS, Throttle, held_back, log, one_line
from gateway_limiter.observe.metrics import ProcessMetrics, interface_label


def call_class(rule: Rule, priority: Priority | None) -> Priority:
    """The class a call is decided in: its own, else its row's, else ``default``."""
    return priority or rule.priority or Priority.DEFAULT


def route(snapshot: Snapshot, url: str, key: str | None = None) -> Rule | None:
    """The rule that limits ``url`` for caller ``key`` now, or None when the call is not
    limited (a named caller's own rule where a per-caller row names ``key``)."""
    if not snapshot.switch:
        return None
    if key is not None and snapshot.named:  # empty unless some row names a caller
        return snapshot.named.get((url, key)) or snapshot.rules.get(url)
    return snapshot.rules.get(url)


def slot_rule(snapshot: Snapshot, url: str) -> Rule | None:
    """The rule whose ``maxConcurrent`` counts ``url``'s slots for ``in_flight``: its
    own, else a named caller's with a cap (the slots are the interface's, one pool)."""
    rule = route(snapshot, url)
    if (rule is None or rule.max_concurrent is None) and snapshot.switch and snapshot.named:
        capped = (r for (u, _), r in snapshot.named.items() if u == url and r.max_concurrent)
        return next(capped, rule)
    return rule


#: What a reservation comes to: the verdict to honour, its reason, and the rule (None:
#: not limited). Built once per decision; the unlimited ones are built here, once.
Outcome = tuple[Verdict, Reason, Rule | None]
_UNLIMITED: Final[dict[Reason, Outcome]] = {
    reason: (ADMIT, reason, None)
    for reason in (Reason.SWITCH_OFF, Reason.NOT_CONFIGURED, Reason.DISABLED)
}


def allowed_wait_s(verdict: Verdict) -> float:
    """The seconds a caller sleeps to honour ``verdict`` (0.0: none, or refused)."""
    return verdict.wait_us / US_PER_S if verdict.allowed else 0.0


def acquired_wait_s(verdict: Verdict, rule: Rule, permits: int) -> float:
    """The seconds an ``acquire`` must wait for ``verdict`` (decided with no timeout).

    Raises ValueError when no wait can ever do: ``permits`` more than a window of the
    interface holds (or a paced quota's burst: ``Rule.quota_most``), or, for a class
    below critical on limits with a reserve (which takes nothing ahead), more than they
    can give that class at once.
    """
    if not verdict.allowed:
        if rule.shares is not None:  # a class below critical takes nothing ahead
            most, cls = class_most(rule), call_class(rule, None).value
            if permits > most:
                raise ValueError(
                    f"permits must be at most {most} for {rule.url!r} at class {cls} "
                    "(what its limits can give that class at once, less the reserves "
                    f"kept for the classes above it), got {permits}"
                )
            raise ValueError(
                f"permits must be fewer for {rule.url!r} at class {cls} for now: a "
                "pushback, or this process's part while Redis is away, leaves its limits "
                f"less than that class can take at once, got {permits}"
            )
        most, binds = rule.window_most, _what_binds(rule)
        raise ValueError(
            f"permits must be at most {most} for {rule.url!r} ({binds}), got {permits}"
        )
    return verdict.wait_us / US_PER_S


def never_given(rule: Rule, permits: int) -> bool:
    """Whether no wait can ever give one call ``permits`` on ``rule``: more than a
    window or calendar quota ever lets one call have (``Rule.window_most``), or, for a
    class below critical on limits with a reserve, than they can give that class at once
    (``class_most``). Such a call is refused at once, whatever the other limits' state."""
    if permits <= 1:
        return False
    if rule.shares is not None:
        return permits > class_most(rule)
    most = rule.window_most
    return most > 0 and permits > most


def _what_binds(rule: Rule) -> str:
    """What gives ``rule``'s most for one call (``Rule.window_most``), in words."""
    most = rule.window_most
    binds = [r for r in rule.limits if r.spec.window and r.quota_most == most]
    if any(r.calendar is not None and r.pacing and r.pace_burst < r.rate for r in binds):
        return "its paced quota's burst"
    if any(r.calendar is not None for r in binds):
        return "its quota per period"
    return "what its window holds"


def class_most(rule: Rule) -> int:
    """The most permits one call of ``rule``'s class (a class's variant, ``shares`` set)
    can ever get at once: each limit's most less its share for the class (whole
    permits); a calendar quota keeps no reserve (a paced one gives at most its burst)."""
    shares = rule.shares or (0.0,) * len(rule.limits)
    return min(
        r.quota_most if r.calendar is not None else math.floor(r.most - share * r.most)
        for r, share in zip(rule.limits, shares, strict=True)
    )


def slept_s(outcome: Outcome) -> float:
    """The seconds a call already slept before ``outcome`` admitted it (a class below
    critical re-checking: ``LimiterCore._rechecking``)."""
    return outcome[0].slept_us / US_PER_S


def label(rule: Rule, priority: Priority | None = None) -> str:
    """The metrics' ``priority`` label of a call on ``rule`` (a class's Rule knows it)."""
    return (priority or rule.priority or Priority.DEFAULT).value


class Outcomes:
    """How a decision ends, the same for the sync and asyncio limiters: a shadow rule
    lets the call go whatever the bucket said, and the metrics count every decision.

    A limited interface's decision calls in here only when its rule is a shadow rule
    (``LimiterCore._settled`` counts the others' itself).
    """

    __slots__ = ("_shadow_log", "metrics")

    def __init__(self, metrics: ProcessMetrics | None) -> None:
        self.metrics = metrics
        self._shadow_log = Throttle(SHADOW_REPORT_SECONDS)

    def unlimited(self, snapshot: Snapshot, url: str, priority: Priority | None = None) -> Outcome:
        """A call no rule limits: admitted at once; why, and counted."""
        if not snapshot.switch:
            reason = Reason.SWITCH_OFF
        elif url in snapshot.disabled:
            reason = Reason.DISABLED
        else:
            reason = Reason.NOT_CONFIGURED
        if self.metrics is not None:
            label = (priority or Priority.DEFAULT).value
            self.metrics.record(interface_label(snapshot, url), reason, True, None, label)
        return _UNLIMITED[reason]

    def shadowed(self, rule: Rule, verdict: Verdict, reason: Reason) -> Outcome:
        """A shadow rule's bucket (or the failure policy) decided: the call goes ahead at
        once, counted (``LimiterCore._settled`` counts the other rules' decisions)."""
        # Shadow: counted as the limit decided (a wait it would impose is observed),
        # but the call goes ahead at once.
        if verdict.allowed:
            if self.metrics is not None:
                self.metrics.record(rule.url, reason, True, verdict.wait_us, label(rule))
            if verdict.wait_us > 0:
                verdict = Verdict(True, 0.0, verdict.stored, 0.0, verdict.factor)
            return verdict, reason, rule
        if self.metrics is not None:
            self.metrics.record(rule.url, Reason.SHADOW, True, None, label(rule))
        held = self._shadow_log.ready(rule.url)
        if held is not None:
            log.info(
                "shadow rule %s (%d/s, configId %d) would have refused a call (%s)%s",
                one_line(rule.url),
                rule.rate,
                rule.config_id,
                reason,
                held_back(held),
            )
        shadowed = (
            ADMIT if verdict is REFUSE else Verdict(True, 0.0, verdict.stored, 0.0, verdict.factor)
        )
        return shadowed, Reason.SHADOW, rule
