"""``gateway-limiter conf list``: every row, what the reload makes of it, and the rows it
skips; fitted to the terminal, filtered, or as JSON for scripts.

The filters (``--url GLOB``, ``--channel``, ``--status``, ``--algorithm``) pick rows;
what the reload makes of them is still decided over the whole table (a row's effect
can depend on the others: the stricter of two rows, a channel cap).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from gateway_limiter.cli.context import PROG, Context
from gateway_limiter.cli.describe import (
    fmt_cache,
    fmt_opt,
    fmt_row_field,
    fmt_seconds,
    fmt_time,
    row_effect,
    switch_line,
)
from gateway_limiter.cli.output import Column
from gateway_limiter.config.rules import ALGORITHMS, read_ruleset
from gateway_limiter.config.table import CONF_TABLE, ConfRow

if TYPE_CHECKING:
    from gateway_limiter.config.rules import RuleSet

#: The columns of ``conf list``, as the table names them. On a narrow terminal the
#: table takes the short headers, then leaves out the columns ``effect`` already says
#: (``drop``: 1 first), then folds the URL and the effect onto more lines.
CONF_COLUMNS = (
    Column("configId", numeric=True, short="id"),
    Column("channelType", short="channel", drop=9),
    Column("interfaceNo", short="no", drop=2),
    Column("interfaceUrl", short="url", cut=20),
    Column("rateLimit", numeric=True, short="rate"),
    Column("cache", numeric=True, drop=8),
    Column("status", numeric=True, short="on"),
    Column("shadow", numeric=True, drop=7),
    Column("lastModifyTime", short="modified", drop=1),
    Column("algorithm", short="algo", drop=10),
    Column("maxPermits", numeric=True, short="max", drop=4),
    Column("warmupPeriod", numeric=True, short="warmup", drop=3),
    Column("periodSeconds", numeric=True, short="period", drop=13),
    Column("perCaller", numeric=True, short="per", drop=5),
    Column("callerKey", short="caller", drop=6),
    Column("effect", cut=30),
)
#: Shown before ``effect`` when some row has a ``maxConcurrent`` (schema 0006).
MAX_CONCURRENT_COLUMN = Column("maxConcurrent", numeric=True, short="conc", drop=11)
#: Shown before ``effect`` when some row has a ``leaseMs`` (schema 0007).
LEASE_MS_COLUMN = Column("leaseMs", numeric=True, short="lease", drop=12)
#: Shown before ``effect`` when some row is a calendar quota (schema 0009): its
#: ``quotaPeriod``, ``timeZone`` (NULL: the default), ``quotaRenews`` and pacing.
QUOTA_COLUMN = Column("quota", drop=14, cut=12)


def status_arg(text: str) -> int:
    """``--status``: 1 or 0 (also on/off, enabled/disabled)."""
    word = text.strip().lower()
    if word in ("1", "on", "enabled"):
        return 1
    if word in ("0", "off", "disabled"):
        return 0
    raise argparse.ArgumentTypeError(f"must be 1 (enabled) or 0 (disabled), got {text!r}")


def add_filters(parser: argparse.ArgumentParser, what: str) -> None:
    """The filters ``conf list`` and ``status`` share, and ``--json``."""
    parser.add_argument(
        "--url",
        dest="url_glob",
        metavar="GLOB",
        help=f"only {what} whose interfaceUrl matches GLOB (shell-style: * ? [...]; quote it)",
    )
    parser.add_argument("--channel", metavar="C", help=f"only {what} of channelType C")
    parser.add_argument(
        "--algorithm", choices=ALGORITHMS, metavar="A", help=f"only {what} of algorithm A"
    )
    parser.add_argument("--json", action="store_true", help="print JSON, for scripts")


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``conf list`` command's."""
    add_filters(parser, "rows")
    parser.add_argument(
        "--status", type=status_arg, metavar="0|1", help="only disabled (0) or enabled (1) rows"
    )


def picked(row: ConfRow, args: argparse.Namespace) -> bool:
    """True when ``row`` passes ``conf list``'s filters."""
    if args.url_glob is not None and not fnmatchcase(row.interface_url or "", args.url_glob):
        return False
    if args.channel is not None and row.channel_type != args.channel:
        return False
    if args.status is not None and row.status != args.status:
        return False
    algorithm = row.algorithm or "token_bucket"  # NULL: the column's default
    return args.algorithm is None or algorithm == args.algorithm


def cmd_conf_list(ctx: Context) -> int:
    """Every row (or those the filters pick), what the reload makes of it, and each
    skipped row with its reason."""
    engine = ctx.engine()
    every, ruleset = read_ruleset(engine, ctx.settings)
    rows = [r for r in every if picked(r, ctx.args)]
    if ctx.args.json:
        ctx.out.line(json.dumps(list_json(rows, ruleset), ensure_ascii=False, indent=1))
        return 0
    ctx.out.line(switch_line(engine, ctx.settings))
    if not every:
        ctx.out.line(
            f"{CONF_TABLE} is empty: nothing is limited. Add a row with "
            f"'{PROG} conf set URL --rate N --enable'"
        )
        return 0
    if not rows:
        ctx.out.line(f"no row of {len(every)} matches the filters")
        return 0
    caps = any(r.max_concurrent is not None for r in rows)
    leases = any(r.lease_ms is not None for r in rows)
    quotas = any(r.quota_period is not None for r in rows)
    columns = (
        *CONF_COLUMNS[:-1],
        *([MAX_CONCURRENT_COLUMN] if caps else []),
        *([LEASE_MS_COLUMN] if leases else []),
        *([QUOTA_COLUMN] if quotas else []),
        CONF_COLUMNS[-1],
    )
    zone = ctx.settings.default_time_zone
    ctx.out.table(columns, [_cells(r, ruleset, caps, leases, quotas, zone) for r in rows])
    footer = cache_footer(rows, ctx.settings.default_cache)
    if footer:
        ctx.out.line(footer)
    ids = {r.config_id for r in rows}
    for s in ruleset.skipped:
        if s.config_id in ids:
            ctx.out.line(f"skipped by the reload: {s}")
    for warning in ruleset.warnings:
        ctx.out.line(f"warning: {warning}")
    return 0


def cache_footer(rows: Sequence[ConfRow], default_cache: float) -> str:
    """What a NULL ``cache`` means, when an enabled row has one ("": none has): the row
    counts as ``default_cache``; where its interface has other enabled rows (a calendar
    quota beside its per-second row), callers wait up to the smallest cache of them all,
    not necessarily this one."""
    enabled = [r for r in rows if r.status == 1]
    nulls = [r for r in enabled if r.cache is None]
    if not nulls:
        return ""
    line = f"cache NULL: the row counts as default_cache = {default_cache:g} s"
    shared = {r.interface_url for r in nulls}
    if sum(1 for r in enabled if r.interface_url in shared) > len(shared):
        line += "; an interface with several rows waits up to the smallest cache of its rows"
    return line


def quota_cell(r: ConfRow, default_zone: str) -> str:
    """A calendar quota row's period, zone, renewal and pacing in one cell ("-": none)."""
    if r.quota_period is None:
        return "-"
    parts = [r.quota_period, r.time_zone or f"{default_zone} (default)"]
    if r.quota_renews:
        parts.append(f"from {r.quota_renews}")
    if r.quota_pacing:
        parts.append("paced")
    return " ".join(parts)


def _cells(
    r: ConfRow,
    ruleset: RuleSet,
    caps: bool,
    leases: bool,
    quotas: bool = False,
    default_zone: str = "UTC",
) -> list[str]:
    return [
        str(r.config_id),
        fmt_opt(r.channel_type),
        fmt_opt(r.interface_no),
        fmt_opt(r.interface_url),
        fmt_opt(r.rate_limit),
        fmt_cache(r.cache),
        fmt_opt(r.status),
        "-" if r.shadow is None else str(r.shadow),  # None: schema before 0005
        fmt_time(r),
        fmt_row_field(r, "algorithm"),
        fmt_opt(r.max_permits),
        fmt_seconds(r.warmup_period),
        fmt_row_field(r, "period_seconds"),
        fmt_opt(r.per_caller),
        fmt_opt(r.caller_key),
        *([fmt_opt(r.max_concurrent)] if caps else []),
        *([fmt_opt(r.lease_ms)] if leases else []),
        *([quota_cell(r, default_zone)] if quotas else []),
        row_effect(r, ruleset),
    ]


def list_json(rows: Sequence[ConfRow], ruleset: RuleSet) -> dict[str, Any]:
    """``conf list --json``: each row by its column names, with ``effect`` (what the
    reload makes of it) and ``skipped`` (why the reload skips it, else null); and the
    reload's warnings."""
    skipped = {s.config_id: s.reason for s in ruleset.skipped}
    out = []
    for r in rows:
        modified = r.last_modify_time
        when = modified.isoformat() if isinstance(modified, dt.datetime) else None
        out.append(
            {
                "configId": r.config_id,
                "channelType": r.channel_type,
                "interfaceNo": r.interface_no,
                "interfaceUrl": r.interface_url,
                "rateLimit": r.rate_limit,
                "cache": r.cache,
                "status": r.status,
                "shadow": r.shadow,
                "lastModifyTime": when,
                "algorithm": r.algorithm,
                "maxPermits": r.max_permits,
                "warmupPeriod": r.warmup_period,
                "periodSeconds": r.period_seconds,
                "perCaller": r.per_caller,
                "callerKey": r.caller_key,
                "maxConcurrent": r.max_concurrent,
                "leaseMs": r.lease_ms,
                "priority": r.priority,
                "reserve": r.reserve,
                "quotaPeriod": r.quota_period,
                "timeZone": r.time_zone,
                "quotaRenews": r.quota_renews,
                "quotaPacing": r.quota_pacing,
                "effect": row_effect(r, ruleset),
                "skipped": skipped.get(r.config_id),
            }
        )
    return {"rows": out, "warnings": list(ruleset.warnings)}
