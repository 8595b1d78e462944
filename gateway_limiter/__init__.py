"""gateway-limiter: keep a fleet of gateway processes within each supplier's call rate.

>>> from gateway_limiter import try_acquire
>>> if try_acquire("/ibe/flight/search"):  # doctest: +SKIP
...     call_supplier()

``try_acquire`` and ``acquire`` here use one process-wide limiter, built and started
on first use from settings ($GATEWAY_LIMITER_SETTINGS, else ./settings.toml, else the
defaults). Build a ``GatewayLimiter`` yourself for anything else.
"""

from __future__ import annotations

import atexit
import threading

from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings, SettingsError, load_settings
from gateway_limiter.core.decision import Decision
from gateway_limiter.limiter import (
    BackendUnavailable,
    BucketStatus,
    GatewayLimiter,
    InterfaceClosed,
    LimiterError,
    NotStarted,
)

__all__ = [
    "BackendUnavailable",
    "BucketStatus",
    "Decision",
    "GatewayLimiter",
    "InterfaceClosed",
    "LimiterError",
    "NotStarted",
    "ReloadSummary",
    "Rule",
    "Settings",
    "SettingsError",
    "acquire",
    "decide",
    "default_limiter",
    "load_settings",
    "try_acquire",
]

__version__ = "0.1.0"

_default: GatewayLimiter | None = None
_default_lock = threading.Lock()


def default_limiter() -> GatewayLimiter:
    """The process-wide limiter, built and started on first use (thread-safe)."""
    global _default  # noqa: PLW0603 - one limiter per process is the point
    limiter = _default
    if limiter is None:
        with _default_lock:
            limiter = _default
            if limiter is None:
                limiter = GatewayLimiter()
                limiter.start()
                atexit.register(limiter.close)
                _default = limiter
    return limiter


def try_acquire(
    url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
) -> bool:
    """``GatewayLimiter.try_acquire`` on the process-wide limiter."""
    return default_limiter().try_acquire(url, permits, timeout, key)


def acquire(url: str, permits: int = 1, key: str | None = None) -> float:
    """``GatewayLimiter.acquire`` on the process-wide limiter."""
    return default_limiter().acquire(url, permits, key)


def decide(
    url: str, permits: int = 1, timeout: float | None = None, key: str | None = None
) -> Decision:
    """``GatewayLimiter.decide`` on the process-wide limiter."""
    return default_limiter().decide(url, permits, timeout, key)
