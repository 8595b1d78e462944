"""Rules: what the table's rows mean (docs/design.md), decided in one place: each row
alone (``config/rule.py``: ``Rule``, ``rule_from_row``), and here the rows together.

How it works: docs/internals.md, section ``gateway_limiter.config.rules``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gateway_limiter.config.row_checks import (
    BAD_URL_CATEGORIES,
    CHANNEL_URL,
    MAX_CACHE,
    MAX_CALLER_KEY,
    MAX_CHANNEL,
    MAX_LEASE_MS,
    MAX_PERIOD,
    MAX_URL_LENGTH,
    MIN_WARMUP,
    algorithm_problem,
    calendar_problem,
    caller_key_problem,
    control_character,
    lease_range_problem,
    share_problem,
    type_problem,
    url_shape_problem,
)
from gateway_limiter.config.rule import CALENDAR_SECONDS, MAX_FILL_S, Rule, Skipped, rule_from_row
from gateway_limiter.config.table import ConfRow, read_rows

# The rows' names for the algorithms, defined in the table (re-exported here).
from gateway_limiter.model.algorithms import ALGORITHMS as ALGORITHMS  # noqa: PLC0414
from gateway_limiter.model.algorithms import Algorithm as Algorithm  # noqa: PLC0414
from gateway_limiter.model.calendar import (
    DEFAULT_PACING_BURST,
    DEFAULT_TIME_ZONE,
)
from gateway_limiter.model.priority import (
    Priority,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from gateway_limiter.config.settings import Settings

__all__ = [
    "ALGORITHMS",
    "BAD_URL_CATEGORIES",
    "CALENDAR_SECONDS",
    "CHANNEL_URL",
    "MAX_CACHE",
    "MAX_CALLER_KEY",
    "MAX_CHANNEL",
    "MAX_FILL_S",
    "MAX_LEASE_MS",
    "MAX_PERIOD",
    "MAX_URL_LENGTH",
    "MIN_WARMUP",
    "Algorithm",
    "RowWarning",
    "Rule",
    "RuleSet",
    "Skipped",
    "algorithm_problem",
    "build_rules",
    "calendar_problem",
    "caller_key_problem",
    "control_character",
    "folded",
    "interface_rule",
    "lease_problem",
    "lease_range_problem",
    "rule_from_row",
    "scope_text",
    "share_problem",
    "twin_warnings",
    "type_problem",
    "url_shape_problem",
]


class RowWarning(str):
    """A warning about rows the reload applies anyway, as text; ``config_ids`` names the
    rows it is about (``conf set`` shows those of the rows it wrote)."""

    config_ids: tuple[int, ...]

    def __new__(cls, text: str, config_ids: Iterable[int]) -> RowWarning:
        made = super().__new__(cls, text)
        made.config_ids = tuple(config_ids)
        return made


def _without_bad_lease(
    row: ConfRow,
    warnings: list[str],
    default_cache: float,
    default_time_zone: str,
    pacing_burst: int = DEFAULT_PACING_BURST,
) -> ConfRow:
    """``row`` with an out-of-range ``leaseMs`` cleared, and a warning naming it when the
    row applies: an optional performance setting must not unlimit its interface."""
    problem = "" if type_problem(row) else lease_range_problem(row)
    if not problem:
        return row
    cleared = replace(row, lease_ms=None)
    if isinstance(rule_from_row(cleared, default_cache, default_time_zone, pacing_burst), Rule):
        warnings.append(
            RowWarning(
                f"leaseMs of configId {row.config_id} ignored on {row.interface_url!r}: "
                f"{problem} (the row applies without a lease)",
                [row.config_id],
            )
        )
    return cleared


def scope_text(period: int | str, per_caller: bool) -> str:
    """A limit's period and scope in words: "per 60 s, per caller", "per day"."""
    unit = f"per {period}" if isinstance(period, str) else f"per {period} s"
    return unit + (", per caller" if per_caller else "")


def _stricter(a: Rule, b: Rule) -> Rule:
    # Enforced before shadow (False < True), then the lower rate, then the lower configId.
    return min(a, b, key=lambda r: (r.shadow, r.rate, r.config_id))


def interface_rule(limits: Iterable[Rule]) -> Rule:
    """One interface's limits as the Rule ``Snapshot.rules`` holds for it.

    The first limit is one of the interface's own (a channel's limits come last): a
    closed one if any, else the shortest period, shared before per caller, then the
    lowest configId; the rest go into ``also`` in that order. The interface's wait
    budget is the smallest ``cache`` among its rows (and its channel's): the caller
    waits for every limit at once, and no row allows more waiting than its own. Its
    ``max_concurrent`` is the smallest any of its own rows sets (the stricter cap wins,
    as for rates; a channel row caps rates only).
    """
    lead, *rest = sorted(
        limits,
        key=lambda r: (r.caps_channel, r.rate != 0, r.period, r.per_caller, r.config_id),
    )
    caps = [
        r.max_concurrent
        for r in (lead, *rest)
        if r.max_concurrent is not None and not r.caps_channel
    ]
    classes = [r for r in sorted((lead, *rest), key=lambda r: r.config_id) if r.priority]
    return replace(
        lead,
        cache=min(r.cache for r in (lead, *rest)),
        also=tuple(rest),
        max_concurrent=min(caps) if caps else None,
        priority=next((r.priority for r in classes if not r.caps_channel), None),
    )


def with_classes(rule: Rule) -> Rule:
    """``rule`` with its variant per class (``Rule.classed``) when one of its limits has
    a reserve: a class below critical is decided with each limit's share for it."""
    if all(r.reserve is None for r in rule.limits):
        return rule
    variants = [replace(rule, priority=Priority.CRITICAL)] + [
        replace(
            rule,
            priority=cls,
            shares=tuple(0.0 if r.reserve is None else r.reserve.share(cls) for r in rule.limits),
        )
        for cls in list(Priority)[1:]
    ]
    return replace(rule, classed=tuple(variants))


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules in force, and what was skipped on the way."""

    rules: Mapping[str, Rule]
    skipped: tuple[Skipped, ...] = field(default=())
    #: URLs whose rows are all disabled (``status = 0``): not limited, but configured.
    disabled: frozenset[str] = frozenset()
    #: (url, callerKey) -> the Rule for that named caller, where it differs from
    #: ``rules[url]`` (a per-caller row names it).
    named: Mapping[tuple[str, str], Rule] = field(default_factory=lambda: MappingProxyType({}))
    #: What is odd but applied anyway (rows of one interface naming different channels).
    warnings: tuple[str, ...] = ()


#: A limit's place among its owner's limits: (period, per caller, callerKey).
#: A calendar quota's period is its name (``day``): a daily quota and a row of
#: ``periodSeconds`` 86,400 are different limits.
_Slot = tuple[int | str, bool, str | None]


def _slot_text(slot: _Slot) -> str:
    where = "" if slot[:2] == (1, False) else f" ({scope_text(slot[0], slot[1])})"
    return where + ("" if slot[2] is None else f" for caller {slot[2]!r}")


def _place(slots: dict[_Slot, Rule], rule: Rule, owner: str, skipped: list[Skipped]) -> None:
    """Put ``rule`` into its slot; of two rows for one slot the stricter wins."""
    slot = (rule.quota_period or rule.period, rule.per_caller, rule.caller)
    other = slots.get(slot)
    if other is None:
        slots[slot] = rule
        return
    winner = _stricter(other, rule)
    loser = rule if winner is other else other
    slots[slot] = winner
    why = "is stricter"
    if loser.shadow != winner.shadow:
        why = "is enforced (this one is shadow)"
    skipped.append(
        Skipped(
            loser.config_id,
            f"duplicate enabled row for {owner}{_slot_text(slot)}: configId "
            f"{winner.config_id} (rateLimit {winner.rate}) {why} and applies",
        )
    )


def _for_caller(slots: Mapping[_Slot, Rule], caller: str | None) -> list[Rule]:
    """The limits that apply to ``caller`` (None: to callers no row names): a named
    caller's row takes the place of the unnamed per-caller row of its period."""
    chosen = {(p, pc): r for (p, pc, name), r in slots.items() if name is None}
    if caller is not None:
        for (p, pc, name), r in slots.items():
            if name == caller:
                chosen[(p, pc)] = r
    return list(chosen.values())


def _resolve(url: str, chosen: list[Rule], skipped: list[Skipped]) -> list[Rule]:
    """One interface's own limits, less what cannot go with the rest: shadow rows
    beside enforced ones, warm_up beside anything (see the module's docstring)."""
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
    return chosen


def _capped(
    url: str, own: list[Rule], cap: list[Rule], channel: str, skipped: list[Skipped]
) -> list[Rule]:
    """``url``'s own limits with its channel's, all keyed under the channel's hash tag.

    A channel's limits join an interface only where one call can be decided by all of
    them: not beside a warm_up row (warm-up stands alone), and only when they are as
    enforced (or as shadow) as the interface's own; otherwise they are left out for that
    interface, with a warning naming them."""
    if not cap:
        return own
    shadow = all(r.shadow for r in own)
    why = ""
    if any(r.algorithm is Algorithm.WARM_UP for r in own + cap):
        why = "warm_up stands alone and cannot be decided with a channel cap"
    elif any(r.shadow != shadow for r in cap):
        why = (
            f"the interface's rows are {'shadow' if shadow else 'enforced'} and one call "
            "cannot be half enforced; make the channel's rows match"
        )
    if why:
        skipped.extend(
            Skipped(r.config_id, f"channel row for {channel!r} does not apply to {url!r}: {why}")
            for r in cap
        )
        return own
    return [replace(r, channel=channel) for r in own] + list(cap)


def lease_problem(rule: Rule) -> str:
    """Why an interface's Rule cannot be leased ("" when it can): a lease is permits
    taken ahead from one shared token bucket, so the interface must be exactly that."""
    if rule.also:
        return "the interface has several limits (or a channel cap)"
    if rule.algorithm is not Algorithm.TOKEN_BUCKET:
        return f"{rule.algorithm} is not token_bucket"
    if rule.per_caller:
        return "the row is perCaller"
    if rule.shadow:
        return "the row is shadow"
    if rule.channel is not None:
        return "the row is a channel cap"
    return ""


def _leased(rule: Rule, warnings: list[str]) -> Rule:
    """``rule`` with its lease, or without it and a warning naming the rows that ask."""
    asking = [r for r in rule.limits if r.lease_ms]
    if not asking:
        return rule
    problem = lease_problem(rule)
    if not problem:
        return rule
    ids = ", ".join(str(r.config_id) for r in asking)
    warnings.append(
        RowWarning(
            f"leaseMs of configId {ids} ignored on {rule.url!r}: {problem} (a lease needs "
            "one shared, enforced token_bucket row)",
            [r.config_id for r in asking],
        )
    )
    return replace(rule, lease_ms=0, also=tuple(replace(r, lease_ms=0) for r in rule.also))


def folded(text: str) -> str:
    """``text`` as MySQL's and MariaDB's default collations compare it: case, accents
    and trailing spaces ignored (an approximation of their tables, which is all a
    warning needs)."""
    if not text.isascii():
        decomposed = unicodedata.normalize("NFKD", text)
        text = "".join(c for c in decomposed if not unicodedata.combining(c))
    return text.casefold().rstrip(" ")


def twin_warnings(rows: Sequence[ConfRow]) -> list[RowWarning]:
    """Rows whose identifying text differs, yet only in case, accents or trailing spaces
    (``/api/x`` and ``/API/x``; channelType ``IBE+`` and ``ibe+``; callerKey
    ``Partner`` and ``partner`` on one URL): the limiter and every command treat them
    as two, a database comparing text by its default collation as one. One warning per
    pair of spellings, naming a row of each."""
    found: list[RowWarning] = []

    def look(column: str, keyed: list[tuple[Any, str, ConfRow]]) -> None:
        # Fold each distinct value once, and look closer only when two fold alike.
        distinct = {(scope, value) for scope, value, _ in keyed}
        folds = {key: (key[0], folded(key[1])) for key in distinct}
        if len(set(folds.values())) == len(folds):
            return
        first: dict[tuple[Any, str], dict[str, ConfRow]] = {}
        for scope, value, row in keyed:
            spellings = first.setdefault(folds[(scope, value)], {})
            spellings.setdefault(value, row)
        for spellings in first.values():
            if len(spellings) < 2:
                continue
            (one, a), *others = spellings.items()
            for other, b in others:
                found.append(
                    RowWarning(
                        f"{column} {one!r} (configId {a.config_id}) and {other!r} (configId "
                        f"{b.config_id}) differ only in case, accents or trailing spaces: "
                        "the limiter treats them as two, a database comparing text by its "
                        "default collation as one",
                        [a.config_id, b.config_id],
                    )
                )

    texts = [r for r in rows if isinstance(r.interface_url, str)]
    look("interfaceUrl", [(None, r.interface_url or "", r) for r in texts])
    look(
        "channelType",
        [(None, r.channel_type, r) for r in rows if isinstance(r.channel_type, str)],
    )
    look(
        "callerKey",
        [(r.interface_url, r.caller_key, r) for r in texts if isinstance(r.caller_key, str)],
    )
    return found


def build_rules(
    rows: Iterable[ConfRow],
    default_cache: float,
    default_time_zone: str = DEFAULT_TIME_ZONE,
    pacing_burst: int = DEFAULT_PACING_BURST,
) -> RuleSet:
    """Turn rows into rules: skip bad rows, resolve duplicate limits (stricter wins),
    gather each URL's limits into one Rule, with its channel's cap and named callers.
    ``default_time_zone`` is the zone of calendar quotas whose ``timeZone`` is NULL;
    ``pacing_burst`` the burst of paced ones whose ``maxPermits`` is NULL."""
    limits: dict[str, dict[_Slot, Rule]] = {}  # url -> slot -> the row's limit
    caps: dict[str, dict[_Slot, Rule]] = {}  # channelType -> slot -> a channel row's limit
    channels: dict[str, dict[str, list[int]]] = {}  # url -> channelType -> configIds
    skipped: list[Skipped] = []
    disabled: set[str] = set()
    leases = False
    rows = list(rows)
    warnings: list[str] = list(twin_warnings(rows))
    for row in rows:
        row = _without_bad_lease(  # noqa: PLW2901
            row, warnings, default_cache, default_time_zone, pacing_burst
        )
        outcome = rule_from_row(row, default_cache, default_time_zone, pacing_burst)
        if outcome is None:
            if row.interface_url and row.interface_url != CHANNEL_URL:
                disabled.add(row.interface_url)
            continue
        if isinstance(outcome, Skipped):
            skipped.append(outcome)
            continue
        leases = leases or outcome.lease_ms != 0
        shape = url_shape_problem(outcome.url)
        if shape:  # applied: callers may pass such a key to the limiter themselves
            warnings.append(RowWarning(f"configId {row.config_id}: {shape}", [row.config_id]))
        if outcome.channel is not None:  # a channel row
            _place(
                caps.setdefault(outcome.channel, {}),
                outcome,
                f"channel {outcome.channel!r}",
                skipped,
            )
            continue
        _place(limits.setdefault(outcome.url, {}), outcome, repr(outcome.url), skipped)
        if row.channel_type:
            channels.setdefault(outcome.url, {}).setdefault(row.channel_type, []).append(
                row.config_id
            )
    rules: dict[str, Rule] = {}
    named: dict[tuple[str, str], Rule] = {}
    for url, slots in limits.items():
        named_in = channels.get(url, {})
        channel = None
        if named_in:
            # The channel of the row with the lowest configId: a fixed choice, warned about.
            channel = min(named_in, key=lambda c: min(named_in[c]))
            if len(named_in) > 1:
                which = "; ".join(
                    f"{c!r}: configId {', '.join(map(str, ids))}" for c, ids in named_in.items()
                )
                warnings.append(
                    f"rows of {url!r} disagree on channelType ({which}); "
                    f"channel caps follow {channel!r} (the lowest configId's)"
                )
        cap_slots = caps.get(channel, {}) if channel is not None else {}
        if len(slots) == 1 and not cap_slots:  # the common case: one limit, no shares
            (lone,) = slots.values()
            if lone.caller is None:
                rules[url] = lone
                continue
        names = {name for (_, _, name) in (*slots, *cap_slots) if name is not None}
        base = _resolve(url, _for_caller(slots, None), skipped)
        if base:
            base = _capped(url, base, _for_caller(cap_slots, None), channel or "", skipped)
            rules[url] = interface_rule(base)
        for name in sorted(names):
            own = _resolve(url, _for_caller(slots, name), skipped)
            if own:
                mine = _capped(url, own, _for_caller(cap_slots, name), channel or "", skipped)
                rule = interface_rule(mine)
                if rule != rules.get(url):
                    named[(url, name)] = rule
    if leases:  # some row asks for a lease: only then look closer
        rules = {url: _leased(rule, warnings) for url, rule in rules.items()}
        named = {k: _leased(rule, warnings) for k, rule in named.items()}
    rules = {url: with_classes(rule) for url, rule in rules.items()}
    named = {k: with_classes(rule) for k, rule in named.items()}
    return RuleSet(
        MappingProxyType(rules),
        tuple(dict.fromkeys(skipped)),  # a row left out for several callers: said once
        frozenset(disabled - rules.keys()),
        MappingProxyType(named),
        tuple(warnings),
    )


def read_ruleset(engine: Engine, settings: Settings) -> tuple[list[ConfRow], RuleSet]:
    """The table's rows, and the rules the reload makes of them under ``settings``'
    defaults (what the command line and the console show of the table)."""
    rows = read_rows(engine)
    return rows, build_rules(rows, settings.default_cache, settings.default_time_zone)
