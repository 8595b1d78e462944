"""What Envoy is told: each descriptor's code, its limit in Envoy's units, what is left,
when it resets, and the response headers to add. Plain data: ``server.py`` turns it
into the protobuf answer.

How it works: docs/internals.md, section ``gateway_limiter.rls.answers``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.decision import Decision
from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.rls.judge import Judgement

#: Envoy's ``RateLimitResponse.RateLimit.Unit`` values used here, with their seconds.
SECOND, MINUTE, HOUR, DAY, MONTH, WEEK = 1, 2, 3, 4, 5, 7
UNITS: tuple[tuple[int, int], ...] = ((1, SECOND), (60, MINUTE), (3600, HOUR), (86_400, DAY))
#: A calendar quota's period in Envoy's units (said exactly, however long the period).
CALENDAR_UNITS: dict[str, int] = {"day": DAY, "week": WEEK, "month": MONTH}
#: The header that says what decided (Redis, or the failure policy while it is away).
DECIDED_BY = "X-RateLimit-Decided-By"


@dataclass(frozen=True, slots=True)
class Limit:
    """A row in Envoy's terms: ``requests_per_unit`` per ``unit``, and its name."""

    requests_per_unit: int
    unit: int
    name: str
    #: True when the unit is the row's period: said exactly
    exact: bool


@dataclass(frozen=True, slots=True)
class Status:
    """One descriptor's answer."""

    ok: bool
    limit: Limit | None = None
    remaining: int = 0
    #: seconds; None: not said
    reset_s: float | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """A request's answer: OK or OVER_LIMIT overall, each descriptor's, the headers."""

    ok: bool
    statuses: tuple[Status, ...]
    headers: dict[str, str]
    decided_by: str


def envoy_limit(rule: Rule) -> Limit:
    """``rule`` (one row) in Envoy's units: exactly when its period is one of them."""
    if rule.calendar is not None:  # a calendar quota: per day, week or month of its zone
        period = rule.calendar.renewal.period
        name = f"configId {rule.config_id}: {rule.rate} per {period} in {rule.calendar.zone.key}"
        return Limit(rule.rate, CALENDAR_UNITS[period], name, True)
    name = f"configId {rule.config_id}: {rule.rate} per {rule.period} s, {rule.algorithm}"
    for seconds, unit in UNITS:
        if rule.period == seconds:
            return Limit(rule.rate, unit, name, True)
    for seconds, unit in UNITS:
        if seconds >= rule.period:
            scaled = math.floor(rule.rate * seconds / rule.period)
            return Limit(max(1, scaled) if rule.rate else 0, unit, name, False)
    raise ValueError(f"period {rule.period} s is longer than a day")  # rows never are


def answer(limiter: AsyncGatewayLimiter, judgement: Judgement) -> Answer:
    """What Envoy is told of ``judgement`` (see the module)."""
    statuses: list[Status] = []
    binding: tuple[float, Decision] | None = None
    for judged in judgement.judged:
        outcome = judged.outcome
        if outcome is None or outcome[2] is None:
            statuses.append(Status(judged.admitted))
            continue
        verdict, _reason, rule = outcome
        assert rule is not None
        decision = limiter._decision(outcome, 0.0)
        if judged.admitted:
            reset_s: float | None = verdict.next_free_us / US_PER_S if verdict.allowed else None
        else:
            reset_s = decision.retry_after
        statuses.append(
            Status(judged.admitted, envoy_limit(rule), decision.remaining or 0, reset_s)
        )
        if judgement.allowed or not decision.allowed:
            # refused: the refusal that frees last binds; admitted: the fewest left
            if judgement.allowed:
                weight = -float(decision.remaining if decision.remaining is not None else 2**62)
            else:
                weight = math.inf if decision.retry_after is None else decision.retry_after
            if binding is None or weight > binding[0]:
                binding = (weight, decision)
    headers = {} if binding is None else binding[1].headers()
    headers[DECIDED_BY] = judgement.decided_by
    return Answer(judgement.allowed, tuple(statuses), headers, judgement.decided_by)
