"""What one decision was, and why: ``Decision``, its reasons, and its HTTP headers.

``try_acquire`` answers yes or no. A gateway that answers HTTP wants more: how long
the call waited, when a refused caller may try again, how many permits are left, and
why (so a refusal by a closed interface is not mistaken for one by a busy one).
``GatewayLimiter.decide`` returns a ``Decision`` with all of that;
``decide(...).allowed`` is always what ``try_acquire(...)`` would have returned.

Every decision has exactly one reason:

=================== ======= ===============================================================
reason              allowed when
=================== ======= ===============================================================
``admitted``        yes     the bucket had room, within the wait budget (``waited`` s)
``limited``         no      the wait would exceed the budget; nothing was reserved
``reserved``        no      the call's class must leave a reserve it would have taken
``closed``          no      the row's ``rateLimit`` is 0
``shadow``          yes     a shadow row would have refused (``limited`` or ``closed``)
``backend_fallback`` either  Redis was unreachable; ``on_backend_error`` decided
``switch_off``      yes     the global switch is off: nothing is limited
``not_configured``  yes     no row for this URL (or only rows the reload skipped)
``disabled``        yes     the URL's rows all have ``status = 0``
=================== ======= ===============================================================
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
    """Why a decision went as it did (the table above). The values are what logs, the
    metrics' ``reason`` label and ``Decision.reason`` have always said."""

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

    ``waited``: seconds the call waited before going ahead (0 when refused).
    ``retry_after``: when refused, seconds after which the same call would fit its wait
    budget if nobody else took permits meanwhile; None when allowed, or when waiting
    cannot help (a closed interface, more permits than the limit can ever give).
    ``remaining``: whole permits left after this call by the limit that binds (a
    bucket's stored permits; a window's count less what its window holds), 0 while a
    pushback's ``retry_after`` holds the interface; None when the call is not limited,
    or the failure policy ``allow``/``deny`` decided.
    ``limit``: the row's ``rateLimit`` (permits per second); None when not limited.
    ``shadow``: the rule is in shadow mode: decided and counted, never enforced.
    ``effective_rate``: the rate the interface runs at after the supplier's pushbacks
    (``limiter.pushback``), in the row's units (permits per ``periodSeconds``; windows
    in whole permits, as they enforce it): the ``limit`` unless a pushback without
    ``retry_after`` lowered it; None when not limited.

    ``in_flight``: the calls to the interface in flight across the fleet as ``slot()``
    saw it (this one included when it was admitted); None outside ``slot()``, or where
    the row has no ``maxConcurrent``.

    ``reset_at``: when a calendar quota (``quotaPeriod``) binds, when it renews (Unix
    epoch seconds, on the Redis server's clock); None otherwise. ``limit``,
    ``remaining`` and ``effective_rate`` speak of the limit that binds: a calendar quota
    binds when it has fewer permits left than the interface's other limits (or refused
    the call for want of them); then ``limit`` is its ``rateLimit`` per period, and a
    refusal by the spent quota has ``retry_after`` = the seconds to ``reset_at``.
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
        """``X-RateLimit-Limit``, ``X-RateLimit-Remaining``, (refused) ``Retry-After``, and
        ``X-RateLimit-Effective-Rate`` while a pushback holds the rate below the limit.

        Empty when the call is not limited, and for a shadow rule: a limit on trial
        must not change what clients see. ``Retry-After`` is whole seconds, at least 1.
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
        waited, retry_after = verdict.wait_us / US_PER_S, None
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
        spent = not verdict.allowed and left < permits
        # ``stored`` is what the interface's other limits have left (none: the quota's)
        others = any(r.kind is not LimitKind.CALENDAR for r in rule.limits)
        if spent or not others or remaining is None or left < remaining:  # the quota binds
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
