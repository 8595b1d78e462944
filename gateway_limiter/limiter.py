"""``GatewayLimiter``: the facade every gateway process calls before an upstream call.

A call goes: arguments checked -> snapshot read (no lock) -> switch off, no rule, or a
disabled row: admitted at once, no Redis traffic -> a closed rule (rateLimit 0):
refused at once -> otherwise one backend decision, then the wait, outside any lock.

When the backend fails, ``on_backend_error`` decides (``local``: the same rules in this
process; ``allow``; ``deny``), and a circuit breaker keeps every following call off
Redis for ``breaker_seconds``, after which one caller probes and the rest follow it back.
The pieces below (argument checks, routing, breaker, policy) are shared with
``gateway_limiter.aio``; only the I/O differs there.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .backends import Backend, BackendError, open_backend
from .backends.memory import MemoryBackend
from .bucket import MICROS, Verdict, resync
from .registry import Registry, ReloadSummary, Snapshot
from .rules import SLIDING_WINDOW, Rule
from .settings import Settings, load_settings, mask_secrets

log = logging.getLogger("gateway_limiter")


class LimiterError(Exception):
    """Base class of the limiter's own errors."""


class InterfaceClosed(LimiterError):
    """``acquire`` on an interface whose row has ``rateLimit = 0``: it would wait forever."""


class BackendUnavailable(LimiterError):
    """``acquire`` while Redis is unreachable and ``on_backend_error = deny``."""


class NotStarted(LimiterError, RuntimeError):
    """A decision was asked of a limiter that was never started (or already closed)."""


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


def check_args(url: object, permits: object, timeout: object) -> None:
    """Raise TypeError/ValueError naming the bad argument."""
    if (
        type(url) is str
        and type(permits) is int
        and 1 <= permits <= MAX_PERMITS
        and (timeout is None or (type(timeout) in (float, int) and 0 <= timeout <= _MAX_TIMEOUT))  # type: ignore[operator]
    ):
        return  # the common case, in a few type checks; the rest explains what is wrong
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


def check_grantable(rule: Rule, permits: int) -> None:
    """ValueError when ``rule`` can never grant ``permits`` at once (``acquire`` would
    wait forever): a sliding window admits at most ``rate`` in any second."""
    if rule.algorithm == SLIDING_WINDOW and permits > rule.rate:
        raise ValueError(
            f"permits must be at most {rule.rate} on {rule.url!r}: its sliding_window admits "
            f"at most {rule.rate} in any 1 s, so {permits} would never be granted"
        )


def route(snapshot: Snapshot, url: str) -> Rule | None:
    """The rule that limits ``url`` now, or None when the call is not limited."""
    if not snapshot.switch:
        return None
    return snapshot.rules.get(url)


ADMIT = Verdict(True, 0.0, 0.0)
REFUSE = Verdict(False, 0.0, 0.0)


class Breaker:
    """Keeps calls off a failing backend for ``seconds``, then lets one caller probe.

    Closed (healthy) costs one attribute read per call; a lock is taken only while
    the backend is failing.
    """

    __slots__ = ("_lock", "_open_until", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._open_until = 0.0
        self._lock = threading.Lock()

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
                log.error(
                    "Redis unreachable (%s); deciding by on_backend_error", mask_secrets(str(error))
                )
            self._open_until = time.monotonic() + self._seconds

    def succeeded(self) -> None:
        """The backend answered: close (log once)."""
        if self._open_until != 0.0:
            with self._lock:
                if self._open_until != 0.0:
                    self._open_until = 0.0
                    log.warning("Redis reachable again; back to shared limits")


class Policy:
    """What a decision is when the backend cannot be asked (``on_backend_error``)."""

    __slots__ = ("local", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.local = MemoryBackend() if name == "local" else None

    def decide(self, rule: Rule, permits: int, timeout: float | None) -> Verdict:
        """``local``: the model in this process; ``allow``/``deny``: at once."""
        if self.local is not None:
            return self.local.reserve(rule, permits, timeout)
        if self.name == "allow":
            return ADMIT
        if timeout is None:
            raise BackendUnavailable("Redis is unreachable and on_backend_error is 'deny'")
        return REFUSE


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """One rule and its bucket's live state (for ``status``)."""

    rule: Rule
    stored: float | None  # None: no state stored (a full bucket)
    debt_ms: float
    shared: bool
    error: str | None = None


def settings_from(settings: Settings | str | Path | None, overrides: dict[str, Any]) -> Settings:
    """Settings from an object, a file path, or the usual lookup, plus keyword overrides."""
    if isinstance(settings, Settings):
        return settings.replace(**overrides) if overrides else settings
    return load_settings(settings, **overrides)


def describe_state(rule: Rule, backend: Backend) -> BucketStatus:
    """A rule's bucket as ``status`` shows it, brought up to the backend's clock."""
    try:
        state, now = backend.peek(rule)
    except BackendError as e:
        return BucketStatus(rule, None, 0.0, backend.shared, str(e))
    if state is None:
        return BucketStatus(rule, None, 0.0, backend.shared)
    current = resync(state, now)
    return BucketStatus(
        rule, current.stored, max(0.0, current.balance - now) / 1000.0, backend.shared
    )


class GatewayLimiter:
    """Fleet-wide rate limits for one gateway process.

    >>> with GatewayLimiter(database_url="sqlite:///limits.db") as limiter:  # doctest: +SKIP
    ...     if limiter.try_acquire("/ibe/flight/search"):
    ...         call_supplier()

    Keywords are settings (DESIGN.md section 4) and override the file and environment.
    """

    def __init__(self, settings: Settings | str | Path | None = None, **overrides: Any) -> None:
        self.settings = settings_from(settings, overrides)
        self.registry = Registry(self.settings)
        self.backend: Backend = open_backend(self.settings)
        self.policy = Policy(self.settings.on_backend_error)
        self._breaker = Breaker(self.settings.breaker_seconds)
        self._started = False
        self._fallbacks = 0

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
            self._breaker.failed(e)  # start anyway: the failure policy decides meanwhile
        summary = self.registry.start()
        self._started = True
        return summary

    def reload(self) -> ReloadSummary:
        """Reload the limits now; the last good limits stay if the database fails."""
        return self.registry.reload()

    def close(self) -> None:
        """Stop reloading and close connections. Decisions after this raise NotStarted."""
        self._started = False
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

    @property
    def backend_healthy(self) -> bool:
        """False while the failure policy is deciding instead of the backend."""
        return not self._breaker.is_open

    @property
    def backend_fallbacks(self) -> int:
        """How many decisions the failure policy made instead of the backend."""
        return self._fallbacks

    def reserve(self, url: str, permits: int = 1, timeout: float | None = None) -> Verdict:
        """Decide without sleeping: the verdict, whose ``wait`` (µs) the caller must honour.

        ``timeout=None`` here means the row's ``cache``.
        """
        check_args(url, permits, timeout)
        if not self._started:
            raise NotStarted("call start() (or use 'with GatewayLimiter(...)') first")
        rule = route(self.registry.snapshot, url)
        if rule is None:
            return ADMIT
        if rule.closed:
            return REFUSE
        return self._decide(rule, permits, rule.cache if timeout is None else timeout)

    def _decide(self, rule: Rule, permits: int, timeout: float | None) -> Verdict:
        if self._breaker.allows():
            try:
                verdict = self.backend.reserve(rule, permits, timeout)
            except BackendError as e:
                self._breaker.failed(e)
            else:
                self._breaker.succeeded()
                return verdict
        self._fallbacks += 1  # off the hot path: only while the backend is failing
        return self.policy.decide(rule, permits, timeout)

    def try_acquire(self, url: str, permits: int = 1, timeout: float | None = None) -> bool:
        """Take ``permits`` for ``url`` if the wait fits in ``timeout`` (default: the row's
        ``cache``): wait, then True. Otherwise False at once, with nothing reserved."""
        verdict = self.reserve(url, permits, timeout)
        if verdict.allowed and verdict.wait > 0:
            time.sleep(verdict.wait / MICROS)
        return verdict.allowed

    def acquire(self, url: str, permits: int = 1) -> float:
        """Take ``permits`` for ``url`` however long it takes; returns the seconds waited.

        Raises InterfaceClosed for a closed interface (it would never return).
        """
        check_args(url, permits, None)
        if not self._started:
            raise NotStarted("call start() (or use 'with GatewayLimiter(...)') first")
        rule = route(self.registry.snapshot, url)
        if rule is None:
            return 0.0
        if rule.closed:
            raise InterfaceClosed(f"interface {url!r} is closed (rateLimit 0)")
        check_grantable(rule, permits)
        verdict = self._decide(rule, permits, None)
        seconds = verdict.wait / MICROS
        if seconds > 0:
            time.sleep(seconds)
        return seconds

    def status(self, url: str | None = None) -> list[BucketStatus]:
        """The rules in force (or ``url``'s) with each bucket's live state."""
        rules = self.registry.snapshot.rules
        chosen = (
            [rules[url]]
            if url is not None and url in rules
            else ([] if url is not None else [rules[u] for u in sorted(rules)])
        )
        return [describe_state(rule, self.backend) for rule in chosen]
