"""Rules: what the table's rows mean (docs/design.md), decided in one place.

``build_rules`` turns rows into an immutable mapping url -> Rule plus the list of rows
it skipped and why. Rows never raise: a bad row is skipped with a warning naming its
configId, and every valid row still applies.

One interface, several limits. A row limits its interface to ``rateLimit`` permits per
``periodSeconds`` (revision 0004), for all callers together or, with ``perCaller = 1``,
for each caller key apart. Enabled rows of one URL that differ in period or in scope
(shared / per caller) all apply, and a call is admitted only when every one of them
admits it: "5 per second and 200 per minute", or "100 per second in all and 10 per
second per caller". The Rule of such a URL is its first limit, with the others in
``Rule.also`` (see ``interface_rule`` for the order and the wait budget).

Two enabled rows for one URL with the same period and scope: **the stricter row wins**
(the lower ``rateLimit``; on a tie, the lower ``configId``), and a warning names both.
A supplier's cap is never exceeded because someone inserted a second row by mistake.

``warm_up`` stands alone: it paces one per-second limit for the supplier as a whole, so
it needs ``periodSeconds = 1`` and ``perCaller = 0``, and a warm_up row on a URL that
has other limits is skipped (the others apply): a call's wait under warm-up depends on
when it goes, which the other limits decide, so no exact common answer exists.

A shadow row (``shadow = 1``) is decided and counted, never enforced. An enforced row
always wins over a shadow row for the same period and scope, so a row on trial can never
lift a limit in force; an interface whose limits are all shadow is on trial as a whole,
and shadow rows beside enforced limits of other periods or scopes are skipped with a
warning (one call cannot be half enforced).

``maxConcurrent`` caps the calls in flight (``limiter.slot``; docs/concurrency.md): NULL
or 0 no cap, negative a skipped row, and the smallest cap of a URL's rows applies. A
row always limits a rate too (``rateLimit`` stays required): a cap on concurrency alone
is a row with a rate the supplier never reaches, so every row keeps one meaning for
``try_acquire``.

Disabled rows make no rule, but their URLs are kept (``RuleSet.disabled``) so that a
decision can say "disabled" rather than "not configured".
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from gateway_limiter.config.table import ConfRow

MAX_URL_LENGTH = 128
MAX_CACHE = 9.99
#: The longest ``periodSeconds``: a day (suppliers sell daily quotas; no longer ones).
MAX_PERIOD = 86_400


class Algorithm(StrEnum):
    """The ``algorithm`` column's values. Each member equals its column value (a str), so
    rows, logs, metrics labels and script arguments carry the same text as ever."""

    TOKEN_BUCKET = "token_bucket"
    WARM_UP = "warm_up"
    SLIDING_WINDOW = "sliding_window"
    FIXED_WINDOW = "fixed_window"


#: Every algorithm's column value, in the order the CLI and messages list them (plain
#: strings: argparse and messages show them with repr).
ALGORITHMS: tuple[str, ...] = tuple(a.value for a in Algorithm)


@dataclass(frozen=True, slots=True)
class Rule:
    """An enforced limit: ``rate`` permits per ``period`` s on ``url``; callers may wait
    ``cache`` s.

    In ``Snapshot.rules`` a Rule stands for its whole interface: its own limit first,
    the interface's other limits in ``also`` (decided with it, all or nothing), and
    ``cache`` the interface's wait budget.
    """

    url: str
    rate: int
    cache: float
    config_id: int
    capacity: int = 0  # token bucket: maxPermits; 0 = the rate (one period's worth)
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    warmup: float = 0.0  # warm_up: seconds from cold to the full rate
    period: int = 1  # seconds that ``rate`` permits are for
    per_caller: bool = False  # True: each caller key has its own state
    also: tuple[Rule, ...] = ()  # the interface's other limits
    shadow: bool = False  # decided and counted, never enforced (the call always goes ahead)
    #: calls in flight at once across the fleet (``slot()``); None: no concurrency limit
    max_concurrent: int | None = None

    if TYPE_CHECKING:
        # The generated __init__, except that ``algorithm`` may also be given as its
        # column value ("sliding_window"): __post_init__ makes it an Algorithm.
        def __init__(
            self,
            url: str,
            rate: int,
            cache: float,
            config_id: int,
            capacity: int = 0,
            algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET,
            warmup: float = 0.0,
            period: int = 1,
            per_caller: bool = False,
            also: tuple[Rule, ...] = (),
            shadow: bool = False,
            max_concurrent: int | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        if type(self.algorithm) is not Algorithm:  # ValueError naming an unknown one
            object.__setattr__(self, "algorithm", Algorithm(self.algorithm))

    @property
    def closed(self) -> bool:
        """``rateLimit = 0``: every call refused."""
        return self.rate == 0

    @property
    def burst(self) -> int:
        """The most permits the bucket saves up."""
        return self.capacity or self.rate

    @property
    def per_second(self) -> float:
        """The rate in permits per second (``rate / period``)."""
        return self.rate / self.period

    @property
    def limits(self) -> tuple[Rule, ...]:
        """Every limit of the interface: this one, then ``also``."""
        return (self, *self.also)

    @property
    def keyed(self) -> bool:
        """True when the caller's key matters: some limit is per caller."""
        return any(r.per_caller for r in self.limits)


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


#: Unicode categories a URL may not hold: control characters (C0, DEL, C1: newline, tab,
#: NUL, escape...) and the line and paragraph separators, which break a line as well.
BAD_URL_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def control_character(url: str) -> tuple[int, str] | None:
    """The first control character in ``url`` as (its 1-based position, it), or None.

    A caller never sends such a URL, and a newline in a row would split every line that
    shows it (``conf list``, ``status``, logs): such rows are skipped, and the command
    line and ``gateway_limiter.admin`` refuse to write them.
    """
    for position, char in enumerate(url, start=1):
        if unicodedata.category(char) in BAD_URL_CATEGORIES:
            return position, char
    return None


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
    if not (row.max_concurrent is None or _is_whole(row.max_concurrent)):
        return f"maxConcurrent {row.max_concurrent!r} is not a whole number"
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
    if row.shadow not in (None, 0, 1):
        return Skipped(row.config_id, f"shadow {row.shadow!r} is not 0 or 1")
    url = row.interface_url
    if url is None or url == "":
        return Skipped(row.config_id, "interfaceUrl is empty")
    if len(url) > MAX_URL_LENGTH:
        return Skipped(row.config_id, f"interfaceUrl longer than {MAX_URL_LENGTH} characters")
    bad = control_character(url)
    if bad is not None:
        return Skipped(
            row.config_id,
            f"interfaceUrl contains the control character {bad[1]!r} (character {bad[0]})",
        )
    if row.rate_limit is None:
        return Skipped(row.config_id, "rateLimit is NULL")
    if row.rate_limit < 0:
        return Skipped(row.config_id, f"rateLimit {row.rate_limit} is negative")
    cache = default_cache if row.cache is None else float(row.cache)
    if not math.isfinite(cache) or cache < 0:
        return Skipped(row.config_id, f"cache {row.cache!r} is negative")
    # FLOAT(3,2) on MySQL reads back as e.g. 0.300000011920929; keep what was meant.
    cache = min(round(cache, 2), MAX_CACHE)
    algorithm = row.algorithm or Algorithm.TOKEN_BUCKET
    # NULL (a schema before revision 0004, or written so by hand): today's meaning.
    period = 1 if row.period_seconds is None else row.period_seconds
    per_caller = 0 if row.per_caller is None else row.per_caller
    if per_caller not in (0, 1):
        return Skipped(row.config_id, f"perCaller {per_caller!r} is not 0 or 1")
    problem = algorithm_problem(
        algorithm, row.max_permits, row.warmup_period, period, bool(per_caller)
    )
    if problem:
        return Skipped(row.config_id, problem)
    if row.max_concurrent is not None and row.max_concurrent < 0:
        return Skipped(row.config_id, f"maxConcurrent {row.max_concurrent} is negative")
    return Rule(
        url=url,
        rate=int(row.rate_limit),
        cache=cache,
        config_id=row.config_id,
        capacity=row.max_permits or 0,
        algorithm=Algorithm(algorithm),
        warmup=float(row.warmup_period or 0.0),
        period=period,
        per_caller=bool(per_caller),
        shadow=bool(row.shadow),
        # 0 is what `conf set --max-concurrent 0` clears: no concurrency limit, like NULL
        max_concurrent=row.max_concurrent or None,
    )


def algorithm_problem(
    algorithm: str,
    max_permits: int | None,
    warmup: float | None,
    period: object = 1,
    per_caller: bool = False,
) -> str:
    """Why these columns of one row cannot go together ("" when they can).

    Every algorithm takes any ``periodSeconds`` from 1 to MAX_PERIOD and ``perCaller``,
    except ``warm_up``: one per-second limit on the supplier as a whole.
    """
    if type(period) is not int or not 1 <= period <= MAX_PERIOD:
        return f"periodSeconds {period!r} is not a whole number from 1 to {MAX_PERIOD}"
    if algorithm not in ALGORITHMS:
        return f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}"
    if max_permits is not None and (max_permits < 1 or algorithm != Algorithm.TOKEN_BUCKET):
        return f"maxPermits {max_permits} is invalid for {algorithm} (token_bucket only, >= 1)"
    if algorithm == Algorithm.WARM_UP:
        if warmup is None or not (math.isfinite(warmup) and 0 < warmup <= 3600):
            return f"warm_up needs warmupPeriod between 0 and 3600 seconds, got {warmup!r}"
        if period != 1:
            return f"warm_up paces per second: periodSeconds must be 1, got {period}"
        if per_caller:
            return "warm_up warms the supplier as a whole: it cannot be perCaller"
    elif warmup is not None:
        return f"warmupPeriod is for warm_up only, not {algorithm}"
    return ""


def scope_text(period: int, per_caller: bool) -> str:
    """A limit's period and scope in words: "per 60 s, per caller"."""
    return f"per {period} s" + (", per caller" if per_caller else "")


def _stricter(a: Rule, b: Rule) -> Rule:
    # Enforced before shadow (False < True), then the lower rate, then the lower configId.
    return min(a, b, key=lambda r: (r.shadow, r.rate, r.config_id))


def interface_rule(limits: Iterable[Rule]) -> Rule:
    """One interface's limits as the Rule ``Snapshot.rules`` holds for it.

    The first limit is a closed one if any (a call must pass every limit, so one closed
    limit closes the interface), else the shortest period, shared before per caller,
    then the lowest configId; the rest go into ``also`` in that order. The interface's
    wait budget is the smallest ``cache`` among its rows: the caller waits for every
    limit at once, and no row allows more waiting than its own. Its ``max_concurrent``
    is the smallest any of its rows sets (the stricter cap wins, as for rates).
    """
    lead, *rest = sorted(limits, key=lambda r: (not r.closed, r.period, r.per_caller, r.config_id))
    caps = [r.max_concurrent for r in (lead, *rest) if r.max_concurrent is not None]
    return replace(
        lead,
        cache=min(r.cache for r in (lead, *rest)),
        also=tuple(rest),
        max_concurrent=min(caps) if caps else None,
    )


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules in force, and what was skipped on the way."""

    rules: Mapping[str, Rule]
    skipped: tuple[Skipped, ...] = field(default=())
    #: URLs whose rows are all disabled (``status = 0``): not limited, but configured.
    disabled: frozenset[str] = frozenset()


def build_rules(rows: Iterable[ConfRow], default_cache: float) -> RuleSet:
    """Turn rows into rules: skip bad rows, resolve duplicate limits (stricter wins), and
    gather each URL's limits into one Rule."""
    # url -> (period, per caller) -> the row's limit
    limits: dict[str, dict[tuple[int, bool], Rule]] = {}
    skipped: list[Skipped] = []
    disabled: set[str] = set()
    for row in rows:
        outcome = rule_from_row(row, default_cache)
        if outcome is None:
            if row.interface_url:
                disabled.add(row.interface_url)
            continue
        if isinstance(outcome, Skipped):
            skipped.append(outcome)
            continue
        slots = limits.setdefault(outcome.url, {})
        slot = (outcome.period, outcome.per_caller)
        other = slots.get(slot)
        if other is None:
            slots[slot] = outcome
            continue
        winner = _stricter(other, outcome)
        loser = outcome if winner is other else other
        slots[slot] = winner
        where = "" if slot == (1, False) else f" ({scope_text(*slot)})"
        why = "is stricter"
        if loser.shadow != winner.shadow:
            why = "is enforced (this one is shadow)"
        skipped.append(
            Skipped(
                loser.config_id,
                f"duplicate enabled row for {outcome.url!r}{where}: configId "
                f"{winner.config_id} (rateLimit {winner.rate}) {why} and applies",
            )
        )
    rules: dict[str, Rule] = {}
    for url, slots in limits.items():
        chosen = list(slots.values())
        enforced = [r for r in chosen if not r.shadow]
        if enforced and len(enforced) < len(chosen):
            applies = ", ".join(str(r.config_id) for r in enforced)
            skipped.extend(
                Skipped(
                    r.config_id,
                    f"shadow row beside enforced limits of {url!r} (configId {applies} "
                    "apply): a call is enforced or on trial as a whole; make every row "
                    "of the URL shadow to trial them together",
                )
                for r in chosen
                if r.shadow
            )
            chosen = enforced
        if len(chosen) > 1:
            others = [r for r in chosen if r.algorithm is not Algorithm.WARM_UP]
            applies = ", ".join(str(r.config_id) for r in others)
            skipped.extend(
                Skipped(
                    r.config_id,
                    f"warm_up cannot be combined with other limits of {url!r} "
                    f"(configId {applies} apply); for pacing at the rate give this row "
                    "algorithm token_bucket with maxPermits 1",
                )
                for r in chosen
                if r.algorithm is Algorithm.WARM_UP
            )
            chosen = others
        rules[url] = interface_rule(chosen)
    return RuleSet(MappingProxyType(rules), tuple(skipped), frozenset(disabled - rules.keys()))
