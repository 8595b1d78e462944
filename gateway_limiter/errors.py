"""The limiter's own errors, raised by both ``GatewayLimiter`` and ``AsyncGatewayLimiter``.

A Redis failure never leaves a decision as an exception: the failure policy decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # errors.py sits below core/: the type only, for the annotation
    from gateway_limiter.core.decision import Decision


class LimiterError(Exception):
    """Base class of the limiter's own errors: catch it to catch them all.

    Bad arguments are not among them: they raise ``TypeError`` or ``ValueError``
    naming the argument.
    """


class InterfaceClosed(LimiterError):
    """``acquire`` on an interface whose row has ``rateLimit = 0``: it would wait forever.

    ``try_acquire`` and ``decide`` answer False (reason ``closed``) instead.

    Example:
        ```python
        try:
            limiter.acquire("/ibe/flight/search")
        except InterfaceClosed:
            ...  # the operators closed it: answer 503, serve from cache
        ```
    """


class BackendUnavailable(LimiterError):
    """``acquire`` while Redis is unreachable and the failure policy cannot grant.

    Raised under ``on_backend_error = "deny"``, and under ``"share"`` when this
    process's part of a window holds fewer permits than asked. ``try_acquire`` and
    ``decide`` answer instead (reason ``backend_fallback``).
    """


class Refused(LimiterError):
    """A call was refused where it cannot be answered with False.

    Raised by the HTTP integrations before the request leaves, and by ``slot()``.

    Args:
        decision: the refused decision: why (``.reason``), when to retry
            (``.retry_after``) and the headers to answer with (``.headers()``).
        message: the text of the error; default ``refused (<reason>)``.

    Example:
        ```python
        try:
            client.get("/ibe/flight/search")       # an httpx.Client with LimiterTransport
        except Refused as refused:
            print(refused.decision.reason, refused.decision.retry_after)
        ```
    """

    def __init__(self, decision: Decision, message: str | None = None) -> None:
        super().__init__(message or f"refused ({decision.reason})")
        #: the refused decision
        self.decision = decision


class NotStarted(LimiterError, RuntimeError):
    """A decision was asked of a limiter that was never started, or already closed.

    Start it with ``start()`` (``await start()``), or use it as a context manager.
    """
