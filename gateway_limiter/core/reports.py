"""What the supplier says, told to the backend: a pushback (a 429 or 503, with its
``Retry-After``) and what is left of a calendar quota (``observe``). Each is a begin (the
arguments checked, what to send) and an end (the reply, or the backend's error logged and
never raised), with the backend call made by the shell between them, as a decision is
(``core/pipeline.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway_limiter.backends.base import BackendError
from gateway_limiter.config.rules import Rule
from gateway_limiter.core.arguments import check_observe_args, check_pushback_args
from gateway_limiter.core.outcomes import route
from gateway_limiter.core.quotas import Observed
from gateway_limiter.errors import NotStarted
from gateway_limiter.observe.logs import log, one_line

if TYPE_CHECKING:  # core/pipeline.py imports this module
    from gateway_limiter.core.pipeline import LimiterCore


class Push:
    """What ``begin_pushback`` leaves to the shell: tell the backend the
    supplier pushed back on ``rule`` (``retry_after`` s, or None), for ``key``."""

    __slots__ = ("asked", "key", "retry_after", "rule")

    def __init__(
        self,
        rule: Rule,
        retry_after: float | None,
        key: str | None,
        asked: tuple[float, int] | None,
    ) -> None:
        self.rule = rule
        self.retry_after = None if retry_after is None else float(retry_after)
        self.key = key
        #: as ``Ask.asked``: when the request left, for the local refusals
        self.asked = asked


def begin_pushback(
    core: LimiterCore, url: str, retry_after: float | None, key: str | None
) -> Push | None:
    """Check the arguments; what to tell the backend, or None: nothing to do (the
    interface is not limited or closed, or the backend is failing)."""
    check_pushback_args(url, retry_after, key)
    if not core._started:
        raise NotStarted(core._NOT_STARTED)
    rule = route(core.registry.snapshot, url, key)
    if rule is None or rule.closed or not core._breaker.allows():
        return None
    if rule.lease_ms and core._leases is not None:
        core._leases.drop(url)  # the supplier said stop: this process stops now
    refusals = core._local_refusals
    asked = None if refusals is None else (core.clock.monotonic(), refusals.generation)
    return Push(rule, retry_after, key, asked)


def pushed(core: LimiterCore, push: Push, reply: tuple[float, float] | BackendError) -> None:
    """The backend recorded ``push`` (or failed: logged and counted, never raised)."""
    if isinstance(reply, BackendError):
        core._backend_failed(reply)
        log.warning("pushback on %s not recorded: %s", one_line(push.rule.url), reply)
        return
    if core._breaker.succeeded():
        core._fleet.charges_due = True
    factor, next_free_us = reply
    core._seen_factor(push.rule, factor)
    refusals = core._local_refusals
    if push.asked is not None and refusals is not None and next_free_us > 0.0:
        refusals.learn(push.rule, push.key, push.asked, next_free_us, next_free_us)


def begin_observe(
    core: LimiterCore, url: str, remaining: object, reset_at: object, key: str | None
) -> Observed | None:
    """Check the arguments; the script call that lowers what is left of ``url``'s
    calendar quotas to ``remaining``, or None: nothing to do (not limited, no calendar
    quota it speaks of, no ``remaining``, the backend failing or not shared)."""
    check_observe_args(url, remaining, reset_at, key)
    if not core._started:
        raise NotStarted(core._NOT_STARTED)
    rule = route(core.registry.snapshot, url, key)
    if rule is None or remaining is None or core._counters is None:
        return None
    if not core._breaker.allows():
        return None
    assert isinstance(remaining, int)
    when = None if reset_at is None else float(reset_at)  # type: ignore[arg-type]
    return core._counters.observe(rule, key, remaining, when)


def observed(core: LimiterCore, report: Observed, reply: object) -> int | None:
    """The backend took a report (or failed: logged, never raised): what is left."""
    if isinstance(reply, BackendError):
        core._backend_failed(reply)
        log.warning("supplier's quota report not recorded: %s", reply)
        return None
    assert core._counters is not None
    try:
        return core._counters.observed(report, reply)
    except BackendError as e:
        log.warning("supplier's quota report not recorded: %s", e)
        return None
