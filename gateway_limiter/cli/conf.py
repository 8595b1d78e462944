"""``gateway-limiter conf list|set|enable|disable|delete``: the rows of the limits table
(``conf list`` is ``listing.py``, ``conf set`` is ``conf_set.py``).

Commands that write change the rows they name in one transaction, after every argument
has been checked: an error never leaves half a change.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gateway_limiter.cli import conf_set, listing
from gateway_limiter.cli.arguments import (
    leaf,
    period_arg,
    url_arg,
)
from gateway_limiter.cli.conf_set import warn_written
from gateway_limiter.cli.context import PROG, CliError, Context, UsageError
from gateway_limiter.cli.describe import (
    url_effect,
)
from gateway_limiter.config.edits import (
    combination_problem,
    delete_row,
    row_problem,
    update_row,
)
from gateway_limiter.config.rules import (
    CHANNEL_URL,
    read_ruleset,
    scope_text,
)
from gateway_limiter.config.table import (
    ConfRow,
    locked_table,
    same_scope,
)
from gateway_limiter.model.calendar import QUOTA_PERIODS

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
    conf_set.register(conf)
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
            if row.status != status:
                update_row(table, row, {"status": status}, by)
                changed.append(row.config_id)
    return [row.config_id for row in picked], changed


def delete_rows(
    engine: Engine, url: str, scope: dict[str, Any], by: ChangedBy | None = None
) -> list[int]:
    """Delete the rows of ``url`` that ``scope`` picks, in one transaction over the
    locked table (with an audit row each, ``by``); return their configIds."""
    with locked_table(engine) as table:
        picked = _picked(table.rows, url, scope)
        for row in picked:
            delete_row(table, row, by)
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
    rows, ruleset = read_ruleset(engine, ctx.settings)
    ctx.out.line(url_effect(url, rows, ruleset))
    if status:
        warn_written(ctx, rows, picked)
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
    ctx.out.line(url_effect(url, *read_ruleset(engine, ctx.settings)))
    ctx.out.line(ctx.reload_note())
    return 0
