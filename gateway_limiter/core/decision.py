"""What one decision was, and why: ``Decision``, its ``Reason``, and its HTTP headers.

``GatewayLimiter.decide`` returns a ``Decision``; ``decide(...).allowed`` is always
what ``try_acquire(...)`` would have returned.
"""

from __future__ import annotations

import math
import time
from enum import StrEnum
from typing import Final, NamedTuple

from gateway_limiter.config.rules import Rule
from gateway_limiter.model.algorithms import LimitKind
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.model.pushback import effective_rate


class Reason(StrEnum):
    """Why a decision went as it did: every decision has exactly one reason.

    The values are what ``Decision.reason``, the logs and the metrics' ``reason`` label
    say.

    Attributes:
        ADMITTED: allowed: the bucket had room within the wait budget (``waited`` s).
        LIMITED: refused: the wait would exceed the budget; nothing was reserved.
        RESERVED: refused: the call's class must leave a reserve for the classes above it.
        CLOSED: refused: the row's ``rateLimit`` is 0.
        SHADOW: allowed: a shadow row would have refused.
        BACKEND_FALLBACK: either: Redis was unreachable and ``on_backend_error`` decided.
        SWITCH_OFF: allowed: the global switch is off, nothing is limited.
        NOT_CONFIGURED: allowed: no row for this URL (or only rows the reload skipped).
        DISABLED: allowed: the URL's rows all have ``status = 0``.
    """

    ADMITTED = "admitted"
    LIMITED = "limited"
    #: priority classes: the limits would admit the call, but its class must leave a
    #: reserve for the classes above it (``model/priority.py``)
    RESERVED = "reserved"
    CLOSED = "closed"
    SHADOW = "shadow"
    BACKEND_FALLBACK = "backend_fallback"
    SWITCH_OFF = "switch_off"
    NOT_CONFIGURED = "not_configured"
    DISABLED = "disabled"


#: The verdicts of calls decided without a bucket (unlimited, closed, allow/deny policy).
ADMIT: Final = Verdict(True, 0.0, 0.0)
REFUSE: Final = Verdict(False, 0.0, 0.0)


class Decision(NamedTuple):
    """One decision: whether the call may go ahead, and what a caller may tell its client.

    Returned by ``decide`` (and given to ``with limiter.slot(url) as decision``); an
    immutable named tuple.

    Attributes:
        allowed: whether the call may go ahead.
        reason: why (a ``Reason``).
        waited: seconds the call waited before going ahead (0 when refused); from
            ``slot()``, the seconds queued for the slot as well; for a class below
            ``critical`` on an interface with a reserve, the seconds it slept between
            re-checks (on the limiter's clock) until its class could go.
        retry_after: when refused, the seconds after which the same call would fit its
            wait budget if nobody else took permits meanwhile; None when allowed, or
            when waiting cannot help (a closed interface).
        remaining: whole permits left after this call by the limit that binds (a
            bucket's stored permits; a window's count less what it holds); 0 while a
            pushback's ``retry_after`` holds the interface; None when not limited.
        limit: the binding row's ``rateLimit``; None when the call is not limited.
        shadow: the rule is in shadow mode: decided and counted, never enforced.
        effective_rate: the rate after the supplier's pushbacks, in the row's units;
            the ``limit`` unless a pushback lowered it; None when not limited.
        in_flight: from ``slot()`` on a row with ``maxConcurrent``: the calls in flight
            across the fleet, this one included; else None.
        reset_at: when a calendar quota binds, when it renews (Unix epoch seconds on the
            Redis clock); ``limit`` and ``remaining`` are then the quota's, and a
            refusal by the spent quota has ``retry_after`` = the seconds to it. A
            refusal by a paced quota's pace (the other limits had room) reports the
            quota too: ``retry_after`` is then until its next paced permit.
        priority: on a limited interface, the class the call was decided in: its
            ``priority=``, else its row's ``priority``, else ``default``.

    Example:
        ```python
        decision = limiter.decide("/ibe/flight/search", key=client_ip)
        status = 200 if decision.allowed else 429
        return status, decision.headers()   # Retry-After, X-RateLimit-*
        ```
    """

    allowed: bool
    #: A ``Reason`` (a str) when a limiter made it; typed ``str`` so that a Decision
    #: built by hand, in a caller's test say, may write ``"admitted"``.
    reason: str
    waited: float = 0.0
    retry_after: float | None = None
    remaining: int | None = None
    limit: int | None = None
    shadow: bool = False
    effective_rate: float | None = None
    in_flight: int | None = None
    reset_at: float | None = None
    #: The call's class (``gateway_limiter.Priority``) on a limited interface: the
    #: call's ``priority=``, else its row's ``priority``, else ``default``.
    priority: str | None = None

    def headers(self) -> dict[str, str]:
        """The rate-limit headers an HTTP answer to this call should carry.

        Empty when the call is not limited, and for a shadow rule: a limit on trial
        must not change what clients see.

        Returns:
            ``X-RateLimit-Limit`` and ``X-RateLimit-Remaining``; ``Retry-After`` (whole
            seconds, at least 1) when refused; ``X-RateLimit-Effective-Rate`` while a
            pushback holds the rate below the limit; and, when a calendar quota binds,
            ``X-RateLimit-Reset`` with the IETF ``RateLimit-Policy`` and ``RateLimit``.

        Example:
            ```python
            >>> Decision(False, "limited", retry_after=0.4, remaining=0, limit=20).headers()
            {'X-RateLimit-Limit': '20', 'X-RateLimit-Remaining': '0', 'Retry-After': '1'}
            ```
        """
        if self.limit is None or self.shadow:
            return {}
        headers = {"X-RateLimit-Limit": str(self.limit)}
        if self.remaining is not None:
            headers["X-RateLimit-Remaining"] = str(self.remaining)
        if self.effective_rate is not None and self.effective_rate < self.limit:
            headers["X-RateLimit-Effective-Rate"] = f"{self.effective_rate:.6g}"
        if not self.allowed and self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        if self.reset_at is not None:
            headers["X-RateLimit-Reset"] = str(math.ceil(self.reset_at))
            # draft-ietf-httpapi-ratelimit-headers: the quota's policy and what is left
            # of it, t seconds before it renews
            seconds = max(0, math.ceil(self.reset_at - time.time()))
            left = self.remaining if self.remaining is not None else 0
            headers["RateLimit-Policy"] = f'"quota";q={self.limit}'
            headers["RateLimit"] = f'"quota";r={left};t={seconds}'
        return headers


def decision_of(
    verdict: Verdict,
    reason: Reason,
    rule: Rule | None,
    budget_s: float,
    fallback_retry_s: float,
    permits: int = 1,
    priority: str | None = None,
) -> Decision:
    """The Decision of a verdict already honoured (any wait slept).

    ``budget_s``: the wait budget the call had. ``fallback_retry_s``: what
    ``retry_after`` is when the ``deny`` policy refused (the breaker's next probe).
    ``permits``: what the call asked (a quota with fewer left refused it).
    """
    if rule is None:
        return Decision(verdict.allowed, reason)
    if verdict.allowed:
        waited, retry_after = (verdict.wait_us + verdict.slept_us) / US_PER_S, None
    else:
        waited = 0.0
        if reason == Reason.CLOSED or math.isinf(verdict.wait_us):
            retry_after = None
        elif verdict is REFUSE:
            retry_after = fallback_retry_s
        else:
            retry_after = max(0.0, verdict.wait_us / US_PER_S - budget_s)
    if rule.closed:
        remaining: int | None = 0
    elif verdict is ADMIT or verdict is REFUSE:
        remaining = None
    elif verdict.held_us > 0.0:  # a pushback's hold: nothing goes before it ends
        remaining = 0
    else:
        remaining = int(verdict.stored)
    limit, rate = rule.rate, effective_rate(rule.rate, verdict.factor, rule.algorithm)
    reset_at = None
    if verdict.quota_left >= 0.0 and not rule.closed:
        left = int(verdict.quota_left)
        # refused for want of what is left, or for more than the quota ever gives one
        # call (its rate, a paced one's burst: no wait would do, and the scripts then
        # tell that quota's figures)
        spent = not verdict.allowed and (
            left < permits
            or (
                math.isinf(verdict.wait_us)
                and any(r.calendar is not None and permits > r.quota_most for r in rule.limits)
            )
        )
        # ``stored`` is what the interface's other limits have left (none: the quota's)
        others = any(r.kind is not LimitKind.CALENDAR for r in rule.limits)
        # refused with permits left in the quota and room in the other limits: a paced
        # quota's pace refused it (a limited refusal; a reserve's is the class's)
        paced = (
            reason == Reason.LIMITED
            and not verdict.allowed
            and not spent
            and remaining is not None
            and remaining >= permits
            and any(r.pacing for r in rule.limits)
        )
        if spent or paced or not others or remaining is None or left < remaining:  # it binds
            remaining, limit = left, int(verdict.quota_limit)
            rate, reset_at = float(limit), verdict.quota_reset_us / US_PER_S
            if spent and retry_after is not None:
                retry_after = verdict.wait_us / US_PER_S  # to the renewal, on its clock
    return Decision(
        verdict.allowed,
        reason,
        waited,
        retry_after,
        remaining,
        limit,
        rule.shadow,
        rate,
        None,
        reset_at,
        priority,
    )
