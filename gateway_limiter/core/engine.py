"""The engine's operations: each public call of the limiters, written once, as steps.

Each function here is one operation of ``GatewayLimiter`` and ``AsyncGatewayLimiter``
as a generator of steps (``core/steps.py``) that their shells carry out (``_run``): the
decisions (``reserving``, ``trying``, ``deciding``, ``acquiring``: the one round trip,
then the wait slept on the limiter's clock), what the supplier reports (``pushing``,
``observing``), what the limiter reports (``statuses``, ``in_flight``), ``slot()`` on an
interface without a cap (``slot_decided``; a capped one is ``core.slot_steps.holding``), and
the fleet's heartbeats (``joining``, ``beating``, ``leaving``). The engine reads time
only through the limiter's clock, and starts no thread and opens no socket.

A plain decision is one ``Reserve`` step: ``_begin`` (everything up to the backend,
``core/pipeline.py``), the reply, ``_finish``. A lease row's (``core/leases.py``) and
a lower class's on an interface with a reserve (``LimiterCore._rechecking``) may take
more steps; they are entered from ``asking``.
"""

from __future__ import annotations

import dataclasses
import math

from gateway_limiter.backends.base import BackendError
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.arguments import check_args, check_priority
from gateway_limiter.core.decision import Decision, Reason
from gateway_limiter.core.outcomes import (
    Outcome,
    allowed_wait_s,
    call_class,
    route,
    slept_s,
    slot_rule,
)
from gateway_limiter.core.pipeline import LimiterCore
from gateway_limiter.core.slot_steps import counting
from gateway_limiter.core.slots import SlotState, refused
from gateway_limiter.core.status import BucketStatus, chosen, describing
from gateway_limiter.core.steps import Ask, Beat, PushBack, Reserve, Send, Sleep, Steps, raw
from gateway_limiter.errors import NotStarted
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.priority import Priority

# --- the decisions ------------------------------------------------------------------


def asking(core: LimiterCore, ask: Ask) -> Steps[Outcome]:
    """The backend's part of a decision ``_begin`` left to it: one ``Reserve`` (a lease
    row's ``lease.lua`` call, or a lower class's re-checks, may take more)."""
    if ask.lease is None and not ask.renewing:  # a plain decision: bucket.lua
        if ask.rule.shares is None:
            return core._finish(ask, (yield Reserve(ask)))
        return (yield from core._rechecking(ask))  # a class that takes nothing ahead
    return (yield from core._leasing(ask))


def reserving(
    core: LimiterCore,
    url: str,
    permits: int,
    timeout: float | None,
    key: str | None,
    priority: Priority | str | None,
) -> Steps[Verdict]:
    """``reserve``: the verdict, its wait left to the caller."""
    begun = core._begin(url, permits, timeout, key, priority=priority)
    return ((yield from asking(core, begun)) if isinstance(begun, Ask) else begun)[0]


def trying(
    core: LimiterCore,
    url: str,
    permits: int,
    timeout: float | None,
    key: str | None,
    priority: Priority | str | None,
) -> Steps[bool]:
    """``try_acquire``: the verdict, its wait slept when it admits."""
    begun = core._begin(url, permits, timeout, key, priority=priority)
    verdict = ((yield from asking(core, begun)) if isinstance(begun, Ask) else begun)[0]
    if (wait_s := allowed_wait_s(verdict)) > 0:
        yield Sleep(wait_s)
    return verdict.allowed


def deciding(
    core: LimiterCore,
    url: str,
    permits: int,
    timeout: float | None,
    key: str | None,
    priority: Priority | str | None,
) -> Steps[Decision]:
    """``decide``: ``trying``, answering with the whole Decision."""
    begun = core._begin(url, permits, timeout, key, priority=priority)
    outcome = (yield from asking(core, begun)) if isinstance(begun, Ask) else begun
    if (wait_s := allowed_wait_s(outcome[0])) > 0:
        yield Sleep(wait_s)
    return core._decision(outcome, timeout, permits, priority)


def acquiring(
    core: LimiterCore, url: str, permits: int, key: str | None, priority: Priority | str | None
) -> Steps[float]:
    """``acquire``: no wait budget; the seconds waited. A calendar quota books no call
    past the periods it knows (docs/algorithms.md, "Calendar quotas"): refused with a
    wait all the same, ``acquire`` sleeps it and asks again."""
    before_s = 0.0  # slept on such refusals
    while True:
        begun = core._begin(url, permits, None, key, forever=True, priority=priority)
        outcome = (yield from asking(core, begun)) if isinstance(begun, Ask) else begun
        verdict, reason, _ = outcome
        if verdict.allowed or reason != Reason.LIMITED or not 0.0 < verdict.wait_us < math.inf:
            break
        yield Sleep(verdict.wait_us / US_PER_S)
        before_s += verdict.wait_us / US_PER_S
    wait_s = core._acquired(url, permits, outcome)
    if wait_s > 0:
        yield Sleep(wait_s)
    return before_s + wait_s + slept_s(outcome)


# --- what the supplier reports, and what the limiter reports ---------------------------


def pushing(core: LimiterCore, url: str, retry_after: float | None, key: str | None) -> Steps[None]:
    """``pushback``: one round trip, its failure logged (``core/reports.py``)."""
    push = core._begin_pushback(url, retry_after, key)
    if push is not None:
        core._pushed(push, (yield PushBack(push.rule, push.retry_after, push.key)))


def observing(
    core: LimiterCore, url: str, remaining: object, reset_at: object, key: str | None
) -> Steps[int | None]:
    """``observe``: one round trip, or none (``core/reports.py``)."""
    observed = core._begin_observe(url, remaining, reset_at, key)
    if observed is None:
        return None
    return core._observed(observed, (yield Send(observed.call, raw)))


def statuses(core: LimiterCore, state: SlotState, url: str | None) -> Steps[list[BucketStatus]]:
    """``status``: every limit in force (or ``url``'s) with its live state, then, on an
    interface's first limit, its calls in flight."""
    shown: list[BucketStatus] = []
    for interface, limits in chosen(core.registry, url):
        shown += yield from describing(interface, limits, core._shared)
    out = []
    for status in shown:
        rule = core.registry.snapshot.rules.get(status.rule.url)
        if rule is None or rule.config_id != status.rule.config_id or rule.max_concurrent is None:
            out.append(status)
            continue
        counted = yield from in_flight(core, state, rule.url)
        out.append(dataclasses.replace(status, in_flight=counted))
    return out


def in_flight(core: LimiterCore, state: SlotState, url: str) -> Steps[int | None]:
    """``in_flight``: ``url``'s calls in flight fleet-wide (None: no ``maxConcurrent``)."""
    rule = slot_rule(core.registry.snapshot, url)
    if rule is None or rule.max_concurrent is None:
        return None
    return (yield from counting(core._shared, state, rule))


# --- slot() ---------------------------------------------------------------------------


def slot_of(
    core: LimiterCore,
    url: str,
    timeout: float | None,
    key: str | None,
    priority: Priority | str | None,
) -> tuple[Rule | None, Priority | None, float | None]:
    """``slot()``'s arguments checked: the rule it is decided by, the call's class, and
    the wait budget for one of the rule's slots (``core.slot_steps.holding``), or None: no
    cap to hold (not limited, no ``maxConcurrent``, a shadow or closed row), decided as
    ``decide`` would (``slot_decided``)."""
    check_args(url, 1, timeout, key)
    cls = None if priority is None else check_priority(priority)
    if not core._started:
        raise NotStarted(core._NOT_STARTED)
    rule = route(core.registry.snapshot, url, key)
    if rule is not None and rule.classed:  # priority classes: the class's Rule
        rule = rule.for_class(call_class(rule, cls))
    if rule is None or rule.max_concurrent is None or rule.shadow or rule.closed:
        return rule, cls, None
    return rule, cls, rule.cache if timeout is None else timeout


def slot_decided(
    core: LimiterCore,
    url: str,
    timeout: float | None,
    key: str | None,
    cls: Priority | None,
    rule: Rule | None,
) -> Steps[Decision]:
    """``slot()`` with no cap to hold on ``rule``: ``decide``, and ``Refused`` when it
    refuses."""
    decision = yield from deciding(core, url, 1, timeout, key, cls)
    if not decision.allowed:
        budget = timeout if timeout is not None or rule is None else rule.cache
        raise refused(url, None, decision, budget or 0.0)
    return decision


# --- the fleet's heartbeats (core/fleet.py) ---------------------------------------------


def joining(core: LimiterCore) -> Steps[None]:
    """One heartbeat: this process counts in the fleet from now on."""
    fleet = core._fleet
    demand = fleet.demand(core.registry.snapshot.rules)
    core._beat((yield Beat((fleet.member, fleet.ttl_ms, demand))))


def beating(core: LimiterCore) -> Steps[None]:
    """A heartbeat every ``fleet_heartbeat`` s, off the decision path: the membership,
    demand and tallies; after an outage, the charges for what this process admitted
    alone; the leases a reload ended."""
    fleet = core._fleet
    demand = fleet.demand(core.registry.snapshot.rules)
    core._beat((yield Beat((fleet.member, fleet.ttl_ms, demand, core._tallies()))))
    for rule, permits in core._charges():  # after an outage, off the decision path
        charged = yield Reserve(Ask(rule, permits, None, None, None))
        if not isinstance(charged, BackendError):
            fleet.charged += permits
    for call in core._lease_returns():  # leases a reload ended
        yield Send(call, raw)


def leaving(core: LimiterCore) -> Steps[None]:
    """Leave the fleet at once (best effort), so N drops now rather than when this
    member would have expired."""
    if core.backend_healthy:
        yield Beat((core._fleet.member, 0))


def returning(core: LimiterCore) -> Steps[None]:
    """Hand back every lease of the lease rows (best effort: else they expire), when
    the limiter closes."""
    for call in core._lease_returns(closing=True):
        yield Send(call, raw)
