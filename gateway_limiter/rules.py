"""Rules: what the table's rows mean (DESIGN.md section 1), decided in one place.

``build_rules`` turns rows into an immutable mapping url -> Rule plus the list of rows
it skipped and why. Rows never raise: a bad row is skipped with a warning naming its
configId, and every valid row still applies.

Two enabled rows for one URL: **the stricter row wins** (the lower ``rateLimit``; on a
tie, the lower ``configId``), and a warning names both. A supplier's cap is never
exceeded because someone inserted a second row by mistake.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .table import ConfRow

MAX_URL_LENGTH = 128
MAX_CACHE = 9.99
TOKEN_BUCKET = "token_bucket"
WARM_UP = "warm_up"
SLIDING_WINDOW = "sliding_window"
ALGORITHMS = (TOKEN_BUCKET, WARM_UP, SLIDING_WINDOW)


@dataclass(frozen=True, slots=True)
class Rule:
    """An enforced limit: ``rate`` permits/s on ``url``, callers may wait ``cache`` s."""

    url: str
    rate: int
    cache: float
    config_id: int
    capacity: int = 0  # token bucket: maxPermits; 0 = the rate (one second's worth)
    algorithm: str = TOKEN_BUCKET
    warmup: float = 0.0  # warm_up: seconds from cold to the full rate

    @property
    def closed(self) -> bool:
        """``rateLimit = 0``: every call refused."""
        return self.rate == 0

    @property
    def burst(self) -> int:
        """The most permits the bucket saves up."""
        return self.capacity or self.rate


@dataclass(frozen=True, slots=True)
class Skipped:
    """A row that was not applied, and why."""

    config_id: int
    reason: str

    def __str__(self) -> str:
        return f"configId {self.config_id}: {self.reason}"


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def type_problem(row: ConfRow) -> str:
    """Why a value of an enabled row is not of its column's type ("" when all are).

    MySQL enforces the column types, SQLite does not: it keeps text in rateLimit or a
    blob in interfaceUrl as given. Such a row is skipped like any invalid row.
    """
    if not isinstance(row.interface_url, str | None):
        return f"interfaceUrl {row.interface_url!r} is not text"
    if not (row.rate_limit is None or _is_whole(row.rate_limit)):
        return f"rateLimit {row.rate_limit!r} is not a whole number"
    if not (row.cache is None or _is_number(row.cache)):
        return f"cache {row.cache!r} is not a number"
    if not isinstance(row.algorithm, str | None):
        return f"algorithm {row.algorithm!r} is not text"
    if not (row.max_permits is None or _is_whole(row.max_permits)):
        return f"maxPermits {row.max_permits!r} is not a whole number"
    if not (row.warmup_period is None or _is_number(row.warmup_period)):
        return f"warmupPeriod {row.warmup_period!r} is not a number"
    return ""


def rule_from_row(row: ConfRow, default_cache: float) -> Rule | Skipped | None:
    """The rule of one row, a Skipped with the reason, or None for a disabled row."""
    if row.status not in (0, 1):
        return Skipped(row.config_id, f"status {row.status!r} is not 0 or 1")
    if row.status == 0:
        return None
    problem = type_problem(row)
    if problem:
        return Skipped(row.config_id, problem)
    url = row.interface_url
    if url is None or url == "":
        return Skipped(row.config_id, "interfaceUrl is empty")
    if len(url) > MAX_URL_LENGTH:
        return Skipped(row.config_id, f"interfaceUrl longer than {MAX_URL_LENGTH} characters")
    if row.rate_limit is None:
        return Skipped(row.config_id, "rateLimit is NULL")
    if row.rate_limit < 0:
        return Skipped(row.config_id, f"rateLimit {row.rate_limit} is negative")
    cache = default_cache if row.cache is None else float(row.cache)
    if not math.isfinite(cache) or cache < 0:
        return Skipped(row.config_id, f"cache {row.cache!r} is negative")
    # FLOAT(3,2) on MySQL reads back as e.g. 0.300000011920929; keep what was meant.
    cache = min(round(cache, 2), MAX_CACHE)
    algorithm = row.algorithm or TOKEN_BUCKET
    problem = algorithm_problem(algorithm, row.max_permits, row.warmup_period)
    if problem:
        return Skipped(row.config_id, problem)
    return Rule(
        url=url,
        rate=int(row.rate_limit),
        cache=cache,
        config_id=row.config_id,
        capacity=row.max_permits or 0,
        algorithm=algorithm,
        warmup=float(row.warmup_period or 0.0),
    )


def algorithm_problem(algorithm: str, max_permits: int | None, warmup: float | None) -> str:
    """Why these algorithm columns cannot go together ("" when they can)."""
    if algorithm not in ALGORITHMS:
        return f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}"
    if max_permits is not None and (max_permits < 1 or algorithm != TOKEN_BUCKET):
        return f"maxPermits {max_permits} is invalid for {algorithm} (token_bucket only, >= 1)"
    if algorithm == WARM_UP:
        if warmup is None or not (math.isfinite(warmup) and 0 < warmup <= 3600):
            return f"warm_up needs warmupPeriod between 0 and 3600 seconds, got {warmup!r}"
    elif warmup is not None:
        return f"warmupPeriod is for warm_up only, not {algorithm}"
    return ""


def _stricter(a: Rule, b: Rule) -> Rule:
    return min(a, b, key=lambda r: (r.rate, r.config_id))


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules in force, and what was skipped on the way."""

    rules: Mapping[str, Rule]
    skipped: tuple[Skipped, ...] = field(default=())


def build_rules(rows: Iterable[ConfRow], default_cache: float) -> RuleSet:
    """Turn rows into rules: skip bad rows, resolve duplicate URLs (stricter wins)."""
    rules: dict[str, Rule] = {}
    skipped: list[Skipped] = []
    for row in rows:
        outcome = rule_from_row(row, default_cache)
        if outcome is None:
            continue
        if isinstance(outcome, Skipped):
            skipped.append(outcome)
            continue
        other = rules.get(outcome.url)
        if other is None:
            rules[outcome.url] = outcome
            continue
        winner = _stricter(other, outcome)
        loser = outcome if winner is other else other
        rules[outcome.url] = winner
        skipped.append(
            Skipped(
                loser.config_id,
                f"duplicate enabled row for {outcome.url!r}: configId {winner.config_id} "
                f"(rateLimit {winner.rate}) is stricter and applies",
            )
        )
    return RuleSet(MappingProxyType(rules), tuple(skipped))
