"""gateway-limiter: keep a fleet of gateway processes within each supplier's call rate.

The functions here use one process-wide limiter built from the settings; build a
``GatewayLimiter`` for anything else. Names are imported on first use (PEP 562), so
``import gateway_limiter`` alone loads neither SQLAlchemy nor redis.
"""

from __future__ import annotations

import atexit
import importlib
import threading
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
    from gateway_limiter.limiter import (
        GatewayLimiter,
        acquire,
        decide,
        pushback,
        slot,
        try_acquire,
    )
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
    # on the process-wide limiter (default_limiter below): written once, in aio.py, and
    # generated into limiter.py (scripts/generate_sync.py)
    "acquire": "gateway_limiter.limiter",
    "decide": "gateway_limiter.limiter",
    "pushback": "gateway_limiter.limiter",
    "slot": "gateway_limiter.limiter",
    "try_acquire": "gateway_limiter.limiter",
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
