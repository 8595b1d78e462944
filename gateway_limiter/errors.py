"""The limiter's own errors, raised by both ``GatewayLimiter`` and ``AsyncGatewayLimiter``.

A backend's failure is ``gateway_limiter.backends.base.BackendError``; the limiters
never let it out of a decision (the failure policy decides instead), except as
``BackendUnavailable`` when that policy is ``deny`` and the caller would wait forever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # errors.py sits below core/: the type only, for the annotation
    from gateway_limiter.core.decision import Decision


class LimiterError(Exception):
    """Base class of the limiter's own errors."""


class InterfaceClosed(LimiterError):
    """``acquire`` on an interface whose row has ``rateLimit = 0``: it would wait forever."""


class BackendUnavailable(LimiterError):
    """``acquire`` while Redis is unreachable and ``on_backend_error = deny``."""


class Refused(LimiterError):
    """A call was refused where it cannot be answered with False (an integration, a
    context manager): ``decision`` says why and when to retry (``Decision.retry_after``,
    ``Decision.headers()``)."""

    def __init__(self, decision: Decision, message: str | None = None) -> None:
        super().__init__(message or f"refused ({decision.reason})")
        #: the refused decision
        self.decision = decision


class NotStarted(LimiterError, RuntimeError):
    """A decision was asked of a limiter that was never started (or already closed)."""
