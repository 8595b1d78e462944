"""``gateway-limiter audit [--limit N] [--config-id ID]``: the latest changes of the limits
and the switch, newest first, from ``t_ratelimite_audit`` (who, when, how, what)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway_limiter.cli.arguments import command, count_arg
from gateway_limiter.cli.context import Context
from gateway_limiter.cli.output import Column

AUDIT_COLUMNS = (
    Column("auditId", numeric=True),
    Column("changedAt"),
    Column("actor"),
    Column("source"),
    Column("configId", numeric=True),
    Column("action"),
    Column("change"),
)


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``audit`` command."""
    command(parser, cmd_audit)
    parser.add_argument(
        "--limit", type=count_arg, default=50, metavar="N", help="how many (default 50)"
    )
    parser.add_argument(
        "--config-id", type=count_arg, metavar="ID", help="only the changes of this row"
    )


def change_text(entry: dict[str, Any]) -> str:
    """What changed, in one line: the columns that differ, or the row made or deleted."""
    before, after = entry["beforeRow"] or {}, entry["afterRow"] or {}
    if entry["action"] in ("insert", "delete"):
        row = after if entry["action"] == "insert" else before
        url = row.get("interfaceUrl")
        if url == "*":  # a channel cap: say whose
            url = f"* (channel {row.get('channelType')})"
        elif row.get("callerKey") is not None:
            url = f"{url} (caller {row.get('callerKey')})"
        return f"{url} rateLimit {row.get('rateLimit')}"
    keys = sorted(set(before) | set(after))
    return ", ".join(
        f"{k} {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}"
        for k in keys
        if before.get(k) != after.get(k)
    )


def cmd_audit(ctx: Context) -> int:
    """List the latest audit rows."""
    from gateway_limiter.config.audit import read_audit

    entries = read_audit(ctx.engine(), limit=ctx.args.limit, config_id=ctx.args.config_id)
    if not entries:
        ctx.out.line("no changes recorded in t_ratelimite_audit")
        return 0
    ctx.out.table(
        AUDIT_COLUMNS,
        [
            [
                str(e["auditId"]),
                str(e["changedAt"]),
                e["actor"],
                e["source"],
                "-" if e["configId"] is None else str(e["configId"]),
                e["action"],
                change_text(e),
            ]
            for e in entries
        ],
    )
    return 0
