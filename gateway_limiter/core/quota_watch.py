"""How much of each calendar quota's period is used, as this process's decisions see it:
the ``gateway_limiter_quota_used_ratio`` gauge, and a warning log line once per period
as each of the ``quota_warn_at`` fractions (default 80 % and 95 %) is passed.

Every reply on an interface with a calendar quota says what is left of the quota that
binds and when its period ends (``Verdict.quota_left``, ``quota_reset_us``); the watch
keeps the latest per interface and period, so it costs a decision one dict write. The
ratio is the fleet's (the count lives in Redis), as of this process's last decision on
the interface. Each process logs its own warning when its decisions see a fraction
passed; a fleet of N processes logs at most N lines per fraction and period.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Mapping

from gateway_limiter.config.rules import Rule
from gateway_limiter.model.bucket import US_PER_S, Verdict
from gateway_limiter.observe.logs import log


def quota_rule(rule: Rule, limit: float) -> Rule | None:
    """``rule``'s calendar quota of ``limit`` permits: the one a reply speaks of (the
    first such, when two have the same limit; else its first quota; None: none)."""
    quotas = [r for r in rule.limits if r.calendar is not None]
    return next((r for r in quotas if r.rate == limit), quotas[0] if quotas else None)


def quota_period(rule: Rule, limit: float) -> str:
    """The period (day, week, month) of ``rule``'s calendar quota of ``limit`` permits
    (``quota_rule``)."""
    quota = quota_rule(rule, limit)
    if quota is None or quota.calendar is None:
        return "calendar"
    return quota.calendar.renewal.period.value


def renewal_text(rule: Rule, limit: float, reset_us: float) -> str:
    """When the quota renews, as a date and time in its zone with the epoch seconds:
    "2026-11-30 00:00 CST (Asia/Shanghai; 1795968000 epoch s)"."""
    epoch = int(reset_us / US_PER_S)
    quota = quota_rule(rule, limit)
    if quota is None or quota.calendar is None:
        return f"{epoch} (epoch s)"
    zone = quota.calendar.zone
    when = dt.datetime.fromtimestamp(epoch, zone)
    return f"{when:%Y-%m-%d %H:%M %Z} ({zone.key}; {epoch} epoch s)"


class QuotaWatch:
    """The used ratio per (interface, period), and the warnings told per period."""

    __slots__ = ("_fractions", "_lock", "_told", "_used", "publish")

    def __init__(self, fractions: tuple[float, ...]) -> None:
        self._fractions = fractions
        self._used: dict[tuple[str, str], float] = {}
        #: Under prometheus-client's multiprocess mode, where no scrape reads ``used``:
        #: told (interface, period, ratio) whenever a ratio changes, to set the gauge.
        self.publish: Callable[[str, str, float], None] | None = None
        #: (interface, period) -> (the period's end, µs; the highest fraction told in it)
        self._told: dict[tuple[str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def seen(self, rule: Rule, verdict: Verdict) -> None:
        """A reply on ``rule``: its quota's used ratio, and a warning when it passed a
        fraction not yet told in this period."""
        limit = verdict.quota_limit
        if verdict.quota_left < 0.0 or limit <= 0.0:
            return
        ratio = (limit - verdict.quota_left) / limit
        key = (rule.url, quota_period(rule, limit))
        if self.publish is not None and self._used.get(key) != ratio:
            self.publish(key[0], key[1], ratio)
        self._used[key] = ratio
        passed = [f for f in self._fractions if ratio >= f]
        if not passed:
            return
        with self._lock:
            ends, told = self._told.get(key, (0.0, 0.0))
            if ends != verdict.quota_reset_us:
                told = 0.0  # a new period: nothing told in it yet
            if passed[-1] <= told:
                return
            self._told[key] = (verdict.quota_reset_us, passed[-1])
        log.warning(
            "calendar quota of %r (%s): %.0f %% used (%d of %d), past %.0f %%; it renews at %s",
            rule.url,
            key[1],
            ratio * 100,
            round(limit - verdict.quota_left),
            round(limit),
            passed[-1] * 100,
            renewal_text(rule, limit, verdict.quota_reset_us),
        )

    def used(self) -> Mapping[tuple[str, str], float]:
        """(interface, period) -> the used ratio last seen."""
        return dict(self._used)
