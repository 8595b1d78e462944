"""``gateway-limiter conf list|set|enable|disable|delete``: the rows of the limits table.

Commands that write change the rows they name in one transaction, after every argument
has been checked: an error never leaves half a change.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gateway_limiter.cli import listing
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
    fmt_field,
    url_effect,
)
from gateway_limiter.config.audit import record_change, record_unrecorded, row_record
from gateway_limiter.config.edits import (
    combination_problem,
    row_problem,
    written_warnings,
)
from gateway_limiter.config.rules import (
    ALGORITHMS,
    CHANNEL_URL,
    MAX_PERIOD,
    Algorithm,
    build_rules,
    scope_text,
    url_shape_problem,
)
from gateway_limiter.config.table import (
    ConfRow,
    locked_table,
    read_rows,
    same_scope,
)
from gateway_limiter.model.calendar import QUOTA_PERIODS, RenewalError, parse_renewal

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from gateway_limiter.config.audit import ChangedBy


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``conf`` commands to ``parser``."""
    conf = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing.register(
        leaf(
            conf, "list", listing.cmd_conf_list, "every row, its effect, and rows the reload skips"
        )
    )
    _register_set(conf)
    for name, run, text in (
        ("enable", cmd_conf_enable, "set status 1 on the rows of URL"),
        ("disable", cmd_conf_disable, "set status 0 on the rows of URL"),
        ("delete", cmd_conf_delete, "delete the rows of URL"),
    ):
        pick = leaf(conf, name, run, text)
        pick.add_argument("url", metavar="URL", type=url_arg)
        pick.add_argument(
            "--period", type=period_arg, metavar="S", help="only the rows for S seconds"
        )
        scope = pick.add_mutually_exclusive_group()
        scope.add_argument(
            "--per-caller",
            dest="per_caller",
            action="store_const",
            const=True,
            help="only the per-caller rows",
        )
        scope.add_argument(
            "--shared",
            dest="per_caller",
            action="store_const",
            const=False,
            help="only the rows for all callers together",
        )
        pick.add_argument(
            "--quota-period",
            dest="quota_period",
            choices=QUOTA_PERIODS,
            help="only the calendar quota of this period (quotaPeriod)",
        )
        pick.add_argument(
            "--channel",
            metavar="C",
            help="with URL '*': only the channel cap of channelType C (each channel has its own)",
        )


def _register_set(conf: Any) -> None:
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
    setp.add_argument(
        "--max-permits",
        dest="max_permits",
        type=max_permits_arg,
        default=argparse.SUPPRESS,
        metavar="N",
        help=f"token_bucket capacity (maxPermits, >= 1); '{NONE_WORD}': NULL, one "
        "second's worth (the rate)",
    )
    setp.add_argument(
        "--warmup",
        dest="warmup_period",
        type=warmup_arg,
        default=argparse.SUPPRESS,
        metavar="S",
        help=f"warm_up: seconds from cold to the full rate (warmupPeriod, 0 < S <= 3600); "
        f"'{NONE_WORD}': NULL",
    )
    setp.add_argument(
        "--max-concurrent",
        dest="max_concurrent",
        type=max_concurrent_arg,
        default=argparse.SUPPRESS,
        metavar="N",
        help="at most N calls to the URL in flight across the fleet (maxConcurrent; "
        f"limiter.slot); 0 or '{NONE_WORD}': NULL, no concurrency limit",
    )
    setp.add_argument(
        "--lease-ms",
        dest="lease_ms",
        type=lease_ms_arg,
        default=argparse.SUPPRESS,
        metavar="MS",
        help="rate leases: each process takes up to MS ms of the rate in one round trip "
        "and spends it in-process (leaseMs; one shared token_bucket row only); "
        f"0 or '{NONE_WORD}': NULL, every call decided in Redis",
    )
    setp.add_argument(
        "--quota-period",
        dest="quota_period",
        choices=QUOTA_PERIODS,
        help="the calendar quota's row: --rate permits per day, week or month of the "
        "supplier's calendar (quotaPeriod); without it, the row per --period seconds",
    )
    setp.add_argument(
        "--time-zone",
        dest="time_zone",
        type=time_zone_arg,
        default=argparse.SUPPRESS,
        metavar="ZONE",
        help="with --quota-period: the calendar's IANA zone, e.g. Asia/Shanghai "
        f"(timeZone); '{NONE_WORD}': NULL, the default_time_zone setting",
    )
    setp.add_argument(
        "--renews",
        dest="quota_renews",
        type=renews_arg,
        default=argparse.SUPPRESS,
        metavar="WHEN",
        help="with --quota-period: when the period turns over, in local time "
        "(quotaRenews): HH:MM for a day, 'mon HH:MM' for a week, 'DD HH:MM' (1-30) for a "
        f"month; '{NONE_WORD}': NULL, midnight, Monday, the 1st",
    )
    setp.add_argument(
        "--priority",
        dest="priority",
        type=priority_arg,
        default=argparse.SUPPRESS,
        metavar="CLASS",
        help="the class of the URL's calls that name none (priority): critical, default, "
        f"sheddable_plus or sheddable; '{NONE_WORD}': NULL, default",
    )
    setp.add_argument(
        "--reserve",
        dest="reserve",
        type=reserve_arg,
        default=argparse.SUPPRESS,
        metavar="SHARES",
        help="the share of this limit each class must leave for the classes above it "
        "(reserve), e.g. default=0.1,sheddable_plus=0.3,sheddable=0.5; "
        f"'{NONE_WORD}': NULL, no reserve",
    )
    pacing = setp.add_mutually_exclusive_group()
    pacing.add_argument(
        "--pacing",
        dest="quota_pacing",
        action="store_const",
        const=1,
        help="with --quota-period: quotaPacing 1, spread what is left over what is left "
        "of the period",
    )
    pacing.add_argument(
        "--no-pacing", dest="quota_pacing", action="store_const", const=0, help="quotaPacing 0"
    )
    onoff = setp.add_mutually_exclusive_group()
    onoff.add_argument("--enable", dest="status", action="store_const", const=1, help="status 1")
    onoff.add_argument("--disable", dest="status", action="store_const", const=0, help="status 0")
    shadow = setp.add_mutually_exclusive_group()
    shadow.add_argument(
        "--shadow",
        dest="shadow",
        action="store_const",
        const=1,
        help="shadow 1: decide and count as usual, but never refuse or delay a call "
        "(try a new limit on live traffic; the refusals it would make are counted and logged)",
    )
    shadow.add_argument(
        "--no-shadow", dest="shadow", action="store_const", const=0, help="shadow 0: enforce"
    )
    setp.add_argument(
        "--any-key",
        action="store_true",
        help="URL is a key callers pass to the limiter themselves, not a request path: "
        "write it even though it does not start with '/' (the integrations decide on paths)",
    )


# --- conf set ------------------------------------------------------------------------------

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
        try:
            parse_renewal(quota, a.quota_renews)
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
    if hasattr(a, "max_concurrent"):  # SUPPRESS: absent unless given (None: clear it)
        fields["max_concurrent"] = a.max_concurrent
    if hasattr(a, "lease_ms"):  # SUPPRESS: absent unless given (None: clear it)
        fields["lease_ms"] = a.lease_ms
    if hasattr(a, "time_zone"):
        fields["time_zone"] = a.time_zone
    if hasattr(a, "quota_renews"):
        fields["quota_renews"] = a.quota_renews
    if a.quota_pacing is not None:
        fields["quota_pacing"] = a.quota_pacing
    for name in ("priority", "reserve"):
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
        problem = algorithm_args_problem(given, old, period, per_caller)
        if problem:
            raise UsageError(problem, "conf set")
        if a.rate is None and old is None:
            raise UsageError(
                f"{a.url} has no row for this period and scope: a new row needs --rate",
                "conf set",
            )
        if old is None:
            target = ConfRow(
                config_id=max([0, *(r.config_id for r in table.rows)]) + 1,
                channel_type=None,
                interface_no=None,
                interface_url=a.url,
                rate_limit=None,
                cache=None,
                status=0,
                period_seconds=period,
                per_caller=int(per_caller),
                caller_key=caller,
                quota_period=quota,
            )
        else:
            target = old
        changed = replace(target, **fields)
        problem_row = row_problem(changed)
        if problem_row is not None:
            raise CliError(f"{a.url} would not be limited as meant: {problem_row}", 2)
        clash = combination_problem(table.rows, a.url, changed, ctx.settings.default_cache)
        if clash:
            raise CliError(
                f"{a.url} would not be limited as meant: the reload would skip {clash}", 2
            )
        if old is None:
            row = table.insert({"interface_url": a.url, "status": 0, **scope, **fields})
            record_change(table.conn, by, row.config_id, "insert", None, row_record(row))
            created = True
        else:
            record_unrecorded(table.conn, [old], by)
            row = table.update(old.config_id, fields) or old
            if row_record(row) != row_record(old):
                record_change(
                    table.conn, by, row.config_id, "update", row_record(old), row_record(row)
                )
            created = False
    if created or old is None:  # (old is None only when created; this tells mypy)
        values = ", ".join(
            f"{column} {fmt_field(name, getattr(row, name))}" for name, column in _CONF_FIELDS
        )
        ctx.out.line(f"created configId {row.config_id} for {a.url}: {values}")
    else:
        pairs = [
            (column, fmt_field(name, getattr(old, name)), fmt_field(name, getattr(row, name)))
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
    rows = read_rows(engine)
    ctx.out.line(
        url_effect(
            a.url,
            rows,
            build_rules(rows, ctx.settings.default_cache, ctx.settings.default_time_zone),
        )
    )
    _warn_written(ctx, rows, [row.config_id])
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


def _warn_written(ctx: Context, rows: Sequence[ConfRow], config_ids: Sequence[int]) -> None:
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


def _scope_flags(row: ConfRow) -> str:
    """The ``conf enable/disable`` flags that pick ``row``'s period and scope."""
    quota = f" --quota-period {row.quota_period}" if row.quota_period else ""
    scope = "per-caller" if row.per_caller else "shared"
    return f" --period {row.period_seconds}{quota} --{scope}"


# --- conf enable, disable, delete: the rows of a URL, narrowed by period and scope -------


def _scope_of(args: argparse.Namespace) -> dict[str, Any]:
    """The rows ``--period``, ``--per-caller``/``--shared`` pick (model attribute -> value)."""
    scope: dict[str, Any] = {}
    if args.period is not None:
        scope["period_seconds"] = args.period
    if args.per_caller is not None:
        scope["per_caller"] = int(args.per_caller)
    if getattr(args, "quota_period", None) is not None:
        scope["quota_period"] = args.quota_period
    if getattr(args, "channel", None) is not None:
        if args.url != CHANNEL_URL:
            raise UsageError(
                f"argument --channel: picks one channel cap, of URL {CHANNEL_URL!r}; "
                f"{args.url} is one interface",
                f"conf {args.action}",
            )
        scope["channel_type"] = args.channel
    return scope


def _no_row(ctx: Context, scope: dict[str, Any], then: str) -> CliError:
    url = ctx.args.url
    period = getattr(ctx.args, "quota_period", None) or ctx.args.period or 1
    which = f" {scope_text(period, bool(ctx.args.per_caller))}" if scope else ""
    return CliError(f"no row for URL {url}{which}; {then}")


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)


def _rows(count: int) -> str:
    return f"{count} row{'' if count == 1 else 's'}"


def _picked(rows: Sequence[ConfRow], url: str, scope: dict[str, Any]) -> list[ConfRow]:
    """The rows of ``url`` that ``scope`` picks, each compared exactly (docs/design.md:
    a row's identity is its exact text, whatever the database's collation says)."""
    return [r for r in rows if r.interface_url == url and same_scope(r, scope)]


def _refuse_skipped(rows: Sequence[ConfRow], enabling: Sequence[ConfRow], cache: float) -> None:
    """Exit 2, changing nothing, when a row of ``enabling`` would be skipped by the
    reload once enabled (its own values, or beside the other rows of its URL)."""
    for row in enabling:
        problem = row_problem(row)
        clash = (
            ""
            if problem
            else combination_problem(rows, row.interface_url or "", replace(row, status=1), cache)
        )
        if problem or clash:
            why = str(problem) if problem else f"the reload would skip {clash}"
            raise CliError(
                f"configId {row.config_id} would not be limited once enabled: {why}; "
                "nothing changed",
                2,
            )


def flip_rows(
    engine: Engine,
    url: str,
    status: int,
    scope: dict[str, Any],
    by: ChangedBy | None = None,
    default_cache: float = 0.5,
) -> tuple[list[int], list[int]]:
    """Set ``status`` on the rows of ``url`` that ``scope`` picks, in one transaction
    over the locked table (with an audit row per row changed, ``by``); return the
    configIds picked and those that changed (their status was another)."""
    with locked_table(engine) as table:
        picked = _picked(table.rows, url, scope)
        changed = []
        if status == 1:
            _refuse_skipped(table.rows, [r for r in picked if r.status != 1], default_cache)
        for row in picked:
            if row.status == status:
                continue
            if by is not None:
                record_unrecorded(table.conn, [row], by)
            now = table.update(row.config_id, {"status": status}) or row
            changed.append(row.config_id)
            if by is not None:
                record_change(
                    table.conn, by, row.config_id, "update", row_record(row), row_record(now)
                )
    return [row.config_id for row in picked], changed


def delete_rows(
    engine: Engine, url: str, scope: dict[str, Any], by: ChangedBy | None = None
) -> list[int]:
    """Delete the rows of ``url`` that ``scope`` picks, in one transaction over the
    locked table (with an audit row each, ``by``); return their configIds."""
    with locked_table(engine) as table:
        picked = _picked(table.rows, url, scope)
        for row in picked:
            if by is not None:
                record_unrecorded(table.conn, [row], by)
            table.delete(row.config_id)
            if by is not None:
                record_change(table.conn, by, row.config_id, "delete", row_record(row), None)
    return [row.config_id for row in picked]


def _cmd_conf_status(ctx: Context, status: int) -> int:
    url = ctx.args.url
    engine = ctx.engine()
    scope = _scope_of(ctx.args)
    picked, changed = flip_rows(
        engine, url, status, scope, ctx.changed_by(), ctx.settings.default_cache
    )
    if not picked:
        raise _no_row(ctx, scope, f"create one with '{PROG} conf set {url} --rate N'")
    verb = "enabled" if status else "disabled"
    already = [i for i in picked if i not in changed]
    said = []
    if changed:
        said.append(f"{verb} {_rows(len(changed))} for {url} (configId {_ids(changed)})")
    if already:
        was = "was" if len(already) == 1 else "were"
        said.append(f"configId {_ids(already)} {was} already {verb}")
    if not changed:
        said.append(f"0 rows changed for {url}")
    ctx.out.line("; ".join(said))
    rows = read_rows(engine)
    ctx.out.line(
        url_effect(
            url, rows, build_rules(rows, ctx.settings.default_cache, ctx.settings.default_time_zone)
        )
    )
    if status:
        _warn_written(ctx, rows, picked)
    if changed:
        ctx.out.line(ctx.reload_note())
    return 0


def cmd_conf_enable(ctx: Context) -> int:
    """Set status 1 on the rows of a URL (every row, or those --period/--per-caller pick)."""
    return _cmd_conf_status(ctx, 1)


def cmd_conf_disable(ctx: Context) -> int:
    """Set status 0 on the rows of a URL (every row, or those --period/--per-caller pick)."""
    return _cmd_conf_status(ctx, 0)


def cmd_conf_delete(ctx: Context) -> int:
    """Delete the rows of a URL (every row, or those --period/--per-caller pick)."""
    url = ctx.args.url
    engine = ctx.engine()
    scope = _scope_of(ctx.args)
    gone = delete_rows(engine, url, scope, ctx.changed_by())
    if not gone:
        raise _no_row(ctx, scope, "nothing deleted")
    ctx.out.line(f"deleted {_rows(len(gone))} for {url} (configId {_ids(gone)})")
    rows = read_rows(engine)
    ctx.out.line(
        url_effect(
            url, rows, build_rules(rows, ctx.settings.default_cache, ctx.settings.default_time_zone)
        )
    )
    ctx.out.line(ctx.reload_note())
    return 0
