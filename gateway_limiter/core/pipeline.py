"""The decision path both limiters share, with no I/O in it: ``LimiterCore``.

A call goes: arguments checked -> snapshot read (no lock) -> switch off, no rule, or a
disabled row: admitted at once, no backend traffic -> a closed rule (rateLimit 0):
refused at once -> a lease row (``leaseMs``) with permits left in this process's
lease: admitted from it, no round trip (``core.leases``) -> an earlier reply said the
interface is not free within the caller's timeout: refused at once, no round trip
(``core.local_refusal``; not for lease rows) -> otherwise one backend decision (a lease
row's: ``lease.lua``) -> a shadow rule lets the call go whatever was decided -> the
metrics count it -> the wait, outside any lock.

``GatewayLimiter`` and ``AsyncGatewayLimiter`` are two I/O shells around this core. A
decision is ``_begin`` (everything up to the backend: it returns the finished
``Outcome``, or an ``Ask`` when the backend must be asked), the backend call, then
``_finish`` with the reply or the error: written as steps in ``core/engine.py``
(``trying`` and its siblings), which the shell carries out (the ``Reserve``, sync or
awaited, and the wait, a ``Sleep`` on the limiter's clock).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Self

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.backends.fleet import Heartbeat
from gateway_limiter.backends.scripts import ScriptCall
from gateway_limiter.config.reload import Registry, ReloadSummary
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings, load_settings, warn_fractions
from gateway_limiter.core import reports
from gateway_limiter.core.arguments import (
    MAX_PERMITS,
    MAX_RESET_AT,
    MAX_RETRY_AFTER_S,
    MAX_WAIT_S,
    MAX_WINDOW_PERMITS,
    check_args,
    check_permits,
    check_priority,
)
from gateway_limiter.core.clock import SYSTEM_CLOCK, Clock
from gateway_limiter.core.decision import ADMIT, REFUSE, Decision, Reason, decision_of
from gateway_limiter.core.failure import Breaker, FailurePolicy, Policy, script_fault
from gateway_limiter.core.fleet import Fleet
from gateway_limiter.core.leases import Leases, from_lease, leasing
from gateway_limiter.core.local_refusal import LocalRefusals
from gateway_limiter.core.outcomes import (
    Outcome,
    Outcomes,
    acquired_wait_s,
    allowed_wait_s,
    call_class,
    label,
    never_given,
    route,
    slept_s,
    slot_rule,
)
from gateway_limiter.core.quota_watch import QuotaWatch
from gateway_limiter.core.quotas import Observed, QuotaKeeper, counter_key
from gateway_limiter.core.reports import Push
from gateway_limiter.core.steps import Ask, Reserve, Sleep, Steps
from gateway_limiter.errors import BackendUnavailable, InterfaceClosed, NotStarted
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.priority import Priority
from gateway_limiter.observe.logs import log
from gateway_limiter.observe.metrics import ProcessMetrics, Source, process_metrics

# The arguments' checks and bounds (``core/arguments.py``) and the ends of a decision
# (``core/outcomes.py``) live in modules of their own; the shells, the integrations and
# the rate limit service import them from here as well.
__all__ = [
    "MAX_PERMITS",
    "MAX_RESET_AT",
    "MAX_RETRY_AFTER_S",
    "MAX_WAIT_S",
    "MAX_WINDOW_PERMITS",
    "LimiterBase",
    "LimiterCore",
    "Outcome",
    "Push",
    "allowed_wait_s",
    "call_class",
    "check_args",
    "check_priority",
    "local_refusals_for",
    "open_metrics",
    "route",
    "settings_from",
    "slept_s",
    "slot_rule",
]


def settings_from(settings: Settings | str | Path | None, overrides: dict[str, Any]) -> Settings:
    """Settings from an object, a file path, or the usual lookup, plus keyword overrides."""
    if isinstance(settings, Settings):
        return settings.replace(**overrides) if overrides else settings
    return load_settings(settings, **overrides)


def open_metrics(settings: Settings) -> ProcessMetrics | None:
    """The process's metrics if the settings ask for them and prometheus-client is there."""
    return process_metrics() if settings.metrics else None


def local_refusals_for(shared: bool, registry: Registry) -> LocalRefusals | None:
    """Local refusals for a shared backend, forgotten when a reload changes the limits."""
    if not shared:
        return None  # memory:// decides in-process already
    refusals = LocalRefusals()
    registry.listeners.append(refusals.reloaded)
    return refusals


class LimiterBase:
    """What a limiter holds, and its life: settings, the registry of rules, the failure
    policy and its breaker, the fleet, the metrics, the local refusals (what replies
    said about when each interface is next free) and the leases; built, started,
    beating, stopped. The decision path is ``LimiterCore``'s, on top of it. A subclass
    opens its backend (sync or asyncio) in ``_open_backend``.
    """

    __slots__ = (
        "_breaker",
        "_counters",
        "_factors",
        "_fallbacks",
        "_fleet",
        "_leases",
        "_local_refusals",
        "_metrics",
        "_outcomes",
        "_quotas",
        "_shared",
        "_source",
        "_started",
        "_tally",
        "clock",
        "policy",
        "registry",
        "settings",
    )

    #: What ``NotStarted`` says: how to start this kind of limiter.
    _NOT_STARTED: ClassVar[str] = "call start() first"

    def __init__(self, settings: Settings | str | Path | None = None, **overrides: Any) -> None:
        # ``clock=`` (not a setting): where every moment of a decision is read and how its
        # waits are slept (``core/clock.py``); taken from the keywords so that settings
        # passed as ``**dict`` keep type-checking
        clock = overrides.pop("clock", SYSTEM_CLOCK)
        if not isinstance(clock, Clock):
            raise TypeError(f"clock must be a Clock, got {type(clock).__name__}")
        self.clock: Clock = clock
        self.settings = chosen = settings_from(settings, overrides)
        shared = self._open_backend(chosen)
        self.registry = Registry(chosen)  # no I/O until the first reload
        self.policy = Policy(chosen.on_backend_error, self._in_process)
        self._breaker = Breaker(chosen.breaker_seconds, clock)
        self._shared = shared
        self._started = False
        self._fallbacks = 0
        self._fleet = Fleet(chosen, shared, clock)
        self._tally = self._fleet.tallies.add  # every decision: bound once
        self._metrics = open_metrics(chosen)
        self._outcomes = Outcomes(self._metrics)
        self._source: Source | None = None
        #: calendar quotas' used ratios, and their warnings (``quota_warn_at``)
        self._quotas = QuotaWatch(warn_fractions(chosen.quota_warn_at))
        if self._metrics is not None and self._metrics.multiprocess:  # a gauge in a file
            self._quotas.publish = self._metrics.quota_seen
        #: url -> its effective rate / the row's, where the last reply said it was < 1
        self._factors: dict[str, float] = {}
        if self._metrics is not None:
            self.registry.listeners.append(self._metrics.reloaded)
            self._source = Source(
                lambda: self.registry.snapshot,
                lambda: self._breaker.is_open,
                fleet_size=lambda: self._fleet.size,
                factors=lambda: dict(self._factors),
                in_flight=self._in_flight_seen,
                quota_used=self._quotas.used,
            )
        self._local_refusals = local_refusals_for(shared, self.registry)
        #: leases of lease rows; memory:// decides in-process already and takes none
        self._leases: Leases | None = None
        if shared:
            leases = self._leases = Leases(chosen.key_prefix, clock)
            self.registry.listeners.append(lambda _: leases.reloaded(self.registry.snapshot))
        #: calendar quotas' floors and checkpoints (``core/quotas.py``); shared state only
        self._counters: QuotaKeeper | None = None
        if shared:
            counters = self._counters = QuotaKeeper(
                chosen.key_prefix, self._fleet.member, chosen.quota_checkpoint_s
            )
            # share: a quota's part of what the fleet had left, not of the whole period
            self.policy.quota_floor = lambda limit, key: counters.floors.get(
                counter_key(chosen.key_prefix, limit, key)
            )

    @classmethod
    def from_settings(cls, path: str | Path | None = None, **overrides: Any) -> Self:
        """A limiter from a settings file (None: $GATEWAY_LIMITER_SETTINGS, ./settings.toml)."""
        return cls(load_settings(path, **overrides))

    def _open_backend(self, settings: Settings) -> bool:
        """Open this limiter's backend (no I/O yet); whether its state is shared."""
        raise NotImplementedError

    def _in_process(self) -> Backend:
        """Fresh in-process state for the failure policy (the shell's ``memory://``)."""
        raise NotImplementedError

    def _in_flight_seen(self) -> dict[str, int]:
        """Interface -> calls in flight as this process last saw (``slot()``)."""
        return {}

    @property
    def backend_healthy(self) -> bool:
        """False while the failure policy is deciding instead of the backend."""
        return not self._breaker.is_open

    @property
    def backend_fallbacks(self) -> int:
        """How many decisions the failure policy made instead of the backend."""
        return self._fallbacks

    @property
    def fleet_size(self) -> int:
        """The live processes sharing the rules as Redis last said, this one included
        (``memory://``: 1; before Redis has answered: the ``fleet_size`` setting, 0
        unknown). While Redis is away ``share`` decides at 1/fleet_size of each rule."""
        return self._fleet.size

    @property
    def call_counts(self) -> dict[str, tuple[int, int, int]]:
        """Calls decided in this process per limited interface since start: (admitted,
        of which after a wait, refused). The console's live numbers for ``memory://``."""
        return {url: (c[0], c[1], c[2]) for url, c in list(self._fleet.tallies.counts.items())}

    @property
    def local_refusals(self) -> int:
        """How many calls were refused in-process, without a round trip, because the
        interface was not free within their timeout (see ``core.local_refusal``)."""
        return 0 if self._local_refusals is None else self._local_refusals.refused

    def _backend_failed(self, error: BackendError) -> None:
        """The backend failed ``error``: the breaker counts it, the policy decides meanwhile."""
        if script_fault(error):  # the call's or its row's, not Redis': the breaker stays
            return
        if not self._breaker.is_open:  # an outage begins (not a failed probe in one)
            self.policy.outage_began(start_empty=self._fleet.size != 0)
        self._breaker.failed(error)
        if self._local_refusals is not None:
            # The failure policy decides now; the backend may come back without its state.
            self._local_refusals.forget()
        if self._metrics is not None:
            self._metrics.backend_error()

    # --- start and stop: the shell does the I/O in between -----------------------

    def _starting(self) -> None:
        """Before the backend's ``prepare``: say when limits hold in this process only."""
        if not self._shared:
            log.warning(
                "redis_url is memory://: limits hold in this process only "
                "(N processes admit N x the rate)"
            )

    def _prepared(self, failure: BackendError | None) -> None:
        """The backend's ``prepare`` returned (None) or failed."""
        if failure is not None:
            self._backend_failed(failure)  # start anyway: the failure policy decides meanwhile

    def _running(self, summary: ReloadSummary) -> ReloadSummary:
        """The first reload is done: decisions may be asked for."""
        self._started = True
        if self._metrics is not None and self._source is not None:
            self._metrics.attach(self._source)
        return summary

    def _beat(self, reply: Heartbeat | BackendError) -> None:
        """A fleet heartbeat answered N and the claims (or failed: they stay)."""
        self._fleet.beat(reply)

    def _charges(self) -> list[tuple[Rule, int]]:
        """After an outage, once: what the heartbeat charges the shared buckets for the
        permits this process admitted alone (``Fleet.charges``)."""
        return self._fleet.charges() if self._fleet.charges_due else []

    def _tallies(self) -> str:
        """What this heartbeat carries besides the membership: the calls per interface
        per second since the last one, and the effective rates after pushback."""
        return self._fleet.tallies.since_last(dict(self._factors))

    def _stopping(self) -> None:
        """Before closing: decisions raise NotStarted from now on, the gauges go."""
        self._started = False
        if self._metrics is not None and self._source is not None:
            self._metrics.detach(self._source)


class LimiterCore(LimiterBase):
    """What the sync and asyncio limiters share: everything but the I/O. One decision
    (``_begin``, the backend in the shell, ``_finish``) and one pushback
    (``_begin_pushback``, the backend, ``_pushed``; written in ``core/reports.py``), with
    the failure policy deciding when the backend cannot.
    """

    __slots__ = ()

    # --- one decision: _begin, the backend (in the shell), _finish ----------------

    def _begin(
        self,
        url: str,
        permits: int,
        timeout_s: float | None,
        key: str | None,
        *,
        forever: bool = False,
        priority: Priority | str | None = None,
    ) -> Outcome | Ask:
        """Everything up to the backend: the finished Outcome, or what to ask it.

        ``timeout_s`` None: the row's ``cache``. ``forever`` (``acquire``): no wait
        budget at all, however long it takes. ``priority``: the call's class (None: its
        row's); on an interface with a reserve, its class's Rule decides.
        """
        check_args(url, permits, timeout_s, key)
        if priority is not None and type(priority) is not Priority:
            priority = check_priority(priority)
        if not self._started:
            raise NotStarted(self._NOT_STARTED)
        snapshot = self.registry.snapshot
        rule = route(snapshot, url, key)
        if rule is None:
            return self._outcomes.unlimited(snapshot, url, priority)
        if rule.classed:  # priority classes: the class's shares of each limit's reserve
            rule = rule.classed[call_class(rule, priority).rank]
        if rule.closed:
            return self._settled(rule, REFUSE, Reason.CLOSED, priority)
        if permits > 1:
            check_permits(rule, url, permits)
        budget_s = None if forever else rule.cache if timeout_s is None else timeout_s
        if budget_s is not None and budget_s > MAX_WAIT_S:
            budget_s = MAX_WAIT_S
        if rule.lease_ms and self._leases is not None:  # from the lease (core.leases)
            return from_lease(self, self._leases, rule, permits, budget_s, wait=True)
        # The local refusals (``core.local_refusal``), inline: every decision passes here.
        refusals = self._local_refusals
        # an ask no wait can ever give: the backend refuses it at once, whatever any
        # limit's next free moment; neither refused here nor learnt from
        if refusals is None or (permits > 1 and never_given(rule, permits)):
            asked = None
        else:
            now_s = self.clock.monotonic()
            if budget_s is not None and not self._breaker.is_open:
                refused = refusals.refusal(rule, key, budget_s, now_s)
                if refused is not None:  # the backend would refuse too: no round trip
                    return self._refused_locally(rule, refused, priority)
            asked = (now_s, refusals.generation)
        if self._breaker.allows():
            return Ask(rule, permits, budget_s, key, asked, priority=priority)
        return self._settled(rule, *self._fall_back(rule, permits, budget_s, key), priority)

    def _refused_locally(
        self, rule: Rule, refused: Verdict, priority: Priority | None = None
    ) -> Outcome:
        """An earlier reply said ``rule``'s interface is not free in time: refused here."""
        if self._metrics is not None:
            self._metrics.local_refusal()
        if self._factors and (factor := self._factors.get(rule.url)) is not None:
            refused = refused._replace(factor=factor)  # what the last reply said
        return self._settled(rule, refused, Reason.LIMITED, priority)

    def _leasing(self, ask: Ask) -> Steps[Outcome]:
        """A lease row's decision, as steps for the shell (``core.leases.leasing``)."""
        assert self._leases is not None
        return leasing(self, self._leases, ask)

    def _lease_returns(self, closing: bool = False) -> list[ScriptCall]:
        """The calls that hand back leases (on the heartbeat; every lease when closing)."""
        return [] if self._leases is None else list(self._leases.returns(closing))

    def _finish(self, ask: Ask, reply: Verdict | BackendError) -> Outcome:
        """The backend answered ``ask`` (or failed): the Outcome."""
        if isinstance(reply, BackendError):
            self._backend_failed(reply)
            verdict, reason = self._fall_back(ask.rule, ask.permits, ask.budget_s, ask.key)
            return self._settled(ask.rule, verdict, reason, ask.priority)
        self._answered(ask, reply)
        if reply.allowed:
            return self._settled(ask.rule, reply, Reason.ADMITTED, ask.priority)
        reason = Reason.RESERVED if reply.reserved else Reason.LIMITED
        return self._settled(ask.rule, reply, reason, ask.priority)

    def _rechecking(self, ask: Ask) -> Steps[Outcome]:
        """A call of a class below critical on an interface with a reserve: it takes
        nothing ahead (only critical reserves future permits), so while its budget
        allows it sleeps, reserving nothing, until the reply said its class could go,
        and asks again. What it slept (on the clock) is the admitted verdict's
        ``slept_us``: part of the time it waited for its permit (``Decision.waited``,
        ``acquire``'s answer), never slept again; a refusal waited for nothing."""
        began = self.clock.monotonic()
        slept_s = 0.0
        while True:
            reply = yield Reserve(ask)
            if isinstance(reply, BackendError) or reply.allowed:
                return self._slept(self._finish(ask, reply), slept_s)
            wait_s = reply.wait_us / US_PER_S
            left_s = (
                None if ask.budget_s is None else ask.budget_s - (self.clock.monotonic() - began)
            )
            if math.isinf(wait_s) or (left_s is not None and wait_s > left_s):
                return self._finish(ask, reply)
            before_s = self.clock.monotonic()
            yield Sleep(wait_s)
            slept_s += max(0.0, self.clock.monotonic() - before_s)
            budget_s = (
                None
                if ask.budget_s is None
                else max(0.0, ask.budget_s - (self.clock.monotonic() - began))
            )
            ask = Ask(ask.rule, ask.permits, budget_s, ask.key, ask.asked, priority=ask.priority)
            began = self.clock.monotonic()

    @staticmethod
    def _slept(outcome: Outcome, slept_s: float) -> Outcome:
        """``outcome`` with ``slept_s`` already slept for it, when it admitted the call."""
        verdict, reason, rule = outcome
        if slept_s <= 0.0 or not verdict.allowed or verdict is ADMIT:
            return outcome
        return verdict._replace(slept_us=verdict.slept_us + slept_s * US_PER_S), reason, rule

    def _decision(
        self,
        outcome: Outcome,
        timeout_s: float | None,
        permits: int = 1,
        priority: Priority | str | None = None,
    ) -> Decision:
        """The Decision a ``decide`` answers, once its wait is slept."""
        verdict, reason, rule = outcome
        if rule is None:
            return decision_of(verdict, reason, None, 0.0, 0.0)._replace(
                priority=None if priority is None else str(priority)
            )
        budget_s = rule.cache if timeout_s is None else timeout_s
        breaker_s = self.settings.breaker_seconds
        cls = call_class(rule, None if priority is None else check_priority(priority))
        decision = decision_of(verdict, reason, rule, budget_s, breaker_s, permits, cls.value)
        if reason == Reason.BACKEND_FALLBACK and self.policy.kind is FailurePolicy.SHARE:
            # the rate this process enforces now is its part of the row's, not the row's
            part = self._fleet.part(rule)
            if part < 1.0 and decision.limit is not None:
                shared = rule.rate * part
                decision = decision._replace(
                    limit=math.floor(shared + 1e-9),
                    effective_rate=shared * verdict.factor,
                )
        return decision

    def _acquired(self, url: str, permits: int, outcome: Outcome) -> float:
        """The seconds an ``acquire`` sleeps; InterfaceClosed for a closed interface,
        ValueError for more permits than a window of it can ever hold."""
        verdict, reason, rule = outcome
        if rule is None:
            return 0.0
        if reason == Reason.CLOSED:
            raise InterfaceClosed(f"interface {url!r} is closed (rateLimit 0)")
        whole = rule.window_most
        if not verdict.allowed and reason == Reason.BACKEND_FALLBACK and permits <= whole:
            part = self._fleet.share(rule) if self.policy.kind is FailurePolicy.SHARE else rule
            most = part.window_most
            raise BackendUnavailable(
                f"Redis is unreachable, and meanwhile this process's part of a window of "
                f"{url!r} holds at most {most} permits (on_backend_error is "
                f"{self.policy.kind.value!r}): got {permits}"
            )
        return acquired_wait_s(verdict, rule, permits)

    def _settled(
        self, rule: Rule, verdict: Verdict, reason: Reason, priority: Priority | None = None
    ) -> Outcome:
        # What the limit decided (a shadow rule's refusals count as refusals here): the
        # console's live numbers and the demand the heartbeat reports (core/fleet.py).
        self._tally(rule.url, verdict.allowed, verdict.wait_us > 0)
        if rule.shadow:
            return self._outcomes.shadowed(rule, verdict, reason)
        if self._metrics is not None:
            self._metrics.record(
                rule.url,
                reason,
                verdict.allowed,
                verdict.wait_us if verdict.allowed else None,
                label(rule, priority),
            )
        return verdict, reason, rule

    def _answered(self, ask: Ask, verdict: Verdict) -> None:
        """The backend decided: close the breaker, learn when the interface is next free."""
        if self._breaker.succeeded():  # after an outage: the heartbeat charges Redis
            self._fleet.charges_due = True
        refusals = self._local_refusals
        if verdict.next_free_us > 0.0 and ask.asked is not None and refusals is not None:
            refusals.learn(
                ask.rule,
                ask.key,
                ask.asked,
                verdict.next_free_us,
                verdict.held_us,
                (verdict.quota_left, verdict.quota_reset_us, verdict.quota_limit),
                verdict.stored,
            )
        if verdict.factor != 1.0 or self._factors:  # a pushback, now or before
            self._seen_factor(ask.rule, verdict.factor)
        if verdict.quota_left >= 0.0:  # a calendar quota: how much of its period is used
            self._quotas.seen(ask.rule, verdict)
        if verdict.quota_limit and self._counters is not None:  # a calendar quota's count
            self._counters.learn(ask.rule, ask.key, verdict)

    def _seen_factor(self, rule: Rule, factor: float) -> None:
        if factor < 1.0:
            self._factors[rule.url] = factor
        else:
            self._factors.pop(rule.url, None)
        if self._metrics is not None and self._metrics.multiprocess:
            # a worker's gauge lives in a file: set it now, no scrape will compute it
            self._metrics.factor_seen(rule.url, rule.rate, rule.algorithm, factor)

    # --- what the supplier says (core/reports.py): a pushback, what is left ---------

    def _begin_pushback(self, url: str, retry_after: float | None, key: str | None) -> Push | None:
        return reports.begin_pushback(self, url, retry_after, key)

    def _pushed(self, push: Push, reply: tuple[float, float] | BackendError) -> None:
        reports.pushed(self, push, reply)

    def _begin_observe(
        self, url: str, remaining: object, reset_at: object, key: str | None
    ) -> Observed | None:
        return reports.begin_observe(self, url, remaining, reset_at, key)

    def _observed(self, observed: Observed, reply: object) -> int | None:
        return reports.observed(self, observed, reply)

    def _fall_back(
        self, rule: Rule, permits: int, budget_s: float | None, key: str | None
    ) -> tuple[Verdict, Reason]:
        """The backend could not be asked: the failure policy decides."""
        self._fallbacks += 1  # off the hot path: only while the backend is failing
        if self._metrics is not None:
            self._metrics.fallback()
        original = rule
        if self.policy.kind is FailurePolicy.SHARE:
            rule = self._fleet.share(rule)  # a part of 0: closed (Policy.reserve)
        try:
            verdict = self.policy.reserve(rule, permits, budget_s, key, original)
            if verdict.allowed and key is None and self.policy.kind is FailurePolicy.SHARE:
                # share only: local keeps its meaning (N x the rate, nothing paid back)
                self._fleet.admitted_alone(original, permits)
            return verdict, Reason.BACKEND_FALLBACK
        except BackendUnavailable:  # deny, and an acquire: it would wait forever
            if not rule.shadow:
                raise
            return REFUSE, Reason.BACKEND_FALLBACK  # a shadow rule never stops a call
