"""``gateway-limiter conf set``: create or update one row of the limits table, every
argument checked before anything is written, the row written with its audit row.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final

from gateway_limiter.cli.algorithm_args import (
    algorithm_args_problem,
    given_algorithm_fields,
    one_permit_lease_warning,
    warm_up_cache_warning,
)
from gateway_limiter.cli.arguments import (
    NONE_WORD,
    cache_arg,
    caller_arg,
    label_arg,
    leaf,
    lease_ms_arg,
    max_concurrent_arg,
    max_permits_arg,
    period_arg,
    priority_arg,
    rate_arg,
    renews_arg,
    reserve_arg,
    time_zone_arg,
    url_arg,
    warmup_arg,
)
from gateway_limiter.cli.context import PROG, CliError, Context, UsageError, warning_line
from gateway_limiter.cli.describe import (
    fmt_row_field,
    url_effect,
)
from gateway_limiter.config.edits import (
    FieldError,
    WouldSkip,
    new_row,
    write_planned,
    written_warnings,
)
from gateway_limiter.config.rules import (
    ALGORITHMS,
    CHANNEL_URL,
    MAX_PERIOD,
    Algorithm,
    build_rules,
    read_ruleset,
    scope_text,
    url_shape_problem,
)
from gateway_limiter.config.table import ConfRow, locked_table, same_scope
from gateway_limiter.model.calendar import QUOTA_PERIODS, RenewalError, parse_renewal

#: The columns ``conf set`` leaves as they are unless their flag is given, and clears to
#: NULL with ``none``: flag, attribute, argument type, metavar, in ``--help``'s order
#: (``--quota-period`` comes before the calendar's own, ``--time-zone`` and ``--renews``).
_CLEARABLE: Final[tuple[tuple[str, str, Callable[[str], object], str], ...]] = (
    ("--max-permits", "max_permits", max_permits_arg, "N"),
    ("--warmup", "warmup_period", warmup_arg, "S"),
    ("--max-concurrent", "max_concurrent", max_concurrent_arg, "N"),
    ("--lease-ms", "lease_ms", lease_ms_arg, "MS"),
    ("--time-zone", "time_zone", time_zone_arg, "ZONE"),
    ("--renews", "quota_renews", renews_arg, "WHEN"),
    ("--priority", "priority", priority_arg, "CLASS"),
    ("--reserve", "reserve", reserve_arg, "SHARES"),
)
_CLEARABLE_HELP: Final = {
    "--max-permits": f"token_bucket capacity (maxPermits, >= 1); '{NONE_WORD}': NULL, one "
    "second's worth (the rate). On a paced calendar quota (--pacing): its burst, the most "
    "the pacing saves up",
    "--warmup": "warm_up: seconds from cold to the full rate (warmupPeriod, 0 < S <= 3600); "
    f"'{NONE_WORD}': NULL",
    "--max-concurrent": "at most N calls to the URL in flight across the fleet "
    f"(maxConcurrent; limiter.slot); 0 or '{NONE_WORD}': NULL, no concurrency limit",
    "--lease-ms": "rate leases: each process takes up to MS ms of the rate in one round "
    "trip and spends it in-process (leaseMs; one shared token_bucket row only); "
    f"0 or '{NONE_WORD}': NULL, every call decided in Redis",
    "--time-zone": "with --quota-period: the calendar's IANA zone, e.g. Asia/Shanghai "
    f"(timeZone); '{NONE_WORD}': NULL, the default_time_zone setting",
    "--renews": "with --quota-period: when the period turns over, in local time "
    "(quotaRenews): HH:MM for a day, 'mon HH:MM' for a week, 'DD HH:MM' (1-30) for a "
    f"month; '{NONE_WORD}': NULL, midnight, Monday, the 1st",
    "--priority": "the class of the URL's calls that name none (priority): critical, "
    f"default, sheddable_plus or sheddable; '{NONE_WORD}': NULL, default",
    "--reserve": "the share of this limit each class must leave for the classes above it "
    "(reserve), e.g. default=0.1,sheddable_plus=0.3,sheddable=0.5; "
    f"'{NONE_WORD}': NULL, no reserve",
}

#: The 0/1 columns a pair of flags sets (neither given: left as it is): attribute, the
#: flag for 1 and its help, the flag for 0 and its help.
_SWITCHES: Final = (
    (
        "quota_pacing",
        "--pacing",
        "with --quota-period: quotaPacing 1, spread what is left over what is left of the period",
        "--no-pacing",
        "quotaPacing 0",
    ),
    ("status", "--enable", "status 1", "--disable", "status 0"),
    (
        "shadow",
        "--shadow",
        "shadow 1: decide and count as usual, but never refuse or delay a call (try a new "
        "limit on live traffic; the refusals it would make are counted and logged)",
        "--no-shadow",
        "shadow 0: enforce",
    ),
)


def register(conf: Any) -> None:
    """Add ``conf set`` to ``conf``, the subparsers of the ``conf`` group."""
    setp = leaf(
        conf,
        "set",
        cmd_conf_set,
        "create or update the row of URL (a new row is disabled unless --enable)",
        epilog="Only the columns given change. The algorithm columns are checked together "
        "with what the row already holds, as the reload checks them, before anything is "
        "written; nothing is cleared silently. maxPermits is for token_bucket only and "
        "warmupPeriod for warm_up only, so switching a row's algorithm away from them "
        f"needs '--max-permits {NONE_WORD}' or '--warmup {NONE_WORD}' too (the error says "
        f"which), e.g. '{PROG} conf set URL --rate 50 --algorithm sliding_window "
        f"--max-permits {NONE_WORD}'.",
    )
    setp.add_argument("url", metavar="URL", type=url_arg, help="interfaceUrl (1-128 characters)")
    setp.add_argument(
        "--rate",
        type=rate_arg,
        metavar="N",
        help="permits per period (--period, 1 s by default; 0: closed); needed for a new "
        "row, optional when changing one",
    )
    setp.add_argument(
        "--period",
        type=period_arg,
        metavar="S",
        help=f"the row for a rate per S seconds (periodSeconds, 1 to {MAX_PERIOD}; default 1): "
        "a URL may have a row for each period, and every enabled one applies",
    )
    setp.add_argument(
        "--per-caller",
        dest="per_caller",
        action="store_true",
        help="the row whose limits apply to each caller key apart (perCaller 1); without "
        "it, the row for all callers together",
    )
    setp.add_argument(
        "--caller",
        dest="caller_key",
        type=caller_arg,
        metavar="KEY",
        help="with --per-caller: the row for this caller key alone (callerKey), in place "
        "of the per-caller row that names none",
    )
    setp.add_argument(
        "--cache", type=cache_arg, metavar="S", help="seconds a caller may wait (0-9.99)"
    )
    setp.add_argument(
        "--channel",
        type=label_arg,
        metavar="C",
        help="channelType ('' clears it); the row of URL '*' caps every interface of C together",
    )
    setp.add_argument(
        "--interface-no", type=label_arg, metavar="N", help="interfaceNo ('' clears it)"
    )
    # SUPPRESS: a flag left out leaves its column as it is; 'none' clears it to NULL.
    setp.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=argparse.SUPPRESS,
        help="token_bucket (the default for a new row): bursts of up to --max-permits; "
        "sliding_window: never more than N in any 1 s; warm_up: a third of the rate "
        "after idling, the full rate after --warmup seconds of use",
    )
    for flag, dest, kind, metavar in _CLEARABLE:
        if flag == "--time-zone":  # the calendar quota's columns follow its own flag
            setp.add_argument(
                "--quota-period",
                dest="quota_period",
                choices=QUOTA_PERIODS,
                help="the calendar quota's row: --rate permits per day, week or month of the "
                "supplier's calendar (quotaPeriod); without it, the row per --period seconds",
            )
        setp.add_argument(
            flag,
            dest=dest,
            type=kind,
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=_CLEARABLE_HELP[flag],
        )
    for dest, on, on_help, off, off_help in _SWITCHES:
        pair = setp.add_mutually_exclusive_group()
        pair.add_argument(on, dest=dest, action="store_const", const=1, help=on_help)
        pair.add_argument(off, dest=dest, action="store_const", const=0, help=off_help)
    setp.add_argument(
        "--any-key",
        action="store_true",
        help="URL is a key callers pass to the limiter themselves, not a request path: "
        "write it even though it does not start with '/' (the integrations decide on paths)",
    )


_CONF_FIELDS = (
    ("rate_limit", "rateLimit"),
    ("cache", "cache"),
    ("channel_type", "channelType"),
    ("interface_no", "interfaceNo"),
    ("status", "status"),
    ("algorithm", "algorithm"),
    ("max_permits", "maxPermits"),
    ("warmup_period", "warmupPeriod"),
    ("period_seconds", "periodSeconds"),
    ("per_caller", "perCaller"),
    ("caller_key", "callerKey"),
    ("shadow", "shadow"),
    ("max_concurrent", "maxConcurrent"),
    ("lease_ms", "leaseMs"),
    ("quota_period", "quotaPeriod"),
    ("time_zone", "timeZone"),
    ("quota_renews", "quotaRenews"),
    ("quota_pacing", "quotaPacing"),
    ("priority", "priority"),
    ("reserve", "reserve"),
)


def cmd_conf_set(ctx: Context) -> int:
    """Create or update the row of a URL for one period and scope (lowest configId); a
    new row starts disabled.

    Only the columns given change. The algorithm columns are checked together with
    what the row already holds, by the same rule the reload uses, before anything is
    written: the reload never skips a row ``conf set`` wrote for its algorithm columns.
    """
    a = ctx.args
    shape = url_shape_problem(a.url)
    if shape and not a.any_key:
        raise UsageError(f"argument URL: {shape} (or add --any-key: written as is)", "conf set")
    engine = ctx.engine()
    period, per_caller, caller = a.period or 1, bool(a.per_caller), a.caller_key
    if caller is not None and not per_caller:
        raise UsageError(
            f"argument --caller: {caller!r} names one caller of a per-caller row: add --per-caller",
            "conf set",
        )
    quota = a.quota_period
    if quota is None:
        calendar_flags = [
            flag
            for flag, given in (
                ("--time-zone", hasattr(a, "time_zone")),
                ("--renews", hasattr(a, "quota_renews")),
                ("--pacing", a.quota_pacing == 1),
            )
            if given
        ]
        if calendar_flags:
            raise UsageError(
                f"argument {calendar_flags[0]}: is for a calendar quota's row: add "
                "--quota-period day, week or month",
                "conf set",
            )
    elif a.period not in (None, 1):
        raise UsageError(
            f"argument --period: {a.period} cannot go with --quota-period {quota}: the "
            "calendar is the period (a rate per seconds is a row of its own)",
            "conf set",
        )
    if quota is not None and getattr(a, "quota_renews", None) is not None:
        try:  # stored as every view shows it: 'Mon 0:00' is written 'mon 00:00'
            a.quota_renews = parse_renewal(quota, a.quota_renews).text
        except RenewalError as e:
            raise UsageError(f"argument --renews: {e}", "conf set") from None
    scope: dict[str, Any] = {
        "period_seconds": period,
        "per_caller": int(per_caller),
        "caller_key": caller,
        "quota_period": quota,
    }
    if a.url == CHANNEL_URL:
        # each channel has its own cap: the row is picked (and made) for --channel alone
        if not a.channel:
            raise UsageError(
                f"URL {CHANNEL_URL!r} is a channel cap and needs the channelType it caps: "
                "--channel C (each channel has its own row)",
                "conf set",
            )
        scope["channel_type"] = a.channel
    given = given_algorithm_fields(a)
    fields: dict[str, Any] = dict(given)
    if a.rate is not None:
        fields["rate_limit"] = a.rate
    if a.cache is not None:
        fields["cache"] = a.cache
    if a.channel is not None:
        fields["channel_type"] = a.channel or None
    if a.interface_no is not None:
        fields["interface_no"] = a.interface_no or None
    if a.status is not None:
        fields["status"] = a.status
    if a.shadow is not None:
        fields["shadow"] = a.shadow
    if a.quota_pacing is not None:
        fields["quota_pacing"] = a.quota_pacing
    for _, name, _, _ in _CLEARABLE:
        if hasattr(a, name):  # SUPPRESS: absent unless given (None: clear it)
            fields[name] = getattr(a, name)
    by = ctx.changed_by()
    # Every check is made on the rows as they are in the transaction that writes: a
    # change another session makes meanwhile waits for this one (or this one for it),
    # so what is checked is what is written. Rows are found by their exact values.
    with locked_table(engine) as table:
        everything = [r for r in table.rows if r.interface_url == a.url]
        before = [r for r in everything if same_scope(r, scope)]
        old = before[0] if before else None
        if quota is None:
            problem = algorithm_args_problem(given, old, period, per_caller)
        else:  # a calendar quota's maxPermits is its pacing burst, checked as such
            burst = given.get("max_permits")
            if burst is not None and burst < 1:
                raise UsageError(
                    f"argument --max-permits: {burst}: a paced quota's burst must be at "
                    "least 1 (or 'none': the default burst)",
                    "conf set",
                )
            problem = algorithm_args_problem(
                {k: v for k, v in given.items() if k != "max_permits"},
                None if old is None else replace(old, max_permits=None),
                period,
                per_caller,
            )
        if problem:
            raise UsageError(problem, "conf set")
        if a.rate is None and old is None:
            raise UsageError(
                f"{a.url} has no row for this period and scope: a new row needs --rate",
                "conf set",
            )
        if old is None:
            target = new_row(
                table.rows,
                interface_url=a.url,
                period_seconds=period,
                per_caller=int(per_caller),
                caller_key=caller,
                quota_period=quota,
            )
            written = {"interface_url": a.url, "status": 0, **scope, **fields}
        else:
            target, written = old, fields
        unpaced = _unpaced_burst_problem(replace(target, **fields), given, fields)
        if unpaced:
            raise UsageError(unpaced, "conf set")
        try:
            cache = ctx.settings.default_cache
            row = write_planned(table, old, replace(target, **fields), written, by, cache)
        except FieldError as e:
            raise CliError(f"{a.url} would not be limited as meant: {e}", 2) from None
        except WouldSkip as e:
            raise CliError(
                f"{a.url} would not be limited as meant: the reload would skip {e}", 2
            ) from None
    if old is None:
        values = ", ".join(f"{column} {fmt_row_field(row, name)}" for name, column in _CONF_FIELDS)
        ctx.out.line(f"created configId {row.config_id} for {a.url}: {values}")
    else:
        pairs = [
            (column, fmt_row_field(old, name), fmt_row_field(row, name))
            for name, column in _CONF_FIELDS
        ]
        changes = [f"{column} {was} -> {now}" for column, was, now in pairs if was != now]
        ctx.out.line(
            f"updated configId {row.config_id} for {a.url}: "
            + (", ".join(changes) if changes else "no change")
        )
    if len(before) > 1:
        others = ", ".join(str(r.config_id) for r in before[1:])
        ctx.out.line(
            f"note: {a.url} has other rows {scope_text(quota or period, per_caller)} "
            f"(configId {others}); of the enabled ones, the stricter applies"
        )
    rows, ruleset = read_ruleset(engine, ctx.settings)
    ctx.out.line(url_effect(a.url, rows, ruleset))
    warn_written(ctx, rows, [row.config_id])
    if row.lease_ms and row.rate_limit and _lease_in_force(ctx, rows, row.config_id, a.url):
        warning = one_permit_lease_warning(row.rate_limit, row.period_seconds or 1, row.lease_ms)
        if warning:
            warning_line(warning)
    if row.algorithm == Algorithm.WARM_UP and row.rate_limit and row.warmup_period:
        cache = ctx.settings.default_cache if row.cache is None else round(row.cache, 2)
        warning = warm_up_cache_warning(row.rate_limit, cache, row.warmup_period)
        if warning:
            ctx.out.line(warning)
    if row.status == 0:
        # the URL's other rows stay as they are: name exactly this one
        flags = _scope_flags(row) if any(r.config_id != row.config_id for r in everything) else ""
        ctx.out.line(f"enable it with: {PROG} conf enable {a.url}{flags}")
    ctx.out.line(ctx.reload_note())
    return 0


def warn_written(ctx: Context, rows: Sequence[ConfRow], config_ids: Sequence[int]) -> None:
    """On stderr, what the reload will warn about the rows just written (the exit code
    stays 0: the rows apply, only not wholly as written)."""
    for warning in written_warnings(rows, config_ids, ctx.settings.default_cache):
        warning_line(warning)


def _lease_in_force(ctx: Context, rows: Sequence[ConfRow], config_id: int, url: str) -> bool:
    """Whether the reload gives ``url`` the lease of row ``config_id`` once that row is
    enabled (a lease it ignores has its own warning, from ``written_warnings``)."""
    enabled = [replace(r, status=1) if r.config_id == config_id else r for r in rows]
    rule = build_rules(
        enabled, ctx.settings.default_cache, ctx.settings.default_time_zone
    ).rules.get(url)
    return rule is not None and rule.lease_ms != 0


def _unpaced_burst_problem(planned: ConfRow, given: dict[str, Any], fields: dict[str, Any]) -> str:
    """Why a calendar quota's row would keep a ``maxPermits`` it does not use (pacing
    off), as an error naming the flag given and the one to add ("" when it would not)."""
    if planned.quota_period is None or planned.quota_pacing or planned.max_permits is None:
        return ""
    problem = (
        f"maxPermits {planned.max_permits} is not used by a calendar quota without pacing "
        "(with pacing it is the most the pacing saves up)"
    )
    if "max_permits" in given:
        return f"argument --max-permits: {problem}; add --pacing, or leave --max-permits out"
    blamed = "--no-pacing" if "quota_pacing" in fields else "--quota-period"
    return (
        f"argument {blamed}: {problem}; the row has maxPermits {planned.max_permits}: add "
        f"'--max-permits {NONE_WORD}' to clear it (or --pacing to keep it as the burst)"
    )


def _scope_flags(row: ConfRow) -> str:
    """The ``conf enable/disable`` flags that pick ``row``'s period and scope."""
    quota = f" --quota-period {row.quota_period}" if row.quota_period else ""
    scope = "per-caller" if row.per_caller else "shared"
    return f" --period {row.period_seconds}{quota} --{scope}"
