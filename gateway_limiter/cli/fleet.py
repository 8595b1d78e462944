"""``gateway-limiter fleet``: the live gateway processes sharing the rules, as Redis
knows them from their heartbeats (``gateway_limiter/core/fleet.py``)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from gateway_limiter.cli.arguments import command
from gateway_limiter.cli.context import CliError, Context, relaxed
from gateway_limiter.cli.output import Column, Report
from gateway_limiter.observe.redact import mask_secrets

if TYPE_CHECKING:
    from gateway_limiter.backends.base import Backend

FLEET_COLUMNS = (
    Column("host"),
    Column("pid", numeric=True),
    Column("since"),
    Column("version"),
    Column("last seen s ago", numeric=True),
)


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``fleet`` command."""
    command(parser, cmd_fleet)


def cmd_fleet(ctx: Context) -> int:
    """List the live members of ``<key_prefix>:fleet`` (one round trip to Redis)."""
    from gateway_limiter.backends.base import BackendError
    from gateway_limiter.backends.schemes import open_backend

    settings = relaxed(ctx.settings)
    where = mask_secrets(settings.redis_url)
    try:
        backend = open_backend(settings)
    except ValueError as e:  # a redis_url the backend cannot use (it names the value)
        raise CliError(str(e), code=2) from None
    try:
        if not backend.shared:
            ctx.out.line(
                f"{where}: each process keeps its own state and is a fleet of one; "
                "no process announces itself anywhere"
            )
            return 0
        try:
            report = fleet_report(backend, settings.key_prefix, where)
        except BackendError as e:
            raise CliError(f"cannot read the fleet from {where}: {e}") from None
    finally:
        backend.close()
    ctx.out.show(report)
    return 0


def fleet_report(backend: Backend, prefix: str, where: str) -> Report:
    """The fleet's members as a table, most recently started first. Raises BackendError."""
    from gateway_limiter.backends.fleet import decode_member, fleet_key

    members, now_ms = backend.members()
    rows = []
    for text, expires_ms in members:
        about = decode_member(text)
        ttl_ms = float(about.get("ttl_ms", 0))
        since = about.get("since")
        started = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
            if isinstance(since, (int, float))
            else "?"
        )
        seen_ago_s = max(0.0, (now_ms - (expires_ms - ttl_ms)) / 1000.0)
        row = [
            str(about.get("host", text)),
            str(about.get("pid", "?")),
            started,
            str(about.get("version", "?")),
            f"{seen_ago_s:.1f}",
        ]
        rows.append((float(since) if isinstance(since, (int, float)) else 0.0, row))
    rows.sort(key=lambda r: r[0], reverse=True)
    n = len(rows)
    head = f"fleet: {n} live process{'es' if n != 1 else ''} in {fleet_key(prefix)} on {where}"
    if not rows:
        return [head, "no gateway process has beaten within its time to live"]
    return [head, (FLEET_COLUMNS, [r for _, r in rows])]
