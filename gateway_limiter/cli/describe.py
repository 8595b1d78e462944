"""Rows, rules and the switch in words, as ``conf``, ``switch`` and ``status`` show them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway_limiter.cli.context import PROG
from gateway_limiter.config.rules import CALENDAR_SECONDS, CHANNEL_URL, Algorithm, Rule, RuleSet
from gateway_limiter.model.algorithms import Quota
from gateway_limiter.model.bucket import US_PER_S, shape

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from gateway_limiter.config.settings import Settings
    from gateway_limiter.config.table import ConfRow


def _not_a_number(value: object) -> bool:
    # SQLite keeps whatever it is given; conf list shows such a value as it is.
    return not isinstance(value, (int, float)) or isinstance(value, bool)


def fmt_cache(value: float | None) -> str:
    """A cache value: FLOAT(3,2) reads back from MySQL as e.g. 0.200000002980232."""
    if value is None or _not_a_number(value):
        return fmt_opt(value)
    return f"{round(value, 2):g}"


def fmt_opt(value: object) -> str:
    """A column's value, NULL for None."""
    return "NULL" if value is None else str(value)


def fmt_seconds(value: float | None) -> str:
    """A warmupPeriod: a FLOAT, so 0.1 reads back from MySQL as 0.100000001490116."""
    if value is None or _not_a_number(value):
        return fmt_opt(value)
    return f"{value:.6g}"


def fmt_amount(value: float) -> str:
    """A count or rate as a person writes it: thousands grouped, never an exponent
    ("100,000", "1,666.7", "0.25")."""
    if abs(value) < 10 and value != int(value):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.1f}"


def fmt_field(name: str, value: Any) -> str:
    """A column's value as messages show it (model attribute ``name``)."""
    if name == "cache":
        return fmt_cache(value)
    if name == "warmup_period":
        return fmt_seconds(value)
    return fmt_opt(value)


def quota_seconds(row: ConfRow) -> int | None:
    """A calendar quota row's period in seconds as ``status`` reckons it (a day 86,400, a
    week 604,800, a month 31 days); None for any other row (or a quotaPeriod the reload
    skips): its ``periodSeconds`` is its period."""
    for period, seconds in CALENDAR_SECONDS.items():
        if row.quota_period == period:
            return seconds
    return None


def fmt_row_field(row: ConfRow, name: str) -> str:
    """A row's column as messages show it: a calendar quota's ``algorithm`` is
    ``calendar`` and its ``periodSeconds`` its calendar period's, whatever the columns
    hold (the reload reads neither for it)."""
    if row.quota_period is not None and name == "algorithm":
        return str(Quota.CALENDAR)
    seconds = quota_seconds(row) if name == "period_seconds" else None
    return fmt_field(name, getattr(row, name) if seconds is None else seconds)


def fmt_time(row: ConfRow) -> str:
    """A row's lastModifyTime, to the second."""
    t = row.last_modify_time
    if not isinstance(t, dt.datetime):
        return "-" if t is None else repr(t)
    return t.isoformat(sep=" ", timespec="seconds")


def on_off(value: bool) -> str:
    """The switch in a word."""
    return "on" if value else "off"


def _per(rule: Rule) -> str:
    """A limit's rate with its period: "20/s", "200 per 60 s", "50,000 per day"."""
    if rule.calendar is not None:
        return f"{rule.rate:,} per {rule.calendar.renewal.period}"
    return f"{rule.rate}/s" if rule.period == 1 else f"{rule.rate} per {rule.period} s"


def calendar_text(rule: Rule) -> str:
    """When a calendar quota renews: "renews 00:00 Asia/Shanghai", "renews mon 00:00
    UTC", "renews on day 15 at 00:00 America/New_York"."""
    assert rule.calendar is not None
    renewal, zone = rule.calendar.renewal, rule.calendar.zone.key
    if renewal.period == "month":
        return f"renews on day {renewal.day} at {renewal.hour:02d}:{renewal.minute:02d} {zone}"
    return f"renews {renewal.text} {zone}"


def _algorithm_text(rule: Rule) -> str:
    """What the rule's algorithm does with the rate, in a few words."""
    if rule.calendar is not None:
        pacing = f", paced, burst {rule.pace_burst:,}" if rule.pacing else ""
        return f"{Quota.CALENDAR}: {calendar_text(rule)}{pacing}"
    if rule.algorithm == Algorithm.SLIDING_WINDOW:
        return f"sliding_window: never more in any {rule.period} s"
    if rule.algorithm == Algorithm.FIXED_WINDOW:
        return f"fixed_window: at most {rule.rate} in each aligned {rule.period} s window"
    if rule.algorithm == Algorithm.WARM_UP:
        return f"warm_up: a third of the rate when idle, full after {rule.warmup:g} s of use"
    return f"token_bucket: bursts of up to {rule.burst}"


def _limit_text(rule: Rule) -> str:
    caller = " for each caller" if rule.per_caller else ""
    if rule.caller is not None:
        caller = f" for caller {rule.caller!r}"
    if rule.caps_channel:  # shared with every interface of the channel
        caller += f" over channel {rule.channel!r}"
    return f"{_per(rule)}{caller} ({_algorithm_text(rule)})"


def lease_text(rule: Rule) -> str:
    """A rate lease in words ("" without one): its length, and the permits one process
    takes at a time (docs/algorithms.md, "Leases": n = max(1, floor(R x L / 1000)))."""
    if not rule.lease_ms:
        return ""
    from gateway_limiter.core.leases import lease_size  # only for a leased row

    n = lease_size(rule, 1)
    return (
        f"rate leases of {rule.lease_ms} ms: up to {n:,} permit{'' if n == 1 else 's'} "
        "per process at a time"
    )


def rule_text(rule: Rule) -> str:
    """An interface's rule in words: every limit, the wait budget, the concurrency cap
    and the rate lease."""
    if rule.closed:
        text = "closed: every call refused"
    else:
        limits = " and ".join(_limit_text(r) for r in rule.limits)
        text = f"limited to {limits}, callers wait up to {rule.cache:g} s"
        if rule.max_concurrent is not None:
            text += f", at most {rule.max_concurrent} in flight"
        if rule.lease_ms:
            text += f", {lease_text(rule)}"
    if rule.shadow:
        return f"{text}, IN SHADOW MODE: decided and counted, never enforced"
    return text


def _rule_brief(rule: Rule, cache: float) -> str:
    """One limit in a table cell: rate, what its algorithm adds, scope, wait budget."""
    shadow = "shadow (not enforced): " if rule.shadow else ""
    if rule.closed:
        return f"{shadow}closed"
    caller = ", per caller" if rule.per_caller else ""
    if rule.calendar is not None:  # named as status names it: its algorithm is the quota
        paced = f", paced, burst {rule.pace_burst:,}" if rule.pacing else ""
        return f"{shadow}{_per(rule)}, {Quota.CALENDAR}{paced}{caller}, wait <= {cache:g} s"
    shaped = {
        Algorithm.SLIDING_WINDOW: f"{_per(rule)} in any {rule.period} s",
        Algorithm.FIXED_WINDOW: f"{_per(rule)} in aligned windows",
        Algorithm.WARM_UP: f"{_per(rule)}, {rule.warmup:g} s warm-up",
    }.get(rule.algorithm, f"{_per(rule)}, burst {rule.burst}")
    return f"{shadow}{shaped}{caller}, wait <= {cache:g} s"


def row_effect(row: ConfRow, ruleset: RuleSet) -> str:
    """What the reload makes of one row (the same ``build_rules`` the reload uses)."""
    if any(s.config_id == row.config_id for s in ruleset.skipped):
        return "skipped (see below)"
    if row.status == 0:
        return "disabled"
    if row.interface_url == CHANNEL_URL or row.caller_key is not None:
        return _share_effect(row, ruleset)
    rule = ruleset.rules.get(row.interface_url or "")
    if rule is None:
        return "-"
    for limit in rule.limits:
        if limit.config_id == row.config_id:
            # a closed limit closes its interface: the other rows say so too
            brief = _rule_brief(rule if rule.closed else limit, rule.cache)
            if rule.closed:
                return brief
            if limit.max_concurrent is not None:
                brief += f", at most {limit.max_concurrent} in flight"
            if rule.lease_ms:  # set only where the interface is this one row
                brief += f", {lease_text(rule)}"
            return brief + _class_text(limit)
    return "-"


def _class_text(limit: Rule) -> str:
    """A limit's priority class and reserve in words ("" when it has neither)."""
    text = ""
    if limit.priority is not None:
        text += f", calls {limit.priority.value} unless they say"
    if limit.reserve is not None:
        text += f", reserve {limit.reserve} (shares each class leaves)"
    return text


def _share_effect(row: ConfRow, ruleset: RuleSet) -> str:
    """A channel row's or a named caller's row's effect: which interfaces (and caller)
    it limits, from the same ``build_rules`` the reload uses."""
    found = [
        (rule, limit)
        for rule in (*ruleset.rules.values(), *ruleset.named.values())
        for limit in rule.limits
        if limit.config_id == row.config_id
    ]
    if not found:
        if row.interface_url == CHANNEL_URL:
            return f"channel cap of {row.channel_type!r}: no enabled interface of it"
        return "-"
    rule, limit = found[0]
    brief = _rule_brief(limit, rule.cache)
    if limit.caps_channel:
        urls = sorted({r.url for r, _ in found})
        shown = ", ".join(urls[:3]) + (f" (+{len(urls) - 3})" if len(urls) > 3 else "")
        brief = f"channel cap of {limit.channel!r} over {shown}: {brief}"
    if limit.caller is not None:
        brief = f"{brief}, for caller {limit.caller!r} only"
    return brief + _class_text(limit)


def url_effect(url: str, rows: Sequence[ConfRow], ruleset: RuleSet) -> str:
    """What the reload makes of ``url``: its rule, or why it is not limited."""
    rule = ruleset.rules.get(url)
    if rule is not None:
        ids = ", ".join(str(r.config_id) for r in rule.limits)
        text = f"{url} is {rule_text(rule)} (configId {ids})"
        for (u, key), named_rule in sorted(ruleset.named.items()):
            if u == url:  # a named caller's limits, in place of the unnamed per-caller row
                named_ids = ", ".join(str(r.config_id) for r in named_rule.limits)
                text += f"; caller {key!r}: {rule_text(named_rule)} (configId {named_ids})"
        return text
    if url == CHANNEL_URL:  # not an interface: each row caps its channel
        caps = [
            f"configId {r.config_id}: {row_effect(r, ruleset)}"
            for r in rows
            if r.interface_url == url
        ]
        return "'*' rows are channel caps: " + ("; ".join(caps) or "none")
    named = sorted(key for u, key in ruleset.named if u == url)
    if named:  # only per-caller rows that name callers: everyone else is not limited
        names = ", ".join(map(repr, named))
        return f"{url} is limited only for the callers its rows name ({names})"
    mine = {r.config_id for r in rows if r.interface_url == url}
    reasons = [str(s) for s in ruleset.skipped if s.config_id in mine]
    if reasons:
        return f"{url} is not limited: the reload skips " + "; ".join(reasons)
    if mine:
        return f"{url} is not limited: {'its rows are' if len(mine) > 1 else 'its row is'} disabled"
    return f"{url} is not limited: no row"


def switch_line(engine: Engine, settings: Settings) -> str:
    """The switch as ``conf list`` heads it: on or off, and where that comes from."""
    from sqlalchemy.exc import SQLAlchemyError

    from gateway_limiter.config.switch_source import parse_switch_source
    from gateway_limiter.config.table import read_switch

    kept = parse_switch_source(settings.switch_source)
    if kept.external:  # not read here: 'switch status' reads it
        return (
            f"switch: kept in {kept.kind} {kept.shown} (setting switch_source; "
            f"'{PROG} switch status' reads it)"
        )
    try:
        stored = read_switch(engine)
    except SQLAlchemyError:
        # As the reload does: the switch table missing means the settings default.
        return (
            f"switch: {on_off(settings.switch)} (settings default; the switch table is "
            f"missing: run '{PROG} db upgrade')"
        )
    if stored is None:
        return f"switch: {on_off(settings.switch)} (settings default)"
    return f"switch: {on_off(stored)} (database row)"


def capacity(rule: Rule) -> float:
    """The most the bucket stores: maxPermits, or for warm_up the model's (rate x warm-up)."""
    if rule.algorithm == Algorithm.WARM_UP and rule.rate > 0:
        return shape(rule.rate, rule.burst, rule.warmup * US_PER_S).capacity
    return float(rule.burst)
