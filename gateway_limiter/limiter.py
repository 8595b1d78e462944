"""``GatewayLimiter``: the facade every gateway process calls before an upstream call.

A call goes: arguments checked -> snapshot read (no lock) -> switch off, no rule, or a
disabled row: admitted at once, no Redis traffic -> a closed rule (rateLimit 0):
refused at once -> an earlier reply said the interface is not free within the
caller's timeout: refused at once, no round trip (``horizons``) -> otherwise one
backend decision -> a shadow rule lets the call go whatever was decided -> the
metrics count it -> the wait, outside any lock.
``decide`` returns all of that as a ``Decision``; ``try_acquire`` is its ``allowed``.

When the backend fails, ``on_backend_error`` decides (``local``: the same rules in this
process; ``allow``; ``deny``), and a circuit breaker keeps every following call off
Redis for ``breaker_seconds``, after which one caller probes and the rest follow it back.
The pieces below (argument checks, routing, breaker, policy, outcomes, and
``LimiterCore``, which holds them for a limiter) are shared with ``gateway_limiter.aio``;
only the I/O differs there.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from gateway_limiter.backends.base import Backend, BackendError
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.backends.schemes import open_backend
from gateway_limiter.config.reload import Registry, ReloadSummary, Snapshot
from gateway_limiter.config.rules import FIXED_WINDOW, SLIDING_WINDOW, Rule
from gateway_limiter.config.settings import Settings, load_settings
from gateway_limiter.core.decision import (
    ADMIT,
    ADMITTED,
    BACKEND_FALLBACK,
    CLOSED,
    DISABLED,
    LIMITED,
    NOT_CONFIGURED,
    REFUSE,
    SHADOW,
    SWITCH_OFF,
    Decision,
    decision_of,
)
from gateway_limiter.core.horizons import Horizons
from gateway_limiter.model.bucket import MICROS, BucketState, Verdict, decide, resync
from gateway_limiter.observe.logs import (
    OUTAGE_REPORT_SECONDS,
    SHADOW_REPORT_SECONDS,
    Throttle,
    held_back,
    log,
    one_line,
)
from gateway_limiter.observe.metrics import ProcessMetrics, Source, interface_label, process_metrics


class LimiterError(Exception):
    """Base class of the limiter's own errors."""


class InterfaceClosed(LimiterError):
    """``acquire`` on an interface whose row has ``rateLimit = 0``: it would wait forever."""


class BackendUnavailable(LimiterError):
    """``acquire`` while Redis is unreachable and ``on_backend_error = deny``."""


class NotStarted(LimiterError, RuntimeError):
    """A decision was asked of a limiter that was never started (or already closed)."""


#: Algorithms whose state is a window of admissions, not a bucket.
WINDOWS = (SLIDING_WINDOW, FIXED_WINDOW)
#: The most permits one call may ask for: a row's rateLimit is an INT(11), and beyond
#: this a reservation's debt stops being exact in the script's doubles.
MAX_PERMITS = 2**31 - 1
#: The largest timeout: a finite float (an int beyond it would overflow converting).
_MAX_TIMEOUT = sys.float_info.max


def _shown(value: object) -> str:
    # repr of an int of thousands of digits raises ValueError (int_max_str_digits).
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def check_args(url: object, permits: object, timeout: object, key: object = None) -> None:
    """Raise TypeError/ValueError naming the bad argument."""
    if (
        type(url) is str
        and type(permits) is int
        and 1 <= permits <= MAX_PERMITS
        and (timeout is None or (type(timeout) in (float, int) and 0 <= timeout <= _MAX_TIMEOUT))  # type: ignore[operator]
        and (key is None or type(key) is str)
    ):
        return  # the common case, in a few type checks; the rest explains what is wrong
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string or None, got {type(key).__name__}")
    if not isinstance(url, str):
        raise TypeError(f"url must be a string, got {type(url).__name__}")
    if not isinstance(permits, int) or isinstance(permits, bool):
        raise TypeError(f"permits must be an int, got {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {_shown(permits)}")
    if permits > MAX_PERMITS:
        raise ValueError(f"permits must be at most {MAX_PERMITS}, got {_shown(permits)}")
    if timeout is not None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
        # NaN, infinity and ints too large for a float all fail this comparison.
        if not 0 <= timeout <= _MAX_TIMEOUT:
            raise ValueError(
                f"timeout must be a finite number of seconds >= 0, got {_shown(timeout)}"
            )


def route(snapshot: Snapshot, url: str) -> Rule | None:
    """The rule that limits ``url`` now, or None when the call is not limited."""
    if not snapshot.switch:
        return None
    return snapshot.rules.get(url)


#: What a reservation comes to: the verdict to honour, its reason, and the rule (None:
#: not limited). Built once per decision; the unlimited ones are built here, once.
Outcome = tuple[Verdict, str, Rule | None]
_UNLIMITED: Final[dict[str, Outcome]] = {
    reason: (ADMIT, reason, None) for reason in (SWITCH_OFF, NOT_CONFIGURED, DISABLED)
}


def waited_seconds(verdict: Verdict, rule: Rule, permits: int) -> float:
    """The seconds an ``acquire`` must wait for ``verdict`` (decided with no timeout).

    Raises ValueError when no wait can ever do: ``permits`` more than a window of the
    interface holds.
    """
    if not verdict.allowed:
        most = min((r.rate for r in rule.limits if r.algorithm in WINDOWS), default=0)
        raise ValueError(
            f"permits must be at most {most} for {rule.url!r} (what its window holds), "
            f"got {permits}"
        )
    return verdict.wait / MICROS


class Breaker:
    """Keeps calls off a failing backend for ``seconds``, then lets one caller probe.

    Closed (healthy) costs one attribute read per call; a lock is taken only while
    the backend is failing. Each outage is logged once, and a backend that comes and
    goes at most once per ``OUTAGE_REPORT_SECONDS`` (with a count of the others).
    """

    __slots__ = ("_lock", "_open_until", "_outages", "_reported", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._open_until = 0.0
        self._lock = threading.Lock()
        self._outages = Throttle(OUTAGE_REPORT_SECONDS)
        self._reported = False

    @property
    def is_open(self) -> bool:
        """True while calls go to the failure policy instead of the backend."""
        return self._open_until != 0.0

    def allows(self) -> bool:
        """Should this call try the backend? (True for exactly one prober per window.)"""
        if self._open_until == 0.0:
            return True
        now = time.monotonic()
        with self._lock:
            if now < self._open_until:
                return False
            self._open_until = now + self._seconds  # this caller probes; others wait
            return True

    def failed(self, error: BaseException) -> None:
        """The backend failed: open (log once per outage)."""
        with self._lock:
            if self._open_until == 0.0:
                held = self._outages.ready("backend")
                self._reported = held is not None
                if held is not None:
                    log.error(
                        "Redis unreachable (%s); deciding by on_backend_error%s",
                        one_line(str(error)),
                        held_back(held),
                    )
            self._open_until = time.monotonic() + self._seconds

    def succeeded(self) -> None:
        """The backend answered: close (log once)."""
        if self._open_until != 0.0:
            with self._lock:
                if self._open_until != 0.0:
                    self._open_until = 0.0
                    if self._reported:
                        log.warning("Redis reachable again; back to shared limits")


class Policy:
    """What a decision is when the backend cannot be asked (``on_backend_error``)."""

    __slots__ = ("local", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.local = MemoryBackend() if name == "local" else None

    def decide(
        self, rule: Rule, permits: int, timeout: float | None, key: str | None = None
    ) -> Verdict:
        """``local``: the model in this process (the same rules: every limit, per caller
        too); ``allow``/``deny``: at once."""
        if self.local is not None:
            return self.local.reserve(rule, permits, timeout, key)
        if self.name == "allow":
            return ADMIT
        if timeout is None:
            raise BackendUnavailable("Redis is unreachable and on_backend_error is 'deny'")
        return REFUSE


class Outcomes:
    """How a decision ends, the same for the sync and asyncio limiters: a shadow rule
    lets the call go whatever the bucket said, and the metrics count every decision.

    With metrics off and no shadow rule, the decision path never calls in here for a
    limited interface (the limiters check ``rule.shadow`` and ``metrics`` first).
    """

    __slots__ = ("_shadow_log", "metrics")

    def __init__(self, metrics: ProcessMetrics | None) -> None:
        self.metrics = metrics
        self._shadow_log = Throttle(SHADOW_REPORT_SECONDS)

    def unlimited(self, snapshot: Snapshot, url: str) -> Outcome:
        """A call no rule limits: admitted at once; why, and counted."""
        if not snapshot.switch:
            reason = SWITCH_OFF
        elif url in snapshot.disabled:
            reason = DISABLED
        else:
            reason = NOT_CONFIGURED
        if self.metrics is not None:
            self.metrics.record(interface_label(snapshot, url), reason, True, None)
        return _UNLIMITED[reason]

    def settle(self, rule: Rule, verdict: Verdict, reason: str) -> Outcome:
        """The bucket (or the failure policy) decided: apply shadow mode, count it."""
        if not rule.shadow:
            if self.metrics is not None:
                wait = verdict.wait if verdict.allowed else None
                self.metrics.record(rule.url, reason, verdict.allowed, wait)
            return verdict, reason, rule
        # Shadow: counted as the limit decided (a wait it would impose is observed),
        # but the call goes ahead at once.
        if verdict.allowed:
            if self.metrics is not None:
                self.metrics.record(rule.url, reason, True, verdict.wait)
            if verdict.wait > 0:
                verdict = Verdict(True, 0.0, verdict.stored)
            return verdict, reason, rule
        if self.metrics is not None:
            self.metrics.record(rule.url, SHADOW, True, None)
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
        return (ADMIT if verdict is REFUSE else Verdict(True, 0.0, verdict.stored)), SHADOW, rule


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """One rule and its bucket's live state (for ``status``)."""

    rule: Rule
    stored: float | None  # None: no state stored (a full bucket)
    debt_ms: float
    shared: bool
    error: str | None = None
    #: Milliseconds until one permit would be granted (0: now); None: unknown (a closed
    #: or sliding_window rule, or the state could not be read).
    next_free_ms: float | None = None


def settings_from(settings: Settings | str | Path | None, overrides: dict[str, Any]) -> Settings:
    """Settings from an object, a file path, or the usual lookup, plus keyword overrides."""
    if isinstance(settings, Settings):
        return settings.replace(**overrides) if overrides else settings
    return load_settings(settings, **overrides)


def chosen_limits(registry: Registry, url: str | None) -> list[Rule]:
    """The limits ``status`` shows: every limit of ``url``, or of every URL, in order,
    each on its own with its interface's wait budget (the one that applies)."""
    rules = registry.snapshot.rules
    urls = sorted(rules) if url is None else [url] if url in rules else []
    return [
        replace(limit, cache=rules[u].cache, also=()) for u in urls for limit in rules[u].limits
    ]


def bucket_status(rule: Rule, state: BucketState | None, now: float, shared: bool) -> BucketStatus:
    """A limit's bucket as ``status`` shows it, from its peeked state at ``now`` (µs)."""
    next_free = None
    if not rule.closed and has_shared_bucket(rule):
        # What one permit would wait now: the model's own answer, nothing written.
        verdict, _ = decide(state, rule.per_second, rule.burst, 1, None, now, rule.warmup * MICROS)
        next_free = verdict.wait / 1000.0
    if state is None:
        return BucketStatus(rule, None, 0.0, shared, next_free_ms=next_free)
    current = resync(state, now)
    debt = max(0.0, current.balance - now) / 1000.0
    return BucketStatus(rule, current.stored, debt, shared, next_free_ms=next_free)


def describe_state(rule: Rule, backend: Backend) -> BucketStatus:
    """A limit's shared bucket as ``status`` shows it, brought up to the backend's clock.

    Windows and per-caller limits have no single bucket to show: no state is read.
    """
    if not has_shared_bucket(rule):
        return BucketStatus(rule, None, 0.0, backend.shared)
    try:
        state, now = backend.peek(rule)
    except BackendError as e:
        return BucketStatus(rule, None, 0.0, backend.shared, str(e))
    return bucket_status(rule, state, now, backend.shared)


def has_shared_bucket(rule: Rule) -> bool:
    """True when ``rule``'s limit is one bucket for all callers, whose state peek reads."""
    return rule.algorithm not in WINDOWS and not rule.per_caller


def horizons_for(shared: bool, registry: Registry) -> Horizons | None:
    """Local refusals for a shared backend, forgotten when a reload changes the limits."""
    if not shared:
        return None  # memory:// decides in-process already
    horizons = Horizons()
    registry.listeners.append(horizons.reloaded)
    return horizons


def open_metrics(settings: Settings) -> ProcessMetrics | None:
    """The process's metrics if the settings ask for them and prometheus-client is there."""
    return process_metrics() if settings.metrics else None


class LimiterCore:
    """What the sync and asyncio limiters share: everything but the I/O.

    Settings, the registry of rules, the failure policy and its breaker, the metrics,
    and what replies taught about when each interface is next free. A subclass opens
    its backend (sync or asyncio) and then calls ``__init__`` with whether that
    backend's state is shared.
    """

    __slots__ = (
        "_breaker",
        "_fallbacks",
        "_horizons",
        "_metrics",
        "_outcomes",
        "_source",
        "_started",
        "policy",
        "registry",
        "settings",
    )

    def __init__(self, settings: Settings, shared: bool) -> None:
        self.settings = settings
        self.registry = Registry(settings)  # no I/O until the first reload
        self.policy = Policy(settings.on_backend_error)
        self._breaker = Breaker(settings.breaker_seconds)
        self._started = False
        self._fallbacks = 0
        self._metrics = open_metrics(settings)
        self._outcomes = Outcomes(self._metrics)
        self._source: Source | None = None
        if self._metrics is not None:
            self.registry.listeners.append(self._metrics.reloaded)
            self._source = Source(lambda: self.registry.snapshot, lambda: self._breaker.is_open)
        self._horizons = horizons_for(shared, self.registry)

    @property
    def backend_healthy(self) -> bool:
        """False while the failure policy is deciding instead of the backend."""
        return not self._breaker.is_open

    @property
    def backend_fallbacks(self) -> int:
        """How many decisions the failure policy made instead of the backend."""
        return self._fallbacks

    @property
    def local_refusals(self) -> int:
        """How many calls were refused in-process, without a round trip, because the
        interface was not free within their timeout (see ``gateway_limiter.horizons``)."""
        return 0 if self._horizons is None else self._horizons.refused

    def _refused_here(
        self, rule: Rule, key: str | None, timeout: float | None
    ) -> tuple[tuple[float, int] | None, Verdict | None]:
        """When the request leaves (monotonic s, with the horizons' generation; None
        without horizons), or a refusal in-process when an earlier reply said the
        interface is not free within ``timeout`` (None: ask the backend)."""
        horizons = self._horizons
        if horizons is None:
            return None, None
        now = time.monotonic()
        if timeout is not None and not self._breaker.is_open:
            refused = horizons.refusal(rule, key, timeout, now)
            if refused is not None:
                if self._metrics is not None:
                    self._metrics.local_refusal()
                return None, refused
        return (now, horizons.generation), None

    def _answered(
        self, rule: Rule, key: str | None, asked: tuple[float, int] | None, verdict: Verdict
    ) -> tuple[Verdict, str]:
        """The backend decided: close the breaker, learn when the interface is next free."""
        self._breaker.succeeded()
        if asked is not None and self._horizons is not None and verdict.next_free > 0.0:
            self._horizons.learn(rule, key, asked, verdict.next_free)
        return verdict, ADMITTED if verdict.allowed else LIMITED

    def _fall_back(
        self, rule: Rule, permits: int, timeout: float | None, key: str | None
    ) -> tuple[Verdict, str]:
        """The backend could not be asked: the failure policy decides."""
        self._fallbacks += 1  # off the hot path: only while the backend is failing
        if self._metrics is not None:
            self._metrics.fallback()
        return self.policy.decide(rule, permits, timeout, key), BACKEND_FALLBACK

    def _backend_failed(self, error: BackendError) -> None:
        self._breaker.failed(error)
        if self._horizons is not None:
            self._horizons.forget()  # the failure policy decides now; Redis may lose state
        if self._metrics is not None:
            self._metrics.backend_error()


class GatewayLimiter(LimiterCore):
    """Fleet-wide rate limits for one gateway process.

    >>> with GatewayLimiter(database_url="sqlite:///limits.db") as limiter:  # doctest: +SKIP
    ...     if limiter.try_acquire("/ibe/flight/search"):
    ...         call_supplier()

    Keywords are settings (DESIGN.md section 4) and override the file and environment.
    """

    def __init__(self, settings: Settings | str | Path | None = None, **overrides: Any) -> None:
        chosen = settings_from(settings, overrides)
        self.backend: Backend = open_backend(chosen)
        super().__init__(chosen, self.backend.shared)

    @classmethod
    def from_settings(cls, path: str | Path | None = None, **overrides: Any) -> Self:
        """A limiter from a settings file (None: $GATEWAY_LIMITER_SETTINGS, ./settings.toml)."""
        return cls(load_settings(path, **overrides))

    def start(self) -> ReloadSummary:
        """Load the limits now, then reload every ``reload_interval`` seconds."""
        if not self.backend.shared:
            log.warning(
                "redis_url is memory://: limits hold in this process only "
                "(N processes admit N x the rate)"
            )
        try:
            self.backend.prepare()
        except BackendError as e:
            self._backend_failed(e)  # start anyway: the failure policy decides meanwhile
        summary = self.registry.start()
        self._started = True
        if self._metrics is not None and self._source is not None:
            self._metrics.attach(self._source)
        return summary

    def reload(self) -> ReloadSummary:
        """Reload the limits now; the last good limits stay if the database fails."""
        return self.registry.reload()

    def close(self) -> None:
        """Stop reloading and close connections. Decisions after this raise NotStarted."""
        self._started = False
        if self._metrics is not None and self._source is not None:
            self._metrics.detach(self._source)
        self.registry.close()
        self.backend.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def reserve(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Verdict:
        """Decide without sleeping: the verdict, whose ``wait`` (µs) the caller must honour.

        ``timeout=None`` here means the row's ``cache``; ``key`` is the caller, for
        per-caller limits. A shadow rule's verdict is always allowed, with no wait.
        """
        return self._reserve(url, permits, timeout, key)[0]

    def _reserve(self, url: str, permits: int, timeout: float | None, key: str | None) -> Outcome:
        check_args(url, permits, timeout, key)
        if not self._started:
            raise NotStarted("call start() (or use 'with GatewayLimiter(...)') first")
        snapshot = self.registry.snapshot
        rule = route(snapshot, url)
        if rule is None:
            return self._outcomes.unlimited(snapshot, url)
        if rule.closed:
            verdict, reason = REFUSE, CLOSED
        else:
            budget = rule.cache if timeout is None else timeout
            verdict, reason = self._decide(rule, permits, budget, key)
        if rule.shadow or self._metrics is not None:
            return self._outcomes.settle(rule, verdict, reason)
        return verdict, reason, rule

    def _decide(
        self, rule: Rule, permits: int, timeout: float | None, key: str | None
    ) -> tuple[Verdict, str]:
        asked, refused = self._refused_here(rule, key, timeout)
        if refused is not None:  # Redis would refuse too: no round trip
            return refused, LIMITED
        if self._breaker.allows():
            try:
                verdict = self.backend.reserve(rule, permits, timeout, key)
            except BackendError as e:
                self._backend_failed(e)
            else:
                return self._answered(rule, key, asked, verdict)
        return self._fall_back(rule, permits, timeout, key)

    def try_acquire(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> bool:
        """Take ``permits`` for ``url`` if the wait fits in ``timeout`` (default: the row's
        ``cache``): wait, then True. Otherwise False at once, with nothing reserved.

        ``key`` names the caller (an IP, a channel): rows with ``perCaller = 1`` give
        each key its own limits; other rows ignore it. Always ``decide(...).allowed``,
        without building the Decision.
        """
        verdict = self._reserve(url, permits, timeout, key)[0]
        if verdict.allowed and verdict.wait > 0:
            time.sleep(verdict.wait / MICROS)
        return verdict.allowed

    def decide(
        self, url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
    ) -> Decision:
        """``try_acquire``, answering with the whole Decision: allowed or not, why, the
        seconds waited, when to retry, permits left and the limit (see ``Decision``;
        ``Decision.headers()`` gives the HTTP headers)."""
        verdict, reason, rule = self._reserve(url, permits, timeout, key)
        if verdict.allowed and verdict.wait > 0:
            time.sleep(verdict.wait / MICROS)
        if rule is None:
            return decision_of(verdict, reason, None, 0.0, 0.0)
        budget = rule.cache if timeout is None else timeout
        return decision_of(verdict, reason, rule, budget, self.settings.breaker_seconds)

    def acquire(self, url: str, permits: int = 1, key: str | None = None) -> float:
        """Take ``permits`` for ``url`` however long it takes; returns the seconds waited.

        Raises InterfaceClosed for a closed interface (it would never return), and
        ValueError for more permits than a window of the interface can ever hold. A
        shadow rule returns 0.0 at once (its wait and refusals are only counted).
        """
        check_args(url, permits, None, key)
        if not self._started:
            raise NotStarted("call start() (or use 'with GatewayLimiter(...)') first")
        snapshot = self.registry.snapshot
        rule = route(snapshot, url)
        if rule is None:
            self._outcomes.unlimited(snapshot, url)
            return 0.0
        if rule.closed:
            verdict, reason = REFUSE, CLOSED
        else:
            try:
                verdict, reason = self._decide(rule, permits, None, key)
            except BackendUnavailable:
                if not rule.shadow:
                    raise
                verdict, reason = REFUSE, BACKEND_FALLBACK  # a shadow rule never stops a call
        verdict, reason, _ = self._outcomes.settle(rule, verdict, reason)
        if reason == CLOSED:
            raise InterfaceClosed(f"interface {url!r} is closed (rateLimit 0)")
        seconds = waited_seconds(verdict, rule, permits)  # ValueError: more than a window
        if seconds > 0:
            time.sleep(seconds)
        return seconds

    def status(self, url: str | None = None) -> list[BucketStatus]:
        """Every limit in force (or ``url``'s) with its live state (shared buckets)."""
        return [describe_state(rule, self.backend) for rule in chosen_limits(self.registry, url)]
