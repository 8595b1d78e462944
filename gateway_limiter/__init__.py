"""gateway-limiter: keep a fleet of gateway processes within each supplier's call rate.

The functions here use one process-wide limiter built from the settings; build a
``GatewayLimiter`` for anything else. Names are imported on first use (PEP 562), so
``import gateway_limiter`` alone loads neither SQLAlchemy nor redis.
"""

from __future__ import annotations

import atexit
import importlib
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway_limiter.config.reload import ReloadSummary
    from gateway_limiter.config.rules import Rule
    from gateway_limiter.config.settings import Settings, SettingsError, load_settings
    from gateway_limiter.core.decision import Decision
    from gateway_limiter.core.status import BucketStatus
    from gateway_limiter.errors import (
        BackendUnavailable,
        InterfaceClosed,
        LimiterError,
        NotStarted,
        Refused,
    )
    from gateway_limiter.limiter import GatewayLimiter
    from gateway_limiter.model.priority import Priority

__all__ = [
    "BackendUnavailable",
    "BucketStatus",
    "Decision",
    "GatewayLimiter",
    "InterfaceClosed",
    "LimiterError",
    "NotStarted",
    "Priority",
    "Refused",
    "ReloadSummary",
    "Rule",
    "Settings",
    "SettingsError",
    "acquire",
    "decide",
    "default_limiter",
    "load_settings",
    "pushback",
    "slot",
    "try_acquire",
]

__version__ = "0.2.0"

#: Where each lazily imported public name lives (keep in step with the TYPE_CHECKING
#: imports above, which are what mypy sees).
_HOMES = {
    "BackendUnavailable": "gateway_limiter.errors",
    "BucketStatus": "gateway_limiter.core.status",
    "Decision": "gateway_limiter.core.decision",
    "GatewayLimiter": "gateway_limiter.limiter",
    "InterfaceClosed": "gateway_limiter.errors",
    "LimiterError": "gateway_limiter.errors",
    "NotStarted": "gateway_limiter.errors",
    "Priority": "gateway_limiter.model.priority",
    "Refused": "gateway_limiter.errors",
    "ReloadSummary": "gateway_limiter.config.reload",
    "Rule": "gateway_limiter.config.rules",
    "Settings": "gateway_limiter.config.settings",
    "SettingsError": "gateway_limiter.config.settings",
    "load_settings": "gateway_limiter.config.settings",
}


if not TYPE_CHECKING:  # mypy sees the imports above, and still flags a misspelt name

    def __getattr__(name: str) -> Any:
        """Import a public name from its home module on first use (PEP 562)."""
        home = _HOMES.get(name)
        if home is None:
            # AttributeError (not ImportError) lets ``from gateway_limiter import aio`` go
            # on to import the submodule, and hasattr() answer False.
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later look-ups skip this function
        return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *__all__})


_default: GatewayLimiter | None = None
_default_lock = threading.Lock()


def default_limiter() -> GatewayLimiter:
    """The process-wide limiter, built and started on first use (thread-safe).

    Built from ``$GATEWAY_LIMITER_SETTINGS``, else ``./settings.toml``, else the
    defaults, and closed when the process exits.

    Returns:
        The started ``GatewayLimiter`` the module-level functions use.
    """
    global _default  # noqa: PLW0603 - one limiter per process is the point
    limiter = _default
    if limiter is None:
        with _default_lock:
            limiter = _default
            if limiter is None:
                from gateway_limiter.limiter import GatewayLimiter

                limiter = GatewayLimiter()
                limiter.start()
                atexit.register(limiter.close)
                _default = limiter
    return limiter


def try_acquire(
    url: str,
    permits: int = 1,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> bool:
    """``GatewayLimiter.try_acquire`` on the process-wide limiter.

    Args:
        url: the interface (a row's ``interfaceUrl``).
        permits: permits this call takes.
        timeout: the most to wait, seconds; None: the row's ``cache``.
        key: the caller, for ``perCaller`` rows.
        priority: the call's class (``Priority`` or its text); None: the row's.

    Returns:
        True once the call may go ahead (after any wait); False at once otherwise.

    Example:
        ```python
        from gateway_limiter import try_acquire

        if try_acquire("/ibe/flight/search"):
            call_supplier()
        ```
    """
    return default_limiter().try_acquire(url, permits, timeout, key, priority)


def acquire(
    url: str, permits: int = 1, key: str | None = None, priority: Priority | str | None = None
) -> float:
    """``GatewayLimiter.acquire`` on the process-wide limiter: wait as long as it takes.

    Returns:
        The seconds waited.

    Raises:
        InterfaceClosed: the interface's ``rateLimit`` is 0.
        BackendUnavailable: Redis is away and the failure policy cannot grant.
    """
    return default_limiter().acquire(url, permits, key, priority)


def decide(
    url: str,
    permits: int = 1,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> Decision:
    """``GatewayLimiter.decide`` on the process-wide limiter.

    Returns:
        A ``Decision``: allowed or not, why, and the headers to answer with.
    """
    return default_limiter().decide(url, permits, timeout, key, priority)


def pushback(url: str, retry_after: float | None = None, key: str | None = None) -> None:
    """``GatewayLimiter.pushback`` on the process-wide limiter: the supplier answered
    429 or 503.

    Args:
        url: the interface.
        retry_after: the seconds of the supplier's ``Retry-After``; None: lower the
            interface's rate instead.
        key: the caller, for ``perCaller`` rows.
    """
    default_limiter().pushback(url, retry_after, key)


def slot(
    url: str,
    timeout: float | None = None,
    key: str | None = None,
    priority: Priority | str | None = None,
) -> AbstractContextManager[Decision]:
    """``GatewayLimiter.slot`` on the process-wide limiter.

    Example:
        ```python
        with gateway_limiter.slot("/ibe/flight/book"):
            call_supplier()
        ```
    """
    return default_limiter().slot(url, timeout, key, priority)
