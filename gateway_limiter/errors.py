"""The limiter's own errors, raised by both ``GatewayLimiter`` and ``AsyncGatewayLimiter``.

A backend's failure is ``gateway_limiter.backends.base.BackendError``; the limiters
never let it out of a decision (the failure policy decides instead), except as
``BackendUnavailable`` when that policy is ``deny`` and the caller would wait forever.
"""

from __future__ import annotations


class LimiterError(Exception):
    """Base class of the limiter's own errors."""


class InterfaceClosed(LimiterError):
    """``acquire`` on an interface whose row has ``rateLimit = 0``: it would wait forever."""


class BackendUnavailable(LimiterError):
    """``acquire`` while Redis is unreachable and ``on_backend_error = deny``."""


class NotStarted(LimiterError, RuntimeError):
    """A decision was asked of a limiter that was never started (or already closed)."""
